"""Batched decode benchmark (issue 40): `python -m benchmarks.batch [--quick] [--out DIR]`.

B = 8 sequences of a random converted Llama (benchmarks/llama.py's cases) decode together with
`Program.batch` (oi2jax/runtime/batch.py: examples/llama_prefill.oi at S=1 under `jax.vmap`, a
fused loop of `chunk` steps per compiled call) against the hand-written batched step of
benchmarks/handwritten/llama_batch.py (handwritten/llama.py's step under `jax.vmap`, n steps as
one donated `lax.scan`). In ONE process, interleaved, medians: the time per step of N greedy steps
of all B slots (oi2jax: `batch.run(N)`, every token back on the host; hand-written: `decode(...,
N)` and its `[N, B]` tokens fetched), each from the state after the same prompts (each slot's
prompt a different length; the prompt steps are not timed); and the tokens/s of the oi2jax batch
at B = 8 against B = 1.

Targets (reported, never asserted): per step <= 1.10x the hand-written batched step; total
tokens/s at B = 8 >= 4x B = 1. Writes results/batch[-gpu][-quick].md (JAX's default device).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np

import oi2jax

from .handwritten.llama_batch import LlamaBatchJax
from .llama import EXAMPLES, LlamaCase, case_list, make_model

HERE = Path(__file__).resolve().parent
GRAPH = EXAMPLES / "llama_prefill.oi"
B = 8
BUCKET = 16  # every prompt fits one prompt step
TARGETS = {"step": 1.10, "scale": 4.0}


def cases(profile: str) -> list[LlamaCase]:
    """benchmarks/llama.py's case, and for the full profile the same model with a short cache
    (T = 128): a step whose cost is the weights' (the T = 1024 one reads B caches of T rows)."""
    out = case_list(profile, gpu=False)
    if profile == "full":
        out.append(replace(out[0], name="cpu-full-T128", max_positions=128))
    return out


def prompts(case: LlamaCase) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.integers(0, case.vocab, 6 + k).astype(np.int32) for k in range(B)]  # 6..13 tokens


def fill(batch, ps) -> None:
    """Every slot freed, then given its prompt (not timed)."""
    for slot in range(batch.size):
        batch.evict(slot)
        batch.insert(slot, ps[slot])
    jax.block_until_ready(batch._state)


def bench(case: LlamaCase, model: Path, steps: int, reps: int) -> dict:
    prog = oi2jax.compile(GRAPH, model=model, ops=["nn"], sizes={"S": 1})
    ps = prompts(case)
    batch8 = prog.batch(B, chunk=steps, buckets=(BUCKET,))
    batch1 = prog.batch(1, chunk=steps, buckets=(BUCKET,))
    hand = LlamaBatchJax.from_model(model, batch=B)
    start_pos = np.array([len(p) for p in ps], np.int32)

    def run_oi(batch, pset):
        fill(batch, pset)
        t = time.perf_counter()
        out = batch.run(steps)
        took = time.perf_counter() - t
        assert all(len(v) == steps for v in out.values())
        return took

    def run_hand():
        cache = hand.init_cache()
        first = np.array([batch8.result(s).tokens[0] for s in range(B)], np.int32)
        jax.block_until_ready(cache)
        t = time.perf_counter()
        cache, nexts = hand.decode(hand.params, cache, first, start_pos, steps)
        np.asarray(nexts)
        return time.perf_counter() - t

    times = {"oi2jax B=8": [], "hand B=8": [], "oi2jax B=1": []}
    for rep in range(reps + 1):  # the first round compiles: not counted
        t8 = run_oi(batch8, ps)
        th = run_hand()
        t1 = run_oi(batch1, ps[:1])
        if rep:
            times["oi2jax B=8"].append(t8)
            times["hand B=8"].append(th)
            times["oi2jax B=1"].append(t1)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"name": case.name, "sizes": case.sizes(), "steps": steps, "reps": reps,
            "step_ms": {k: 1e3 * v / steps for k, v in med.items()},
            "step": med["oi2jax B=8"] / med["hand B=8"],
            "tok_s": {"B=8": B * steps / med["oi2jax B=8"], "B=1": steps / med["oi2jax B=1"],
                      "hand B=8": B * steps / med["hand B=8"]},
            "scale": (B * steps / med["oi2jax B=8"]) / (steps / med["oi2jax B=1"])}


def report(results: list[dict], meta: dict) -> str:
    lines = [f"# Batched decode (B = {B}): `Program.batch` vs a hand-written batched step", "",
             f"machine: {meta['machine']}; device: {meta['device']}; jax {meta['jax']}; load average "
             f"{meta['load_before']:.1f} before, {meta['load_after']:.1f} after (a loaded machine: ratios, "
             f"measured interleaved in one process, are what to read)", "",
             "| case | steps | oi2jax B=8 ms/step | hand B=8 ms/step | oi2jax/hand (<= 1.10) | "
             "oi2jax B=1 ms/step | tok/s B=8 | tok/s B=1 | B=8/B=1 tok/s (>= 4) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ms, ts = r["step_ms"], r["tok_s"]
        lines.append(f"| {r['name']} ({r['sizes']}) | {r['steps']} | {ms['oi2jax B=8']:.2f} | {ms['hand B=8']:.2f} | "
                     f"{r['step']:.2f}{'' if r['step'] <= TARGETS['step'] else ' (over)'} | {ms['oi2jax B=1']:.2f} | "
                     f"{ts['B=8']:.0f} | {ts['B=1']:.0f} | {r['scale']:.2f}"
                     f"{'' if r['scale'] >= TARGETS['scale'] else ' (under)'} |")
    lines += ["", f"Medians of {results[0]['reps'] if results else 0} interleaved rounds after one warm-up round; "
              "each round starts every slot from its prompt (prompt steps not timed).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small model (well under a minute)")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    profile = "quick" if args.quick else "full"
    steps, reps = (32, 5) if args.quick else (64, 5)
    load_before = os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases(profile):
            model = make_model(case, Path(tmp))
            t0 = time.perf_counter()
            r = bench(case, model, steps, reps)
            print(f"{r['name']}: step {r['step']:.2f}  scale {r['scale']:.2f}  ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
            results.append(r)
    meta = dict(machine=f"{platform.machine()} ({os.cpu_count()} cpus)", device=str(jax.devices()[0]),
                jax=jax.__version__, load_before=load_before, load_after=os.getloadavg()[0])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = jax.devices()[0].platform == "gpu"
    path = out / ("batch" + ("-gpu" if gpu else "") + ("-quick" if args.quick else "") + ".md")
    path.write_text(report(results, meta))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
