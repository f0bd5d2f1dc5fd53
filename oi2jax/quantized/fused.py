"""The matrix-vector product over a quantized weight with its dequantization fused in: one XLA
reduction that reads each packed byte once and never writes a dequantized copy.

Two forms, each kind the faster one measured (docs/performance.md):
- block sums (Q4_0, Q4_1, Q5_0, Q5_1): the block's integer quants against x summed first, the
  scale (and min) applied once per block -- fewer operations per weight; the products round like
  a reassociation of the dot product, within its f32 error bound.
- planes (Q8_0, Q4_K, Q5_K, Q6_K): f32 expressions [..., out, blocks, (groups,) width], each the
  exact dequantized value of the weights it covers (gguf.quants' f32 operations), paired with the
  view of x [..., blocks, (groups,) width] those weights multiply.
A 4-bit byte holds two weights that meet different x values, so its low and high nibbles are two
planes against two slices of x, never concatenated back into ggml's order (XLA's CPU code for a
concatenate inside a reduction is several times slower). Nibbles come out of a byte as floats:
hi = floor(v / 16), lo = v - 16 hi, exact in f32.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from .blocks import AFFINE, QuantTensor, affine_decode

F32 = jnp.float32


def _nib(qs):
    """Packed bytes -> (low, high) nibbles as f32 (exact)."""
    v = qs.astype(F32)
    hi = jnp.floor(v * (1 / 16))
    return v - 16 * hi, hi


def _col(a):
    return a.astype(F32)[..., None]


def _q8_0(f, x):
    return [(f["qs"].astype(F32) * _col(f["d"]), x.reshape(x.shape[:-1] + (-1, 32)))]


def _fields(v, width, ks, last=False):
    """Unsigned integers [..., n] (bytes, uint16) -> their `width`-bit fields number ks, as f32
    [..., len(ks), n] (`last`: [..., n, len(ks)]): floor(v / 2^(w k)) - 2^w floor(v / 2^(w (k + 1))),
    exact, and float operations, which XLA keeps inside the reduction's fusion (integer shifts and masks there are
    split off and written to memory as f32 arrays). Each plane computes its own fields: a slice of
    fields shared by two planes is written out too."""
    scale = np.float32(2.0) ** -(width * np.asarray(ks, dtype=np.float32))
    v, scale = (v.astype(F32)[..., None], scale) if last else (v.astype(F32)[..., None, :], scale[:, None])
    return jnp.floor(v * scale) - 2.0 ** width * jnp.floor(v * (scale * 2.0 ** -width))


def _bits(half):
    """Q5_0/Q5_1: bits 0..15 of a uint16 field [..., blocks] as f32 [..., blocks, 16]."""
    return _fields(half, 1, range(16), last=True)


def _block_sums(f, x, with_high_bits):
    """Q4_0/Q4_1/Q5_0/Q5_1, the block's scale factored out: per block b, the integer quants q
    against x, s_b = sum_j q_j x_j, and X_b = sum_j x_j; then y = sum_b d_b (s_b + off X_b) + m_b X_b.
    A byte v holds q_j = lo and q_{j+16} = hi: lo x_j + hi x_{j+16} = v x_j + hi (x_{j+16} - 16 x_j),
    so each byte costs one conversion, one floor and two products."""
    xb = x.reshape(x.shape[:-1] + (-1, 2, 16))
    xl, xh = xb[..., 0, :], xb[..., 1, :]
    v = f["qs"].astype(F32)
    hi = jnp.floor(v * (1 / 16))
    terms = v * xl + hi * (xh - 16 * xl)
    if with_high_bits:
        terms = terms + 16 * (_bits(f["qh_lo"]) * xl + _bits(f["qh_hi"]) * xh)
    s = jnp.sum(terms, axis=-1)
    total = jnp.sum(xb, axis=(-2, -1))
    d = f["d"].astype(F32)
    if "m" in f:
        return d * s + f["m"].astype(F32) * total
    return d * (s - (16.0 if with_high_bits else 8.0) * total)


def _k_planes(f, x, fifth=False):
    """Q4_K / Q5_K: 128 bytes = 4 groups of 32; group g's low nibbles are sub-block 2g, its high
    ones sub-block 2g+1, each with scale d * sc and min dmin * m."""
    lead = f["qs"].shape[:-1]
    lo, hi = _nib(f["qs"].reshape(lead + (4, 32)))
    if fifth:  # Q5_K: bit i of qh[l] is value l of sub-block i = 2 g + n
        lo = lo + 16 * _fields(f["qh"], 1, (0, 2, 4, 6))
        hi = hi + 16 * _fields(f["qh"], 1, (1, 3, 5, 7))
    xb = x.reshape(x.shape[:-1] + (-1, 4, 2, 32))

    def plane(q, n):  # each plane scales from its own slice of sc and m (a shared product is written out)
        d = _col(f["d"]) * f["sc"][..., n::2].astype(F32)
        dm = _col(f["dmin"]) * f["m"][..., n::2].astype(F32)
        return d[..., None] * q - dm[..., None], xb[..., n, :]
    return [plane(lo, 0), plane(hi, 1)]


def _q4_k(f, x):
    return _k_planes(f, x)


def _q5_k(f, x):
    return _k_planes(f, x, fifth=True)


def _q6_k(f, x):
    """Q6_K: per half of 128 values, bytes ql[64] and qh[32]: value (n, a, l) of the half, at
    64 n + 32 a + l, is nibble n of ql[32 a + l] with bits 4n + 2a of qh[l] above it, minus 32;
    scale index 8 half + 4 n + 2 a + l // 16."""
    lead = f["ql"].shape[:-1]
    lo, hi = _nib(f["ql"].reshape(lead + (2, 2, 32)))  # [..., half, a, l]
    qh = f["qh"].reshape(lead + (2, 32))
    scales = f["scales"].reshape(lead + (2, 2, 2, 2))  # [..., half, n, a, l//16]
    xb = x.reshape(x.shape[:-1] + (-1, 2, 2, 2, 2, 16))  # [..., blocks, half, n, a, l//16, l%16]

    def plane(q, n):
        q = (q + 16 * _fields(qh, 2, (2 * n, 2 * n + 1)) - 32).reshape(lead + (2, 2, 2, 16))  # fields 2n + a
        scale = f["d"].astype(F32)[..., None, None, None] * scales[..., n, :, :].astype(F32)
        return scale[..., None] * q, xb[..., n, :, :, :]
    return [plane(lo, 0), plane(hi, 1)]


