"""The Gemma rows of the architecture table: `gemma2` (Gemma2ForCausalLM) and `gemma3_text`
(Gemma3ForCausalLM), with examples/gemma2_decode.oi and examples/gemma3_text_decode.oi.

Both: the embedding scaled by sqrt(hidden_size) (metadata `embed_scale`), RMSNorm with the
(1 + w) weight (metadata `norm_offset` = 1, the graphs' `rms_norm(..., offset=norm_offset)`; the
checkpoint's w is stored as is; a source whose norm weights already hold 1 + w, as llama.cpp's
GGUF files do, can say 0 instead), a
GeGLU MLP with the tanh gelu, four norms a layer, attention scaled by query_pre_attn_scalar^-0.5
(metadata `attn_scale`), and layers of two types (`layer_types`, or transformers' default
pattern): a `sliding_attention` layer attends to the last `sliding_window` positions, a
`full_attention` layer to all of them. The per-layer computed tensors:
`model.layers.{l}.self_attn.sliding_window` (i32: the window, T for a full-attention layer) and,
for gemma3_text, `model.layers.{l}.self_attn.rope.inv_freq` (the rotary frequencies of the
layer's type: `rope_parameters` keyed by layer type, or the older `rope_theta` + `rope_scaling`
for full attention and `rope_local_base_freq` for sliding). gemma2 soft-caps attention scores
and logits (metadata `attn_softcap`, `final_softcap`); its graph always does, so a config that
turns soft-capping off is refused, and gemma3_text's graph never does, so one that turns it on
is refused."""
from __future__ import annotations

import numpy as np

from .config import ConfigReader
from .families import (ATTN_NORM, DOWN, EMBED, FINAL, MLP_NORM, NO_QUANT, O_PROJ, P, QKV, SWIGLU,
                       Family, Meta, Setting, Tensor, attention_sizes, decoder_sizes, no_bias, register, rotary)
from .rope import rope_inv_freq

