"""convert-hf's families (model/hf/families.py) end to end: per family, a project-written tiny
random checkpoint with that family's config keys (tests/hf_ref.py) is converted and run with its
example graph, against an independent NumPy reference of the Hugging Face modeling code: logits
within 1e-4 of the largest |logit| at every step of a teacher-forced run, greedy tokens equal.
One compile per family; sliding windows shorter than the run."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax
from oi2jax.model import open_model
from oi2jax.model.convert import FAMILIES, convert_hf

from conftest import EXAMPLES
from hf_ref import FamilyRef, write_family

TOL = 1e-4  # |logit - reference| / max |reference logit|, every step (issue #39's bound)
STEPS = 9
SIZES = dict(vocab=48, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=40, max_positions=16)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 12}  # every band, at HD 8
CASES = {
    "llama-llama3": ("llama", dict(rope=LLAMA3)),
    "llama-linear-old-form": ("llama", dict(rope={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
                                            rope_form="old", tied=True)),
    "mistral-window-3": ("mistral", dict(sliding_window=3)),
    "qwen2-biases-tied": ("qwen2", dict(tied=True, rope={"rope_type": "default", "rope_theta": 1e6})),
    "qwen3-qk-norm-head-dim": ("qwen3", dict(head_dim=16, tied=True)),  # 4 heads x 16 != 32
    "phi3-fused-window-4": ("phi3", dict(sliding_window=4, kv_heads=4)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def family(request, tmp_path_factory):
    model_type, kw = CASES[request.param]
    tmp = tmp_path_factory.mktemp(request.param)
    ck, weights, config = write_family(tmp / "ck", model_type, seed=len(request.param), **dict(SIZES, **kw))
    summary = convert_hf(ck, tmp / "m.oinf")
    assert summary.model_type == model_type and summary.graph == FAMILIES[model_type].graph
    prog = oi2jax.compile(EXAMPLES / summary.graph, model=tmp / "m.oinf", ops=["nn"])
    return prog, weights, config, summary


def _rel(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


def test_teacher_forced_logits_and_greedy_tokens_match_the_reference(family):
    prog, weights, config, _ = family
    ref = FamilyRef(weights, config)
    tokens = np.random.default_rng(1).integers(0, config["vocab_size"], STEPS)
    sess = prog.session()
    for k, tok in enumerate(tokens):
        sess.step(token=np.int32(tok))
        want = ref.step(int(tok))
        assert _rel(sess.read("logits"), want) <= TOL, (k, _rel(sess.read("logits"), want))
    prompt = tokens[:3].astype(np.int32)
    res = prog.session().run({"token": prompt}, steps=STEPS, feedback={"token": "next"}, collect=("next",))
    ref, tok, greedy = FamilyRef(weights, config), None, []
    for k in range(STEPS):
        tok = int(prompt[k]) if k < len(prompt) else tok
        tok = int(np.argmax(ref.step(tok)))
        greedy.append(tok)
    assert res["next"].tolist() == greedy


def test_the_window_really_bounds_attention(family):
    """A sliding-window model differs from the same weights without the window once the run is
    longer than the window (the reference without it is off), so the window is not a no-op."""
    prog, weights, config, summary = family
    if config.get("sliding_window") is None:  # a window of T (mistral, phi3: null) or none at all
        assert summary.metadata.get("sliding_window", SIZES["max_positions"]) == SIZES["max_positions"]
        return
    assert summary.metadata["sliding_window"] == config["sliding_window"] < STEPS
    full = FamilyRef(weights, config)
    full.window = None
    sess = prog.session()
    tokens = np.random.default_rng(2).integers(0, config["vocab_size"], STEPS)
    for tok in tokens:
        sess.step(token=np.int32(tok))
        want = full.step(int(tok))
    assert _rel(sess.read("logits"), want) > 1e-2


def test_tied_models_hold_one_embedding(family):
    prog, weights, config, summary = family
    model = open_model(summary.path)
    if not config["tie_word_embeddings"]:
        assert "lm_head.weight" in model.tensors and "alias.lm_head.weight" not in model.metadata
        return
    assert "lm_head.weight" not in model.tensors  # one copy in the file
    assert model.metadata["alias.lm_head.weight"].value == "model.embed_tokens.weight"
    consts = prog.consts if hasattr(prog, "consts") else prog.program.consts
    assert consts["embed"] is consts["lm_head"]  # one placed buffer, read under both names


def test_interpreter_agrees_on_the_first_steps(family):
    """The reference interpreter (the nn ops' NumPy references, node by node; a tied model through
    its alias) on the first steps, past a window of 3."""
    _, weights, config, summary = family
    prog = oi2jax.compile(EXAMPLES / summary.graph, model=summary.path, ops=["nn"], mode="interpret")
    ref = FamilyRef(weights, config)
    for tok in (5, 1, 7, 2):
        prog.step({"token": np.int32(tok)})
        assert _rel(prog.outputs()["logits"], ref.step(tok)) <= TOL


LLAMA31_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"}  # Llama 3.1's config.json


@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 500000.0},
                                  {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
                                  dict(LLAMA31_ROPE, rope_theta=500000.0)])
def test_rope_inv_freq_in_both_config_forms_is_transformers_formula(rope):
    """rope.inv_freq of `rope_parameters` (current) and of `rope_scaling` + `rope_theta` (older,
    Llama 3.1's own file) are the same f32 values, within f32 rounding of the formula in f64."""
    from hf_ref import family_config, inv_freq
    from oi2jax.model.convert import read_config
    sizes = dict(SIZES, hidden=512, heads=4)  # HD 128: every llama3 band (high, medium, low)
    new, old = (family_config("llama", rope=dict(rope), rope_form=form, **sizes) for form in ("new", "old"))
    assert "rope_parameters" not in old and old["rope_theta"] == rope["rope_theta"]
    got_new = read_config(new).constants["rope.inv_freq"]
    got_old = read_config(old).constants["rope.inv_freq"]
    assert got_new.dtype == np.float32 and got_new.shape == (64,)
    np.testing.assert_array_equal(got_new, got_old)
    np.testing.assert_allclose(got_new, inv_freq(new, 128), rtol=4e-7)
    if rope["rope_type"] == "llama3":
        base = inv_freq(dict(new, rope_parameters={"rope_theta": 500000.0}), 128)
        ratio = base / got_new
        assert np.isclose(ratio[0], 1) and np.isclose(ratio[-1], 8) and ((ratio > 1.01) & (ratio < 7.9)).any()


@pytest.mark.parametrize("model_type,changes,message", [
    ("phi3", {"rope_parameters": None, "rope_theta": 1e4,
              "rope_scaling": {"type": "longrope", "long_factor": [1.0] * 4, "short_factor": [1.0] * 4}},
     "rope_scaling.rope_type is 'longrope': supported rope types are default, linear, llama3"),
    ("phi3", {"partial_rotary_factor": 0.75},
     "partial_rotary_factor is 0.75: only a rotary embedding over the whole head (1.0) is supported"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
     "use_sliding_window is true with sliding_window 8 and max_window_layers 1: layers 1..1 attend through a window, "
     "which is not supported for qwen2 (only full attention in every layer)"),
    ("qwen3", {"layer_types": ["full_attention", "sliding_attention"]},
     "layer_types holds 'sliding_attention': only 'full_attention' layers are supported for qwen3"),
    ("qwen3", {"attention_bias": True}, "attention_bias is true: Qwen3 projections have no biases"),
    ("mistral", {"sliding_window": 0}, "sliding_window must be a positive integer, got 0"),
    ("mistral", {"architectures": ["LlamaForCausalLM"]},
     "architectures is ['LlamaForCausalLM']: a mistral checkpoint is ['MistralForCausalLM']"),
])
def test_what_a_family_cannot_compute_is_refused_by_key(model_type, changes, message):
    from hf_ref import family_config
    from oi2jax.diagnostics import OiError
    from oi2jax.model.convert import read_config
    config = dict(family_config(model_type, **SIZES), **changes)
    with pytest.raises(OiError) as e:
        read_config(config)
    assert e.value.diagnostics[0].message == f"config.json: {message}"


def test_window_settings():
    from hf_ref import family_config
    from oi2jax.model.convert import read_config
    null = read_config(family_config("mistral", **SIZES))  # sliding_window: null
    assert null.metadata["sliding_window"] == SIZES["max_positions"] and null.metadata["sliding_window"].dtype == np.int32
    wide = read_config(family_config("phi3", sliding_window=2047, **SIZES))  # wider than T: T
    assert wide.metadata["sliding_window"] == SIZES["max_positions"]
    qwen = read_config(dict(family_config("qwen2", **SIZES), sliding_window=4096))  # unused, as in transformers
    assert "sliding_window" not in qwen.metadata
    assert qwen.notes == ()  # it said "key sliding_window is not read (did you mean use_sliding_window?)"
    # transformers' rule: layer i slides iff use_sliding_window, a sliding_window and i >= max_window_layers:
    # with max_window_layers >= the layers every layer is full attention (helper probe: this was refused)
    for model_type in ("qwen2", "qwen3"):
        every = read_config(dict(family_config(model_type, **SIZES), use_sliding_window=True, sliding_window=4,
                                 max_window_layers=2))
        assert every.sizevars == read_config(family_config(model_type, **SIZES)).sizevars and every.notes == ()


def test_a_configs_missing_head_dim_and_kv_heads_take_the_families_defaults():
    """As transformers' config classes read them: Gemma2Config head_dim 256 and 4 kv heads,
    Qwen3Config head_dim 128, Llama's hidden / heads and one kv head per query head."""
    from hf_ref import family_config
    from oi2jax.model.convert import read_config
    for model_type, hd, kvh in (("qwen3", 128, 2), ("llama", 8, 4), ("qwen2", 8, 2)):
        config = family_config(model_type, **SIZES)
        config.pop("head_dim", None)
        if model_type == "llama":
            config.pop("num_key_value_heads")
        got = read_config(config).sizevars
        assert (got["HD"], got["KVH"]) == (hd, kvh), (model_type, got)


def test_convert_checkpoint_from_any_tensor_source(tmp_path):
    """The seam other formats use (a GGUF reader): a TensorSource of Hugging Face names and
    layouts converts to the same file as the safetensors directory (fused Phi-3 tensors too)."""
    import json
    from oi2jax.model.convert import SourceEntry, TensorSource, convert_checkpoint

    ck, weights, config = write_family(tmp_path / "ck", "phi3", sliding_window=4, **SIZES)

    class Memory(TensorSource):
        def __init__(self):
            self.directory, self.files, self.notes = tmp_path, [], []
            self.entries = {n: SourceEntry("memory", "F32", v.shape) for n, v in weights.items()}

        def read(self, name):
            return weights[name].copy()

    from oi2jax.model.tokenizer import hf_tokenizer_metadata
    config = json.loads((ck / "config.json").read_text())
    a = convert_hf(ck, tmp_path / "a.oinf")  # the directory's tokenizer entries (ids from config.json) too
    b = convert_checkpoint(config, Memory(), tmp_path / "b.oinf", extra_metadata=hf_tokenizer_metadata(ck, config))
    assert a.tensors == b.tensors and a.sizevars == b.sizevars and a.metadata == b.metadata
    assert (tmp_path / "a.oinf").read_bytes() == (tmp_path / "b.oinf").read_bytes()
    m = open_model(tmp_path / "b.oinf")
    qkv = weights["model.layers.1.self_attn.qkv_proj.weight"]
    np.testing.assert_array_equal(m.load("model.layers.1.self_attn.k_proj.weight"), qkv[32:48])
    np.testing.assert_array_equal(m.load("model.layers.1.mlp.up_proj.weight"),
                                  weights["model.layers.1.mlp.gate_up_proj.weight"][40:])


def test_a_gemma_configs_missing_head_dim_and_kv_heads_take_gemmas_defaults():
    from gemma_gpt2_checkpoints import gemma2_config
    from oi2jax.model.convert import read_config
    config = gemma2_config(vocab=48, hidden=32, layers=2, heads=8, kv_heads=4, head_dim=256, intermediate=40,
                           max_positions=16, sliding_window=4)
    del config["head_dim"], config["num_key_value_heads"]  # before: 32 / 8 = 4 and 8, a tensor's shape blamed
    got = read_config(config).sizevars
    assert (got["HD"], got["KVH"]) == (256, 4), got
