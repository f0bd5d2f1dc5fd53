"""IR -> canonical DSL text (`format_graph`), and OpenInfer's trace description of a node (`describe`).

Canonical form: memory sections first (consecutive declarations of one kind share a section, in
source order), then blocks in source order; 4-space indentation; `, ` between items; attributes
in the order @pattern @ref @table @auto_dim @fixed @init; a full cache slice written `..`.
`parse(format_graph(g))` equals `g` up to spans (node indices included). Comments and blank
lines of the source are kept (format_graph's docstring says where they go).
"""
from __future__ import annotations

import bisect
import dataclasses
import math
import re

from .. import ir

INDENT = "    "
_ATTR_ORDER = ("pattern", "ref", "table", "auto_dim", "fixed", "init")


def format_graph(graph: ir.Graph) -> str:
    """The canonical text of `graph`, keeping the comments and the blank lines of its source
    (`graph.source`): a comment after code on a line stays after that statement (at its column
    when the code still fits before it); other comments stay before the statement, closing brace
    or section that follows them, re-indented; one blank line is kept wherever the source had at
    least one between two statements or comments."""
    chunks = _chunks(graph)
    source = graph.source or ""
    comments = scan_comments(source) if source else []
    if not comments and not source:
        return "\n\n".join("\n".join(text for text, _, _ in c) for c in chunks) + "\n" if chunks else ""
    src_lines = source.split("\n")  # lines as the parser counts them (never at U+2028, NEL, \f, \v)
    # each output line: [text, source line, kind]; comments become lines too
    out: list[list] = []
    chunk_start: set[int] = set()
    for chunk in chunks:
        chunk_start.add(len(out))
        out.extend([text, line, kind] for text, line, kind in chunk)
    pending = []
    ended = set()  # ids of the lines that end in a `//` comment: nothing may follow it on that line
    for c_line, c_col, c_end, text in comments:
        before = src_lines[c_line - 1][:c_col - 1] if c_line - 1 < len(src_lines) else ""
        if _code(before).strip() or _inside_item(src_lines, out, c_line, c_col):
            # after code on its line, or on a line of its own inside an item that spans lines
            # (`op add(q, // a` / `// s` / `q) >> q;`): a trailing comment of that item, in order
            host = [e for e in out if e[1] is not None and e[1] <= c_line and e[2] != "comment"]
            if host:  # the last item of the latest line before it (`a; b; } // c`: after the brace)
                target = max(reversed(host), key=lambda e: e[1])
                if id(target) in ended:  # a second comment after a `//` one: a line of its own after it
                    at = next(k for k, e in enumerate(out) if e is target)
                    while at + 1 < len(out) and out[at + 1][2] == "comment" and out[at + 1][1] == target[1]:
                        at += 1
                    inside = INDENT if target[2] == "open" else ""  # after a `{`: the block's first line
                    out.insert(at + 1, [_indent_of(target[0]) + inside + text, target[1], "comment", c_end])
                    chunk_start = {j + 1 if j > at else j for j in chunk_start}
                    continue
                last = target[0].rsplit("\n", 1)[-1]  # the column counts on the line the comment goes on
                target[0] += (" " * (c_col - 1 - len(last)) if len(last) < c_col - 2 else "  ") + text
                if text.startswith("//"):
                    ended.add(id(target))
                continue
        pending.append((c_line, c_end, text))
    for c_line, c_end, text in pending:  # before the next source item (statement, brace, comment)
        # nothing precedes it on its line: an item on that line comes after it (`/* a */ op ...;`);
        # right before that item, so after the comments already placed before it
        later = [i for i, e in enumerate(out) if e[1] is not None and e[1] >= c_line and e[2] != "comment"]
        if later:
            i = min(later, key=lambda j: (out[j][1], j))
            nxt = out[i]
            indent = _indent_of(nxt[0]) + (INDENT if nxt[2] == "close" else "")
            entry = [indent + _reindent(text), c_line, "comment", c_end]
            # a comment before a section or block belongs to its chunk: the chunk now starts with it
            chunk_start = {j + 1 if j > i else j for j in chunk_start}
            out.insert(i, entry)
        else:
            out.append([_reindent(text), c_line, "comment", c_end])
    lines: list[str] = []
    prev = None
    for i, e in enumerate(out):
        if i in chunk_start and lines:
            lines.append("")
        elif prev is not None and e[2] != "close" and prev[2] != "open" and e[1] is not None \
                and prev[1] is not None and _blank_between(src_lines, _end(prev), e[1]):
            lines.append("")
        lines.append(e[0])
        prev = e
    return "\n".join(lines) + "\n" if lines else ""


def _inside_item(src_lines: list[str], out: list, c_line: int, c_col: int) -> bool:
    """A comment alone on its line lies inside the item (statement, declaration, header) that starts
    on an earlier line and has not ended by it: the code from that item's line up to the comment
    does not end in `;`, `{` or `}`."""
    starts = [e[1] for e in out if e[1] is not None and e[1] < c_line and e[2] != "comment"]
    if not starts:
        return False
    first = max(starts)
    code = _code("\n".join(src_lines[first - 1:c_line - 1] + [src_lines[c_line - 1][:c_col - 1]])).rstrip()
    return bool(code) and code[-1] not in ";{}"


