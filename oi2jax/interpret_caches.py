"""Host-side state of the reference interpreter: cache tables, auto_dim growth, plain persistent, cache indices."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from . import dtypes as dt
from . import ir
from .host_numerics import f8_encode, state_fill
from .limits import growth_refused
from . import messages
from .messages import CHECKED

if TYPE_CHECKING:
    from .interpret import Ctx, Frame


# ---------------------------------------------------------------------------------------- state


@dataclass
class Table:
    """A cache table: materialised entries by index tuple, current size per table index."""

    sizes: list[int]
    fixed: list[int | None]
    entries: dict[tuple[int, ...], np.ndarray] = field(default_factory=dict)

    def copy(self) -> "Table":
        return Table(list(self.sizes), list(self.fixed), dict(self.entries))

    def reset_sizes(self) -> None:
        for d, fixed in enumerate(self.fixed):
            if fixed is not None:
                self.sizes[d] = fixed
            else:
                self.sizes[d] = max((k[d] + 1 for k in self.entries), default=0)


@dataclass
class State:
    """All values: `values` (every non-table variable and temporary, including plain persistent
    and auto_dim tensors), `tables`, `counts` (auto_dim counts). Arrays are never mutated in
    place, so copies are shallow."""

    values: dict[str, np.ndarray] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)
    counts: dict[str, list[int]] = field(default_factory=dict)

    def copy(self) -> "State":
        return State(dict(self.values), {k: t.copy() for k, t in self.tables.items()},
                      {k: list(c) for k, c in self.counts.items()})

    def take(self, other: "State", name: str) -> None:
        """Copy variable `name` (value, table or auto_dim counts) from `other`."""
        if name in other.tables:
            self.tables[name] = other.tables[name].copy()
        if name in other.values:
            self.values[name] = other.values[name]
        if name in other.counts:
            self.counts[name] = list(other.counts[name])


# ----------------------------------------------------------------------------------- helpers


def _shape(a) -> list[int]:
    return [int(s) for s in np.shape(a)]


class CacheOps:
    """Mixin of `InterpretedProgram`: cache index resolution and the cache.* nodes on a `State`.

    Uses the program's `graph`, `_sizes`, `_err`, `_read_ref` and `_ref_dtype`."""

    # ---------------------------------------------------------------------- index resolution

    def _loop_index(self, name: str, frames: list[Frame]) -> int | None:
        for f in reversed(frames):
            if f.loop is not None and f.loop.var == name:
                return f.value
        return None

    def _index(self, value: ir.IndexValue, frames, st: State, node, what="cache index") -> int:
        if isinstance(value, int):
            return value
        if value in self._sizes:
            return int(self._sizes[value])
        li = self._loop_index(value, frames)
        if li is not None:
            return li
        decl = self.graph.var(value)
        if decl is not None and decl.kind == ir.MemKind.PERSISTENT and decl.is_scalar and value in st.values:
            d = dt.get(decl.dtype)
            if d.packed:
                raise self._err(f"{what} {value}: packed scalars are not supported", node)
            if d.family not in (dt.SIGNED, dt.UNSIGNED, dt.BOOL):
                raise self._err(f"{what} must be integer: {value} is {decl.dtype}", node)
            v = int(np.asarray(st.values[value]).reshape(()))
            if v >= messages.I64_RANGE[1]:  # a u64 at 2^63 or more
                raise self._err(messages.index_out_of_range(what, value, v), node)
            return v
        raise self._err(f"unknown {what} {value}", node)

    def _table_array(self, decl: ir.VarDecl, t: Table) -> np.ndarray:
        entry = decl.shape(self._sizes)
        arr = np.broadcast_to(state_fill(decl, entry), tuple(t.sizes) + entry).copy()
        for k, v in t.entries.items():
            if all(i < s for i, s in zip(k, t.sizes)):
                arr[k] = v
        return arr

    # ------------------------------------------------------------------------------------ caches

    def _persistent(self, name: str, node, op: str) -> ir.VarDecl:
        decl = self.graph.var(name)
        assert decl is not None and decl.kind == ir.MemKind.PERSISTENT, f"{op} {name}: %s" % CHECKED
        return decl

    def _grow(self, decl: ir.VarDecl, t: Table, d: int, size: int, node, what: str = "index") -> None:
        fixed = t.fixed[d]
        if fixed is not None and size > fixed:
            raise self._err(messages.exceeds_fixed(decl.name, d, fixed, what, size - 1 if what == "index" else size),
                            node)
        if size > t.sizes[d]:  # refuse before allocating: a write at index 10**12 ...
            sizes = [size if j == d else n for j, n in enumerate(t.sizes)]
            nbytes = dt.get(decl.dtype).nbytes(math.prod(sizes) * math.prod(decl.shape(self._sizes)))
            at = size - 1 if what == "index" else size
            refused = growth_refused(decl.name, nbytes, f"size {sizes} ({what} {at} needs {size} entries)")
            if refused is not None:
                raise self._err(refused, node)
            t.sizes[d] = size

    def _single(self, decl, sel: ir.Single, frames, st, node) -> int:
        k = self._index(sel.value, frames, st, node)
        if k < 0:
            raise self._err(messages.negative_index(decl.name, f"index {sel.value}", k), node)
        return k

    def _table_read(self, decl: ir.VarDecl, access: ir.CacheAccess, frames, st: State, ctx,
                    out_lengths) -> np.ndarray:
        """The selection; each slice's length must be the destination's dimension (`out_lengths`).
        Errors are located at the access, as the compiled step locates them."""
        t = st.tables[decl.name]
        before = tuple(t.sizes)
        n = len(t.sizes)
        assert len(access.indices) <= n, CHECKED
        sels = list(access.indices) + [ir.Slice()] * (n - len(access.indices))
        ranges, out_dims = [], []
        for d, sel in enumerate(sels):
            if isinstance(sel, ir.Single):
                k = self._single(decl, sel, frames, st, access)
                self._grow(decl, t, d, k + 1, access)
                ranges.append([k])
                continue
            size = t.sizes[d]
            start = 0 if sel.start is None else self._index(sel.start, frames, st, access)
            if start < 0:
                raise self._err(messages.negative_index(decl.name, "slice start", start), access)
            end = size if sel.end is None else self._index(sel.end, frames, st, access)
            if end < 0:
                if -end > size:
                    raise self._err(messages.slice_end_underflow(decl.name, size), access)
                end = size + end
            if end < start:
                raise self._err(messages.slice_end_before_start(decl.name, end), access)
            self._grow(decl, t, d, end, access, what="slice end")
            length = out_lengths[len(out_dims)]
            if end - start != length:
                raise self._err(messages.read_slice_length(decl.name, end - start, length), access)
            ranges.append(range(start, end))
            out_dims.append(end - start)
        entry = decl.shape(self._sizes)
        fill = state_fill(decl, entry)
        values = []
        for combo in itertools.product(*ranges):
            if combo not in t.entries:
                t.entries[combo] = fill  # reading materialises the entry
            values.append(t.entries[combo])
        if tuple(t.sizes) != before:  # grown (phases.read_grows); an entry it materialises holds the
            ctx.wrote(decl.name)      # fill it read as before: no change to merge
        if not values:
            return np.zeros(tuple(out_dims) + entry, dtype=dt.get(decl.dtype).np_dtype)
        return np.stack(values).reshape(tuple(out_dims) + entry)

    def _auto_dim(self, decl: ir.VarDecl, access: ir.CacheAccess, frames, st: State, ctx) -> None:
        """The access's indices grow the tensor's current shape (errors located at the access, as the
        compiled step locates them)."""
        names = decl.auto_dim
        assert len(names) == len(decl.dims) and len(access.indices) <= len(names), CHECKED
        counts = st.counts[decl.name]
        fixed = decl.fixed_sizes(self._sizes)
        new = list(counts)
        for j, sel in enumerate(access.indices):
            assert isinstance(sel, ir.Single), CHECKED
            v = self._single(decl, sel, frames, st, access)
            mx = fixed.get(names[j])
            if mx is not None and v > mx:
                raise self._err(messages.auto_dim_exceeds(decl.name, mx, names[j], v), access)
            new[j] = max(new[j], v)
        if new != counts:
            base = decl.shape(self._sizes)
            value = st.values[decl.name]
            target = tuple(b + c for b, c in zip(base, new))
            refused = growth_refused(decl.name, dt.get(decl.dtype).nbytes(math.prod(target)), f"shape {list(target)}")
            if refused is not None:  # refused before allocating, as a table's growth
                raise self._err(refused, access)
            pad = [(0, t - s) for t, s in zip(target, value.shape)]
            st.values[decl.name] = np.pad(value, pad, constant_values=state_fill(decl))
            st.counts[decl.name] = new
            ctx.wrote(decl.name)

    def _cache_read(self, node: ir.CacheRead, frames, st: State, ctx: Ctx) -> None:
        access = node.src
        decl = self._persistent(access.base, node, "cache.read")
        dst = node.dst
        ddecl = self.graph.var(dst.name)
        assert dst.indices is None and (ddecl is not None or dst.name in self._temps), CHECKED
        assert ddecl is None or ddecl.kind not in (ir.MemKind.CONSTANT, ir.MemKind.PERSISTENT), CHECKED
        want = tuple(self.bound.shape(dst.name))
        if decl.is_table:
            assert access.bracketed, CHECKED
            n_slices = len(st.tables[decl.name].sizes) - sum(isinstance(s, ir.Single) for s in access.indices)
            value = self._table_read(decl, access, frames, st, ctx, want[:n_slices])
        elif decl.is_auto_dim:
            self._auto_dim(decl, access, frames, st, ctx)
            value = st.values[decl.name]
        else:
            assert not access.bracketed, CHECKED
            value = st.values[decl.name]
        if tuple(np.shape(value)) != want and dst.name not in self._shaped:  # §0 item 12: declared shape,
            # except where the destination takes an @auto_dim tensor's current shape
            assert decl.is_auto_dim, CHECKED  # a table's selection: its slice lengths were checked above
            raise self._err(messages.current_shape("cache.read", decl.name, np.shape(value), want), access)
        st.values[dst.name] = np.array(value, copy=True)
        ctx.wrote(dst.name)

    def _cache_write(self, node: ir.CacheWrite, frames, st: State, ctx: Ctx) -> None:
        access = node.dst
        decl = self._persistent(access.base, node, "cache.write")
        src = np.asarray(self._read_ref(node.src, frames, st, node))
        assert src.dtype == dt.get(decl.dtype).np_dtype, CHECKED
        if decl.is_table:
            t = st.tables[decl.name]
            assert access.bracketed and len(access.indices) == len(t.sizes), CHECKED
            entry = decl.shape(self._sizes)
            if any(isinstance(s, ir.Slice) for s in access.indices):
                self._write_rows(decl, t, access, src, entry, frames, st, node)
                ctx.wrote(decl.name)
                return
            if tuple(src.shape) != entry:  # a runtime-shaped source (phases.runtime_shaped)
                raise self._err(messages.write_shape(decl.name, entry, src.shape), node)
            combo = []
            for d, sel in enumerate(access.indices):  # located at the access, as the compiled step locates them
                k = self._single(decl, sel, frames, st, access)
                self._grow(decl, t, d, k + 1, access)
                combo.append(k)
            t.entries[tuple(combo)] = src
        elif decl.is_auto_dim:
            self._auto_dim(decl, access, frames, st, ctx)
            cur = st.values[decl.name]
            if tuple(src.shape) != tuple(cur.shape):
                raise self._err(messages.write_shape(decl.name, cur.shape, src.shape), node)
            st.values[decl.name] = src
        else:
            assert not access.indices, CHECKED
            cur = st.values[decl.name]
            if tuple(src.shape) != tuple(cur.shape):
                raise self._err(messages.write_shape(decl.name, cur.shape, src.shape), node)
            st.values[decl.name] = src
        ctx.wrote(decl.name)

    def _write_rows(self, decl: ir.VarDecl, t: Table, access: ir.CacheAccess, src, entry, frames, st, node) -> None:
        """`cache.write v >> M[i, a..b]` (every dimension @fixed, checked): rows a..b take v[0..b-a];
        the checks in the lowering's order, the whole write refused on the first failure."""
        assert tuple(src.shape[1:]) == entry, CHECKED
        rows = src.shape[0]
        heads = []
        for d, sel in enumerate(access.indices):
            if isinstance(sel, ir.Single):
                k = self._single(decl, sel, frames, st, node)
                self._grow(decl, t, d, k + 1, node)
                heads.append(range(k, k + 1))
                continue
            a = self._index(sel.start, frames, st, node)
            b = self._index(sel.end, frames, st, node)
            if a < 0:
                raise self._err(messages.negative_index(decl.name, "slice start", a), node)
            if b < a:
                raise self._err(messages.slice_end_before_start(decl.name, b), node)
            if b - a > rows:
                raise self._err(messages.write_rows_count(decl.name, b - a, rows), node)
            self._grow(decl, t, d, b, node, what="slice end")
            heads.append(range(a, b))
        for i, combo in enumerate(itertools.product(*heads)):  # one slice: combo i is row a + i
            t.entries[combo] = src[i]

    def _cache_step(self, node, st: State, ctx: Ctx) -> None:
        up = isinstance(node, ir.CacheIncrement)
        word = "cache.increment" if up else "cache.decrement"
        decl = self._persistent(node.target, node, word)
        d = dt.get(decl.dtype)
        if decl.is_table or decl.is_auto_dim or not decl.is_scalar:
            raise self._err(f"{word} {decl.name} expects a persistent scalar", node)
        if d.packed or d.family in (dt.BOOL, dt.BITSET, dt.TERNARY):
            raise self._err(f"{word} {decl.name}: unsupported dtype {decl.dtype}", node)
        cur = np.asarray(st.values[decl.name])
        amount = node.amount if up else -node.amount
        if d.is_float:
            with np.errstate(over="ignore"):  # rounding past the dtype's range gives inf: IEEE, no warning
                if d.name in ("f16", "bf16", "f8"):
                    v = np.float32(cur.astype(np.float32)) + np.float32(amount)
                    new = f8_encode(np.asarray(v, dtype=np.float32)) if d.name == "f8" else np.asarray(v).astype(d.np_dtype)
                else:
                    new = np.asarray(cur.astype(d.np_dtype) + d.np_dtype.type(amount))
        else:
            v = (int(cur.reshape(())) + amount) % (1 << d.bits)
            if d.is_signed and v >= 1 << (d.bits - 1):
                v -= 1 << d.bits
            new = np.asarray(v).astype(d.np_dtype)
        st.values[decl.name] = np.asarray(new).reshape(cur.shape)
        ctx.wrote(decl.name)

    def _cache_reset(self, node: ir.CacheReset, frames, st: State, ctx: Ctx) -> None:
        access = node.target
        decl = self._persistent(access.base, node, "cache.reset")
        if decl.is_table:
            t = st.tables[decl.name]
            assert access.bracketed, CHECKED
            if not access.indices:
                t.entries.clear()
            else:
                assert len(access.indices) <= len(t.sizes) and all(isinstance(s, ir.Single) for s in access.indices), \
                    CHECKED
                prefix = tuple(self._single(decl, s, frames, st, node) for s in access.indices)
                t.entries = {k: v for k, v in t.entries.items() if k[: len(prefix)] != prefix}
            t.reset_sizes()
        elif decl.is_auto_dim:
            st.counts[decl.name] = [0] * len(decl.auto_dim)
            st.values[decl.name] = state_fill(decl, decl.shape(self._sizes), reset=True)
        else:
            st.values[decl.name] = state_fill(decl, decl.shape(self._sizes), reset=True)
        ctx.wrote(decl.name)
