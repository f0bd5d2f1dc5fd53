"""min max sign (SPEC §6.4 Statistics)."""
from __future__ import annotations

import jax.numpy as jnp

from .builtin import Builtin
from . import jax_numerics as N
from ._common import float_nary, is_float


def _minmax(float_fn, int_fn):
    def impl(inputs, attrs, ctx):
        if is_float(ctx.dtype):
            return float_nary(float_fn, inputs, ctx)  # IEEE minNum/maxNum: one NaN is ignored
        return N.wrap(int_fn(*inputs), ctx.dtype)
    return impl


def _sign(inputs, attrs, ctx):
    d = ctx.dtype
    x = N.to_compute(inputs[0], d) if is_float(d) else inputs[0]
    zero = jnp.zeros((), x.dtype)
    return jnp.where(x > zero, jnp.int8(1), jnp.where(x < zero, jnp.int8(-1), jnp.int8(0)))


OPS = {
    "min": Builtin(_minmax(jnp.fmin, jnp.minimum)),
    "max": Builtin(_minmax(jnp.fmax, jnp.maximum)),
    "sign": Builtin(_sign),
}
