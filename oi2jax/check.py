"""Semantic validation of a parsed graph: every rule of SPEC §3.10, §3.6, §4.7, §2.2/2.3, §0 items 11/12.

`check(graph, model=None, sizes=None)` returns ALL diagnostics (errors and warnings), sorted by
location. Op-specific typing comes from `oi2jax.ops.infer` (no op list here).

Size variables: `sizes` = the model's sizevars overridden by `sizes`. With neither a model nor
sizes, unknown size names are accepted and shape checks that involve them are skipped.
"""
from __future__ import annotations

import re

from . import dtypes, ir
from .diagnostics import Diagnostic, OiError
from .ir import MemKind

_KIND_WORD = {MemKind.DYNAMIC: "Dynamic", MemKind.VOLATILE: "Volatile", MemKind.CONSTANT: "Constant",
              MemKind.PERSISTENT: "Persistent"}


def check(graph: ir.Graph, model=None, sizes: dict[str, int] | None = None) -> list[Diagnostic]:
    checker = _Checker(graph, model, sizes)
    checker.run()
    return sorted(checker.diags, key=_sort_key)


def check_or_raise(graph: ir.Graph, model=None, sizes: dict[str, int] | None = None) -> list[Diagnostic]:
    """Raise `OiError` (all errors) when there are errors; otherwise return the warnings."""
    diags = check(graph, model, sizes)
    errors = [d for d in diags if d.severity == "error"]
    if errors:
        raise OiError(errors, source=graph.source)
    return diags


def _sort_key(d: Diagnostic):
    if d.span is None:
        return (0, 0, 0)
    return (1, d.span.line, d.span.col)


