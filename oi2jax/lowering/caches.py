"""Persistent state and cache tables (SPEC §4) as fixed-shape device arrays.

Layout per persistent variable (`CacheLayout`):
- plain:    env[P] = the value.
- table:    env[T] = data [capacity..., *entry] (unwritten entries hold the @init fill),
            env[T#size] = int64[k] logical sizes, env[T#present] = bool[capacity...] (growable only).
- auto_dim: env[M] = data [base + capacity...] (zeros outside the current shape),
            env[M#count] = int64[r] growth counts.
`@fixed` dims have capacity = the fixed size; other dims start small and the host doubles
their capacity (and recompiles) when a step asks for more (`GROW`), so n growth steps cost
O(log n) compiles. Every out-of-range access is a runtime guard (`Tracer.fail_if`), never a clamp.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
import numpy as np

from .. import dtypes as dt
from .. import ir
from ..diagnostics import OiError
from .. import messages
from ..messages import CHECKED
from ..numerics import state_fill
from .context import Frame, Tracer
from .packing import pack, unpack
from .rules import rule

from ..limits import INITIAL_CAPACITY  # noqa: E402,F401  (one definition)


@dataclass(frozen=True)
class CacheLayout:
    name: str
    kind: str  # plain | table | auto_dim
    dtype: str
    shape: tuple[int, ...]  # plain: value shape; table: entry shape; auto_dim: base shape
    fixed: tuple[int | None, ...] = ()  # per table dim / per auto dim: @fixed size (max)
    capacity: tuple[int, ...] = ()
    grow_slots: tuple[int | None, ...] = ()
    fill: object = 0  # numerics.state_fill: what unwritten space holds (start, growth, import)
    reset_fill: object = 0  # numerics.state_fill(reset=True): what `cache.reset` writes

    @property
    def packed(self) -> bool:
        return dt.get(self.dtype).packed

    @property
    def growable(self) -> bool:
        return any(s is not None for s in self.grow_slots)

    @property
    def static_size(self) -> bool:
        """A table whose every dim is @fixed: its sizes are the fixed sizes, always, so the
        step state carries no size buffer for it (one buffer less to pass, donate and return)."""
        return self.kind == "table" and all(f is not None for f in self.fixed)

    def fixed_sizes(self) -> np.ndarray:
        """int64[k]: the sizes of a `static_size` table."""
        return np.asarray(self.fixed, np.int64).reshape(len(self.fixed))

    def size_key(self) -> str:
        return f"{self.name}#size" if self.kind == "table" else f"{self.name}#count"

    def data_shape(self) -> tuple[int, ...]:
        if self.kind == "table":
            return tuple(self.capacity) + self.shape
        if self.kind == "auto_dim":
            return tuple(b + c for b, c in zip(self.shape, self.capacity)) + self.shape[len(self.capacity):]
        return self.shape


def _fill(shape, fill, dtype):
    from .step import fill_array  # floats opaque to XLA's constant reassociation
    return fill_array(shape, dtype, fill)


def _fills(decl: ir.VarDecl) -> dict:
    """The layout's fills (numerics.state_fill, the one rule) as 0-d arrays in the dtype's
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
            kind = "table"
        elif decl.auto_dim:
            dims = decl.auto_dim
            kind = "auto_dim"
            if len(dims) != len(shape):
                raise OiError(f"auto_dim requires {len(shape)} dims, got {len(dims)}", decl.span,
                              source=bound.graph.source)
        else:
            layouts[decl.name] = CacheLayout(decl.name, "plain", decl.dtype, shape, **_fills(decl))
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


def initial_state(layout: CacheLayout) -> dict[str, np.ndarray]:
    """Host arrays for a cache's state at program start."""
    np_dtype = dt.get(layout.dtype).np_dtype
    if layout.kind == "plain":
        value = np.full(layout.shape, layout.fill, dtype=np_dtype)
        if layout.packed:  # sub-byte persistent values stay packed on the device
            from ..model.packing import pack
            value = pack(layout.dtype, value)
        return {layout.name: value}
    if layout.kind == "table":
        k = len(layout.capacity)
        state = {layout.name: np.full(layout.data_shape(), layout.fill, dtype=np_dtype),
                 layout.size_key(): np.array([f or 0 for f in layout.fixed], dtype=np.int64).reshape(k)}
        if layout.growable:
            state[f"{layout.name}#present"] = np.zeros(layout.capacity, dtype=bool)
        return state
    return {layout.name: np.full(layout.data_shape(), layout.fill, dtype=np_dtype),
            layout.size_key(): np.zeros(len(layout.capacity), dtype=np.int64)}


