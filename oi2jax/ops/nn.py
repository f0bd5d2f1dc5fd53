"""The bundled `nn` op set (`--ops nn`, `ops=["nn"]`): what a Llama/Mistral/GPT-style decoder
needs. Semantics, dtypes and numerics of each op: docs/ops.md ("The bundled nn set").

Floats: f16 and bf16 are computed in f32 and rounded once to the output dtype; f32 in f32 and f64
in f64 (`numerics.to_compute` / `numerics.store`). Norms, softmax and the matmul family accumulate
in f32 for 16-bit inputs. Each op carries a NumPy reference computing in float64 (the tests' oracle,
and what the interpreter runs) and `samples(rng, dtype)`: small cases for the generated tests, where
an attribute given as a 0-d NumPy array stands for a variable (a traced value in the kernel).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import dtypes as D
from . import numerics as N
from .define import Attr, op
from .errors import OpTypeError, broadcast_shapes
from .numerical import MATMUL_PRECISION, PRECISIONS

# ====================================================================== helpers


def _map(fn, x, ctx):
    """An elementwise float function in the compute type, rounded once to the output dtype."""
    return N.store(fn(N.to_compute(x, ctx.dtype)), ctx.out_dtype)


def _f64(x):
    return np.asarray(x).astype(np.float64)


def _ref1(fn):
    """A unary float64 NumPy reference (IEEE warnings silenced: NaN / inf are results here)."""
    def ref(x):
        with np.errstate(all="ignore"):
            return fn(_f64(x))
    return ref


def _precision():
    """The float matmul precision of the program being traced (`--precision`), as the built-in matmul."""
    return PRECISIONS[MATMUL_PRECISION.get()]


def _static_int(value, op_name: str, attr: str) -> int:
    """An attribute that fixes a shape (an axis): a literal or a constant, not a run-time variable."""
    if isinstance(value, (float, np.floating)) and not float(value).is_integer():
        raise OpTypeError(f"op {op_name}: {attr} must be an integer, got {value!r}", attr=attr)
    try:
        return int(value)
    except TypeError:  # a traced value (jax.errors.TracerIntegerConversionError is one)
        raise OpTypeError(f"op {op_name}: {attr} must be a literal integer (it fixes the output's shape), "
                          f"not a variable", attr=attr) from None


def _axis(op_name: str, axis, rank: int) -> int:
    axis = _static_int(axis, op_name, "axis")
    if not -rank <= axis < rank:
        raise OpTypeError(f"op {op_name}: axis {axis} is out of range for rank {rank}", attr="axis")
    return axis % rank


def _float_attr(value, d: str):
    """A float attribute (literal or variable) in `d`'s compute type."""
    return N.float_const(value, d).astype(N.compute_dtype(d))


