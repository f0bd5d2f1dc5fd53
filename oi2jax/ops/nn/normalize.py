"""nn ops that normalize over an axis: softmax (with a valid length), rms_norm, layer_norm."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import jax_numerics as N
from ..define import Attr, op
from ..errors import OpTypeError
from ..registry import DYNAMIC
from ._common import as_f64, norm_axis, float_attr, rep_values, float_samples

# ====================================================================== softmax


def _valid_message(n: int) -> str:
    return f"softmax: valid length {{value}} is not in 1..{n}"


def _valid_rows(valid, rows: tuple[int, ...]) -> None:
    """A per-row `valid` broadcasts to x's shape without the axis (right-aligned, as NumPy). The
    rows may hold a symbolic dimension (`export --symbolic`): JAX's broadcast rule compares them,
    where NumPy's cannot."""
    shape = tuple(np.shape(valid))
    try:
        ok = tuple(jnp.broadcast_shapes(shape, tuple(rows))) == tuple(rows)
    except ValueError:
        ok = False
    if not ok:
        raise OpTypeError(f"op softmax: valid has shape {list(shape)}, which does not broadcast to the rows "
                          f"{list(rows)} (x's shape without the axis)", attr="valid")


def _valid_length(valid, n: int, rows: tuple[int, ...], ctx):
    """`valid` (a literal, a constant, or an integer variable: one value, or one per row) clipped to
    0..n, with the runtime check 1 <= valid <= n recorded (the first value outside, in row order)."""
    if isinstance(valid, (float, np.floating)) or (hasattr(valid, "dtype") and not (
            jnp.issubdtype(valid.dtype, jnp.integer) or valid.dtype == jnp.bool_)):
        raise OpTypeError(f"op softmax: valid must be an integer, got {getattr(valid, 'dtype', type(valid).__name__)}",
                          attr="valid")
    if isinstance(valid, (bool, int, np.integer)):
        v = int(valid)
        if not 1 <= v <= n:
            ctx.fail_if(jnp.asarray(True), _valid_message(n), v)
        return min(max(v, 0), n)
    _valid_rows(valid, rows)
    v = jnp.asarray(valid)
    if v.dtype == jnp.bool_:
        v = v.astype(jnp.int32)
    bad = ((v < 1) | (v > n)).reshape(-1)
    anybad, first = N.first_true(bad)
    ctx.fail_if(anybad, _valid_message(n), v.reshape(-1)[first])
    return jnp.clip(v, 0, n).astype(jnp.int32)


def _window_message() -> str:
    return "softmax: window {value} is not positive"


def _window_start(window, k, ctx):
    """The first read position k - window (clipped at 0) of a `window` (literal or 0-d integer
    variable), with the runtime check window >= 1 recorded."""
    if isinstance(window, (float, np.floating)) or (hasattr(window, "dtype") and not jnp.issubdtype(window.dtype,
                                                                                                     jnp.integer)):
        raise OpTypeError(f"op softmax: window must be an integer, got {getattr(window, 'dtype', type(window).__name__)}",
                          attr="window")
    w = jnp.asarray(window).reshape(()) if hasattr(window, "dtype") else int(window)
    ctx.fail_if(jnp.asarray(w < 1), _window_message(), w)  # checked as given: never cut to 32 bits first
    return jnp.maximum(jnp.asarray(k, jnp.int32) - N.saturate_i32(w), 0)


def _softmax_shape(shapes, attrs):
    x = shapes[0]
    ax = norm_axis("softmax", attrs.get("axis", -1), len(x))
    valid = attrs.get("valid")
    if valid is not None and valid is not DYNAMIC and not 1 <= int(valid) <= x[ax]:
        raise OpTypeError(f"op softmax: valid length {int(valid)} is not in 1..{x[ax]}", attr="valid")
    window = attrs.get("window")
    if window is not None and window is not DYNAMIC and int(window) < 1:
        raise OpTypeError(f"op softmax: window {int(window)} is not positive", attr="window")
    return x


