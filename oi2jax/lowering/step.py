"""The step function: one pure function (consts, state, dynamic) -> (state, outputs), the state an
`Env` (lowering/state.py) both ways.

At step start the environment holds the dynamic inputs, volatile variables and temporaries
at their initial values (§0 item 4), and the persistent state. `entry` is lowered node by
node. A runtime guard that fires skips the failing write (never a clamp) and records a sticky
error code the host reports; a step that needs more capacity in a growable cache is undone (the
old state is returned) so the host can grow and re-run it.
"""
from __future__ import annotations

import copy
from dataclasses import replace
from types import MappingProxyType

import jax
import jax.numpy as jnp
import numpy as np

from .. import ir
from ..ops.jax_numerics import opaque
from . import rules
from .rules import lower_block, lower_nodes
from .caches import PLAIN, build_layouts
from .context import Frame, Lowering, Tracer
from .loops import LoopPolicy, split_families
from .subbyte import unpack
from .state import Env, PhaseIO, Shaped, commit

def build_lowering(bound, loop_policy: LoopPolicy = LoopPolicy(), precision: str = "highest",
                   kernels: str = "jax") -> Lowering:
    """The `Lowering` of a checked and bound graph under `loop_policy` and the float matmul
    `precision` (CompileOptions): its cache layouts, grow slots and the families held member by
    member (loops.split_families)."""
    rules.load()  # every construct module's rules registered
    grow_slots: list = []
    layouts = build_layouts(bound, grow_slots)
    lowering = Lowering(bound=bound, caches=MappingProxyType(layouts), growable=tuple(grow_slots),
                        shaped=MappingProxyType(dict(bound.checked.runtime_shaped)), loop_policy=loop_policy,
                        precision=precision, kernels=kernels)
    return replace(lowering, split=frozenset(split_families(Tracer(lowering, {}), loop_policy)))


def uniform_value(array: np.ndarray):
    """The single value an array is filled with, or None (so fills are built in-kernel)."""
    flat = array.reshape(-1)
    if flat.size == 0:
        return 0
    first = flat[0]
    if np.all((flat == first) | (np.isnan(flat) & np.isnan(first) if flat.dtype.kind == "f" else False)):
        return first
    return None


def fill_array(shape, dtype, fill):
    """An in-kernel fill (a volatile's or temporary's initial value, a reset): floats through an
    opaque scalar (ops.jax_numerics.opaque), so that XLA cannot reassociate arithmetic with it."""
    value = jnp.asarray(fill, dtype)
    if jnp.issubdtype(value.dtype, jnp.floating):
        value = opaque(value)
    return jnp.broadcast_to(value, shape)


