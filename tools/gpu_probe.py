"""Two questions the H200 run of 2026-11-28 left open, each answered in fresh processes under
several settings (run by tools/gpu_session.sh's `probe`; prints one line per run):

`int-matmul`: the SPEC's `quantized_linear` example (an i4 x i4 -> i32 `matmul`: an s8 x s8 -> s32
  dot on the device) returned exactly twice the product on an H200 in a suite run with
  `XLA_PYTHON_CLIENT_ALLOCATOR=platform`; earlier suite runs with JAX's own allocator passed it.
  Each run computes the dot three times, as jnp.matmul and through oi2jax, against NumPy.

`ttft`: the TinyLlama-shaped bf16 decode step took 13.1 s of XLA:GPU compile in oi2jax and 2.7 s
  hand-written (benchmarks/llama.py's split). Runs each side's first token with XLA's autotuning on
  and off, and oi2jax's with its layer loop rolled (`unroll="none"`: one body to compile; the
  hand-written's `lax.scan` form ran 0.86x its unrolled step there), and counts the optimized
  module's fusions and gemm kinds (a fusion that differs per layer is compiled, and a gemm
  autotuned, once per layer). Every run dumps its HLO while compiling, which adds to both sides'
  compile times alike: compare the variants with each other, not with benchmarks/llama.py.

`step`: `Session.step` cost the host 0.55 ms a step more than a jitted step on the H200 (the quick
  model: 819 against 270 µs; about 90 µs on a CPU). Times the hot path as it is, then with the
  outcome reads taken out (no readiness polls, no flag reads), and one read and one readiness check.

python tools/gpu_probe.py int-matmul | ttft | step [--work DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENVS = {
    "int-matmul": {"default": {}, "platform allocator": {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
                   "no preallocation": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
                   "platform, no triton gemm": {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform",
                                                "XLA_FLAGS": "--xla_gpu_enable_triton_gemm=false"},
                   "platform, no cublaslt": {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform",
                                             "XLA_FLAGS": "--xla_gpu_enable_cublaslt=false"}},
    "ttft": {"autotune on": {}, "autotune off": {"XLA_FLAGS": "--xla_gpu_autotune_level=0"},
             "layers rolled": {"PROBE_UNROLL": "none"}},
    "step": {"default": {}},
}


def int_matmul_child() -> dict:
    import jax.numpy as jnp
    import numpy as np
    import oi2jax
    rng = np.random.default_rng(0)
    x = rng.integers(-8, 8, (4, 16)).astype(np.int8)
    w = rng.integers(-8, 8, (16, 8)).astype(np.int8)
    want = x.astype(np.int64) @ w.astype(np.int64)
    ratios = []
    for _ in range(3):
        got = np.asarray(jnp.matmul(jnp.asarray(x), jnp.asarray(w), preferred_element_type=jnp.int32))
        ratios.append("ok" if np.array_equal(got, want) else f"x{np.round(got / np.where(want == 0, 1, want)).max():g}")
    src = "constant { x: i4[4, 16]; w: i4[16, 8]; }\nvolatile { y: i32[4, 8]; }\n" \
          "block entry {\n  op matmul(x, w, acc=i32) >> y;\n  return;\n}\n"
    with tempfile.TemporaryDirectory() as tmp:
        from oi2jax.model.writer import Tensor, save
        save(Path(tmp) / "m.oinf", tensors={"x": Tensor("i4", x), "w": Tensor("i4", w)})
        prog = oi2jax.compile(src, model=Path(tmp) / "m.oinf")
        for _ in range(3):
            got = prog.run({}, steps=1)["y"]
            ratios.append("ok" if np.array_equal(got, want) else
                          f"x{np.round(got / np.where(want == 0, 1, want)).max():g}")
    return {"jnp.matmul x3, oi2jax x3": ratios}


def the_case():
    """The TinyLlama-shaped bf16 case of benchmarks/llama.py (PROBE_CASE=quick: its small one, to try
    this script on a CPU)."""
    from benchmarks import llama as L
    cases = L.case_list("quick", True, "bf16")
    return cases[0] if os.environ.get("PROBE_CASE") == "quick" else cases[-1]


def ttft_child(side: str, model: str) -> dict:
    import functools
    import oi2jax
    from benchmarks import llama as L
    case = the_case()
    if os.environ.get("PROBE_UNROLL"):  # the oi2jax side with another layer-loop policy
        L.oi2jax.compile = functools.partial(oi2jax.compile, unroll=os.environ["PROBE_UNROLL"])
    r = L.worker(side, case, Path(model), None)
    steps = case.prompt - 1 + case.gen
    out = {"ttft_s": round(r["ttft_s"], 2), **{k: round(v, 2) for k, v in r["ttft_split_s"].items()},
           "fused ms/step, first call": round(r["run_s"] / steps * 1e3, 3),
           "fused ms/step, second call": r["run2_s"] and round(r["run2_s"] / steps * 1e3, 3)}
    dump = os.environ.get("PROBE_DUMP")
    if dump:
        mods = sorted(Path(dump).glob("*after_optimizations.txt"), key=lambda p: p.stat().st_size)
        if mods:
            text = mods[-1].read_text()  # the largest module: the step
            out["fusions"] = len(re.findall(r"^\s*\S+ = \S+ fusion\(", text, re.M))
            out["triton gemms"] = text.count('"kind":"__triton_gemm"')
            out["cublas gemms"] = len(re.findall(r'custom_call_target="__cublas\$(?:lt\$)?matmul|__cublas\$gemm', text))
            out["distinct fused computations"] = len(set(re.findall(r"calls=(%?[\w.]+)", text)))
    return out


def step_child() -> dict:
    import jax
    import numpy as np
    import oi2jax
    from benchmarks import llama as L
    from oi2jax.runtime.session import DeviceOutcomes
    case = L.case_list("quick", True, "f32")[0]
    model = L.make_model(case, Path(tempfile.mkdtemp()))
    prog = oi2jax.compile(str(case.graph), model=str(model), ops=["nn"])
    out = {}

    class NeverReady(DeviceOutcomes):
        @staticmethod
        def ready(flags) -> bool:
            return False

    for name, kwargs, outcomes in (("as it is", {}, None), ("no outcome reads", {"max_unchecked": 10**6}, NeverReady()),
                                   ("as it is, again", {}, None)):
        sess = prog.session(**kwargs)
        if outcomes is not None:
            sess.outcomes = outcomes
        tok = sess.step(token=np.int32(1))["next"]
        for _ in range(20):
            tok = sess.step(token=tok)["next"]
        jax.block_until_ready(tok)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(50):
                tok = sess.step(token=tok)["next"]
            jax.block_until_ready(tok)
            times.append((time.perf_counter() - t0) / 50 * 1e6)
        out[f"{name} us/step"] = sorted(round(t) for t in times)
        flags = sess._flags  # noqa: SLF001 (the probe reads the session's own)
        sess.check()
    t0 = time.perf_counter()
    for _ in range(200):
        DeviceOutcomes.read(flags)
    out["one flags read us"] = round((time.perf_counter() - t0) / 200 * 1e6, 1)
    t0 = time.perf_counter()
    for _ in range(200):
        flags.is_ready()
    out["one readiness check us"] = round((time.perf_counter() - t0) / 200 * 1e6, 1)
    return out


def run_child(args: list[str], env: dict) -> str:
    full = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **env)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=full, timeout=300)
    except subprocess.TimeoutExpired:
        return f"({time.perf_counter() - t0:.0f} s) timed out"
    tail = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr[-600:]}"
    return f"({time.perf_counter() - t0:.0f} s) {tail}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("int-matmul", "ttft", "step"))
    ap.add_argument("--child", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    if a.child:
        child = {"int-matmul": int_matmul_child, "step": step_child}.get(a.what)
        print(json.dumps(child() if child else ttft_child(a.child, a.model)))
        return 0
    if a.what in ("int-matmul", "step"):
        for name, env in ENVS[a.what].items():
            print(f"{a.what}, {name}: {run_child([a.what, '--child', 'x'], env)}", flush=True)
        return 0
    from benchmarks import llama as L
    work = Path(a.work or tempfile.mkdtemp())
    work.mkdir(parents=True, exist_ok=True)
    case = the_case()
    model = work / f"{case.name}.oinf"
    if not model.exists():
        t0 = time.perf_counter()
        model = L.make_model(case, work)
        print(f"model written in {time.perf_counter() - t0:.0f} s", flush=True)
    for name, env in ENVS["ttft"].items():
        for side in ("oi2jax", "hand") if "PROBE_UNROLL" not in env else ("oi2jax",):
            dump = tempfile.mkdtemp()
            env2 = dict(env, PROBE_DUMP=dump, XLA_FLAGS=(env.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}"
                                                          " --xla_dump_hlo_as_text").strip())
            print(f"ttft, {name}, {side}: {run_child(['ttft', '--child', side, '--model', str(model)], env2)}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
