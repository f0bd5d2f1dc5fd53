"""Single-head attention decode (examples/attention_decode.oi): RMSNorm, q/k/v, the key and value
written at slot `pos` of donated [T, D] caches, softmax over slots 0..pos (the rest masked with the
largest finite negative), output projection, residual."""
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import Handwritten


def step(p, state, inputs):
    x = inputs["x"]
    pos = state["pos"]
    h = x * lax.rsqrt(jnp.mean(x * x) + jnp.float32(1e-6)) * p["norm_w"]
    q, k, v = p["Wq"] @ h, p["Wk"] @ h, p["Wv"] @ h
    K = lax.dynamic_update_slice_in_dim(state["K"], k[None], pos, axis=0)
    V = lax.dynamic_update_slice_in_dim(state["V"], v[None], pos, axis=0)
    s = (K @ q) * p["scale"]
    s = jnp.where(jnp.arange(s.shape[0]) <= pos, s, jnp.finfo(jnp.float32).min)
    e = jnp.exp(s - jnp.max(s))
    probs = e / jnp.sum(e)
    y = p["Wo"] @ (probs @ V) + x
    return {"pos": pos + 1, "K": K, "V": V}, {"y": y}


def make(model, device=None):
    params = {n: model.load(n) for n in ("norm_w", "Wq", "Wk", "Wv", "Wo", "scale")}
    T, D = model.sizevars["T"], model.sizevars["D"]
    state = {"pos": np.int32(0), "K": np.zeros((T, D), np.float32), "V": np.zeros((T, D), np.float32)}
    return Handwritten(step, params, state, device)
