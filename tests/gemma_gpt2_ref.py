"""Independent NumPy references of Hugging Face's Gemma2ForCausalLM, Gemma3ForCausalLM (the text
model, model_type gemma3_text) and GPT2LMHeadModel, for testing (not a test file).

Written from transformers' `models/gemma2/modeling_gemma2.py`, `models/gemma3/modeling_gemma3.py`
and `models/gpt2/modeling_gpt2.py`, plainly, one token at a time, in float64, each with its own
KV cache (the position is the number of tokens stepped so far):

    ref = GemmaRef(weights, config, gemma3=False)   # {HF tensor name: array}, the config.json dict
    logits = ref.step(token)                        # [V]
    full = gemma_forward_full(weights, config, tokens, gemma3=False)   # [S, V], no cache: a check

Gemma2 (HF names), with RMSNorm(x, w) = x / sqrt(mean(x^2) + eps) * (1 + w):
    h = embed_tokens[token] * sqrt(hidden_size)
    per layer: x = RMSNorm(h, input_layernorm); q, k, v = x @ Wq.T, ... (heads of head_dim);
        rotate q, k (rotate_half); scores = q . k * query_pre_attn_scalar^-0.5, then
        tanh(scores / attn_logit_softcapping) * attn_logit_softcapping; a `sliding_attention`
        layer sees the last `sliding_window` positions (kv > pos - window), a `full_attention`
        layer all; h = h + RMSNorm(attn @ Wo.T, post_attention_layernorm);
        h = h + RMSNorm(down(gelu_tanh(gate(x)) * up(x)), post_feedforward_layernorm) with
        x = RMSNorm(h, pre_feedforward_layernorm)
    logits = RMSNorm(h, norm) @ lm_head.T, then tanh(logits / final_logit_softcapping) * cap.
Gemma3 text: the same, plus q_norm / k_norm (RMSNorm (1 + w) over head_dim) before the rotation,
    and the rotary embedding of a layer chosen by its type (`rope_parameters` keyed by layer type;
    older files: `rope_theta` + `rope_scaling` for full attention, `rope_local_base_freq` for the
    sliding layers); soft-capping only when configured. `layer_types` default: every
    `sliding_window_pattern`-th layer (6) is full attention.
GPT-2: h = wte[token] + wpe[pos]; per layer: x = LayerNorm(h, ln_1); qkv = x @ c_attn.weight +
    c_attn.bias (Conv1D, weight [in, out]); q, k, v = thirds; scores / sqrt(head_dim);
    h = h + attn @ c_proj.weight + c_proj.bias; h = h + mlp(LayerNorm(h, ln_2)) with
    mlp(x) = gelu_new(x @ c_fc.weight + b) @ c_proj.weight + b; logits = LayerNorm(h, ln_f) @ wte.T.
"""
from __future__ import annotations

import math

import numpy as np


def _f64(weights: dict) -> dict:
    return {name: np.asarray(value).astype(np.float64) for name, value in weights.items()}


def gemma_rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + weight)


def layer_norm(x, weight, bias, eps):
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * weight + bias


