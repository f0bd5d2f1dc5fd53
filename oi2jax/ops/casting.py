"""cast (SPEC §6.4 Casting, §0 item 10)."""
from __future__ import annotations

import jax.numpy as jnp

from .. import dtypes as D
from .builtin import Builtin
from .errors import OpTypeError
from . import jax_numerics as N
from ._common import static_bool
from .rounding import round_half_away

_ROUND = {"trunc": jnp.trunc, "floor": jnp.floor, "ceil": jnp.ceil, "nearest": round_half_away}


def _float_to_int(x, src: str, dst: str, mode: str, saturate):
    """Round (mode), NaN -> 0, then saturate to dst's range or wrap modulo 2^bits."""
    dt = D.get(dst)
    # f32 / low-precision values round exactly in f32; f64 in f64 (same result as via f64)
    xc = N.to_compute(x, src)
    r = _ROUND[mode](xc)
    r = jnp.where(jnp.isnan(r), jnp.zeros_like(r), r)
    bits = dt.bits
    lo = -(2.0 ** (bits - 1)) if dt.is_signed else 0.0
    hi = 2.0 ** (bits - 1) if dt.is_signed else 2.0 ** bits  # exclusive, exact power of two
    in_range = (r >= lo) & (r < hi)
    safe = jnp.where(in_range, r, jnp.zeros_like(r))
    conv = safe.astype(dt.np_dtype)
    sat = jnp.where(r < lo, jnp.asarray(dt.min, dt.np_dtype), jnp.asarray(dt.max, dt.np_dtype))
    sat_result = jnp.where(in_range, conv, sat)
    if saturate is True:
        return sat_result
    wrapped = _wrap_float(r, dst)
    if saturate is False:
        return jnp.where(in_range, conv, wrapped)
    return jnp.where(jnp.asarray(saturate) != 0, sat_result, jnp.where(in_range, conv, wrapped))


def _wrap_float(r, dst: str):
    """Integral float r -> its value modulo 2^bits in dst (±inf -> 0). fmod is exact; folding
    into [-2^(W-1), 2^(W-1)) is exact (Sterbenz); then the int conversion is exact."""
    bits = D.get(dst).bits
    w = 64 if bits == 64 else 32
    cont = N.wide_int(True) if w == 64 else jnp.int32
    r = jnp.where(jnp.isfinite(r), r, jnp.zeros_like(r))
    m = jnp.fmod(r, jnp.asarray(2.0 ** bits, r.dtype))
    half, full = jnp.asarray(2.0 ** (w - 1), r.dtype), jnp.asarray(2.0 ** w, r.dtype)
    m = jnp.where(m >= half, m - full, m)
    m = jnp.where(m < -half, m + full, m)
    return N.wrap(m.astype(cont), dst)


def _cast(inputs, attrs, ctx):
    x = inputs[0]
    src, dst = ctx.dtype, ctx.out_dtype
    s, d = D.get(src), D.get(dst)
    if dst == "bool":  # SPEC-2026-03 D4: x != 0 (NaN -> true, ±0.0 -> false)
        return N.nonzero(x)
    if s.is_float and d.is_float:
        if dst == "f64":
            return x.astype(jnp.float64)
        if src == "f64":
            return N.store(x.astype(jnp.float32), dst)  # via f32 (double rounding, as the reference)
        return N.store(x.astype(jnp.float32), dst)
    if s.is_float:
        mode = attrs.get("rounding_mode", "trunc")
        if not isinstance(mode, str) or mode not in _ROUND:
            raise ValueError(f"unsupported cast rounding_mode {mode!r}")
        sat = attrs.get("saturate", True)
        sb = static_bool(sat)
        return _float_to_int(x, src, dst, mode, sat if sb is None else sb)
    if d.is_float:
        if dst == "f64":
            return x.astype(jnp.float64)
        if s.bits == 64:
            return N.store(N.f64_to_f32(x.astype(jnp.float64)), dst)  # via f64, then rounded
        return N.store(x.astype(jnp.float32), dst)  # <= 32-bit ints: direct rounding == via f64
    return x.astype(d.np_dtype)  # widening int -> int: value preserved


def cast_allowed(src: str, dst: str) -> bool:
    """§6.4 cast pairs."""
    SI, UI = D.SIGNED_INTS, D.UNSIGNED_INTS
    if dst == "bool":  # SPEC-2026-03 D4: from every dtype cast takes
        return src in D.FLOATS + SI + UI + D.PACKED_SIGNED + D.PACKED_UNSIGNED
    if dst not in D.FLOATS + SI + UI:
        return False
    if src in D.FLOATS:
        return True
    if dst in D.FLOATS:
        return src in SI + UI + D.PACKED_SIGNED + D.PACKED_UNSIGNED
    if src in SI:
        return dst in SI and D.get(dst).bits > D.get(src).bits
    if src in UI:
        return dst in UI and D.get(dst).bits > D.get(src).bits
    if src in D.PACKED_SIGNED:
        return dst in SI
    if src in D.PACKED_UNSIGNED:
        return dst in UI
    return False


def _check_cast(in_dtypes, out_dtype, attrs, op_def) -> None:
    listed = not op_def.output_dtypes or out_dtype in op_def.output_dtypes or out_dtype == "bool"  # D4 adds bool
    if not listed or not cast_allowed(in_dtypes[0], out_dtype):
        raise OpTypeError(f"unsupported cast from {in_dtypes[0]} to {out_dtype}", attr="to")


OPS = {"cast": Builtin(_cast, required=("to",), check=_check_cast)}
