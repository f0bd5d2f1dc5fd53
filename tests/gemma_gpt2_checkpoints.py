"""Tiny random Hugging Face checkpoints of the Gemma2, Gemma3 text and GPT-2 families, for testing
(not a test file): `config.json` with the keys current transformers writes for each family, and
random weights under the real tensor names, written with safetensors.

    config = gemma2_config(vocab=64, hidden=32, ...)
    weights = random_weights(config, seed=0)        # {HF tensor name: float32 array}
    write_checkpoint(directory, config, weights)

Norm weights and biases are nonzero (a Gemma norm weight w scales by 1 + w, so w is drawn around
0); tied embeddings (the families' default) store no lm_head.weight, as `save_pretrained` does.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _gemma_common(architecture: str, model_type: str, *, vocab, hidden, layers, heads, kv_heads, head_dim,
                  intermediate, max_positions, sliding_window) -> dict:
    """The `config.json` keys Gemma 2 and Gemma 3 (text) write alike."""
    return {
        "architectures": [architecture], "model_type": model_type,
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": intermediate,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": max_positions, "initializer_range": 0.02, "rms_norm_eps": 1e-6,
        "use_cache": True, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
        "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0,
        "sliding_window": sliding_window, "torch_dtype": "float32",
    }


def gemma2_config(*, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int,
                  intermediate: int, max_positions: int, sliding_window: int, rope_form: str = "new",
                  **extra) -> dict:
    """A Gemma2ForCausalLM `config.json` (transformers 5 with `rope_form="new"`, 4.x with "old")."""
    config = {
        **_gemma_common("Gemma2ForCausalLM", "gemma2", vocab=vocab, hidden=hidden, layers=layers, heads=heads,
                        kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate,
                        max_positions=max_positions, sliding_window=sliding_window),
        "query_pre_attn_scalar": head_dim * 2, "final_logit_softcapping": 3.0, "attn_logit_softcapping": 5.0,
    }
    if rope_form == "new":
        config["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
        config["transformers_version"] = "5.0.0"
    else:  # 4.4x: no layer_types (even layers slide), a top-level rope_theta, hidden_act beside hidden_activation
        config.update(rope_theta=10000.0, hidden_act="gelu_pytorch_tanh", cache_implementation="hybrid",
                      transformers_version="4.44.0")
    config.update(extra)
    return config


def gemma3_text_config(*, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int,
                       intermediate: int, max_positions: int, sliding_window: int, rope_form: str = "new",
                       **extra) -> dict:
    """A Gemma3ForCausalLM (model_type gemma3_text) `config.json`: `rope_parameters` keyed by layer
    type (transformers 5, "new") or rope_theta + rope_local_base_freq + sliding_window_pattern (4.5x)."""
    config = {
        **_gemma_common("Gemma3ForCausalLM", "gemma3_text", vocab=vocab, hidden=hidden, layers=layers, heads=heads,
                        kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate,
                        max_positions=max_positions, sliding_window=sliding_window),
        "query_pre_attn_scalar": head_dim, "final_logit_softcapping": None, "attn_logit_softcapping": None,
        "use_bidirectional_attention": False,
    }
    if rope_form == "new":
        config["layer_types"] = ["sliding_attention" if (i + 1) % 3 else "full_attention" for i in range(layers)]
        config["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
        config["transformers_version"] = "5.0.0"
    else:
        config.update(rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, rope_scaling=None,
                      sliding_window_pattern=3, cache_implementation="hybrid", transformers_version="4.50.0")
    config.update(extra)
    return config


def gpt2_config(*, vocab: int, hidden: int, layers: int, heads: int, positions: int, inner=None, **extra) -> dict:
    """A GPT2LMHeadModel `config.json` (its own key names: n_embd, n_layer, n_head, n_positions)."""
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": vocab, "n_embd": hidden, "n_layer": layers, "n_head": heads, "n_positions": positions,
        "n_ctx": positions, "n_inner": inner, "activation_function": "gelu_new",
        "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02, "summary_type": "cls_index", "summary_use_proj": True,
        "summary_activation": None, "summary_proj_to_labels": True, "summary_first_dropout": 0.1,
        "scale_attn_weights": True, "use_cache": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "bos_token_id": vocab - 1, "eos_token_id": vocab - 1,
        "torch_dtype": "float32", "transformers_version": "4.57.0",
    }
    config.update(extra)
    return config


def random_weights(config: dict, *, seed: int = 0) -> dict[str, np.ndarray]:
    """{HF tensor name: float32 array} for a config of one of the three families. Scales keep the
    logits well-conditioned and every nonlinearity (soft-caps, gelu, norms) away from identity."""
    rng = np.random.default_rng(seed)

    def normal(*shape, std=0.1):
        return (std * rng.standard_normal(shape)).astype(np.float32)

    if config["model_type"] == "gpt2":
        D, V, P = config["n_embd"], config["vocab_size"], config["n_positions"]
        F = config.get("n_inner") or 4 * D
        w = {"transformer.wte.weight": normal(V, D, std=0.5), "transformer.wpe.weight": normal(P, D, std=0.3)}
        for i in range(config["n_layer"]):
            p = f"transformer.h.{i}."
            w[p + "ln_1.weight"], w[p + "ln_1.bias"] = 1 + normal(D), normal(D)
            w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"] = normal(D, 3 * D, std=0.3), normal(3 * D)
            w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"] = normal(D, D), normal(D)
            w[p + "ln_2.weight"], w[p + "ln_2.bias"] = 1 + normal(D), normal(D)
            w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"] = normal(D, F, std=0.3), normal(F)
            w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"] = normal(F, D), normal(D)
        w["transformer.ln_f.weight"], w["transformer.ln_f.bias"] = 1 + normal(D), normal(D)
        if not config.get("tie_word_embeddings", True):
            w["lm_head.weight"] = normal(V, D, std=0.5)
        return w
    V, D, F = config["vocab_size"], config["hidden_size"], config["intermediate_size"]
    H, KVH, HD = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    w = {"model.embed_tokens.weight": normal(V, D, std=0.3)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            w[p + norm + ".weight"] = normal(D, std=0.2)
        w[p + "self_attn.q_proj.weight"] = normal(H * HD, D, std=0.3)
        w[p + "self_attn.k_proj.weight"] = normal(KVH * HD, D, std=0.3)
        w[p + "self_attn.v_proj.weight"] = normal(KVH * HD, D, std=0.3)
        w[p + "self_attn.o_proj.weight"] = normal(D, H * HD)
        if config["model_type"] == "gemma3_text":
            w[p + "self_attn.q_norm.weight"] = normal(HD, std=0.2)
            w[p + "self_attn.k_norm.weight"] = normal(HD, std=0.2)
        w[p + "mlp.gate_proj.weight"] = normal(F, D, std=0.3)
        w[p + "mlp.up_proj.weight"] = normal(F, D, std=0.3)
        w[p + "mlp.down_proj.weight"] = normal(D, F)
    w["model.norm.weight"] = normal(D, std=0.2)
    if not config.get("tie_word_embeddings", True):
        w["lm_head.weight"] = normal(V, D, std=0.3)
    return w


def write_checkpoint(directory, config: dict, weights: dict) -> Path:
    """`config.json` and `model.safetensors` under `directory` (created)."""
    from safetensors.numpy import save_file
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    return directory
