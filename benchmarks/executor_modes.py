"""Sequential vs concurrent build of the yield/await driver: time to first result (no assertions).

    .venv/bin/python benchmarks/executor_modes.py [consumers] [repeats]

A graph whose entry yields once to N consumer blocks, each a chain of matmuls in nested loops
(so each kernel takes a noticeable XLA compile). For every build mode, fresh programs (a new
size D per repeat, so nothing is reused from an in-process cache) are run for one step:

- first: seconds from `run` start until the first kernel's outputs are ready
- total: seconds from `run` start until the outputs are on the host
"""
from __future__ import annotations

import statistics
import sys
import time

import jax
import numpy as np

import oi2jax


def source(consumers: int) -> str:
    vols = " ".join(f"o{i}: f32[D, D];" for i in range(consumers))
    blocks = "\n".join(f"""
block c{i} {{
    await x;
    loop l{i} (k in 0..{3 + i % 3}) {{
        op matmul(x, x) >> o{i};
        op add(o{i}, x) >> o{i};
        op relu(o{i}, alpha=0.0{i}) >> o{i};
        op mul(o{i}, o{i}) >> o{i};
        op sub(o{i}, x) >> o{i};
    }}
    yield x;
}}""" for i in range(consumers))
    return f"""
dynamic {{ x: f32[D, D]; }}
volatile {{ h: f32[D, D]; {vols} }}
block entry {{
    op matmul(x, x) >> h;
    yield x;
    op add(h, x) >> h;
    await x;
    return;
}}
{blocks}
"""


def measure(build: str, consumers: int, d: int) -> tuple[float, float]:
    prog = oi2jax.compile(source(consumers), sizes={"D": d}, build=build)
    marks: list[float] = []
    real = prog.driver.invoke

    def timed(kern, args):
        outs = real(kern, args)
        if not marks:
            jax.block_until_ready(outs)
            marks.append(time.perf_counter())
        return outs

    prog.driver.invoke = timed
    x = np.random.default_rng(d).standard_normal((d, d)).astype(np.float32) * 0.1
    t0 = time.perf_counter()
    prog.run({"x": x})
    t1 = time.perf_counter()
    return marks[0] - t0, t1 - t0


def main(argv: list[str]) -> None:
    consumers = int(argv[0]) if argv else 8
    repeats = int(argv[1]) if len(argv) > 1 else 3
    measure("sequential", consumers, 5)  # warm up JAX itself
    print(f"{consumers} consumers, {repeats} repeats, {jax.devices()[0].platform} ({jax.device_count()} device(s))")
    print(f"{'build':<11} {'first (s)':>10} {'total (s)':>10}")
    for build in ("sequential", "concurrent"):
        firsts, totals = [], []
        for r in range(repeats):
            first, total = measure(build, consumers, 16 + r + (0 if build == "sequential" else 100))
            firsts.append(first)
            totals.append(total)
        print(f"{build:<11} {statistics.median(firsts):>10.3f} {statistics.median(totals):>10.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
