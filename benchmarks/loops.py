"""Loop lowering policies (issue #32 item 4, docs/loops.md): `python -m benchmarks.loops [--quick]
[--device gpu] [--out DIR]`.

Per case and per `unroll` policy (none | 2 | 4 | full | auto), in ONE process:
  compile: `oi2jax.compile(...)` + trace + lower + XLA compile of the step (`prog.lower().compile()`),
           split into oi2jax+trace+lower and XLA compile;
  step:    `state, out = prog.step(state, **inputs)` with device-resident inputs, k steps then
           `block_until_ready`; the median over interleaved repetitions (every policy once per round,
           so load changes on a shared machine hit all alike);
  the loop structure of the optimized HLO (while loops, dynamic-slices) and a bit-for-bit check of the
  outputs against unroll=none.
Cases: residual_mlp_stack at its shipped sizes and at L=12 (D=32, D=512, D=1024, D=2048), and
benchmarks/graphs/kv_layers.oi (per-layer weights and K/V cache rows, attention-like reads of every slot).
Writes results/loops[-quick].md and .json (with the device it ran on).
"""
from __future__ import annotations

import argparse
import json
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
from oi2jax.model import save  # noqa: E402

EXAMPLES = HERE.parent / "examples"
POLICIES = ("none", 2, 4, "full", "auto")


def residual_case(workdir: Path, B: int, D: int, L: int, shipped: bool = False):
    graph = EXAMPLES / "residual_mlp_stack.oi"
    if shipped:
        return "residual_mlp_stack (shipped B=4 D=32 L=3)", graph, EXAMPLES / "residual_mlp_stack.oinf", \
            {"x": np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)}
    rng = np.random.default_rng(0)
    tensors = {"bias0": np.zeros(D, np.float32)}
    for l in range(L):
        tensors[f"res.mlp.w.{l}"] = (rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32)
        tensors[f"res.mlp.b.{l}"] = (0.1 * rng.standard_normal(D)).astype(np.float32)
    model = workdir / f"res_{B}_{D}_{L}.oinf"
    save(str(model), sizevars={"B": B, "D": D, "num_layers": L}, metadata={}, tensors=tensors)
    x = np.random.default_rng(1).standard_normal((B, D)).astype(np.float32)
    return f"residual_mlp_stack B={B} D={D} L={L}", graph, model, {"x": x}


def kv_model(path, D: int, F: int, L: int, T: int, seed: int = 0) -> None:
    """A model for benchmarks/graphs/kv_layers.oi (tests/test_unroll.py uses it too)."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for l in range(L):
        for n, shape in (("wq", (D, D)), ("wk", (D, D)), ("wv", (D, D)), ("wo", (D, D)), ("w1", (D, F)),
                         ("w2", (F, D))):
            tensors[f"l.{l}.{n}"] = (0.3 * rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
    save(str(path), sizevars={"D": D, "F": F, "L": L, "T": T}, metadata={}, tensors=tensors)


def kv_case(workdir: Path, D: int, F: int, L: int, T: int):
    model = workdir / f"kv_{D}_{L}_{T}.oinf"
    kv_model(model, D, F, L, T)
    x = np.random.default_rng(1).standard_normal((1, D)).astype(np.float32)
    return f"kv_layers D={D} F={F} L={L} T={T}", HERE / "graphs" / "kv_layers.oi", model, {"x": x}, T


def loop_structure(prog) -> dict:
    text = prog.emit("optimized-hlo")
    return {"while": len(re.findall(r"\bwhile\(", text)), "dynamic_slice": len(re.findall(r"dynamic-slice\(", text)),
            "const_params": sum(1 for k in prog.consts)}


def build(graph, model, policy, device):
    t0 = time.perf_counter()
    prog = oi2jax.compile(graph, model=model, device=device, unroll=policy)
    lowered = prog.lower()
    t1 = time.perf_counter()
    lowered.compile(prog.compile_options)  # as a session compiles it
    t2 = time.perf_counter()
    return prog, t1 - t0, t2 - t1


class Stepper:
    def __init__(self, prog, inputs, steps_cap):
        self.prog = prog
        with prog.scope():
            self.inputs = {k: jax.device_put(prog.convert(k, v)) for k, v in inputs.items()}
        self.steps_cap, self.used = steps_cap, 0
        self.state = prog.init_state()

    def run(self, k: int) -> float:
        if self.used + k > self.steps_cap:  # a @fixed KV cache: start again before it is full
            self.state, self.used = self.prog.init_state(), 0
        t0 = time.perf_counter()
        state = self.state
        for _ in range(k):
            state, out = self.prog.step(state, **self.inputs)
        jax.block_until_ready(out)
        self.state, self.used = state, self.used + k
        return (time.perf_counter() - t0) / k


def bench(name, graph, model, inputs, device, reps, steps_cap=10**9) -> dict:
    rows, steppers, outputs = {}, {}, {}
    for policy in POLICIES:
        prog, front, xla = build(graph, model, policy, device)
        st = Stepper(prog, inputs, steps_cap)
        st.state, out = prog.step(st.state, **st.inputs)
        prog.check(st.state)
        outputs[policy] = {k: np.asarray(v) for k, v in out.items()}
        st.used = 1
        rows[str(policy)] = {"compile_s": front + xla, "trace_lower_s": front, "xla_compile_s": xla,
                             "policy": str(prog.loop_policy()), **loop_structure(prog)}
        steppers[policy] = st
    first = steppers[POLICIES[0]].run(1)  # one timed step: pick k for ~20 ms runs
    k = max(1, min(200, int(0.02 / max(first, 1e-6)), steps_cap // 4))
    times = {p: [] for p in POLICIES}
    for st in steppers.values():
        st.run(k)
    for _ in range(reps):
        for p, st in steppers.items():
            times[p].append(st.run(k))
    for p in POLICIES:
        rows[str(p)]["step_s"] = statistics.median(times[p])
        rows[str(p)]["step_min_s"] = min(times[p])
        rows[str(p)]["same_bits"] = all(np.array_equal(outputs[p][n], outputs["none"][n], equal_nan=True)
                                        for n in outputs["none"])
    return {"case": name, "k": k, "reps": reps, "policies": rows}


def compile_scaling(workdir: Path, device, layers=(12, 48, 192)) -> list[dict]:
    """Compile time per policy as the trip count grows (residual_mlp_stack B=1 D=64): a loop's is
    flat, an unrolled one's grows with n x body (what UNROLL_BUDGET bounds)."""
    rows = []
    for L in layers:
        name, graph, model, inputs = residual_case(workdir, 1, 64, L)
        for policy in ("none", "full"):
            prog, front, xla = build(graph, model, policy, device)
            rows.append({"case": name, "unroll": policy, "nodes": 4 * L, "trace_lower_s": front,
                         "xla_compile_s": xla})
    return rows


