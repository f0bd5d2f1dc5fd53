"""Ordering and phases: `barrier` / `dep` -> lax.optimization_barrier; yield/await fused into
one trace with snapshot semantics (SPEC §3.6): consumers run from the state at `yield`,
their writes merge at `await`."""
from __future__ import annotations

import jax

from .. import ir
from .rules import lower_block, rule
from .context import Frame, Tracer


@rule(ir.Barrier)
def _barrier(node, env, frame, tr):
    return jax.lax.optimization_barrier(env)


@rule(ir.Dep)
def _dep(node: ir.Dep, env, frame, tr):
    a, b = env.get(node.after), env.get(node.before)
    if a is None or b is None:
        return env  # op names / dotted names: recorded in the IR, no effect (§0 item 6)
    a, b = jax.lax.optimization_barrier((a, b))
    return _put(_put(env, node.after, a), node.before, b)


def _put(env, name: str, array):
    """`env` with variable `name`'s array (`Env.get`: a value, or a cache's data) replaced."""
    return env.set(name, array) if name in env.values else env.set_cache(name, data=array)


@rule(ir.Yield)
def _yield(node: ir.Yield, env, frame: Frame, tr: Tracer):
    """Entry's yield: run every consumer from the snapshot now; merge at the await."""
    checked = tr.bound.checked
    pending = []
    for name in checked.yield_phases.consumers_of(node.vars):  # each from the snapshot: `env` now
        result = lower_block(name, env, tr)
        pending.append((result, checked.writes[name]))
    tr.pending = getattr(tr, "pending", []) + pending
    return env


@rule(ir.Await)
def _await(node: ir.Await, env, frame: Frame, tr: Tracer):
    if frame.block != "entry":
        return env  # in a consumer: makes the yielded values visible (no-op under snapshots)
    pending, tr.pending = getattr(tr, "pending", []), []
    for result, writes in pending:  # the written variables (`Env.take`), then the guards
        env = env.take(result, writes).with_guards(env.guards.merge(result.guards))
    return env
