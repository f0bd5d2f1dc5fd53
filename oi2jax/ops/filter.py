"""filter is_nan is_inf is_neg is_finite (SPEC §6.4 Filter / predicates)."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .builtin import Builtin
from . import jax_numerics as N
from ._common import is_float


def _filter(inputs, attrs, ctx):
    a, b, cond = inputs
    if ctx.dtype == "bool":
        c = cond
    elif is_float(ctx.dtype):
        # cond != 0 read from the bits (NaN true, ±0.0 false, a subnormal true): a float compare
        # on XLA:CPU reads a subnormal as zero, and fused or not changed which one it did
        c = N.nonzero(cond)
    else:
        c = cond != 0
    return jnp.where(c, a, b)


def _is_nan(inputs, attrs, ctx):
    return jnp.isnan(N.to_compute(inputs[0], ctx.dtype))


def _is_inf(inputs, attrs, ctx):
    return jnp.isinf(N.to_compute(inputs[0], ctx.dtype))


_SIGN_VIEW = {"f16": (jnp.uint16, 15), "bf16": (jnp.uint16, 15), "f8": (jnp.uint8, 7), "f32": (jnp.uint32, 31)}


def _is_neg(inputs, attrs, ctx):
    d = ctx.dtype
    x = inputs[0]
    if d == "f64":
        return jnp.signbit(x)
    if d in _SIGN_VIEW:  # the sign bit: -0.0 and negative NaN are negative
        ut, sh = _SIGN_VIEW[d]
        return (lax.bitcast_convert_type(x, ut) >> sh) != 0
    if jnp.issubdtype(x.dtype, jnp.unsignedinteger):
        return jnp.zeros(x.shape, jnp.bool_)
    return x < 0


def _is_finite(inputs, attrs, ctx):
    return jnp.all(jnp.isfinite(N.to_compute(inputs[0], ctx.dtype)))


OPS = {
    "filter": Builtin(_filter, runtime_shape=True),
    "is_nan": Builtin(_is_nan, runtime_shape=True),
    "is_inf": Builtin(_is_inf, runtime_shape=True),
    "is_neg": Builtin(_is_neg, runtime_shape=True),
    "is_finite": Builtin(_is_finite, shape="scalar"),  # one bool: every element finite
}
