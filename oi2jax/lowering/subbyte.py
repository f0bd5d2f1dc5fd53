"""Sub-byte values inside kernels: packed constants stay packed on device (§5.1 layout,
LSB-first) and are unpacked here, inside the compiled step, into int8/uint8 values."""
from __future__ import annotations

import math

import jax.numpy as jnp

from .. import dtypes as dt


def pack(values, dtype: str):
    """Values of packed `dtype` (int8/uint8 representation) -> uint8 bytes, LSB-first (§5.1)."""
    d = dt.get(dtype)
    w = d.bits
    per_byte = 8 // w
    flat = values.reshape(-1)
    if d.name == "t1":
        patterns = (flat > 0).astype(jnp.uint8)
    else:
        patterns = flat.astype(jnp.uint8) & jnp.uint8((1 << w) - 1)
    pad = (-flat.shape[0]) % per_byte
    patterns = jnp.pad(patterns, (0, pad)).reshape(-1, per_byte)
    shifts = jnp.arange(per_byte, dtype=jnp.uint8) * w
    return jnp.bitwise_or.reduce(patterns << shifts[None, :], axis=1).astype(jnp.uint8)


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
