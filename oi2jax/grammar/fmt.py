"""IR -> canonical DSL text (`format_graph`), and OpenInfer's trace description of a node (`describe`).

Canonical form: memory sections first (consecutive declarations of one kind share a section, in
source order), then blocks in source order; 4-space indentation; `, ` between items; attributes
in the order @pattern @ref @table @auto_dim @fixed @init; a full cache slice written `..`.
`parse(format_graph(g))` equals `g` up to spans (node indices included).
"""
from __future__ import annotations

import math

from .. import ir

INDENT = "    "
_ATTR_ORDER = ("pattern", "ref", "table", "auto_dim", "fixed", "init")


def format_graph(graph: ir.Graph) -> str:
    chunks: list[str] = []
    group: list[ir.VarDecl] = []
    for decl in graph.vars:
        if group and decl.kind != group[0].kind:
            chunks.append(_section(group))
            group = []
        group.append(decl)
    if group:
        chunks.append(_section(group))
    for block in graph.blocks:
        lines = [f"block {block.name} {{"]
        _nodes(block.nodes, 1, lines)
        lines.append("}")
        chunks.append("\n".join(lines))
    return "\n\n".join(chunks) + "\n" if chunks else ""


def _section(decls: list[ir.VarDecl]) -> str:
    lines = [f"{decls[0].kind.value} {{"]
    lines += [INDENT + format_decl(d) for d in decls]
    lines.append("}")
    return "\n".join(lines)


def format_decl(d: ir.VarDecl) -> str:
    head = d.name + (f"({', '.join(d.index_params)})" if d.index_params else "")
    text = f"{head}: {d.dtype}{_dims(d.dims)}"
    attrs = []
    for name in _ATTR_ORDER:
        if name == "pattern" and d.pattern is not None:
            attrs.append(f"@pattern({_string(d.pattern)})")
        elif name == "ref" and d.ref is not None:
            attrs.append(f"@ref({_string(d.ref)})")
        elif name == "table" and d.table:
            attrs.append("@table")
        elif name == "auto_dim" and d.auto_dim:
            attrs.append(f"@auto_dim({', '.join(d.auto_dim)})")
        elif name == "fixed" and d.fixed:
            attrs.append(f"@fixed({', '.join(f'{k}={v}' for k, v in d.fixed)})")
        elif name == "init" and d.init is not None:
            attrs.append(f"@init({format_literal(d.init)})")
    return text + "".join(" " + a for a in attrs) + ";"


def _dims(dims: tuple[ir.Dim, ...]) -> str:
    return f"[{', '.join(str(d) for d in dims)}]" if dims else ""


def _string(s: str) -> str:
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    out = out.replace("\r", "\\r").replace("\0", "\\0")
    return f'"{out}"'


def _float(v: float) -> str:
    if math.isinf(v):
        if v < 0:
            raise ValueError("-inf cannot be written in the DSL")
        return "inf"
    if math.isnan(v):
        raise ValueError("NaN cannot be written in the DSL")
    text = repr(float(v))
    return text


def format_literal(lit: ir.Literal) -> str:
    if lit.kind == "float":
        return _float(lit.value)
    if lit.kind == "int":
        return str(lit.value)
    if lit.kind == "bool":
        return "true" if lit.value else "false"
    if lit.kind == "str":
        return _string(lit.value)
    if lit.kind == "int_list":
        return f"[{', '.join(str(v) for v in lit.value)}]"
    return str(lit.value)  # var, dtype


def format_ref(r: ir.VarRef, sep: str = ", ") -> str:
    if r.indices is None:
        return r.name
    return f"{r.name}[{sep.join(str(i) for i in r.indices)}]"


def _entry(e, full: str = "..") -> str:
    if isinstance(e, ir.Single):
        return str(e.value)
    if e.start is None and e.end is None:
        return full
    return f"{'' if e.start is None else e.start}..{'' if e.end is None else e.end}"


def format_access(a: ir.CacheAccess, sep: str = ", ", full: str = "..") -> str:
    if not a.bracketed:
        return a.base
    return f"{a.base}[{sep.join(_entry(e, full) for e in a.indices)}]"


