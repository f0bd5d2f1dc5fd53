"""A hand-written JAX Llama decode: the baseline of benchmarks/llama.py (issue 31).

Exactly the math of examples/llama_decode.oi (and tests/llama_ref.py), written as idiomatic JAX:

    h = embed[token]; per layer l:
        x = rms_norm(h, attn_norm[l]); q, k, v = x @ Wq.T, x @ Wk.T, x @ Wv.T   (heads of HD)
        q, k = rope(q, pos), rope(k, pos)    # HF rotate_half; inv_freq computed in f32 as HF does
        K[l, pos], V[l, pos] = k, v          # a fixed-capacity [L, T, KVH, HD] cache pair, donated
        scores = einsum("kgd,tkd->kgt", q as [KVH, G, HD], K[l]) * attn_scale
        probs = softmax over slots 0..pos (the others masked with f32's most negative finite value)
        h = h + einsum("kgt,tkd->kgd", probs, V[l]) @ Wo.T
        x = rms_norm(h, mlp_norm[l]); h = h + (silu(x @ Wg.T) * (x @ Wu.T)) @ Wd.T
    logits = rms_norm(h, final_norm) @ lm_head.T; next = argmax(logits) (i32)

Weights stay in Hugging Face's `[out, in]` layout (`lax.dot_general` contracting the input axis:
no transpose is materialised). f32 matmuls run at `precision` (default HIGHEST, oi2jax's default
`--precision highest`); 16-bit weights are computed as the `nn` ops do: every op in f32 (matmuls
accumulate in f32) and rounded once to the weights' dtype, the attention scores scaled and
soft-maxed in f32 and `logits` widened to f32 (examples/llama_decode_bf16.oi).

Two layer forms: `layers="unrolled"` (a Python loop over the layers: XLA sees L copies of the
layer; the faster form on GPU) and `layers="scan"` (a `lax.scan` over weights stacked `[L, ...]`,
the cache carried and updated in place at [l, pos]).

    m = LlamaJax.from_model("llama.oinf")            # parameters from the same .oinf as oi2jax
    cache = m.init_cache()
    cache, logits, nxt = m.step(m.params, cache, token, pos)      # jitted, cache donated
    cache, nexts, logits = m.generate(m.params, cache, prompt, n)  # donated lax.scan of n steps
    cache, logits, nxt = m.prefill(m.params, cache, tokens)        # a whole prompt in one step (unrolled)
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from oi2jax.naming import resolve_alias

PRECISIONS = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH, "default": lax.Precision.DEFAULT}

LAYER_WEIGHTS = {  # hand-written name -> Hugging Face name (within "model.layers.{l}.")
    "attn_norm": "input_layernorm.weight",
    "Wq": "self_attn.q_proj.weight",
    "Wk": "self_attn.k_proj.weight",
    "Wv": "self_attn.v_proj.weight",
    "Wo": "self_attn.o_proj.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "Wg": "mlp.gate_proj.weight",
    "Wu": "mlp.up_proj.weight",
    "Wd": "mlp.down_proj.weight",
}


@dataclass(frozen=True)
class Config:
    V: int
    D: int
    L: int
    H: int
    KVH: int
    HD: int
    F: int
    T: int
    eps: float
    theta: float
    attn_scale: float
    dtype: str  # the weights' (and cache's) dtype name as NumPy spells it: float32, bfloat16, ...

    @property
    def G(self) -> int:
        return self.H // self.KVH

    @staticmethod
    def from_model(model) -> "Config":
        s = model.sizevars
        meta = {k: v.value for k, v in model.metadata.items()}
        dtype = model.info("model.embed_tokens.weight").dtype
        return Config(V=s["V"], D=s["D"], L=s["L"], H=s["H"], KVH=s["KVH"], HD=s["HD"], F=s["F"], T=s["T"],
                      eps=float(meta["rms_norm_eps"]), theta=float(meta["rope_theta"]),
                      attn_scale=float(meta["attn_scale"]), dtype=str(np.dtype(_np_dtype(dtype))))


def _np_dtype(name):
    if name in ("bf16", "bfloat16"):
        import ml_dtypes
        return ml_dtypes.bfloat16
    return {"f32": np.float32, "f16": np.float16, "f64": np.float64}.get(name, name)


def load_params(model) -> dict:
    """{"embed", "layers": [per-layer dict], "final_norm", "lm_head"} as NumPy arrays, straight
    from the `.oinf` (HF layouts and dtypes kept)."""
    layers = []
    for l in range(model.sizevars["L"]):
        layers.append({k: model.load(f"model.layers.{l}.{hf}") for k, hf in LAYER_WEIGHTS.items()})
    return {"embed": model.load("model.embed_tokens.weight"), "layers": layers,
            "final_norm": model.load("model.norm.weight"),
            "lm_head": model.load(resolve_alias(model, "lm_head.weight"))}  # a tied model: the embedding


def stack_layers(params: dict) -> dict:
    """The same parameters with the layers stacked `[L, ...]` (the `lax.scan` form)."""
    layers = params["layers"]
    stacked = {k: np.stack([np.asarray(lw[k]) for lw in layers]) for k in layers[0]}
    return {**params, "layers": stacked}


def inv_freq(cfg: Config) -> np.ndarray:
    """Hugging Face's `1.0 / (theta ** (arange(0, HD, 2).float() / HD))`, every step in f32."""
    f = np.float32
    e = np.arange(0, cfg.HD, 2).astype(f) / f(cfg.HD)
    return (f(1.0) / (np.float64(f(cfg.theta)) ** e.astype(np.float64)).astype(f)).astype(f)


