"""Sharding a compiled graph over a device mesh (docs/scaling.md).

`shard={"B": "data", "H": "model"}` maps size variables to mesh axes. Every value whose
declaration has a dim that is exactly a sharded size variable gets a `NamedSharding` whose
PartitionSpec names that mesh axis at that dim (other dims: None; a mesh axis is used at
most once per array, first dim wins). Leading dims the declaration does not have (cache
capacity dims, prefix-table member dims) are replicated, and so are auto_dim caches (their
dims grow), packed constants (stored flat) and a state's bookkeeping (cache sizes, `present`
masks, guards).

- constants: `jax.make_array_from_callback`, each device's shard sliced from the mmap'd
  model tensor, so a process reads only the pages of its own shards;
- state: jit `in_shardings` == `out_shardings`, so caches keep their placement across steps;
- outputs: left where the compiler puts them (`Program.step` returns sharded arrays);
  `Program.run` gathers (`process_allgather` across processes) into NumPy.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import replace

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from .. import dtypes as dt
from .. import ir, quantized
from ..diagnostics import OiError, OiNote, suggest
from ..lowering.state import CacheState, Guards, StepState
from ..protocol import CompileOptions
from .placement import Placer
from .program import Program



# ---------------------------------------------------------------------------- specs & meshes


def parse_mesh_spec(text: str) -> dict[str, int]:
    """'data=4,model=2' -> {'data': 4, 'model': 2} (OiError on malformed text)."""
    axes: dict[str, int] = {}
    for part in text.split(","):
        name, sep, value = (x.strip() for x in part.strip().partition("="))
        if not sep or not name.isidentifier():
            raise OiError(f"--mesh expects AXIS=INT[,AXIS=INT...], got '{text}'")
        if not name.isascii():  # XLA aborts the process on a non-ASCII axis name
            raise OiError(f"--mesh: axis name {name!r} must be ASCII letters, digits and _")
        try:
            size = int(value)
        except ValueError:
            raise OiError(f"--mesh {name}: '{value}' is not an integer") from None
        if size < 1:
            raise OiError(f"--mesh {name}: axis size must be >= 1, got {size}")
        if name in axes:
            raise OiError(f"--mesh: axis {name} given twice")
        axes[name] = size
    return axes


def parse_shard_specs(pairs) -> dict[str, str]:
    """['B=data', 'H=model'] -> {'B': 'data', 'H': 'model'}."""
    shard: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, axis = (x.strip() for x in pair.partition("="))
        if not sep or not name or not axis:
            raise OiError(f"--shard expects SIZEVAR=AXIS, got '{pair}'")
        if name in shard:
            raise OiError(f"--shard: size variable {name} given twice")
        shard[name] = axis
    return shard


def make_mesh(axes: dict[str, int] | str, devices=None) -> Mesh:
    """A mesh over all (global) devices with Auto axis types; the sizes must multiply to the count."""
    if isinstance(axes, str):
        axes = parse_mesh_spec(axes)
    bad = next((k for k in axes if not (isinstance(k, str) and k.isascii() and k.isidentifier())), None)
    if bad is not None:  # XLA aborts the process on a non-ASCII axis name
        raise OiError(f"mesh axis name {bad!r} must be ASCII letters, digits and _")
    devices = list(jax.devices() if devices is None else devices)
    need = math.prod(axes.values())
    if need != len(devices):
        shape = ", ".join(f"{k}={v}" for k, v in axes.items())
        raise OiError(f"mesh {shape} needs {need} devices, but {len(devices)} are available")
    names = tuple(axes)
    try:
        return jax.make_mesh(tuple(axes.values()), names, axis_types=(AxisType.Auto,) * len(names),
                             devices=devices)
    except TypeError:  # older signature
        return Mesh(np.array(devices).reshape(tuple(axes.values())), names)


def auto_mesh(mesh: Mesh) -> Mesh:
    """The same mesh with Auto axis types (explicit-sharding mode would type-check every op)."""
    types = getattr(mesh, "axis_types", None)
    if types is None or all(t == AxisType.Auto for t in types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def validate_shard(bound, mesh: Mesh, shard: dict[str, str]) -> dict[str, str]:
    """OiError for an unknown size variable, an unknown mesh axis, or a size the axis does not divide."""
    if not isinstance(shard, dict):
        raise OiError(f"shard must be a dict {{size variable: mesh axis}}, got {type(shard).__name__}")
    axis_sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
    for name, axis in shard.items():
        if name not in bound.sizes:
            known = ", ".join(sorted(bound.sizes)) or "(none)"
            raise OiError(f"shard {name}={axis}: unknown size variable {name}{suggest(str(name), bound.sizes)} "
                          f"(the graph's size variables are {known})")
        if axis not in axis_sizes:
            raise OiError(f"shard {name}={axis}: unknown mesh axis {axis}{suggest(str(axis), map(str, axis_sizes))} "
                          f"(the mesh's axes are {', '.join(map(str, mesh.axis_names))})")
        n, k = int(bound.sizes[name]), axis_sizes[axis]
        if n % k:
            raise OiError(f"shard {name}={axis}: size variable {name} = {n} is not divisible by mesh "
                          f"axis {axis} of size {k}")
    return dict(shard)


# ---------------------------------------------------------------------------- lazy constants


class LazyConst:
    """A model tensor not yet read: `read(index)` reads one shard's bytes from the file."""

    def __init__(self, model, info, np_dtype):
        self.model = model
        self.info = info
        self.shape = tuple(info.shape)
        self.ndim = len(self.shape)
        self.np_dtype = np.dtype(np_dtype)

    def read(self, index) -> np.ndarray:
        """This shard's block, read from the file (only its bytes; model.read_block)."""
        return self.model.read_block(self.info, index, self.np_dtype)