def _softmax_ref(x, axis=-1, valid=None, window=None, ctx=None):
    x = as_f64(x)
    ax = axis % x.ndim
    n = x.shape[ax]
    rows = x.shape[:ax] + x.shape[ax + 1:]
    k = np.full(rows, n)
    if valid is not None:
        if np.asarray(valid).dtype.kind not in "iub":
            raise OpTypeError(f"op softmax: valid must be an integer, got {np.asarray(valid).dtype}", attr="valid")
        _valid_rows(valid, rows)
        v = np.broadcast_to(np.asarray(valid).astype(np.int64), rows)
        bad = (v < 1) | (v > n)
        if bad.any() and ctx is not None:
            ctx.fail_if(np.bool_(True), _valid_message(n), int(np.asarray(valid).reshape(-1)[
                np.argmax(((np.asarray(valid) < 1) | (np.asarray(valid) > n)).reshape(-1))]))
        k = np.clip(v, 0, n)
    start = np.zeros(rows, np.int64)
    if window is not None:
        if np.asarray(window).dtype.kind not in "iu":
            raise OpTypeError(f"op softmax: window must be an integer, got {np.asarray(window).dtype}", attr="window")
        w = int(np.asarray(window))
        if w < 1 and ctx is not None:
            ctx.fail_if(np.bool_(True), _window_message(), w)
        start = np.minimum(np.maximum(k - w, 0), k)
    out = np.zeros_like(x)
    xm, om = np.moveaxis(x, ax, -1), np.moveaxis(out, ax, -1)  # om: a view of out
    for r in np.ndindex(*rows):
        a, b = int(start[r]), int(k[r])
        if b > a:
            with np.errstate(all="ignore"):
                e = np.exp(xm[r][a:b] - np.max(xm[r][a:b]))
                om[r][a:b] = e / np.sum(e)
            if np.isnan(om[r][a:b]).any():  # a NaN, +inf or an all -inf read: the whole row, as the kernel and torch
                om[r][:] = np.nan
    return out


def _softmax_samples(rng, d):
    big = float_samples(rng, d, (2, 6), 3.0, (1000.0, -1000.0, 3e4, -3e4, 0.0, 60.0, 65.0, 60.0, -np.inf, 1.0, 2.0, 3.0))
    masked = float_samples(rng, d, (3, 5), 2.0)
    masked[0, 4] = rep_values(np.nan, d)  # past the valid length: never read
    masked[1, 3] = rep_values(np.inf, d)
    return [((float_samples(rng, d, (2, 6), 3.0),), {}),
            ((big,), {"axis": -1}),
            ((masked,), {"valid": 3, "window": np.array(2, np.int32)}),  # positions 1, 2 of the first 3
            ((float_samples(rng, d, (4, 3), 2.0),), {"axis": 0, "valid": np.array(2, np.int32)}),
            ((float_samples(rng, d, (2, 4), 2.0),), {"valid": np.array(0, np.int64)})]  # a runtime error


def _softmax_rows(shapes, attrs):
    """`valid`'s rows (AttrSpec.rows): x's shape without the axis."""
    x = shapes[0]
    ax = norm_axis("softmax", attrs.get("axis", -1), len(x))
    return tuple(x[:ax]) + tuple(x[ax + 1:]), "x's shape without the axis"


@op(inputs={"x": "float"}, attrs={"axis": Attr("int", -1, static=True), "valid": Attr("int", rows=_softmax_rows),
                                  "window": Attr("int")},
    shape=_softmax_shape, category="nn", op_set="nn", reference=_softmax_ref, samples=_softmax_samples)
def softmax(x, *, axis=-1, valid=None, window=None, ctx):
    """Softmax over `axis`; with `valid=n` only the first n positions take part, the others are exactly 0.

    Max-subtracted: exp(x - max) / sum(exp(x - max)), exp and sum in f32 for f16/bf16 (f64 for f64),
    rounded once. The positions past `valid` are masked with the compute type's most negative finite
    value (never -inf, so a row is never all -inf by masking) and their results set to 0; they are
    never read (a NaN there has no effect). `valid` is a literal or an integer variable (e.g. a
    cache's fill count), one value or one per row (a shape broadcasting to x's shape without the
    axis: a prompt step's causal mask, row i reading positions 0..valid[i]-1); outside 1..N (N the
    axis length) it is a runtime error of the node. A NaN
    or +inf among the read positions makes the whole row NaN (as torch); so does a row whose read
    positions are all -inf.

    `window=W` (a literal or an integer variable, e.g. a model's sliding_window): only the last W
    of the read positions take part, n-W..n-1 (n = valid, else N): a sliding-window attention
    where query position q = n-1 reads q-W+1..q, as transformers' `kv_idx > q_idx - W`. W >= n
    bounds nothing; W < 1 is a runtime error of the node."""
    xc = N.to_compute(x, ctx.dtype)
    ax = norm_axis("softmax", axis, xc.ndim)
    n = xc.shape[ax]
    rows = xc.shape[:ax] + xc.shape[ax + 1:]
    keep = None
    v = n if valid is None else _valid_length(valid, n, rows, ctx)
    if not isinstance(v, int):  # one value or one per row: along the axis
        v = jnp.expand_dims(jnp.broadcast_to(v, rows), ax)
    if not (isinstance(v, int) and v == n):
        keep = lax.broadcasted_iota(jnp.int32, xc.shape, ax) < v
    if window is not None:
        after = lax.broadcasted_iota(jnp.int32, xc.shape, ax) >= _window_start(window, v, ctx)
        keep = after if keep is None else keep & after
    if keep is not None:
        xc = jnp.where(keep, xc, jnp.asarray(jnp.finfo(xc.dtype).min, xc.dtype))
    e = jnp.exp(xc - jnp.max(xc, axis=ax, keepdims=True))
    if keep is not None:
        e = jnp.where(keep, e, jnp.zeros((), e.dtype))
    return N.store(e / jnp.sum(e, axis=ax, keepdims=True), ctx.out_dtype)


