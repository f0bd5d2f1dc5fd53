"""A candidate measured and not kept: the matrix-vector product over Q8_0 / Q4_K blocks as one
Pallas (Triton) kernel per product on a GPU, reading each packed byte once as llama.cpp's CUDA
`mul_mat_vec_q` does (benchmarks/quantized_gpu.py times it beside XLA's forms).

Each program of the grid takes `rows` output rows and walks their blocks in chunks of `values`:
the chunk's quants are decoded in registers, multiplied by the matching x values and summed per
block, then scaled by the block's scale (and min). Its products equal the dequantized weight's f32
dot up to the summation order (checked by the benchmark before timing; `interpret=True` runs the
kernel through Pallas' interpreter on any backend).

Measured on an H200 (benchmarks/results/quantized_gpu-gpu.md, device time of all 154 products of
a TinyLlama-shaped token): Q8_0 869 GB/s and Q4_K 446 GB/s, against XLA:GPU's own fused forms of
oi2jax/quantized/fused.py at 1166 and 519 GB/s. So the decode step keeps XLA's forms
(docs/performance.md, "Quantized weights on a GPU").
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from oi2jax.quantized import QuantTensor

F32 = jnp.float32
KINDS = ("Q8_0", "Q4_K")  # the kinds with a kernel here


def _largest_pow2_divisor(n: int, cap: int) -> int:
    k = 1
    while k * 2 <= cap and n % (k * 2) == 0:
        k *= 2
    return k


def _triton(warps):
    """Pallas' Triton backend, named: JAX's default for a GPU pallas_call is Mosaic GPU."""
    from jax.experimental.pallas import triton as pltriton
    return pltriton.CompilerParams(num_warps=warps)


@functools.partial(jax.jit, static_argnames=("bo", "kb", "warps", "interpret"))
def _q8_0(x, qs, d, *, bo, kb, warps, interpret):
    """x [R, NB, 32] f32, qs int8 [O, NB, 32], d f16 [O, NB] -> [R, O]."""
    from jax.experimental import pallas as pl
    rows, nb, _ = x.shape
    out = qs.shape[0]

    def kernel(x_ref, qs_ref, d_ref, o_ref):
        def body(i, acc):
            q = qs_ref[:, pl.ds(i * kb, kb), :].astype(F32)  # [BO, KB, 32]
            s = d_ref[:, pl.ds(i * kb, kb)].astype(F32)  # [BO, KB]
            new = []
            for r in range(rows):
                xv = x_ref[r, pl.ds(i * kb, kb), :]  # [KB, 32]
                new.append(acc[r] + jnp.sum(jnp.sum(q * xv[None], axis=2) * s, axis=1))
            return tuple(new)
        acc = lax.fori_loop(0, nb // kb, body, tuple(jnp.zeros((bo,), F32) for _ in range(rows)))
        for r in range(rows):
            o_ref[r, :] = acc[r]

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((rows, out), F32), grid=(out // bo,),
        in_specs=[pl.BlockSpec((rows, nb, 32), lambda i: (0, 0, 0)),
                  pl.BlockSpec((bo, nb, 32), lambda i: (i, 0, 0)),
                  pl.BlockSpec((bo, nb), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((rows, bo), lambda i: (0, i)), compiler_params=_triton(warps),
        interpret=interpret)(x, qs, d)


@functools.partial(jax.jit, static_argnames=("bo", "kb", "warps", "interpret"))
def _q4_k(xl, xh, xsum, qs, d, dmin, sc, m, *, bo, kb, warps, interpret):
    """Q4_K: x's halves xl, xh [R, NS, 4, 32] (the values that group g's low / high nibbles meet),
    xsum [R, NS, 4, 2] (x summed per sub-block 2g + n), qs uint8 [O, NS, 4, 32], d, dmin f16
    [O, NS], sc, m uint8 [O, NS, 4, 2] -> [R, O]. Per superblock: d sum_j sc_j (q_j . x_j) -
    dmin sum_j m_j X_j."""
    from jax.experimental import pallas as pl
    rows, ns = xl.shape[:2]
    out = qs.shape[0]

    def kernel(xl_ref, xh_ref, xs_ref, qs_ref, d_ref, dm_ref, sc_ref, m_ref, o_ref):
        first = lax.broadcasted_iota(jnp.int32, (1, 1, 1, 2), 3) == 0

        def body(i, acc):
            at = pl.ds(i * kb, kb)
            q = qs_ref[:, at, :, :]  # [BO, KB, 4, 32] uint8
            lo = (q & 0x0F).astype(F32)
            hi = (q >> 4).astype(F32)
            sc = sc_ref[:, at, :, :].astype(F32)  # [BO, KB, 4, 2]
            mn = m_ref[:, at, :, :].astype(F32)
            d = d_ref[:, at].astype(F32)
            dm = dm_ref[:, at].astype(F32)
            new = []
            for r in range(rows):
                s_lo = jnp.sum(lo * xl_ref[r, at, :, :][None], axis=3)  # [BO, KB, 4]
                s_hi = jnp.sum(hi * xh_ref[r, at, :, :][None], axis=3)
                dots = jnp.where(first, s_lo[..., None], s_hi[..., None])  # [BO, KB, 4, 2]
                scaled = jnp.sum(jnp.sum(sc * dots, axis=3), axis=2)  # [BO, KB]
                mins = jnp.sum(jnp.sum(mn * xs_ref[r, at, :, :][None], axis=3), axis=2)
                new.append(acc[r] + jnp.sum(d * scaled - dm * mins, axis=1))
            return tuple(new)
        acc = lax.fori_loop(0, ns // kb, body, tuple(jnp.zeros((bo,), F32) for _ in range(rows)))
        for r in range(rows):
            o_ref[r, :] = acc[r]

    full = lambda *shape: pl.BlockSpec(shape, lambda i: (0,) * len(shape))  # noqa: E731
    tile = lambda *shape: pl.BlockSpec((bo,) + shape, lambda i: (i,) + (0,) * len(shape))  # noqa: E731
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((rows, out), F32), grid=(out // bo,),
        in_specs=[full(rows, ns, 4, 32), full(rows, ns, 4, 32), full(rows, ns, 4, 2),
                  tile(ns, 4, 32), tile(ns), tile(ns), tile(ns, 4, 2), tile(ns, 4, 2)],
        out_specs=pl.BlockSpec((rows, bo), lambda i: (0, i)), compiler_params=_triton(warps),
        interpret=interpret)(
            xl, xh, xsum, qs, d, dmin, sc, m)


# tiles: output rows per program, values per chunk of a row's walk, Triton warps per program
TILES = (8, 512, 4)


def matvec(x, w: QuantTensor, *, tiles=None, interpret: bool = False):
    """x [..., in] (a few rows) @ W^T for a Q8_0 / Q4_K weight W [out, in] -> [..., out]
    f32. `tiles`: (rows, values, warps) in place of TILES (benchmarks/quantized_gpu.py sweeps them)."""
    lead = x.shape[:-1]
    out, n = w.shape
    x = x.astype(F32).reshape((-1, n))
    rows = x.shape[0]
    f = w.fields
    bo_cap, values, warps = tiles or TILES
    bo = _largest_pow2_divisor(out, bo_cap)
    if w.kind == "Q8_0":
        nb = n // 32
        y = _q8_0(x.reshape(rows, nb, 32), f["qs"], f["d"], bo=bo, kb=_largest_pow2_divisor(nb, max(values // 32, 1)),
                  warps=warps, interpret=interpret)
    else:
        ns = n // 256
        xb = x.reshape(rows, ns, 4, 2, 32)
        y = _q4_k(xb[:, :, :, 0], xb[:, :, :, 1], jnp.sum(xb, axis=-1), f["qs"].reshape(out, ns, 4, 32),
                  f["d"], f["dmin"], f["sc"].reshape(out, ns, 4, 2), f["m"].reshape(out, ns, 4, 2),
                  bo=bo, kb=_largest_pow2_divisor(ns, max(values // 256, 1)), warps=warps, interpret=interpret)
    return y.reshape(lead + (out,))
