"""Issue 39, the gemma2, gemma3_text and gpt2 families of `convert-hf`: a tiny random checkpoint of
each (tests/gemma_gpt2_checkpoints.py: the keys of current transformers' config.json, the real tensor
names, nonzero norms and biases) converted and run with its example graph, against an
independent NumPy reference of Hugging Face's modeling code (tests/gemma_gpt2_ref.py): logits within
1e-4 of the largest |logit| at every step of a teacher-forced run longer than the sliding
window, greedy tokens equal. Older config spellings convert to the same model; every unsupported
setting is an error naming the config key."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError
from oi2jax.model import open_model
from oi2jax.model.convert import convert_hf, read_config
from oi2jax.numerics import default_inv_freq

import gemma_gpt2_checkpoints as ck
from conftest import EXAMPLES
from gemma_gpt2_ref import GemmaRef, GPT2Ref, gemma_forward_full

T, WINDOW, STEPS, GREEDY = 20, 5, 16, 8
TOL = 1e-4  # |logit - reference| / max |reference logit|, every step (the bound)
GEMMA_SIZES = dict(vocab=64, hidden=32, heads=4, kv_heads=2, head_dim=16, intermediate=48, max_positions=T,
                   sliding_window=WINDOW)


def config_of(family: str, form: str = "new", **extra) -> dict:
    if family == "gemma2":
        return ck.gemma2_config(layers=3, rope_form=form, **GEMMA_SIZES, **extra)
    if family == "gemma3_text":
        return ck.gemma3_text_config(layers=4, rope_form=form, **GEMMA_SIZES, **extra)
    return ck.gpt2_config(vocab=64, hidden=32, layers=2, heads=4, positions=T + 4, **extra)


def reference(family: str, weights: dict, config: dict):
    return GPT2Ref(weights, config) if family == "gpt2" else GemmaRef(weights, config, gemma3=family == "gemma3_text")


def _rel(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


@pytest.fixture(scope="module", params=["gemma2", "gemma3_text", "gpt2"])
def family(request, tmp_path_factory):
    """(name, compiled example graph, weights, config) of a converted random checkpoint."""
    name = request.param
    tmp = tmp_path_factory.mktemp(name)
    config = config_of(name, tie_word_embeddings=name != "gemma3_text")  # tied (the default) and untied
    if name == "gemma3_text":  # Gemma 3 4B-27B's linear scaling on the full-attention layers
        config["rope_parameters"]["full_attention"] = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    weights = ck.random_weights(config, seed=7)
    summary = convert_hf(ck.write_checkpoint(tmp / "ck", config, weights), tmp / "m.oinf",
                         max_positions=T if name == "gpt2" else None)
    assert summary.graph == f"{name}_decode.oi"
    prog = oi2jax.compile(EXAMPLES / summary.graph, model=tmp / "m.oinf", ops=["nn"])
    return name, prog, weights, config


def test_logits_match_the_hugging_face_reference_at_every_step(family):
    name, prog, weights, config = family
    ref = reference(name, weights, config)
    sess = prog.session()
    tokens = np.random.default_rng(1).integers(0, 64, STEPS)
    worst = 0.0
    for k, tok in enumerate(tokens):
        sess.step(token=np.int32(tok))
        want = ref.step(int(tok))
        worst = max(worst, _rel(sess.read("logits"), want))
        assert worst <= TOL, (name, k, worst)
        assert int(sess.read("next")) == int(np.argmax(want)), (name, k)
    assert worst > 0  # really computed in f32


def test_greedy_generation_equals_the_reference(family):
    name, prog, weights, config = family
    ref = reference(name, weights, config)
    sess = prog.session()
    got, want, tok, ref_tok = [], [], 3, 3
    for _ in range(GREEDY):
        sess.step(token=np.int32(tok))
        tok = int(sess.read("next"))
        ref_tok = int(np.argmax(ref.step(ref_tok)))
        got.append(tok)
        want.append(ref_tok)
    assert got == want


@pytest.mark.parametrize("name", ["gemma2", "gemma3_text"])
def test_the_sliding_window_bounds_attention(name):
    """Past the window, the windowed reference (which the graph matches, above) and one whose
    window covers every position disagree: the window is really applied, by layer type."""
    config = config_of(name)
    weights = ck.random_weights(config, seed=7)
    windowed, full = reference(name, weights, config), reference(name, weights, {**config, "sliding_window": T})
    tokens = np.random.default_rng(1).integers(0, 64, STEPS)
    gaps = [_rel(windowed.step(int(t)), full.step(int(t))) for t in tokens]
    assert max(gaps[:WINDOW]) < 1e-12 and min(gaps[WINDOW + 1:]) > 1e-3
    types = read_config(config).constants
    assert [int(types[f"model.layers.{i}.self_attn.sliding_window"]) for i in range(config["num_hidden_layers"])] \
        == [WINDOW if kind == "sliding_attention" else T for kind in config["layer_types"]]


def _tensors(path) -> dict:
    model = open_model(path)
    return {name: np.asarray(model.load(name)) for name in model.tensors}, dict(model.sizevars), \
        {k: v.value for k, v in model.metadata.items()}


@pytest.mark.parametrize("name", ["gemma2", "gemma3_text", "gpt2"])
def test_older_spellings_convert_to_the_same_model(name, tmp_path):
    """gemma2 / gemma3_text: transformers 4.x configs (rope_theta, rope_local_base_freq,
    sliding_window_pattern, no layer_types); gpt2: the original files' names without
    `transformer.`, with their causal-mask buffers."""
    config = config_of(name)
    weights = ck.random_weights(config, seed=2)
    convert_hf(ck.write_checkpoint(tmp_path / "new", config, weights), tmp_path / "new.oinf")
    old_weights = weights
    if name == "gpt2":
        old_config = config
        old_weights = {k.removeprefix("transformer."): v for k, v in weights.items()}
        for i in range(config["n_layer"]):
            old_weights[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, T + 4, T + 4), np.float32))
            old_weights[f"h.{i}.attn.masked_bias"] = np.float32(-1e4)
    else:
        old_config = config_of(name, form="old")
    summary = convert_hf(ck.write_checkpoint(tmp_path / "old", old_config, old_weights), tmp_path / "old.oinf")
    new, old = _tensors(tmp_path / "new.oinf"), _tensors(tmp_path / "old.oinf")
    assert new[1] == old[1] and new[2] == old[2]
    assert new[0].keys() == old[0].keys()
    for key in new[0]:
        assert new[0][key].dtype == old[0][key].dtype and new[0][key].tobytes() == old[0][key].tobytes(), key
    if name == "gpt2":
        assert any("causal-mask buffer" in note for note in summary.notes)


def test_what_the_gemma_conversion_computes(tmp_path):
    """Gemma 3: each layer's rotary frequencies are its type's (a linear scaling on full attention
    only); tied embeddings are stored once (an alias); Gemma's norm weights are stored as w."""
    config = config_of("gemma3_text")
    config["rope_parameters"]["full_attention"] = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    weights = ck.random_weights(config, seed=2)
    summary = convert_hf(ck.write_checkpoint(tmp_path / "ck", config, weights), tmp_path / "m.oinf")
    tensors, sizevars, metadata = _tensors(tmp_path / "m.oinf")
    full, local = default_inv_freq(1e6, 16) / np.float32(8.0), default_inv_freq(1e4, 16)
    for i, kind in enumerate(config["layer_types"]):
        want = full if kind == "full_attention" else local
        assert tensors[f"model.layers.{i}.self_attn.rope.inv_freq"].tobytes() == want.tobytes()
    assert "lm_head.weight" not in tensors and metadata["alias.lm_head.weight"] == "model.embed_tokens.weight"
    assert tensors["model.layers.0.input_layernorm.weight"].tobytes() == \
        weights["model.layers.0.input_layernorm.weight"].tobytes()
    assert metadata["embed_scale"] == pytest.approx(32 ** 0.5) and metadata["attn_scale"] == pytest.approx(16 ** -0.5)
    assert metadata["norm_offset"] == 1.0
    assert summary.tensors["model.layers.0.self_attn.sliding_window"] == "i32"
    assert sizevars["R"] == 8


