"""`Program`: a compiled graph. Holds the device constants, the jitted step (state donated),
the host loop of `run`, cache growth (capacity doubling + recompile) and error reporting."""
from __future__ import annotations

import contextlib
import json
import math
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from .. import dtypes as dt
from .. import ir
from ..diagnostics import OiError
from ..values import convert_input, convert_output
from . import caches as cache_mod
from .context import ERR, ERRVAL, GROW
from .step import STEPS, StepBuilder, build_lowering

warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


def resolve_device(device):
    """None | 'cpu' | 'gpu' | 'tpu' | jax.Device -> jax.Device (clear error when absent)."""
    if device is None or isinstance(device, jax.Device):
        return device
    try:
        devices = jax.devices(device)
    except RuntimeError as exc:
        raise OiError(f"device {device} is not available ({str(exc).splitlines()[0]})") from None
    if not devices:
        raise OiError(f"device {device} is not available")
    return devices[0]


MAX_VALUE_BYTES = 1 << 40  # 1 TiB: anything larger is a size-variable mistake, not a model


def check_sizes(bound) -> None:
    """Refuse absurd shapes (e.g. a size variable of 2**56) with a located error, before allocating."""
    graph = bound.graph
    names = [v.name for v in graph.vars] + [t for t in graph.temporaries if graph.var(t) is None]
    for name in names:
        shape = bound.shape(name)
        nbytes = dt.get(bound.dtype(name)).nbytes(math.prod(shape))
        if nbytes > MAX_VALUE_BYTES:
            decl = graph.var(name) or graph.temporaries[name]
            raise OiError(f"{name} would need {nbytes} bytes (shape {list(shape)}): too large to allocate; "
                          f"check the size variables", decl.span, source=graph.source)


class Placer:
    """Where values live: one device (default) or, in subclasses, shardings over a mesh.

    Each method takes {name: host or device array} for one role and returns device arrays;
    `jit_kwargs` adds e.g. `out_shardings` so state keeps its placement across steps."""

    def __init__(self, device=None):
        self.device = device

    def put(self, role: str, values: dict) -> dict:
        """role: 'consts' | 'state' | 'dynamic' | 'defaults'."""
        if self.device is not None:
            return {k: jax.device_put(v, self.device) for k, v in values.items()}
        return {k: jnp.asarray(v) for k, v in values.items()}

    def jit_kwargs(self, program) -> dict:
        return {}


