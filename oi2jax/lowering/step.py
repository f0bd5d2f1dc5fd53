"""The step function: one pure function (consts, state, dynamic) -> (state, outputs).

At step start the environment holds the dynamic inputs, volatile variables and temporaries
at their initial values (§0 item 4), and the persistent state. `entry` is lowered node by
node. A runtime guard that fires skips the failing write (never a clamp) and records a sticky
error code the host reports; a step that needs more capacity in a growable cache is undone (the
old state is returned) so the host can grow and re-run it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import ir
from ..phases import written_names
from .blocks import lower_nodes
from .caches import build_layouts
from .context import ERR, ERRVAL, GROW, Frame, Lowering, Tracer

STEPS = "__steps"  # int64: steps applied (programs with growable caches only)
STATE_GUARDS = (ERR, ERRVAL, STEPS)


def build_lowering(bound) -> Lowering:
    grow_slots: list = []
    layouts = build_layouts(bound, grow_slots)
    return Lowering(bound=bound, caches=layouts, growable=grow_slots)


def uniform_value(array: np.ndarray):
    """The single value an array is filled with, or None (so fills are built in-kernel)."""
    flat = array.reshape(-1)
    if flat.size == 0:
        return 0
    first = flat[0]
    if np.all((flat == first) | (np.isnan(flat) & np.isnan(first) if flat.dtype.kind == "f" else False)):
        return first
    return None


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
        written = set().union(*(written_names(graph, b) for b in graph.blocks)) if graph.blocks else set()
        self.output_names = tuple(n for n in self.dynamic if n in written) + tuple(self.volatile)
        self.fills: dict[str, tuple] = {}  # name -> (shape, dtype, value): built in the kernel
        self.init_args: dict[str, np.ndarray] = {}  # name -> host array passed as a const arg
        for name in self.volatile + self.temps:
            value = bound.initial(name)
            fill = uniform_value(value)
            if fill is None:
                self.init_args[name] = value
            else:
                self.fills[name] = (value.shape, value.dtype, fill)

    def start_env(self, consts: dict, state: dict, dynamic: dict) -> dict:
        """The environment at step start: inputs, fresh volatiles/temporaries, the state."""
        env: dict = {}
        env.update(dynamic)
        for name, (shape, dtype, fill) in self.fills.items():
            env[name] = jnp.full(shape, fill, dtype)
        for name in self.init_args:
            env[name] = consts[f"__init__/{name}"]
        env.update(state)
        env[GROW] = jnp.zeros((len(self.lowering.growable),), jnp.int64)
        return env

    def block_kernel(self, block: str):
        """(consts, env) -> env running one block as a call: for per-block dumps."""
        from .blocks import lower_block

        def kernel(consts, env):
            return lower_block(block, env, Tracer(self.lowering, consts))
        return kernel

    def __call__(self, consts: dict, state: dict, dynamic: dict):
        lowering = self.lowering
        tr = Tracer(lowering, consts)
        env = self.start_env(consts, state, dynamic)
        entry = lowering.graph.entry
        with jax.named_scope("entry"):
            env, _ = lower_nodes(entry.nodes, env, Frame("entry"), tr)
        if lowering.growable:
            # a step that needs more cache capacity is undone; the host grows and re-runs it
            undo = jnp.any(env[GROW] > 0)
            new_state = {k: jnp.where(undo, state[k], env[k]) if k not in STATE_GUARDS else env[k]
                         for k in state}
            new_state[STEPS] = state[STEPS] + jnp.where(undo, 0, 1).astype(jnp.int64)
        else:
            # guards skip the failing write itself; the host reports the (sticky) error
            new_state = {k: env[k] for k in state}
        new_state[GROW] = env[GROW]
        names = tr.outputs if tr.outputs is not None else self.output_names
        outputs = {name: env[name] for name in names if name in env}
        return new_state, outputs
