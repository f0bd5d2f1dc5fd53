"""Weights kept in GGML's quantized block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K),
and stored i8/u8 integers with OpenInfer's v2 QuantParams (AFFINE), and the pure JAX ops over them:
`prepare` raw GGUF bytes once at load, then `linear`, `embedding` and `dequantize` inside a step.
docs/performance.md says how the kernels were chosen."""
from __future__ import annotations

from .blocks import AFFINE, KINDS, QuantTensor, affine_tensor, block_size, dequantize, dequantize_prepared, has_kernels, \
    is_raw, member, prepare, raw_nbytes, raw_tensor
from .kernels import embedding, linear

__all__ = ["AFFINE", "KINDS", "QuantTensor", "affine_tensor", "block_size", "dequantize", "dequantize_prepared",
           "embedding", "has_kernels", "is_raw", "linear", "member", "prepare", "raw_nbytes", "raw_tensor"]
