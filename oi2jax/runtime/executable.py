"""`Executable`: one generation of a compiled program -- the lowering for one set of cache
capacities, its state codec, its kernels and the placed constants. Immutable: a growth builds the
next generation (`Executable.grown`); `Program` keeps the current one and delegates to it.
`Session`, the yield/await `Driver`, export and the chunked runner are clients of this surface."""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Callable

import jax
import numpy as np

from ..diagnostics import OiError
from ..limits import allocation_error
from ..lowering.context import Lowering
from ..lowering.state import CacheState, Guards, Shaped, StateSpec, StepState
from ..lowering.step import StepBuilder
from ..values import convert_output, unknown_input
from . import cache_state, faults
from .kernels import StepKernels, StepOutcome
from .placement import Placer


@dataclass(frozen=True)
class Host:
    """What an executable takes from the program that builds it, the same for every generation:
    where values live (`placer`), the context every trace and dispatch runs in (`scope()`: x64,
    matmul precision, loop policy, device), and the program's log (`count(what)`: a kernel is
    (re)traced; `note(text)`: anything else worth a line of --explain-recompiles)."""

    placer: Placer
    scope: Callable
    count: Callable[[str], None]
    note: Callable[[str], None]


class Executable:
    """One generation: `lowering` (its `CacheLayout`s), `builder` (the step function),
    `state_spec` (the ONE state codec: `StepState` <-> the trace's `Env`), the placed `consts` (by
    IR name) and `defaults` (each input's), the pure step `jit_step`, the session and fused
    kernels `kernels`. Nothing here changes after construction (the kernels cache what they compile
    for this generation); `grown(layouts)` is the next generation."""

    __slots__ = ("generation", "lowering", "builder", "state_spec", "consts", "defaults", "host", "jit_step",
                 "kernels", "__weakref__")

    def __init__(self, generation: int, lowering: Lowering, builder: StepBuilder, consts, defaults, host: Host):
        init = object.__setattr__
        init(self, "generation", generation)
        init(self, "lowering", lowering)
        init(self, "builder", builder)
        init(self, "state_spec", StateSpec(lowering.caches, len(lowering.growable)))
        init(self, "consts", consts)  # dicts: JAX takes them as pytrees; never changed after this
        init(self, "defaults", defaults)
        init(self, "host", host)
        init(self, "jit_step", self._make_jit())
        init(self, "kernels", StepKernels(self))

    def __setattr__(self, name, value):
        raise AttributeError(f"an Executable does not change ({name}): Executable.grown builds the next one")

    def grown(self, layouts: dict) -> "Executable":
        """The next generation: these cache layouts (a growth, or a state imported at a larger
        capacity), a new lowering and kernels; the same constants and defaults."""
        lowering = replace(self.lowering, caches=MappingProxyType(layouts))
        return Executable(self.generation + 1, lowering, self.builder.for_lowering(lowering), self.consts,
                          self.defaults, self.host)

    def _make_jit(self):
        # no compiler options here: the pure step may be called under a user's jit (a nested jit
        # takes none); oi2jax's own ahead-of-time compiles of it pass them (`compile_options`)
        return jax.jit(self.pure_step(), donate_argnums=(1,), **self.host.placer.jit_kwargs(self))

    @property
    def compile_options(self) -> dict:
        """XLA's options for this program's kernels (`Placer.jit_options`), as `Lowered.compile`
        takes them."""
        return self.host.placer.jit_options().get("compiler_options") or {}

    def pure_step(self, what: str = "step"):
        """The step as a plain function `(consts, state, dynamic) -> (state, outputs)`, each trace
        counted as `what` (`jit_step` jits it; runtime/batch.py vmaps it over stacked states)."""
        builder, spec, count = self.builder, self.state_spec, self.host.count

        def step(consts, state, dynamic):
            count(what)
            flat, outputs = builder(consts, spec.to_env(state), dynamic)
            return spec.from_env(flat), outputs

        return step

    # ------------------------------------------------------------------ facts

    def scope(self):
        """The program's scope (`Program.scope`): enter it around every trace and dispatch."""
        return self.host.scope()

    @property
    def growable(self) -> bool:
        """Whether some cache grows at run time (a step may be undone and re-run after growth)."""
        return bool(self.lowering.growable)

    @property
    def shaped(self) -> dict:
        """Runtime-shaped variables (phases.runtime_shaped): name -> @auto_dim tensor."""
        return self.lowering.shaped

    def dynamic_args(self, dynamic: dict) -> dict:
        """Every dynamic variable: the given value, else its default (a hot path: kept minimal)."""
        if dynamic.keys() <= self.defaults.keys():
            return {**self.defaults, **dynamic} if dynamic else self.defaults
        raise unknown_input(sorted(dynamic.keys() - self.defaults.keys())[0], self.lowering.graph)

    def status_error(self, outcome: StepOutcome, step: int | None = None) -> "OiError | None":
        """The OiError of the error `outcome` records, or None."""
        if not outcome.err:
            return None
        return self.lowering.error_for(outcome.err, outcome.errval, step=step)

    def memory(self) -> dict:
        """Bytes this program keeps in device memory: `weights`, its placed constants (each buffer
        once: a tied embedding's two names share one; GGML blocks at their packed size), and
        `state`, one session's persistent variables and caches at their current capacity (the KV
        cache). Computed from the buffers and the layouts: nothing is allocated."""
        seen, weights = set(), 0
        for leaf in jax.tree.leaves(self.consts):
            if isinstance(leaf, jax.Array) and id(leaf) not in seen:
                seen.add(id(leaf))
                weights += leaf.nbytes
        state = sum(layout.data_nbytes() for layout in self.lowering.caches.values())
        return {"weights": weights, "state": state}

    # ------------------------------------------------------------------ the state

    def initial_values(self) -> dict:
        """Every persistent variable's host value at program start (honours @init):
        runtime/cache_state.py."""
        values = {}
        for layout in self.lowering.caches.values():
            try:
                faults.reach(faults.ALLOCATE)
                values[layout.name] = cache_state.initial_state(layout)
            except MemoryError as exc:
                nbytes = layout.data_nbytes()
                raise allocation_error(exc, f"{layout.name} ({nbytes} bytes)") from None
        return values

    def initial_host_state(self) -> StepState:
        """The state at program start (honours @init) as host arrays."""
        return self.assemble(self.initial_values())

    def assemble(self, values: dict, flags=None) -> StepState:
        """A host `StepState` of persistent `values` (`initial_values` form) and guard `flags`
        (default: no error, no growth asked)."""
        flags = cache_state.no_error(len(self.lowering.growable)) if flags is None else flags
        return cache_state.assemble(self.lowering.caches, values, flags)

    def place(self, host: StepState) -> StepState:
        """A host `StepState` on the device (an allocation failure says how many bytes)."""
        with self.scope():
            try:
                return self.host.placer.put_state(host)
            except Exception as exc:
                nbytes = sum(np.asarray(v).nbytes for v in jax.tree.leaves(host))
                error = allocation_error(exc, f"the state on the device ({nbytes} bytes)")
                if error is None:
                    raise
                raise error from None

    def init_state(self) -> StepState:
        """The state at program start (honours @init): a `StepState` pytree on the device."""
        return self.place(self.initial_host_state())

    def to_host(self, value) -> np.ndarray:
        """A device value as a full host array (gathered when sharded)."""
        return self.host.placer.fetch(value)

    def host_state(self, state: StepState) -> StepState:
        """The state as host arrays."""
        return jax.tree.map(self.to_host, state)

    def export_state(self, state: StepState) -> dict:
        """Every persistent variable's user-visible value (widened like `--out`). Fetches only
        the buffers the values need (not the guards, not `present`): the end of every `run`."""
        out = {}
        for name, layout in self.lowering.caches.items():
            if layout.is_cache:
                cache = state.caches[name]
                host = CacheState(self.to_host(cache.data), None if cache.size is None else self.to_host(cache.size))
            else:
                host = self.to_host(state.vars[name])
            out[name] = convert_output(cache_state.export(layout, host), layout.dtype)
        return out

    def export_present(self, state: StepState) -> dict:
        """Each growable table's `present` mask over its current sizes (bool[sizes...]): which
        entries exist, what a `cache.reset` of a prefix recomputes the sizes from (SPEC §4.5);
        a state file keeps it beside the table's value (state_file.PRESENT)."""
        out = {}
        for name, layout in self.lowering.caches.items():
            if layout.has_present:
                cache = state.caches[name]
                sizes = layout.fixed_sizes() if cache.size is None else self.to_host(cache.size)
                present = np.asarray(self.to_host(cache.present))
                out[name] = present[tuple(slice(0, int(s)) for s in sizes)]
        return out

    # ------------------------------------------------------------------ outputs

    def trim(self, value):
        """A runtime-shaped variable's value (a `Shaped` output) cut to its logical shape, on the
        host; any other value as it is."""
        if not isinstance(value, Shaped):
            return value
        return self.to_host(value.value)[tuple(slice(0, int(n)) for n in self.to_host(value.shape))]

    def trim_outputs(self, outputs: dict) -> dict:
        """Step outputs with runtime-shaped values cut to their logical shapes."""
        if not self.lowering.shaped:
            return outputs
        return {k: self.trim(v) for k, v in outputs.items()}

    def collect_result(self, state: StepState, values: dict) -> dict:
        """The user-facing result: every dynamic and volatile variable from `values` (device or
        host arrays), every persistent variable from `state`; widened like `--out`."""
        result = {}
        bound = self.lowering.bound
        for name in self.builder.dynamic + self.builder.volatile:
            if name in values:
                value = values[name]
                value = value.value if isinstance(value, Shaped) else value  # at capacity, as it came
                result[name] = convert_output(self.to_host(value), bound.dtype(name))
        result.update(self.export_state(state))
        return result

    # ------------------------------------------------------------------ one step

    def session_step(self, state: StepState, dynamic: dict):
        """One step for a session: `(state, outputs)`; `dynamic` complete and placed. The new
        state's `guards.flags` are not donated by the next step, so the host may read them after
        dispatching it. A step whose incoming state holds an unreported error does nothing (the
        session reports that error before anything else)."""
        vars_, caches, flags, outputs = self.kernels.after_unchecked(self.consts, (state.vars, state.caches),
                                                                     state.guards.flags, dynamic)
        return StepState(vars_, caches, Guards(flags)), outputs