def scaling_markdown(rows: list[dict]) -> str:
    lines = ["| case | unroll | traced nodes (unrolled) | oi2jax + trace + lower | XLA compile |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['unroll']} | {r['nodes'] if r['unroll'] == 'full' else 4} | "
                     f"{r['trace_lower_s'] * 1e3:.0f} ms | {r['xla_compile_s'] * 1e3:.0f} ms |")
    return "\n".join(lines) + "\n"


def fmt_time(s: float) -> str:
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def markdown(results: list[dict], device: str) -> str:
    lines = [f"# Loop policies ({device}; {platform.processor() or platform.machine()}, jax {jax.__version__})", "",
             "| case | unroll | step (median) | step (min) | compile (total) | of which XLA | while | dyn-slice | "
             "const buffers | same bits |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for p, row in r["policies"].items():
            lines.append(f"| {r['case']} | {p} | {fmt_time(row['step_s'])} | {fmt_time(row['step_min_s'])} | "
                         f"{row['compile_s'] * 1e3:.0f} ms | {row['xla_compile_s'] * 1e3:.0f} ms | {row['while']} | "
                         f"{row['dynamic_slice']} | {row['const_params']} | {'yes' if row['same_bits'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", choices=("cpu", "gpu", "tpu"))
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--only", help="run the cases whose name contains this text")
    args = ap.parse_args(argv)
    reps = 5 if args.quick else 15
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cases = [lambda: residual_case(work, 4, 32, 3, shipped=True),
                 lambda: residual_case(work, 4, 32, 12),
                 lambda: residual_case(work, 32, 512, 12)]
        if not args.quick:
            cases += [lambda: residual_case(work, 1, 1024, 12), lambda: residual_case(work, 1, 2048, 12)]
        cases.append(lambda: kv_case(work, 64, 128, 4, 64) if args.quick else kv_case(work, 256, 688, 12, 256))
        warm, _ = build(EXAMPLES / "residual_mlp_stack.oi", EXAMPLES / "residual_mlp_stack.oinf", "none",
                        args.device)[:2]  # JAX and oi2jax warmed once: no case pays for first-use costs
        warm.run({"x": np.zeros((4, 32), np.float32)})
        for make in cases:
            name, graph, model, inputs, *cap = make()
            if args.only and args.only not in name:
                continue
            r = bench(name, graph, model, inputs, args.device, reps, steps_cap=cap[0] if cap else 10**9)
            results.append(r)
            print(markdown([r], "").split("\n", 4)[-1], end="", flush=True)
        scaling = [] if args.quick or args.only else compile_scaling(work, args.device)
        if scaling:
            print(scaling_markdown(scaling), end="", flush=True)
    device = str(jax.devices(args.device)[0] if args.device else jax.devices()[0])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "loops-quick" if args.quick else "loops"
    text = markdown(results, device)
    if scaling:
        text += "\n## Compile time against the trip count\n\n" + scaling_markdown(scaling)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"device": device, "jax": jax.__version__, "results": results,
                                                  "compile_scaling": scaling}, indent=1))
    print(f"wrote {out / stem}.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
