"""The ops over a quantized weight (`QuantTensor`): `linear` (x @ W^T, W [out, in] blocked along
in) and `embedding` (rows of a table [V, D] blocked along D). Values: gguf.quants.dequantize
followed by the f32 op, up to the summation order of the matmul (docs/semantics.md, "Quantized
weights"). Which formulation each uses and why: docs/performance.md.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..diagnostics import OiError
from . import ggml
from .blocks import RAW, QuantTensor, dequantize_prepared, is_raw
from .fused import matvec

# x with at most this many rows (tokens) takes the fused matrix-vector product; more rows dequantize
# the weight once and run one f32 matmul (docs/performance.md measures both)
FUSED_MAX_ROWS = 8


def _out_dtype(x):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


def linear(x, w: QuantTensor):
    """x [..., in] @ W^T for a quantized W [out, in] -> [..., out], in f32 (rounded once to x's float
    dtype). The weight is dequantized inside the step, to f32, and never kept."""
    if len(w.shape) != 2 or x.shape[-1:] != w.shape[1:]:
        raise OiError(f"linear: x has shape {list(x.shape)}, the {w.kind} weight {list(w.shape)}: expected "
                      f"x [..., {w.shape[-1]}] and a weight [out, in]")
    rows = 1
    for n in x.shape[:-1]:
        rows *= n
    if rows <= FUSED_MAX_ROWS:  # kept as raw blocks (kernels="ggml"): llama.cpp's row dot products
        y = ggml.matvec(x, w.fields[RAW], w.kind) if is_raw(w) else matvec(x, w)
        return y.astype(_out_dtype(x))
    weight = dequantize_prepared(w)
    y = lax.dot_general(x.astype(jnp.float32), weight, (((x.ndim - 1,), (1,)), ((), ())),
                        precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    return y.astype(_out_dtype(x))


def embedding(table: QuantTensor, ids, dtype=jnp.float32):
    """Rows of a quantized table [V, D] at integer `ids` (any shape S) -> S + [D] of `dtype`: only
    the rows picked are dequantized. `ids` must lie in 0..V-1 (the caller's guard, as the nn
    `embedding` op's, reports one that does not; here it would read row 0 or V-1)."""
    if len(table.shape) != 2:
        raise OiError(f"embedding: the {table.kind} table has shape {list(table.shape)}, expected [V, D]")
    ids = jnp.asarray(ids)
    rows = {name: jnp.take(a, ids, axis=0, mode="clip") for name, a in table.fields.items()}
    return dequantize_prepared(QuantTensor(rows, table.kind, ids.shape + table.shape[1:]), dtype)