def _rep(values, d: str):
    """float64 values -> the representation of float dtype `d` (rounded once)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values, np.float64).astype(D.get(d).np_dtype)


def _floats(rng, d: str, shape, scale: float = 1.0, edges=(), offset: float = 0.0):
    """Random normal values (times `scale`, plus `offset`) of float dtype `d`, the first ones `edges`."""
    n = math.prod(shape)
    v = rng.standard_normal(n) * scale + offset
    e = np.asarray(edges, np.float64)[:n]
    v[:len(e)] = e
    return _rep(v.reshape(shape), d)


def _values(rng, d: str, shape):
    """Random values of any dtype `d` (in its representation)."""
    dt = D.get(d)
    if d == "bool":
        return rng.random(shape) < 0.5
    if dt.is_float:
        return _floats(rng, d, shape, 4.0)
    lo, hi = max(int(dt.min), -100), min(int(dt.max), 100)
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(dt.np_dtype)


def _unary_samples(edges, scale: float = 3.0, positive: bool = False):
    def samples(rng, d):
        a = _floats(rng, d, (2, 8), scale, edges)
        b = _floats(rng, d, (3, 4), 1.0)
        if positive:
            b = _rep(np.abs(_f64(b)) + 0.25, d)
        return [((a,), {}), ((b,), {}), ((_rep(0.75, d),), {})]
    return samples


_SPECIAL = (np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0)

# ====================================================================== elementwise


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=_ref1(np.exp),
    samples=_unary_samples(_SPECIAL + (11.1, 88.5, 89.0, 710.0, -104.0, -750.0, 0.5)))
def exp(x, *, ctx):
    """e^x elementwise: overflow gives +inf, exp(-inf) = 0, NaN stays NaN."""
    return _map(jnp.exp, x, ctx)


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=_ref1(np.log),
    samples=_unary_samples(_SPECIAL + (1e-30, 65504.0, 2.0, 1e-3, 0.5), positive=True))
def log(x, *, ctx):
    """Natural logarithm elementwise: log(±0) = -inf, log(x < 0) = NaN, log(+inf) = +inf."""
    return _map(jnp.log, x, ctx)


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=_ref1(np.sqrt),
    samples=_unary_samples(_SPECIAL + (4.0, 1e-30, 2.0, 65504.0), positive=True))
def sqrt(x, *, ctx):
    """Square root elementwise: sqrt(-0) = -0, sqrt(x < 0) = NaN, sqrt(+inf) = +inf."""
    return _map(jnp.sqrt, x, ctx)


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=_ref1(lambda x: 1.0 / np.sqrt(x)),
    samples=_unary_samples(_SPECIAL + (4.0, 1e-30, 2.0, 65504.0), positive=True))
def rsqrt(x, *, ctx):
    """1 / sqrt(x) elementwise: rsqrt(+0) = +inf, rsqrt(-0) = -inf, rsqrt(x < 0) = NaN, rsqrt(+inf) = 0."""
    return _map(lambda v: jnp.reciprocal(jnp.sqrt(v)), x, ctx)


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=_ref1(np.tanh),
    samples=_unary_samples(_SPECIAL + (20.0, -20.0, 1e-3, 0.5)))
def tanh(x, *, ctx):
    """Hyperbolic tangent elementwise: tanh(±inf) = ±1."""
    return _map(jnp.tanh, x, ctx)


def _sigmoid_ref(x):
    return np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x))))


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=_ref1(_sigmoid_ref),
    samples=_unary_samples(_SPECIAL + (100.0, -100.0, 20.0, -20.0)))
def sigmoid(x, *, ctx):
    """The logistic function 1 / (1 + e^-x) elementwise: sigmoid(+inf) = 1, sigmoid(-inf) = 0."""
    return _map(jax.nn.sigmoid, x, ctx)


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=_ref1(lambda x: x * _sigmoid_ref(x)),
    samples=_unary_samples(_SPECIAL + (100.0, -100.0, 20.0, -20.0)))
def silu(x, *, ctx):
    """x * sigmoid(x) elementwise (SiLU / swish): silu(+inf) = +inf, silu(-inf) = NaN (-inf * 0)."""
    return _map(lambda v: v * jax.nn.sigmoid(v), x, ctx)


_SQRT_HALF = 1.0 / math.sqrt(2.0)
_TANH_C = math.sqrt(2.0 / math.pi)
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _gelu_ref(x, approximate=False):
    if bool(np.asarray(approximate)):
        return x * _sigmoid_ref(2.0 * _TANH_C * (x + 0.044715 * x ** 3))  # = 0.5 x (1 + tanh(u)), no cancellation
    return 0.5 * x * _erfc(-x * _SQRT_HALF)


def _gelu_samples(rng, d):
    edges = _SPECIAL + (10.0, -10.0, 3.0, -3.0, 0.5)
    a = _floats(rng, d, (2, 8), 3.0, edges)
    return [((a,), {}), ((a,), {"approximate": True}), ((_floats(rng, d, (5,), 2.0),), {"approximate": np.array(True)}),
            ((_floats(rng, d, (5,), 2.0),), {"approximate": np.array(False)})]


@op(inputs={"x": "float"}, attrs={"approximate": False}, elementwise=True, category="nn", op_set="nn",
    reference=lambda x, approximate=False: _ref1(lambda v: _gelu_ref(v, approximate))(x), samples=_gelu_samples)
def gelu(x, *, approximate=False, ctx):
    """The Gaussian error linear unit x * Phi(x) elementwise; `approximate=true`: its tanh form.

    Exact (default): 0.5 * x * erfc(-x / sqrt 2) (= 0.5 * x * (1 + erf(x / sqrt 2)), accurate in the
    negative tail). approximate=true: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) as
    torch's `gelu(approximate="tanh")` / Hugging Face `gelu_pytorch_tanh`, computed as x * sigmoid(2u)
    (the same function). gelu(+inf) = +inf, gelu(-inf) = NaN (-inf * 0). `approximate` may be a
    bool variable."""
    def exact(v):
        return 0.5 * v * lax.erfc(-v * _SQRT_HALF)

    def tanh_form(v):
        return v * jax.nn.sigmoid(2.0 * _TANH_C * (v + 0.044715 * (v * v * v)))

    if isinstance(approximate, (bool, int, np.bool_, np.integer)):
        return _map(tanh_form if approximate else exact, x, ctx)
    flag = jnp.asarray(approximate).astype(jnp.bool_)
    return _map(lambda v: jnp.where(flag, tanh_form(v), exact(v)), x, ctx)


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=_ref1(np.sin),
    samples=_unary_samples(_SPECIAL + (3.140625, 100.0, -1000.0, 1e-3), scale=4.0))
def sin(x, *, ctx):
    """Sine (radians) elementwise: sin(±inf) = NaN."""
    return _map(jnp.sin, x, ctx)


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=_ref1(np.cos),
    samples=_unary_samples(_SPECIAL + (1.5703125, 100.0, -1000.0, 1e-3), scale=4.0))
def cos(x, *, ctx):
    """Cosine (radians) elementwise: cos(±inf) = NaN."""
    return _map(jnp.cos, x, ctx)


# ====================================================================== softmax


def _valid_message(n: int) -> str:
    return f"softmax: valid length {{value}} is not in 1..{n}"


def _valid_length(valid, n: int, ctx):
    """`valid` (a literal, a constant or a 0-d integer variable) clipped to 0..n, with the runtime
    check 1 <= valid <= n recorded."""
    if isinstance(valid, (float, np.floating)) or (hasattr(valid, "dtype") and not (
            jnp.issubdtype(valid.dtype, jnp.integer) or valid.dtype == jnp.bool_)):
        raise OpTypeError(f"op softmax: valid must be an integer, got {getattr(valid, 'dtype', type(valid).__name__)}",
                          attr="valid")
    if isinstance(valid, (bool, int, np.integer)):
        v = int(valid)
        if not 1 <= v <= n:
            ctx.fail_if(jnp.asarray(True), _valid_message(n), v)
        return min(max(v, 0), n)
    v = jnp.asarray(valid).reshape(())
    if v.dtype == jnp.bool_:
        v = v.astype(jnp.int32)
    ctx.fail_if((v < 1) | (v > n), _valid_message(n), v)
    return jnp.clip(v, 0, n).astype(jnp.int32)


def _softmax_shape(shapes, attrs):
    x = shapes[0]
    ax = _axis("softmax", attrs.get("axis", -1), len(x))
    valid = attrs.get("valid")
    if valid is not None and not 1 <= int(valid) <= x[ax]:
        raise OpTypeError(f"op softmax: valid length {int(valid)} is not in 1..{x[ax]}", attr="valid")
    return x


def _softmax_ref(x, axis=-1, valid=None, ctx=None):
    x = _f64(x)
    ax = axis % x.ndim
    n = x.shape[ax]
    k = n
    if valid is not None:
        if np.asarray(valid).dtype.kind not in "iub":
            raise OpTypeError(f"op softmax: valid must be an integer, got {np.asarray(valid).dtype}", attr="valid")
        v = int(np.asarray(valid))
        if not 1 <= v <= n and ctx is not None:
            ctx.fail_if(np.bool_(True), _valid_message(n), v)
        k = min(max(v, 0), n)
    out = np.zeros_like(x)
    part = tuple(slice(0, k) if i == ax else slice(None) for i in range(x.ndim))
    if k > 0:
        with np.errstate(all="ignore"):
            e = np.exp(x[part] - np.max(x[part], axis=ax, keepdims=True))
            out[part] = e / np.sum(e, axis=ax, keepdims=True)
    return out


def _softmax_samples(rng, d):
    big = _floats(rng, d, (2, 6), 3.0, (1000.0, -1000.0, 3e4, -3e4, 0.0, 60.0, 65.0, 60.0, -np.inf, 1.0, 2.0, 3.0))
    masked = _floats(rng, d, (3, 5), 2.0)
    masked[0, 4] = _rep(np.nan, d)  # past the valid length: never read
    masked[1, 3] = _rep(np.inf, d)
    return [((_floats(rng, d, (2, 6), 3.0),), {}),
            ((big,), {"axis": -1}),
            ((masked,), {"valid": 3}),
            ((_floats(rng, d, (4, 3), 2.0),), {"axis": 0, "valid": np.array(2, np.int32)}),
            ((_floats(rng, d, (2, 4), 2.0),), {"valid": np.array(0, np.int64)})]  # a runtime error


@op(inputs={"x": "float"}, attrs={"axis": Attr("int", -1, static=True), "valid": Attr("int")}, shape=_softmax_shape, category="nn", op_set="nn",
    reference=_softmax_ref, samples=_softmax_samples)
def softmax(x, *, axis=-1, valid=None, ctx):
    """Softmax over `axis`; with `valid=n` only the first n positions take part, the others are exactly 0.

    Max-subtracted: exp(x - max) / sum(exp(x - max)), exp and sum in f32 for f16/bf16 (f64 for f64),
    rounded once. The positions past `valid` are masked with the compute type's most negative finite
    value (never -inf, so a row is never all -inf by masking) and their results set to 0; they are
    never read (a NaN there has no effect). `valid` is a literal or an integer variable (e.g. a
    cache's fill count); outside 1..N (N the axis length) it is a runtime error of the node. A NaN
    or +inf among the read positions makes the whole row NaN (as torch); so does a row whose read
    positions are all -inf."""
    xc = N.to_compute(x, ctx.dtype)
    ax = _axis("softmax", axis, xc.ndim)
    n = xc.shape[ax]
    keep = None
    if valid is not None:
        v = _valid_length(valid, n, ctx)
        if not (isinstance(v, int) and v == n):
            keep = lax.broadcasted_iota(jnp.int32, xc.shape, ax) < v
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
            w = _floats(rng, d, (n,), 0.2, offset=1.0)
            return (w, _floats(rng, d, (n,), 0.5)) if with_bias else (w,)
        x2 = _floats(rng, d, (3, 4), 300.0)
        x2[0] = _rep(0.0, d)  # an all-zero row: 0 (eps keeps it finite)
        return [((_floats(rng, d, (2, 8), 2.0), *params(8)), {}),
                ((x2, *params(4)), {"eps": 1e-5}),
                ((_floats(rng, d, (4,), 1.0, offset=3.0), *params(4)), {"eps": np.array(1e-2, np.float32)})]
    return samples


def _rms_norm_ref(x, weight, eps=1e-6):
    x = _f64(x)
    eps = float(np.asarray(eps))
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * _f64(weight)


@op(inputs={"x": "float", "weight": "same"}, attrs={"eps": 1e-6}, shape=_norm_shape("rms_norm", ("weight",)),
    category="nn", op_set="nn", reference=_rms_norm_ref, samples=_norm_samples(False))
def rms_norm(x, weight, *, eps=1e-6, ctx):
    """RMS normalization over the last axis: x * rsqrt(mean(x^2) + eps) * weight.

    `weight` has shape [x.shape[-1]]. f16/bf16 are computed in f32 (mean of squares, rsqrt, both
    products) and rounded once; Hugging Face's LlamaRMSNorm rounds to the input dtype before
    multiplying by the weight (a second rounding; the results can differ by an ulp). `eps` is a
    literal or a float variable (held in the compute type: f32 for 16-bit and f32 inputs)."""
    xc = N.to_compute(x, ctx.dtype)
    ms = jnp.mean(xc * xc, axis=-1, keepdims=True)
    y = xc * lax.rsqrt(ms + _float_attr(eps, ctx.dtype)) * N.to_compute(weight, ctx.dtype)
    return N.store(y, ctx.out_dtype)


def _layer_norm_ref(x, weight, bias, eps=1e-5):
    x = _f64(x)
    eps = float(np.asarray(eps))
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * _f64(weight) + _f64(bias)


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
    y = xm * lax.rsqrt(var + _float_attr(eps, ctx.dtype)) * N.to_compute(weight, ctx.dtype) \
        + N.to_compute(bias, ctx.dtype)
    return N.store(y, ctx.out_dtype)


# ====================================================================== rotary embedding


def _inv_freq_np(theta: float, hd: int, f64: bool):
    """Hugging Face's `1.0 / (theta ** (arange(0, hd, 2).float() / hd))`, each step rounded to f32
    (f64 for f64 inputs); the power correctly rounded."""
    f = np.float64 if f64 else np.float32
    e = np.arange(0, hd, 2).astype(f) / f(hd)
    p = (np.float64(f(theta)) ** e.astype(np.float64)).astype(f)
    return f(1.0) / p


def _rope_shape(shapes, attrs):
    x, pos = shapes
    if len(x) < 1 or x[-1] % 2 or x[-1] == 0:
        raise OpTypeError(f"op rope: x must end in an even head dimension, got shape {list(x)}", input=0)
    if tuple(pos) != ():
        raise OpTypeError(f"op rope: pos must be a scalar position (shape []), got shape {list(pos)}", input=1)
    return x


def _rope_ref(x, pos, theta=10000.0):
    f64 = np.asarray(x).dtype == np.float64
    f = np.float64 if f64 else np.float32
    x = _f64(x)
    hd = x.shape[-1]
    theta = float(np.asarray(theta, np.float64 if f64 else np.float32))
    freqs = (f(np.asarray(pos)) * _inv_freq_np(theta, hd, f64)).astype(np.float64)  # rounded to f32: HF's angles
    emb = np.concatenate([freqs, freqs])
    rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], axis=-1)
    return x * np.cos(emb) + rot * np.sin(emb)


def _rope_samples(rng, d):
    return [((_floats(rng, d, (2, 8), 1.0), np.array(0, np.int32)), {}),
            ((_floats(rng, d, (2, 8), 1.0), np.array(5, np.int32)), {}),
            ((_floats(rng, d, (3, 2, 8), 2.0), np.array(100, np.int64)), {"theta": 500000.0}),
            ((_floats(rng, d, (4, 6), 1.0), np.array(37, np.uint16)), {"theta": np.array(10000.0, np.float32)})]


@op(inputs={"x": "float", "pos": "index"}, attrs={"theta": 10000.0}, shape=_rope_shape, category="nn", op_set="nn",
    reference=_rope_ref, samples=_rope_samples)
def rope(x, pos, *, theta=10000.0, ctx):
    """Rotary position embedding of x [..., HD] at the integer position `pos` (shape []), in Hugging Face Llama's form.

    inv_freq[i] = 1 / theta^(2i/HD) for i in 0..HD/2-1, computed in f32 as HF does
    (`1.0 / (theta ** (arange(0, HD, 2).float() / HD))`; a literal theta: on the host, each step
    rounded to f32, the power correctly rounded; a variable theta: in the kernel, within an ulp);
    freqs = pos * inv_freq (f32), emb = concat(freqs, freqs),
    out = x * cos(emb) + rotate_half(x) * sin(emb), rotate_half(x) = concat(-x[..., HD/2:], x[..., :HD/2]).
    f64 inputs: everything in f64. f16/bf16: the products in f32, rounded once (HF rounds cos/sin to
    x's dtype first and rounds each product: results can differ by an ulp). pos 0 is the identity
    (for finite x)."""
    ct = N.compute_dtype(ctx.dtype)
    hd = x.shape[-1]
    if isinstance(theta, (bool, int, float, np.integer, np.floating)):
        inv = jnp.asarray(_inv_freq_np(float(theta), hd, ctx.dtype == "f64"))
    else:
        t = jnp.asarray(theta).astype(ct)
        inv = jnp.asarray(1.0, ct) / t ** (jnp.arange(0, hd, 2).astype(ct) / jnp.asarray(hd, ct))
    freqs = jnp.asarray(pos).astype(ct) * inv
    emb = jnp.concatenate([freqs, freqs])
    xc = N.to_compute(x, ctx.dtype)
    rot = jnp.concatenate([-xc[..., hd // 2:], xc[..., :hd // 2]], axis=-1)
    return N.store(xc * jnp.cos(emb) + rot * jnp.sin(emb), ctx.out_dtype)


# ====================================================================== embedding lookup


def _embedding_message(v: int) -> str:
    return f"embedding: id {{value}} is outside 0..{v - 1}"


def _embedding_shape(shapes, attrs):
    table, ids = shapes
    if len(table) < 1 or table[0] == 0:
        raise OpTypeError(f"op embedding: table must have rank >= 1 and at least one row, got shape {list(table)}",
                          input=0)
    return tuple(ids) + tuple(table[1:])


def _embedding_ref(table, ids, ctx=None):
    table, ids = np.asarray(table), np.asarray(ids)
    v = table.shape[0]
    bad = (ids < 0) | (ids >= v)
    if bad.any() and ctx is not None:
        ctx.fail_if(np.bool_(True), _embedding_message(v), int(ids.reshape(-1)[np.argmax(bad.reshape(-1))]))
    return table[np.clip(ids, 0, v - 1)]


def _embedding_samples(rng, d):
    table = _values(rng, d, (8, 3))
    return [((table, rng.integers(0, 8, size=(2, 3)).astype(np.int32)), {}),
            ((table, np.array([7, 0, 3, 7], np.int64)), {}),
            ((_values(rng, d, (5,)), np.array(4, np.uint8)), {}),
            ((table, np.array([1, 9, -2, 9], np.int32)), {})]  # a runtime error: id 9


@op(inputs={"table": "any", "ids": "index"}, shape=_embedding_shape, category="nn", op_set="nn",
    reference=_embedding_ref, samples=_embedding_samples)
def embedding(table, ids, *, ctx):
    """Rows of `table` [V, D...] picked by the integer `ids` (any shape S): the result has shape S + [D...].

    Any table dtype (the result has it); ids of any integer dtype, e.g. a variable holding token ids.
    An id outside 0..V-1 is a runtime error of the node naming the first such id ("embedding: id 9
    is outside 0..7"), never clamped silently."""
    v = table.shape[0]
    ids = jnp.asarray(ids)
    bad = (ids < 0) | (ids >= v)
    if ids.size:
        ctx.fail_if(bad, _embedding_message(v), ids.reshape(-1)[lax.argmax(bad.reshape(-1).astype(jnp.int32), 0, jnp.int32)])
    return jnp.take(table, jnp.clip(ids, 0, v - 1), axis=0, mode="clip")


# ====================================================================== layout


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
            return [((_values(rng, d, (2, 3, 4)),), {"perm": (2, 0, 1)}),
                    ((_values(rng, d, (3, 5)),), {"perm": (1, 0)}), ((_values(rng, d, (4,)),), {"perm": (0,)})]
        if kind == "reshape":
            return [((_values(rng, d, (2, 3, 4)),), {"shape": (4, -1)}), ((_values(rng, d, (6,)),), {"shape": (2, 3)}),
                    ((_values(rng, d, (1, 4)),), {"shape": (4, 1, 1)}), ((_values(rng, d, (1, 1)),), {"shape": ()})]
        return [((_values(rng, d, (2, 3)), _values(rng, d, (4, 3))), {}),
                ((_values(rng, d, (2, 3)), _values(rng, d, (2, 1))), {"axis": -1}),
                ((_values(rng, d, (2,)), _values(rng, d, (3,))), {"axis": 0})]
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
    ax = _axis("concat", attrs.get("axis", 0), len(a))
    if a[:ax] + a[ax + 1:] != b[:ax] + b[ax + 1:]:
        raise OpTypeError(f"op concat: shapes {list(a)} and {list(b)} differ outside axis {ax}", input=1)
    return a[:ax] + (a[ax] + b[ax],) + a[ax + 1:]


@op(inputs={"a": "any", "b": "same"}, attrs={"axis": Attr("int", 0, static=True)}, shape=_concat_shape, category="nn", op_set="nn",
    reference=lambda a, b, axis=0: np.concatenate([np.asarray(a), np.asarray(b)], axis=axis),
    samples=_layout_samples("concat"))
def concat(a, b, *, axis=0):
    """a and b (the same dtype) joined along `axis`; their shapes agree on every other axis."""
    return jnp.concatenate([a, b], axis=_axis("concat", axis, a.ndim))


# ====================================================================== matmul family


def _linear_shape(shapes, attrs):
    x, w = (tuple(s) for s in shapes)
    if len(x) < 1:
        raise OpTypeError("op linear: x must have rank >= 1", input=0)
    if len(w) != 2 or w[1] != x[-1]:
        raise OpTypeError(f"op linear: weight has shape {list(w)}, expected [OUT, {x[-1]}] ([out, in], in = the "
                          f"last axis of x)", input=1)
    return x[:-1] + (w[0],)


def _matmul_samples(kind: str):
    def samples(rng, d):
        def f(*shape):
            return _floats(rng, d, shape, 1.0)
        if kind == "linear":
            return [((f(3, 4), f(5, 4)), {}), ((f(6), f(2, 6)), {}), ((f(2, 2, 16), f(3, 16)), {})]
        if kind == "matmul_t":
            return [((f(2, 3, 4), f(5, 4)), {}), ((f(3, 4), f(2, 5, 4)), {}), ((f(2, 1, 3, 16), f(2, 5, 16)), {})]
        return [((f(2, 3, 4), f(5, 2, 4)), {"spec": "kgd,tkd->kgt"}), ((f(3, 4), f(4, 2)), {"spec": "ij,jk->ik"}),
                ((f(2, 3, 8), f(2, 3, 8)), {"spec": "bhd,bhd->bh"}), ((f(3,), f(2,)), {"spec": "i,j->ji"})]
    return samples


@op(inputs={"x": "float", "weight": "same"}, shape=_linear_shape, category="nn", op_set="nn",
    reference=lambda x, weight: _f64(x) @ _f64(weight).T, samples=_matmul_samples("linear"))
def linear(x, weight, *, ctx):
    """x @ weight^T with weight [out, in] (the torch / Hugging Face layout): x [..., in] -> [..., out].

    f16/bf16 accumulate in f32 and are rounded once; f32 uses the program's matmul precision
    (`--precision`, default highest: exact f32 products), f64 computes in f64."""
    y = lax.dot_general(x, weight, (((x.ndim - 1,), (1,)), ((), ())), precision=_precision(),
                        preferred_element_type=N.compute_dtype(ctx.dtype))
    return N.store(y, ctx.out_dtype)


def _matmul_t_shape(shapes, attrs):
    a, b = (tuple(s) for s in shapes)
    if len(a) < 2 or len(b) < 2:
        raise OpTypeError("op matmul_t: a and b must have rank >= 2", input=0 if len(a) < 2 else 1)
    if a[-1] != b[-1]:
        raise OpTypeError(f"op matmul_t: a [.., M, K] and b [.., N, K] differ in K: {a[-1]} vs {b[-1]}", input=1)
    try:
        batch = broadcast_shapes(a[:-2], b[:-2])
    except OpTypeError as exc:
        raise OpTypeError(f"op matmul_t: batch dimensions {list(a[:-2])} and {list(b[:-2])}: {exc}", input=1) \
            from None
    return batch + (a[-2], b[-2])


@op(inputs={"a": "float", "b": "same"}, shape=_matmul_t_shape, category="nn", op_set="nn",
    reference=lambda a, b: np.matmul(_f64(a), np.swapaxes(_f64(b), -1, -2)), samples=_matmul_samples("matmul_t"))
def matmul_t(a, b, *, ctx):
    """a @ swapaxes(b, -1, -2): a [..., M, K], b [..., N, K] -> [..., M, N], batch dimensions broadcast (e.g. q @ k^T).

    Numerics as linear: f32 accumulation for f16/bf16, the program's matmul precision for f32."""
    y = jnp.matmul(a, jnp.swapaxes(b, -1, -2), precision=_precision(),
                   preferred_element_type=N.compute_dtype(ctx.dtype))
    return N.store(y, ctx.out_dtype)


def _parse_einsum(spec, ranks) -> tuple[list[str], str]:
    def fail(why: str):
        raise OpTypeError(f"op einsum: spec {spec!r}: {why}", attr="spec")
    if not isinstance(spec, str):
        fail("expected a string")
    text = spec.replace(" ", "")
    if text.count("->") != 1:
        fail("expected 'A,B->OUT' (two operands and an explicit output)")
    lhs, out = text.split("->")
    operands = lhs.split(",")
    if len(operands) != 2:
        fail(f"expected two operands, got {len(operands)}")
    for part in operands + [out]:
        if not all(c.isalpha() and c.isascii() for c in part):
            fail(f"subscripts are letters only (no '...'), got {part!r}")
        if len(set(part)) != len(part):
            fail(f"a letter repeats in {part!r}")
    for i, (part, rank) in enumerate(zip(operands, ranks)):
        if len(part) != rank:
            fail(f"operand {i + 1} has {len(part)} subscripts ({part!r}) but rank {rank}")
    missing = [c for c in out if c not in operands[0] + operands[1]]
    if missing:
        fail(f"output letter {missing[0]!r} is in no operand")
    return operands, out


def _einsum_shape(shapes, attrs):
    operands, out = _parse_einsum(attrs.get("spec"), [len(s) for s in shapes])
    sizes: dict[str, int] = {}
    for part, shape in zip(operands, shapes):
        for c, n in zip(part, shape):
            if sizes.setdefault(c, n) != n:
                raise OpTypeError(f"op einsum: spec {attrs['spec']!r}: {c!r} is {sizes[c]} in one place and {n} "
                                  f"in another", attr="spec")
    return tuple(sizes[c] for c in out)


@op(inputs={"a": "float", "b": "same"}, attrs={"spec": Attr("string", required=True)}, shape=_einsum_shape,
    category="nn", op_set="nn", reference=lambda a, b, spec: np.einsum(spec, _f64(a), _f64(b)),
    samples=_matmul_samples("einsum"))
def einsum(a, b, *, spec, ctx):
    """Two-operand Einstein summation given by `spec` ("kgd,tkd->kgt"): letters only, an explicit output.

    Numerics as linear: f32 accumulation for f16/bf16, the program's matmul precision for f32."""
    _parse_einsum(spec, (a.ndim, b.ndim))
    y = jnp.einsum(spec, a, b, precision=_precision(), preferred_element_type=N.compute_dtype(ctx.dtype))
    return N.store(y, ctx.out_dtype)


# ====================================================================== argmax


def _argmax_shape(shapes, attrs):
    x = tuple(shapes[0])
    ax = _axis("argmax", attrs.get("axis", -1), len(x))
    return x[:ax] + x[ax + 1:]


def _argmax_ref(x, axis=-1):
    x = np.asarray(x)
    if D.get(_dtype_name(x.dtype)).is_float:
        x = x.astype(np.float64)
    return np.argmax(x, axis=axis)


def _dtype_name(np_dtype) -> str:
    for name, dt in D.DTYPES.items():
        if np.dtype(dt.np_dtype) == np.dtype(np_dtype):
            return name
    raise KeyError(np_dtype)


def _argmax_samples(rng, d):
    a = _values(rng, d, (3, 5))
    a[0, :] = a[0, 0]  # ties: the first wins
    if D.get(d).is_float:
        a[1, 3] = _rep(np.nan, d)  # NaN counts as the maximum
        a[2, 1], a[2, 2] = _rep(-0.0, d), _rep(0.0, d)
    return [((a,), {}), ((_values(rng, d, (4, 3)),), {"axis": 0}), ((_values(rng, d, (6,)),), {"axis": 0})]


@op(inputs={"x": "numeric"}, attrs={"axis": Attr("int", -1, static=True)}, out_dtype="i32", shape=_argmax_shape, category="nn", op_set="nn",
    reference=_argmax_ref, samples=_argmax_samples)
def argmax(x, *, axis=-1):
    """The index (i32) of the first maximum of x along `axis`, which is removed from the shape.

    Ties give the first index; a NaN counts as larger than every number (the first NaN wins, as
    jnp.argmax and np.argmax); -0.0 and +0.0 tie."""
    # lax.argmax with an explicit int32 index: jnp.argmax's index dtype follows the x64 flag when
    # lowered, which breaks the pure step under a user's jit without x64 (tests/test_user_jit.py)
    return lax.argmax(x, _axis("argmax", axis, x.ndim), jnp.int32)