def _error(config) -> str:
    with pytest.raises(OiError) as info:
        read_config(config, "ck/config.json")
    return info.value.render()


@pytest.mark.parametrize("name, edit, message", [
    ("gemma2", {"hidden_activation": "gelu"}, "hidden_activation is 'gelu': only the tanh gelu"),
    ("gemma2", {"attn_logit_softcapping": None}, "attn_logit_softcapping is null: examples/gemma2_decode.oi always"),
    ("gemma2", {"final_logit_softcapping": None}, "final_logit_softcapping is null"),
    ("gemma2", {"sliding_window": None}, "sliding_window is null"),
    ("gemma2", {"layer_types": ["sliding_attention"]}, "layer_types must be a list of num_hidden_layers (3)"),
    ("gemma2", {"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]},
     "layer_types[1] is 'chunked_attention'"),
    ("gemma2", {"attention_bias": True}, "attention_bias is true: Gemma projections have no biases"),
    ("gemma2", {"query_pre_attn_scalar": -1}, "query_pre_attn_scalar must be a positive number"),
    ("gemma2", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}},
     "rope_parameters.rope_type is 'yarn'"),
    ("gemma3_text", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping is 50.0: examples/gemma3_text_decode.oi"),
    ("gemma3_text", {"final_logit_softcapping": 30.0}, "final_logit_softcapping is 30.0"),
    ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention is true"),
    ("gemma3_text", {"rope_parameters": {"full_attention": {"rope_type": "dynamic", "factor": 2.0},
                                         "sliding_attention": {"rope_type": "default"}}},
     "(rope_parameters.full_attention): rope_parameters.rope_type is 'dynamic'"),
    ("gemma3_text", {"rope_local_base_freq": 1e4}, "rope_local_base_freq is set beside rope_parameters keyed by"),
    ("gemma3_text", {"quantization_config": {"quant_method": "bitsandbytes"}}, "quantization_config is set"),
    ("gpt2", {"activation_function": "relu"}, "activation_function is 'relu': only the tanh gelu"),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx is true"),
    ("gpt2", {"add_cross_attention": True}, "add_cross_attention is true"),
    ("gpt2", {"n_head": 5}, "n_embd 32 is not a multiple of n_head 5"),
    ("gpt2", {"n_layer": 10 ** 30}, "n_layer 1000000000000000000000000000000 is out of range"),
])
def test_unsupported_settings_name_the_key(name, edit, message):
    config = {**config_of(name), **edit}
    assert message in _error(config)


