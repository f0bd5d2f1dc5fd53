"""nn ops `top_k` and `take_along`: choosing the k largest entries of a row and reading entries
of a row by index (a mixture-of-experts router: the experts of a token and their logits).

`top_k` orders as `argmax` does: a NaN counts as larger than every number, -0.0 and +0.0 tie, and
ties go to the lower index; `take_along` reads as `embedding` does: an index outside the row is a
runtime error of the node, never clamped."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import dtypes as D
from .. import jax_numerics as N
from ..define import Attr, op
from ..errors import OpTypeError
from ..registry import DYNAMIC
from ._common import dtype_name, float_order_key, rep_values, sample_values, static_int


# ====================================================================== top_k


def _top_k_shape(shapes, attrs):
    x = tuple(shapes[0])
    if len(x) < 1:
        raise OpTypeError("op top_k: x must have rank >= 1 (the entries are chosen along its last axis), "
                          "got a scalar", input=0)
    if attrs["k"] is DYNAMIC:  # a size name not resolved yet (checked without the sizes): bind resolves it
        return None
    k = static_int(attrs["k"], "top_k", "k")
    if not 1 <= k <= x[-1]:
        raise OpTypeError(f"op top_k: k must be 1..{x[-1]} (the last axis' length), got {k}", attr="k")
    return x[:-1] + (k,)


def _top_k_ref(x, k):
    """Stable order by (NaN first, then the value descending, then the index): float64 values,
    integers as ~x (decreasing in x, exact for every integer dtype)."""
    x = np.asarray(x)
    idx = np.broadcast_to(np.arange(x.shape[-1]), x.shape)
    if D.get(dtype_name(x.dtype)).is_float:
        v = x.astype(np.float64)
        nan = np.isnan(v)
        order = np.lexsort((idx, np.where(nan, 0.0, -v), ~nan), axis=-1)
    else:
        order = np.lexsort((idx, ~x), axis=-1)
    return order[..., :int(k)].astype(np.int32)


def _top_k_samples(rng, d):
    a = sample_values(rng, d, (3, 6))
    a[0, :] = a[0, 1]  # all tied: the lower indices win
    if D.get(d).is_float:
        a[1, 4], a[1, 2] = rep_values(np.nan, d), rep_values(-np.nan, d)  # NaNs (either sign) first
        a[2, 0], a[2, 3] = rep_values(-0.0, d), rep_values(0.0, d)  # -0.0 and +0.0 tie
        a[2, 1] = a[2, 2] = a[2, 4] = a[2, 5] = rep_values(-1.0, d)
    return [((a,), {"k": 3}), ((a,), {"k": 6}), ((sample_values(rng, d, (5,)),), {"k": 1}),
            ((sample_values(rng, d, (2, 2, 4)),), {"k": 2})]


@op(inputs={"x": "numeric"}, attrs={"k": Attr("int", required=True, static=True)}, out_dtype="i32",
    shape=_top_k_shape, category="nn", op_set="nn", reference=_top_k_ref, samples=_top_k_samples)
def top_k(x, *, k):
    """The indices (i32) of the k largest entries of x along its last axis, largest first.

    x [..., N] gives [..., k]; `k` (1..N) is a literal or a size name: it fixes the output's shape.

    Ties give the lower index first; a NaN (of either sign) counts as larger than every number;
    -0.0 and +0.0 tie: `argmax`'s order, of which `top_k(x, k=1)` is the first entry. The values
    are `take_along(x, top_k(x, k=K))`."""
    k = static_int(k, "top_k", "k")
    if jnp.issubdtype(x.dtype, jnp.floating):
        x = float_order_key(x)
    return lax.top_k(x, k)[1].astype(jnp.int32)


# ====================================================================== take_along


def _take_along_message(n: int) -> str:
    return f"take_along: id {{value}} is outside 0..{n - 1}"


def _take_along_shape(shapes, attrs):
    x, ids = tuple(shapes[0]), tuple(shapes[1])
    if len(x) < 1 or x[-1] == 0:
        raise OpTypeError(f"op take_along: x must have rank >= 1 and a non-empty last axis, got shape {list(x)}",
                          input=0)
    if len(ids) != len(x) or ids[:-1] != x[:-1]:
        want = ", ".join([str(n) for n in x[:-1]] + ["K"])
        raise OpTypeError(f"op take_along: ids must have x's shape but for the last axis ([{want}]), "
                          f"got {list(ids)}", input=1)
    return ids


def _take_along_ref(x, ids, ctx=None):
    x, ids = np.asarray(x), np.asarray(ids)
    n = x.shape[-1]
    bad = (ids < 0) | (ids >= n)
    if bad.any() and ctx is not None:
        ctx.fail_if(np.bool_(True), _take_along_message(n), int(ids.reshape(-1)[np.argmax(bad.reshape(-1))]))
    return np.take_along_axis(x, np.clip(ids, 0, n - 1).astype(np.int64), axis=-1)


def _take_along_samples(rng, d):
    x = sample_values(rng, d, (3, 5))
    return [((x, np.array([[4, 0], [2, 2], [1, 3]], np.int32)), {}),
            ((x, rng.integers(0, 5, size=(3, 7)).astype(np.uint8)), {}),
            ((sample_values(rng, d, (6,)), np.array([5, 0, 3], np.int64)), {}),
            ((x, np.array([[0, 1], [5, 0], [-1, 2]], np.int32)), {})]  # a runtime error: id 5


@op(inputs={"x": "any", "ids": "index"}, shape=_take_along_shape, category="nn", op_set="nn",
    reference=_take_along_ref, samples=_take_along_samples)
def take_along(x, ids, *, ctx):
    """Entries of x picked along its last axis by integer ids (NumPy's take_along_axis).

    x [..., N] and ids [..., K] (the same leading axes) give [..., K] of x's dtype,
    out[..., j] = x[..., ids[..., j]] (torch's `gather` on the last dim). An id outside 0..N-1 is
    a runtime error of the node naming the first such id, never clamped silently."""
    n = x.shape[-1]
    ids = jnp.asarray(ids)
    bad = (ids < 0) | (ids >= n)
    if ids.size:
        anybad, first = N.first_true(bad)
        ctx.fail_if(anybad, _take_along_message(n), ids.reshape(-1)[first])
    return jnp.take_along_axis(x, jnp.clip(ids, 0, n - 1).astype(jnp.int32), axis=-1, mode="clip")