def grow(layout: CacheLayout, state: dict, new_capacity: tuple[int, ...]) -> tuple[CacheLayout, dict]:
    """Pad a cache's host/device state to `new_capacity` with its fill (numerics.state_fill)."""
    new = replace(layout, capacity=tuple(new_capacity))
    out = dict(state)
    pads = [(0, n - o) for o, n in zip(layout.capacity, new_capacity)]
    data = np.asarray(state[layout.name])
    extra = [(0, 0)] * (data.ndim - len(pads))
    out[layout.name] = np.pad(data, pads + extra, constant_values=np.asarray(layout.fill, dtype=data.dtype))
    if layout.kind == "table" and layout.growable:
        out[f"{layout.name}#present"] = np.pad(np.asarray(state[f"{layout.name}#present"]), pads)
    return new, out


def import_value(layout: CacheLayout, value: np.ndarray, source: str = "state") -> tuple[CacheLayout, dict]:
    """The inverse of `export`: host state arrays for a user-visible value (tables: `[sizes...,
    *entry]`, auto_dim: its current shape), converted exactly to the dtype. Returns the layout,
    with a larger capacity if the value needs it."""
    from ..values import convert_input
    name = layout.name
    k = len(layout.capacity)
    shape = tuple(np.shape(value))
    if layout.kind == "plain":
        arr = convert_input(f"{source}: {name}", value, layout.dtype, layout.shape)
        if layout.packed:
            from ..model.packing import pack as host_pack
            arr = host_pack(layout.dtype, arr)
        return layout, {name: arr}
    if layout.kind == "table":
        if len(shape) != k + len(layout.shape) or shape[k:] != layout.shape:
            raise OiError(f"{source}: {name}: expected a table of entries {list(layout.shape)} as an array "
                          f"[{k} table size(s)..., {', '.join(map(str, layout.shape))}], got shape {list(shape)}")
        sizes = shape[:k]
    else:
        base = layout.shape
        if len(shape) != len(base) or any(n < b for n, b in zip(shape, base)):
            raise OiError(f"{source}: {name}: expected an auto_dim tensor of at least {list(base)}, "
                          f"got shape {list(shape)}")
        sizes = tuple(n - b for n, b in zip(shape, base))[:k]
    caps = list(layout.capacity)
    for j, n in enumerate(sizes):
        if layout.fixed[j] is not None and n > layout.fixed[j]:
            raise OiError(f"{source}: {name}: size {n} of dim {j} exceeds its fixed size {layout.fixed[j]}")
        while n > caps[j]:
            caps[j] *= 2
    new = replace(layout, capacity=tuple(caps)) if tuple(caps) != layout.capacity else layout
    arr = convert_input(f"{source}: {name}", value, layout.dtype, shape)
    np_dtype = dt.get(layout.dtype).np_dtype
    data = np.full(new.data_shape(), layout.fill, dtype=np_dtype)
    data[tuple(slice(0, n) for n in shape)] = arr
    arrays = {name: data, new.size_key(): np.asarray(sizes, dtype=np.int64).reshape(k)}
    if layout.kind == "table" and layout.growable:
        present = np.zeros(new.capacity, dtype=bool)
        present[tuple(slice(0, n) for n in sizes)] = True
        arrays[f"{name}#present"] = present
    return new, arrays


