"""K[t] = q + zero; t += 1; k_hist = K (a `rows`-row key table in the donated state)."""
import jax
import numpy as np

from . import Handwritten


def step(p, state, inputs):
    q = inputs["q"] + p["zero"]
    t = state["t"]
    K = jax.lax.dynamic_update_slice_in_dim(state["K"], q[None], t, axis=0)
    return {"t": t + 1, "K": K}, {"q": q, "k_hist": K}


def make(model, rows: int = 4, device=None):
    zero = model.load("zero")
    state = {"t": np.int32(0), "K": np.zeros((rows,) + zero.shape, np.float32)}
    return Handwritten(step, {"zero": zero}, state, device)
