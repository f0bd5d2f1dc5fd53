"""Exact OpenInfer number conversions shared by every stage (host NumPy side), and Hugging
Face's default rotary frequencies (the nn `rope` op and convert-hf's `rope.inv_freq`).

`f8_encode` is the reference encoder of SPEC §5.4 (E5M2 with the carry-dropping quirk and
ties away from zero); a plain `astype(float8_e5m2)` gives different bits. The JAX
versions used inside compiled kernels live in `oi2jax.ops.jax_numerics`.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from . import dtypes as dt


def f8_encode_bits(x) -> np.ndarray:
    """f32 values -> uint8 E5M2 bytes, bit-exact with OpenInfer's `from_f32` (§5.4)."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.int64)
    sign = ((bits >> 31) & 1).astype(np.uint8) << 7
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    big_m = mant | (1 << 23)
    e8 = exp - 127 + 15
    out = np.zeros(x.shape, dtype=np.uint8)
    # normal f8 range
    m2 = ((big_m + (1 << 20)) >> 21) & 3
    normal = sign | (np.clip(e8, 0, 31).astype(np.uint8) << 2) | m2.astype(np.uint8)
    # f8 subnormal range: s = 21 + (1 - e8)
    s = 21 + (1 - e8)
    s_safe = np.clip(s, 0, 31)
    m2s = ((big_m + (np.int64(1) << np.maximum(s_safe - 1, 0))) >> s_safe) & 3
    sub = np.where(s >= 32, sign, sign | m2s.astype(np.uint8))
    out = np.where(e8 <= 0, sub, normal)
    out = np.where(e8 >= 31, sign | 0x7C, out)
    out = np.where(exp == 0, sign, out)  # zero and f32 subnormals -> signed zero
    is_nan = np.isnan(x)
    is_inf = np.isinf(x)
    out = np.where(is_inf, sign | 0x7C, out)
    out = np.where(is_nan, np.uint8(0x7D), out)
    return out.astype(np.uint8)


def f8_encode(x) -> np.ndarray:
    """f32 values -> float8_e5m2 array holding OpenInfer's encoding of them."""
    return f8_encode_bits(x).view(ml_dtypes.float8_e5m2)


def bf16_encode(x) -> np.ndarray:
    """f32 -> bf16, round to nearest even (§5.3; ml_dtypes agrees for finite values)."""
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16)


def wrap_int(values, bits: int, signed: bool) -> np.ndarray:
    """Keep the low `bits` bits of integer values; sign-extend when `signed` (int64 result)."""
    v = np.asarray(values).astype(np.int64) & ((1 << bits) - 1) if bits < 64 else np.asarray(values).astype(np.int64)
    if signed and bits < 64:
        v = np.where(v >= (1 << (bits - 1)), v - (1 << bits), v)
    return v


def init_scalar(dtype: str, init) -> np.ndarray:
    """THE `@init` rule (one definition for bind, the lowering's initial state and in-kernel
    `cache.reset`, and the interpreter): the literal (`ir.Literal` or None) as a 0-d array in
    `dtype`'s representation. Floats go through f32 for f32 and the low-precision types (f8 with
    the SPEC §5.4 encoder, bf16 round to nearest even), f16 and f64 directly; None is zero."""
    d = dt.get(dtype)
    if init is None:
        return np.zeros((), d.np_dtype)
    v = init.value
    if d.name == "f8":
        return f8_encode(np.float32(v)).reshape(())
    if d.name == "bf16":
        return bf16_encode(np.float32(v)).reshape(())
    if d.is_float:
        return np.asarray(float(v), d.np_dtype)
    if d.name == "bool":
        return np.asarray(bool(v), np.bool_)
    v = int(v)  # in the dtype's range (the checker's `init_error`); u64 above i64's as u64
    return np.asarray(v, np.uint64 if v > np.iinfo(np.int64).max else np.int64).astype(d.np_dtype)


def fill_value(dtype: str, shape: tuple[int, ...], init) -> np.ndarray:
    """An array of `shape` holding the `@init` fill (`init_scalar`) in `dtype`'s representation."""
    return np.full(shape, init_scalar(dtype, init))


def state_fill(decl, shape: tuple[int, ...] = (), reset: bool = False) -> np.ndarray:
    """THE fill of persistent state (SPEC §4.6), an array of `shape` (0-d by default): what a
    persistent variable (`ir.VarDecl`) holds where nothing was written -- at program start, in
    capacity added by growth or by an imported state, and after `cache.reset` (`reset=True`).
    That is its `@init` fill (`init_scalar`), except in an `@auto_dim` tensor, which is zeros until
    a reset fills its base region with `@init`. One definition for the lowering (its layouts, host
    state and in-kernel reset) and the interpreter, which each execute it their own way."""
    init = None if decl.is_auto_dim and not reset else decl.init
    return np.full(shape, init_scalar(decl.dtype, init))


def default_inv_freq(theta: float, hd: int, f64: bool = False):
    """Hugging Face's `1.0 / (theta ** (arange(0, hd, 2).float() / hd))`, each step rounded to f32
    (f64 for f64 inputs); the power correctly rounded."""
    f = np.float64 if f64 else np.float32
    e = np.arange(0, hd, 2).astype(f) / f(hd)
    p = (np.float64(f(theta)) ** e.astype(np.float64)).astype(f)
    return f(1.0) / p