def _shape_text(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _writes(node: ir.Node) -> str | None:
    if isinstance(node, ir.Op):
        return node.output
    if isinstance(node, ir.Transfer):
        return node.dst.name
    if isinstance(node, ir.CacheRead):
        return node.dst.name
    return None


class _Checker:
    def __init__(self, graph: ir.Graph, model, sizes):
        self.g = graph
        self.model = model
        self.strict = model is not None or bool(sizes)
        self.sizes: dict[str, int] = dict(getattr(model, "sizevars", {}) or {}) if model is not None else {}
        self.sizes.update(sizes or {})
        self.diags: list[Diagnostic] = []
        self.decls: dict[str, ir.VarDecl] = {}
        self.temps: dict[str, ir.Assign] = {}

    # ---------------------------------------------------------------- helpers
    def error(self, message: str, span: ir.Span | None, related=()):
        self.diags.append(Diagnostic(message, span, "error", tuple(related)))

    def warning(self, message: str, span: ir.Span | None):
        self.diags.append(Diagnostic(message, span, "warning"))

    def top_span(self) -> ir.Span:
        return ir.Span(self.g.path, 1, 1)

    def resolve_dims(self, dims) -> tuple[int, ...] | None:
        try:
            return tuple(d.resolve(self.sizes) for d in dims)
        except KeyError:
            return None

    def dtype(self, name: str) -> str | None:
        if name in self.decls:
            return self.decls[name].dtype
        if name in self.temps:
            return self.temps[name].dtype
        return None

    def shape(self, name: str) -> tuple[int, ...] | None:
        if name in self.decls:
            return self.resolve_dims(self.decls[name].dims)
        if name in self.temps:
            return self.resolve_dims(self.temps[name].dims)
        return None

    def known(self, name: str) -> bool:
        return name in self.decls or name in self.temps

    def kind(self, name: str) -> MemKind | None:
        d = self.decls.get(name)
        return d.kind if d is not None else None

    def is_scalar(self, name: str) -> bool:
        shape = self.shape(name)
        if shape is None:
            dims = self.decls[name].dims if name in self.decls else self.temps[name].dims
            return len(dims) == 0 or not self.strict
        n = 1
        for s in shape:
            n *= s
        return n == 1

    def name_span(self, span: ir.Span, keyword: str) -> ir.Span:
        """The span of the word after `keyword` at `span` (an op's name)."""
        lines = self.g.source.splitlines()
        if 1 <= span.line <= len(lines):
            line = lines[span.line - 1]
            m = re.compile(re.escape(keyword) + r"\s+").match(line, span.col - 1)
            if m:
                return ir.Span(span.path, span.line, m.end() + 1)
        return span

    # ---------------------------------------------------------------- driver
    def run(self):
        self.check_vars()
        self.check_blocks_structure()
        self.collect_temps()
        for block in self.g.blocks:
            self.check_nodes(block, block.nodes, (), top=True)
        self.check_branch_graph()
        self.check_yield_await()

    # ---------------------------------------------------------------- declarations
    def check_vars(self):
        for d in self.g.vars:
            if d.name in self.decls:
                first = self.decls[d.name]
                self.error(f"duplicate variable declaration {d.name}", d.span,
                           [(f"{d.name} first declared here", first.span)])
                continue
            self.decls[d.name] = d
        for d in self.g.vars:
            self.check_decl(d)
        if self.model is not None:
            self.check_model()

    def check_decl(self, d: ir.VarDecl):
        if not dtypes.is_dtype(d.dtype):
            self.error(f"unsupported dtype {d.dtype}", d.span)
            return
        for dim in d.dims:
            for name in dim.names:
                if name not in self.sizes and self.strict:
                    self.error(f"invalid dims for {d.name}: unknown size: {name}", d.span)
        if d.table and not d.index_params:
            self.error(f"persistent table {d.name} missing table indices", d.attr_span("table"))
        if d.is_table and dtypes.get(d.dtype).packed:
            self.error("cache table packed dtypes not supported", d.span)
        for name, _ in d.fixed:
            if name not in d.index_params:
                self.error(f"@fixed names {name}, which is not an index parameter of {d.name}", d.attr_span("fixed"))
        for name in d.auto_dim:
            if name not in d.index_params:
                self.error(f"@auto_dim names {name}, which is not an index parameter of {d.name}",
                           d.attr_span("auto_dim"))
        if d.is_auto_dim and len(d.auto_dim) != len(d.dims):
            self.error(f"auto_dim requires {len(d.dims)} dims, got {len(d.auto_dim)}", d.attr_span("auto_dim"))
        if (d.table or d.auto_dim) and d.kind != MemKind.PERSISTENT:
            what = "@table" if d.table else "@auto_dim"
            self.error(f"{what} is only allowed on persistent variables, {d.name} is {d.kind.value}",
                       d.attr_span("table" if d.table else "auto_dim"))
        if d.index_params and not (d.table or d.auto_dim or d.pattern is not None):
            self.error(f"{d.name} has index parameters but no @pattern, @table or @auto_dim", d.span)
        if d.pattern is not None and d.index_params and not d.table:
            for param in d.index_params:
                if "{" + param + "}" not in d.pattern:
                    self.error(f"@pattern of {d.name} does not use index parameter {param}", d.attr_span("pattern"))
        if d.init is not None:
            msg = init_error(d.dtype, d.init)
            if msg:
                self.error(msg, d.attr_span("init"))

    def check_model(self):
        m = self.model
        tensors = m.tensors
        for d in self.decls.values():
            if d.ref is not None and d.ref not in tensors:
                self.error(f"model variable not found: {d.ref}", d.attr_span("ref"))
                continue
            if d.is_prefix_table:
                members = self.family_members(d)
                for tname in members:
                    self.check_bound(d, tname)
                if not members and d.kind == MemKind.CONSTANT:
                    self.error(f"constant {d.name} not found in model: no tensor matches @pattern(\"{d.pattern}\")",
                               d.span)
                continue
            tname = d.ref if d.ref is not None else d.name
            if tname in tensors:
                if not (d.is_table or d.is_auto_dim):
                    self.check_bound(d, tname)
            elif d.kind == MemKind.CONSTANT and d.name not in (m.metadata or {}):
                self.error(f"constant {d.name} not found in model (no tensor or metadata entry)", d.span)

    def family_members(self, d: ir.VarDecl) -> list[str]:
        parts = re.split(r"\{(\w+)\}", d.pattern)
        regex = "".join(re.escape(p) if i % 2 == 0 else r"\d+" for i, p in enumerate(parts))
        rx = re.compile(regex + r"\Z")
        return [t for t in self.model.tensors if rx.match(t)]

    def check_bound(self, d: ir.VarDecl, tname: str):
        info = self.model.tensors[tname]
        if info.dtype != d.dtype:
            self.error(f"model dtype mismatch for {d.name}: model {info.dtype}, graph {d.dtype}", d.span)
            return
        shape = self.resolve_dims(d.dims)
        if shape is not None and tuple(info.shape) != shape:
            self.error(f"model shape mismatch for {d.name}: model {_shape_text(info.shape)}, graph "
                       f"{_shape_text(shape)}", d.span)

    # ---------------------------------------------------------------- blocks
    def check_blocks_structure(self):
        if not self.g.blocks:
            self.error("graph has no blocks", self.top_span())
            return
        seen: dict[str, ir.Block] = {}
        for b in self.g.blocks:
            if b.name in seen:
                self.error(f"duplicate block {b.name}", b.span, [(f"block {b.name} first defined here", seen[b.name].span)])
            else:
                seen[b.name] = b
        if "entry" not in seen:
            self.error("graph has no entry block (block entry { ... })", self.top_span())

    def collect_temps(self):
        for block in self.g.blocks:
            for node in block.walk():
                if not isinstance(node, ir.Assign):
                    continue
                if node.name in self.decls:
                    self.error(f"assign shadows declared variable {node.name}", node.span,
                               [(f"{node.name} declared here", self.decls[node.name].span)])
                    continue
                if node.name in self.temps:
                    self.error(f"duplicate temporary {node.name}", node.span,
                               [(f"{node.name} first assigned here", self.temps[node.name].span)])
                    continue
                self.temps[node.name] = node
                if not dtypes.is_dtype(node.dtype):
                    self.error(f"unsupported dtype {node.dtype}", node.span)
                for dim in node.dims:
                    for name in dim.names:
                        if name not in self.sizes and self.strict:
                            self.error(f"invalid dims for {node.name}: unknown size: {name}", node.span)

    def check_nodes(self, block: ir.Block, nodes, loops: tuple[str, ...], top: bool):
        for pos, node in enumerate(nodes):
            if isinstance(node, ir.Op):
                self.check_op(node, loops)
            elif isinstance(node, ir.CacheRead):
                self.check_cache_read(node, loops)
            elif isinstance(node, ir.CacheWrite):
                self.check_cache_write(node, loops)
            elif isinstance(node, ir.CacheReset):
                self.check_cache_reset(node, loops)
            elif isinstance(node, (ir.CacheIncrement, ir.CacheDecrement)):
                self.check_incdec(node)
            elif isinstance(node, ir.Branch):
                self.check_branch(node)
            elif isinstance(node, ir.Transfer):
                self.check_transfer(node, loops)
            elif isinstance(node, ir.Loop):
                if node.var in loops:
                    self.error(f"loop index {node.var} shadows an enclosing loop index", node.span)
                for which, bound in (("start", node.start), ("end", node.end)):
                    self.check_loop_bound(node, which, bound, loops)
                self.check_nodes(block, node.body, loops + (node.var,), top=False)
            elif isinstance(node, ir.Return):
                if node.vars and (block.name != "entry" or not top):
                    where = "inside a loop" if block.name == "entry" else f"in block {block.name}"
                    self.error(f"return with values is only allowed at the top level of entry, not {where}",
                               node.span)
                for v in node.vars:
                    if not self.known(v):
                        self.error(f"unknown variable: {v}", node.span)
            elif isinstance(node, (ir.Yield, ir.Await)):
                word = "yield" if isinstance(node, ir.Yield) else "await"
                for v in node.vars:
                    if not self.known(v):
                        self.error(f"unknown variable: {v}", node.span)
                    elif word == "await" and self.kind(v) == MemKind.CONSTANT:
                        self.error(f"await may not name constant {v}", node.span)
                if word == "yield" and top and block.name != "entry" and pos != len(nodes) - 1:
                    self.error(f"yield in block {block.name} must be the final node", node.span)

    # ---- ops
    def check_ref(self, ref: ir.VarRef, loops, unknown_msg: str) -> bool:
        """A variable use (op input, transfer source); False when it cannot be typed."""
        if ref.name in loops and ref.indices is None:
            self.error(f"loop index {ref.name} is not a variable", ref.span)
            return False
        if not self.known(ref.name):
            self.error(f"{unknown_msg} {ref.name}", ref.span)
            return False
        if ref.indices is not None:
            d = self.decls.get(ref.name)
            if d is None or not d.is_prefix_table:
                self.error(f"{ref.name} is not a prefix table and cannot be indexed", ref.span)
                return False
            if len(ref.indices) != len(d.index_params):
                self.error(f"prefix table {ref.name} expects {len(d.index_params)} indices, got {len(ref.indices)}",
                           ref.span)
                return False
            for ix in ref.indices:
                if isinstance(ix, str) and ix not in loops and ix not in self.sizes and self.strict:
                    self.error(f"unknown prefix table index {ix} (expected a loop index or size variable)",
                               ref.span)
        return True

    def check_op(self, node: ir.Op, loops):
        from . import ops
        name_span = self.name_span(node.span, "op")
        if node.op not in ops.REGISTRY:
            self.error(f"unsupported op {node.op}", name_span)
            return
        spec = ops.REGISTRY[node.op]
        ok = True
        for ref in node.inputs:
            if not self.check_ref(ref, loops, "unknown input variable"):
                ok = False
            elif ref.indices is None and self.kind(ref.name) == MemKind.PERSISTENT:
                self.error(f"persistent cache {ref.name} must be read via cache.read", ref.span)
                ok = False
        out = node.output
        out_ok = True
        if not self.known(out):
            self.error(f"unknown output variable {out}", node.output_span)
            out_ok = False
        elif self.kind(out) == MemKind.CONSTANT:
            self.error(f"cannot write to constant memory: {out}", node.output_span)
            out_ok = False
        elif self.kind(out) == MemKind.PERSISTENT:
            self.error(f"persistent cache {out} must be written via cache.write", node.output_span)
            out_ok = False
        # variable-valued attributes
        for attr in node.attrs:
            aname = "alpha" if (node.op, attr.name) == ("relu", "negative_slope") else attr.name
            aspec = spec.attrs.get(aname)
            if attr.value.kind != "var" or aspec is None:
                continue
            var = attr.value.value
            if aspec.kind == "string":
                if self.model is not None:
                    meta = (self.model.metadata or {}).get(var)
                    if meta is None or getattr(meta, "type", None) != "string":
                        self.error(f"unknown attribute string: {var}", attr.span)
            elif aspec.kind == "scalar":
                if self.model is not None and getattr((self.model.metadata or {}).get(var), "type", None) == "string":
                    continue
                if not self.known(var):
                    self.error(f"unknown attribute variable {var}", attr.span)
                elif not self.is_scalar(var):
                    self.error(f"attribute {var} must be scalar", attr.span)
        if not ok:
            return
        in_dtypes = [self.dtype(r.name) for r in node.inputs]
        in_shapes = [self.shape(r.name) for r in node.inputs]
        in_names = [r.name if r.indices is None else str(r) for r in node.inputs]
        try:
            sig = ops.infer(node.op, in_dtypes, in_shapes, node.attr_map, out_name=out, in_names=in_names)
        except ops.OpTypeError as exc:
            span = name_span
            if exc.attr is not None:
                for a in node.attrs:
                    if a.name == exc.attr or (exc.attr == "alpha" and a.name == "negative_slope"):
                        span = a.span
            elif exc.input is not None and 0 <= exc.input < len(node.inputs):
                span = node.inputs[exc.input].span
            self.error(exc.message, span)
            return
        if not out_ok:
            return
        declared = self.dtype(out)
        if declared != sig.out_dtype:
            self.error(f"op {node.op} output dtype mismatch for {out}: expected {declared}, got {sig.out_dtype}",
                       node.output_span)
            return
        out_shape = self.shape(out)
        if sig.out_shape is not None and out_shape is not None and tuple(sig.out_shape) != out_shape:
            self.error(f"op {node.op} output shape mismatch for {out}: {out} is {_shape_text(out_shape)}, "
                       f"the result is {_shape_text(sig.out_shape)}", node.output_span)

    # ---- cache
    def cache_target(self, access_name: str, span: ir.Span, word: str) -> ir.VarDecl | None:
        d = self.decls.get(access_name)
        if d is None:
            self.error(f"unknown cache variable {access_name}", span)
            return None
        if d.kind != MemKind.PERSISTENT:
            self.error(f"{word} expects persistent variable, got {_KIND_WORD[d.kind]} {access_name}", span)
            return None
        return d

    def index_value(self, value, loops, span, slice_end=False) -> int | None:
        """Validate one cache index (§4.1); its static value when known."""
        if isinstance(value, int):
            if value < 0 and not slice_end:
                self.error("cache index cannot be negative", span)
            return value
        if value in self.sizes:
            return self.sizes[value]
        if value in loops:
            return None
        d = self.decls.get(value)
        if d is not None and d.kind == MemKind.PERSISTENT and not d.index_params and self.is_scalar(value):
            dt = dtypes.get(d.dtype)
            if dt.packed:
                self.error(f"cache index {value}: packed scalars are not supported", span)
            elif not (dt.is_int or dt.family == dtypes.BOOL):
                self.error(f"cache index must be integer: {value} is {d.dtype}", span)
            return None
        if d is None and not self.strict:
            return None  # may be a size variable of the model bound later
        self.error(f"unknown cache index {value}", span)
        return None

    def check_access(self, d: ir.VarDecl, acc: ir.CacheAccess, loops, op: str) -> list | None:
        """Structural checks of §4.7; returns the per-position static info or None on error."""
        n = len(acc.indices)
        if d.is_table:
            if not acc.bracketed:
                self.error(f"cache table {d.name} requires indices", acc.span)
                return None
            limit = len(d.table_indices)
            if n > limit:
                self.error(f"cache access {d.name} expects at most {limit} indices, got {n}", acc.span)
                return None
        else:
            if n > len(d.dims):
                self.error(f"cache access expects at most {len(d.dims)} indices, got {n}", acc.span)
                return None
            if d.is_auto_dim:
                if n > len(d.auto_dim):
                    self.error(f"cache access {d.name} expects at most {len(d.auto_dim)} indices, got {n}", acc.span)
                    return None
                if any(isinstance(e, ir.Slice) for e in acc.indices):
                    self.error(f"cache access {d.name} does not support slice indices", acc.span)
                    return None
        out = []
        for e in acc.indices:
            if isinstance(e, ir.Single):
                out.append(("single", self.index_value(e.value, loops, acc.span)))
            else:
                start = None if e.start is None else self.index_value(e.start, loops, acc.span)
                end = None if e.end is None else self.index_value(e.end, loops, acc.span, slice_end=True)
                out.append(("slice", e.start is None, start, e.end is None, end))
        return out

    def read_shape(self, d: ir.VarDecl, acc: ir.CacheAccess, info: list) -> tuple[int, ...] | None:
        entry = self.resolve_dims(d.dims)
        if entry is None:
            return None
        if not d.table and not d.auto_dim:
            return entry
        if not d.is_table:
            return None  # auto_dim: grows at run time
        fixed = d.fixed_map
        lead = []
        for j, name in enumerate(d.table_indices):
            item = info[j] if j < len(info) else ("slice", True, None, True, None)
            if item[0] == "single":
                continue
            _, no_start, start, no_end, end = item
            size = fixed.get(name)
            start = 0 if no_start else start
            if no_end:
                end = size
            elif end is not None and end < 0:
                end = None if size is None else size + end
            if start is None or end is None:
                return None
            lead.append(max(end - start, 0))
        return tuple(lead) + entry

    def check_cache_read(self, node: ir.CacheRead, loops):
        d = self.cache_target(node.src.base, node.src.span, "cache.read")
        dst = node.dst
        dst_ok = True
        if not self.known(dst.name):
            self.error(f"unknown output variable {dst.name}", dst.span)
            dst_ok = False
        elif dst.indices is not None:
            self.error(f"cache.read destination {dst.name} cannot be indexed", dst.span)
            dst_ok = False
        elif self.kind(dst.name) == MemKind.CONSTANT:
            self.error(f"cannot write to constant memory: {dst.name}", dst.span)
            dst_ok = False
        elif self.kind(dst.name) == MemKind.PERSISTENT:
            self.error(f"persistent cache {dst.name} must be written via cache.write", dst.span)
            dst_ok = False
        if d is None:
            return
        info = self.check_access(d, node.src, loops, "read")
        if info is None:
            return
        if not d.table and not d.auto_dim and node.src.bracketed:
            self.error(f"cache {d.name} does not support indexed access", node.src.span)
            return
        if not dst_ok:
            return
        if self.dtype(dst.name) != d.dtype:
            self.error(f"cache.read {d.name} -> {dst.name} dtype mismatch: {d.name} is {d.dtype}, "
                       f"{dst.name} is {self.dtype(dst.name)}", dst.span)
            return
        shape = self.read_shape(d, node.src, info)
        declared = self.shape(dst.name)
        if shape is not None and declared is not None and shape != declared:
            self.error(f"cache.read {d.name} -> {dst.name} shape mismatch: the read gives {_shape_text(shape)}, "
                       f"{dst.name} is {_shape_text(declared)}", dst.span)

    def check_cache_write(self, node: ir.CacheWrite, loops):
        src_ok = self.check_ref(node.src, loops, "unknown input variable")
        if src_ok and node.src.indices is None and self.kind(node.src.name) == MemKind.PERSISTENT:
            self.error(f"persistent cache {node.src.name} must be read via cache.read", node.src.span)
            src_ok = False
        d = self.cache_target(node.dst.base, node.dst.span, "cache.write")
        if d is None:
            return
        info = self.check_access(d, node.dst, loops, "write")
        if info is None:
            return
        if d.is_table:
            if len(info) < len(d.table_indices) or any(i[0] == "slice" for i in info):
                self.error(f"cache.write {d.name} does not support slice indices", node.dst.span)
                return
        elif not d.auto_dim and node.dst.indices:
            self.error(f"cache.write {d.name} does not support indexed writes", node.dst.span)
            return
        if not src_ok:
            return
        if self.dtype(node.src.name) != d.dtype:
            self.error(f"cache.write {node.src.name} -> {d.name} dtype mismatch: {d.name} is {d.dtype}, "
                       f"{node.src.name} is {self.dtype(node.src.name)}", node.src.span)
            return
        if d.is_auto_dim:
            return
        entry = self.resolve_dims(d.dims)
        got = self.shape(node.src.name)
        if entry is not None and got is not None and entry != got:
            self.error(f"cache.write {d.name} expects shape {_shape_text(entry)}, got {_shape_text(got)}",
                       node.src.span)

    def check_cache_reset(self, node: ir.CacheReset, loops):
        d = self.cache_target(node.target.base, node.target.span, "cache.reset")
        if d is None:
            return
        info = self.check_access(d, node.target, loops, "reset")
        if info is None:
            return
        if d.is_table and any(i[0] == "slice" for i in info):
            self.error(f"cache.reset {d.name} requires scalar indices", node.target.span)

    def check_incdec(self, node):
        word = "cache.increment" if isinstance(node, ir.CacheIncrement) else "cache.decrement"
        d = self.cache_target(node.target, node.span, word)
        if d is None:
            return
        if d.index_params or not self.is_scalar(d.name):
            self.error(f"{word} {d.name} requires a scalar persistent variable", node.span)
            return
        dt = dtypes.get(d.dtype)
        if dt.packed or dt.family in (dtypes.BOOL, dtypes.BITSET):
            self.error(f"{word} {d.name} does not support dtype {d.dtype}", node.span)

    # ---- control
    def check_scalar_var(self, name: str, span: ir.Span, prefix: str = "") -> bool:
        if not self.known(name):
            self.error(f"{prefix}unknown variable {name}", span)
            return False
        if not self.is_scalar(name):
            self.error(f"{prefix}{name} must be scalar", span)
            return False
        return True

    def check_branch(self, node: ir.Branch):
        if node.cond is not None and self.check_scalar_var(node.cond, node.span):
            if dtypes.get(self.dtype(node.cond)).packed:
                self.error(f"branch condition {node.cond}: packed scalars are not supported", node.span)
        for target in (node.then_block, node.else_block):
            if target is not None and target not in self.g.block_map:
                self.error(f"branch target block not found: {target}", node.span)

    def check_loop_bound(self, node: ir.Loop, which: str, bound, loops):
        if isinstance(bound, int) or bound in self.sizes:
            return
        prefix = f"loop {which} bound {bound} is invalid: "
        if bound in loops:
            self.error(prefix + f"loop index {bound} is not a variable", node.span)
            return
        if not self.known(bound) and not self.strict:
            return  # may be a size variable of a model bound later
        if self.check_scalar_var(bound, node.span, prefix) and dtypes.get(self.dtype(bound)).packed:
            self.error(prefix + "packed scalars are not supported", node.span)

    def check_transfer(self, node: ir.Transfer, loops):
        src_ok = self.check_ref(node.src, loops, "unknown transfer source")
        if src_ok and node.src.indices is None and self.kind(node.src.name) == MemKind.PERSISTENT:
            self.error(f"persistent cache {node.src.name} must be read via cache.read", node.src.span)
            src_ok = False
        dst = node.dst
        if not self.known(dst.name):
            self.error(f"unknown transfer destination {dst.name}", dst.span)
            return
        if dst.indices is not None or self.kind(dst.name) in (MemKind.CONSTANT, MemKind.PERSISTENT):
            self.error(f"cannot transfer into {dst}", dst.span)
            return
        if not src_ok:
            return
        if self.dtype(node.src.name) != self.dtype(dst.name):
            self.error(f"transfer dtype mismatch: {node.src} is {self.dtype(node.src.name)}, {dst.name} is "
                       f"{self.dtype(dst.name)}", dst.span)
            return
        a, b = self.shape(node.src.name), self.shape(dst.name)
        if a is not None and b is not None and a != b:
            self.error(f"transfer shape mismatch: {node.src} is {_shape_text(a)}, {dst.name} is {_shape_text(b)}",
                       dst.span)

    # ---------------------------------------------------------------- whole-graph rules
    def branch_targets(self) -> dict[str, list[ir.Branch]]:
        edges: dict[str, list[ir.Branch]] = {}
        for b in self.g.blocks:
            for node in b.walk():
                if isinstance(node, ir.Branch):
                    edges.setdefault(b.name, []).append(node)
        return edges

    def check_branch_graph(self):
        edges = self.branch_targets()
        blocks = self.g.block_map
        reported: set[int] = set()
        state: dict[str, int] = {}  # 1 visiting, 2 done
        path: list[str] = []

        def visit(name: str):
            state[name] = 1
            path.append(name)
            for br in edges.get(name, []):
                for t in (br.then_block, br.else_block):
                    if t is None or t not in blocks:
                        continue
                    if state.get(t) == 1:
                        if br.index not in reported:
                            reported.add(br.index)
                            cycle = path[path.index(t):] + [t]
                            self.error(f"recursion through branches: {' -> '.join(cycle)}", br.span)
                    elif t not in state:
                        visit(t)
            path.pop()
            state[name] = 2

        order = (["entry"] if "entry" in blocks else []) + [b.name for b in self.g.blocks]
        for name in order:
            if name not in state:
                visit(name)

    def check_yield_await(self):
        blocks = self.g.block_map
        targets = {t for brs in self.branch_targets().values() for br in brs
                   for t in (br.then_block, br.else_block) if t is not None}
        # non-entry blocks: await/yield consistency (§3.6)
        for b in self.g.blocks:
            if b.name == "entry":
                continue
            awaited: list[str] = []
            yielded: set[str] = set()
            first_await = None
            for node in b.walk():
                if isinstance(node, ir.Await):
                    awaited += [v for v in node.vars if v not in awaited]
                    first_await = first_await or node
                elif isinstance(node, ir.Yield):
                    yielded.update(node.vars)
            if awaited and not yielded:
                self.error(f"block {b.name} awaits [{', '.join(awaited)}] but never yields them", first_await.span)
            elif awaited:
                for v in awaited:
                    if v not in yielded:
                        self.error(f"block {b.name} awaits {v} but does not yield it", first_await.span)
        entry = blocks.get("entry")
        all_yielded: set[str] = set()
        if entry is not None:
            all_yielded = self.check_entry_windows(entry, targets)
        # dead blocks
        for b in self.g.blocks:
            if b.name == "entry" or b.name in targets:
                continue
            awaits = {v for n in b.walk() if isinstance(n, ir.Await) for v in n.vars}
            if not (awaits & all_yielded):
                self.warning(f"block {b.name} is never run: no branch targets it and it awaits no variable "
                             f"that entry yields", b.span)

    def consumers(self, yielded: tuple[str, ...], targets: set[str]) -> list[ir.Block]:
        out = []
        for b in sorted(self.g.block_map.values(), key=lambda b: b.name):
            if b.name == "entry" or b.name in targets:
                continue
            if any(isinstance(n, ir.Await) and set(n.vars) & set(yielded) for n in b.walk()):
                out.append(b)
        return out

    def check_entry_windows(self, entry: ir.Block, targets: set[str]) -> set[str]:
        all_yielded: set[str] = set()
        pending: ir.Yield | None = None
        window: list[ir.Node] = []
        for node in entry.walk():
            if isinstance(node, ir.Yield):
                all_yielded.update(node.vars)
                if pending is not None:
                    self.error("await required before next yield", node.span,
                               [("previous yield here", pending.span)])
                    continue
                pending, window = node, []
            elif isinstance(node, ir.Await):
                if pending is None:
                    self.error(f"await {', '.join(node.vars)} has no matching yield", node.span)
                    continue
                self.check_window(pending, window, targets)
                pending = None
            elif pending is not None:
                window.append(node)
        if pending is not None:
            self.error(f"yield {', '.join(pending.vars)} has no matching await", pending.span)
        return all_yielded

    def check_window(self, y: ir.Yield, window: list[ir.Node], targets: set[str]):
        writers: dict[str, tuple[str, ir.Span]] = {}
        for node in window:
            var = _writes(node)
            if var is None:
                continue
            if var in y.vars:
                self.error(f"entry writes yielded variable {var} between yield and await", node.span,
                           [("yielded here", y.span)])
                continue
            writers.setdefault(var, ("entry", node.span))
        for b in self.consumers(y.vars, targets):
            seen: set[str] = set()
            for node in b.walk():
                var = _writes(node)
                if var is None or var in seen:
                    continue
                seen.add(var)
                if var in writers:
                    who, span = writers[var]
                    self.error(f"multiple blocks mutated {var}: block {b.name} and {who} write it in the same "
                               f"yield..await window", node.span, [(f"{var} also written here ({who})", span)])
                else:
                    writers[var] = (f"block {b.name}", node.span)


# ---------------------------------------------------------------- @init rules (§2.3)

_PACKED_RANGES = {"i4": (-8, 7), "i2": (-2, 1), "i1": (-1, 0), "u4": (0, 15), "u2": (0, 3), "u1": (0, 1),
                  "t2": (-1, 1)}


def init_error(dtype: str, lit: ir.Literal) -> str | None:
    dt = dtypes.get(dtype)
    if lit.kind == "float":
        return None if dt.is_float else "float init requires f8/bf16/f16/f32/f64 dtype"
    if lit.kind == "bool":
        return None if dtype == "bool" else "bool init requires bool dtype"
    if lit.kind != "int":
        return f"unsupported init value kind {lit.kind}"
    v = lit.value
    if dt.is_float:
        return f"int init requires an integer, bool or bitset dtype, got {dtype} (write {v}.0)"
    if dtype == "t1":
        return None if v in (-1, 1) else "t1 init out of range"
    if dtype in _PACKED_RANGES:
        lo, hi = _PACKED_RANGES[dtype]
    elif dtype == "bool":
        lo, hi = 0, 1
    elif dtype == "bitset":
        lo, hi = 0, 255
    else:
        lo, hi = dt.min, dt.max
    return None if lo <= v <= hi else f"{dtype} init out of range"
