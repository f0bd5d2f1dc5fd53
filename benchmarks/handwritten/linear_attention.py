"""out = sum_h (x·Wq[h] + x·Wk[h])·Wv[h], then out·w_out (lax.scan over stacked heads)."""
import jax
import jax.numpy as jnp
import numpy as np

from . import Handwritten


def step(p, state, inputs):
    x = inputs["x"]

    def head(carry, w):
        out = carry[0]
        wq, wk, wv = w
        q = x @ wq
        k = x @ wk
        h = q + k
        head_out = h @ wv
        return (out + head_out, q, k, h, head_out), None

    z = jnp.zeros_like(x)
    (out, q, k, h, head_out), _ = jax.lax.scan(head, (z, z, z, z, z), (p["Wq"], p["Wk"], p["Wv"]))
    out = out @ p["w_out"]
    return state, {"q": q, "k": k, "h": h, "head_out": head_out, "out": out}


def make(model, device=None):
    n = model.sizevars["num_heads"]
    params = {f"W{c}": np.stack([model.load(f"attn.w{c}.{i}") for i in range(n)]) for c in "qkv"}
    params["w_out"] = model.load("w_out")
    return Handwritten(step, params, {}, device)
