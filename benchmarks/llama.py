"""Llama decode benchmark (issue 31): `python -m benchmarks.llama [--quick] [--device gpu] [--out DIR]`.

examples/llama_decode.oi on a random Hugging Face checkpoint (examples/llama_checkpoint.py,
converted with convert-hf) against the hand-written JAX Llama of benchmarks/handwritten/llama.py
(the same math, parameters from the same `.oinf`). Per token after a P-token prompt, in ONE process:
  (a) `Session.step(token=tok)` loop, `tok` the previous step's `next` as returned (a device
      array: no host read per step);
  (b) the hand-written `jax.jit` step, cache donated, layers unrolled (also reported: (b-scan),
      layers as a `lax.scan` over stacked weights);
  (c) `Session.run({"token": [tok]}, steps=N, feedback={"token": "next"}, collect=("next",))`:
      N generated tokens in one compiled loop (the result, as NumPy, is part of the time);
  (d) the hand-written donated `lax.scan` generation of N tokens, the tokens fetched to the host.
Each side starts from its own state after the same prompt (a copy made before the clock);
medians of interleaved runs. Before timing, the logits of both after the prompt are asserted
equal within TOL relative to the largest |logit|.

In separate fresh processes (one per side and repetition, JAX and oi2jax warmed on a trivial
program first): time to first token (TTFT: wall time from nothing compiled or loaded to the
first step's logits on the host: `oi2jax.compile` + `session().step` + `read("logits")` against
`open_model` + load + `jax.jit` + first call + `np.asarray(logits)`), then a fused generation of
the prompt plus N tokens; peak memory over the whole process: device `memory_stats()`
peak_bytes_in_use where the device has them, else the growth of the process's max RSS
(`resource.getrusage`) from just before the clock.

Memory-bandwidth floor: the bytes of weights one token reads / the device's copy rate (a jitted
`x + 1` over a large buffer, read + written bytes per second).

Every timed run during which something was compiled is not counted but run again (the count is
reported): a Session compiles its second step form, and Session.run compiles slices of its
collected stacks, only when first needed, many tokens in; the tables are steady state.

Targets (reported, never asserted): a/b <= 1.10, c/d <= 1.10, TTFT <= 1.5x, peak memory <= 1.2x;
on a GPU, (c) within 1.5x of the floor. Writes results/llama[-quick|-gpu].md and .json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import oi2jax  # noqa: E402

from benchmarks.handwritten.llama import LlamaJax  # noqa: E402

EXAMPLES = REPO / "examples"
TARGETS = {"a/b": 1.10, "c/d": 1.10, "ttft": 1.5, "mem": 1.2, "c/floor": 1.5}
TOL = {"f32": 1e-4, "bf16": 2e-2}  # |oi2jax - hand-written| / max |hand-written| (bf16: rounding of every op)
STEP_CHUNK = 16  # (a)/(b): tokens per timed run


@dataclass
class LlamaCase:
    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_positions: int
    prompt: int
    gen: int
    dtype: str = "f32"

    @property
    def graph(self) -> Path:
        return EXAMPLES / ("llama_decode.oi" if self.dtype == "f32" else f"llama_decode_{self.dtype}.oi")

    def sizes(self) -> str:
        return (f"D={self.hidden} L={self.layers} H={self.heads} KVH={self.kv_heads} F={self.intermediate} "
                f"V={self.vocab} T={self.max_positions} {self.dtype}")


def case_list(profile: str, gpu: bool, dtype: str = "f32") -> list[LlamaCase]:
    tiny = LlamaCase("tiny", 128, 64, 2, 4, 2, 128, 64, prompt=16, gen=8, dtype=dtype)
    quick = LlamaCase("quick", 1024, 128, 2, 4, 2, 352, 256, prompt=64, gen=32, dtype=dtype)
    full = LlamaCase("cpu-full", 8192, 512, 4, 8, 4, 1408, 1024, prompt=512, gen=128)
    tinyllama = LlamaCase("TinyLlama-1.1B-shaped", 32000, 2048, 22, 32, 4, 5632, 2048, prompt=512, gen=128,
                          dtype="bf16")
    if profile == "tiny":
        return [tiny]
    out = [quick] if profile == "quick" else [full]
    if gpu:
        out.append(tinyllama)
    return out


# ------------------------------------------------------------------ helpers


def block(tree):
    return jax.block_until_ready(tree)


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def make_model(case: LlamaCase, workdir: Path) -> Path:
    sys.path.insert(0, str(EXAMPLES))
    import llama_checkpoint
    from oi2jax.model.convert import convert_hf
    ck = llama_checkpoint.write_random_llama(
        workdir / f"{case.name}-hf", vocab=case.vocab, hidden=case.hidden, layers=case.layers, heads=case.heads,
        kv_heads=case.kv_heads, intermediate=case.intermediate, max_positions=case.max_positions, dtype=case.dtype,
        seed=0)
    out = workdir / f"{case.name}.oinf"
    convert_hf(ck, out)
    return out


def prompt_tokens(case: LlamaCase) -> np.ndarray:
    return np.random.default_rng(1).integers(0, case.vocab, case.prompt).astype(np.int32)


def copy_rate(device) -> float:
    """Device-to-device copy rate: bytes read + written per second by a jitted `x + 1` over a large
    buffer (1 GiB on a GPU, 64 MiB elsewhere), ten calls back to back (dispatch amortised), median
    of five such measurements."""
    n = (1 << 30) if device.platform == "gpu" else (64 << 20)
    x = jax.device_put(jnp.zeros(n // 4, jnp.float32), device)
    f = jax.jit(lambda v: v + 1)
    block(f(x))
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(10):
            y = f(x)
        block(y)
        ts.append((time.perf_counter() - t0) / 10)
    return 2 * n / statistics.median(ts)


class Loop:
    """A timed loop of k tokens from a state restored (outside the clock) when the cache would overflow."""

    def __init__(self, restore, run, capacity):
        self.restore, self.body, self.capacity = restore, run, capacity
        self.ctx, self.used = restore(), 0

    def run(self, k: int) -> float:
        if self.used + k > self.capacity:
            self.ctx, self.used = self.restore(), 0
        t0 = time.perf_counter()
        self.ctx = self.body(self.ctx, k)
        dt = time.perf_counter() - t0
        self.used += k
        return dt


COMPILES = [0]  # XLA compilations in this process so far


STAGES = {"/jax/core/compile/jaxpr_trace_duration": "trace", "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
          "/jax/core/compile/backend_compile_duration": "xla"}
STAGE_S = dict.fromkeys(STAGES.values(), 0.0)  # seconds in each compile stage in this process so far


def _count_compiles(event: str, duration: float, **kw) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        COMPILES[0] += 1
    if event in STAGES:
        STAGE_S[STAGES[event]] += duration


jax.monitoring.register_event_duration_secs_listener(_count_compiles)


def interleaved(impls: dict, k: int, reps: int, discarded: dict | None = None) -> dict:
    """Medians of `reps` interleaved timed runs of k tokens each. A run during which anything was
    compiled is not counted but run again (at most `reps` times more per implementation), and
    counted in `discarded`: a `Session` compiles its second kernel form (for steps dispatched
    while earlier ones are unchecked) only when that first happens, which may be many steps in."""
    for impl in impls.values():  # warm-up: compiles and first-call paths
        impl.run(k)
        impl.run(k)
    times = {n: [] for n in impls}
    for _ in range(reps):
        for name, impl in impls.items():
            for _retry in range(reps + 1):
                before = COMPILES[0]
                dt = impl.run(k) / k
                if COMPILES[0] == before:
                    times[name].append(dt)
                    break
                if discarded is not None:
                    discarded[name] = discarded.get(name, 0) + 1
    return {n: statistics.median(ts) for n, ts in times.items()}


# ------------------------------------------------------------------ one case, in process


def bench(case: LlamaCase, model: Path, device, reps: int, cd_reps: int, scan_form: bool = True) -> dict:
    """(a)-(d) of one case in this process, after checking that both sides compute the same logits.
    `scan_form`: also time (b-scan) (the smoke test leaves it out: one compile fewer)."""
    dt_name = case.dtype
    P, N = case.prompt, case.gen
    prompt = prompt_tokens(case)
    prog = oi2jax.compile(str(case.graph), model=str(model), ops=["nn"], device=device)
    hw = LlamaJax.from_model(model, layers="unrolled", device=device)
    hws = LlamaJax.from_model(model, layers="scan", device=device) if scan_form else None
    put = hw.put
    pos_dev = [put(np.int32(p)) for p in range(case.max_positions)]  # (b)'s positions, on the device

    # the state after the prompt, both sides, through the step APIs (the executables timed below),
    # the logits of every prompt step compared (the scan-over-layers form: the first three)
    sess = prog.session()
    cache = hw.init_cache()
    c2 = hws.init_cache() if hws else None
    err = 0.0
    for t in range(P):
        tok, pos = np.int32(prompt[t]), np.int32(t)
        sess.step(token=tok)
        cache, hw_logits, hw_nxt = hw.step(hw.params, cache, tok, pos)
        err = max(err, rel(sess.read("logits"), hw_logits))
        if hws and t < 3:
            c2, l2, _ = hws.step(hws.params, c2, tok, pos)
            err = max(err, rel(l2, hw_logits))
    oi_next, hw_next = int(sess.read("next")), int(hw_nxt)
    snapshot = sess.values()  # host values: every session below starts from a copy of them
    hw_snapshot = jax.tree.map(np.asarray, cache)
    del sess, cache, c2
    tol = TOL[dt_name]
    assert err <= tol, f"{case.name}: oi2jax and hand-written logits differ: {err:.3g} > {tol}"

    capacity = case.max_positions - P
    k = min(STEP_CHUNK, capacity)

    # (a) Session.step loop feeding `next` back as the device array it returns
    first_tok = jax.device_put(np.int32(oi_next), prog.device) if prog.device is not None else jnp.asarray(
        np.int32(oi_next))

    def a_restore():
        s = prog.session(state=snapshot)
        block(s.state)
        return s, first_tok

    def a_run(ctx, k):
        s, tok = ctx
        for _ in range(k):
            tok = s.step(token=tok)["next"]
        s.check()
        block(tok)
        return s, tok

    # (b) hand-written jitted step (unrolled, and the scan-over-layers form)
    def b_restore_for(m):
        def restore():
            return block(m.put(hw_snapshot)), put(np.int32(hw_next)), P
        return restore

    def b_run_for(m):
        step, params = m.step, m.params

        def run(ctx, k):
            c, tok, pos = ctx
            for i in range(k):
                c, _, tok = step(params, c, tok, pos_dev[pos + i])
            block(tok)
            return c, tok, pos + k
        return run

    loops = {"a": Loop(a_restore, a_run, capacity), "b": Loop(b_restore_for(hw), b_run_for(hw), capacity)}
    if hws:
        loops["b_scan"] = Loop(b_restore_for(hws), b_run_for(hws), capacity)
    discarded = {}
    ab = interleaved(loops, k, reps, discarded)

    # (c) fused generation through Session.run, (d) the hand-written donated scan
    tok1 = np.array([oi_next], np.int32)
    gen = {}

    class C:
        @staticmethod
        def run(_k):
            s = prog.session(state=snapshot)
            block(s.state)
            t0 = time.perf_counter()
            res = s.run({"token": tok1}, steps=N, feedback={"token": "next"}, collect=("next",))
            dt = time.perf_counter() - t0
            gen["c"] = res["next"]
            return dt * _k / N

    hw_tok1 = np.array([hw_next], np.int32)

    class Dd:
        @staticmethod
        def run(_k):
            c = block(hw.put(hw_snapshot))
            t0 = time.perf_counter()
            _, toks, _ = hw.generate(hw.params, c, hw_tok1, N, pos_dev[P])
            toks = np.asarray(toks)
            dt = time.perf_counter() - t0
            gen["d"] = toks
            return dt * _k / N

    cd = interleaved({"c": C, "d": Dd}, N, cd_reps, discarded)
    same_tokens = np.asarray(gen["c"]).tolist() == np.asarray(gen["d"]).tolist()
    weight_bytes = hw.weight_bytes()
    rate = copy_rate(device or jax.devices()[0])
    res = dict(name=case.name, sizes=case.sizes(), prompt=P, gen=N, rel_err=err,
               same_tokens=same_tokens, a_s=ab["a"], b_s=ab["b"], b_scan_s=ab.get("b_scan", float("nan")), c_s=cd["c"], d_s=cd["d"],
               discarded=discarded, weight_bytes=weight_bytes, copy_rate=rate, floor_s=weight_bytes / rate)
    res["a/b"] = res["a_s"] / res["b_s"]
    res["c/d"] = res["c_s"] / res["d_s"]
    res["c/floor"] = res["c_s"] / res["floor_s"]
    return res


# ------------------------------------------------------------------ fresh processes: TTFT, memory


def _proc_status(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return None


def _rss_start() -> tuple[int, str]:
    """The process's resident set now, its high-water mark reset to it (Linux: clear_refs 5),
    else the max RSS so far (then only growth beyond every earlier peak counts)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        rss = _proc_status("VmRSS")
        if rss is not None:
            return rss, "VmHWM"
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "ru_maxrss"