def test_gpt2_positions_past_its_learned_ones_are_refused(tmp_path):
    config = config_of("gpt2")
    with pytest.raises(OiError) as info:
        read_config(config, "ck/config.json", max_positions=T + 5)
    assert f"T = {T + 5} is beyond n_positions {T + 4}: GPT-2 has no position embedding past" in info.value.render()
    weights = ck.random_weights(config)
    weights["h.0.ln_1.weight"] = weights["transformer.h.0.ln_1.weight"]
    with pytest.raises(OiError) as info:
        convert_hf(ck.write_checkpoint(tmp_path / "ck", config, weights), tmp_path / "m.oinf")
    assert "tensors h.0.ln_1.weight and transformer.h.0.ln_1.weight are one GPT-2 tensor" in info.value.render()
    assert not (tmp_path / "m.oinf").exists()


def test_interpreter_agrees_on_the_first_step(family):
    """The reference interpreter (the nn ops' NumPy references, node by node) on step 0."""
    name, prog, weights, config = family
    interp = oi2jax.compile(EXAMPLES / f"{name}_decode.oi", model=prog.model_path, ops=["nn"], mode="interpret")
    assert _rel(interp.run({"token": np.int32(5)})["logits"], reference(name, weights, config).step(5)) <= TOL


def test_gemma3_rope_settings_in_both_spellings():
    """A linear scaling on full attention: `rope_parameters.full_attention` (transformers 5) and
    `rope_scaling` (4.5x) give the same per-layer frequencies; sliding layers keep theirs."""
    new = config_of("gemma3_text")
    new["rope_parameters"]["full_attention"] = {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5}
    old = config_of("gemma3_text", form="old", rope_theta=5e5, rope_scaling={"rope_type": "linear", "factor": 4.0})
    a, b = read_config(new).constants, read_config(old).constants
    assert a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert a["model.layers.2.self_attn.rope.inv_freq"].tobytes() == (default_inv_freq(5e5, 16) / np.float32(4)).tobytes()
    assert a["model.layers.0.self_attn.rope.inv_freq"].tobytes() == default_inv_freq(1e4, 16).tobytes()