class StepBuilder:
    """Knows which values are arguments, which are built in the kernel, and traces the step."""

    def __init__(self, lowering: Lowering):
        self.lowering = lowering
        bound = lowering.bound
        graph = bound.graph
        self.dynamic = [v.name for v in graph.vars_of(ir.MemKind.DYNAMIC)]
        self.volatile = [v.name for v in graph.vars_of(ir.MemKind.VOLATILE) if not v.is_prefix_table]
        self.temps = [name for name in graph.temporaries if graph.var(name) is None]
        # step outputs: every volatile, and the dynamic inputs the graph writes (an unwritten input
        # would only be copied out again; Program.run reports it from the input itself)
        written = set().union(*bound.checked.writes.values())
        self.output_names = tuple(n for n in self.dynamic if n in written) + tuple(self.volatile)
        # what a step returns: the names of entry's top-level `return a, b;`, else output_names
        returned = next((n.vars for n in graph.entry.nodes if isinstance(n, ir.Return)), None) \
            if graph.entry is not None else None
        self.step_outputs = tuple(returned) if returned else self.output_names
        self.fills: dict[str, tuple] = {}  # name -> (shape, dtype, value): built in the kernel
        self.init_args: dict[str, np.ndarray] = {}  # name -> host array passed as a const arg
        for name in self.volatile + self.temps:
            value = bound.initial(name)
            fill = uniform_value(value)
            if fill is None:
                self.init_args[name] = value
            else:
                self.fills[name] = (value.shape, value.dtype, fill)

    def for_lowering(self, lowering: Lowering) -> "StepBuilder":
        """A copy that traces with `lowering`: the same graph at other cache capacities (a
        growth), or bound at other, e.g. symbolic, sizes (`export --symbolic`: in-kernel fills
        take that binding's shapes)."""
        other = copy.copy(self)
        other.lowering = lowering
        other.fills = {n: (lowering.bound.shape(n), dtype, fill) for n, (_, dtype, fill) in self.fills.items()}
        return other

    def fresh(self, consts: dict, env: Env) -> Env:
        """`env` at step start (§0 item 4): volatiles and temporaries at their initial values
        (runtime-shaped ones at the capacity shape, logically as declared), and no capacity
        requested yet."""
        values = {name: fill_array(shape, dtype, fill) for name, (shape, dtype, fill) in self.fills.items()}
        values.update({name: consts[name] for name in self.init_args})  # keyed by the variable's name
        env = replace(env, values={**env.values, **values},
                      guards=replace(env.guards, grow=jnp.zeros((len(self.lowering.growable),), jnp.int64)))
        if self.lowering.shaped:
            tr = Tracer(self.lowering, consts)
            for name in self.lowering.shaped:
                if name in values:
                    env = tr.embed(env, name, values[name])
        return env

    def start_env(self, consts: dict, state: Env, dynamic: dict) -> Env:
        """The environment at step start: the state, the inputs, fresh volatiles/temporaries."""
        return self.fresh(consts, state.update(dynamic))

    def block_kernel(self, block: str):
        """(consts, env) -> env running one block as a call: a consumer kernel of the yield/await
        driver, and the per-block dumps."""
        def kernel(consts, env: Env) -> Env:
            return lower_block(block, env, Tracer(self.lowering, consts))
        return kernel

    def phase_kernel(self, nodes, first: bool, fused_fallback: bool = False):
        """(consts, PhaseIO) -> PhaseIO running one entry phase of the yield/await driver: the
        step's fresh values first (`first`), then the guards of the awaited consumers
        (`io.pending`, in consumer order: `TraceGuards.merge`, first error wins), the phase's
        nodes, and when `io.old` is given (the last phase) the one commit rule (`state.commit`:
        the committed values come back as `new`). `fused_fallback`: yield/await inside entry
        loops, run by the fused rules in one phase."""
        lowering = self.lowering

        def kernel(consts, io: PhaseIO) -> PhaseIO:
            tr = Tracer(lowering, consts)
            env = self.fresh(consts, io.env) if first else io.env
            for guards in io.pending:
                env = env.with_guards(env.guards.merge(guards))
            if fused_fallback:
                tr.pending = []
            with jax.named_scope("entry"):
                env, _ = lower_nodes(nodes, env, Frame("entry"), tr)
            if io.old is None:
                return PhaseIO(env)
            return PhaseIO(env, new=commit(io.old, env, bool(lowering.growable)))  # undo only a step that must grow
        return kernel

    @property
    def all_names(self) -> tuple[str, ...]:
        """Every dynamic the graph writes and every volatile: what a complete result holds
        besides the inputs and the persistent state (whatever `return` names)."""
        return self.output_names

    def value_of(self, env: Env, name: str):
        """A variable's user-level value in `env` (packed persistent values unpacked)."""
        layout = self.lowering.caches.get(name)
        if layout is not None and layout.kind is PLAIN and layout.packed:
            return unpack(env.values[name], layout.dtype, layout.shape)
        return env.get(name)

    def outputs(self, env: Env, names, extra=()) -> dict:
        """The arrays of the variables `names` that `env` holds, then the user-level values of
        `extra` (`value_of`), each runtime-shaped one as a `Shaped` (its value at capacity and its
        logical shape)."""
        outputs = {}
        for name in names:
            value = env.get(name)
            if value is not None:
                outputs[name] = value
        for name in extra:
            if name not in outputs:
                outputs[name] = self.value_of(env, name)
        for name in self.lowering.shaped:
            if name in outputs and name in env.shapes:
                outputs[name] = Shaped(outputs[name], env.shapes[name])
        return outputs

    def __call__(self, consts: dict, state: Env, dynamic: dict, extra: tuple = (), skip=None):
        """(state, outputs): outputs are `return`'s names (else `output_names`) plus `extra`.
        `skip` (a traced bool): where it holds, every table write and reset leaves its row as it
        was (the caller restores every other state entry: `Tracer.writes_on`)."""
        lowering = self.lowering
        tr = Tracer(lowering, consts)
        if skip is not None:
            tr.writes_on = jnp.logical_not(skip)
        env = self.start_env(consts, state, dynamic)
        entry = lowering.graph.entry
        with jax.named_scope("entry"):
            env, _ = lower_nodes(entry.nodes, env, Frame("entry"), tr)
        new_state = commit(state, env, bool(lowering.growable))
        names = tr.outputs if tr.outputs is not None else self.output_names
        return new_state, self.outputs(env, names, extra)