# ====================================================================== norms


def _norm_shape(op_name: str, params: tuple[str, ...]):
    def rule(shapes, attrs):
        x = shapes[0]
        if len(x) < 1:
            raise OpTypeError(f"op {op_name}: x must have rank >= 1 (it normalizes the last axis)", input=0)
        for i, name in enumerate(params, start=1):
            if tuple(shapes[i]) != tuple(x[-1:]):
                raise OpTypeError(f"op {op_name}: {name} has shape {list(shapes[i])}, expected [{x[-1]}] "
                                  f"(the last axis of x)", input=i)
        return x
    return rule


def _norm_samples(with_bias: bool):
    def samples(rng, d):
        def params(n):
            w = float_samples(rng, d, (n,), 0.2, offset=1.0)
            return (w, float_samples(rng, d, (n,), 0.5)) if with_bias else (w,)
        x2 = float_samples(rng, d, (3, 4), 300.0)
        x2[0] = rep_values(0.0, d)  # an all-zero row: 0 (eps keeps it finite)
        cases = [((float_samples(rng, d, (2, 8), 2.0), *params(8)), {}),
                 ((x2, *params(4)), {"eps": 1e-5}),
                 ((float_samples(rng, d, (4,), 1.0, offset=3.0), *params(4)), {"eps": np.array(1e-2, np.float32)})]
        if not with_bias:  # Gemma's (1 + w) weight: w near 0
            small = float_samples(rng, d, (8,), 0.2)
            cases += [((float_samples(rng, d, (2, 8), 2.0), small), {"offset": 1.0}),
                      ((float_samples(rng, d, (3, 8), 2.0), small), {"eps": 1e-6, "offset": np.array(1.0, np.float32)})]
        return cases
    return samples


def _rms_norm_ref(x, weight, eps=1e-6, offset=0.0):
    x = as_f64(x)
    eps = float(np.asarray(eps))
    scale = as_f64(weight) + float(np.asarray(offset))
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


@op(inputs={"x": "float", "weight": "same"}, attrs={"eps": 1e-6, "offset": 0.0}, shape=_norm_shape("rms_norm", ("weight",)),
    category="nn", op_set="nn", reference=_rms_norm_ref, samples=_norm_samples(False))
def rms_norm(x, weight, *, eps=1e-6, offset=0.0, ctx):
    """RMS normalization over the last axis: x * rsqrt(mean(x^2) + eps) * (offset + weight).

    `weight` has shape [x.shape[-1]]. `offset=1.0` is Gemma's RMSNorm, which stores w and scales by
    (1 + w), the sum formed in the compute type as Gemma does (`1.0 + weight.float()`), never in the
    weight's own dtype. f16/bf16 are computed in f32 (mean of squares, rsqrt, the offset, both
    products) and rounded once; Hugging Face's LlamaRMSNorm rounds to the input dtype before
    multiplying by the weight (a second rounding; the results can differ by an ulp), Gemma's does
    not. `eps` and `offset` are literals or float variables (held in the compute type: f32 for
    16-bit and f32 inputs)."""
    xc = N.to_compute(x, ctx.dtype)
    ms = jnp.mean(xc * xc, axis=-1, keepdims=True)
    w = N.to_compute(weight, ctx.dtype)
    if not (isinstance(offset, (int, float)) and offset == 0):
        w = float_attr(offset, ctx.dtype) + w
    y = xc * lax.rsqrt(ms + float_attr(eps, ctx.dtype)) * w
    return N.store(y, ctx.out_dtype)


def _layer_norm_ref(x, weight, bias, eps=1e-5):
    x = as_f64(x)
    eps = float(np.asarray(eps))
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * as_f64(weight) + as_f64(bias)


@op(inputs={"x": "float", "weight": "same", "bias": "same"}, attrs={"eps": 1e-5},
    shape=_norm_shape("layer_norm", ("weight", "bias")), category="nn", op_set="nn", reference=_layer_norm_ref,
    samples=_norm_samples(True))
def layer_norm(x, weight, bias, *, eps=1e-5, ctx):
    """Layer normalization over the last axis: (x - mean) * rsqrt(var + eps) * weight + bias.

    `var` is the population variance (divided by N), as torch's LayerNorm; `weight` and `bias` have
    shape [x.shape[-1]]. f16/bf16 are computed in f32 and rounded once. `eps` is a literal or a float
    variable."""
    xc = N.to_compute(x, ctx.dtype)
    mu = jnp.mean(xc, axis=-1, keepdims=True)
    xm = xc - mu
    var = jnp.mean(xm * xm, axis=-1, keepdims=True)
    y = xm * lax.rsqrt(var + float_attr(eps, ctx.dtype)) * N.to_compute(weight, ctx.dtype) \
        + N.to_compute(bias, ctx.dtype)
    return N.store(y, ctx.out_dtype)
