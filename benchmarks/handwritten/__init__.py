"""The ten SPEC §9 examples written by hand as idiomatic `jax.jit` code (the benchmark baseline).

Each module defines `make(model, **static) -> Handwritten`: `model` is the open `.oinf`
(`oi2jax.model.open_model`), `static` holds what the scaled `.oi` text fixes rather than the
model (e.g. a `@fixed` table size). The step is a pure function
`step(params, state, inputs) -> (state, outputs)`; `Handwritten.step` is it under `jax.jit`
with the state donated (as `oi2jax.Program.step`), `Handwritten.eager` the same function
dispatched op by op (`jax.disable_jit()`), the benchmark's (d).

The output names are the DSL variable names, so `run()` results compare key by key with
`oi2jax.Program.run()`.
"""
from __future__ import annotations

import importlib

import jax
import numpy as np

NAMES = ("attention_decode", "cache_window_slice", "kv_cache_decode", "linear_attention", "mlp_regression", "moe_routing",
         "online_weight_update", "quantized_linear", "residual_mlp_stack", "stability_guard",
         "streaming_pipeline")


def at_highest_precision(fn):
    """`fn` with its matmuls at full float32 precision, as oi2jax compiles them by default
    (`precision="highest"`). JAX's default lets a GPU use TF32 and a TPU bf16 passes, and the
    baseline would then compute other values than oi2jax (tests/test_benchmarks_smoke.py holds
    them equal); on a CPU both are the same. Entered while tracing: the precision is fixed per
    `dot_general` in the traced program, so `jax.jit`, `lax.scan` and eager calls all keep it."""
    def step(params, state, inputs):
        with jax.default_matmul_precision("highest"):
            return fn(params, state, inputs)
    return step


class Handwritten:
    def __init__(self, fn, params: dict, state: dict, device=None):
        fn = at_highest_precision(fn)
        self.fn = fn
        self.device = device
        self.params = self.put(params)
        self._state0 = state
        # a fresh jit wrapper per instance: its first call really traces and compiles
        self._jit = jax.jit(lambda p, s, i: fn(p, s, i), donate_argnums=(1,))

    def put(self, tree):
        if self.device is not None:
            return jax.device_put(tree, self.device)
        return jax.tree_util.tree_map(jax.numpy.asarray, tree)

    def init_state(self) -> dict:
        return self.put(self._state0)

    def step(self, state, **inputs):
        return self._jit(self.params, state, inputs)

    def eager(self, state, **inputs):
        with jax.disable_jit():
            return self.fn(self.params, state, inputs)

    def run(self, inputs: dict, steps: int = 1) -> dict:
        """`steps` jitted steps from a fresh state; outputs and state as NumPy, by DSL name."""
        state = self.init_state()
        inputs = self.put(inputs)
        outputs = {}
        for _ in range(steps):
            state, outputs = self.step(state, **inputs)
        result = {k: np.asarray(v) for k, v in outputs.items()}
        result.update({k: np.asarray(v) for k, v in state.items()})
        return result


def make(name: str, model, **static) -> Handwritten:
    if name not in NAMES:
        raise KeyError(name)
    return importlib.import_module(f"{__name__}.{name}").make(model, **static)