def _rss_peak(how: str) -> int:
    if how == "VmHWM":
        return _proc_status("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(side: str, case: LlamaCase, model: Path, device_kind: str | None) -> dict:
    """One side in a fresh process: TTFT, then prompt + N tokens fused; peak memory throughout."""
    device = jax.devices(device_kind)[0] if device_kind else jax.devices()[0]
    # warm JAX and oi2jax on a trivial program: no side pays for first-use costs of the libraries
    warm = oi2jax.compile(str(EXAMPLES / "mlp_regression.oi"), model=str(EXAMPLES / "mlp_regression.oinf"),
                          device=device)
    warm.session().run(dict(warm.defaults), steps=1)
    block(jax.jit(lambda v: v + 1)(jax.device_put(np.ones(4, np.float32), device)))
    del warm
    prompt = prompt_tokens(case)
    stats = device.memory_stats() or {}
    base_dev = stats.get("bytes_in_use")
    base_rss, rss_how = _rss_start()
    stages0 = dict(STAGE_S)
    t0 = time.perf_counter()
    if side == "oi2jax":
        prog = oi2jax.compile(str(case.graph), model=str(model), ops=["nn"], device=device)
        sess = prog.session()
        sess.step(token=np.int32(prompt[0]))
        logits = sess.read("logits")
        ttft = time.perf_counter() - t0
        split = {k: STAGE_S[k] - stages0[k] for k in STAGE_S}
        t1 = time.perf_counter()
        res = sess.run({"token": prompt[1:]}, steps=case.prompt - 1 + case.gen, feedback={"token": "next"},
                       collect=("next",))
        toks = res["next"]
        run_s = time.perf_counter() - t1
    else:
        m = LlamaJax.from_model(model, layers="unrolled", device=device)
        cache = m.init_cache()
        cache, logits, _ = m.step(m.params, cache, np.int32(prompt[0]), np.int32(0))
        logits = np.asarray(logits)
        ttft = time.perf_counter() - t0
        split = {k: STAGE_S[k] - stages0[k] for k in STAGE_S}
        t1 = time.perf_counter()
        cache, toks, _ = m.generate(m.params, cache, prompt[1:], case.prompt - 1 + case.gen, np.int32(1))
        toks = np.asarray(toks)
        run_s = time.perf_counter() - t1
    stats = device.memory_stats() or {}
    if base_dev is not None and "peak_bytes_in_use" in stats:
        peak, how = stats["peak_bytes_in_use"] - base_dev, "device peak_bytes_in_use"
    else:
        peak = _rss_peak(rss_how) - base_rss
        how = "peak RSS growth (VmHWM reset at the start)" if rss_how == "VmHWM" else "max RSS growth"
    split["rest"] = ttft - sum(split.values())  # reading and placing the weights, dispatch, the step itself
    # the same run again from where it ended (compiled now; the positions go on), where T holds
    # both: its seconds are the steady per-step cost of a fresh process's program (tools/gpu_probe.py)
    run2_s = None
    if 2 * (case.prompt + case.gen) <= case.max_positions:
        t1 = time.perf_counter()
        if side == "oi2jax":
            sess.run({"token": prompt[1:]}, steps=case.prompt - 1 + case.gen, feedback={"token": "next"},
                     collect=("next",))
        else:
            block(m.generate(m.params, cache, prompt[1:], case.prompt - 1 + case.gen, np.int32(case.prompt + case.gen)))
        run2_s = time.perf_counter() - t1
    return dict(side=side, ttft_s=ttft, ttft_split_s=split, run_s=run_s, run2_s=run2_s, peak_bytes=int(peak), mem_method=how, logits0=float(np.max(np.abs(logits))),
                last_tokens=np.asarray(toks)[-4:].tolist())


def fresh_process(side: str, case: LlamaCase, model: Path, device_kind: str | None) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.llama", "--worker", side, "--model", str(model),
           "--case", json.dumps(asdict(case))]
    if device_kind:
        cmd += ["--device", device_kind]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{side} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fresh(case: LlamaCase, model: Path, device_kind: str | None, repeats: int) -> dict:
    runs = {"oi2jax": [], "hand": []}
    for _ in range(repeats):  # alternating, so load changes hit both
        for side in runs:
            runs[side].append(fresh_process(side, case, model, device_kind))
    out = {}
    for side, rs in runs.items():
        out[f"ttft_{side}_s"] = statistics.median(r["ttft_s"] for r in rs)
        out[f"peak_{side}_bytes"] = statistics.median(r["peak_bytes"] for r in rs)
        out[f"ttft_split_{side}_s"] = {k: statistics.median(r["ttft_split_s"][k] for r in rs)
                                       for k in rs[0]["ttft_split_s"]}
    out["mem_method"] = runs["oi2jax"][0]["mem_method"]
    out["ttft_ratio"] = out["ttft_oi2jax_s"] / out["ttft_hand_s"]
    out["mem_ratio"] = out["peak_oi2jax_bytes"] / max(out["peak_hand_bytes"], 1)
    out["fresh_tokens_equal"] = runs["oi2jax"][0]["last_tokens"] == runs["hand"][0]["last_tokens"]
    out["fresh_repeats"] = repeats
    return out


