"""What a batch of B rows costs XLA's dot (issue 40): `python -m benchmarks.batch_dots [--step-b1-ms MS] [--out DIR]`.

The matrix products of one decode step of benchmarks/llama.py's cpu-full model (4 layers of
q/k/v/o and gate/up/down, and the lm_head: 16.2M f32 weights), jitted as one program with M = B
rows for B = 1, 2, 4, 8, 16, in ONE process, interleaved, best of several calls. The weights are
read once per call whatever B is: M = 1 is a matrix-vector product bound by memory; a batch
should add little until its FLOPs catch up with the memory time. `Program.batch`'s tokens/s at
B = 8 against B = 1 is at most 8 x (B=1 step) / (these products at B = 8), reached only if
everything else in the B = 8 step were free: printed next to the issue's target (4x), with
`--step-b1-ms` (the B = 1 step of results/batch.md). Each product is timed in both operand
orders (weight first, as nn `linear` computes it, and rows first). Writes
results/batch-dots[-gpu].md (JAX's default device).
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .reporting import write_report

HERE = Path(__file__).resolve().parent
ROWS = (1, 2, 4, 8, 16)


def shapes(d: int = 512, f: int = 1408, kv: int = 256, v: int = 8192, layers: int = 4) -> list[tuple[int, int]]:
    """The [out, in] weight matrices of one step (cpu-full: D=512, F=1408, KVH*HD=256, V=8192)."""
    per_layer = [(d, d), (kv, d), (kv, d), (d, d), (f, d), (f, d), (d, f)]
    return per_layer * layers + [(v, d)]


ORDERS = ("weight first", "rows first")  # nn `linear` under vmap; a plain x-first dot_general under vmap


def products(m: int, order: str = ORDERS[0]):
    """Every matrix times M rows as `Program.batch` computes them: `jax.vmap` over M one-row
    products (the input of each product is the batch, cut or tiled to the matrix's width; the
    sum of each product out, so that no part of one is dead). "weight first": nn `linear`'s own
    product (oi2jax/ops/nn/matmul.py: under vmap, `dot_general(w, rows)` -> [out, M] moved to
    [M, out]); "rows first": `dot_general(row, w)` vmapped, the form nn `linear` had before and
    vmap's own rule ([M, in] x [out, in] contracting `in`): the same products."""
    from oi2jax.ops.nn.matmul import _product_fn
    weight_first = _product_fn(lax.Precision.HIGHEST, np.dtype(np.float32))

    def row_first(row, w):
        return lax.dot_general(row, w, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST)
    one = weight_first if order == ORDERS[0] else row_first

    def run(weights, x):
        total = jnp.float32(0)
        for w in weights:
            rows = x if x.shape[1] == w.shape[1] else jnp.resize(x, (m, w.shape[1]))
            y = jax.vmap(lambda r, w=w: one(r[None], w))(rows)  # each slot's [1, in] row
            total = total + y.sum()
        return total
    return jax.jit(run)


def measure(mats: list[tuple[int, int]] | None = None, rows: tuple[int, ...] = ROWS, rounds: int = 7) -> list[dict]:
    mats = shapes() if mats is None else mats
    rng = np.random.default_rng(0)
    weights = [jnp.asarray(rng.standard_normal(s).astype(np.float32) * 0.02) for s in mats]
    fns, xs = {}, {}
    for m in rows:
        xs[m] = jnp.asarray(rng.standard_normal((m, mats[0][1])).astype(np.float32))
        for order in ORDERS:
            fns[m, order] = products(m, order)
            jax.block_until_ready(fns[m, order](weights, xs[m]))
    best = {key: float("inf") for key in fns}
    for _ in range(rounds):  # interleaved: a load change touches every row count and order alike
        for (m, order), fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(weights, xs[m]))
            best[m, order] = min(best[m, order], time.perf_counter() - start)
    params = sum(a * b for a, b in mats)
    return [dict(rows=m, ms=best[m, ORDERS[0]] * 1e3, rows_first_ms=best[m, ORDERS[1]] * 1e3,
                 gflops=2 * m * params / best[m, ORDERS[0]] / 1e9, gbs=4 * params / best[m, ORDERS[0]] / 1e9,
                 per_row_ms=best[m, ORDERS[0]] * 1e3 / m) for m in rows]


def report(results: list[dict], step_b1_ms: float | None = None) -> str:
    device = jax.devices()[0]
    one = results[0]["ms"]
    lines = ["# Batched rows through XLA's dot: the products of one cpu-full decode step", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores; device {device.platform} "
             f"({device.device_kind}); jax {jax.__version__}. 16.2M f32 weights (65 MB) read once per "
             "call; best of 7 interleaved calls, one process.", "",
             "M rows as `Program.batch` runs them, `jax.vmap` over one-row products. Weight first: nn `linear`'s "
             "product (`dot_general(w, rows)` -> [out, M], moved to [M, out]); rows first: `dot_general(row, w)` "
             "vmapped (nn `linear` before; the same products).", "",
             "| rows M | ms (weight first) | x M=1 | GFLOP/s | weight GB/s | ms per row | ms (rows first) |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['rows']} | {r['ms']:.2f} | {r['ms'] / one:.2f} | {r['gflops']:.0f} | {r['gbs']:.1f} | "
                     f"{r['per_row_ms']:.2f} | {r['rows_first_ms']:.2f} |")
    eight = next((r for r in results if r["rows"] == 8), None)
    if eight is not None:
        lines += ["", f"Bound on B=8 / B=1 tokens/s from these products: 8 rows cost {eight['ms'] / one:.2f}x one "
                      f"row, so their tokens/s scale by at most 8 x (M=1) / (M=8) = {8 * one / eight['ms']:.2f}x "
                      "(the issue's target: 4x). A whole step: 8 x (the B=1 step) / (these products at M=8), "
                      "the rest of the B=8 step (attention, norms, sampling) taken as free."]
    if eight is not None and step_b1_ms is not None:
        lines.append(f"With a B=1 step of {step_b1_ms:.2f} ms: at most {8 * step_b1_ms / eight['ms']:.2f}x.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--step-b1-ms", type=float, help="the B=1 decode step (ms, results/batch.md) for the step bound")
    args = ap.parse_args(argv)
    write_report(args.out, "batch-dots", report(measure(), args.step_b1_ms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
