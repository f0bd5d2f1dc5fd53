"""JAX-side number handling shared by the op impls (pure jnp; traceable).

- `f8_encode_bits(x32)`: jnp port of `oi2jax.host_numerics.f8_encode_bits` (SPEC §5.4), bit-exact.
- `to_compute(x, d)` / `store(y, d)`: low-precision floats are computed in f32 and rounded
  once (f16 RNE, bf16 RNE, f8 via the §5.4 encoder); f32/f64 natively.
- `wrap(x, d)`: integer values (any int container) -> representation of `d`, keeping the
  low `bits` bits (packed: then sign-/zero-extend into int8/uint8).
- `wide_int(signed)`: the widest integer container available (64-bit under x64, else 32).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from .. import dtypes as D

LOWP = ("f16", "bf16", "f8")


def x64_enabled() -> bool:
    return jax.dtypes.canonicalize_dtype(np.int64) == np.dtype(np.int64)


def wide_int(signed: bool = True):
    if x64_enabled():
        return jnp.int64 if signed else jnp.uint64
    return jnp.int32 if signed else jnp.uint32


def wide_float():
    return jnp.float64 if x64_enabled() else jnp.float32


def np_dtype(d: str):
    return D.get(d).np_dtype


def compute_dtype(d: str):
    """Float compute type: f64 for f64, f32 for every other float."""
    return jnp.float64 if d == "f64" else jnp.float32


def f8_encode_bits(x):
    """f32 values -> uint8 E5M2 bytes, OpenInfer's `from_f32` (carry-dropping, ties away)."""
    x = jnp.asarray(x, jnp.float32)
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    sign = ((bits >> 31) & 1).astype(jnp.int32) << 7
    exp = ((bits >> 23) & 0xFF).astype(jnp.int32)
    mant = (bits & 0x7FFFFF).astype(jnp.int32)
    big_m = mant | (1 << 23)
    e8 = exp - 127 + 15
    m2 = ((big_m + (1 << 20)) >> 21) & 3
    normal = sign | (jnp.clip(e8, 0, 31) << 2) | m2
    s = 21 + (1 - e8)
    s_safe = jnp.clip(s, 0, 31)
    half = jnp.left_shift(jnp.int32(1), jnp.maximum(s_safe - 1, 0))
    m2s = (lax.shift_right_logical(big_m + half, s_safe)) & 3
    sub = jnp.where(s >= 32, sign, sign | m2s)
    out = jnp.where(e8 <= 0, sub, normal)
    out = jnp.where(e8 >= 31, sign | 0x7C, out)
    out = jnp.where(exp == 0, sign, out)
    out = jnp.where(jnp.isinf(x), sign | 0x7C, out)
    out = jnp.where(jnp.isnan(x), 0x7D, out)
    return out.astype(jnp.uint8)


def f8_encode(x):
    """f32 -> float8_e5m2 holding OpenInfer's encoding."""
    return lax.bitcast_convert_type(f8_encode_bits(x), jnp.float8_e5m2)


def to_compute(x, d: str):
    """A float value of dtype `d` in its compute type (exact widening)."""
    return jnp.asarray(x).astype(compute_dtype(d))


_BITS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def nonzero(x):
    """OpenInfer's truthiness of each element (SPEC §3.2; cast to bool, SPEC-2026-03 D4): x != 0,
    a float read from its bits: every bit but the sign's, so NaN is true, ±0.0 false, and a
    subnormal true, which XLA:CPU's float compare (denormals read as zero) would call false."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x != 0
    width = x.dtype.itemsize
    bits = lax.bitcast_convert_type(x, _BITS[width])
    return (bits & _BITS[width]((1 << (8 * width - 1)) - 1)) != 0


def f64_to_f32(y):
    """An f64 value rounded to f32 once, as its own step. XLA:CPU fuses `convert(convert(i64 ->
    f64) -> f32)` into one i64 -> f32 rounding (2^60 + 2^36 + 1 becomes 2^60 + 2^37, not the 2^60
    rounded via f64), and drops an optimization barrier between the two; `reduce_precision` to
    f32's bits first keeps the f64 rounding, after which the convert is exact."""
    return lax.reduce_precision(y, exponent_bits=8, mantissa_bits=23).astype(jnp.float32)


def store(y, d: str):
    """Round a compute-type float result to dtype `d` (once)."""
    if d == "f8":
        return f8_encode(jnp.asarray(y).astype(jnp.float32))
    if d == "f64":
        return jnp.asarray(y).astype(jnp.float64)
    y = jnp.asarray(y).astype(jnp.float32)
    if d == "f32":
        return y
    return y.astype(np_dtype(d))


def opaque(value):
    """A float constant XLA may not fold into its neighbours. XLA's algebraic simplifier
    reassociates float arithmetic with constants (`(x + c1) + c2 -> x + (c1 + c2)`,
    `(x - c) + c -> x`, likewise for multiplies), which is not IEEE: OpenInfer rounds after every
    op, and so do the interpreter and a step run op by op. Behind an optimization barrier the value
    is no longer a constant to XLA (a scalar: it still broadcasts and fuses)."""
    return lax.optimization_barrier(value)


def unfolded_index(i):
    """An integer index (an unrolled loop's, a table's layer) that XLA does not fold into the
    kernels using it: each layer's table read or write is then the same kernel with a different
    argument, which XLA compiles once and reuses for every layer, where a folded constant makes
    each layer's kernel distinct (a 30-layer decode step: 85 kernels fewer to compile)."""
    return lax.optimization_barrier(jnp.asarray(i))