# ------------------------------------------------------------------ the math


def _f32(x):
    return x.astype(jnp.float32)


def _linear(x, w, precision):
    """x [in] @ w[out, in].T in f32 (the weight's layout kept: contract its axis 1)."""
    return lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())), precision=precision,
                           preferred_element_type=jnp.float32)


def _rms_norm(x, w, eps):
    xc = _f32(x)
    return xc * lax.rsqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + jnp.float32(eps)) * _f32(w)


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    xc = _f32(x)
    rot = jnp.concatenate([-xc[..., half:], xc[..., :half]], axis=-1)
    return xc * cos + rot * sin


def _attend(cfg: Config, q, kc, vc, n, precision, dt):
    """q [H, HD] (rotated), kc/vc [T, KVH, HD]; slots 0..n-1 read."""
    qg = q.reshape(cfg.KVH, cfg.G, cfg.HD)
    scores = jnp.einsum("kgd,tkd->kgt", qg, kc, precision=precision, preferred_element_type=jnp.float32)
    scores = _f32(scores.astype(dt)) * jnp.float32(cfg.attn_scale)  # scaled and soft-maxed in f32
    keep = lax.broadcasted_iota(jnp.int32, scores.shape, 2) < n
    scores = jnp.where(keep, scores, jnp.finfo(jnp.float32).min)
    e = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    e = jnp.where(keep, e, 0.0)
    probs = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(dt)
    og = jnp.einsum("kgt,tkd->kgd", probs, vc, precision=precision, preferred_element_type=jnp.float32)
    return og.astype(dt).reshape(cfg.H * cfg.HD)


def _layer(cfg: Config, lw, x, K, V, l, pos, cos, sin, precision):
    """One decoder layer on the residual x [D] (dtype dt); K/V the whole [L, T, KVH, HD] caches,
    written at [l, pos] in place. `l`: a Python int (unrolled) or a traced index (scan)."""
    dt = x.dtype
    h = _rms_norm(x, lw["attn_norm"], cfg.eps).astype(dt)
    q = _linear(h, lw["Wq"], precision).astype(dt).reshape(cfg.H, cfg.HD)
    k = _linear(h, lw["Wk"], precision).astype(dt).reshape(cfg.KVH, cfg.HD)
    v = _linear(h, lw["Wv"], precision).astype(dt).reshape(cfg.KVH, cfg.HD)
    q = _rope(q, cos, sin).astype(dt)
    k = _rope(k, cos, sin).astype(dt)
    zero = jnp.int32(0)
    K = lax.dynamic_update_slice(K, k[None, None], (l, pos, zero, zero))
    V = lax.dynamic_update_slice(V, v[None, None], (l, pos, zero, zero))
    kc = K[l] if isinstance(l, int) else lax.dynamic_index_in_dim(K, l, 0, keepdims=False)
    vc = V[l] if isinstance(l, int) else lax.dynamic_index_in_dim(V, l, 0, keepdims=False)
    o = _attend(cfg, q, kc, vc, pos + 1, precision, dt)
    x = (_f32(x) + _linear(o, lw["Wo"], precision).astype(dt)).astype(dt)
    h = _rms_norm(x, lw["mlp_norm"], cfg.eps).astype(dt)
    gate = _linear(h, lw["Wg"], precision).astype(dt)
    up = _linear(h, lw["Wu"], precision).astype(dt)
    gate = (_f32(gate) * jax.nn.sigmoid(_f32(gate))).astype(dt)
    gate = (_f32(gate) * _f32(up)).astype(dt)
    x = (_f32(x) + _f32(_linear(gate, lw["Wd"], precision).astype(dt))).astype(dt)
    return x, K, V


