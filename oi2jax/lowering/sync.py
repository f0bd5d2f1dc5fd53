"""Ordering and phases: `barrier` / `dep` -> lax.optimization_barrier; yield/await fused into
one trace with snapshot semantics (SPEC §3.6): consumers run from the state at `yield`,
their writes merge at `await`."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .. import ir
from .rules import lower_block, rule
from ..phases import consumers_of, written_names
from .context import ERR, ERRVAL, GROW, Frame, Tracer
from .state import key_owner


@rule(ir.Barrier)
def _barrier(node, env, frame, tr):
    return jax.lax.optimization_barrier(env)


@rule(ir.Dep)
def _dep(node: ir.Dep, env, frame, tr):
    if node.after in env and node.before in env:
        a, b = jax.lax.optimization_barrier((env[node.after], env[node.before]))
        env = dict(env)
        env[node.after], env[node.before] = a, b
    return env  # op names / dotted names: recorded in the IR, no effect (§0 item 6)


def _consumers_of(tr: Tracer, names: tuple[str, ...]) -> list[ir.Block]:
    return consumers_of(tr.graph, names)


@rule(ir.Yield)
def _yield(node: ir.Yield, env, frame: Frame, tr: Tracer):
    """Entry's yield: run every consumer from the snapshot now; merge at the await."""
    snapshot = dict(env)
    pending = []
    for block in _consumers_of(tr, node.vars):
        result = lower_block(block.name, dict(snapshot), tr)
        pending.append((result, written_names(tr.graph, block)))
    tr.pending = getattr(tr, "pending", []) + pending
    return env


@rule(ir.Await)
def _await(node: ir.Await, env, frame: Frame, tr: Tracer):
    if frame.block != "entry":
        return env  # in a consumer: makes the yielded values visible (no-op under snapshots)
    pending, tr.pending = getattr(tr, "pending", []), []
    env = dict(env)
    for result, writes in pending:
        for key in result:
            if key_owner(key) in writes and not key.startswith("__"):
                env[key] = result[key]
        first = (env[ERR] == 0) & (result[ERR] != 0)
        env[ERR] = jnp.where(first, result[ERR], env[ERR])
        env[ERRVAL] = jnp.where(first, result[ERRVAL], env[ERRVAL])
        env[GROW] = jnp.maximum(env[GROW], result[GROW])
    return env