def any_true(cond):
    """Whether any element of the bool array `cond` holds, as a bool scalar: the count of true
    elements (int32) compared with 0, not `jnp.any`. XLA:CPU turns a reduction of a long bool
    vector into a tree of reduce-windows whose code takes LLVM long to compile (110 ms for 512
    bools, against 30 ms for the int32 count). The same truth value for every input below 2^31
    elements."""
    cond = jnp.asarray(cond)
    if cond.ndim == 0:
        return cond
    return jnp.sum(cond.astype(jnp.int32), dtype=jnp.int32) > 0


def first_true(cond):
    """`(any, index)` of the bool array `cond` (flattened): whether any element holds, and the
    first one that does (0 where none does), from one argmax: a guard's condition and the index
    of the value its message names (an id out of range). No separate reduction for the `any`."""
    flat = jnp.asarray(cond).reshape(-1)
    i = lax.argmax(flat.astype(jnp.int32), 0, jnp.int32)
    return flat[i], i


def float_const(v, d: str):
    """A (static or traced) scalar attribute as `d`'s compute type: bool -> 1.0/0.0, f32 path
    for f32 and the low-precision types, full f64 for f64."""
    if isinstance(v, (bool, int, float, np.generic)):
        v = float(v)
        if d == "f64":
            return opaque(jnp.asarray(v, wide_float()))
        with np.errstate(over="ignore"):
            return opaque(jnp.asarray(np.float32(v), jnp.float32))
    v = jnp.asarray(v)
    if v.dtype == jnp.bool_:
        v = v.astype(jnp.float32)
    if d == "f64":
        return v.astype(wide_float())
    return v.astype(jnp.float64 if x64_enabled() else jnp.float32).astype(jnp.float32)


def int_const(v, dtype, clip: bool = False):
    """A (static or traced) integer-valued attribute as a 0-d array of int container `dtype`,
    wrapping modulo 2^bits of the container (Python ints wrap exactly; `clip` saturates
    instead, for 64-bit bounds held in a 32-bit container when x64 is off)."""
    if isinstance(v, (bool, int, np.integer)):
        v = int(v)
        info = np.iinfo(np.dtype(dtype))
        bits = info.bits
        if clip:
            v = min(max(v, int(info.min)), int(info.max))
        v &= (1 << bits) - 1
        if info.min < 0 and v >= 1 << (bits - 1):
            v -= 1 << bits
        return jnp.asarray(np.array(v, dtype=np.dtype(dtype)))
    if isinstance(v, float):
        return jnp.asarray(v).astype(dtype)
    v = jnp.asarray(v)
    return v.astype(dtype)


def saturate_i32(v):
    """An integer setting (a Python int or an integer array) as i32 for index arithmetic, a value
    past i32 held at i32's nearest end, never wrapped: a range check on the result (a length, a
    layer, a window) sees it as out of range, or as the "more than any table" it means, not as
    the small number a cast would make of 2^32 + 1."""
    if isinstance(v, (bool, int, np.integer)):
        return min(max(int(v), -2**31), 2**31 - 1)
    v = jnp.asarray(v)
    info = jnp.iinfo(v.dtype)
    if info.min < -2**31 or info.max > 2**31 - 1:
        v = jnp.clip(v, jnp.asarray(max(int(info.min), -2**31), v.dtype), jnp.asarray(min(int(info.max), 2**31 - 1),
                                                                                      v.dtype))
    return v.astype(jnp.int32)


def wrap(x, d: str):
    """Integer values -> `d`'s representation keeping the low bits (packed: w bits)."""
    dt = D.get(d)
    x = jnp.asarray(x)
    if d == "bool":
        return x != 0
    if not dt.packed:
        return x.astype(dt.np_dtype)
    mask = (1 << dt.bits) - 1
    v = x.astype(jnp.int32) & mask if x.dtype.itemsize < 8 else (x & mask).astype(jnp.int32)
    if dt.is_signed:
        v = jnp.where(v >= (1 << (dt.bits - 1)), v - (1 << dt.bits), v)
        return v.astype(jnp.int8)
    return v.astype(jnp.uint8)


def widen(x, d: str, signed: bool | None = None):
    """Integer value of dtype `d` as the widest available container (sign-/zero-extended)."""
    if signed is None:
        signed = D.get(d).is_signed
    return jnp.asarray(x).astype(wide_int(signed))


def bits_of(d: str) -> int:
    return D.get(d).bits


__all__ = ["LOWP", "f8_encode_bits", "f8_encode", "to_compute", "store", "wrap", "widen", "wide_int",
           "wide_float", "float_const", "int_const", "x64_enabled", "compute_dtype", "np_dtype", "ml_dtypes"]


def ieee_div(a, b):
    """Correctly rounded a / b. XLA's CPU simplifier rewrites division by a broadcast or
    scalar into multiplication by a reciprocal (off by an ulp); an optimization barrier on the
    materialized divisor keeps the real division."""
    a, b = jnp.broadcast_arrays(jnp.asarray(a), jnp.asarray(b))
    return a / lax.optimization_barrier(b)


def no_contract(p):
    """Return the float product `p` such that a later add/sub cannot be contracted with it
    into a fused multiply-add (XLA:CPU lets LLVM fuse fmul+fadd inside a loop fusion; OpenInfer
    rounds the product first). `copysign(p + z, p)` with z an opaque zero array is the identity
    (NaN and -0.0 included) and is not an fmul, so nothing downstream can fuse with it.
    (A barrier on a -0.0 constant does not work: LLVM still sees the constant and folds it.)"""
    p = jnp.asarray(p)
    if not jnp.issubdtype(p.dtype, jnp.floating):
        return p
    return jnp.copysign(p + lax.optimization_barrier(jnp.zeros_like(p)), p)
