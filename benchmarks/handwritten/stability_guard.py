"""cond = all(isfinite(x)); y = x + bias if cond else 0 (lax.cond)."""
import jax
import jax.numpy as jnp

from . import Handwritten


def step(p, state, inputs):
    x = inputs["x"]
    cond = jnp.all(jnp.isfinite(x))
    y = jax.lax.cond(cond, lambda: x + p["bias"], lambda: jnp.zeros_like(x))
    return state, {"cond": cond, "y": y}


def make(model, device=None):
    return Handwritten(step, {"bias": model.load("bias")}, {}, device)