SLIDING, FULL = "sliding_attention", "full_attention"
WINDOW = P + "self_attn.sliding_window"  # i32 per layer: how many positions the layer attends to
LAYER_INV_FREQ = P + "self_attn.rope.inv_freq"  # gemma3_text: f32[R] per layer, its type's rotary frequencies
# transformers' class defaults, used (with a note) when a config omits the key
DEFAULTS = {"gemma2": {"query_pre_attn_scalar": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
                       "final_logit_softcapping": 30.0},
            "gemma3_text": {"query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6,
                            "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0}}

GELU_TANH = Setting("hidden_activation", ("gelu_pytorch_tanh", "gelu_new"), "gelu_pytorch_tanh",
                    "only the tanh gelu ('gelu_pytorch_tanh', 'gelu_new': the GeGLU MLP of Gemma) is supported")


def _default(cfg: ConfigReader, model_type: str, key: str):
    """The config's value of `key`, else transformers' default for the family (with a note)."""
    value = cfg.get(key)
    if value is None:
        value = DEFAULTS[model_type][key]
        cfg.notes.append(f"{cfg.where} names no {key}: using transformers' default {value!r}")
    return value


def layer_types(cfg: ConfigReader, model_type: str, n_layers: int) -> list[str]:
    """`layer_types` (each sliding_attention or full_attention, one per layer), else transformers'
    default: every `sliding_window_pattern`-th layer is full attention (gemma2: every 2nd, a fixed
    pattern; gemma3_text: the key, default 6)."""
    types = cfg.config.get("layer_types")
    if types is None:
        pattern = 2 if model_type == "gemma2" else cfg.size(
            "sliding_window_pattern", default=_default(cfg, model_type, "sliding_window_pattern"))
        return [SLIDING if (i + 1) % pattern else FULL for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers:
        cfg.fail(f"layer_types must be a list of num_hidden_layers ({n_layers}) layer types, got {types!r:.80}")
    for i, kind in enumerate(types):
        if kind not in (SLIDING, FULL):
            cfg.fail(f"layer_types[{i}] is {kind!r}: supported layer types are {SLIDING!r} and {FULL!r}")
    return list(types)


def _layers(model_type: str):
    """The hook of a Gemma family: embed_scale, attn_scale, soft-capping, and the per-layer
    windows (and, gemma3_text, rotary frequencies) by layer type."""
    def derive(cfg: ConfigReader, sizes: dict, metadata: dict, constants: dict) -> None:
        metadata["embed_scale"] = float(sizes["D"]) ** 0.5
        metadata["norm_offset"] = 1.0  # the graphs' rms_norm(offset=): Gemma's (1 + w), w as stored
        scalar = cfg.number("query_pre_attn_scalar", default=_default(cfg, model_type, "query_pre_attn_scalar"))
        metadata["attn_scale"] = scalar ** -0.5
        if cfg.flag("use_bidirectional_attention"):
            cfg.fail("use_bidirectional_attention is true: only causal attention (a decoder) is supported")
        if "sliding_window" in cfg.config and cfg.config["sliding_window"] is None:
            cfg.fail("sliding_window is null: the sliding_attention layers of a Gemma model need a window")
        window = cfg.size("sliding_window", default=_default(cfg, model_type, "sliding_window"))
        types = layer_types(cfg, model_type, sizes["L"])
        for i, kind in enumerate(types):
            constants[WINDOW.format(l=i)] = np.int32(min(window, sizes["T"]) if kind == SLIDING else sizes["T"])
        if model_type == "gemma2":
            _softcaps(cfg, metadata)
            return
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if cfg.get(key) is not None:
                cfg.fail(f"{key} is {cfg.get(key)!r}: examples/gemma3_text_decode.oi does not soft-cap "
                         f"(Gemma 3 models set it to null)")
        freqs = _rotary_by_type(cfg, sizes["HD"])
        for i, kind in enumerate(types):
            constants[LAYER_INV_FREQ.format(l=i)] = freqs[kind]
    return derive


def _softcaps(cfg: ConfigReader, metadata: dict) -> None:
    for key, name in (("attn_logit_softcapping", "attn_softcap"), ("final_logit_softcapping", "final_softcap")):
        if key in cfg.config and cfg.config[key] is None:
            cfg.fail(f"{key} is null: examples/gemma2_decode.oi always soft-caps (Gemma 2 is trained with "
                     f"attn_logit_softcapping 50.0 and final_logit_softcapping 30.0)")
        metadata[name] = cfg.number(key, default=_default(cfg, "gemma2", key))


def _rotary_by_type(cfg: ConfigReader, head_dim: int) -> dict[str, np.ndarray]:
    """Gemma 3's rotary frequencies of each layer type: `rope_parameters` keyed by layer type
    (transformers 5), or rope_theta + rope_scaling (full attention) and rope_local_base_freq
    (sliding) of older files; each computed as `rope.rope_inv_freq` does for one rope."""
    if head_dim % 2:
        cfg.fail(f"head_dim {head_dim} is odd: the rotary embedding rotates pairs of dimensions")
    c = cfg.config
    params = c.get("rope_parameters")
    subs, where = {}, {}
    if isinstance(params, dict) and (FULL in params or SLIDING in params):  # transformers 5
        for key in ("rope_scaling", "rope_local_base_freq", "rope_theta"):
            if c.get(key) is not None:
                cfg.fail(f"{key} is set beside rope_parameters keyed by layer type: which one?")
        for kind, theta_key in ((FULL, "rope_theta"), (SLIDING, "rope_local_base_freq")):
            sub = params.get(kind, {"rope_type": "default"})
            if not isinstance(sub, dict):
                cfg.fail(f"rope_parameters.{kind} must be an object, got {sub!r:.60}")
            subs[kind] = {"rope_parameters": {"rope_theta": DEFAULTS["gemma3_text"][theta_key], **sub}}
            where[kind] = f"{cfg.where} (rope_parameters.{kind})"
    else:  # transformers 4.5x
        subs[FULL] = {k: c[k] for k in ("rope_parameters", "rope_scaling", "partial_rotary_factor")
                      if c.get(k) is not None}
        if not (isinstance(params, dict) and params.get("rope_theta") is not None) or c.get("rope_theta") is not None:
            subs[FULL]["rope_theta"] = _default(cfg, "gemma3_text", "rope_theta")
        subs[SLIDING] = {"rope_theta": _default(cfg, "gemma3_text", "rope_local_base_freq")}
        where = {FULL: cfg.where, SLIDING: f"{cfg.where} (rope_local_base_freq)"}
    freqs = {}
    for kind, sub in subs.items():
        freqs[kind], _ = rope_inv_freq(ConfigReader(sub, where[kind]), head_dim)
    return freqs


FOUR_NORMS = (ATTN_NORM, MLP_NORM, Tensor(P + "pre_feedforward_layernorm.weight", ("D",)),
              Tensor(P + "post_feedforward_layernorm.weight", ("D",)))
QK_NORMS = (Tensor(P + "self_attn.q_norm.weight", ("HD",)), Tensor(P + "self_attn.k_norm.weight", ("HD",)))
GEMMA_SETTINGS = (NO_QUANT, GELU_TANH, no_bias("attention_bias", "Gemma"))
# sizes with Gemma2Config's and Gemma3TextConfig's defaults (head_dim 256, 4 kv heads)
GEMMA = dict(sizes=decoder_sizes(head_dim=256, kv_heads=4), metadata=(Meta("rms_norm_eps", "rms_norm_eps"),),
             tied_default=True, settings=GEMMA_SETTINGS)

GEMMA2 = Family("gemma2", ("Gemma2ForCausalLM",), "gemma2_decode.oi",
                (EMBED, *FOUR_NORMS, *QKV, O_PROJ, *SWIGLU, DOWN, *FINAL),
                derive=(attention_sizes, rotary, _layers("gemma2")), **GEMMA)
GEMMA3_TEXT = Family("gemma3_text", ("Gemma3ForCausalLM",), "gemma3_text_decode.oi",
                     (EMBED, *FOUR_NORMS, *QKV, *QK_NORMS, O_PROJ, *SWIGLU, DOWN, *FINAL),
                     derive=(attention_sizes, _layers("gemma3_text")), **GEMMA)

register(GEMMA2)
register(GEMMA3_TEXT)