PLANES = {"Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
# kinds whose blocks are summed with the scale factored out: -> per-block terms [..., blocks]
BLOCK_SUMS = {"Q4_0": False, "Q4_1": False, "Q5_0": True, "Q5_1": True}


def matvec(x, w: QuantTensor):
    """x [..., in] @ W^T for a quantized W [out, in], fused: for a few rows of x (decode)."""
    lead = x.shape[:-1]
    # the barrier keeps each product's broadcast of x its own: XLA's CPU pipeline otherwise merges
    # the identical broadcasts of one x against same-shaped weights and writes it to memory as an
    # [out, in] f32 array that every reduction then reads (as many bytes as an f32 weight)
    x, fields = lax.optimization_barrier((x, w.fields))
    one = math.prod(lead) == 1
    # one row: x [in] against W [out, ...]; more: x [rows, 1 (out), in] (a leading axis of 1 makes
    # XLA's code for the single row slower)
    x = x.astype(F32).reshape((x.shape[-1],) if one else (-1, 1, x.shape[-1]))
    first = 1 if one else 2
    if w.kind == AFFINE:  # stored integers with QuantParams: their f32 values, reduced against x
        y = jnp.sum(affine_decode(fields) * x, axis=-1)
    elif w.kind in BLOCK_SUMS:
        y = jnp.sum(_block_sums(fields, x, BLOCK_SUMS[w.kind]), axis=-1)
    else:
        total = None
        for weight, xs in PLANES[w.kind](fields, x):
            term = weight * xs
            total = term if total is None else total + term
        y = jnp.sum(total, axis=tuple(range(first, total.ndim)))
    return y.reshape(lead + (w.shape[0],))
