"""argmax: the index of the first maximum along an axis (nn set)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import dtypes as D
from ..define import Attr, op
from ._common import dtype_name, float_order_key, norm_axis, rep_values, sample_values


def _argmax_shape(shapes, attrs):
    x = tuple(shapes[0])
    ax = norm_axis("argmax", attrs.get("axis", -1), len(x))
    return x[:ax] + x[ax + 1:]


def _argmax_ref(x, axis=-1):
    x = np.asarray(x)
    if D.get(dtype_name(x.dtype)).is_float:
        x = x.astype(np.float64)
    return np.argmax(x, axis=axis)


def _argmax_samples(rng, d):
    a = sample_values(rng, d, (3, 5))
    a[0, :] = a[0, 0]  # ties: the first wins
    if D.get(d).is_float:
        a[1, 3] = rep_values(np.nan, d)  # NaN counts as the maximum
        a[2, 1], a[2, 2] = rep_values(-0.0, d), rep_values(0.0, d)
    return [((a,), {}), ((sample_values(rng, d, (4, 3)),), {"axis": 0}), ((sample_values(rng, d, (6,)),), {"axis": 0})]


@op(inputs={"x": "numeric"}, attrs={"axis": Attr("int", -1, static=True)}, out_dtype="i32", shape=_argmax_shape, category="nn", op_set="nn",
    reference=_argmax_ref, samples=_argmax_samples)
def argmax(x, *, axis=-1):
    """The index (i32) of the first maximum of x along `axis`, which is removed from the shape.

    Ties give the first index; a NaN counts as larger than every number (the first NaN wins, as
    jnp.argmax and np.argmax); -0.0 and +0.0 tie."""
    # lax.argmax with an explicit int32 index: jnp.argmax's index dtype follows the x64 flag when
    # lowered, which breaks the pure step under a user's jit without x64 (tests/test_user_jit.py)
    # floats by an integer key of their bits (top_k's order): XLA:CPU's float compare reads a
    # subnormal as 0, so argmax([0, 1e-40]) was 0 compiled and 1 interpreted
    key = float_order_key(x) if jnp.issubdtype(x.dtype, jnp.floating) else x
    return lax.argmax(key, norm_axis("argmax", axis, x.ndim), jnp.int32)
