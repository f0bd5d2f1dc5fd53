"""Weights kept quantized on the device, end to end (issue 42, items 1, 3 and 6):
`python -m benchmarks.quantized_model [--quick] [--kinds Q8_0,Q4_1,Q4_K]`.

In ONE process, the candidates interleaved round by round (min and median; the machine is shared):
  prompt  `oi2jax.quantized.linear` of a [2048, 1024] weight on 64 rows at once (the weight
          dequantized once per step) against 64 single-row products in the same jitted step
          (the fused matrix-vector product, each reading the weight again), and f32's 64-row GEMM
  decode  examples/llama_decode.oi, ms/token at position ~8, on a random Llama converted with
          `convert-hf --quantize KIND` (kept packed) and with `--dtype f32`: a tiny model
          (D=256, L=2, F=512, V=512) and a mid one (D=1024, L=8, F=2816, V=8192; --quick: L=4)
  memory  the placed constants' bytes on the device and the KV cache's, against the model file's
          size plus the cache; and, in a process of its own, the resident memory (VmRSS) a compiled
          8-token decode adds to a process with JAX imported and warmed (XLA's compiled code included),
          as it is and after `malloc_trim` gives back the heap pages compilation freed ("trimmed")
Writes results/quantized_model[-quick].md; docs/performance.md reads it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import oi2jax  # noqa: E402
from oi2jax import quantized as Q  # noqa: E402
from oi2jax.model import ggml  # noqa: E402
from oi2jax.model.convert import convert_hf  # noqa: E402
from oi2jax.npz import write_text_atomic  # noqa: E402

from benchmarks.quantized_matvec import compare  # noqa: E402

EXAMPLES = HERE.parent / "examples"
sys.path.insert(0, str(EXAMPLES))
import llama_checkpoint  # noqa: E402

MODELS = {"tiny": dict(vocab=512, hidden=256, layers=2, heads=4, kv_heads=2, intermediate=512, max_positions=256),
          "mid": dict(vocab=8192, hidden=1024, layers=8, heads=8, kv_heads=4, intermediate=2816, max_positions=256)}


# a decode run in a process of its own: resident memory (VmRSS) after importing and warming JAX,
# then after compiling the model and decoding 8 tokens (the host copies of the model released)
RSS_RUN = """import ctypes, sys, jax, jax.numpy as jnp, numpy as np, oi2jax
def rss():
    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS:')) / 1024
jnp.ones(4).block_until_ready()
base = rss()
sess = oi2jax.compile(sys.argv[1], model=sys.argv[2], ops=['nn']).session()
for t in range(8):
    sess.step(token=np.int32(t))