def test_a_transposed_conv1d_weight_is_named_with_its_shape(tmp_path):
    """GPT-2's Conv1D weights are [in, out]: one stored [out, in] (as nn.Linear) is refused by name."""
    config = config_of("gpt2")
    weights = ck.random_weights(config)
    weights["transformer.h.1.attn.c_attn.weight"] = np.ascontiguousarray(weights["transformer.h.1.attn.c_attn.weight"].T)
    with pytest.raises(OiError) as info:
        convert_hf(ck.write_checkpoint(tmp_path / "ck", config, weights), tmp_path / "m.oinf")
    assert "tensor transformer.h.1.attn.c_attn.weight has shape [96, 32], expected [32, 96] (hidden_size, 3*n_embd)" \
        in info.value.render()


def test_omitted_keys_take_transformers_defaults_with_a_note():
    config = config_of("gemma2")
    for key in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "tie_word_embeddings"):
        del config[key]
    cfg = read_config(config, "ck/config.json")
    assert cfg.metadata["attn_scale"] == 256 ** -0.5 and cfg.tied
    assert (cfg.metadata["attn_softcap"], cfg.metadata["final_softcap"]) == (50.0, 30.0)
    assert "ck/config.json names no query_pre_attn_scalar: using transformers' default 256" in cfg.notes
    old = config_of("gemma3_text", form="old")
    del old["sliding_window_pattern"], old["rope_local_base_freq"]
    cfg = read_config(old, "ck/config.json")
    kinds = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(4)]  # all sliding: L = 4 < 6
    assert [int(cfg.constants[f"model.layers.{i}.self_attn.sliding_window"]) for i in range(4)] == \
        [WINDOW if k == "sliding_attention" else T for k in kinds]
    assert cfg.constants["model.layers.0.self_attn.rope.inv_freq"].tobytes() == default_inv_freq(1e4, 16).tobytes()


@pytest.mark.parametrize("name", ["gemma2", "gemma3_text"])
def test_the_reference_steps_equal_its_whole_sequence_form(name):
    """tests/gemma_gpt2_ref.py checked against itself: one token at a time with a cache equals the
    whole sequence with transformers' additive masks (causal, sliding window)."""
    config = config_of(name)
    weights = ck.random_weights(config, seed=4)
    tokens = np.random.default_rng(2).integers(0, 64, 12)
    ref = GemmaRef(weights, config, gemma3=name == "gemma3_text")
    steps = np.stack([ref.step(int(t)) for t in tokens])
    np.testing.assert_allclose(steps, gemma_forward_full(weights, config, tokens, gemma3=name == "gemma3_text"),
                               rtol=1e-12, atol=1e-12)