def gelu_tanh(x):
    """transformers' gelu_new / gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rotate(x, pos: int, theta: float, factor: float = 1.0):
    """Hugging Face's rotate_half rotary embedding of x [..., HD] at `pos` (linear scaling: the
    inverse frequencies divided by `factor`)."""
    hd = x.shape[-1]
    inv_freq = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)) / factor
    emb = np.concatenate([pos * inv_freq, pos * inv_freq])
    half = hd // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(emb) + rotated * np.sin(emb)


def softcap(x, cap):
    return x if cap is None else np.tanh(x / cap) * cap


def _softmax(s):
    e = np.exp(s - s.max())
    return e / e.sum()


def gemma_layer_types(config: dict, pattern_default: int) -> list[str]:
    """`layer_types`, else transformers' default: full attention every `sliding_window_pattern`-th
    layer (Gemma2: 2, layer 0 sliding; Gemma3: 6)."""
    if config.get("layer_types") is not None:
        return list(config["layer_types"])
    pattern = config.get("sliding_window_pattern", pattern_default)
    return ["sliding_attention" if (i + 1) % pattern else "full_attention"
            for i in range(config["num_hidden_layers"])]


def gemma3_rope(config: dict) -> dict[str, tuple[float, float]]:
    """{layer type: (theta, linear factor)} from either config form."""
    params = config.get("rope_parameters")
    out = {}
    if isinstance(params, dict) and "full_attention" in params:
        for kind in ("full_attention", "sliding_attention"):
            p = params[kind]
            factor = float(p.get("factor", 1.0)) if p.get("rope_type", "default") == "linear" else 1.0
            out[kind] = (float(p["rope_theta"]), factor)
        return out
    scaling = config.get("rope_scaling") or {}
    factor = float(scaling["factor"]) if scaling.get("rope_type", scaling.get("type")) == "linear" else 1.0
    out["full_attention"] = (float(config.get("rope_theta", 1_000_000.0)), factor)
    out["sliding_attention"] = (float(config.get("rope_local_base_freq", 10_000.0)), 1.0)
    return out


class GemmaRef:
    """Gemma2 (`qk_norm=False`) and Gemma3 text (`qk_norm=True`) decode, one token at a time."""

    def __init__(self, weights: dict, config: dict, *, gemma3: bool):
        c = config
        self.gemma3 = gemma3
        self.w = _f64(weights)
        if c.get("tie_word_embeddings", True):
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        self.D, self.L = c["hidden_size"], c["num_hidden_layers"]
        self.H, self.KVH, self.HD = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.eps = float(c["rms_norm_eps"])
        self.scaling = float(c["query_pre_attn_scalar"]) ** -0.5
        self.window = c["sliding_window"]
        self.attn_cap = c.get("attn_logit_softcapping")
        self.final_cap = c.get("final_logit_softcapping")
        self.layer_types = gemma_layer_types(c, 6 if gemma3 else 2)
        if gemma3:
            self.rope = gemma3_rope(c)
        else:
            params = c.get("rope_parameters") or {}
            theta = float(params.get("rope_theta", c.get("rope_theta", 10000.0)))
            self.rope = {"full_attention": (theta, 1.0), "sliding_attention": (theta, 1.0)}
        self.pos = 0
        self.k = [np.zeros((0, self.KVH, self.HD)) for _ in range(self.L)]
        self.v = [np.zeros((0, self.KVH, self.HD)) for _ in range(self.L)]

    def step(self, token: int) -> np.ndarray:
        w, eps, pos = self.w, self.eps, self.pos
        h = w["model.embed_tokens.weight"][int(token)] * np.sqrt(self.D)
        group = self.H // self.KVH
        for i in range(self.L):
            p = f"model.layers.{i}."
            kind = self.layer_types[i]
            x = gemma_rms_norm(h, w[p + "input_layernorm.weight"], eps)
            q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(self.H, self.HD)
            k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(self.KVH, self.HD)
            v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(self.KVH, self.HD)
            if self.gemma3:
                q = gemma_rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
                k = gemma_rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
            theta, factor = self.rope[kind]
            q, k = rotate(q, pos, theta, factor), rotate(k, pos, theta, factor)
            self.k[i] = np.concatenate([self.k[i], k[None]])
            self.v[i] = np.concatenate([self.v[i], v[None]])
            first = max(0, pos - self.window + 1) if kind == "sliding_attention" else 0
            heads = []
            for j in range(self.H):
                keys, values = self.k[i][first:, j // group], self.v[i][first:, j // group]
                scores = softcap(keys @ q[j] * self.scaling, self.attn_cap)
                heads.append(_softmax(scores) @ values)
            attn = np.concatenate(heads) @ w[p + "self_attn.o_proj.weight"].T
            h = h + gemma_rms_norm(attn, w[p + "post_attention_layernorm.weight"], eps)
            x = gemma_rms_norm(h, w[p + "pre_feedforward_layernorm.weight"], eps)
            mlp = (gelu_tanh(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)) \
                @ w[p + "mlp.down_proj.weight"].T
            h = h + gemma_rms_norm(mlp, w[p + "post_feedforward_layernorm.weight"], eps)
        self.pos += 1
        logits = gemma_rms_norm(h, w["model.norm.weight"], eps) @ w["lm_head.weight"].T
        return softcap(logits, self.final_cap)


class GPT2Ref:
    """GPT2LMHeadModel decode, one token at a time (`transformer.` names; lm_head tied to wte)."""

    def __init__(self, weights: dict, config: dict):
        c = config
        self.w = _f64({k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k: v
                       for k, v in weights.items()})
        self.D, self.L, self.H = c["n_embd"], c["n_layer"], c["n_head"]
        self.HD = self.D // self.H
        self.eps = float(c.get("layer_norm_epsilon", 1e-5))
        self.scale = self.HD ** -0.5 if c.get("scale_attn_weights", True) else 1.0
        if c.get("tie_word_embeddings", True) or "lm_head.weight" not in self.w:
            self.w["lm_head.weight"] = self.w["transformer.wte.weight"]
        self.pos = 0
        self.k = [np.zeros((0, self.H, self.HD)) for _ in range(self.L)]
        self.v = [np.zeros((0, self.H, self.HD)) for _ in range(self.L)]

    def step(self, token: int) -> np.ndarray:
        w, eps = self.w, self.eps
        h = w["transformer.wte.weight"][int(token)] + w["transformer.wpe.weight"][self.pos]
        for i in range(self.L):
            p = f"transformer.h.{i}."
            x = layer_norm(h, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
            qkv = x @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
            q, k, v = (part.reshape(self.H, self.HD) for part in np.split(qkv, 3))
            self.k[i] = np.concatenate([self.k[i], k[None]])
            self.v[i] = np.concatenate([self.v[i], v[None]])
            heads = [_softmax(self.k[i][:, j] @ q[j] * self.scale) @ self.v[i][:, j] for j in range(self.H)]
            h = h + np.concatenate(heads) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
            x = layer_norm(h, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
            up = gelu_tanh(x @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
            h = h + up @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        self.pos += 1
        return layer_norm(h, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps) @ w["lm_head.weight"].T


def gemma_forward_full(weights: dict, config: dict, tokens, *, gemma3: bool) -> np.ndarray:
    """Logits [S, V] of a whole sequence at once, as transformers' forward over a prompt: matrices
    over positions and an additive mask (causal, and for a sliding layer `kv > q - window`), no
    cache. A second formulation to check `GemmaRef.step` against."""
    ref = GemmaRef(weights, config, gemma3=gemma3)  # its settings and weights, not its cache
    w, eps, S = ref.w, ref.eps, len(tokens)
    q_idx, kv_idx = np.arange(S)[:, None], np.arange(S)[None, :]
    h = w["model.embed_tokens.weight"][np.asarray(tokens)] * np.sqrt(ref.D)
    for i in range(ref.L):
        p = f"model.layers.{i}."
        kind = ref.layer_types[i]
        allowed = (kv_idx <= q_idx) & ((kv_idx > q_idx - ref.window) if kind == "sliding_attention" else True)
        mask = np.where(allowed, 0.0, -np.inf)
        x = gemma_rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(S, ref.H, ref.HD)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(S, ref.KVH, ref.HD)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(S, ref.KVH, ref.HD)
        if gemma3:
            q = gemma_rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = gemma_rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        theta, factor = ref.rope[kind]
        q = np.stack([rotate(q[t], t, theta, factor) for t in range(S)])
        k = np.stack([rotate(k[t], t, theta, factor) for t in range(S)])
        k, v = np.repeat(k, ref.H // ref.KVH, axis=1), np.repeat(v, ref.H // ref.KVH, axis=1)  # repeat_kv
        scores = softcap(np.einsum("qhd,khd->hqk", q, k) * ref.scaling, ref.attn_cap) + mask
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(S, ref.H * ref.HD) @ w[p + "self_attn.o_proj.weight"].T
        h = h + gemma_rms_norm(attn, w[p + "post_attention_layernorm.weight"], eps)
        x = gemma_rms_norm(h, w[p + "pre_feedforward_layernorm.weight"], eps)
        mlp = (gelu_tanh(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)) \
            @ w[p + "mlp.down_proj.weight"].T
        h = h + gemma_rms_norm(mlp, w[p + "post_feedforward_layernorm.weight"], eps)
    return softcap(gemma_rms_norm(h, w["model.norm.weight"], eps) @ w["lm_head.weight"].T, ref.final_cap)
