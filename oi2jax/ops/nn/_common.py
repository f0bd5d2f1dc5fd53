"""Helpers shared by the nn op set's modules: float kernels in the compute type, static
attributes, NumPy references in float64 and the sample generators of the generated tests."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import dtypes as D
from .. import jax_numerics as N
from ..errors import OpTypeError
from ..numerical import PRECISIONS


def map_float(fn, x, ctx):
    """An elementwise float function in the compute type, rounded once to the output dtype."""
    return N.store(fn(N.to_compute(x, ctx.dtype)), ctx.out_dtype)


def as_f64(x):
    return np.asarray(x).astype(np.float64)


def ref_unary(fn):
    """A unary float64 NumPy reference (IEEE warnings silenced: NaN / inf are results here)."""
    def ref(x):
        with np.errstate(all="ignore"):
            return fn(as_f64(x))
    return ref


def matmul_precision(ctx):
    """The float matmul precision of the program being traced (`ctx.precision`: `--precision`), as
    the built-in matmul."""
    return PRECISIONS[ctx.precision]


def static_int(value, op_name: str, attr: str) -> int:
    """An attribute that fixes a shape (an axis): a literal or a constant, not a run-time variable."""
    if isinstance(value, (float, np.floating)) and not float(value).is_integer():
        raise OpTypeError(f"op {op_name}: {attr} must be an integer, got {value!r}", attr=attr)
    try:
        return int(value)
    except TypeError:  # a traced value (jax.errors.TracerIntegerConversionError is one)
        raise OpTypeError(f"op {op_name}: {attr} must be a literal integer (it fixes the output's shape), "
                          f"not a variable", attr=attr) from None


def norm_axis(op_name: str, axis, rank: int) -> int:
    axis = static_int(axis, op_name, "axis")
    if not -rank <= axis < rank:
        raise OpTypeError(f"op {op_name}: axis {axis} is out of range for rank {rank}", attr="axis")
    return axis % rank


def float_attr(value, d: str):
    """A float attribute (literal or variable) in `d`'s compute type."""
    return N.float_const(value, d).astype(N.compute_dtype(d))


def dtype_name(np_dtype) -> str:
    """The DSL dtype of a NumPy dtype (bf16 and the f8s included, which NumPy's kinds do not tell)."""
    for name, dt in D.DTYPES.items():
        if np.dtype(dt.np_dtype) == np.dtype(np_dtype):
            return name
    raise KeyError(np_dtype)


def rep_values(values, d: str):
    """float64 values -> the representation of float dtype `d` (rounded once)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values, np.float64).astype(D.get(d).np_dtype)


def float_samples(rng, d: str, shape, scale: float = 1.0, edges=(), offset: float = 0.0):
    """Random normal values (times `scale`, plus `offset`) of float dtype `d`, the first ones `edges`."""
    n = math.prod(shape)
    v = rng.standard_normal(n) * scale + offset
    e = np.asarray(edges, np.float64)[:n]
    v[:len(e)] = e
    return rep_values(v.reshape(shape), d)


def sample_values(rng, d: str, shape):
    """Random values of any dtype `d` (in its representation)."""
    dt = D.get(d)
    if d == "bool":
        return rng.random(shape) < 0.5
    if dt.is_float:
        return float_samples(rng, d, shape, 4.0)
    lo, hi = max(int(dt.min), -100), min(int(dt.max), 100)
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(dt.np_dtype)


def unary_samples(edges, scale: float = 3.0, positive: bool = False):
    def samples(rng, d):
        a = float_samples(rng, d, (2, 8), scale, edges)
        b = float_samples(rng, d, (3, 4), 1.0)
        if positive:
            b = rep_values(np.abs(as_f64(b)) + 0.25, d)
        return [((a,), {}), ((b,), {}), ((rep_values(0.75, d),), {})]
    return samples


SPECIAL_FLOATS = (np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0)


_SIGNED = {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}


def float_order_key(x):
    """An integer per float, in the order top_k and argmax rank them: every NaN the largest (one value),
    -0.0 and +0.0 one value (0), every other value in its exact float order, subnormals included:
    the magnitude's bits, negated for a negative sign. Integer operations only: XLA:CPU reads a
    subnormal as zero in a float compare or select, and LLVM may rewrite a test of x's bits
    beside a float compare into one, so `x == 0` (or `isnan(x)` next to a bit test) tied every
    subnormal with 0 there, where the interpreter and XLA:GPU order them. 16-bit floats give an
    int32 key (XLA's TopK on 16-bit types is not everywhere)."""
    width = x.dtype.itemsize
    signed = _SIGNED[width]
    bits = lax.bitcast_convert_type(x, signed)
    mag_mask = (1 << (8 * width - 1)) - 1
    mag = bits & signed(mag_mask)
    inf = np.array(np.inf, x.dtype).view(np.dtype(f"i{width}")).item()  # the largest non-NaN magnitude
    key = jnp.where(mag > signed(inf), signed(mag_mask), jnp.where(bits < 0, -mag, mag))
    return key.astype(jnp.int32) if width < 4 else key