def export(layout: CacheLayout, state: dict) -> np.ndarray:
    """The user-visible value: tables as [sizes..., *entry]; auto_dim at its current shape."""
    data = np.asarray(state[layout.name])
    if layout.kind == "plain":
        if layout.packed:
            from ..model.packing import unpack
            return unpack(layout.dtype, data, layout.shape)
        return data
    sizes = np.asarray(state[layout.size_key()])
    if layout.kind == "table":
        return data[tuple(slice(0, int(s)) for s in sizes)]
    return data[tuple(slice(0, b + int(c)) for b, c in zip(layout.shape, sizes))]


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
        v = tr.index_value(raw, frame, env)
        neg = tr.lowering.site(messages.negative_index(layout.name, f"index {raw}", "{value}"), span)
        env = tr.fail_if(env, jnp.asarray(v) < 0, neg, v)
        env = self._bound(env, layout, j, jnp.asarray(v, jnp.int64) + 1, span, what="index")
        return env, v, jnp.maximum(size, jnp.asarray(v, jnp.int64) + 1)

    def _bound(self, env, layout: CacheLayout, j: int, end, span, what: str):
        """`end` (exclusive) must fit the fixed size, or the capacity (else ask to grow)."""
        tr = self.tr
        fixed = layout.fixed[j]
        if fixed is not None:
            code = tr.lowering.site(messages.exceeds_fixed(layout.name, j, fixed, what, "{value}"), span)
            return tr.fail_if(env, end > fixed, code, end - 1 if what == "index" else end)
        slot = layout.grow_slots[j]
        return tr.need_capacity(env, slot, jnp.where(end > layout.capacity[j], end, 0))

    def _table_select(self, access: ir.CacheAccess, layout: CacheLayout, env, frame, out_lengths, span):
        """Resolve a table read selection -> (env, starts, lengths, squeeze dims)."""
        tr = self.tr
        k = len(layout.capacity)
        assert len(access.indices) <= k, CHECKED
        sel = list(access.indices) + [ir.Slice(None, None)] * (k - len(access.indices))
        sizes = env[layout.size_key()]
        new_sizes = []
        starts, lengths, squeeze = [], [], []
        slice_pos = 0
        for j, s in enumerate(sel):
            size = sizes[j]
            if isinstance(s, ir.Single):
                env, v, size = self._single(env, frame, layout, j, s.value, span, size=size)
                starts.append(jnp.asarray(v, jnp.int64))
                lengths.append(1)
                squeeze.append(j)
            else:
                start = jnp.int64(0) if s.start is None else jnp.asarray(tr.index_value(s.start, frame, env), jnp.int64)
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
                    end = jnp.asarray(tr.index_value(s.end, frame, env), jnp.int64)
                code = tr.lowering.site(messages.slice_end_before_start(layout.name, "{value}"), span)
                env = tr.fail_if(env, end < start, code, end)
                env = self._bound(env, layout, j, end, span, what="slice end")
                length = out_lengths[slice_pos]
                slice_pos += 1
                code = tr.lowering.site(messages.read_slice_length(layout.name, "{value}", length), span)
                env = tr.fail_if(env, (end - start) != length, code, end - start)
                size = jnp.maximum(size, end)
                starts.append(start)
                lengths.append(length)
            new_sizes.append(size)
        env = dict(env)
        env[layout.size_key()] = jnp.stack(new_sizes).astype(jnp.int64)
        return env, starts, lengths, squeeze

    def _mark_present(self, env, layout: CacheLayout, starts, lengths, value: bool):
        key = f"{layout.name}#present"
        if key not in env:
            return env
        present = env[key]
        mask = jnp.ones(present.shape, bool)
        for j, (s, n) in enumerate(zip(starts, lengths)):
            iota = jax.lax.broadcasted_iota(jnp.int64, present.shape, j)
            mask = mask & (iota >= s) & (iota < s + n)
        env = dict(env)
        env[key] = (present | mask) if value else (present & ~mask)
        return env

    def _auto_access(self, access: ir.CacheAccess, layout: CacheLayout, env, frame, span):
        tr = self.tr
        r = len(layout.capacity)
        assert len(access.indices) <= r, CHECKED
        counts = env[layout.size_key()]
        new = []
        for j in range(r):
            c = counts[j]
            if j < len(access.indices):
                s = access.indices[j]
                assert isinstance(s, ir.Single), CHECKED
                v = jnp.asarray(tr.index_value(s.value, frame, env), jnp.int64)
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
        env = dict(env)
        env[layout.size_key()] = jnp.stack(new).astype(jnp.int64) if new else counts
        return env

    def _auto_shape_check(self, env, layout: CacheLayout, want: tuple[int, ...], span, what: str):
        tr = self.tr
        counts = env[layout.size_key()]
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
        if layout.kind == "plain":
            assert not access.bracketed, CHECKED
            value = unpack(env[layout.name], layout.dtype, layout.shape) if layout.packed else env[layout.name]
        elif layout.kind == "table":
            assert access.bracketed, CHECKED
            n_slices = len(layout.capacity) - sum(isinstance(s, ir.Single) for s in access.indices)
            out_lengths = dst_shape[:n_slices]
            env, starts, lengths, squeeze = self._table_select(access, layout, env, frame, out_lengths, access.span)
            data = env[layout.name]
            n_entry = len(layout.shape)
            idx = [jnp.clip(s, 0, c - n).astype(jnp.int32) if n <= c else jnp.int32(0)
                   for s, n, c in zip(starts, lengths, layout.capacity)]
            if any(n > c for n, c in zip(lengths, layout.capacity)):
                # the destination is larger than the allocation: the step asks to grow and is re-run
                value = jnp.zeros(tuple(lengths) + layout.shape, data.dtype)
            else:
                value = jax.lax.dynamic_slice(data, idx + [jnp.int32(0)] * n_entry, tuple(lengths) + layout.shape)
            value = value.reshape(tuple(n for j, n in enumerate(lengths) if j not in squeeze) + layout.shape)
            env = self._mark_present(env, layout, starts, lengths, True)
        elif dst in self.tr.lowering.shaped:  # dst takes the tensor's current shape (SPEC §0 item 12)
            env = self._auto_access(access, layout, env, frame, access.span)
            current = jnp.asarray(layout.shape, jnp.int64).at[:len(layout.capacity)].add(env[layout.size_key()])
            value = env[layout.name].astype(env[dst].dtype)  # zeros outside the current shape
            return self.tr.embed(env, dst, value, current)
        else:
            env = self._auto_access(access, layout, env, frame, access.span)
            env = self._auto_shape_check(env, layout, dst_shape, access.span, "cache.read")
            data = env[layout.name]
            if any(w > s for w, s in zip(dst_shape, data.shape)):
                value = jnp.zeros(dst_shape, data.dtype)
            else:
                value = data[tuple(slice(0, w) for w in dst_shape)]
        if dst in self.tr.lowering.shaped:  # a fixed-shape selection into a runtime-shaped variable
            return self.tr.embed(env, dst, value.astype(env[dst].dtype))
        assert tuple(value.shape) == tuple(dst_shape), CHECKED  # §0 item 12, checks/caches.py
        env = dict(env)
        env[dst] = value.astype(env[dst].dtype)
        return env

    def write(self, node: ir.CacheWrite, env, frame: Frame):
        access = node.dst
        layout = self._layout(access.base, access.span)
        env, src = self.tr.read(node.src, env, frame)
        if layout.kind == "plain":
            assert not access.indices, CHECKED
            if tuple(src.shape) != layout.shape:
                raise self._err(messages.write_shape(layout.name, layout.shape, src.shape), node.span)
            env = dict(env)
            env[layout.name] = pack(src, layout.dtype) if layout.packed else src
            return env
        if layout.kind == "table":
            k = len(layout.capacity)
            assert access.bracketed and len(access.indices) == k, CHECKED
            assert all(isinstance(s, ir.Single) for s in access.indices), CHECKED
            if tuple(src.shape) != layout.shape:
                raise self._err(messages.write_shape(layout.name, layout.shape, src.shape), node.span)
            sizes = env[layout.size_key()]
            new_sizes, starts = [], []
            ok = jnp.bool_(True)  # this write's own guards: a failing write is skipped, never clamped
            for j, s in enumerate(access.indices):
                env, v, size = self._single(env, frame, layout, j, s.value, access.span, size=sizes[j])
                v = jnp.asarray(v, jnp.int64)
                ok = ok & (v >= 0) & (v < (layout.fixed[j] or layout.capacity[j]))
                new_sizes.append(size)
                starts.append(v)
            env = dict(env)
            env[layout.size_key()] = jnp.where(ok, jnp.stack(new_sizes).astype(jnp.int64), sizes)
            data = env[layout.name]
            idx = [jnp.clip(s, 0, c - 1).astype(jnp.int32) for s, c in zip(starts, layout.capacity)]
            idx = idx + [jnp.int32(0)] * len(layout.shape)
            update = src.reshape((1,) * k + layout.shape).astype(data.dtype)
            # guard the row, not the table: the donated table is then updated in place
            current = jax.lax.dynamic_slice(data, idx, update.shape)
            env[layout.name] = jax.lax.dynamic_update_slice(data, jnp.where(ok, update, current), idx)
            return self._mark_present(env, layout, starts, [1] * k, True)
        env = self._auto_access(access, layout, env, frame, access.span)
        if node.src.indices is None and node.src.name in self.tr.lowering.shaped:
            return self._write_shaped(node, layout, env, src)
        env = self._auto_shape_check(env, layout, tuple(src.shape), access.span, "cache.write")
        data = env[layout.name]
        env = dict(env)
        if all(w <= s for w, s in zip(src.shape, data.shape)):
            zeros = jnp.zeros_like(data)
            env[layout.name] = jax.lax.dynamic_update_slice(zeros, src.astype(data.dtype), [0] * data.ndim)
        return env

    def _write_shaped(self, node: ir.CacheWrite, layout: CacheLayout, env, src):
        """`cache.write v >> M[...]` with a runtime-shaped v: its logical shape must equal M's
        (grown) current shape; the tensor becomes v inside that shape and zeros outside."""
        from .context import SHAPE
        tr = self.tr
        k = len(layout.capacity)
        logical = env[SHAPE + node.src.name]
        current = jnp.asarray(layout.shape, jnp.int64).at[:k].add(env[layout.size_key()])
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
        data = env[name]
        value = src.astype(data.dtype)
        if tuple(value.shape) != tuple(data.shape):  # another tensor's capacity: cut or pad to this one
            value = value[tuple(slice(0, c) for c in data.shape)]
            value = jnp.pad(value, [(0, c - s) for s, c in zip(value.shape, data.shape)])
        mask = jnp.ones(data.shape, bool)
        for j in range(data.ndim):
            mask = mask & (jax.lax.broadcasted_iota(jnp.int64, data.shape, j) < current[j])
        env = dict(env)
        env[name] = jnp.where(mismatch, data, jnp.where(mask, value, jnp.zeros_like(data)))
        return env

    def reset(self, node: ir.CacheReset, env, frame: Frame):
        access = node.target
        layout = self._layout(access.base, access.span)
        env = dict(env)
        np_dtype = dt.get(layout.dtype).np_dtype
        data = env[layout.name]
        if layout.kind == "plain":
            fill = _fill(layout.shape, layout.reset_fill, np_dtype)
            env[layout.name] = pack(fill, layout.dtype) if layout.packed else fill
            return env
        if layout.kind == "auto_dim":
            base = jnp.full(data.shape, layout.fill, np_dtype)
            region = _fill(layout.shape, layout.reset_fill, np_dtype)
            env[layout.name] = jax.lax.dynamic_update_slice(base, region, [0] * data.ndim)
            env[layout.size_key()] = jnp.zeros_like(env[layout.size_key()])
            return env
        assert access.bracketed, CHECKED
        k = len(layout.capacity)
        if not access.indices:
            env[layout.name] = _fill(data.shape, layout.reset_fill, np_dtype)
            env[layout.size_key()] = jnp.asarray([f or 0 for f in layout.fixed], jnp.int64)
            if f"{layout.name}#present" in env:
                env[f"{layout.name}#present"] = jnp.zeros_like(env[f"{layout.name}#present"])
            return env
        assert all(isinstance(s, ir.Single) for s in access.indices), CHECKED
        starts = []
        for j, s in enumerate(access.indices):
            v = jnp.asarray(self.tr.index_value(s.value, frame, env), jnp.int64)
            neg = self.tr.lowering.site(messages.negative_index(layout.name, f"index {s.value}", "{value}"), access.span)
            env = self.tr.fail_if(env, v < 0, neg, v)
            starts.append(v)
        p = len(starts)
        in_range = jnp.all(jnp.stack([(s < c) for s, c in zip(starts, layout.capacity)]))
        block = _fill((1,) * p + tuple(layout.capacity[p:]) + layout.shape, layout.reset_fill, np_dtype)
        idx = [jnp.clip(s, 0, c - 1).astype(jnp.int32) for s, c in zip(starts, layout.capacity)]
        updated = jax.lax.dynamic_update_slice(data, block, idx + [jnp.int32(0)] * (data.ndim - p))
        env[layout.name] = jnp.where(in_range, updated, data)
        key = f"{layout.name}#present"
        if key in env:
            lengths = [1] * p + list(layout.capacity[p:])
            full_starts = starts + [jnp.int64(0)] * (k - p)
            cleared = self._mark_present(env, layout, full_starts, lengths, False)[key]
            env[key] = jnp.where(in_range, cleared, env[key])
            present = env[key]
            sizes = []
            for j in range(k):
                if layout.fixed[j] is not None:
                    sizes.append(jnp.int64(layout.fixed[j]))
                else:
                    other = tuple(a for a in range(k) if a != j)
                    along = jnp.any(present, axis=other) if other else present
                    iota = jnp.arange(1, layout.capacity[j] + 1, dtype=jnp.int64)
                    sizes.append(jnp.max(jnp.where(along, iota, 0)))
            env[layout.size_key()] = jnp.stack(sizes)
        return env

    def step(self, node, env, frame: Frame, sign: int):
        from ..ops.numerics import store
        layout = self._layout(node.target, node.span)
        assert layout.kind == "plain" and layout.shape == (), CHECKED
        d = dt.get(layout.dtype)
        value = env[layout.name]
        n = sign * node.amount
        if d.is_float:
            if d.name == "f64":
                new = value + jnp.float64(n)
            else:
                new = store(value.astype(jnp.float32) + jnp.float32(n), d.name)
        elif d.is_int and not d.packed:
            new = (value.astype(jnp.int64) + jnp.int64(n)).astype(d.np_dtype) if d.bits < 64 else \
                value + jnp.asarray(n).astype(d.np_dtype)
        else:
            raise AssertionError(f"cache.increment of {d.name}: {CHECKED}")
        env = dict(env)
        env[layout.name] = new.astype(value.dtype)
        return env


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
