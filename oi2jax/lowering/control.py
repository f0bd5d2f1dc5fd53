"""Control flow: `branch` -> lax.cond (call and return, §3.2); `loop` -> lax.fori_loop, or unrolled
by the loop policy (§3.3, lowering/loops.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import dtypes as dt
from .. import ir
from .. import messages
from ..ops.jax_numerics import nonzero
from ..messages import CHECKED
from . import loops
from .rules import lower_block, lower_nodes, rule
from .context import Frame, Tracer
from . import machine


def truthy(value, dtype: str):
    """OpenInfer truthiness of a scalar: bool as is, numbers != 0 (NaN is true)."""
    assert not dt.get(dtype).packed, CHECKED  # checks/control.py: packed scalars are no conditions
    v = value.reshape(())
    return v if v.dtype == jnp.bool_ else nonzero(v)


@rule(ir.Branch)
def _branch(node: ir.Branch, env, frame: Frame, tr: Tracer):
    if node.cond is None:
        return lower_block(node.then_block, env, tr)
    env, cond = tr.read(ir.VarRef(node.cond, node.span), env, frame)
    pred = truthy(cond, tr.bound.dtype(node.cond))
    if machine.needs_machine(tr, node):  # targets shared by many paths: each block lowered once
        return machine.run_branch(node, env, frame, tr, pred)
    return jax.lax.cond(pred,
                        lambda e: lower_block(node.then_block, e, tr),
                        lambda e: lower_block(node.else_block, e, tr),
                        env)


def _bound(value: ir.IndexValue, env, frame: Frame, tr: Tracer):
    """A loop bound and the runtime errors reading it can raise: a static int (literal, sizevar,
    metadata, constant) and none, or a traced int64 and `(cond, message, errval, render)` guards
    (a float that is not finite or truncates outside i64, a u64 past i64's range)."""
    lo, hi = messages.I64_RANGE
    static = tr.bound.loop_bound(value)
    if static is None and isinstance(value, str):
        static = tr.static_scalar(value)
    if static is not None:
        static = int(static)
        if lo <= static < hi:
            return static, ()
        return 0, ((True, messages.loop_bound_out_of_range(value, static), 0, None),)  # a u64 constant
    _, v = tr.read(ir.VarRef(value, ir.NO_SPAN), env, frame)
    v = v.reshape(())
    if jnp.issubdtype(v.dtype, jnp.floating):
        v = v.astype(jnp.float64)
        finite = jnp.isfinite(v)
        t = jnp.trunc(jnp.where(finite, v, 0.0))
        outside = finite & ((t < float(lo)) | (t >= float(hi)))
        shown = lambda bits: messages.loop_bound_out_of_range(value, float(np.int64(bits).view(np.float64)))
        return (jnp.where(outside, 0.0, t).astype(jnp.int64),
                ((~finite, messages.loop_bound_not_finite(value), 0, None),
                 (outside, None, jax.lax.bitcast_convert_type(v, jnp.int64), shown)))
    if v.dtype == jnp.uint64:
        outside = v >= jnp.uint64(hi)
        shown = lambda bits: messages.loop_bound_out_of_range(value, int(bits) % 2**64)
        return jnp.where(outside, jnp.uint64(0), v).astype(jnp.int64), ((outside, None, v.astype(jnp.int64), shown),)
    return v.astype(jnp.int64), ()


def _checked_bounds(node: ir.Loop, env, frame: Frame, tr: Tracer):
    """(env, lo, hi): a bound that is not finite or no i64 holds is a runtime error, and the loop
    runs 0 times -- never forever, never silently wrapped."""
    (lo, lo_guards), (hi, hi_guards) = (_bound(value, env, frame, tr) for value in (node.start, node.end))
    bad = None
    for cond, message, errval, render in lo_guards + hi_guards:
        code = tr.lowering.site(message or render(0), node.span, render)
        env = tr.fail_if(env, cond, code, errval)
        bad = cond if bad is None else bad | cond
    if bad is True:
        hi = lo
    elif bad is not None:
        hi = jnp.where(bad, jnp.asarray(lo, jnp.int64), hi)
    return env, lo, hi


def _until_return(body: tuple[ir.Node, ...], block: str) -> tuple[tuple[ir.Node, ...], bool]:
    """A loop body up to the node that ends the loop (`ir.ends_frame`: a `return`, or outside entry
    a `yield`), and whether there is one: then the loop runs its first iteration only."""
    for i, node in enumerate(body):
        if ir.ends_frame(node, block):
            return body[:i], True
    return body, False


@rule(ir.Loop)
def _loop(node: ir.Loop, env, frame: Frame, tr: Tracer):
    env, lo, hi = _checked_bounds(node, env, frame, tr)
    static_range = (lo, hi) if isinstance(lo, int) and isinstance(hi, int) else None
    body, returns = _until_return(node.body, frame.block)

    def body_fn(i, e, scope=f"loop_{node.name}"):
        inner = frame.enter_loop(node.var, i, static_range)
        with jax.named_scope(scope):
            e, _ = lower_nodes(body, e, inner, tr)
        return e

    if returns:  # `return` (a consumer's `yield`) in a loop body ends the loop in its first iteration (§3.3)
        if static_range is not None:
            return body_fn(lo, env) if lo < hi else env
        return jax.lax.cond(lo < hi, lambda e: body_fn(jnp.asarray(lo, jnp.int64), e), lambda e: e, env)
    if static_range is not None and lo >= hi:
        return env
    how = loops.unrolling(node, hi - lo if static_range is not None else None, tr, tr.lowering.loop_policy)
    if how.unroll:  # a static index: every W[l] a static slice (lowering/loops.py)
        for i in range(lo, hi):
            env = body_fn(i, env, f"loop_{node.name}.{i}")
        return env
    if how.factor > 1:
        return jax.lax.fori_loop(lo, hi, body_fn, env, unroll=how.factor)
    return jax.lax.fori_loop(lo, hi, body_fn, env)