def step_fn(cfg: Config, params, cache, token, pos, *, precision=lax.Precision.HIGHEST, layers="unrolled"):
    """One decode step at position `pos` (i32 scalar): (cache, logits [V] f32, next i32)."""
    K, V = cache
    dt = params["embed"].dtype
    x = jnp.take(params["embed"], token, axis=0)
    freqs = pos.astype(jnp.float32) * jnp.asarray(inv_freq(cfg))
    emb = jnp.concatenate([freqs, freqs])
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    if layers == "unrolled":
        for l in range(cfg.L):
            x, K, V = _layer(cfg, params["layers"][l], x, K, V, l, pos, cos, sin, precision)
    elif layers == "scan":
        def body(carry, xs):
            x, K, V = carry
            lw, l = xs
            return _layer(cfg, lw, x, K, V, l, pos, cos, sin, precision), None
        (x, K, V), _ = lax.scan(body, (x, K, V), (params["layers"], jnp.arange(cfg.L, dtype=jnp.int32)))
    else:
        raise ValueError(f"layers must be 'unrolled' or 'scan', got {layers!r}")
    h = _rms_norm(x, params["final_norm"], cfg.eps).astype(dt)
    logits = _linear(h, params["lm_head"], precision).astype(dt)
    nxt = jnp.argmax(logits).astype(jnp.int32)
    return (K, V), _f32(logits), nxt


def prefill_fn(cfg: Config, params, cache, tokens, *, precision=lax.Precision.HIGHEST):
    """A whole prompt of S tokens in one step from an empty cache (the fastest form of the same
    math): the layers run on all S rows at once, row i attending causally over rows 0..i (an S x S
    mask from iota), k and v written into the cache at rows 0..S-1 with one dynamic_update_slice per
    layer. (cache, logits [V] f32 of the last row, next i32)."""
    K, V = cache
    dt = params["embed"].dtype
    s = tokens.shape[0]
    x = jnp.take(params["embed"], tokens, axis=0)
    freqs = jnp.arange(s, dtype=jnp.float32)[:, None] * jnp.asarray(inv_freq(cfg))[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, None, :]
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    causal = lax.broadcasted_iota(jnp.int32, (s, s), 1) <= lax.broadcasted_iota(jnp.int32, (s, s), 0)
    zero = jnp.int32(0)
    for l in range(cfg.L):
        lw = params["layers"][l]
        h = _rms_norm(x, lw["attn_norm"], cfg.eps).astype(dt)
        q = _rope(_linear(h, lw["Wq"], precision).astype(dt).reshape(s, cfg.H, cfg.HD), cos, sin).astype(dt)
        k = _rope(_linear(h, lw["Wk"], precision).astype(dt).reshape(s, cfg.KVH, cfg.HD), cos, sin).astype(dt)
        v = _linear(h, lw["Wv"], precision).astype(dt).reshape(s, cfg.KVH, cfg.HD)
        K = lax.dynamic_update_slice(K, k[None], (jnp.int32(l), zero, zero, zero))
        V = lax.dynamic_update_slice(V, v[None], (jnp.int32(l), zero, zero, zero))
        qg = q.reshape(s, cfg.KVH, cfg.G, cfg.HD)
        scores = jnp.einsum("skgd,tkd->kgst", qg, k, precision=precision, preferred_element_type=jnp.float32)
        scores = jnp.where(causal, scores * jnp.float32(cfg.attn_scale), jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt)
        o = jnp.einsum("kgst,tkd->skgd", probs, v, precision=precision, preferred_element_type=jnp.float32)
        x = (_f32(x) + _linear(o.astype(dt).reshape(s, cfg.H * cfg.HD), lw["Wo"], precision).astype(dt)).astype(dt)
        h = _rms_norm(x, lw["mlp_norm"], cfg.eps).astype(dt)
        gate = _linear(h, lw["Wg"], precision).astype(dt)
        up = _linear(h, lw["Wu"], precision).astype(dt)
        gate = (_f32(gate) * jax.nn.sigmoid(_f32(gate)) * _f32(up)).astype(dt)
        x = (_f32(x) + _f32(_linear(gate, lw["Wd"], precision).astype(dt))).astype(dt)
    h = _rms_norm(x[-1], params["final_norm"], cfg.eps).astype(dt)
    logits = _linear(h, params["lm_head"], precision).astype(dt)
    return (K, V), _f32(logits), jnp.argmax(logits).astype(jnp.int32)


