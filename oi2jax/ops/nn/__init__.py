"""The bundled `nn` op set (`--ops nn`, `ops=["nn"]`): what a Llama/Mistral/GPT-style decoder
needs. Semantics, dtypes and numerics of each op: docs/ops.md ("The bundled nn set").

Floats: f16 and bf16 are computed in f32 and rounded once to the output dtype; f32 in f32 and f64
in f64 (`jax_numerics.to_compute` / `jax_numerics.store`). Norms, softmax and the matmul family accumulate
in f32 for 16-bit inputs. Each op carries a NumPy reference computing in float64 (the tests' oracle,
and what the interpreter runs) and `samples(rng, dtype)`: small cases for the generated tests, where
an attribute given as a 0-d NumPy array stands for a variable (a traced value in the kernel).
"""
from __future__ import annotations

# in the order docs/ops.md lists them (the order the set registers them in)
from .elementwise import exp, log, sqrt, rsqrt, tanh, sigmoid, silu, gelu, sin, cos
from .normalize import softmax, rms_norm, layer_norm
from .attention import attention
from .position import rope, positions, embedding
from .layout import transpose, reshape, concat
from .matmul import linear, matmul_t, einsum
from .argmax import argmax
from .routing import top_k, take_along
from .sampling import sample

OPS = (exp, log, sqrt, rsqrt, tanh, sigmoid, silu, gelu, sin, cos, softmax, attention, rms_norm, layer_norm, rope,
       positions, embedding,
       transpose, reshape, concat, linear, matmul_t, einsum, argmax, top_k, take_along, sample)
