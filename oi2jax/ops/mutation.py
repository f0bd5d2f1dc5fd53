"""fill (SPEC §6.4 Mutation)."""
from __future__ import annotations

import jax.numpy as jnp

from .builtin import Builtin
from .. import dtypes as D
from . import jax_numerics as N


def fill_value(value, d: str):
    """The fill value as a 0-d array in `d`'s representation (§6.4 conversion rules)."""
    dt = D.get(d)
    if dt.is_float:
        return N.store(N.float_const(value, d), d)
    if d == "bool":
        if isinstance(value, (bool, int, float)):
            return jnp.asarray(bool(value))
        return jnp.asarray(value) != 0
    # integers (signed wrap, unsigned, bitset mod 256, packed w bits): via a 64-bit value
    wide = N.wide_int(dt.is_signed or dt.bits < 64)
    return N.wrap(N.int_const(value, wide), d)


def _fill(inputs, attrs, ctx):
    x = inputs[0]
    v = fill_value(attrs["value"], ctx.dtype)
    return jnp.broadcast_to(v, x.shape).astype(x.dtype)


OPS = {"fill": Builtin(_fill, required=("value",), value_rules={"value": "dtype"})}
