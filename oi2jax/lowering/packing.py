"""Sub-byte values inside kernels: packed constants stay packed on device (§5.1 layout,
LSB-first) and are unpacked here, inside the compiled step, into int8/uint8 values."""
from __future__ import annotations

import math

import jax.numpy as jnp

from .. import dtypes as dt


def unpack(packed, dtype: str, shape: tuple[int, ...]):
    """uint8 bytes (ceil(numel*w/8)) -> values of `dtype` (sign-extended int8 / uint8)."""
    d = dt.get(dtype)
    w = d.bits
    per_byte = 8 // w
    numel = math.prod(shape)
    shifts = jnp.arange(per_byte, dtype=jnp.uint8) * w
    fields = (packed[:, None] >> shifts[None, :]) & jnp.uint8((1 << w) - 1)
    flat = fields.reshape(-1)[:numel]
    if d.name == "t1":
        values = jnp.where(flat == 1, jnp.int8(1), jnp.int8(-1))
    elif d.is_signed:
        signed = flat.astype(jnp.int8)
        values = jnp.where(signed >= (1 << (w - 1)), signed - jnp.int8(1 << w), signed)
    else:
        values = flat
    return values.astype(d.np_dtype).reshape(shape)
