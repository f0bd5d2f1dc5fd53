"""nn layout ops: transpose, reshape, concat."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from ..define import Attr, op
from ..errors import OpTypeError
from ._common import norm_axis, sample_values


def _perm_shape(shapes, attrs):
    x = shapes[0]
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(len(x))):
        raise OpTypeError(f"op transpose: perm {list(perm)} is not a permutation of 0..{len(x) - 1} "
                          f"(x has rank {len(x)})", attr="perm")
    return tuple(x[p] for p in perm)


def _layout_samples(kind: str):
    def samples(rng, d):
        if kind == "transpose":
            return [((sample_values(rng, d, (2, 3, 4)),), {"perm": (2, 0, 1)}),
                    ((sample_values(rng, d, (3, 5)),), {"perm": (1, 0)}), ((sample_values(rng, d, (4,)),), {"perm": (0,)})]
        if kind == "reshape":
            return [((sample_values(rng, d, (2, 3, 4)),), {"shape": (4, -1)}), ((sample_values(rng, d, (6,)),), {"shape": (2, 3)}),
                    ((sample_values(rng, d, (1, 4)),), {"shape": (4, 1, 1)}), ((sample_values(rng, d, (1, 1)),), {"shape": ()})]
        return [((sample_values(rng, d, (2, 3)), sample_values(rng, d, (4, 3))), {}),
                ((sample_values(rng, d, (2, 3)), sample_values(rng, d, (2, 1))), {"axis": -1}),
                ((sample_values(rng, d, (2,)), sample_values(rng, d, (3,))), {"axis": 0})]
    return samples


@op(inputs={"x": "any"}, attrs={"perm": Attr("int_list", required=True)}, shape=_perm_shape, category="nn", op_set="nn",
    reference=lambda x, perm: np.transpose(np.asarray(x), perm), samples=_layout_samples("transpose"))
def transpose(x, *, perm):
    """Permute the axes of x: output axis i is input axis perm[i] (a permutation of 0..rank-1)."""
    return jnp.transpose(x, tuple(int(p) for p in perm))


def _reshape_target(x, shape) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    total = math.prod(x)

    def fail(why=""):
        raise OpTypeError(f"op reshape: cannot reshape {list(x)} ({total} elements) to {list(shape)}{why}",
                          attr="shape")
    if shape.count(-1) > 1:
        fail(" (at most one -1)")
    if any(s < -1 for s in shape):
        fail(" (a negative size other than -1)")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or total % known:
            fail()
        return tuple(total // known if s == -1 else s for s in shape)
    if math.prod(shape) != total:
        fail()
    return shape


@op(inputs={"x": "any"}, attrs={"shape": Attr("int_list", required=True)},
    shape=lambda shapes, attrs: _reshape_target(shapes[0], attrs["shape"]), category="nn", op_set="nn",
    reference=lambda x, shape: np.reshape(np.asarray(x), _reshape_target(np.shape(x), shape)),
    samples=_layout_samples("reshape"))
def reshape(x, *, shape):
    """Row-major reshape of x to `shape`; one entry may be -1 (inferred), the total size must match."""
    return jnp.reshape(x, _reshape_target(x.shape, shape))


def _concat_shape(shapes, attrs):
    a, b = (tuple(s) for s in shapes)
    if len(a) != len(b):
        raise OpTypeError(f"op concat: a has rank {len(a)} but b has rank {len(b)}", input=1)
    ax = norm_axis("concat", attrs.get("axis", 0), len(a))
    if a[:ax] + a[ax + 1:] != b[:ax] + b[ax + 1:]:
        raise OpTypeError(f"op concat: shapes {list(a)} and {list(b)} differ outside axis {ax}", input=1)
    return a[:ax] + (a[ax] + b[ax],) + a[ax + 1:]


@op(inputs={"a": "any", "b": "same"}, attrs={"axis": Attr("int", 0, static=True)}, shape=_concat_shape, category="nn", op_set="nn",
    reference=lambda a, b, axis=0: np.concatenate([np.asarray(a), np.asarray(b)], axis=axis),
    samples=_layout_samples("concat"))
def concat(a, b, *, axis=0):
    """a and b (the same dtype) joined along `axis`; their shapes agree on every other axis."""
    return jnp.concatenate([a, b], axis=norm_axis("concat", axis, a.ndim))