# ------------------------------------------------------------------ report


def fmt_t(s: float) -> str:
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= f:
            return f"{s / f:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def fmt_b(n: float) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= f:
            return f"{n / f:.3g} {unit}"
    return f"{n:.0f} B"


def mark(v: float, t: float) -> str:
    return f"**{v:.2f}**" if v > t else f"{v:.2f}"


def report(results: list[dict], skipped: list[str], meta: dict) -> str:
    lines = ["# Llama decode benchmark (issue 31)", "",
             f"Machine: {meta['machine']}; device: {meta['device']}; JAX {meta['jax']}; profile {meta['profile']}; "
             f"load average {meta['load_before']:.1f} before, {meta['load_after']:.1f} after.",
             "examples/llama_decode.oi (`--ops nn`) against benchmarks/handwritten/llama.py (same math, same `.oinf`,",
             "f32 matmuls at HIGHEST), a random checkpoint converted with convert-hf. Per token after the prompt,",
             "medians of interleaved runs in one process: (a) `Session.step(token=next)` loop (the `next` it returned",
             "fed back as a device array: no host read per step); (b) hand-written `jax.jit` step, cache donated,",
             "layers unrolled ((b-scan): layers as a `lax.scan` over stacked weights); (c) `Session.run(..., feedback=",
             "{\"token\": \"next\"}, collect=(\"next\",))` of N tokens (result on the host); (d) hand-written donated",
             "`lax.scan` of N tokens (tokens on the host). TTFT (compile and load included) and peak memory: medians",
             "of fresh processes per side (see benchmarks/llama.py). Floor: weight bytes / device copy rate.",
             f"Targets: a/b <= {TARGETS['a/b']}, c/d <= {TARGETS['c/d']}, TTFT <= {TARGETS['ttft']}x, "
             f"peak memory <= {TARGETS['mem']}x, (c) <= {TARGETS['c/floor']}x the floor on a GPU.", "",
             "| case | prompt / N | (a) step | (b) jit step | (b-scan) | (c) fused | (d) scan | a/b | c/d | "
             "b-scan/b | floor | c/floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['name']} ({r['sizes']}) | {r['prompt']} / {r['gen']} | {fmt_t(r['a_s'])} | "
                     f"{fmt_t(r['b_s'])} | {fmt_t(r['b_scan_s'])} | {fmt_t(r['c_s'])} | {fmt_t(r['d_s'])} | "
                     f"{mark(r['a/b'], TARGETS['a/b'])} | {mark(r['c/d'], TARGETS['c/d'])} | "
                     f"{r['b_scan_s'] / r['b_s']:.2f} | {fmt_t(r['floor_s'])} | "
                     + (mark(r['c/floor'], TARGETS['c/floor']) if meta["gpu"] else f"({r['c/floor']:.2f})") + " |")
    if any("ttft_ratio" in r for r in results):
        lines += ["", "| case | TTFT oi2jax | TTFT hand | ratio | peak oi2jax | peak hand | ratio | memory method |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in results:
            if "ttft_ratio" in r:
                lines.append(f"| {r['name']} | {fmt_t(r['ttft_oi2jax_s'])} | {fmt_t(r['ttft_hand_s'])} | "
                             f"{mark(r['ttft_ratio'], TARGETS['ttft'])} | {fmt_b(r['peak_oi2jax_bytes'])} | "
                             f"{fmt_b(r['peak_hand_bytes'])} | {mark(r['mem_ratio'], TARGETS['mem'])} | "
                             f"{r['mem_method']} ({r['fresh_repeats']} runs each) |")
        lines += ["", "Where the time to first token goes (JAX's compile events, summed; the rest: reading and "
                  "placing the weights, dispatch and the step): " + "; ".join(
                      f"{r['name']}: " + ", ".join(
                          f"{side} " + " + ".join(f"{k} {v:.2f}" for k, v in r[f"ttft_split_{side}_s"].items()) + " s"
                          for side in ("oi2jax", "hand"))
                      for r in results if "ttft_split_oi2jax_s" in r) + "."]
    lines += ["", "Bold: outside its target. Checked before timing: the logits of every prompt step "
              "within " + ", ".join(f"{v:g} ({k})" for k, v in TOL.items()) + " of the largest |logit|: " +
              "; ".join(f"{r['name']} {r['rel_err']:.2g}" for r in results) + ". Generated tokens (c) == (d): " +
              "; ".join(f"{r['name']} {'yes' if r['same_tokens'] else 'NO'}" for r in results) + "."]
    for r in results:
        if r["discarded"]:
            lines.append(f"{r['name']}: timed runs that compiled something (not counted, run again): " +
                         ", ".join(f"({k}) {v}" for k, v in sorted(r["discarded"].items())) + ".")
    if not meta["gpu"]:
        lines.append("On a CPU the floor (weights / copy rate of a 64 MiB buffer) is for reference only: weights "
                     "that fit in the caches beat it; c/floor's target applies on a GPU.")
    lines += [f"Skipped: {s}" for s in skipped]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small model (well under a minute)")
    ap.add_argument("--tiny", action="store_true", help="a tiny model, no fresh processes (smoke test)")
    ap.add_argument("--device", default=None, help="cpu or gpu (default: JAX's default device)")
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                    help="the --tiny / --quick model's dtype (bf16: examples/llama_decode_bf16.oi)")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--worker", choices=("oi2jax", "hand"), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, LlamaCase(**json.loads(args.case)), Path(args.model), args.device)))
        return 0
    profile = "tiny" if args.tiny else "quick" if args.quick else "full"
    reps, cd_reps, repeats = {"tiny": (2, 2, 0), "quick": (9, 5, 1), "full": (15, 7, 3)}[profile]
    device = jax.devices(args.device)[0] if args.device else None
    dev = device or jax.devices()[0]
    gpu = dev.platform == "gpu"
    results, skipped = [], []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for case in case_list(profile, gpu, args.dtype):
            if not case.graph.exists():
                line = f"{case.name} ({case.sizes()}): {case.graph.relative_to(REPO)} does not exist"
                print("SKIPPED " + line, flush=True)
                skipped.append(line)
                continue
            t0 = time.perf_counter()
            model = make_model(case, Path(tmp))
            r = bench(case, model, device, reps, cd_reps)
            if repeats:
                r.update(fresh(case, model, args.device, repeats))
            r["wall_s"] = time.perf_counter() - t0
            print(f"{r['name']}: a/b {r['a/b']:.2f}  c/d {r['c/d']:.2f}  c/floor {r['c/floor']:.2f}"
                  + (f"  ttft {r['ttft_ratio']:.2f}  mem {r['mem_ratio']:.2f}" if repeats else "")
                  + f"  ({r['wall_s']:.0f} s)", flush=True)
            results.append(r)
    meta = dict(machine=f"{platform.machine()} {platform.processor() or ''} ({os.cpu_count()} cpus)",
                device=str(dev), jax=jax.__version__, profile=profile + ("-gpu" if gpu else ""), gpu=gpu,
                load_before=load_before, load_after=os.getloadavg()[0])
    text = report(results, skipped, meta)
    if profile == "tiny":
        print(text)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "llama" + ("-gpu" if gpu else "") + ("-quick" if profile == "quick" else "") + \
        ("-bf16" if args.dtype != "f32" else "")
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": results, "skipped": skipped}, indent=1))
    print(f"wrote {out / stem}.md", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