# ---------------------------------------------------------------------------- the placer


def _index_key(index) -> tuple:
    return tuple((s.start, s.stop, s.step) if isinstance(s, slice) else s for s in index)


class ShardingPlacer(Placer):
    """Places every role over `mesh` by the declarations' dims (see module doc)."""

    def __init__(self, bound, mesh: Mesh, shard: dict[str, str]):
        super().__init__(None)
        if not isinstance(mesh, Mesh):
            raise OiError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        self.bound = bound
        self.graph = bound.graph
        self.mesh = auto_mesh(mesh)
        self.shard = validate_shard(bound, self.mesh, shard or {})
        self.axis_sizes = dict(zip(self.mesh.axis_names, self.mesh.devices.shape))
        for name, axis in self.shard.items():
            shapes = bound.shapes
            if not any(axis in tuple(self.spec_for(v.name, tuple(shapes[v.name]))) for v in self.graph.vars
                       if v.name in shapes):
                warnings.warn(f"shard {name}={axis} shards nothing: no value has a dim it splits (only a declared "
                              f"dim that is exactly {name} is split; product dims such as {name}*D, loop bounds, "
                              f"table indices and packed constants are not: docs/scaling.md); every value stays "
                              f"replicated over {axis}", OiNote, stacklevel=4)
        self.placed: dict[str, dict[str, NamedSharding]] = {}  # role -> name -> sharding

    def platform(self) -> str:
        return self.mesh.devices.flat[0].platform

    # ------------------------------------------------------------ specs

    def decl_axes(self, decl: ir.VarDecl) -> list:
        """Mesh axis (or None) per declared dim."""
        axes, used = [], set()
        for d in decl.dims:
            axis = None
            if len(d.atoms) == 1 and isinstance(d.atoms[0], str):
                axis = self.shard.get(d.atoms[0])
            if axis in used:
                axis = None
            if axis is not None:
                used.add(axis)
            axes.append(axis)
        return axes

    def spec_for(self, name: str, shape: tuple[int, ...]) -> P:
        """PartitionSpec for a value of variable `name` (its IR name: a family's member as the
        family) of `shape`."""
        decl = self.graph.var(name)
        if decl is None or decl.is_auto_dim or (decl.auto_dim and decl.is_table) or not decl.dims:
            return P()
        if dt.get(decl.dtype).packed and decl.kind == ir.MemKind.CONSTANT:
            return P()  # stored flat as packed bytes
        declared = tuple(self.bound.shape(name))
        lead = len(shape) - len(declared)
        if lead < 0 or tuple(shape[lead:]) != declared:
            return P()
        axes = [None] * lead + self.decl_axes(decl)
        for size, axis in zip(shape, axes):
            if axis is not None and size % self.axis_sizes[axis]:
                return P()
        while axes and axes[-1] is None:
            axes.pop()
        return P(*axes)

    def sharding_for(self, key: str, shape) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec_for(key, tuple(shape)))

    # ------------------------------------------------------------ placement

    def lazy_const(self, decl: ir.VarDecl):
        """A LazyConst for a constant read unchanged from the model and actually sharded, else None."""
        model = self.bound.model
        d = dt.get(decl.dtype)
        if model is None or d.packed or decl.dtype == "bool" or decl.is_prefix_table:
            return None
        info = model.tensors.get(self.bound.model_name(decl))
        if info is None or not info.has_data or info.dtype != decl.dtype:
            return None
        if tuple(info.shape) != tuple(self.bound.shape(decl.name)):
            return None
        if self.spec_for(decl.name, info.shape) == P():
            return None
        return LazyConst(model, info, d.np_dtype)

    def _place(self, key: str, value):
        if isinstance(value, LazyConst):
            sharding = self.sharding_for(key, value.shape)
            cache: dict = {}

            def cb(index, value=value, cache=cache):
                k = _index_key(index)
                if k not in cache:
                    cache[k] = value.read(index)
                return cache[k]

            return jax.make_array_from_callback(value.shape, sharding, cb)
        return self._place_as(self.sharding_for(key, np.shape(value)), value)

    def _place_as(self, sharding, value):
        if isinstance(value, jax.Array):
            if value.sharding == sharding:
                return value
            if value.is_fully_addressable and jax.process_count() == 1:
                return jax.device_put(value, sharding)
            value = np.asarray(value)
        host = np.asarray(value)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    def fetch(self, value) -> np.ndarray:
        """A (possibly multi-process) array as a full NumPy array."""
        if isinstance(value, jax.Array) and not value.is_fully_addressable and not value.is_fully_replicated:
            return np.asarray(multihost_utils.process_allgather(value, tiled=True))
        return np.asarray(value)

    def put(self, role: str, values: dict, names: dict | None = None, sources: dict | None = None) -> dict:
        """As `Placer.put`, each value with its variable's sharding; the keys of one source (a
        model tensor, after aliases: a tied embedding) with the same sharding are placed once,
        sharing the buffer."""
        names, sources = names or {}, sources or {}
        placed: dict = {}
        out = {}
        for k, v in values.items():
            name = names.get(k, k)
            if isinstance(v, quantized.QuantTensor):
                raise OiError(f"constant {name}: its model tensor is kept as {v.kind} blocks, which a mesh cannot "
                              f"shard yet; convert the model with --dtype f32 (or bf16) to shard it, or run it "
                              f"on one device")
            once = (sources.get(k, k), self.spec_for(name, np.shape(v) if not isinstance(v, LazyConst) else v.shape))
            if once not in placed:
                placed[once] = self._place(name, v)
            out[k] = placed[once]
        self.placed.setdefault(role, {}).update({k: a.sharding for k, a in out.items()})
        return out

    def state_shardings(self, state: StepState) -> StepState:
        """The sharding of every buffer of `state` (a `StepState` whose leaves have a `shape`):
        a variable's data by its declaration, the bookkeeping (sizes, present, guards) replicated."""
        rep = NamedSharding(self.mesh, P())
        return StepState({n: self.sharding_for(n, v.shape) for n, v in state.vars.items()},
                         {n: CacheState(self.sharding_for(n, c.data.shape), None if c.size is None else rep,
                                        None if c.present is None else rep) for n, c in state.caches.items()},
                         Guards(rep))

    def put_state(self, state: StepState) -> StepState:
        """A host `StepState` placed buffer by buffer (`state_shardings`)."""
        return jax.tree.map(self._place_as, self.state_shardings(state), state)

    def jit_kwargs(self, exe) -> dict:
        consts = {k: v.sharding for k, v in exe.consts.items()}  # as `put` placed them
        dynamic = {name: self.sharding_for(name, self.bound.shape(name)) for name in exe.builder.dynamic}
        state = self.state_shardings(exe.state_spec.avals())
        return {"in_shardings": (consts, state, dynamic), "out_shardings": (state, None)}


def init_distributed(coordinator: str, num_processes: int, process_id: int) -> None:
    """`jax.distributed.initialize` for a multi-process run (CPU: gloo collectives)."""
    if num_processes is None or process_id is None:
        raise OiError("--coordinator needs --num-processes and --process-id")
    if num_processes < 1:
        raise OiError(f"--num-processes must be >= 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise OiError(f"--process-id {process_id} is not in 0..{num_processes - 1}")
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OiError(f"--coordinator {coordinator}: expects HOST:PORT (PORT a number 1..65535)")
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except Exception:  # option absent in this JAX build: keep its default
        pass
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)


def compile_sharded(bound, mesh, shard, options: CompileOptions | None = None) -> Program:
    """A `Program` whose values live on `mesh` (a `ShardingPlacer`): constants loaded shard by
    shard, results gathered on the host. One jit: the fused step whatever `options.yield_mode` says."""
    if isinstance(mesh, (str, dict)):
        mesh = make_mesh(mesh)
    options = replace(options or CompileOptions(), yield_mode="fused")
    return Program(bound, options, placer=ShardingPlacer(bound, mesh, shard or {}))
