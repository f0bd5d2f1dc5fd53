"""Declaration rules: variable declarations, @init values, model binding, blocks and assign temporaries."""
from __future__ import annotations

import numpy as np

from .. import dtypes, ir, messages
from ..diagnostics import suggest
from ..ir import MemKind
from ..naming import family_hole, family_members, member_name, resolve_alias  # the one prefix-member
# lookup and alias rule (bind's too)
from . import shape_text


class DeclRules:
    """Rules run once over the graph's declarations, before the node walk."""

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
                    self.error(messages.unknown_size(d.name, name, self.model, self.no_model, self.sizes), d.span)
        if d.table and not d.index_params:
            self.error(f"persistent table {d.name} missing table indices", d.attr_span("table"))
        if d.is_table and dtypes.get(d.dtype).packed:
            self.error("cache table packed dtypes not supported", d.span)
        for name, size in d.fixed:
            if name not in d.index_params:
                self.error(f"@fixed names {name}, which is not an index parameter of {d.name}", d.attr_span("fixed"))
            elif isinstance(size, str) and size not in self.sizes and self.strict:
                self.error(messages.unknown_fixed_size(name, size, d.name, self.sizes), d.attr_span("fixed"))
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
        if len(d.dims) > ir.MAX_RANK:
            self.error(f"{d.name} has {len(d.dims)} dimensions; the limit is {ir.MAX_RANK}", d.span)

    def check_model(self):
        m = self.model
        tensors = m.tensors
        for d in self.decls.values():
            if d.ref is not None and resolve_alias(m, d.ref) not in tensors:
                self.error(f"model variable not found: {d.ref}", d.attr_span("ref"))
                continue
            if d.is_prefix_table:
                members = family_members(d, tensors)
                for tname in members.values():
                    self.check_bound(d, tname)
                if not members and d.kind == MemKind.CONSTANT:
                    self.error(f"constant {d.name} not found in model: no tensor matches @pattern(\"{d.pattern}\")",
                               d.span)
                hole = family_hole(members)
                if hole is not None:  # bind stacks the grid 0..largest index: a hole has no value
                    self.error(messages.prefix_member_missing(d.name, member_name(d, hole)), d.span)
                continue
            tname = resolve_alias(m, d.ref if d.ref is not None else d.name)
            if tname in tensors:
                if not (d.is_table or d.is_auto_dim):
                    self.check_bound(d, tname)
            elif d.kind == MemKind.CONSTANT and d.name not in (m.metadata or {}):
                known = list(self.model.tensors) + list(self.model.metadata or {})
                init = (" (its @init is its value only when no model is given: add the tensor to the model, or declare it "
                        "volatile, whose @init is its value at every step and which ops read as they read a constant)"
                        ) if d.init is not None else ""
                self.error(f"constant {d.name} not found in model (no tensor or metadata entry)"
                           f"{suggest(d.ref or d.name, known)}{init}", d.span)

    def check_bound(self, d: ir.VarDecl, tname: str):
        info = self.model.tensors[tname]
        # GGML blocks as their f32 value, QuantParams' integers as f32 too, bf16/f16 as f32 with widen_floats
        if not info.binds_as(d.dtype, self.widen_floats):
            self.error(messages.model_dtype_mismatch(d.name, info, d.dtype), d.span)
            return
        shape = self.resolve_dims(d.dims)
        if shape is not None and tuple(info.value_shape) != shape:
            self.error(f"model shape mismatch for {d.name}: model {shape_text(info.value_shape)}, graph "
                       f"{shape_text(shape)}", d.span)

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
                            self.error(messages.unknown_size(node.name, name, self.model, self.no_model,
                                                             self.sizes), node.span)



# ---------------------------------------------------------------- @init rules (§2.3)

_PACKED_RANGES = {"i4": (-8, 7), "i2": (-2, 1), "i1": (-1, 0), "u4": (0, 15), "u2": (0, 3), "u1": (0, 1),
                  "t2": (-1, 1)}


def init_error(dtype: str, lit: ir.Literal, what: str = "init") -> str | None:
    """Why literal `lit` cannot be a value of `dtype` (SPEC §2.3, THE rule of `@init` and of a
    literal op input, `what` naming which), or None when it can."""
    dt = dtypes.get(dtype)
    if lit.kind == "float":
        if not dt.is_float:
            return f"float {what} requires f8/bf16/f16/f32/f64 dtype"
        v = lit.value
        if v == v and abs(v) != float("inf") and abs(v) > float(dt.max):  # e.g. 100000.0 on f16: not inf
            with np.errstate(over="ignore"):  # rounded as `init_scalar` stores it (via f32 but for f16 and
                # f64), to nearest: 3.4028235e38 (FLT_MAX as printed) is f32's largest, 65519 rounds to
                # f16's 65504; what rounds past the largest is an error (f8 61440: SPEC §5.4's encoder
                # would make it 32768), as a model value's is (`writer.overflow`)
                stored = np.asarray(float(v), np.float64 if dtype in ("f16", "f64") else np.float32)
                stored = stored.astype(dt.np_dtype).astype(np.float64)
            if not np.isfinite(stored):
                return f"{dtype} {what} {v!r} is out of range (largest finite {dtype} is {dt.max:g})"
        return None
    if lit.kind == "bool":
        return None if dtype == "bool" else f"bool {what} requires bool dtype"
    if lit.kind != "int":
        return f"unsupported {what} value kind {lit.kind}"
    v = lit.value
    if dt.is_float:
        return f"int {what} requires an integer, bool or bitset dtype, got {dtype} (write {int(v)}.0)"
    if dtype == "t1":
        return None if v in (-1, 1) else f"t1 {what} out of range"
    if dtype in _PACKED_RANGES:
        lo, hi = _PACKED_RANGES[dtype]
    elif dtype == "bool":
        lo, hi = 0, 1
    elif dtype == "bitset":
        lo, hi = 0, 255
    else:
        lo, hi = dt.min, dt.max
    return None if lo <= v <= hi else f"{dtype} {what} out of range"
