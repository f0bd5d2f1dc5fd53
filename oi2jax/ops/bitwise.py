"""and or xor not shl shr popcount (SPEC §6.4 Bitwise)."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .builtin import Builtin
from .. import dtypes as D
from ..messages import CHECKED
from . import jax_numerics as N


def _logic(int_fn, bool_fn):
    def impl(inputs, attrs, ctx):
        if ctx.dtype == "bool":
            return bool_fn(*inputs)
        return N.wrap(int_fn(*inputs), ctx.dtype)
    return impl


def _shift_amount(bits, modulus: int, dtype):
    """bits < 0 -> 0, else bits mod `modulus`; as a 0-d array of `dtype`."""
    if isinstance(bits, (bool, int)):
        b = int(bits)
        return jnp.asarray(0 if b < 0 else b % modulus, dtype)
    b = jnp.asarray(bits)
    assert not jnp.issubdtype(b.dtype, jnp.floating), CHECKED  # checks/ops: an integer setting
    if jnp.issubdtype(b.dtype, jnp.unsignedinteger):  # never negative: 2^63 + 1 shifts by 1
        return (b.astype(jnp.uint64) % jnp.uint64(modulus)).astype(dtype)
    b = b.astype(N.wide_int(True)) if b.dtype != jnp.bool_ else b.astype(jnp.int32)
    return jnp.where(b < 0, 0, b % modulus).astype(dtype)


def _shift(left: bool):
    def impl(inputs, attrs, ctx):
        d = ctx.dtype
        dt = D.get(d)
        x = inputs[0]
        # non-packed: the 64-bit shift by (bits mod 64) truncated to the width equals the
        # container shift (XLA: shl by >= width -> 0, logical shr -> 0, arithmetic -> sign fill)
        s = _shift_amount(attrs["bits"], 8 if dt.packed else 64, x.dtype)
        if left:
            y = lax.shift_left(x, jnp.broadcast_to(s, x.shape))
        elif dt.is_signed:
            y = lax.shift_right_arithmetic(x, jnp.broadcast_to(s, x.shape))
        else:
            y = lax.shift_right_logical(x, jnp.broadcast_to(s, x.shape))
        return N.wrap(y, d)
    return impl


def _popcount(inputs, attrs, ctx):
    d = ctx.dtype
    dt = D.get(d)
    x = inputs[0]
    if dt.packed:
        x = x.astype(jnp.uint8) & jnp.uint8((1 << dt.bits) - 1)
    return lax.population_count(x).astype(jnp.uint8)


OPS = {
    "and": Builtin(_logic(jnp.bitwise_and, jnp.logical_and)),
    "or": Builtin(_logic(jnp.bitwise_or, jnp.logical_or)),
    "xor": Builtin(_logic(jnp.bitwise_xor, jnp.logical_xor)),
    "not": Builtin(_logic(jnp.bitwise_not, jnp.logical_not)),
    "shl": Builtin(_shift(True), required=("bits",), value_rules={"bits": "int"}),
    "shr": Builtin(_shift(False), required=("bits",), value_rules={"bits": "int"}),
    "popcount": Builtin(_popcount),
}
