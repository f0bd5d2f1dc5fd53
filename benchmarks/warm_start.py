"""Warm starts: time to first result of `oi2jax run` with an empty vs a filled persistent
XLA compilation cache (`--cache-dir`).

    python benchmarks/warm_start.py [--repeats 3] [--examples mlp_regression,residual_mlp_stack]

Each measurement is a fresh process (`python -m oi2jax run EXAMPLE.oi --quiet --cache-dir DIR`):
cold = a new, empty DIR; warm = the same command again on the DIR the cold run filled. Reported
per example: wall time of the whole process and, inside it, the time from `main()` to the end of
the first step (parse + check + bind + lower + compile-or-load + run), as the median of
`--repeats` cold/warm pairs, plus how many XLA compilations the warm run still did (0 expected).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
DEFAULT = ("mlp_regression", "residual_mlp_stack", "linear_attention", "kv_cache_decode", "streaming_pipeline")

PROBE = r"""
import sys, time, json
t0 = time.perf_counter()
from jax._src import monitoring
counts = {"misses": 0, "hits": 0}
def _ev(name, **kw):
    if name == "/jax/compilation_cache/cache_misses": counts["misses"] += 1
    if name == "/jax/compilation_cache/cache_hits": counts["hits"] += 1
monitoring.register_event_listener(_ev)
from oi2jax.cli import main
t1 = time.perf_counter()
rc = main(sys.argv[1:])
t2 = time.perf_counter()
print("WARMSTART " + json.dumps({"rc": rc, "first_result_s": t2 - t1, "import_s": t1 - t0, **counts}))
"""


def measure(example: str, cache_dir: Path) -> dict:
    cmd = [sys.executable, "-c", PROBE, "run", str(EXAMPLES / f"{example}.oi"), "--quiet", "--cache-dir", str(cache_dir)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(REPO))
    wall = time.perf_counter() - start
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("WARMSTART ")]
    if proc.returncode != 0 or not line:
        raise SystemExit(f"{example}: run failed:\n{proc.stderr[-2000:]}")
    result = json.loads(line[-1][len("WARMSTART "):])
    result["wall_s"] = wall
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--examples", default=",".join(DEFAULT))
    args = ap.parse_args(argv)
    rows = []
    for example in [e for e in args.examples.split(",") if e]:
        cold, warm = [], []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="oi2jax-warm-") as tmp:
                cold.append(measure(example, Path(tmp)))
                warm.append(measure(example, Path(tmp)))
        med = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
        row = {"example": example,
               "cold_first_result_s": med(cold, "first_result_s"), "warm_first_result_s": med(warm, "first_result_s"),
               "cold_wall_s": med(cold, "wall_s"), "warm_wall_s": med(warm, "wall_s"),
               "cold_compiles": max(r["misses"] for r in cold), "warm_compiles": max(r["misses"] for r in warm),
               "warm_cache_hits": min(r["hits"] for r in warm)}
        row["speedup_first_result"] = row["cold_first_result_s"] / row["warm_first_result_s"]
        row["speedup_wall"] = row["cold_wall_s"] / row["warm_wall_s"]
        rows.append(row)
    print(f"{'example':<22} {'first result cold':>17} {'warm':>8} {'ratio':>6}   {'process cold':>12} "
          f"{'warm':>8} {'ratio':>6}   {'XLA compiles cold/warm':>22}")
    for r in rows:
        print(f"{r['example']:<22} {r['cold_first_result_s']:>16.3f}s {r['warm_first_result_s']:>7.3f}s "
              f"{r['speedup_first_result']:>5.2f}x   {r['cold_wall_s']:>11.3f}s {r['warm_wall_s']:>7.3f}s "
              f"{r['speedup_wall']:>5.2f}x   {r['cold_compiles']:>11}/{r['warm_compiles']}")
    total_cold = sum(r["cold_first_result_s"] for r in rows)
    total_warm = sum(r["warm_first_result_s"] for r in rows)
    print(f"overall time to first result: cold {total_cold:.3f}s, warm {total_warm:.3f}s, "
          f"ratio {total_cold / total_warm:.2f}x (median of {args.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
