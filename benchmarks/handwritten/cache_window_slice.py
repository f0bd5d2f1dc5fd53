"""A[write_idx] = x; clamp start/end into [zero, limit]; window = A[start : start + width]."""
import jax
import jax.numpy as jnp
import numpy as np

from . import Handwritten


def step(p, state, inputs):
    A = jax.lax.dynamic_update_slice_in_dim(state["A"], inputs["x"][None], state["write_idx"], axis=0)
    s = jnp.minimum(jnp.maximum(state["start"], p["zero"]), p["limit"])
    e = jnp.minimum(jnp.maximum(state["end"], p["zero"]), p["limit"])
    window = jax.lax.dynamic_slice_in_dim(A, s, p["width"], axis=0)
    new = {"write_idx": state["write_idx"] + 1, "start": s + 1, "end": e + 1, "A": A}
    return new, {"s": s, "e": e, "window": window}


def make(model, rows: int = 6, width: int = 3, device=None):
    d = model.sizevars["D"]
    params = {"zero": np.int32(model.load("zero")), "limit": np.int32(model.load("limit"))}
    state = {"write_idx": np.int32(0), "start": np.int32(0), "end": np.int32(width),
             "A": np.zeros((rows, d), np.float32)}
    hw = Handwritten(lambda p, s, i: step({**p, "width": width}, s, i), params, state, device)
    return hw