jax.block_until_ready(sess.read('logits'))
after = rss()
ctypes.CDLL(None).malloc_trim(0)  # the heap pages compilation freed, given back
print(base, after, rss())
"""


def rss_growth(path) -> float:
    """MiB of resident memory a compiled decode run of `path` adds to a process with JAX warmed."""
    run = subprocess.run([sys.executable, "-c", RSS_RUN, str(EXAMPLES / "llama_decode.oi"), str(path)],
                         capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONPATH=str(HERE.parent)))
    base, after, trimmed = map(float, run.stdout.split())
    return after - base, trimmed - base


def prompt_rows(kinds, rounds: int) -> list[str]:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((2048, 1024)) * 0.02).astype(np.float32)
    x = jnp.asarray(rng.standard_normal((64, 1024)).astype(np.float32))
    lines = ["| weight [2048, 1024] | 64 rows, one step (ms) | 64 single-row products (ms) | ratio |", "|---|---|---|---|"]
    f32 = compare({"f32": (lambda x, w: x @ w.T, (x, jnp.asarray(w)))}, rounds)["f32"]
    lines.append(f"| f32 GEMM | {f32[0] * 1e3:.2f} | | |")
    for kind in kinds:
        q = Q.prepare(kind, ggml.quantize(kind, w), w.shape)
        res = compare({"once": (lambda x, q: Q.linear(x, q), (x, q)),
                       "rows": (lambda x, q: jnp.stack([Q.linear(x[i], q) for i in range(64)]), (x, q))}, rounds)
        lines.append(f"| {kind} | {res['once'][0] * 1e3:.2f} | {res['rows'][0] * 1e3:.2f} | "
                     f"{res['rows'][0] / res['once'][0]:.1f}x |")
    return lines


def decode(tmp: Path, name: str, sizes: dict, kinds, steps: int, rounds: int) -> list[str]:
    ck = llama_checkpoint.write_random_llama(tmp / name, **sizes)
    paths = {"f32": convert_hf(ck, tmp / f"{name}-f32.oinf", dtype="f32").path}
    for kind in kinds:
        paths[kind] = convert_hf(ck, tmp / f"{name}-{kind}.oinf", quantize=kind).path
    sessions, memory = {}, {}
    for label, path in paths.items():
        prog = oi2jax.compile(EXAMPLES / "llama_decode.oi", model=path, ops=["nn"])
        sess = prog.session()
        for t in range(4):
            sess.step(token=np.int32(t))
        jax.block_until_ready(sess.read("logits"))
        consts = sum(a.nbytes for a in jax.tree.leaves(prog.executable.consts))
        cache = sum(a.nbytes for a in jax.tree.leaves(sess.state.caches))
        memory[label] = (os.path.getsize(path), consts, cache, rss_growth(path))
        sessions[label] = sess
    times = {label: [] for label in sessions}
    for _ in range(rounds):
        for label, sess in sessions.items():
            t = time.perf_counter()
            for i in range(steps):
                sess.step(token=np.int32(i))
            jax.block_until_ready(sess.read("logits"))
            times[label].append((time.perf_counter() - t) / steps)
    lines = [f"**{name}** ({', '.join(f'{k}={v}' for k, v in sizes.items())})", "",
             "| weights | ms/token min | median | vs f32 | file MiB | device consts MiB | cache MiB | "
             "(consts + cache) / (file + cache) | RSS growth MiB | trimmed | trimmed / (file + cache) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = min(times["f32"])
    for label, ts in times.items():
        size, consts, cache, (rss, trimmed) = memory[label]
        lines.append(f"| {label} | {min(ts) * 1e3:.2f} | {statistics.median(ts) * 1e3:.2f} | {min(ts) / base:.2f}x | "
                     f"{size / 2**20:.1f} | {consts / 2**20:.1f} | {cache / 2**20:.1f} | "
                     f"{(consts + cache) / (size + cache):.2f} | {rss:.0f} | {trimmed:.0f} | "
                     f"{trimmed / ((size + cache) / 2**20):.2f} |")
    return lines + [""]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the mid model with 4 layers, fewer rounds")
    p.add_argument("--kinds", default="Q8_0,Q4_1,Q4_K")
    args = p.parse_args(argv)
    kinds = args.kinds.split(",")
    rounds = 3 if args.quick else 5
    load = os.getloadavg()[0]
    out = [f"# Weights kept quantized: decode, prompt rows, memory{' (quick)' if args.quick else ''}", "",
           f"`python -m benchmarks.quantized_model{' --quick' if args.quick else ''}`; load average {load:.1f} at "
           f"the start, {os.cpu_count()} CPUs, jax {jax.__version__}.", "", "## Prompt rows (item 6)", ""]
    out += prompt_rows(kinds, rounds) + ["", "## Decode and memory", ""]
    with tempfile.TemporaryDirectory() as tmp:
        for name, sizes in MODELS.items():
            sizes = dict(sizes, layers=4) if args.quick and name == "mid" else sizes
            out += decode(Path(tmp), name, sizes, kinds, steps=8, rounds=rounds)
    out.append(f"load average at the end: {os.getloadavg()[0]:.1f}")
    text = "\n".join(out) + "\n"
    path = HERE / "results" / f"quantized_model{'-quick' if args.quick else ''}.md"
    write_text_atomic(path, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