def _end(entry) -> int:
    return entry[3] if len(entry) > 3 else entry[1]


def _blank_between(src_lines: list[str], a: int, b: int) -> bool:
    return any(not src_lines[k - 1].strip() for k in range(a + 1, b) if 0 < k <= len(src_lines))


def _indent_of(text: str) -> str:
    return text[:len(text) - len(text.lstrip(" "))]


def _reindent(text: str) -> str:
    return text  # the first line is indented by the caller; later lines of a /* */ stay verbatim


def _code(text: str) -> str:
    """`text` without comments (a line's prefix may hold an earlier `/* */`)."""
    return "".join(text[a:b] for a, b in _code_ranges(text))


def _code_ranges(text: str):
    spans = [(s, e) for s, e, _ in _scan(text)]
    pos = 0
    for s, e in spans:
        yield pos, s
        pos = e
    yield pos, len(text)


def _scan(source: str):
    """(start, end, text) of every comment, skipping string literals."""
    i, n = 0, len(source)
    while i < n:
        ch = source[i]
        if ch == '"':
            i += 1
            while i < n and source[i] != '"':
                i += 2 if source[i] == "\\" else 1
            i += 1
        elif source.startswith("//", i):
            end = source.find("\n", i)
            end = n if end < 0 else end
            yield i, end, source[i:end].rstrip()
            i = end
        elif source.startswith("/*", i):
            end = source.find("*/", i + 2)
            end = n if end < 0 else end + 2
            yield i, end, source[i:end]
            i = end
        else:
            i += 1


def scan_comments(source: str) -> list[tuple[int, int, int, str]]:
    """(line, column, end line, text) of every comment in `source` (1-based)."""
    out = []
    line_starts = [0]
    for k, ch in enumerate(source):
        if ch == "\n":
            line_starts.append(k + 1)
    for start, end, text in _scan(source):
        line = bisect.bisect_right(line_starts, start)
        end_line = bisect.bisect_right(line_starts, max(start, end - 1))
        out.append((line, start - line_starts[line - 1] + 1, end_line, text))
    return out


def _braces(source: str) -> dict[int, int]:
    """Source line of each `{` -> source line of its matching `}` (comments and strings skipped)."""
    code = list(source)
    for s, e, _ in _scan(source):
        for k in range(s, e):
            if code[k] != "\n":
                code[k] = " "
    text = "".join(code)
    i, stack, out, line = 0, [], {}, 1
    in_string = False
    while i < len(text):
        ch = text[i]
        if ch == "\n":
            line += 1
        elif in_string:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            stack.append(line)
        elif ch == "}" and stack:
            out.setdefault(stack.pop(), line)
        i += 1
    return out


def _chunks(graph: ir.Graph) -> list[list[tuple[str, int | None, str]]]:
    """Canonical sections and blocks, each a list of (line text, source line or None, kind)."""
    braces = _braces(graph.source or "")

    def close_of(open_line: int | None) -> int | None:
        if open_line is None:
            return None
        for line in sorted(braces):
            if line >= open_line:
                return braces[line]
        return None

    def open_before(line: int) -> int | None:
        opens = [o for o, c in braces.items() if o <= line <= c]
        return max(opens) if opens else None

    chunks = []
    group: list[ir.VarDecl] = []

    def section(decls):
        head = open_before(decls[0].span.line) if graph.source else None
        chunk = [(f"{decls[0].kind.value} {{", head, "open")]
        chunk += [(INDENT + format_decl(d), d.span.line, "stmt") for d in decls]
        chunk.append(("}", braces.get(head) if head is not None else None, "close"))
        return chunk

    for decl in graph.vars:
        if group and decl.kind != group[0].kind:
            chunks.append(section(group))
            group = []
        group.append(decl)
    if group:
        chunks.append(section(group))
    for block in graph.blocks:
        line = block.span.line if graph.source else None
        chunk = [(f"block {block.name} {{", line, "open")]
        _node_lines(block.nodes, 1, chunk, close_of if graph.source else (lambda _: None))
        chunk.append(("}", close_of(line), "close"))
        chunks.append(chunk)
    return chunks


def _node_lines(nodes, depth: int, out: list, close_of) -> None:
    pad = INDENT * depth
    for node in nodes:
        line = node.span.line if node.span is not None and node.span.line else None
        if isinstance(node, ir.Loop):
            out.append((pad + format_node(node) + " {", line, "open"))
            _node_lines(node.body, depth + 1, out, close_of)
            out.append((pad + "}", close_of(line), "close"))
        else:
            out.append((pad + format_node(node), line, "stmt"))


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
    if ir.literal_text(v):  # `2.5f32`, `1_000.0`: as the user wrote it
        return ir.literal_text(v)
    if math.isinf(v):
        if v < 0:
            raise ValueError("-inf cannot be written in the DSL")
        return "inf"
    if math.isnan(v):
        raise ValueError("NaN cannot be written in the DSL")
    return plain_float(v)


