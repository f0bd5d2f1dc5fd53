"""Persistent state and cache tables (SPEC §4) as fixed-shape device arrays.

Layout per persistent variable (`CacheLayout`, its `LayoutKind`):
- PLAIN:    env.values[P] = the value.
- TABLE:    env.caches[T] = CacheState(data [capacity..., *entry] (unwritten entries hold the
            @init fill), size int64[k] logical sizes, present bool[capacity...] (growable only)).
- AUTO_DIM: env.caches[M] = CacheState(data [base + capacity...] (zeros outside the current
            shape), size int64[r] growth counts).
`@fixed` dims have capacity = the fixed size; other dims start small and the host doubles
their capacity (and recompiles) when a step asks for more (`TraceGuards.grow`), so n growth
steps cost O(log n) compiles. Every out-of-range access is a runtime guard (`Tracer.fail_if`),
never a clamp. The host side of these layouts (initial, grown, imported and exported state) is
runtime/cache_state.py.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from .. import dtypes as dt
from .. import ir
from ..diagnostics import OiError
from .. import messages
from ..messages import CHECKED
from ..host_numerics import state_fill
from ..ops.jax_numerics import store, unfolded_index
from .context import Frame, Tracer
from .subbyte import pack, unpack
from .rules import rule
from ..limits import INITIAL_CAPACITY


def _known(x) -> bool:
    """A value known while tracing (a Python or NumPy number: a literal or unrolled-loop index, an
    all-@fixed table's sizes): its index arithmetic and guards are computed here, not staged into
    the step (a guard known to hold nowhere costs the step nothing)."""
    return isinstance(x, (bool, int, np.generic, np.ndarray))


def _i64(v):
    return np.int64(v) if isinstance(v, (int, np.integer)) else jnp.asarray(v, jnp.int64)


def _maximum(a, b):
    return np.maximum(a, b) if _known(a) and _known(b) else jnp.maximum(a, b)


def _where(ok, a, b):
    """jnp.where(ok, a, b), or a / b itself where ok is known."""
    if _known(ok):
        return a if bool(ok) else b
    return jnp.where(ok, a, b)


def _index32(v, hi: int):
    """clip(v, 0, hi) as an int32 start index (a known one a NumPy int32)."""
    if _known(v):
        return np.int32(min(max(int(v), 0), hi))
    return jnp.clip(v, 0, hi).astype(jnp.int32)


class LayoutKind(enum.Enum):
    """How a persistent variable is held (module doc): a plain value, a table, an auto_dim tensor."""

    PLAIN = "plain"
    TABLE = "table"
    AUTO_DIM = "auto_dim"


PLAIN, TABLE, AUTO_DIM = LayoutKind.PLAIN, LayoutKind.TABLE, LayoutKind.AUTO_DIM


@dataclass(frozen=True)
class CacheLayout:
    name: str
    kind: LayoutKind
    dtype: str
    shape: tuple[int, ...]  # plain: value shape; table: entry shape; auto_dim: base shape
    fixed: tuple[int | None, ...] = ()  # per table dim / per auto dim: @fixed size (max)
    capacity: tuple[int, ...] = ()
    grow_slots: tuple[int | None, ...] = ()
    fill: object = 0  # host_numerics.state_fill: what unwritten space holds (start, growth, import)
    reset_fill: object = 0  # host_numerics.state_fill(reset=True): what `cache.reset` writes

    @property
    def packed(self) -> bool:
        return dt.get(self.dtype).packed

    @property
    def is_cache(self) -> bool:
        """A table or an auto_dim tensor: held as a `CacheState` (else a plain value)."""
        return self.kind is not PLAIN

    @property
    def growable(self) -> bool:
        return any(s is not None for s in self.grow_slots)

    @property
    def has_present(self) -> bool:
        """A growable table: its `CacheState.present` marks the entries touched."""
        return self.kind is TABLE and self.growable

    @property
    def static_size(self) -> bool:
        """A table whose every dim is @fixed: its sizes are the fixed sizes, always, so the
        step state carries no size buffer for it (one buffer less to pass, donate and return)."""
        return self.kind is TABLE and all(f is not None for f in self.fixed)

    def fixed_sizes(self) -> np.ndarray:
        """int64[k]: a table's fixed sizes (0 for a dim that grows): the sizes at program start,
        always those of a `static_size` table."""
        return np.asarray([f or 0 for f in self.fixed], np.int64).reshape(len(self.fixed))

    def data_shape(self) -> tuple[int, ...]:
        if self.kind is TABLE:
            return tuple(self.capacity) + self.shape
        if self.kind is AUTO_DIM:
            return tuple(b + c for b, c in zip(self.shape, self.capacity)) + self.shape[len(self.capacity):]
        return self.shape

    def data_nbytes(self) -> int:
        """Bytes of the data buffer (`data_shape` of `dtype`, sub-byte types packed)."""
        return dt.get(self.dtype).nbytes(math.prod(self.data_shape()))


def _fill(shape, fill, dtype):
    # fill_array: floats opaque to XLA's constant reassociation
    from .step import fill_array  # cycle: lowering.step imports this module (PLAIN, build_layouts)
    return fill_array(shape, dtype, fill)


def _fills(decl: ir.VarDecl) -> dict:
    """The layout's fills (host_numerics.state_fill, the one rule) as 0-d arrays in the dtype's
    representation, so that every np.full / jnp.full below keeps their exact bits."""
    return {"fill": state_fill(decl), "reset_fill": state_fill(decl, reset=True)}


def build_layouts(bound, grow_slots: list) -> dict[str, CacheLayout]:
    """One layout per persistent variable; registers growable dims in `grow_slots`."""
    layouts = {}
    for decl in bound.graph.vars:
        if decl.kind != ir.MemKind.PERSISTENT:
            continue
        shape = bound.shape(decl.name)
        fixed = decl.fixed_sizes(bound.sizes)
        if decl.is_table:
            dims = decl.table_indices
            kind = TABLE
        elif decl.auto_dim:
            dims = decl.auto_dim
            kind = AUTO_DIM
            assert len(dims) == len(shape), CHECKED  # checks/decls: auto_dim names one index per dim
        else:
            layouts[decl.name] = CacheLayout(decl.name, PLAIN, decl.dtype, shape, **_fills(decl))
            continue
        fixed_sizes, caps, slots = [], [], []
        for j, dim_name in enumerate(dims):
            f = fixed.get(dim_name)
            fixed_sizes.append(f)
            if f is not None:
                caps.append(f)
                slots.append(None)
            else:
                caps.append(INITIAL_CAPACITY)
                slots.append(len(grow_slots))
                grow_slots.append((decl.name, j))
        layouts[decl.name] = CacheLayout(decl.name, kind, decl.dtype, shape, tuple(fixed_sizes), tuple(caps),
                                         tuple(slots), **_fills(decl))
    return layouts


# ---------------------------------------------------------------------------- node rules


class CacheRules:
    """cache.read / write / reset / increment / decrement for one trace."""

    def __init__(self, tr: Tracer):
        self.tr = tr
        self.layouts = tr.lowering.caches

    def _err(self, msg: str, span: ir.Span) -> OiError:
        return OiError(msg, span, source=self.tr.graph.source)

    def _layout(self, access_base: str, span: ir.Span) -> CacheLayout:
        layout = self.layouts.get(access_base)
        assert layout is not None, f"{access_base}: {CHECKED}"
        return layout

    # ----------------------------------------------------------------- index helpers

    def _single(self, env, frame, layout: CacheLayout, j: int, raw, span, *, size):
        """Check single index `raw` at table dim j; returns (env, index, new size)."""
        tr = self.tr
        env, v = tr.index_value(raw, frame, env, span)
        v = _i64(v)
        neg = tr.lowering.site(messages.negative_index(layout.name, f"index {raw}", "{value}"), span)
        env = tr.fail_if(env, v < 0, neg, v)
        # v + 1 wraps at i64's largest index, to a negative end that passed every bound (the
        # access was then dropped in silence): saturated, it is past any fixed size and memory
        end = jnp.where(v == np.iinfo(np.int64).max, v, v + 1)
        env = self._bound(env, layout, j, end, span, what="index", value=v)
        return env, v, _maximum(size, end)

    def _bound(self, env, layout: CacheLayout, j: int, end, span, what: str, value=None):
        """`end` (exclusive) must fit the fixed size, or the capacity (else ask to grow); `value`:
        what an error names (the index, for a single index; default `end`)."""
        tr = self.tr
        fixed = layout.fixed[j]
        if fixed is not None:
            code = tr.lowering.site(messages.exceeds_fixed(layout.name, j, fixed, what, "{value}"), span)
            return tr.fail_if(env, end > fixed, code, end if value is None else value)
        slot = layout.grow_slots[j]
        return tr.need_capacity(env, slot, jnp.where(end > layout.capacity[j], end, 0))

    def _table_select(self, access: ir.CacheAccess, layout: CacheLayout, env, frame, out_lengths, span):
        """Resolve a table read selection -> (env, starts, lengths, squeeze dims)."""
        tr = self.tr
        k = len(layout.capacity)
        assert len(access.indices) <= k, CHECKED
        sel = list(access.indices) + [ir.Slice(None, None)] * (k - len(access.indices))
        sizes = env.caches[layout.name].size
        new_sizes = []
        starts, lengths, squeeze = [], [], []
        slice_pos = 0
        for j, s in enumerate(sel):
            size = sizes[j]
            if isinstance(s, ir.Single):
                env, v, size = self._single(env, frame, layout, j, s.value, span, size=size)
                starts.append(v)
                lengths.append(1)
                squeeze.append(j)
            else:
                start = np.int64(0)
                if s.start is not None:
                    env, start = tr.index_value(s.start, frame, env, span)
                    start = _i64(start)
                assert not (isinstance(s.start, int) and s.start < 0), "the checker refuses a negative literal"
                code = tr.lowering.site(messages.negative_index(layout.name, "slice start", "{value}"), span)
                env = tr.fail_if(env, start < 0, code, start)
                if s.end is None:
                    end = size
                elif isinstance(s.end, int) and s.end < 0:
                    code = tr.lowering.site(messages.slice_end_underflow(layout.name, "{value}"), span)
                    env = tr.fail_if(env, size < -s.end, code, size)
                    end = size + s.end
                else:
                    env, end = tr.index_value(s.end, frame, env, span)
                    end = _i64(end)
                    # a variable's negative value counts from the end, as a negative literal does
                    # (SPEC §4.2: the bound's value decides, whatever names it; the interpreter's rule)
                    negative = end < 0
                    code = tr.lowering.site(messages.slice_end_underflow(layout.name, "{value}"), span)
                    env = tr.fail_if(env, negative & (size < -end), code, size)
                    end = _where(negative, size + end, end)
                code = tr.lowering.site(messages.slice_end_before_start(layout.name, "{value}"), span)
                env = tr.fail_if(env, end < start, code, end)
                env = self._bound(env, layout, j, end, span, what="slice end")
                length = out_lengths[slice_pos]
                slice_pos += 1
                code = tr.lowering.site(messages.read_slice_length(layout.name, "{value}", length), span)
                env = tr.fail_if(env, (end - start) != length, code, end - start)
                size = _maximum(size, end)
                starts.append(start)
                lengths.append(length)
            new_sizes.append(size)
        if not layout.static_size:  # an all-@fixed table's sizes are its fixed sizes, always
            env = env.set_cache(layout.name, size=jnp.stack(new_sizes).astype(jnp.int64))
        return env, starts, lengths, squeeze

    def _mark_present(self, env, layout: CacheLayout, starts, lengths, value: bool):
        present = env.caches[layout.name].present
        if present is None:
            return env
        mask = jnp.ones(present.shape, bool)
        for j, (s, n) in enumerate(zip(starts, lengths)):
            iota = jax.lax.broadcasted_iota(jnp.int64, present.shape, j)
            mask = mask & (iota >= s) & (iota < s + n)
        return env.set_cache(layout.name, present=(present | mask) if value else (present & ~mask))

    def _auto_access(self, access: ir.CacheAccess, layout: CacheLayout, env, frame, span):
        tr = self.tr
        r = len(layout.capacity)
        assert len(access.indices) <= r, CHECKED
        counts = env.caches[layout.name].size
        new = []
        for j in range(r):
            c = counts[j]
            if j < len(access.indices):
                s = access.indices[j]
                assert isinstance(s, ir.Single), CHECKED
                env, v = tr.index_value(s.value, frame, env, span)
                v = jnp.asarray(v, jnp.int64)
                neg = tr.lowering.site(messages.negative_index(layout.name, f"index {s.value}", "{value}"), span)
                env = tr.fail_if(env, v < 0, neg, v)
                fixed = layout.fixed[j]
                if fixed is not None:
                    code = tr.lowering.site(messages.auto_dim_exceeds(layout.name, fixed, tr.graph.var(layout.name).auto_dim[j],
                                                                     "{value}"), span)
                    env = tr.fail_if(env, v > fixed, code, v)
                else:
                    env = tr.need_capacity(env, layout.grow_slots[j], jnp.where(v > layout.capacity[j], v, 0))
                c = jnp.maximum(c, v)
            new.append(c)
        return env.set_cache(layout.name, size=jnp.stack(new).astype(jnp.int64) if new else counts)

    def _auto_shape_check(self, env, layout: CacheLayout, want: tuple[int, ...], span, what: str):
        tr = self.tr
        counts = env.caches[layout.name].size
        current = jnp.asarray(layout.shape[:len(layout.capacity)], jnp.int64) + counts
        want_arr = jnp.asarray(want[:len(layout.capacity)], jnp.int64)
        mismatch = jnp.any(current != want_arr) | (len(want) != len(layout.shape))
        k = len(layout.capacity)
        if k <= 2:  # the growth counts fit the error value: say the tensor's actual shape
            base = layout.shape

            def render(value, base=base, k=k, want=tuple(want), name=layout.name):
                counts = [(value >> (32 * (k - 1 - j))) & 0xFFFFFFFF for j in range(k)]
                shape = [b + c for b, c in zip(base, counts)] + list(base[k:])
                return messages.current_shape(what, name, shape, want)

            code = tr.lowering.site(f"{what} {layout.name}: current shape does not match {list(want)}", span,
                                    render=render)
            packed = sum(jnp.asarray(counts[j], jnp.int64) << (32 * (k - 1 - j)) for j in range(k))
            return tr.fail_if(env, mismatch, code, packed)
        code = tr.lowering.site(f"{what} {layout.name}: current shape does not match {list(want)} "
                                f"(first differing dim is {{value}})", span)
        first_dim = jnp.argmax(current != want_arr)
        return tr.fail_if(env, mismatch, code, first_dim)

    # ----------------------------------------------------------------- rules

    def read(self, node: ir.CacheRead, env, frame: Frame):
        access = node.src
        layout = self._layout(access.base, access.span)
        dst = node.dst.name
        dst_shape = self.tr.bound.shape(dst)
        if layout.kind is PLAIN:
            assert not access.bracketed, CHECKED
            value = env.values[layout.name]
            value = unpack(value, layout.dtype, layout.shape) if layout.packed else value
        elif layout.kind is TABLE:
            assert access.bracketed, CHECKED
            n_slices = len(layout.capacity) - sum(isinstance(s, ir.Single) for s in access.indices)
            out_lengths = dst_shape[:n_slices]
            env, starts, lengths, squeeze = self._table_select(access, layout, env, frame, out_lengths, access.span)
            data = env.caches[layout.name].data
            n_entry = len(layout.shape)
            idx = [_index32(s, c - n) if n <= c else np.int32(0) for s, n, c in zip(starts, lengths, layout.capacity)]
            if any(n > c for n, c in zip(lengths, layout.capacity)):
                # the destination is larger than the allocation: the step asks to grow and is re-run
                value = jnp.zeros(tuple(lengths) + layout.shape, data.dtype)
            elif tuple(lengths) == tuple(data.shape[:len(lengths)]) and all(_known(i) for i in idx):
                value = data  # the whole table (`T[..]`): no slice
            else:
                value = jax.lax.dynamic_slice(data, idx + [jnp.int32(0)] * n_entry, tuple(lengths) + layout.shape)
            value = value.reshape(tuple(n for j, n in enumerate(lengths) if j not in squeeze) + layout.shape)
            env = self._mark_present(env, layout, starts, lengths, True)
        elif dst in self.tr.lowering.shaped:  # dst takes the tensor's current shape (SPEC §0 item 12)
            env = self._auto_access(access, layout, env, frame, access.span)
            cache = env.caches[layout.name]
            current = jnp.asarray(layout.shape, jnp.int64).at[:len(layout.capacity)].add(cache.size)
            value = cache.data.astype(env.values[dst].dtype)  # zeros outside the current shape
            return self.tr.embed(env, dst, value, current)
        else:
            env = self._auto_access(access, layout, env, frame, access.span)
            env = self._auto_shape_check(env, layout, dst_shape, access.span, "cache.read")
            data = env.caches[layout.name].data
            if any(w > s for w, s in zip(dst_shape, data.shape)):
                value = jnp.zeros(dst_shape, data.dtype)
            else:
                value = data[tuple(slice(0, w) for w in dst_shape)]
        if dst in self.tr.lowering.shaped:  # a fixed-shape selection into a runtime-shaped variable
            return self.tr.embed(env, dst, value.astype(env.values[dst].dtype))
        assert tuple(value.shape) == tuple(dst_shape), CHECKED  # §0 item 12, checks/caches.py
        return env.set(dst, value.astype(env.values[dst].dtype))

    def write(self, node: ir.CacheWrite, env, frame: Frame):
        access = node.dst
        layout = self._layout(access.base, access.span)
        env, src = self.tr.read(node.src, env, frame)
        if layout.kind is PLAIN:
            assert not access.indices, CHECKED
            if tuple(src.shape) != layout.shape:
                raise self._err(messages.write_shape(layout.name, layout.shape, src.shape), node.span)
            return env.set(layout.name, pack(src, layout.dtype) if layout.packed else src)
        if layout.kind is TABLE:
            k = len(layout.capacity)
            assert access.bracketed and len(access.indices) == k, CHECKED
            if any(isinstance(s, ir.Slice) for s in access.indices):
                return self._write_rows(node, layout, env, frame, src)
            if tuple(src.shape) != layout.shape:
                raise self._err(messages.write_shape(layout.name, layout.shape, src.shape), node.span)
            sizes = env.caches[layout.name].size
            new_sizes, starts = [], []
            # this write's own guards: a failing write is skipped, never clamped (and a skipped step's)
            ok = np.bool_(True) if self.tr.writes_on is None else self.tr.writes_on
            for j, s in enumerate(access.indices):
                env, v, size = self._single(env, frame, layout, j, s.value, access.span, size=sizes[j])
                ok = ok & (v >= 0) & (v < (layout.fixed[j] or layout.capacity[j]))
                new_sizes.append(size)
                starts.append(v)
            data = env.caches[layout.name].data
            idx = [_index32(s, c - 1) for s, c in zip(starts, layout.capacity)] + [np.int32(0)] * len(layout.shape)
            update = src.reshape((1,) * k + layout.shape).astype(data.dtype)
            if not _known(ok):  # guard the row, not the table: the donated table is then updated in place
                update = jnp.where(ok, update, jax.lax.dynamic_slice(data, idx, update.shape))
            if _known(ok) and not ok:  # known to fail: its guard is recorded, nothing is written
                return env
            data = jax.lax.dynamic_update_slice(data, update, idx)
            if layout.static_size:
                env = env.set_cache(layout.name, data=data)
            else:
                env = env.set_cache(layout.name, data=data, size=_where(ok, jnp.stack(new_sizes).astype(jnp.int64), sizes))
            return self._mark_present(env, layout, starts, [1] * k, True)
        env = self._auto_access(access, layout, env, frame, access.span)
        if node.src.indices is None and node.src.name in self.tr.lowering.shaped:
            return self._write_shaped(node, layout, env, src)
        env = self._auto_shape_check(env, layout, tuple(src.shape), access.span, "cache.write")
        data = env.caches[layout.name].data
        if all(w <= s for w, s in zip(src.shape, data.shape)):
            zeros = jnp.zeros_like(data)
            env = env.set_cache(layout.name, data=jax.lax.dynamic_update_slice(zeros, src.astype(data.dtype),
                                                                              [0] * data.ndim))
        return env

    def _write_rows(self, node: ir.CacheWrite, layout: CacheLayout, env, frame: Frame, src):
        """`cache.write v >> M[i, a..b]` (every dimension @fixed, checked): rows a..b take v[0..b-a],
        v [S, *entry], b - a in 0..S. A failing write is skipped whole, never clamped; the rows are
        scattered with their positions past the table dropped, so a write near the end is never moved."""
        tr, access, span = self.tr, node.dst, node.span  # located at the node, as the interpreter locates them
        rows = src.shape[0]
        assert tuple(src.shape[1:]) == layout.shape, CHECKED
        sizes = env.caches[layout.name].size
        ok = np.bool_(True) if tr.writes_on is None else tr.writes_on
        idx, starts, lengths = [], [], []
        for j, s in enumerate(access.indices):
            if isinstance(s, ir.Single):
                env, v, _ = self._single(env, frame, layout, j, s.value, span, size=sizes[j])
                ok = ok & (v >= 0) & (v < layout.fixed[j])
                idx.append(unfolded_index(_index32(v, layout.capacity[j] - 1)))  # one kernel for every layer
                starts.append(v)
                lengths.append(1)
                continue
            env, a = tr.index_value(s.start, frame, env, span)
            env, b = tr.index_value(s.end, frame, env, span)
            a, b = _i64(a), _i64(b)
            if tr.first_check(("rows a..b of a fixed dim", rows, layout.fixed[j]),
                              tr.index_source(s.start, frame, env), tr.index_source(s.end, frame, env)):
                code = tr.lowering.site(messages.negative_index(layout.name, "slice start", "{value}"), span)
                env = tr.fail_if(env, a < 0, code, a)
                code = tr.lowering.site(messages.slice_end_before_start(layout.name, "{value}"), span)
                env = tr.fail_if(env, (a >= 0) & (b < a), code, b)
                code = tr.lowering.site(messages.write_rows_count(layout.name, "{value}", rows), span)
                env = tr.fail_if(env, (a >= 0) & (b >= a) & (b - a > rows), code, b - a)
                env = self._bound(env, layout, j, b, span, what="slice end")
            ok = ok & (a >= 0) & (b >= a) & (b - a <= rows) & (b <= layout.fixed[j])
            i = jnp.arange(rows, dtype=jnp.int64)
            idx.append(jnp.where(i < b - a, a + i, layout.capacity[j]).astype(jnp.int32))
            starts.append(a)
            lengths.append(b - a)
        data = env.caches[layout.name].data
        # a failing write drops its rows (their indices past the table); the single indices stay
        # as they are, so that each layer's write is the same kernel (`unfolded_index`)
        drop = [jnp.asarray(x if isinstance(s, ir.Single) else _where(ok, x, c), jnp.int32)
                for x, c, s in zip(idx, layout.capacity, access.indices)]
        data = data.at[tuple(drop)].set(src.astype(data.dtype), mode="drop")
        env = env.set_cache(layout.name, data=data)
        if env.caches[layout.name].present is None:
            return env
        marked = self._mark_present(env, layout, starts, lengths, True).caches[layout.name].present
        return env.set_cache(layout.name, present=_where(ok, marked, env.caches[layout.name].present))

    def _write_shaped(self, node: ir.CacheWrite, layout: CacheLayout, env, src):
        """`cache.write v >> M[...]` with a runtime-shaped v: its logical shape must equal M's
        (grown) current shape; the tensor becomes v inside that shape and zeros outside."""
        tr = self.tr
        k = len(layout.capacity)
        logical = env.shapes[node.src.name]
        current = jnp.asarray(layout.shape, jnp.int64).at[:k].add(env.caches[layout.name].size)
        name, rank = layout.name, len(layout.shape)

        def render(value, rank=rank, name=name):
            if value < 0:
                return f"cache.write {name}: the value's current shape differs from the tensor's"
            dims = [(value >> (16 * (2 * rank - 1 - j))) & 0xFFFF for j in range(2 * rank)]
            return messages.write_shape(name, dims[rank:], dims[:rank])

        if rank <= 2:  # both shapes fit the error value (16 bits a dim): say them, as the interpreter does
            both = [logical[j] for j in range(rank)] + [current[j] for j in range(rank)]
            fits = jnp.all(jnp.stack(both) < (1 << 16))
            packed = sum(jnp.asarray(d, jnp.int64) << (16 * (2 * rank - 1 - j)) for j, d in enumerate(both))
            packed = jnp.where(fits, packed, -1)
        else:
            packed = jnp.int64(-1)
        code = tr.lowering.site(f"cache.write {name}: the value's current shape differs from the tensor's",
                                node.span, render=render)
        mismatch = jnp.any(logical != current)
        env = tr.fail_if(env, mismatch, code, packed)
        data = env.caches[name].data
        value = src.astype(data.dtype)
        if tuple(value.shape) != tuple(data.shape):  # another tensor's capacity: cut or pad to this one
            value = value[tuple(slice(0, c) for c in data.shape)]
            value = jnp.pad(value, [(0, c - s) for s, c in zip(value.shape, data.shape)])
        mask = jnp.ones(data.shape, bool)
        for j in range(data.ndim):
            mask = mask & (jax.lax.broadcasted_iota(jnp.int64, data.shape, j) < current[j])
        return env.set_cache(name, data=jnp.where(mismatch, data, jnp.where(mask, value, jnp.zeros_like(data))))

    def reset(self, node: ir.CacheReset, env, frame: Frame):
        access = node.target
        layout = self._layout(access.base, access.span)
        np_dtype = dt.get(layout.dtype).np_dtype
        if layout.kind is PLAIN:
            fill = _fill(layout.shape, layout.reset_fill, np_dtype)
            return env.set(layout.name, pack(fill, layout.dtype) if layout.packed else fill)
        cache = env.caches[layout.name]
        data = cache.data
        if layout.kind is AUTO_DIM:
            base = jnp.full(data.shape, layout.fill, np_dtype)
            region = _fill(layout.shape, layout.reset_fill, np_dtype)
            return env.set_cache(layout.name, data=jax.lax.dynamic_update_slice(base, region, [0] * data.ndim),
                                 size=jnp.zeros_like(cache.size))
        assert access.bracketed, CHECKED
        k = len(layout.capacity)
        if not access.indices:
            present = None if cache.present is None else jnp.zeros_like(cache.present)
            fill = _fill(data.shape, layout.reset_fill, np_dtype)
            if self.tr.writes_on is not None:
                fill = jnp.where(self.tr.writes_on, fill, data)
            return env.set_cache(layout.name, data=fill, present=present,
                                 size=layout.fixed_sizes() if layout.static_size else jnp.asarray(layout.fixed_sizes()))
        assert all(isinstance(s, ir.Single) for s in access.indices), CHECKED
        starts = []
        for j, s in enumerate(access.indices):
            env, v = self.tr.index_value(s.value, frame, env, access.span)
            v = jnp.asarray(v, jnp.int64)
            neg = self.tr.lowering.site(messages.negative_index(layout.name, f"index {s.value}", "{value}"), access.span)
            env = self.tr.fail_if(env, v < 0, neg, v)
            starts.append(v)
        p = len(starts)
        in_range = jnp.all(jnp.stack([(s < c) for s, c in zip(starts, layout.capacity)]))
        if self.tr.writes_on is not None:
            in_range = in_range & self.tr.writes_on
        block = _fill((1,) * p + tuple(layout.capacity[p:]) + layout.shape, layout.reset_fill, np_dtype)
        idx = [jnp.clip(s, 0, c - 1).astype(jnp.int32) for s, c in zip(starts, layout.capacity)]
        updated = jax.lax.dynamic_update_slice(data, block, idx + [jnp.int32(0)] * (data.ndim - p))
        env = env.set_cache(layout.name, data=jnp.where(in_range, updated, data))
        if cache.present is not None:
            lengths = [1] * p + list(layout.capacity[p:])
            full_starts = starts + [jnp.int64(0)] * (k - p)
            cleared = self._mark_present(env, layout, full_starts, lengths, False).caches[layout.name].present
            present = jnp.where(in_range, cleared, cache.present)
            sizes = []
            for j in range(k):
                if layout.fixed[j] is not None:
                    sizes.append(jnp.int64(layout.fixed[j]))
                else:
                    other = tuple(a for a in range(k) if a != j)
                    along = jnp.any(present, axis=other) if other else present
                    iota = jnp.arange(1, layout.capacity[j] + 1, dtype=jnp.int64)
                    sizes.append(jnp.max(jnp.where(along, iota, 0)))
            env = env.set_cache(layout.name, present=present, size=jnp.stack(sizes))
        return env

    def step(self, node, env, frame: Frame, sign: int):
        layout = self._layout(node.target, node.span)
        assert layout.kind is PLAIN and layout.shape == (), CHECKED
        d = dt.get(layout.dtype)
        value = env.values[layout.name]
        n = sign * node.amount
        if d.is_float:
            if d.name == "f64":
                new = value + jnp.float64(n)
            else:
                new = store(value.astype(jnp.float32) + jnp.float32(n), d.name)
        elif d.is_int and not d.packed:
            # wrap-around in the variable's width (SPEC §4.6) for any amount a literal holds (up to
            # 2^64 - 1, which no int64 holds): the amount taken modulo 2^bits first, as the interpreter
            n %= 1 << d.bits
            if d.bits < 64:
                new = (value.astype(jnp.int64) + jnp.int64(n)).astype(d.np_dtype)
            else:
                new = value + d.np_dtype.type(n - (1 << 64) if d.is_signed and n >= 1 << 63 else n)
        else:
            raise AssertionError(f"cache.increment of {d.name}: {CHECKED}")
        return env.set(layout.name, new.astype(value.dtype))


# ---------------------------------------------------------------------------- registration

@rule(ir.CacheRead)
def _cache_read(node, env, frame, tr):
    return CacheRules(tr).read(node, env, frame)


@rule(ir.CacheWrite)
def _cache_write(node, env, frame, tr):
    return CacheRules(tr).write(node, env, frame)


@rule(ir.CacheReset)
def _cache_reset(node, env, frame, tr):
    return CacheRules(tr).reset(node, env, frame)


@rule(ir.CacheIncrement)
def _cache_inc(node, env, frame, tr):
    return CacheRules(tr).step(node, env, frame, +1)


@rule(ir.CacheDecrement)
def _cache_dec(node, env, frame, tr):
    return CacheRules(tr).step(node, env, frame, -1)
