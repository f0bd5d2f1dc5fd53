"""h = relu6(x·w); consumers see the yielded x: h2 = relu6(x); x = x + bias."""
import jax.numpy as jnp

from . import Handwritten


def step(p, state, inputs):
    x = inputs["x"]
    h = jnp.clip(x @ p["w"], 0.0, 6.0)
    h2 = jnp.clip(x, 0.0, 6.0)
    return state, {"x": x + p["bias"], "h": h, "h2": h2}


def make(model, device=None):
    return Handwritten(step, {k: model.load(k) for k in ("w", "bias")}, {}, device)
