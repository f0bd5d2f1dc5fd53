"""The host side of the step state: each persistent variable's host value at program start, grown
to a larger capacity, imported from and exported to its user-visible form, for one
`lowering.caches.CacheLayout` (layouts: lowering/caches.py).

A plain variable's host value is an array (sub-byte dtypes packed, as on the device); a table's or
auto_dim tensor's a `CacheState` of arrays (`size` None for an all-@fixed table: its sizes are its
fixed sizes, `CacheLayout.fixed_sizes`). `assemble` puts them together into a host `StepState`,
which the program's placer puts on the device (`Placer.put_state`).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import dtypes as dt
from ..diagnostics import OiError
from ..lowering.caches import PLAIN, TABLE, CacheLayout
from ..lowering.state import CacheState, Guards, StepState
from ..model.packing import pack, unpack
from ..values import convert_input


def initial_state(layout: CacheLayout):
    """The host value of a persistent variable at program start (its @init fill)."""
    np_dtype = dt.get(layout.dtype).np_dtype
    if layout.kind is PLAIN:
        value = np.full(layout.shape, layout.fill, dtype=np_dtype)
        if layout.packed:  # sub-byte persistent values stay packed on the device
            value = pack(layout.dtype, value)
        return value
    data = np.full(layout.data_shape(), layout.fill, dtype=np_dtype)
    if layout.kind is TABLE:
        present = np.zeros(layout.capacity, dtype=bool) if layout.has_present else None
        return CacheState(data, None if layout.static_size else layout.fixed_sizes(), present)
    return CacheState(data, np.zeros(len(layout.capacity), dtype=np.int64))


def no_error(n_grow: int) -> np.ndarray:
    """The guard flags `[err, errval, grow...]` of a state that holds no error and asks for no
    capacity."""
    return np.zeros(2 + n_grow, np.int64)


def assemble(layouts, values: dict, flags) -> StepState:
    """A host `StepState` from every persistent variable's host value (`initial_state`,
    `import_value`, `grow`) and the guard flags `[err, errval, grow...]`."""
    return StepState({n: values[n] for n, layout in layouts.items() if not layout.is_cache},
                     {n: values[n] for n, layout in layouts.items() if layout.is_cache},
                     Guards(np.asarray(flags, np.int64)))


def plan_growth(layouts: dict, growable, need, sizes: dict) -> dict[str, list[int]]:
    """The new capacity of each cache that grows, by name. `growable`: the (cache, dim) of each
    growable slot; `need[slot]`: the capacity a step asked for (0: enough); `sizes`: each
    growable cache's current sizes. A dim that asked for more doubles until it fits; since a
    rebuild costs a compile, every other growable dim at least 3/4 full doubles with it instead
    of asking a few steps later (fewer compiles when several dims grow at different paces)."""
    per_cache: dict[str, list[int]] = {}
    for slot, (name, dim) in enumerate(growable):
        cap = list(per_cache.get(name, layouts[name].capacity))
        while need[slot] > cap[dim]:
            cap[dim] *= 2
        per_cache[name] = cap
    for slot, (name, dim) in enumerate(growable):
        cap = list(per_cache.get(name, layouts[name].capacity))
        if need[slot] == 0 and 4 * int(np.asarray(sizes[name])[dim]) >= 3 * cap[dim]:
            cap[dim] *= 2
            per_cache[name] = cap
    return per_cache


def grow(layout: CacheLayout, cache: CacheState, new_capacity: tuple[int, ...]) -> tuple[CacheLayout, CacheState]:
    """A cache's host state padded to `new_capacity` with its fill (host_numerics.state_fill)."""
    new = replace(layout, capacity=tuple(new_capacity))
    pads = [(0, n - o) for o, n in zip(layout.capacity, new_capacity)]
    data = np.asarray(cache.data)
    extra = [(0, 0)] * (data.ndim - len(pads))
    data = np.pad(data, pads + extra, constant_values=np.asarray(layout.fill, dtype=data.dtype))
    present = None if cache.present is None else np.pad(np.asarray(cache.present), pads)
    return new, CacheState(data, cache.size, present)


def import_value(layout: CacheLayout, value: np.ndarray, source: str = "state", present=None):
    """The inverse of `export`: the host value of a persistent variable from its user-visible
    value (tables: `[sizes..., *entry]`, auto_dim: its current shape), converted exactly to the
    dtype. Returns `(layout, host value)`, the layout with a larger capacity if the value needs it."""
    name = layout.name
    k = len(layout.capacity)
    shape = tuple(np.shape(value))
    if layout.kind is PLAIN:
        arr = convert_input(f"{source}: {name}", value, layout.dtype, layout.shape)
        if layout.packed:
            arr = pack(layout.dtype, arr)
        return layout, arr
    if layout.kind is TABLE:
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
    if layout.kind is TABLE and layout.static_size and tuple(sizes) != tuple(layout.fixed):
        # its sizes are its fixed sizes: the entries not given would silently be its fill
        raise OiError(f"{source}: {name}: every index of this table is @fixed, so it holds {list(layout.fixed)} "
                      f"entries (as a state exported or saved gives it), got {list(sizes)}; give every entry "
                      f"(an entry never written holds the fill {layout.fill})")
    new = replace(layout, capacity=tuple(caps)) if tuple(caps) != layout.capacity else layout
    arr = convert_input(f"{source}: {name}", value, layout.dtype, shape)
    np_dtype = dt.get(layout.dtype).np_dtype
    data = np.full(new.data_shape(), layout.fill, dtype=np_dtype)
    data[tuple(slice(0, n) for n in shape)] = arr
    given, present = present, None
    if given is not None and not layout.has_present:
        raise OiError(f"{source}: {name}#present: {name} is not a growable table (only those record which "
                      f"entries exist)")
    if layout.has_present:
        present = np.zeros(new.capacity, dtype=bool)
        if given is None:  # every entry within the sizes exists (an --out file, a dict of values)
            present[tuple(slice(0, n) for n in sizes)] = True
        else:
            given = np.asarray(given)
            if given.dtype != np.bool_ or tuple(given.shape) != tuple(sizes):
                raise OiError(f"{source}: {name}#present: expected bool{list(sizes)} (which entries of {name} "
                              f"exist, one per entry), got {given.dtype}{list(given.shape)}")
            present[tuple(slice(0, n) for n in sizes)] = given
    # an all-@fixed table's sizes are its fixed sizes, whatever the array held
    size = None if layout.static_size else np.asarray(sizes, dtype=np.int64).reshape(k)
    return new, CacheState(data, size, present)


def export(layout: CacheLayout, value) -> np.ndarray:
    """The user-visible value of a host value (`present` is not read): tables as
    [sizes..., *entry]; auto_dim at its current shape."""
    if layout.kind is PLAIN:
        data = np.asarray(value)
        if layout.packed:
            return unpack(layout.dtype, data, layout.shape)
        return data
    data = np.asarray(value.data)
    sizes = layout.fixed_sizes() if value.size is None else np.asarray(value.size)
    if layout.kind is TABLE:
        return data[tuple(slice(0, int(s)) for s in sizes)]
    return data[tuple(slice(0, b + int(c)) for b, c in zip(layout.shape, sizes))]
