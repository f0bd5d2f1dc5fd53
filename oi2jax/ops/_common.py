"""Small shared pieces for the category modules."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import dtypes as D
from . import jax_numerics as N


def is_float(d: str) -> bool:
    return D.get(d).is_float


def float_unary(fn):
    """Elementwise float op: compute in f32 (f64 natively), round once to the output dtype."""
    def impl(inputs, attrs, ctx):
        return N.store(fn(N.to_compute(inputs[0], ctx.dtype)), ctx.out_dtype)
    return impl


def float_nary(fn, inputs, ctx):
    return N.store(fn(*[N.to_compute(x, ctx.dtype) for x in inputs]), ctx.out_dtype)


def acc_inputs(inputs, ctx):
    """Accumulate mode: widen integer inputs into the acc dtype's container."""
    target = D.get(ctx.out_dtype).np_dtype
    return [jnp.asarray(x).astype(target) for x in inputs]


def static_bool(v) -> bool | None:
    """Python truth value of a static attr, or None if traced."""
    if isinstance(v, (bool, int, float)):
        return bool(v)
    try:
        return bool(np.asarray(v))
    except Exception:  # a tracer
        return None


def static_int(v, what: str) -> int:
    if isinstance(v, (bool, int)):
        return int(v)
    try:
        return int(np.asarray(v))
    except Exception as e:  # a tracer
        raise TypeError(f"attribute {what} must be a static value") from e
