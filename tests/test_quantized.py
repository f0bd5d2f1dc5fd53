"""oi2jax.quantized: GGML block formats kept quantized, their ops against gguf.quants + NumPy.

dequantize and embedding are bit for bit gguf.quants.dequantize (same f32 operations); linear is
the f32 matmul of those values up to summation order, checked against a float64 product with the
forward error bound of a length-n f32 dot product (n * eps * sum |w x|)."""
from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from oi2jax import quantized as Q
from oi2jax.diagnostics import OiError
from oi2jax.quantized.blocks import FORMATS
from oi2jax.quantized.kernels import FUSED_MAX_ROWS

EPS32 = float(np.finfo(np.float32).eps)
QUANTIZABLE = [k for k in Q.KINDS if "_K" not in k]  # gguf.quants.quantize has no K-quants


def random_blocks(rng, kind, rows, blocks):
    """Raw GGUF bytes [rows, blocks * type_size] of `kind`: random quants, finite f16 scales."""
    per, size = Q.block_size(kind)
    raw = rng.integers(0, 256, size=(rows, blocks, size), dtype=np.uint8)
    at = 0
    for name, width, _ in FORMATS[kind].split:
        if name in ("d", "m", "dmin"):
            scale = rng.uniform(-1, 1, size=(rows, blocks)).astype(np.float16) * np.float16(2 ** -5)
            raw[..., at:at + 2] = scale.view(np.uint8).reshape(rows, blocks, 2)
        at += width
    return raw.reshape(rows, blocks * size)


@pytest.fixture(scope="module")
def weights():
    """kind -> (raw bytes, logical shape [out, in], gguf's f32 dequantization), two blocks per row."""
    rng = np.random.default_rng(42)
    out = {}
    for kind in Q.KINDS:
        per, _ = Q.block_size(kind)
        raw = random_blocks(rng, kind, 5, 2)
        out[kind] = raw, (5, 2 * per), gguf.quants.dequantize(raw, T[kind])
    return out


@pytest.mark.parametrize("kind", Q.KINDS)
def test_dequantize_is_gguf_bit_for_bit(weights, kind):
    raw, shape, ref = weights[kind]
    got = np.asarray(Q.dequantize(kind, raw, shape))
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("kind", Q.KINDS)
def test_prepare_keeps_the_bytes_and_works_under_jit(weights, kind):
    raw, shape, ref = weights[kind]
    q = Q.prepare(T[kind], raw, shape)
    extra = 4 * raw.size // Q.block_size(kind)[1] if kind in ("Q4_K", "Q5_K") else 0  # 6-bit scales: 12 -> 16 bytes
    assert q.nbytes == raw.size + extra
    got = jax.jit(lambda r: Q.dequantize(kind, r, shape, jnp.bfloat16))(jnp.asarray(raw))
    np.testing.assert_array_equal(np.asarray(got), ref.astype(jnp.bfloat16))


@pytest.mark.parametrize("kind", QUANTIZABLE)
def test_round_trip_of_gguf_quantize(kind):
    x = np.random.default_rng(1).normal(size=(4, 64)).astype(np.float32)
    raw = gguf.quants.quantize(x, T[kind])
    got = np.asarray(Q.dequantize(kind, raw, x.shape))
    np.testing.assert_array_equal(got, gguf.quants.dequantize(raw, T[kind]))
    assert np.abs(got - x).max() < 0.5


def _assert_matmul_close(y, x, w):
    """y == x @ w.T up to the summation order: within n * eps * (|x| @ |w|.T) of the float64 product."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    bound = x.shape[-1] * EPS32 * (np.abs(x64) @ np.abs(w64).T) + np.finfo(np.float32).tiny
    err = np.abs(y.astype(np.float64) - x64 @ w64.T)
    assert np.all(err <= bound), f"max error {err.max()} vs bound {bound[err > bound].min()}"


@pytest.mark.parametrize("kind", Q.KINDS)
@pytest.mark.parametrize("lead", [(), (1,), (2, 3), (3, 4)])
def test_linear_is_the_f32_matmul_of_the_dequantized_weight(weights, kind, lead):
    """1 and 6 rows take the fused reduction, 12 rows dequantize once and run one matmul."""
    assert 6 <= FUSED_MAX_ROWS < 12
    raw, shape, ref = weights[kind]
    x = np.random.default_rng(len(lead)).normal(size=lead + (shape[1],)).astype(np.float32)
    y = np.asarray(jax.jit(Q.linear)(jnp.asarray(x), Q.prepare(kind, raw, shape)))
    assert y.shape == lead + (shape[0],) and y.dtype == np.float32
    _assert_matmul_close(y, x, ref)


def test_linear_rounds_once_to_a_16_bit_activation(weights):
    raw, shape, ref = weights["Q4_K"]
    x = np.random.default_rng(3).normal(size=(2, shape[1])).astype(jnp.bfloat16)
    y = Q.linear(jnp.asarray(x), Q.prepare("Q4_K", raw, shape))
    assert y.dtype == jnp.bfloat16
    exact = x.astype(np.float64) @ ref.astype(np.float64).T
    np.testing.assert_array_equal(np.asarray(y), exact.astype(np.float32).astype(jnp.bfloat16))


@pytest.mark.parametrize("kind", Q.KINDS)
def test_embedding_rows_are_gguf_rows(weights, kind):
    raw, shape, ref = weights[kind]
    table = Q.prepare(kind, raw, shape)
    ids = np.array([[4, 0], [2, 4]], np.int32)
    got = np.asarray(jax.jit(Q.embedding)(table, ids))
    np.testing.assert_array_equal(got, ref[ids])
    np.testing.assert_array_equal(np.asarray(Q.embedding(table, np.int32(3), jnp.float16)), ref[3].astype(np.float16))


def test_errors_name_the_kind_and_the_sizes():
    with pytest.raises(OiError, match=r"ggml type 'Q3_K' has no quantized kernels; supported: Q8_0, Q4_0"):
        Q.prepare("Q3_K", np.zeros(110, np.uint8), (1, 256))
    with pytest.raises(OiError, match=r"Q8_0 data of shape \[2, 32\] is 68 bytes of uint8, got 34 values"):
        Q.prepare("q8_0", np.zeros(34, np.uint8), (2, 32))
    with pytest.raises(OiError, match=r"Q4_K tensor's last axis must be a multiple of 256, got shape \[2, 32\]"):
        Q.prepare("Q4_K", np.zeros(144, np.uint8), (2, 32))
    w = Q.prepare("Q8_0", np.zeros(68, np.uint8), (2, 32))
    with pytest.raises(OiError, match=r"linear: x has shape \[3, 16\], the Q8_0 weight \[2, 32\]"):
        Q.linear(jnp.zeros((3, 16)), w)


@pytest.mark.parametrize("kind", ["Q4_1", "Q5_1", "Q4_K", "Q5_K"])
def test_dequantize_rounds_each_product_before_adding_the_min(kind):
    """d * q + m with the product rounded first, as NumPy does (XLA's CPU code may fuse a multiply
    and an add inside a loop fusion: ops.jax_numerics.no_contract prevents it); many values, jitted."""
    per, _ = Q.block_size(kind)
    raw = random_blocks(np.random.default_rng(7), kind, 64, 2048 // per)
    got = jax.jit(lambda r: Q.dequantize(kind, r, (64, 2048)) * 1.0)(jnp.asarray(raw))
    np.testing.assert_array_equal(np.asarray(got), gguf.quants.dequantize(raw, T[kind]))