def format_node(node: ir.Node) -> str:
    """One node as canonical text (a loop: its header line only, without `{`)."""
    if isinstance(node, ir.Assign):
        return f"assign {node.name}: {node.dtype}{_dims(node.dims)};"
    if isinstance(node, ir.Op):
        args = [format_ref(r) for r in node.inputs] + [f"{a.name}={format_literal(a.value)}" for a in node.attrs]
        return f"op {node.op}({', '.join(args)}) >> {node.output};"
    if isinstance(node, ir.CacheRead):
        return f"cache.read {format_access(node.src)} >> {format_ref(node.dst)};"
    if isinstance(node, ir.CacheWrite):
        return f"cache.write {format_ref(node.src)} >> {format_access(node.dst)};"
    if isinstance(node, (ir.CacheIncrement, ir.CacheDecrement)):
        word = "increment" if isinstance(node, ir.CacheIncrement) else "decrement"
        amount = f"{node.amount} " if node.explicit_amount else ""
        return f"cache.{word} {amount}{node.target};"
    if isinstance(node, ir.CacheReset):
        return f"cache.reset {format_access(node.target)};"
    if isinstance(node, ir.Branch):
        if node.cond is None:
            return f"branch {node.then_block};"
        return f"branch {node.cond} {node.then_block} {node.else_block};"
    if isinstance(node, ir.Barrier):
        return "barrier;"
    if isinstance(node, ir.Dep):
        return f"dep after({node.after}) before({node.before});"
    if isinstance(node, ir.Loop):
        return f"loop {node.name} ({node.var} in {node.start}..{node.end})"
    if isinstance(node, ir.Yield):
        return f"yield {', '.join(node.vars)};"
    if isinstance(node, ir.Await):
        return f"await {', '.join(node.vars)};"
    if isinstance(node, ir.Transfer):
        return f"transfer {format_ref(node.src)} >> {format_ref(node.dst)};"
    if isinstance(node, ir.Return):
        return f"return {', '.join(node.vars)};" if node.vars else "return;"
    raise TypeError(f"unknown node {type(node).__name__}")


def _nodes(nodes, depth: int, lines: list[str]) -> None:
    pad = INDENT * depth
    for node in nodes:
        if isinstance(node, ir.Loop):
            lines.append(pad + format_node(node) + " {")
            _nodes(node.body, depth + 1, lines)
            lines.append(pad + "}")
        else:
            lines.append(pad + format_node(node))


def describe(node: ir.Node) -> str:
    """OpenInfer's trace description of a node (SPEC §8.2); attributes are never shown."""
    if isinstance(node, ir.Assign):
        return f"assign {node.name}"
    if isinstance(node, ir.Op):
        return f"op {node.op}({','.join(format_ref(r, ',') for r in node.inputs)}) >> {node.output}"
    if isinstance(node, ir.CacheRead):
        return f"cache.read {format_access(node.src, ',', '')} >> {format_ref(node.dst, ',')}"
    if isinstance(node, ir.CacheWrite):
        return f"cache.write {format_ref(node.src, ',')} >> {format_access(node.dst, ',', '')}"
    if isinstance(node, (ir.CacheIncrement, ir.CacheDecrement)):
        word = "increment" if isinstance(node, ir.CacheIncrement) else "decrement"
        return f"cache.{word} {node.target}" if node.amount == 1 else f"cache.{word} {node.amount} {node.target}"
    if isinstance(node, ir.CacheReset):
        return f"cache.reset {format_access(node.target, ',', '')}"
    if isinstance(node, ir.Branch):
        return f"branch {node.then_block}" if node.cond is None else \
            f"branch {node.cond} {node.then_block} {node.else_block}"
    if isinstance(node, ir.Barrier):
        return "barrier"
    if isinstance(node, ir.Dep):
        return f"dep after({node.after}) before({node.before})"
    if isinstance(node, ir.Loop):
        return f"loop {node.name} ({node.var} in {node.start}..{node.end})"
    if isinstance(node, ir.Yield):
        return f"yield {', '.join(node.vars)}"
    if isinstance(node, ir.Await):
        return f"await {', '.join(node.vars)}"
    if isinstance(node, ir.Transfer):
        return f"transfer {format_ref(node.src, ',')} >> {format_ref(node.dst, ',')}"
    if isinstance(node, ir.Return):
        return "return"
    raise TypeError(f"unknown node {type(node).__name__}")


def strip_spans(obj):
    """`obj` (any IR value) with every span replaced by NO_SPAN, attr_spans emptied and the graph's
    path/source cleared: `strip_spans(a) == strip_spans(b)` is IR equality up to spans."""
    import dataclasses
    if isinstance(obj, ir.Span):
        return ir.NO_SPAN
    if isinstance(obj, tuple):
        return tuple(strip_spans(x) for x in obj)
    if isinstance(obj, ir.Graph):
        return ir.Graph(strip_spans(obj.vars), strip_spans(obj.blocks), "<string>", "")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            changes[f.name] = () if f.name == "attr_spans" else strip_spans(value)
        return dataclasses.replace(obj, **changes)
    return obj
