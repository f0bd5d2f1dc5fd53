"""Ordering and phases: `barrier` / `dep` -> lax.optimization_barrier; yield/await fused into
one trace with snapshot semantics (SPEC §3.6): consumers run from the state at `yield`,
their writes merge at `await`."""
from __future__ import annotations

import jax

from .. import ir
from .rules import lower_block, rule
from .context import ERR, ERRVAL, GROW, Frame, Tracer
from .state import key_owner, merge_guards


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


def merged_keys(keys, writes) -> list[str]:
    """THE env keys an `await` takes from a consumer (fused here and in the driver): those of the
    variables the consumer may write (`CheckedGraph.writes`), i.e. a value, a cache's size, count
    and present keys and a runtime-shaped value's logical shape (`state.key_owner`); never the
    guards, which `state.merge_guards` folds in (first error wins)."""
    return [k for k in keys if key_owner(k) in writes]


@rule(ir.Yield)
def _yield(node: ir.Yield, env, frame: Frame, tr: Tracer):
    """Entry's yield: run every consumer from the snapshot now; merge at the await."""
    checked = tr.bound.checked
    snapshot = dict(env)
    pending = []
    for name in checked.yield_plan.consumers_of(node.vars):
        result = lower_block(name, dict(snapshot), tr)
        pending.append((result, checked.writes[name]))
    tr.pending = getattr(tr, "pending", []) + pending
    return env


@rule(ir.Await)
def _await(node: ir.Await, env, frame: Frame, tr: Tracer):
    if frame.block != "entry":
        return env  # in a consumer: makes the yielded values visible (no-op under snapshots)
    pending, tr.pending = getattr(tr, "pending", []), []
    env = dict(env)
    for result, writes in pending:
        for key in merged_keys(result, writes):
            env[key] = result[key]
        env = merge_guards(env, result[ERR], result[ERRVAL], result[GROW])
    return env
