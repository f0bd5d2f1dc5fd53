"""sum/mean/prod/max/min_axis, argmax/argmin_axis (SPEC §6.4 Reductions)."""
from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from .builtin import Builtin
from .. import dtypes as D
from . import jax_numerics as N
from ._common import is_float, static_bool, static_int
from .accumulate import to_dtype
from .shapes import normalize_axes
from .registry import Ctx


def reduced_axes(op, attrs, x) -> tuple[int, ...]:
    axes = attrs["axes"]
    if not isinstance(axes, (tuple, list)):
        axes = tuple(int(a) for a in jnp.asarray(axes).tolist())
    return normalize_axes(op, axes, x.ndim)


def _keepdims(attrs) -> bool:
    k = static_bool(attrs.get("keepdims", False))
    if k is None:
        raise TypeError("attribute keepdims must be a static value")
    return k


def _finish(y, shape, axes, keepdims):
    if keepdims:
        return y.reshape(tuple(1 if i in axes else d for i, d in enumerate(shape)))
    return y


def _grouped(x, axes):
    """Move the reduced axes (sorted) to the end and flatten them: (..., K) in row-major order."""
    keep = [i for i in range(x.ndim) if i not in axes]
    k = math.prod(x.shape[i] for i in axes)
    y = jnp.transpose(x, keep + list(axes))
    return y.reshape(tuple(x.shape[i] for i in keep) + (k,))


IN_ORDER_CHAIN = 32  # a float reduction of up to this many elements: a chain of adds; longer: a scan
IN_ORDER_UNROLL = 16  # the scan's elements per iteration (still one after another)


def in_order(x, axes, kind: str):
    """A float sum (or product) over `axes` accumulated one element after another in row-major
    input order, each partial result rounded: SPEC §6.4's "accumulate natively in row-major input
    order", OpenInfer's loop. XLA's own reduce adds in another order (vectorized, tree-shaped):
    on a CPU another result from 64 elements on ([2^24, 1, 1, ...]: 2^24 + 32 where the loop
    keeps 2^24). The accumulator starts at 0 (1 for a product), an opaque constant XLA cannot
    fold into the first element."""
    g = _grouped(x, axes)
    op = jnp.multiply if kind == "prod" else jnp.add
    acc = jnp.broadcast_to(N.opaque(jnp.asarray(1 if kind == "prod" else 0, g.dtype)), g.shape[:-1])
    k = g.shape[-1]
    if k <= IN_ORDER_CHAIN:
        for i in range(k):
            acc = op(acc, g[..., i])
        return acc
    columns = jnp.moveaxis(g, -1, 0)
    acc, _ = lax.scan(lambda a, c: (op(a, c), None), acc, columns, unroll=IN_ORDER_UNROLL)
    return acc


def _sum_like(kind):
    def impl(inputs, attrs, ctx):
        x = inputs[0]
        d = ctx.dtype
        axes = reduced_axes(ctx.op, attrs, x)
        keepdims = _keepdims(attrs)
        count = math.prod(x.shape[i] for i in axes)
        if is_float(d):
            xc = N.to_compute(x, d)
            # a CPU adds in order; an accelerator uses its own reduce (docs/semantics.md: within the
            # table's bound), chosen per platform at lowering (an export for cpu and cuda keeps both)
            y = lax.platform_dependent(
                xc, cpu=lambda v: in_order(v, axes, "prod" if kind == "prod" else "sum"),
                default=lambda v: jnp.prod(v, axis=axes) if kind == "prod" else jnp.sum(v, axis=axes))
            if kind == "mean":
                y = N.ieee_div(y, jnp.asarray(count, xc.dtype))
            return _finish(N.store(y, ctx.out_dtype), x.shape, axes, keepdims)
        out = ctx.out_dtype
        signed = D.get(d).is_signed
        wide = N.wide_int(signed)
        xw = x.astype(wide)
        if kind == "prod":
            y = jnp.prod(xw, axis=axes, dtype=wide)
        else:
            y = jnp.sum(xw, axis=axes, dtype=wide)
            if kind == "mean":
                if not count and y.size:  # OpenInfer's kernel divides by the count: an error, not a value
                    ctx.fail_if(jnp.bool_(True), f"mean_axis: an integer mean over an empty axis (input "
                                f"{list(x.shape)}) divides its sum by a count of 0 (SPEC §6.4)")
                y = lax.div(y, jnp.asarray(max(count, 1), wide))
        return _finish(N.wrap(y, out), x.shape, axes, keepdims)
    return impl


