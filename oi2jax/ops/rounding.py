"""clamp floor ceil round trunc (SPEC §6.4 Rounding)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .builtin import Builtin
from .. import dtypes as D
from . import jax_numerics as N
from ._common import float_unary, is_float


def round_half_away(x):
    """Round half away from zero (2.5 -> 3, -2.5 -> -3); NaN/inf/-0.0 preserved."""
    t = jnp.trunc(x)
    frac = jnp.abs(x - t)
    return jnp.where(frac >= 0.5, t + jnp.sign(x), t)


def _clamp(inputs, attrs, ctx):
    d = ctx.dtype
    x = inputs[0]
    if is_float(d):
        # f64 natively; f32 with bounds rounded to f32; f16/bf16/f8 clamp in f64 then round to
        # f32 -- identical to clamping in f32 with f32-rounded bounds (rounding is monotone).
        xc = N.to_compute(x, d)
        lo = N.float_const(attrs["min"], d).astype(xc.dtype)
        hi = N.float_const(attrs["max"], d).astype(xc.dtype)
        return N.store(jnp.fmin(jnp.fmax(xc, lo), hi), d)  # NaN -> lo
    unsigned = not D.get(d).is_signed
    wide = N.wide_int(not unsigned)
    lo = N.int_const(attrs["min"], wide, clip=True)
    hi = N.int_const(attrs["max"], wide, clip=True)
    y = jnp.minimum(jnp.maximum(x.astype(wide), lo), hi)
    return N.wrap(y, d)


OPS = {
    "clamp": Builtin(_clamp, value_rules={"min": "dtype", "max": "dtype"}),
    "floor": Builtin(float_unary(jnp.floor)),
    "ceil": Builtin(float_unary(jnp.ceil)),
    "trunc": Builtin(float_unary(jnp.trunc)),
    "round": Builtin(float_unary(round_half_away)),
}
del np
