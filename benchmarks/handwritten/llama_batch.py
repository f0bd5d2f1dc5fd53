"""A hand-written batched JAX Llama decode: the baseline of benchmarks/batch.py (issue 40).

B sequences, each at its own position, decode together: handwritten/llama.py's step (the same
math as examples/llama_prefill.oi at S=1) under `jax.vmap` over a `[B, L, T, KVH, HD]` cache pair
and `tokens`/`pos` of `[B]`, greedy; `decode(params, cache, tokens, pos, n)` runs n steps as one
`lax.scan`, the cache donated, every step's tokens `[n, B]` returned.

    m = LlamaBatchJax.from_model("llama.oinf", batch=8)
    cache = m.init_cache()
    cache, nexts = m.decode(m.params, cache, tokens, pos, 64)
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

from .llama import LlamaJax, _np_dtype, step_fn


def decode_fn(cfg, params, cache, tokens, pos, n: int, **kw):
    """n greedy steps of B sequences from `tokens` [B] at positions `pos` [B]: (cache, nexts [n, B])."""
    step = jax.vmap(lambda c, t, p: step_fn(cfg, params, c, t, p, **kw))

    def body(carry, _):
        cache, tok, pos = carry
        cache, _, nxt = step(cache, tok, pos)
        return (cache, nxt, pos + 1), nxt

    (cache, _, _), nexts = lax.scan(body, (cache, jnp.asarray(tokens, jnp.int32), jnp.asarray(pos, jnp.int32)),
                                    None, length=n)
    return cache, nexts


class LlamaBatchJax(LlamaJax):
    """The hand-written model batched: `decode` jitted with the cache donated."""

    def __init__(self, cfg, params, *, batch: int, **kw):
        super().__init__(cfg, params, **kw)
        self.batch = batch
        self.decode = jax.jit(partial(decode_fn, cfg, precision=self.precision, layers=self.layers),
                              donate_argnums=(1,), static_argnums=(4,))

    def init_cache(self):
        c = self.cfg
        shape, dt = (self.batch, c.L, c.T, c.KVH, c.HD), _np_dtype(c.dtype)
        return tuple(jnp.zeros(shape, dt, device=self.device) for _ in range(2))
