"""Independent NumPy references of Hugging Face's decoder families, and tiny random checkpoints of
them, for testing (not a test file).

Written from transformers' `modeling_llama.py`, `modeling_mistral.py`, `modeling_qwen2.py`,
`modeling_qwen3.py`, `modeling_phi3.py` and `modeling_rope_utils.py`, plainly, one token at a
time, in float64, from the checkpoint's own tensors (Phi-3's fused `qkv_proj` / `gate_up_proj`
split here, by the modeling code's rule, not the converter's):

    ck, weights, config = write_family(tmp / "ck", "qwen2", seed=0, **SIZES)
    ref = FamilyRef(weights, config)
    logits = ref.step(token)       # [V]; its own KV cache; position = tokens so far

Per layer (HF names): x = RMSNorm(h, input_layernorm); q, k, v = x @ W.T (+ b: qwen2);
qwen3: q, k = RMSNorm over each head (q_norm, k_norm); rotary with inv_freq of the rope type
(default: 1 / theta^(2i/HD); linear: / factor; llama3: the wavelength bands of
`_compute_llama3_parameters`); query head j reads kv head j // (H/KVH) over the positions
q-W+1..q of a sliding window W (mistral, phi3: `kv_idx > q_idx - sliding_window`), else 0..q;
scores * HD^-0.5; h += attn @ Wo.T; x = RMSNorm(h, post_attention_layernorm);
h += down(silu(gate(x)) * up(x)); logits = RMSNorm(h, norm) @ lm_head.T (the embedding when tied).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from llama_ref import rms_norm, rotate_half, silu

ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM"}


# ------------------------------------------------------------------------------- checkpoints

def family_config(model_type: str, *, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int,
                  intermediate: int, max_positions: int, head_dim: int | None = None, tied: bool = False,
                  rope: dict | None = None, sliding_window: int | None = None, rope_form: str = "new") -> dict:
    """config.json of a `model_type` model with these sizes, with the keys its current transformers
    config writes (`rope_form="old"`: top-level rope_theta and rope_scaling, as older files)."""
    rope = dict(rope or {"rope_type": "default", "rope_theta": 10000.0})
    config = {"architectures": [ARCH[model_type]], "model_type": model_type, "vocab_size": vocab,
              "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "hidden_act": "silu",
              "max_position_embeddings": max_positions, "initializer_range": 0.02, "rms_norm_eps": 1e-6,
              "use_cache": True, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": tied,
              "attention_dropout": 0.0, "torch_dtype": "float32", "transformers_version": "5.0.0"}
    if head_dim is not None:
        config["head_dim"] = head_dim
    if model_type == "llama":
        config.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    if model_type == "mistral":
        config["sliding_window"] = sliding_window
    if model_type in ("qwen2", "qwen3"):
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=layers,
                      layer_types=["full_attention"] * layers)
    if model_type == "qwen3":
        config["attention_bias"] = False
    if model_type == "phi3":
        config.update(attention_bias=False, sliding_window=sliding_window, original_max_position_embeddings=max_positions,
                      embd_pdrop=0.0, resid_pdrop=0.0, pad_token_id=0, partial_rotary_factor=1.0)
    if rope_form == "new":
        config["rope_parameters"] = rope
    else:
        theta = rope.pop("rope_theta")
        config["rope_theta"] = theta
        config["rope_scaling"] = None if rope == {"rope_type": "default"} else rope
    return config


def random_weights(config: dict, seed: int = 0, std: float = 0.3) -> dict[str, np.ndarray]:
    """Random weights with the family's tensor names: projections N(0, std), norms near 1 (never 1),
    biases nonzero."""
    rng = np.random.default_rng(seed)
    mt = config["model_type"]
    V, D, F, L = config["vocab_size"], config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    H, KVH = config["num_attention_heads"], config["num_key_value_heads"]
    HD = config.get("head_dim") or D // H

    def normal(*shape):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": normal(V, D), "model.norm.weight": norm(D)}
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(D)
        w[p + "post_attention_layernorm.weight"] = norm(D)
        q, k, v = normal(H * HD, D), normal(KVH * HD, D), normal(KVH * HD, D)
        gate, up = normal(F, D), normal(F, D)
        if mt == "phi3":
            w[p + "self_attn.qkv_proj.weight"] = np.concatenate([q, k, v])
            w[p + "mlp.gate_up_proj.weight"] = np.concatenate([gate, up])
        else:
            w.update({p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                      p + "self_attn.v_proj.weight": v, p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up})
        w[p + "self_attn.o_proj.weight"] = normal(D, H * HD)
        w[p + "mlp.down_proj.weight"] = normal(D, F)
        if mt == "qwen2":
            for name, n in (("q", H * HD), ("k", KVH * HD), ("v", KVH * HD)):
                w[p + f"self_attn.{name}_proj.bias"] = normal(n)
        if mt == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(HD)
            w[p + "self_attn.k_norm.weight"] = norm(HD)
    if not config.get("tie_word_embeddings"):
        w["lm_head.weight"] = normal(V, D)
    return w


def write_family(directory, model_type: str, seed: int = 0, **sizes) -> tuple[Path, dict, dict]:
    """A tiny random `model_type` checkpoint directory (config.json, model.safetensors): (dir,
    weights, config)."""
    from safetensors.numpy import save_file
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = family_config(model_type, **sizes)
    weights = random_weights(config, seed)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return directory, weights, config


# --------------------------------------------------------------------------------- reference

def inv_freq(config: dict, head_dim: int) -> np.ndarray:
    """modeling_rope_utils' inverse frequencies (f64): default, linear, llama3, either config form."""
    rope = dict(config.get("rope_scaling") or {})
    rope.update(config.get("rope_parameters") or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if kind == "linear":
        return inv / rope["factor"]
    if kind == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old = rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return np.where(medium, smoothed, out)
    assert kind == "default", kind
    return inv


class FamilyRef:
    """One-token-at-a-time decode of a Hugging Face model of the families above, with its own KV cache."""

    def __init__(self, weights: dict, config: dict):
        c = config
        self.mt = c["model_type"]
        self.V, self.D, self.L = c["vocab_size"], c["hidden_size"], c["num_hidden_layers"]
        self.H = c["num_attention_heads"]
        self.KVH = c.get("num_key_value_heads") or self.H
        self.HD = c.get("head_dim") or self.D // self.H
        self.eps = float(c["rms_norm_eps"])
        self.window = c.get("sliding_window") if self.mt in ("mistral", "phi3") else None
        self.inv = inv_freq(c, self.HD)
        self.w = {n: np.asarray(v, np.float64) for n, v in weights.items()}
        if c.get("tie_word_embeddings"):
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        self.pos = 0
        self.k = [np.zeros((0, self.KVH, self.HD)) for _ in range(self.L)]
        self.v = [np.zeros((0, self.KVH, self.HD)) for _ in range(self.L)]

    def _proj(self, p: str, x: np.ndarray):
        w, q_n, kv_n = self.w, self.H * self.HD, self.KVH * self.HD
        if self.mt == "phi3":  # Phi3Attention: qkv[..., :q], [q:q+kv], [q+kv:]
            qkv = x @ w[p + "self_attn.qkv_proj.weight"].T
            return qkv[:q_n], qkv[q_n:q_n + kv_n], qkv[q_n + kv_n:]
        out = []
        for name in ("q", "k", "v"):
            y = x @ w[p + f"self_attn.{name}_proj.weight"].T
            if self.mt == "qwen2":
                y = y + w[p + f"self_attn.{name}_proj.bias"]
            out.append(y)
        return out

    def _mlp(self, p: str, x: np.ndarray):
        w = self.w
        if self.mt == "phi3":  # Phi3MLP: gate, up = gate_up_proj(x).chunk(2)
            gate, up = np.split(x @ w[p + "mlp.gate_up_proj.weight"].T, 2)
        else:
            gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        return (silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T

    def step(self, token: int) -> np.ndarray:
        w, HD = self.w, self.HD
        freqs = self.pos * self.inv
        emb = np.concatenate([freqs, freqs])
        cos, sin = np.cos(emb), np.sin(emb)
        h = w["model.embed_tokens.weight"][int(token)]
        group = self.H // self.KVH
        first = 0 if self.window is None else max(0, self.pos - self.window + 1)  # kv > q - W
        for i in range(self.L):
            p = f"model.layers.{i}."
            x = rms_norm(h, w[p + "input_layernorm.weight"], self.eps)
            q, k, v = self._proj(p, x)
            q, k, v = q.reshape(self.H, HD), k.reshape(self.KVH, HD), v.reshape(self.KVH, HD)
            if self.mt == "qwen3":
                q = rms_norm(q, w[p + "self_attn.q_norm.weight"], self.eps)
                k = rms_norm(k, w[p + "self_attn.k_norm.weight"], self.eps)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            self.k[i] = np.concatenate([self.k[i], k[None]])
            self.v[i] = np.concatenate([self.v[i], v[None]])
            heads = []
            for j in range(self.H):
                keys, values = self.k[i][first:, j // group], self.v[i][first:, j // group]
                s = keys @ q[j] * HD ** -0.5
                e = np.exp(s - s.max())
                heads.append((e / e.sum()) @ values)
            h = h + np.concatenate(heads) @ w[p + "self_attn.o_proj.weight"].T
            h = h + self._mlp(p, rms_norm(h, w[p + "post_attention_layernorm.weight"], self.eps))
        self.pos += 1
        return rms_norm(h, w["model.norm.weight"], self.eps) @ w["lm_head.weight"].T