def plain_float(v: float) -> str:
    """A finite float's canonical text, for a value that kept no text of its own (graph JSON, or
    a literal written this way: `0.5`, `1e-6`; build.py keeps any other spelling, `1E3`, `2.`)."""
    return re.sub(r"e([+-]?)0+(?=\d)", r"e\1", repr(float(v)))  # 1e-05 -> 1e-5, as one writes it


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
    if lit.kind == "dtype_list":
        return f"[{', '.join(lit.value)}]"
    return str(lit.value)  # var, dtype


def format_ref(r: "ir.VarRef | ir.LiteralInput", sep: str = ", ") -> str:
    """An op input, transfer or cache operand as written: `x`, `W[l]`, a literal input `0.125`."""
    if isinstance(r, ir.LiteralInput):
        text = format_literal(r.value)
        if r.dtype is not None and ir.literal_text(r.value.value) is None:  # from graph JSON: no text kept
            text += r.dtype  # the suffix that gave it its dtype (`7i32`, `1.0f32`)
        return text
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


class _Text(ir.NodeVisitor):
    """A node as text: its canonical DSL (`format_node`; a loop: its header line only, without
    `{`), or OpenInfer's trace description (`describe`, SPEC §8.2: no `;`, `,` between indices
    and inputs, an open slice end left empty, and no attributes, types, explicit amounts of 1 or
    returned names)."""

    def __init__(self, trace: bool):
        self.trace = trace
        self.sep, self.full, self.end = (",", "", "") if trace else (", ", "..", ";")

    def _ref(self, r: ir.VarRef) -> str:
        return format_ref(r, self.sep)

    def _access(self, a: ir.CacheAccess) -> str:
        return format_access(a, self.sep, self.full)

    def visit_Assign(self, node: ir.Assign):
        return f"assign {node.name}" if self.trace else f"assign {node.name}: {node.dtype}{_dims(node.dims)};"

    def visit_Op(self, node: ir.Op):
        args = [self._ref(r) for r in node.inputs]
        if not self.trace:
            args += [f"{a.name}={format_literal(a.value)}" for a in node.attrs]
        return f"op {node.op}({self.sep.join(args)}) >> {node.output}{self.end}"

    def visit_CacheRead(self, node: ir.CacheRead):
        return f"cache.read {self._access(node.src)} >> {self._ref(node.dst)}{self.end}"

    def visit_CacheWrite(self, node: ir.CacheWrite):
        return f"cache.write {self._ref(node.src)} >> {self._access(node.dst)}{self.end}"

    def visit_CacheIncrement(self, node, word: str = "increment"):
        shown = node.amount != 1 if self.trace else node.explicit_amount
        return f"cache.{word} {f'{node.amount} ' if shown else ''}{node.target}{self.end}"

    def visit_CacheDecrement(self, node):
        return self.visit_CacheIncrement(node, "decrement")

    def visit_CacheReset(self, node: ir.CacheReset):
        return f"cache.reset {self._access(node.target)}{self.end}"

    def visit_Branch(self, node: ir.Branch):
        if node.cond is None:
            return f"branch {node.then_block}{self.end}"
        return f"branch {node.cond} {node.then_block} {node.else_block}{self.end}"

    def visit_Barrier(self, node):
        return f"barrier{self.end}"

    def visit_Dep(self, node: ir.Dep):
        return f"dep after({node.after}) before({node.before}){self.end}"

    def visit_Loop(self, node: ir.Loop):
        return f"loop {node.name} ({node.var} in {node.start}..{node.end})"

    def visit_Yield(self, node):
        return f"{type(node).__name__.lower()} {', '.join(node.vars)}{self.end}"

    visit_Await = visit_Yield

    def visit_Transfer(self, node: ir.Transfer):
        return f"transfer {self._ref(node.src)} >> {self._ref(node.dst)}{self.end}"

    def visit_Return(self, node: ir.Return):
        return f"return {', '.join(node.vars)};" if node.vars and not self.trace else f"return{self.end}"


_FORMAT, _DESCRIBE = _Text(trace=False), _Text(trace=True)


def format_node(node: ir.Node) -> str:
    """One node as canonical text (a loop: its header line only, without `{`)."""
    return _FORMAT.visit(node)


def describe(node: ir.Node) -> str:
    """OpenInfer's trace description of a node (SPEC §8.2); attributes are never shown."""
    return _DESCRIBE.visit(node)


def strip_spans(obj):
    """`obj` (any IR value) with every span replaced by NO_SPAN, attr_spans emptied and the graph's
    path/source cleared: `strip_spans(a) == strip_spans(b)` is IR equality up to spans."""
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