def _first_extreme_index(g, is_max: bool, select_first: bool, floating: bool):
    """Index along the last axis of the element the reference's scan keeps: start with the
    first element, replace when strictly greater/smaller (>= / <= for select_first=False);
    NaN never replaces, so a NaN wins only when it is first."""
    if floating:
        valid = ~jnp.isnan(g)
        fill = -jnp.inf if is_max else jnp.inf
        m = (jnp.max if is_max else jnp.min)(jnp.where(valid, g, fill), axis=-1, keepdims=True)
        hit = valid & (g == m)
    else:
        m = (jnp.max if is_max else jnp.min)(g, axis=-1, keepdims=True)
        hit = g == m
    k = g.shape[-1]
    # lax.argmax with an explicit int32 index (positions along one axis): jnp.argmax's index dtype
    # follows the x64 flag when lowered, which breaks the pure step under a user's jit without x64
    hit32 = hit.astype(jnp.int32)
    first = lax.argmax(hit32, hit.ndim - 1, jnp.int32)
    last = jnp.int32(k - 1) - lax.argmax(hit32[..., ::-1], hit.ndim - 1, jnp.int32)
    idx = first if select_first else last
    if floating:
        idx = jnp.where(jnp.isnan(g[..., 0]) | ~jnp.any(hit, axis=-1), 0, idx)
    return idx


def _extreme(is_max):
    def impl(inputs, attrs, ctx):
        x = inputs[0]
        d = ctx.dtype
        axes = reduced_axes(ctx.op, attrs, x)
        keepdims = _keepdims(attrs)
        g = _grouped(x, axes)
        key = N.to_compute(g, d) if is_float(d) else g
        idx = _first_extreme_index(key, is_max, True, is_float(d))
        y = jnp.take_along_axis(g, idx[..., None], axis=-1)[..., 0]
        return _finish(y, x.shape, axes, keepdims)
    return impl


def _arg(is_max):
    def impl(inputs, attrs, ctx):
        x = inputs[0]
        d = ctx.dtype
        axis = static_int(attrs["axis"], "axis")
        (ax,) = normalize_axes(ctx.op, [axis], x.ndim)
        keepdims = _keepdims(attrs)
        g = jnp.moveaxis(x, ax, -1)
        key = N.to_compute(g, d) if is_float(d) else g
        sf = attrs.get("select_first", True)
        s = static_bool(sf)
        if s is None:  # variable-valued: compute both
            idx = jnp.where(jnp.asarray(sf) != 0, _first_extreme_index(key, is_max, True, is_float(d)),
                            _first_extreme_index(key, is_max, False, is_float(d)))
        else:
            idx = _first_extreme_index(key, is_max, s, is_float(d))
        idx = idx.astype(N.wide_int(True))
        if keepdims:
            idx = jnp.expand_dims(idx, ax)
        return idx.astype(D.get(ctx.out_dtype).np_dtype)
    return impl


def _mean_acc(xs, attrs, a: str, o: str):
    """mean_axis with acc=[A, O] (D2): the sum in A, converted to O, divided by the count in O."""
    count = math.prod(xs[0].shape[i] for i in reduced_axes("mean_axis", attrs, xs[0]))
    total = to_dtype(_sum_like("sum")(xs, attrs, Ctx("sum_axis", (a,), a, "normal")), a, o)
    return N.ieee_div(total, jnp.asarray(count, total.dtype))


# acc=[A, O] rules (SPEC-2026-03 §2.2)
_SUM_RULES = (("i32", "i32"), ("i64", "i64"), ("u32", "u32"), ("u64", "u64"), ("f32", "f32"), ("f64", "f64"))
_MEAN_RULES = (("f32", "f32"), ("f64", "f64"), ("i32", "f32"), ("i64", "f64"), ("u32", "f32"), ("u64", "f64"))
_AXES = dict(shape="reduce", required=("axes",))
_AXIS = dict(shape="reduce", required=("axis",), value_rules={"axis": "int"})

OPS = {
    "sum_axis": Builtin(_sum_like("sum"), acc_rules=_SUM_RULES, **_AXES),
    "mean_axis": Builtin(_sum_like("mean"), acc_rules=_MEAN_RULES, acc_kernel=_mean_acc, **_AXES),
    "prod_axis": Builtin(_sum_like("prod"), acc_rules=_SUM_RULES, **_AXES),
    "max_axis": Builtin(_extreme(True), **_AXES),
    "min_axis": Builtin(_extreme(False), **_AXES),
    "argmax_axis": Builtin(_arg(True), **_AXIS),
    "argmin_axis": Builtin(_arg(False), **_AXIS),
}
