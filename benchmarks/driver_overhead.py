"""Driver per-kernel overhead vs bare jitted calls (no assertions; prints a ratio).

    .venv/bin/python -m benchmarks.driver_overhead [iterations]

`driver`: one step run by the yield/await driver (`Program.session_step`: host bookkeeping +
every kernel call), per kernel call.
`bare`:   the same planned kernels called directly with prebuilt argument tuples, per call.
ratio = driver / bare (1.0 = the driver adds nothing over calling jitted functions).
"""
from __future__ import annotations

import sys
import time

import jax
import numpy as np
from jax.tree_util import tree_flatten_with_path

import oi2jax
from oi2jax.lowering.state import PhaseIO

SRC = """
dynamic { x: f32[8]; }
volatile { h: f32[8]; h2: f32[8]; }
block entry {
    op add(x, x) >> h;
    yield x;
    op mul(h, h) >> h;
    await x;
    op add(h, x) >> h;
}
block writer { await x; op add(x, x) >> x; yield x; }
block reader { await x; op mul(x, x) >> h2; yield x; }
"""


def driver_overhead(iterations: int = 2000) -> dict:
    prog = oi2jax.compile(SRC)
    x = np.arange(8, dtype=np.float32)
    prog.run({"x": x})  # builds and compiles every kernel
    exe = prog.executable
    with prog.scope():
        dynamic = exe.dynamic_args(exe.host.placer.put("dynamic", prog.validate_inputs({"x": x})))
        kernels = [k for k in prog.driver.built.all() if k.sig.out_keys]
        state = prog.init_state()
        for _ in range(50):
            state, out = prog.session_step(state, dynamic)  # one step run by the driver
        jax.block_until_ready((state, out))
        t0 = time.perf_counter()
        for _ in range(iterations):
            state, out = prog.session_step(state, dynamic)
        jax.block_until_ready((state, out))
        driver_s = (time.perf_counter() - t0) / (iterations * len(kernels))

        # bare: each kernel called with ready-made argument tuples (fresh copies for donated
        # ones), its leaves by their key paths in the kernel's `PhaseIO`
        env = dict(tree_flatten_with_path(PhaseIO(exe.state_spec.to_env(state).update(dynamic)))[0])
        for k in kernels:
            env.update({key: jax.numpy.zeros(a.shape, a.dtype) for key, a in k.sig.out_avals.items()})
            env.update({key: jax.numpy.zeros(a.shape, a.dtype) for key, a in k.sig.env_avals.items()
                        if key not in env})
        args = [(k.jitted, k.const_vals, tuple(env[key] for key in k.sig.keep_keys),
                 [tuple(env[key] + 0 for key in k.sig.donate_keys) for _ in range(iterations + 50)])
                for k in kernels]
        outs = None
        for i in range(50):
            for fn, c, keep, don in args:
                outs = fn(c, keep, don[i])
        jax.block_until_ready(outs)
        t0 = time.perf_counter()
        for i in range(50, 50 + iterations):
            for fn, c, keep, don in args:
                outs = fn(c, keep, don[i])
        jax.block_until_ready(outs)
        bare_s = (time.perf_counter() - t0) / (iterations * len(kernels))
    return {"kernels_per_step": len(kernels), "driver_us": driver_s * 1e6, "bare_us": bare_s * 1e6,
            "ratio": driver_s / bare_s}


if __name__ == "__main__":
    r = driver_overhead(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
    print(f"kernels per step: {r['kernels_per_step']}")
    print(f"driver per kernel: {r['driver_us']:.1f} us   bare jitted call: {r['bare_us']:.1f} us")
    print(f"overhead ratio (driver / bare): {r['ratio']:.2f}")
