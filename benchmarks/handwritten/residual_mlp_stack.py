"""y = x + bias0; for each layer: y = y + relu(y·W[l] + b[l]) (lax.scan over stacked weights)."""
import jax
import jax.numpy as jnp
import numpy as np

from . import Handwritten


def step(p, state, inputs):
    y = inputs["x"] + p["bias0"]

    def layer(carry, wb):
        y, _ = carry
        w, b = wb
        h = jnp.maximum(y @ w + b, 0.0)
        return (y + h, h), None

    (y, h), _ = jax.lax.scan(layer, (y, jnp.zeros_like(y)), (p["W"], p["b"]))
    return state, {"y": y, "h": h}


def make(model, device=None):
    n = model.sizevars["num_layers"]
    params = {"bias0": model.load("bias0"),
              "W": np.stack([model.load(f"res.mlp.w.{l}") for l in range(n)]),
              "b": np.stack([model.load(f"res.mlp.b.{l}") for l in range(n)])}
    return Handwritten(step, params, {}, device)
