"""Step time versus device count for a matmul-heavy example (mlp_regression, scaled up).

    python benchmarks/scaling.py [--devices 1,2,4,8] [--B 512 --D 1024 --H 4096 --O 1024] [--steps 20]

Writes a scaled-up mlp_regression model to a temp dir, then, for each device count n, runs a
subprocess with `XLA_FLAGS=--xla_force_host_platform_device_count=8` that compiles the graph
sharded over the first n devices (three layouts: data-parallel B=data; model-parallel H=model;
and 2-D B=data,H=model where n >= 4) and times `Program.step` (state donated, outputs
block_until_ready). Prints ms/step and the ratio to the 1-device time.

On CPU the forced "devices" share the same cores, so this measures partitioning overhead and
collective cost, not real speed-up; on a GPU/TPU host pass --real (uses the real devices).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

WORKER = textwrap.dedent(r'''
    import json, sys, time
    import jax, numpy as np
    sys.path.insert(0, sys.argv[1])
    import oi2jax
    from oi2jax.runtime.sharding import make_mesh
    graph, model, n, layout, steps = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
    devs = jax.devices()[:n]
    if layout == "data":
        mesh, shard = make_mesh({"data": n}, devices=devs), {"B": "data"}
    elif layout == "model":
        mesh, shard = make_mesh({"model": n}, devices=devs), {"H": "model"}
    else:
        mesh, shard = make_mesh({"data": n // 2, "model": 2}, devices=devs), {"B": "data", "H": "model"}
    prog = oi2jax.compile(graph, model=model, mesh=mesh, shard=shard)
    B, D = prog.bound.shape("x")
    x = np.random.default_rng(0).standard_normal((B, D)).astype(np.float32)
    xs = prog.placer.put("dynamic", {"x": x})["x"]
    state = prog.init_state()
    for _ in range(3):
        state, out = prog.step(state, x=xs)
    jax.block_until_ready(out)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state, out = prog.step(state, x=xs)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t0)
    hlo = prog.emit("optimized-hlo")
    colls = {k: hlo.count(f" {k}(") + hlo.count(f" {k}-start(") for k in ("all-reduce", "all-gather", "reduce-scatter")}
    print("RESULT " + json.dumps({"ms": 1000 * float(np.median(times)), "collectives": colls}))
''')


def write_model(path: Path, B: int, D: int, H: int, O: int) -> None:
    import numpy as np
    sys.path.insert(0, str(REPO))
    from oi2jax.model import save
    rng = np.random.default_rng(0)
    save(path, sizevars={"B": B, "D": D, "H": H, "O": O}, tensors={
        "w1": (rng.standard_normal((D, H)) / np.sqrt(D)).astype(np.float32),
        "b1": rng.standard_normal(H).astype(np.float32),
        "w2": (rng.standard_normal((H, O)) / np.sqrt(H)).astype(np.float32),
        "b2": rng.standard_normal(O).astype(np.float32)})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", default="1,2,4,8")
    ap.add_argument("--B", type=int, default=512)
    ap.add_argument("--D", type=int, default=1024)
    ap.add_argument("--H", type=int, default=4096)
    ap.add_argument("--O", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--real", action="store_true", help="use the real accelerator devices")
    args = ap.parse_args()
    counts = [int(c) for c in args.devices.split(",")]
    env = dict(os.environ)
    if not args.real:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={max(counts)}"
        env["JAX_PLATFORMS"] = "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "mlp_big.oinf"
        write_model(model, args.B, args.D, args.H, args.O)
        graph = REPO / "examples" / "mlp_regression.oi"
        print(f"mlp_regression B={args.B} D={args.D} H={args.H} O={args.O} "
              f"({2 * args.B * (args.D * args.H + args.H * args.O) / 1e9:.2f} GFLOP/step)")
        print(f"{'layout':<8}{'devices':>8}{'ms/step':>10}{'vs 1 dev':>10}  collectives")
        for layout in ("data", "model", "2d"):
            base = None
            for n in counts:
                if layout == "2d" and (n < 4 or n % 2):
                    continue
                proc = subprocess.run([sys.executable, "-c", WORKER, str(REPO), str(graph), str(model), str(n),
                                       layout, str(args.steps)], env=env, capture_output=True, text=True,
                                      timeout=600)
                if proc.returncode:
                    print(f"{layout:<8}{n:>8}  failed: {proc.stderr.strip().splitlines()[-1]}")
                    continue
                res = json.loads(proc.stdout.split("RESULT ")[-1])
                if base is None:
                    base = res["ms"] if n == 1 else None
                ratio = f"{res['ms'] / base:.2f}x" if base else "-"
                colls = ", ".join(f"{k} {v}" for k, v in res["collectives"].items() if v) or "none"
                print(f"{layout:<8}{n:>8}{res['ms']:>10.2f}{ratio:>10}  {colls}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
