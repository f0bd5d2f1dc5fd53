"""eq ne lt le gt ge (SPEC §6.4 Comparison): IEEE semantics, output bool."""
from __future__ import annotations

import jax.numpy as jnp

from .builtin import Builtin
from . import jax_numerics as N
from ._common import is_float


def _cmp(fn):
    def impl(inputs, attrs, ctx):
        a, b = inputs
        if is_float(ctx.dtype):
            a, b = N.to_compute(a, ctx.dtype), N.to_compute(b, ctx.dtype)
        return fn(a, b)
    return impl


OPS = {name: Builtin(_cmp(fn)) for name, fn in {
    "eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal,
    "gt": jnp.greater, "ge": jnp.greater_equal,
}.items()}
