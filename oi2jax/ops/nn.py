"""The bundled `nn` op set (`--ops nn`, `ops=["nn"]`): what a Llama/Mistral/GPT-style decoder
needs. Semantics of each op: docs/ops.md. Floats: f16/bf16 (and f8 where listed) are computed in
f32 and rounded once to the output dtype; f32 and f64 natively.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from . import numerics as N
from .define import op


def _ctx_dtype(ctx) -> str:
    return ctx.in_dtypes[0]


def _f32_unary_ref(fn):
    def ref(x):
        return fn(np.asarray(x, np.float64))
    return ref


@op(inputs={"x": "float"}, elementwise=True, category="nn",
    reference=lambda x: np.exp(np.asarray(x, np.float64)))
def exp(x, *, ctx):
    """e^x elementwise."""
    return N.store(jnp.exp(N.to_compute(x, ctx.dtype)), ctx.out_dtype)


@op(inputs={"x": "float"}, elementwise=True, category="nn",
    reference=lambda x: 1.0 / np.sqrt(np.asarray(x, np.float64)))
def rsqrt(x, *, ctx):
    """1 / sqrt(x) elementwise."""
    return N.store(jnp.reciprocal(jnp.sqrt(N.to_compute(x, ctx.dtype))), ctx.out_dtype)