class Program:
    """A graph lowered to one jitted step function. See docs/architecture.md."""

    def __init__(self, bound, device=None, yield_mode: str = "fused", placer: "Placer | None" = None):
        self.bound = bound
        self.graph: ir.Graph = bound.graph
        self.device = resolve_device(device)
        self.placer = placer if placer is not None else Placer(self.device)
        self.yield_mode = yield_mode
        self.compiles = 0  # number of (re)traces of the step: the recompile counter
        self.compile_log: list[str] = []  # why each (re)trace happened (--explain-recompiles)
        self._next_reason = "first call"
        check_sizes(bound)
        with self._scope():
            self._lowering = build_lowering(bound)
            self._builder = StepBuilder(self._lowering)
            self._consts = self.placer.put("consts", self._host_consts())
            self._defaults = self.placer.put("defaults", {name: bound.initial(name)
                                                             for name in self._builder.dynamic})
            self._jit = self._make_jit()

    # ------------------------------------------------------------------ plumbing

    @contextlib.contextmanager
    def _scope(self):
        with jax.enable_x64(True):
            if self.device is not None:
                with jax.default_device(self.device):
                    yield
            else:
                yield

    def _host_consts(self) -> dict:
        """Every constant (packed types packed), prefix-table family and non-uniform initial value."""
        consts = {}
        for decl in self.graph.vars:
            if decl.is_prefix_table:
                consts[decl.name] = self.bound.family(decl.name)
            elif decl.kind == ir.MemKind.CONSTANT:
                consts[decl.name] = self._const_value(decl)
        for name, value in self._builder.init_args.items():
            consts[f"__init__/{name}"] = value
        return consts

    def _const_value(self, decl: ir.VarDecl):
        """A constant's host value (subclasses may return something placed lazily)."""
        from ..model.packing import pack
        value = self.bound.initial(decl.name)
        return pack(decl.dtype, value) if dt.get(decl.dtype).packed else value

    def _make_jit(self):
        builder = self._builder

        def step(consts, state, dynamic):
            self.compiles += 1
            self.compile_log.append(f"compile #{self.compiles}: {self._next_reason}")
            self._next_reason = "new input shapes/dtypes or JAX config (retrace)"
            return builder(consts, state, dynamic)

        return jax.jit(step, donate_argnums=(1,), **self.placer.jit_kwargs(self))

    # ------------------------------------------------------------------ public API

    @property
    def dynamic_names(self) -> list[str]:
        return list(self._builder.dynamic)

    def init_state(self) -> dict:
        """The persistent state at program start (honours @init), as a dict pytree."""
        host = {}
        for layout in self._lowering.caches.values():
            host.update(cache_mod.initial_state(layout))
        host[ERR] = np.int32(0)
        host[ERRVAL] = np.int64(0)
        host[GROW] = np.zeros((len(self._lowering.growable),), np.int64)
        if self._lowering.growable:
            host[STEPS] = np.int64(0)
        with self._scope():
            return self.placer.put("state", host)

    def _dynamic_args(self, dynamic: dict) -> dict:
        """Every dynamic variable: the given value, else its default (a hot path: kept minimal)."""
        if dynamic.keys() <= self._defaults.keys():
            return {**self._defaults, **dynamic} if dynamic else self._defaults
        unknown = sorted(dynamic.keys() - self._defaults.keys())
        raise OiError(f"unknown input {unknown[0]}: the graph's dynamic variables are "
                      f"{', '.join(self._builder.dynamic) or '(none)'}")

    def step(self, state: dict, **dynamic):
        """Pure, jitted: (state, outputs). The state's buffers are donated."""
        with self._scope():
            return self._jit(self._consts, state, self._dynamic_args(dynamic))

    def lower(self, state: dict | None = None, **dynamic):
        """JAX's `Lowered` for the step (`.as_text()`, `.compile()`, `cost_analysis()`)."""
        with self._scope():
            state = self.init_state() if state is None else state
            return self._jit.lower(self._consts, state, self._dynamic_args(dynamic))

    def convert_inputs(self, inputs: dict) -> dict:
        """User arrays -> representation of each dynamic variable's dtype (no silent loss)."""
        out = {}
        for name, value in inputs.items():
            decl = self.graph.var(name)
            if decl is None or decl.kind != ir.MemKind.DYNAMIC:
                raise OiError(f"unknown input {name}: the graph's dynamic variables are "
                              f"{', '.join(self._builder.dynamic) or '(none)'}")
            out[name] = convert_input(name, value, decl.dtype, self.bound.shape(name))
        return out

    def run(self, inputs: dict | None = None, steps: int = 1, progress=None, trace: bool = False) -> dict:
        """Run `steps` steps with the same inputs; every dynamic, volatile and persistent variable.

        `trace=True` records `last_trace`: one event per step (the whole graph is ONE kernel, so
        that is the honest granularity of a compiled trace), each step waited for and timed."""
        if trace:
            return self._traced_run(inputs, steps)
        converted = self.convert_inputs(inputs or {})
        with self._scope():
            dynamic = self._dynamic_args(self.placer.put("dynamic", converted))
            state = self.init_state()
            outputs = {name: dynamic[name] for name in self._builder.dynamic}
            outputs.update({name: jnp.zeros(self.bound.shape(name), dt.get(self.bound.dtype(name)).np_dtype)
                            for name in self._builder.volatile})
            if self._lowering.growable:
                state, outputs = self._run_growing(state, dynamic, outputs, steps, progress)
            else:
                for i in range(steps):
                    state, outputs = self._jit(self._consts, state, dynamic)
                    if progress is not None:  # progress(steps done), e.g. oi2jax.progress.ProgressBar
                        progress(i + 1)
            self._raise_if_failed(state)
            return self._collect(state, {**dynamic, **outputs})

    def _traced_run(self, inputs, steps: int) -> dict:
        events = []

        original = self._jit  # wrapped for this run: each step waited for and timed

        def one_step(consts, state, dynamic):
            start = time.perf_counter()
            result = original(consts, state, dynamic)
            jax.block_until_ready(result)
            events.append({"step": len(events), "phase": 0, "kernel": "step (whole graph, one kernel)",
                           "device": str(self.device or jax.devices()[0]),
                           "ms": (time.perf_counter() - start) * 1e3})
            return result

        self._jit = one_step
        try:
            result = self.run(inputs, steps)
        finally:
            if self._jit is one_step:
                self._jit = original
        self.last_trace = events
        return result

    def trace_text(self, events: list[dict] | None = None) -> str:
        """One line per kernel call: `step S phase P KERNEL on DEVICE: MS ms`."""
        events = getattr(self, "last_trace", []) if events is None else events
        return "\n".join(f"step {e['step']} phase {e['phase']} {e['kernel']} on {e['device']}: {e['ms']:.3f} ms"
                         for e in events)

    def run_batched(self, inputs: dict | None = None, batch_var: str = "B", steps: int = 1) -> dict:
        """Like `run`, for inputs with more rows than the size variable `batch_var`: chunks of
        `batch_var` rows in one compiled program, state carried (lowering/chunked.py)."""
        from .chunked import run_batched
        return run_batched(self, inputs, batch_var, steps)

    def _run_growing(self, state, dynamic, outputs, steps: int, progress, chunk: int = 16):
        """Queue steps in chunks, reading back only the applied-step counter between chunks.

        A step that needs more capacity is undone in the kernel, and so is every later step of
        its chunk (same state, same inputs): the host grows, recompiles once and carries on."""
        applied = 0
        while applied < steps:
            for _ in range(min(chunk, steps - applied)):
                state, outputs = self._jit(self._consts, state, dynamic)
            self._raise_if_failed(state)
            applied = int(np.asarray(state[STEPS]))
            need = np.asarray(state[GROW])
            if np.any(need > 0):
                state = self._grow(state, need)
            if progress is not None:
                progress(applied)
        return state, outputs

    def _grow(self, state, need: np.ndarray):
        """Double the capacity of every cache dim that asked for more; recompile once."""
        host = {k: np.asarray(v) for k, v in state.items()}
        layouts = self._lowering.caches
        per_cache: dict[str, list[int]] = {}
        for slot, (name, dim) in enumerate(self._lowering.growable):
            cap = list(per_cache.get(name, layouts[name].capacity))
            while need[slot] > cap[dim]:
                cap[dim] *= 2
            per_cache[name] = cap
        reasons = []
        for name, cap in per_cache.items():
            layout = layouts[name]
            if tuple(cap) == layout.capacity:
                continue
            reasons.append(f"cache {name} capacity {list(layout.capacity)} -> {cap}")
            keys = {k: v for k, v in host.items() if k == name or k.startswith(name + "#")}
            new_layout, new_keys = cache_mod.grow(layout, keys, tuple(cap))
            layouts[name] = new_layout
            host.update(new_keys)
        if not reasons:
            raise OiError("internal error: a cache asked to grow but no capacity changed")
        host[GROW] = np.zeros_like(host[GROW])
        self._jit = self._make_jit()
        self._next_reason = "growth: " + "; ".join(reasons)
        return self.placer.put("state", host)

    def _raise_if_failed(self, state):
        code = int(np.asarray(state[ERR]))
        if code:
            raise self._lowering.error_for(code, int(np.asarray(state[ERRVAL])))

    def _collect(self, state, outputs) -> dict:
        result = {}
        for name in self._builder.dynamic + self._builder.volatile:
            if name in outputs:
                result[name] = convert_output(np.asarray(outputs[name]), self.bound.dtype(name))
        host = {k: np.asarray(v) for k, v in state.items()}
        for name, layout in self._lowering.caches.items():
            result[name] = convert_output(cache_mod.export(layout, host), layout.dtype)
        return result

    # ------------------------------------------------------------------ inspection

    def dump(self, directory) -> list[str]:
        """Write the step program (every --emit form) and each block's kernel into `directory`."""
        from pathlib import Path
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for kind, suffix in (("jaxpr", "jaxpr.txt"), ("stablehlo", "stablehlo.mlir"), ("hlo", "hlo.txt"),
                             ("optimized-hlo", "optimized-hlo.txt")):
            path = out / f"step.{suffix}"
            path.write_text(self.emit(kind))
            written.append(str(path))
        with self._scope():
            state = self.init_state()
            env = self._builder.start_env(self._consts, state, self._dynamic_args({}))
            for block in self.graph.blocks:
                kernel = jax.jit(self._builder.block_kernel(block.name))
                path = out / f"block.{block.name}.stablehlo.mlir"
                path.write_text(kernel.lower(self._consts, env).as_text(debug_info=True))
                written.append(str(path))
        return written

    def emit(self, kind: str = "stablehlo") -> str:
        """jaxpr | stablehlo | hlo | optimized-hlo | graph-json text of the step."""
        if kind == "graph-json":
            from ..graph_json import to_json
            return json.dumps(to_json(self.graph), indent=2)
        with self._scope():
            state = self.init_state()
            dynamic = self._dynamic_args({})
            if kind == "jaxpr":
                return str(jax.make_jaxpr(self._builder)(self._consts, state, dynamic))
            lowered = self._jit.lower(self._consts, state, dynamic)
            if kind == "stablehlo":
                return lowered.as_text(debug_info=True)  # with locations: entry/3:matmul
            if kind == "hlo":
                return lowered.as_text(dialect="hlo")
            if kind == "optimized-hlo":
                return lowered.compile().as_text()
        raise OiError(f"unknown --emit kind {kind}")