def generate_fn(cfg: Config, params, cache, prompt, n: int, pos0=0, **kw):
    """n steps from position pos0 as one `lax.scan`: step k takes prompt[k] while k < len(prompt)
    (teacher forcing), then the previous step's argmax. (cache, nexts [n] i32, last logits [V])."""
    prompt = jnp.asarray(prompt, jnp.int32)
    P = prompt.shape[0]
    pos0 = jnp.asarray(pos0, jnp.int32)

    def body(carry, k):
        cache, prev, _ = carry
        token = jnp.where(k < P, prompt[jnp.minimum(k, P - 1)], prev)
        cache, logits, nxt = step_fn(cfg, params, cache, token, pos0 + k, **kw)
        return (cache, nxt, logits), nxt

    logits0 = jnp.zeros((cfg.V,), jnp.float32)
    (cache, _, logits), nexts = lax.scan(body, (cache, jnp.int32(0), logits0), jnp.arange(n, dtype=jnp.int32))
    return cache, nexts, logits


class LlamaJax:
    """The hand-written model: parameters on the device, `step` and `generate` jitted with the
    cache donated. A fresh instance traces and compiles anew on first use."""

    def __init__(self, cfg: Config, params: dict, *, layers="unrolled", precision="highest", device=None):
        self.cfg, self.layers, self.device = cfg, layers, device
        self.precision = PRECISIONS[precision] if isinstance(precision, str) else precision
        if layers == "scan":
            params = stack_layers(params)
        self.params = self.put(params)
        kw = dict(precision=self.precision, layers=layers)
        self.step = jax.jit(partial(step_fn, cfg, **kw), donate_argnums=(1,))
        self.generate = jax.jit(partial(generate_fn, cfg, **kw), donate_argnums=(1,), static_argnums=(3,))
        if layers == "unrolled":
            self.prefill = jax.jit(partial(prefill_fn, cfg, precision=self.precision), donate_argnums=(1,))

    @classmethod
    def from_model(cls, model, **kw) -> "LlamaJax":
        """From an `.oinf` path or an open model (`oi2jax.model.open_model`)."""
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            from oi2jax.model import open_model
            model = open_model(str(model))
        return cls(Config.from_model(model), load_params(model), **kw)

    def put(self, tree):
        if self.device is not None:
            return jax.device_put(tree, self.device)
        return jax.tree.map(jnp.asarray, tree)

    def init_cache(self):
        c = self.cfg
        shape, dt = (c.L, c.T, c.KVH, c.HD), _np_dtype(c.dtype)
        return tuple(jnp.zeros(shape, dt, device=self.device) for _ in range(2))

    def weight_bytes(self) -> int:
        """Bytes of the weights a decode step reads (every layer, the final norm, lm_head and one
        embedding row): the memory-bandwidth floor's numerator."""
        p = self.params
        n = sum(int(a.nbytes) for a in jax.tree.leaves(p["layers"]))
        return n + int(p["final_norm"].nbytes) + int(p["lm_head"].nbytes) + int(p["embed"].nbytes) // self.cfg.V
