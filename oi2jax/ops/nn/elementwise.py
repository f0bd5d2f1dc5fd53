"""nn elementwise float functions: exp, log, sqrt, rsqrt, tanh, sigmoid, silu, gelu, sin, cos."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..define import op
from ._common import map_float, ref_unary, float_samples, unary_samples, SPECIAL_FLOATS


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=ref_unary(np.exp),
    samples=unary_samples(SPECIAL_FLOATS + (11.1, 88.5, 89.0, 710.0, -104.0, -750.0, 0.5)))
def exp(x, *, ctx):
    """e^x elementwise: overflow gives +inf, exp(-inf) = 0, NaN stays NaN."""
    return map_float(jnp.exp, x, ctx)


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=ref_unary(np.log),
    samples=unary_samples(SPECIAL_FLOATS + (1e-30, 65504.0, 2.0, 1e-3, 0.5), positive=True))
def log(x, *, ctx):
    """Natural logarithm elementwise: log(±0) = -inf, log(x < 0) = NaN, log(+inf) = +inf."""
    return map_float(jnp.log, x, ctx)


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=ref_unary(np.sqrt),
    samples=unary_samples(SPECIAL_FLOATS + (4.0, 1e-30, 2.0, 65504.0), positive=True))
def sqrt(x, *, ctx):
    """Square root elementwise: sqrt(-0) = -0, sqrt(x < 0) = NaN, sqrt(+inf) = +inf."""
    return map_float(jnp.sqrt, x, ctx)


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=ref_unary(lambda x: 1.0 / np.sqrt(x)),
    samples=unary_samples(SPECIAL_FLOATS + (4.0, 1e-30, 2.0, 65504.0), positive=True))
def rsqrt(x, *, ctx):
    """1 / sqrt(x) elementwise: rsqrt(+0) = +inf, rsqrt(-0) = -inf, rsqrt(x < 0) = NaN, rsqrt(+inf) = 0."""
    return map_float(lambda v: jnp.reciprocal(jnp.sqrt(v)), x, ctx)


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=ref_unary(np.tanh),
    samples=unary_samples(SPECIAL_FLOATS + (20.0, -20.0, 1e-3, 0.5)))
def tanh(x, *, ctx):
    """Hyperbolic tangent elementwise: tanh(±inf) = ±1."""
    return map_float(jnp.tanh, x, ctx)


def _sigmoid_ref(x):
    return np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x))))


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=ref_unary(_sigmoid_ref),
    samples=unary_samples(SPECIAL_FLOATS + (100.0, -100.0, 20.0, -20.0)))
def sigmoid(x, *, ctx):
    """The logistic function 1 / (1 + e^-x) elementwise: sigmoid(+inf) = 1, sigmoid(-inf) = 0."""
    return map_float(jax.nn.sigmoid, x, ctx)


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=ref_unary(lambda x: x * _sigmoid_ref(x)),
    samples=unary_samples(SPECIAL_FLOATS + (100.0, -100.0, 20.0, -20.0)))
def silu(x, *, ctx):
    """x * sigmoid(x) elementwise (SiLU / swish): silu(+inf) = +inf, silu(-inf) = NaN (-inf * 0)."""
    return map_float(lambda v: v * jax.nn.sigmoid(v), x, ctx)


_SQRT_HALF = 1.0 / math.sqrt(2.0)
_TANH_C = math.sqrt(2.0 / math.pi)
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _gelu_ref(x, approximate=False):
    if bool(np.asarray(approximate)):
        return x * _sigmoid_ref(2.0 * _TANH_C * (x + 0.044715 * x ** 3))  # = 0.5 x (1 + tanh(u)), no cancellation
    return 0.5 * x * _erfc(-x * _SQRT_HALF)


def _gelu_samples(rng, d):
    edges = SPECIAL_FLOATS + (10.0, -10.0, 3.0, -3.0, 0.5)
    a = float_samples(rng, d, (2, 8), 3.0, edges)
    return [((a,), {}), ((a,), {"approximate": True}), ((float_samples(rng, d, (5,), 2.0),), {"approximate": np.array(True)}),
            ((float_samples(rng, d, (5,), 2.0),), {"approximate": np.array(False)})]


@op(inputs={"x": "float"}, attrs={"approximate": False}, elementwise=True, category="nn", op_set="nn",
    reference=lambda x, approximate=False: ref_unary(lambda v: _gelu_ref(v, approximate))(x), samples=_gelu_samples)
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
        return map_float(tanh_form if approximate else exact, x, ctx)
    flag = jnp.asarray(approximate).astype(jnp.bool_)
    return map_float(lambda v: jnp.where(flag, tanh_form(v), exact(v)), x, ctx)


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=ref_unary(np.sin),
    samples=unary_samples(SPECIAL_FLOATS + (3.140625, 100.0, -1000.0, 1e-3), scale=4.0))
def sin(x, *, ctx):
    """Sine (radians) elementwise: sin(±inf) = NaN."""
    return map_float(jnp.sin, x, ctx)


@op(inputs={"x": "float"}, elementwise=True, category="nn", op_set="nn", reference=ref_unary(np.cos),
    samples=unary_samples(SPECIAL_FLOATS + (1.5703125, 100.0, -1000.0, 1e-3), scale=4.0))
def cos(x, *, ctx):
    """Cosine (radians) elementwise: cos(±inf) = NaN."""
    return map_float(jnp.cos, x, ctx)
