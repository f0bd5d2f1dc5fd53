"""Cache access rules (§4.7): cache.read/write/reset/increment/decrement targets, indices and shapes."""
from __future__ import annotations

from .. import dtypes, ir
from .. import messages
from ..ir import MemKind
from . import shape_text

_KIND_WORD = {MemKind.DYNAMIC: "Dynamic", MemKind.VOLATILE: "Volatile", MemKind.CONSTANT: "Constant",
              MemKind.PERSISTENT: "Persistent"}


class CacheRules:
    """Per-node rules for the cache.* nodes on persistent variables (tables, auto_dim, plain)."""

    # ---- cache
    def cache_target(self, access_name: str, span: ir.Span, word: str) -> ir.VarDecl | None:
        d = self.decls.get(access_name)
        if d is None:
            self.error(f"unknown cache variable {access_name}{self.near(access_name)}", span)
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

    def read_shape(self, d: ir.VarDecl, acc: ir.CacheAccess, info: list) -> tuple[int | None, ...] | None:
        """The shape a read gives (SPEC §4.3), None where its rank is not known before the run,
        a dim None where only its length is (a slice bound read at run time)."""
        entry = self.resolve_dims(d.dims)
        if entry is None:
            return None
        if not d.table and not d.auto_dim:
            return entry
        if not d.is_table:
            return None  # auto_dim: grows at run time
        try:
            fixed = d.fixed_sizes(self.sizes)
        except KeyError:  # an unknown size variable: checks/decls reports it
            return None
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
            lead.append(None if start is None or end is None else max(end - start, 0))
        return tuple(lead) + entry

    def check_cache_read(self, node: ir.CacheRead, loops):
        d = self.cache_target(node.src.base, node.src.span, "cache.read")
        dst = node.dst
        dst_ok = True
        if not self.known(dst.name):
            self.error(f"unknown output variable {dst.name}{self.near(dst.name)}", dst.span)
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
        if shape is not None and declared is not None and (
                len(shape) != len(declared) or any(a is not None and a != b for a, b in zip(shape, declared))):
            known = "" if None not in shape else " (?: a length read at run time)"
            self.error(f"cache.read {d.name} -> {dst.name} shape mismatch: the read gives {shape_text(shape)}, "
                       f"{dst.name} is {shape_text(declared)}{known}", dst.span)

    def check_cache_write(self, node: ir.CacheWrite, loops):
        src_ok = self.check_source(node.src, loops, "unknown input variable")
        d = self.cache_target(node.dst.base, node.dst.span, "cache.write")
        if d is None:
            return
        info = self.check_access(d, node.dst, loops, "write")
        if info is None:
            return
        rows = False  # a slice write (docs/semantics.md, "Writes of several rows"): the value has a leading row axis
        if d.is_table:
            if len(info) < len(d.table_indices):
                # OpenInfer's words (SPEC §4.4: a missing position is a slice), then which are missing
                self.error(f"cache.write {d.name} does not support slice indices ({d.name} takes "
                           f"{len(d.table_indices)} indices ({', '.join(d.table_indices)}), the write names "
                           f"{len(info)}: a write replaces one entry)", node.dst.span)
                return
            rows = any(i[0] == "slice" for i in info)
            if rows and not self.check_slice_write(d, node, info):
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
        if rows and entry is not None and got is not None and (len(got) != len(entry) + 1 or got[1:] != entry):
            self.error(messages.write_rows_shape(d.name, entry, got), node.src.span)
        elif not rows and entry is not None and got is not None and entry != got:
            self.error(messages.write_shape(d.name, entry, got),
                       node.src.span)

    def check_slice_write(self, d: ir.VarDecl, node: ir.CacheWrite, info: list) -> bool:
        """`cache.write v >> M[i, a..b]`: one slice, with both ends, over @fixed dimensions only, of
        a value with a leading row axis (the opt-in: a value of one entry's shape, what an OpenInfer
        program would write, keeps OpenInfer's error)."""
        span = node.dst.span
        entry, got = self.resolve_dims(d.dims), self.shape(node.src.name)
        if entry is not None and got is not None and len(got) != len(entry) + 1:  # unknown: checked with the sizes
            self.error(f"cache.write {d.name} does not support slice indices (a write of several rows takes "
                       f"a value of shape [S] + the entry's {shape_text(entry)})", span)
            return False
        slices = [i for i in info if i[0] == "slice"]
        if len(slices) > 1:
            self.error(f"cache.write {d.name}: a write takes at most one slice index, got {len(slices)}", span)
            return False
        _, no_start, start, no_end, end = slices[0]
        if no_start or no_end:
            self.error(f"cache.write {d.name}: a slice write names both ends (a..b)", span)
            return False
        if end is not None and end < 0:
            self.error(f"cache.write {d.name}: a slice write's end cannot be negative", span)
            return False
        try:
            fixed = d.fixed_sizes(self.sizes)
        except KeyError:  # an unknown size variable: checks/decls reports it
            return False
        loose = [n for n in d.table_indices if n not in fixed]
        if loose:
            self.error(f"cache.write {d.name}: a slice write needs every table dimension @fixed "
                       f"({', '.join(loose)} is not)", span)
            return False
        return True

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
