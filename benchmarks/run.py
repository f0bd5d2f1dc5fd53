"""The oi2jax benchmark harness (GitHub issue 8): `python -m benchmarks [--quick] [--device gpu]`.

For every case (an example scaled up, benchmarks/cases.py), in ONE process, median of N
timed runs after warm-up, each run a loop of k steps ended by block_until_ready:

  (a)  oi2jax compiled: `Program.step` in a loop (state donated)
  (a0) the same jitted function called directly (`Program.executable.jit_step`, inside its x64 scope): the
       step without `Program.step`'s Python wrapper, to split host overhead from device time
  (b)  the model written by hand as idiomatic jax.jit code (benchmarks/handwritten/)
  (c)  the reference interpreter (`oi2jax.compile(..., mode="interpret").run`, per step)
  (d)  op-by-op eager JAX: the hand-written step under `jax.disable_jit()`
  (e)  time to first result: oi2jax parse + check + bind + lower + XLA compile + first step,
       against the hand-written model's load + first (compiling) call
  (f)  streaming_pipeline with yield_mode="driver" against "fused"

(a), (a0) and (b) are measured interleaved (same k, alternating runs) so that machine noise
hits them alike. Recompiles: `Program.compiles` after all the steps of a fixed-shape graph,
and for n steps of a graph writing an unfixed `@table` at an incrementing index.

Writes results/<results|results-quick>.{md,json} and chart[-quick].png. Targets are reported,
never asserted (tests/test_benchmarks_smoke.py checks values only).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import oi2jax  # noqa: E402
from oi2jax.model import open_model, save  # noqa: E402

from benchmarks import handwritten  # noqa: E402
from benchmarks.cases import GROWTH_SOURCE, Case, cases  # noqa: E402

WARM_SOURCE = """dynamic { x: f32[4]; }
volatile { y: f32[4]; }
block entry {
    op relu(x, alpha=0.0) >> y;
    return;
}
"""
TARGETS = {"a/b": 1.05, "c/a (looped)": 10.0, "e": 1.5}
PROFILES = {  # seconds of timed runs per measurement, and growth sizes
    "full": dict(budget=1.0, slow_budget=1.5, growth=(100, 1000, 10000), min_reps=5),
    "quick": dict(budget=0.25, slow_budget=0.4, growth=(100, 1000, 10000), min_reps=3),
    "tiny": dict(budget=0.0, slow_budget=0.0, growth=(10, 100), min_reps=1),
}


def block(tree):
    return jax.block_until_ready(tree)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


class Timed:
    """A measured implementation: `run(k)` -> seconds for k steps (state handled inside)."""

    def __init__(self, step_fn, init_state, inputs, max_steps):
        self.step_fn, self.init_state, self.inputs, self.max_steps = step_fn, init_state, inputs, max_steps
        self.state = init_state()
        self.used = 0

    def run(self, k: int) -> float:
        if self.used + k > self.max_steps:  # a bounded table: start again from a fresh state
            self.state = block(self.init_state())
            self.used = 0
        state, inputs, step = self.state, self.inputs, self.step_fn
        t0 = time.perf_counter()
        for _ in range(k):
            state, out = step(state, **inputs)
        block((state, out))
        dt = time.perf_counter() - t0
        self.state = state
        self.used += k
        return dt


def choose_k(t1: float, max_k: int, per_run: float = 0.02) -> int:
    return max(1, min(max_k, int(per_run / max(t1, 1e-7))))


def interleaved(impls: dict, max_k: int, budget: float, min_reps: int, max_reps: int = 60) -> dict:
    """Median seconds/step of each implementation, runs alternating between them."""
    for impl in impls.values():
        impl.run(1)
        impl.run(1)  # warm-up (the first call compiles, the second sees donated buffers)
    t1 = max(impl.run(1) for impl in impls.values())
    k = choose_k(t1, max_k)
    reps = max(min_reps, min(max_reps, int(budget / max(k * t1 * len(impls), 1e-9))))
    times = {name: [] for name in impls}
    for _ in range(reps):
        for name, impl in impls.items():
            times[name].append(impl.run(k) / k)
    return {name: dict(median=statistics.median(ts), reps=reps, k=k, min=min(ts)) for name, ts in times.items()}


def single(run_k, max_k: int, budget: float, min_reps: int, max_reps: int = 30) -> dict:
    run_k(1)
    t1 = run_k(1)
    k = choose_k(t1, max_k, per_run=0.05)
    reps = max(min_reps, min(max_reps, int(budget / max(k * t1, 1e-9))))
    ts = [run_k(k) / k for _ in range(reps)]
    return dict(median=statistics.median(ts), reps=reps, k=k, min=min(ts))


def max_diff(a: dict, b: dict) -> float:
    worst = 0.0
    for name, value in b.items():
        x, y = np.asarray(a[name]), np.asarray(value)
        if x.shape != y.shape:
            return float("inf")
        if x.size:
            worst = max(worst, float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))))
    return worst


def bench_case(case: Case, workdir: Path, device, prof: dict, do_slow: bool = True) -> dict:
    oi_path = workdir / f"{slug(case.name)}.oi"
    oinf_path = workdir / f"{slug(case.name)}.oinf"
    oi_path.write_text(case.source())
    save(str(oinf_path), sizevars=case.sizes, metadata={}, tensors=case.tensors())
    inputs = case.inputs()
    res = dict(name=case.name, example=case.example, sizes=case.sizes, static=case.static, params=case.params(),
               looped=case.looped, chart=case.chart, size=case.size)

    # (e) time to first result: everything from the files on disk to the first step's values
    t0 = time.perf_counter()
    ops = list(case.ops) or None
    prog = oi2jax.compile(str(oi_path), model=str(oinf_path), device=device, yield_mode=case.yield_mode, ops=ops)
    t_build = time.perf_counter() - t0
    state, out = prog.step(prog.init_state(), **inputs)
    block((state, out))
    res["ttfr_oi2jax"] = time.perf_counter() - t0
    res["ttfr_oi2jax_build"] = t_build
    t0 = time.perf_counter()
    hw = handwritten.make(case.example, open_model(str(oinf_path)), device=device, **case.static)
    hstate, hout = hw.step(hw.init_state(), **inputs)
    block((hstate, hout))
    res["ttfr_handwritten"] = time.perf_counter() - t0
    res["e_ratio"] = res["ttfr_oi2jax"] / res["ttfr_handwritten"]
    del state, out, hstate, hout

    # correctness: same values, several steps (the smoke test asserts this)
    check_steps = min(3, case.steps)
    expected = hw.run(inputs, check_steps)
    res["max_abs_diff"] = max_diff(prog.run(inputs, check_steps), expected)
    res["compared"] = sorted(expected)

    # (a), (a0), (b): interleaved
    dev_inputs = hw.put(inputs)
    a = Timed(prog.step, prog.init_state, dev_inputs, case.steps)
    dyn = prog.dynamic_args(dev_inputs)

    def raw_step(state):
        return prog.executable.jit_step(prog.consts, state, dyn)

    def a0_run(k, a0=Timed(None, prog.init_state, {}, case.steps)):
        with prog.scope():
            a0.step_fn = lambda state: raw_step(state)
            return a0.run(k)

    class _A0:
        run = staticmethod(a0_run)

    b = Timed(hw.step, hw.init_state, dev_inputs, case.steps)
    t = interleaved({"a": a, "a0": _A0, "b": b}, case.steps, prof["budget"], prof["min_reps"])
    res.update({f"{n}_s": v["median"] for n, v in t.items()})
    res["reps_k"] = {n: (v["reps"], v["k"]) for n, v in t.items()}
    res["compiles"] = prog.compiles

    if do_slow:
        ip = oi2jax.compile(str(oi_path), model=str(oinf_path), mode="interpret", ops=ops)
        c = single(lambda k: _timed_interp(ip, inputs, k), min(case.steps, 8), prof["slow_budget"], prof["min_reps"])
        res["c_s"] = c["median"]
        d = Timed(hw.eager, hw.init_state, dev_inputs, case.steps)
        dd = single(d.run, min(case.steps, 32), prof["slow_budget"], prof["min_reps"])
        res["d_s"] = dd["median"]
        res["reps_k"].update(c=(c["reps"], c["k"]), d=(dd["reps"], dd["k"]))

    if case.example == "streaming_pipeline":  # (f) the yield/await driver against fused mode
        progs = {m: oi2jax.compile(str(oi_path), model=str(oinf_path), device=device, yield_mode=m, ops=ops)
                 for m in ("driver", "fused")}
        res["driver_max_abs_diff"] = max_diff(progs["driver"].run(inputs, check_steps),
                                              progs["fused"].run(inputs, check_steps))
        f = interleaved({m: Timed(p.step, p.init_state, dev_inputs, case.steps) for m, p in progs.items()},
                        case.steps, prof["budget"], prof["min_reps"])
        res["driver_s"], res["fused_s"] = f["driver"]["median"], f["fused"]["median"]
        res["driver_compiles"] = progs["driver"].compiles
    res["a/b"] = res["a_s"] / res["b_s"]
    res["a0/b"] = res["a0_s"] / res["b_s"]
    if "c_s" in res:
        res["c/a"] = res["c_s"] / res["a_s"]
        res["d/a"] = res["d_s"] / res["a_s"]
    return res


def _timed_interp(ip, inputs, k):
    t0 = time.perf_counter()
    ip.run(inputs, steps=k)
    return time.perf_counter() - t0


def bench_growth(workdir: Path, device, ns) -> list[dict]:
    """Compiles of an auto-grown table written at t = 0, 1, ..., n-1 (capacity doubling)."""
    path = workdir / "growable_table.oinf"
    d = 16
    save(str(path), sizevars={"D": d}, metadata={}, tensors={})
    x = np.arange(d, dtype=np.float32)
    out = []
    for n in ns:
        prog = oi2jax.compile(GROWTH_SOURCE, model=str(path), device=device)
        t0 = time.perf_counter()
        result = prog.run({"x": x}, steps=n)
        wall = time.perf_counter() - t0
        ok = result["A"].shape == (n, d) and int(result["t"]) == n and bool(np.all(result["A"] == x))
        out.append(dict(n=n, compiles=prog.compiles, log2n=float(np.log2(n)), seconds=wall,
                        per_step_s=wall / n, values_ok=ok))
    return out


def bench_fixed_recompiles(workdir: Path, device, steps: int) -> dict:
    """A fixed-shape stateful graph (kv decode) for `steps` steps via Program.run: compiles == 1."""
    case = Case("kv", "kv_cache_decode", {"D": 8}, static={"rows": steps})
    (workdir / "kv_fixed.oi").write_text(case.source())
    save(str(workdir / "kv_fixed.oinf"), sizevars=case.sizes, metadata={}, tensors=case.tensors())
    prog = oi2jax.compile(str(workdir / "kv_fixed.oi"), model=str(workdir / "kv_fixed.oinf"), device=device)
    prog.run(case.inputs(), steps=steps)
    return dict(graph="kv_cache_decode (fixed table)", steps=steps, compiles=prog.compiles)


# ------------------------------------------------------------------------------------ report

def fmt_t(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= f:
            return f"{s / f:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def fmt_r(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}"


def misses(results: dict) -> list[str]:
    out = []
    for r in results["cases"]:
        if r["a/b"] > TARGETS["a/b"]:
            out.append(f"a/b = {r['a/b']:.2f} > 1.05 on `{r['name']}` "
                       f"(wrapper-free a0/b = {r['a0/b']:.2f}; a - b = {fmt_t(r['a_s'] - r['b_s'])}/step)")
        if r["looped"] and "c/a" in r and r["c/a"] < TARGETS["c/a (looped)"]:
            out.append(f"c/a = {r['c/a']:.1f} < 10 on looped `{r['name']}`")
        if r["e_ratio"] > TARGETS["e"]:
            out.append(f"time to first result {fmt_t(r['ttfr_oi2jax'])} = {r['e_ratio']:.2f}x the hand-written "
                       f"{fmt_t(r['ttfr_handwritten'])} (> 1.5x) on `{r['name']}`")
    return out


def markdown(results: dict) -> str:
    env = results["env"]
    lines = [f"# oi2jax benchmarks ({results['profile']})", "",
             f"`python -m benchmarks{' --quick' if results['profile'] == 'quick' else ''}` on {env['device']} "
             f"({env['cpus']} CPUs, {env['platform']}), jax {env['jax']}, total {results['seconds']:.0f} s. "
             "Times are medians per step after warm-up; see benchmarks/README.md for the method.", "",
             "(a) oi2jax `Program.step` · (a0) its jitted function without the Python wrapper · "
             "(b) hand-written `jax.jit` · (c) reference interpreter · (d) op-by-op eager JAX · "
             "(e) time to first result, oi2jax vs hand-written", "",
             "| case | params | (a) | (a0) | (b) | a/b | a0/b | (c) | c/a | (d) | d/a | (e) oi2jax | (e) hand | e ratio | compiles | max abs diff |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results["cases"]:
        lines.append(f"| {r['name']}{' (loop)' if r['looped'] else ''} | {r['params']:,} | {fmt_t(r['a_s'])} | "
                     f"{fmt_t(r['a0_s'])} | {fmt_t(r['b_s'])} | {fmt_r(r['a/b'])} | {fmt_r(r['a0/b'])} | "
                     f"{fmt_t(r.get('c_s'))} | {fmt_r(r.get('c/a'))} | {fmt_t(r.get('d_s'))} | {fmt_r(r.get('d/a'))} | "
                     f"{fmt_t(r['ttfr_oi2jax'])} | {fmt_t(r['ttfr_handwritten'])} | {fmt_r(r['e_ratio'])} | "
                     f"{r['compiles']} | {r['max_abs_diff']:.3g} |")
    ab = [r["a/b"] for r in results["cases"]]
    lines += ["", f"a/b: geometric mean {float(np.exp(np.mean(np.log(ab)))):.3f}, max {max(ab):.2f}."]
    f = [r for r in results["cases"] if "driver_s" in r]
    if f:
        lines += ["", "## (f) yield/await: driver vs fused (streaming_pipeline)", "",
                  "| case | driver | fused | driver/fused | max abs diff |", "|---|---:|---:|---:|---:|"]
        for r in f:
            lines.append(f"| {r['name']} | {fmt_t(r['driver_s'])} | {fmt_t(r['fused_s'])} | "
                         f"{r['driver_s'] / r['fused_s']:.2f} | {r['driver_max_abs_diff']:.3g} |")
    lines += ["", "## Recompiles", "",
              f"Fixed-shape graph: {results['fixed']['graph']}, {results['fixed']['steps']} steps through "
              f"`Program.run`: **{results['fixed']['compiles']} compile(s)**; every case above reports its "
              "`Program.compiles` after all its timed steps (the `compiles` column).", "",
              "Auto-grown `@table` (no `@fixed`) written at t = 0..n-1 (benchmarks/cases.py `GROWTH_SOURCE`):", "",
              "| n | compiles | log2 n | wall | per step | values ok |", "|---:|---:|---:|---:|---:|---|"]
    for g in results["growth"]:
        lines.append(f"| {g['n']:,} | {g['compiles']} | {g['log2n']:.1f} | {fmt_t(g['seconds'])} | "
                     f"{fmt_t(g['per_step_s'])} | {g['values_ok']} |")
    m = misses(results)
    lines += ["", "## Targets", "",
              "a/b <= 1.05 on every case; c/a >= 10 on looped models; e ratio <= 1.5 (reported, never asserted).", ""]
    lines += [f"- MISSED: {x}" for x in m] or ["- all met"]
    return "\n".join(lines) + "\n"


def chart(results: dict, path: Path) -> None:
    from benchmarks.png import loglog_chart
    pts = [r for r in results["cases"] if r.get("chart") == "mlp" and "c_s" in r]
    if len(pts) < 2:
        return
    series = {label: [(r["size"], r[key]) for r in pts] for label, key in
              (("(a) oi2jax compiled", "a_s"), ("(b) hand-written jit", "b_s"),
               ("(c) interpreter", "c_s"), ("(d) eager op-by-op", "d_s"))}
    loglog_chart(path, series, "mlp_regression b=64: step time vs width (d=h=o=w)", "width w")


def run_benchmarks(profile: str = "full", device=None, out_dir: Path | None = None, only: str | None = None,
                   log=print) -> dict:
    prof = PROFILES[profile]
    t_start = time.perf_counter()
    dev = oi2jax.runtime.program.resolve_device(device) if device else None
    # warm JAX itself so the first case's time to first result is not charged for backend start-up
    block(jax.jit(lambda v: v + 1)(np.zeros(4, np.float32)))
    # ... and import/warm oi2jax's own modules (parser, checker, lowering, interpreter) once, so
    # that no case's (e) is charged for one-time process start-up either
    for mode in ("compiled", "interpret"):
        oi2jax.compile(WARM_SOURCE, device=dev, mode=mode).run({"x": np.ones(4, np.float32)})
    results = dict(profile=profile, env=dict(
        device=str(dev or jax.devices()[0]), jax=jax.__version__, cpus=os.cpu_count(),
        platform=platform.platform(), python=platform.python_version()), cases=[])
    with tempfile.TemporaryDirectory(prefix="oi2jax-bench-") as tmp:
        work = Path(tmp)
        for case in cases(profile):
            if only and only not in case.name:
                continue
            t0 = time.perf_counter()
            r = bench_case(case, work, dev, prof)
            results["cases"].append(r)
            log(f"{case.name:45s} a={fmt_t(r['a_s']):>9} b={fmt_t(r['b_s']):>9} a/b={r['a/b']:.2f} "
                f"a0/b={r['a0/b']:.2f} c/a={fmt_r(r.get('c/a'))} d/a={fmt_r(r.get('d/a'))} "
                f"e={r['e_ratio']:.2f} compiles={r['compiles']} diff={r['max_abs_diff']:.2g} "
                f"[{time.perf_counter() - t0:.1f}s]")
        results["fixed"] = bench_fixed_recompiles(work, dev, 100 if profile == "tiny" else 1000)
        results["growth"] = bench_growth(work, dev, prof["growth"])
        for g in results["growth"]:
            log(f"growable table n={g['n']}: compiles={g['compiles']} ({fmt_t(g['seconds'])})")
    results["seconds"] = time.perf_counter() - t_start
    results["missed"] = misses(results)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        suffix = {"full": "", "quick": "-quick", "tiny": "-tiny"}[profile]
        (out_dir / f"results{suffix}.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
        (out_dir / f"results{suffix}.md").write_text(markdown(results))
        chart(results, out_dir / f"chart{suffix}.png")
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer runs (~2 minutes)")
    p.add_argument("--profile", choices=sorted(PROFILES), help="full (default) | quick | tiny")
    p.add_argument("--device", help="cpu | gpu | tpu (default: JAX's default device)")
    p.add_argument("--only", help="run only the cases whose name contains this text")
    p.add_argument("--out", type=Path, default=HERE / "results", help="output folder (default benchmarks/results)")
    args = p.parse_args(argv)
    profile = args.profile or ("quick" if args.quick else "full")
    res = run_benchmarks(profile, args.device, args.out, args.only)
    print(f"total {res['seconds']:.0f} s; wrote {args.out}")
    for m in res["missed"]:
        print("MISSED:", m)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
