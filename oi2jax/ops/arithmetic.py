"""add sub mul div floor_div rem fma neg abs recip (SPEC §6.4 Arithmetic, §6.2 accumulate)."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .builtin import Builtin
from .. import dtypes as D
from . import jax_numerics as N
from ._common import acc_inputs, float_nary, is_float


def _ring(fn, bool_fn=None):
    """add/sub/mul: wrapping in the container is exact mod 2^bits, so compute there, re-wrap."""
    def impl(inputs, attrs, ctx):
        d = ctx.dtype
        if is_float(d):
            return float_nary(fn, inputs, ctx)
        if d == "bool":
            return bool_fn(inputs[0], inputs[1])
        if ctx.mode == "accumulate":
            return N.wrap(fn(*acc_inputs(inputs, ctx)), ctx.out_dtype)
        return N.wrap(fn(*inputs), ctx.out_dtype)
    return impl


def _mask_value(attrs, ctx):
    d = ctx.dtype
    m = attrs["div_by_zero_mask"]
    if is_float(d):
        return N.float_const(m, d)
    return N.int_const(m, N.np_dtype(d))


def _div(inputs, attrs, ctx):
    a, b = inputs
    d = ctx.dtype
    mask = _mask_value(attrs, ctx)
    if is_float(d):
        ac, bc = N.to_compute(a, d), N.to_compute(b, d)
        return N.store(jnp.where(bc == 0, mask, N.ieee_div(ac, bc)), d)
    return _int_quotient(a, b, d, mask, euclidean=False)


def _int_quotient(a, b, d, mask, euclidean: bool):
    """Integer a / b: truncated, or Euclidean (remainder in [0, |b|)); a zero divisor gives
    `mask`; b = -1 gives -a, wrapped (i8 -128 / -1 -> -128), never XLA's overflow."""
    a, b = jnp.broadcast_arrays(a, b)
    zero = b == 0
    if D.get(d).is_signed:
        minus1 = b == -1
        safe = jnp.where(zero | minus1, jnp.ones_like(b), b)
        q = lax.div(a, safe)
        if euclidean:
            r = a - q * safe
            one = jnp.ones_like(q)
            q = jnp.where(r < 0, jnp.where(safe > 0, q - one, q + one), q)
        q = jnp.where(minus1, -a, q)
    else:
        q = lax.div(a, jnp.where(zero, jnp.ones_like(b), b))
    return N.wrap(jnp.where(zero, mask.astype(q.dtype), q), d)


def _floor_div(inputs, attrs, ctx):
    a, b = inputs
    return _int_quotient(a, b, ctx.dtype, _mask_value(attrs, ctx), euclidean=True)


def _rem(inputs, attrs, ctx):
    a, b = inputs
    d = ctx.dtype
    a, b = jnp.broadcast_arrays(a, b)
    bad = b == 0
    if D.get(d).is_signed:
        bad = bad | (b == -1)
    r = lax.rem(a, jnp.where(bad, jnp.ones_like(b), b))  # truncated (sign of dividend)
    return N.wrap(jnp.where(bad, jnp.zeros_like(r), r), d)


def _fma(inputs, attrs, ctx):
    # not fused: XLA would contract a*b+c into an FMA; the barrier forces the rounded product
    return float_nary(lambda a, b, c: N.no_contract(a * b) + c, inputs, ctx)


def _neg(inputs, attrs, ctx):
    d = ctx.dtype
    if is_float(d):
        return float_nary(lambda x: -x, inputs, ctx)
    return N.wrap(-inputs[0], d)


def _abs(inputs, attrs, ctx):
    d = ctx.dtype
    if is_float(d):
        return float_nary(jnp.abs, inputs, ctx)
    x = acc_inputs(inputs, ctx)[0] if ctx.mode == "accumulate" else inputs[0]
    return N.wrap(jnp.abs(x), ctx.out_dtype)  # abs(i8 -128) wraps to -128


def _recip(inputs, attrs, ctx):
    d = ctx.dtype
    mask = _mask_value(attrs, ctx)
    x = N.to_compute(inputs[0], d)
    return N.store(jnp.where(x == 0, mask, N.ieee_div(jnp.ones_like(x), x)), d)


_MASK = {"div_by_zero_mask": "dtype"}  # §6.3: the mask's kind follows the first input's dtype

OPS = {
    "add": Builtin(_ring(lambda a, b: a + b, jnp.logical_or)),
    "sub": Builtin(_ring(lambda a, b: a - b)),
    "mul": Builtin(_ring(lambda a, b: N.no_contract(a * b), jnp.logical_and)),
    "div": Builtin(_div, value_rules=_MASK),
    "floor_div": Builtin(_floor_div, value_rules=_MASK),
    "rem": Builtin(_rem),
    "fma": Builtin(_fma),
    "neg": Builtin(_neg),
    "abs": Builtin(_abs),
    "recip": Builtin(_recip, value_rules=_MASK),
}
