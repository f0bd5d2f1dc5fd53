"""An independent NumPy reference of Hugging Face's LlamaForCausalLM, for testing (not a test file).

Written from transformers' `models/llama/modeling_llama.py`, plainly, one token at a time:

    ref = LlamaRef(weights, config)      # {HF tensor name: array}, the config.json dict
    logits = ref.step(token)             # [V]; keeps its own KV cache, position = tokens so far
    full = forward_full(weights, config, tokens)   # [T, V]: the whole sequence at once, no cache

Maths (HF names): h = embed_tokens[token]; per layer
    x = RMSNorm(h, input_layernorm);  q, k, v = x @ Wq.T, x @ Wk.T, x @ Wv.T  (heads of HD)
    q, k = rotary(q, pos), rotary(k, pos)   # rotate_half: halves [x1, x2] -> [-x2, x1]
    query head j attends with kv head j // (H // KVH) over positions 0..pos, scores / sqrt(HD)
    h = h + concat(heads) @ Wo.T
    x = RMSNorm(h, post_attention_layernorm);  h = h + down(silu(gate(x)) * up(x))
then logits = RMSNorm(h, norm) @ lm_head.T (the embedding when tie_word_embeddings).
RMSNorm(x, w) = x / sqrt(mean(x^2) + eps) * w; rotary: inv_freq = 1 / theta^(arange(0, HD, 2) / HD),
angle = pos * inv_freq repeated for both halves. Projections are `[out, in]` (x @ W.T).
Computed in float64 by default (`dtype=np.float32` for a float32 run); weights of any float
dtype (bf16 via ml_dtypes) are converted exactly to it.
"""
from __future__ import annotations

import numpy as np


def rope_theta(config: dict) -> float:
    """rope_theta from either config form: `rope_parameters: {rope_theta, ...}` or top-level."""
    params = config.get("rope_parameters") or {}
    if params.get("rope_theta") is not None:
        return float(params["rope_theta"])
    return float(config.get("rope_theta", 10000.0))


class _Dims:
    def __init__(self, config: dict):
        self.V = config["vocab_size"]
        self.D = config["hidden_size"]
        self.L = config["num_hidden_layers"]
        self.H = config["num_attention_heads"]
        self.KVH = config.get("num_key_value_heads") or self.H
        self.HD = config.get("head_dim") or self.D // self.H
        self.eps = float(config["rms_norm_eps"])
        self.theta = rope_theta(config)
        self.tied = bool(config.get("tie_word_embeddings", False))


def _weights(weights: dict, dims: _Dims, dtype) -> dict:
    w = {name: np.asarray(value).astype(np.float64).astype(dtype) for name, value in weights.items()}
    if dims.tied:  # HF ties lm_head to the embedding (a stored lm_head.weight is overwritten)
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    return w


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(variance + eps) * weight


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rotary_cos_sin(positions: np.ndarray, head_dim: int, theta: float, dtype) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape [len(positions), head_dim] (HF: emb = cat(freqs, freqs))."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    freqs = np.outer(np.asarray(positions, np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


class LlamaRef:
    """One-token-at-a-time Llama decode with its own KV cache."""

    def __init__(self, weights: dict, config: dict, dtype=np.float64):
        self.dims = _Dims(config)
        self.dtype = np.dtype(dtype)
        self.w = _weights(weights, self.dims, self.dtype)
        self.reset()

    def reset(self) -> None:
        d = self.dims
        self.pos = 0
        self.k_cache = [np.zeros((0, d.KVH, d.HD), self.dtype) for _ in range(d.L)]
        self.v_cache = [np.zeros((0, d.KVH, d.HD), self.dtype) for _ in range(d.L)]

    def step(self, token: int) -> np.ndarray:
        """Logits [V] for `token` at position `self.pos` (then advances the position)."""
        d, w = self.dims, self.w
        cos, sin = rotary_cos_sin([self.pos], d.HD, d.theta, self.dtype)
        cos, sin = cos[0], sin[0]
        h = w["model.embed_tokens.weight"][int(token)]
        group = d.H // d.KVH
        for i in range(d.L):
            p = f"model.layers.{i}."
            x = rms_norm(h, w[p + "input_layernorm.weight"], d.eps)
            q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(d.H, d.HD)
            k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(d.KVH, d.HD)
            v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(d.KVH, d.HD)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            self.k_cache[i] = np.concatenate([self.k_cache[i], k[None]], axis=0)
            self.v_cache[i] = np.concatenate([self.v_cache[i], v[None]], axis=0)
            heads = []
            for j in range(d.H):
                kv = j // group
                keys, values = self.k_cache[i][:, kv], self.v_cache[i][:, kv]  # [pos+1, HD]
                scores = keys @ q[j] / np.sqrt(d.HD)
                probs = np.exp(scores - scores.max())
                probs = probs / probs.sum()
                heads.append(probs @ values)
            h = h + np.concatenate(heads) @ w[p + "self_attn.o_proj.weight"].T
            x = rms_norm(h, w[p + "post_attention_layernorm.weight"], d.eps)
            gate = x @ w[p + "mlp.gate_proj.weight"].T
            up = x @ w[p + "mlp.up_proj.weight"].T
            h = h + (silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        self.pos += 1
        h = rms_norm(h, w["model.norm.weight"], d.eps)
        return h @ w["lm_head.weight"].T


def forward_full(weights: dict, config: dict, tokens, dtype=np.float64) -> np.ndarray:
    """Logits [T, V] of the whole sequence at once (matrices over positions, causal mask, no cache):
    a second formulation to check `LlamaRef.step` against."""
    d = _Dims(config)
    dtype = np.dtype(dtype)
    w = _weights(weights, d, dtype)
    tokens = np.asarray(tokens, np.int64)
    T = len(tokens)
    cos, sin = rotary_cos_sin(np.arange(T), d.HD, d.theta, dtype)  # [T, HD]
    mask = np.triu(np.full((T, T), -np.inf), k=1)  # position t sees 0..t
    h = w["model.embed_tokens.weight"][tokens]  # [T, D]
    for i in range(d.L):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], d.eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(T, d.H, d.HD).transpose(1, 0, 2)  # [H, T, HD]
        k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(T, d.KVH, d.HD).transpose(1, 0, 2)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(T, d.KVH, d.HD).transpose(1, 0, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, d.H // d.KVH, axis=0)  # HF repeat_kv: kv head j serves query heads j*group..
        v = np.repeat(v, d.H // d.KVH, axis=0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(d.HD) + mask  # [H, T, T]
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs = probs / probs.sum(axis=-1, keepdims=True)
        attn = (probs @ v).transpose(1, 0, 2).reshape(T, d.H * d.HD)
        h = h + attn @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], d.eps)
        h = h + (silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)) \
            @ w[p + "mlp.down_proj.weight"].T
    h = rms_norm(h, w["model.norm.weight"], d.eps)
    return h @ w["lm_head.weight"].T


def converted_random_llama(directory, seed: int, **sizes):
    """A random Hugging Face Llama checkpoint written under `directory` (examples/
    llama_checkpoint.py) and converted with convert-hf: (model path, the checkpoint's weights by
    Hugging Face name, its config.json)."""
    import json
    import sys
    from pathlib import Path

    from safetensors.numpy import load_file

    from oi2jax.model.convert import convert_hf
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import llama_checkpoint
    directory = Path(directory)
    ck = llama_checkpoint.write_random_llama(directory / "ck", seed=seed, **sizes)
    model = directory / "llama.oinf"
    convert_hf(ck, model)
    return model, load_file(str(ck / "model.safetensors")), json.loads((ck / "config.json").read_text())

