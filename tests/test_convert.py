"""Issue 31 part 1: `oi2jax convert-hf` (oi2jax/model/convert.py) on checkpoints the project writes
itself (examples/llama_checkpoint.py): single file and sharded, f32/bf16/f16, `--dtype`, tied and
untied, both RoPE config forms, every unsupported key rejected by name, atomic and lazy writes;
and tests/llama_ref.py (the NumPy Hugging Face Llama reference) checked against itself."""
from __future__ import annotations

import importlib.util
import io
import json
import os
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

from oi2jax.diagnostics import OiError
from oi2jax.model import open_model, save
from oi2jax.model.convert import FAMILIES, convert_hf, convert_values, read_config
from oi2jax.model.writer import LazyTensor
from oi2jax.progress import ProgressBar

from conftest import EXAMPLES, run_cli
from llama_ref import LlamaRef, forward_full, rotary_cos_sin, rotate_half


def _load_example():
    spec = importlib.util.spec_from_file_location("llama_checkpoint", EXAMPLES / "llama_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ex = _load_example()
BF16 = np.dtype(ml_dtypes.bfloat16)
NP = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": BF16}
SIZES = dict(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=48, max_positions=96)
EXPECT_SIZEVARS = {"V": 64, "D": 32, "L": 2, "H": 4, "KVH": 2, "HD": 8, "F": 48, "T": 96, "QD": 32, "KVD": 16, "G": 2,
                   "R": 4}
INV_FREQ = (1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8)).astype(np.float32)  # HD 8, the default rope


def _checkpoint_tensors(directory) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint directory, read from the safetensors bytes by hand (8-byte
    little-endian header length, JSON header, data), independently of the converter."""
    dtypes = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": BF16, "I32": np.dtype("<i4")}
    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        raw = file.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        for name, entry in header.items():
            if name != "__metadata__":
                begin, end = entry["data_offsets"]
                data = raw[8 + n + begin:8 + n + end]
                out[name] = np.frombuffer(data, dtypes[entry["dtype"]]).reshape(entry["shape"]).copy()
    return out


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def _custom(tmp_path, edit=None, weights_edit=None, shards=1, name="ck"):
    """A checkpoint whose config (`edit(config)`) or weights (`weights_edit(weights)`) is changed."""
    config = ex.llama_config(**SIZES)
    weights = ex.random_llama_weights(config)
    if edit:
        edit(config)
    if weights_edit:
        weights_edit(weights)
    return ex.write_checkpoint(tmp_path / name, config, weights, shards=shards)


def _msg(excinfo) -> str:
    return excinfo.value.diagnostics[0].message


def _no_temp_files(directory) -> bool:
    return not [p for p in os.listdir(directory) if p.startswith(".oi2jax-")]


# ------------------------------------------------------------------------------- conversions

@pytest.mark.parametrize("src", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("sharded", [False, 3])
def test_convert_keeps_names_layouts_dtypes_and_values(tmp_path, src, sharded):
    d = ex.write_random_llama(tmp_path / "ck", dtype=src, sharded=sharded, **SIZES)
    assert (d / "model.safetensors.index.json").exists() == bool(sharded)
    summary = convert_hf(d, tmp_path / "m.oinf")
    m = open_model(tmp_path / "m.oinf")
    source = _checkpoint_tensors(d)
    assert len(source) == 2 + 9 * 2 + 1 == len(m.tensors) - 1
    assert set(m.tensors) == set(source) | {"rope.inv_freq"}
    np.testing.assert_allclose(m.load("rope.inv_freq"), INV_FREQ, rtol=2**-23)
    for name, values in source.items():
        info = m.tensors[name]
        assert (info.dtype, info.shape) == (src, values.shape), name
        assert _bits(m.load(name)) == _bits(values), name  # stored bit for bit
    assert m.tensors["model.layers.1.self_attn.k_proj.weight"].shape == (2 * 8, 32)  # [out, in]
    assert m.tensors["model.layers.0.mlp.down_proj.weight"].shape == (32, 48)
    assert dict(m.sizevars) == EXPECT_SIZEVARS == summary.sizevars
    assert m.metadata["rms_norm_eps"].type == "f32" and m.metadata["rms_norm_eps"].value == np.float32(1e-5)
    assert m.metadata["rope_theta"].type == "f32" and m.metadata["rope_theta"].value == np.float32(10000.0)
    assert m.metadata["architecture"].value == "LlamaForCausalLM"
    assert summary.nbytes == sum(v.nbytes for v in source.values()) + INV_FREQ.nbytes
    assert summary.source_files == ((tuple(f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)))
                                    if sharded else ("model.safetensors",))


@pytest.mark.parametrize("src", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("target", ["f32", "bf16", "f16"])
def test_dtype_conversion_exact_or_round_to_nearest_even(tmp_path, src, target):
    d = ex.write_random_llama(tmp_path / "ck", dtype=src, std=0.5, **SIZES)
    summary = convert_hf(d, tmp_path / "m.oinf", dtype=target)
    assert set(summary.tensors.values()) == {target, "f32"}  # rope.inv_freq is f32, computed
    assert summary.tensors["rope.inv_freq"] == "f32"
    m = open_model(tmp_path / "m.oinf")
    for name, values in _checkpoint_tensors(d).items():
        got = m.load(name)
        assert got.dtype == NP[target]
        # one rounding from the exact f32 value (ml_dtypes / NumPy: round to nearest even)
        assert _bits(got) == _bits(values.astype(np.float32).astype(NP[target])), name
        if target == "f32" or target == src:  # widening (or keeping): exact
            np.testing.assert_array_equal(got.astype(np.float64), values.astype(np.float64))


def test_narrowing_rounds_half_to_even():
    # 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties to the even 1.0;
    # 1 + 3*2^-8 ties to 1 + 2^-6 (even); f16 likewise at 2^-11
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11], np.float32)
    assert convert_values("t", x, "bf16").astype(np.float32).tolist() == [1.0, 1 + 2**-6, 1.0, 1.0]
    assert convert_values("t", x, "f16").astype(np.float32).tolist() == [1 + 2**-8, 1 + 3 * 2**-8, 1.0, 1 + 2**-9]


def test_narrowing_overflow_is_an_error_and_leaves_nothing(tmp_path):
    def big(w):
        w["model.layers.1.mlp.up_proj.weight"][3, 4] = 1e5  # fine in f32 / bf16, not in f16 (max 65504)
    d = _custom(tmp_path, weights_edit=big)
    out = tmp_path / "m.oinf"
    out.write_bytes(b"the old model")
    with pytest.raises(OiError) as e:
        convert_hf(d, out, dtype="f16")
    assert _msg(e) == (f"{d / 'model.safetensors'}: tensor model.layers.1.mlp.up_proj.weight: value 100000 "
                       f"overflows f16 (largest finite 65504); convert to a wider dtype instead")
    assert out.read_bytes() == b"the old model" and _no_temp_files(tmp_path)
    convert_hf(d, out, dtype="bf16")  # bf16 has f32's range
    assert open_model(out).load("model.layers.1.mlp.up_proj.weight")[3, 4] == ml_dtypes.bfloat16(1e5)


@pytest.mark.parametrize("src", ["f32", "bf16"])
def test_tied_embeddings_store_one_copy_and_an_alias(tmp_path, src):
    d = ex.write_random_llama(tmp_path / "ck", tied=True, dtype=src, **SIZES)
    assert "lm_head.weight" not in _checkpoint_tensors(d)
    summary = convert_hf(d, tmp_path / "m.oinf")
    m = open_model(tmp_path / "m.oinf")
    assert "lm_head.weight" not in m.tensors and "lm_head.weight" not in summary.tensors  # one copy
    assert m.metadata["alias.lm_head.weight"].value == "model.embed_tokens.weight"
    assert m.tensors["model.embed_tokens.weight"].dtype == src and summary.notes == ()
    embed = m.tensors["model.embed_tokens.weight"].nbytes
    assert summary.nbytes == sum(v.nbytes for v in _checkpoint_tensors(d).values()) + INV_FREQ.nbytes
    assert os.path.getsize(tmp_path / "m.oinf") < summary.nbytes + embed  # no second embedding in the file


def test_tied_with_a_stored_lm_head_follows_transformers(tmp_path):
    config = ex.llama_config(tied=True, **SIZES)
    weights = ex.random_llama_weights(dict(config, tie_word_embeddings=False))  # has lm_head.weight
    d = ex.write_checkpoint(tmp_path / "ck", config, weights)
    summary = convert_hf(d, tmp_path / "m.oinf")
    m = open_model(tmp_path / "m.oinf")
    assert "lm_head.weight" not in m.tensors
    assert m.metadata["alias.lm_head.weight"].value == "model.embed_tokens.weight"
    np.testing.assert_array_equal(m.load("model.embed_tokens.weight"), weights["model.embed_tokens.weight"])
    assert summary.notes == ("lm_head.weight in the checkpoint is ignored: tie_word_embeddings is true, so "
                             "lm_head is the embedding (as transformers does)",)


def test_untied_lm_head_is_its_own_tensor(tmp_path):
    d = ex.write_random_llama(tmp_path / "ck", **SIZES)
    m = open_model(convert_hf(d, tmp_path / "m.oinf").path)
    src = _checkpoint_tensors(d)
    np.testing.assert_array_equal(m.load("lm_head.weight"), src["lm_head.weight"])
    assert not np.array_equal(src["lm_head.weight"], src["model.embed_tokens.weight"])


@pytest.mark.parametrize("form", ["new", "old"])
def test_both_rope_config_forms(tmp_path, form):
    d = ex.write_random_llama(tmp_path / "ck", rope_form=form, rope_theta=500000.0, rms_norm_eps=1e-6, **SIZES)
    config = json.loads((d / "config.json").read_text())
    if form == "new":
        assert config["rope_parameters"] == {"rope_theta": 500000.0, "rope_type": "default"}
        assert "rope_theta" not in config
    else:
        assert config["rope_theta"] == 500000.0 and config["rope_scaling"] is None
        assert "rope_parameters" not in config
    m = open_model(convert_hf(d, tmp_path / "m.oinf").path)
    assert m.metadata["rope_theta"].value == np.float32(500000.0)
    assert m.metadata["rms_norm_eps"].value == np.float32(1e-6)


def test_rope_config_variants_that_mean_the_default():
    base = ex.llama_config(**SIZES)
    del base["rope_parameters"]
    both = dict(base, rope_theta=1e6, rope_parameters={"rope_theta": 1e6, "rope_type": "default"})
    assert read_config(both).metadata["rope_theta"] == 1e6
    old_type = dict(base, rope_theta=2.0, rope_scaling={"type": "default"})  # `type`: older spelling
    assert read_config(old_type).metadata["rope_theta"] == 2.0
    none = read_config(base)  # transformers' default theta, said out loud
    assert none.metadata["rope_theta"] == 10000.0
    assert none.notes == ("config.json names no rope_theta: using transformers' default 10000.0",)
    defaults = dict(base, rope_theta=3.0)  # num_key_value_heads, head_dim, hidden_act: transformers' defaults
    for key in ("num_key_value_heads", "head_dim", "hidden_act", "tie_word_embeddings", "attention_bias"):
        del defaults[key]
    cfg = read_config(defaults)
    assert (cfg.sizevars["KVH"], cfg.sizevars["HD"], cfg.tied) == (4, 8, False)


@pytest.mark.parametrize("params,scaling,factor", [
    (None, {"type": "linear", "factor": 4.0}, 4.0),  # the older form alone
    ({"rope_theta": 1e4, "rope_type": "linear", "factor": 4.0}, {"type": "linear", "factor": 4.0}, 4.0),
    ({"rope_theta": 1e4, "rope_type": "linear"}, {"type": "linear", "factor": 2.0}, 2.0),  # its factor joins
    ({"rope_theta": 1e4, "type": "linear", "factor": 8.0}, None, 8.0),
])
def test_a_legacy_rope_scaling_type_is_read_as_rope_type(params, scaling, factor):
    """`rope_scaling: {"type": ...}` (older transformers; LlamaFactory still writes it) is the
    rope type, beside rope_parameters too: a linear scaling divides the default frequencies by
    its factor (it was converted as the default rope, without a word, beside rope_parameters)."""
    config = ex.llama_config(**SIZES)
    del config["rope_parameters"]
    if params is None:
        config["rope_theta"] = 1e4
    else:
        config["rope_parameters"] = params
    if scaling is not None:
        config["rope_scaling"] = scaling
    got = read_config(config).constants["rope.inv_freq"]
    np.testing.assert_array_equal(got, INV_FREQ / np.float32(factor))


@pytest.mark.parametrize("scaling", [{"type": "linear", "factor": 4.0}, {"type": "yarn", "factor": 2.0},
                                     {"rope_type": "linear", "factor": 4.0}, {"factor": 4.0, "type": "default",
                                                                                "rope_theta": 5e5}])
def test_a_rope_scaling_that_disagrees_with_rope_parameters_is_refused(tmp_path, scaling):
    """rope_parameters says the default rope; a rope_scaling of another type (either spelling),
    or of another value of a key both hold, is two answers: refused, never converted as one."""
    params = {"rope_theta": 10000.0, "rope_type": "default"}
    d = _custom(tmp_path, _set(rope_parameters=params, rope_scaling=scaling))
    with pytest.raises(OiError) as e:
        convert_hf(d, tmp_path / "m.oinf")
    assert _msg(e) == (f"{d / 'config.json'}: rope_scaling {scaling!r} disagrees with rope_parameters {params!r}: "
                       f"which one?")


def test_a_rope_scaling_naming_type_and_rope_type_differently_is_refused():
    config = dict(ex.llama_config(**SIZES), rope_parameters=None, rope_theta=1e4,
                  rope_scaling={"type": "linear", "rope_type": "llama3", "factor": 2.0})
    with pytest.raises(OiError) as e:
        read_config(config)
    assert _msg(e) == "config.json: rope_scaling.rope_type is 'llama3' but rope_scaling.type is 'linear': which one?"


def _set(**changes):
    def edit(config):
        for key, value in changes.items():
            if value is _DELETE:
                config.pop(key, None)
            else:
                config[key] = value
    return edit


_DELETE = object()

UNSUPPORTED = [
    (_set(architectures=["MistralForCausalLM"]),
     "architectures is ['MistralForCausalLM']: a llama checkpoint is ['LlamaForCausalLM']"),
    (_set(model_type="gpt_neox"), "model_type is 'gpt_neox': supported model types are " + ", ".join(sorted(FAMILIES))),
    (_set(model_type=_DELETE, architectures=_DELETE),
     "missing required key model_type (or architectures): cannot tell the architecture"),
    (_set(rope_parameters={"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0}),
     "missing required key rope_parameters.low_freq_factor (rope_type 'llama3')"),
    (_set(rope_parameters={"rope_theta": 1e4, "rope_type": "default", "partial_rotary_factor": 0.5}),
     "partial_rotary_factor is 0.5: only a rotary embedding over the whole head (1.0) is supported"),
    (_set(rope_parameters=_DELETE, rope_theta=1e4, rope_scaling={"rope_type": "yarn", "factor": 2.0}),
     "rope_scaling.rope_type is 'yarn': supported rope types are default, linear, llama3"),
    (_set(rope_parameters=_DELETE, rope_theta=1e4, rope_scaling={"type": "dynamic", "factor": 2.0}),
     "rope_scaling.rope_type is 'dynamic': supported rope types are default, linear, llama3"),
    (_set(rope_theta=20000.0),
     "rope_theta is 20000.0 but rope_parameters.rope_theta is 10000.0: which one?"),
    (_set(attention_bias=True), "attention_bias is true: Llama projections have no biases"),
    (_set(mlp_bias=True), "mlp_bias is true: Llama projections have no biases"),
    (_set(hidden_act="gelu"), "hidden_act is 'gelu': only 'silu' (the SwiGLU MLP) is supported"),
    (_set(quantization_config={"quant_method": "gptq", "bits": 4}),
     "quantization_config is set: quantized checkpoints are not supported (convert a floating-point checkpoint)"),
    (_set(num_key_value_heads=3), "num_key_value_heads 3 does not divide num_attention_heads 4"),
    (_set(head_dim=_DELETE, num_attention_heads=5, num_key_value_heads=5),
     "hidden_size 32 is not a multiple of num_attention_heads 5 (and no head_dim is given)"),
    (_set(vocab_size=0), "vocab_size must be a positive integer, got 0"),
    (_set(rms_norm_eps="1e-5"), "rms_norm_eps must be a positive number, got '1e-5'"),
    (_set(tie_word_embeddings="yes"), "tie_word_embeddings must be true or false, got 'yes'"),
] + [(_set(**{key: _DELETE}), f"missing required key {key}")
     for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "rms_norm_eps", "max_position_embeddings")]


@pytest.mark.parametrize("edit,message", UNSUPPORTED, ids=[m.split(" ")[0] + str(i) for i, (_, m)
                                                           in enumerate(UNSUPPORTED)])
def test_unsupported_config_is_rejected_by_key(tmp_path, edit, message):
    d = _custom(tmp_path, edit)
    out = tmp_path / "m.oinf"
    with pytest.raises(OiError) as e:
        convert_hf(d, out)
    assert _msg(e) == f"{d / 'config.json'}: {message}"
    assert not out.exists() and _no_temp_files(tmp_path)


def test_explicit_head_dim_need_not_divide_hidden_size(tmp_path):
    """transformers allows head_dim * H != D (q_proj [H*HD, D]); QD and KVD name those widths, and a
    checkpoint whose tensors do not follow the config is refused by tensor name."""
    d = _custom(tmp_path, _set(head_dim=16))
    with pytest.raises(OiError) as e:
        convert_hf(d, tmp_path / "m.oinf")
    assert "tensor model.layers.0.self_attn.q_proj.weight has shape [32, 32], expected [64, 32] " \
           "(num_attention_heads*head_dim, hidden_size)" in _msg(e)
    cfg = read_config(dict(json.loads((d / "config.json").read_text())))
    assert (cfg.sizevars["HD"], cfg.sizevars["QD"], cfg.sizevars["KVD"], cfg.sizevars["G"]) == (16, 64, 32, 2)


def test_max_positions_replaces_max_position_embeddings(tmp_path):
    d = _custom(tmp_path, _set(max_position_embeddings=_DELETE))
    summary = convert_hf(d, tmp_path / "m.oinf", max_positions=40)
    assert summary.sizevars["T"] == 40 and summary.notes == ()
    d2 = ex.write_random_llama(tmp_path / "ck2", **SIZES)
    summary = convert_hf(d2, tmp_path / "m2.oinf", max_positions=200)
    assert open_model(tmp_path / "m2.oinf").sizevars["T"] == 200
    assert summary.notes == ("T = 200 is beyond max_position_embeddings 96: the model was not trained on "
                             "positions past 96",)


# ------------------------------------------------------------------------------ tensor checks

def test_missing_tensor(tmp_path):
    d = _custom(tmp_path, weights_edit=lambda w: w.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(OiError) as e:
        convert_hf(d, tmp_path / "m.oinf")
    assert _msg(e) == f"{d}: missing tensor model.layers.1.mlp.up_proj.weight"
    d = _custom(tmp_path, weights_edit=lambda w: w.pop("lm_head.weight"), name="ck2")
    with pytest.raises(OiError) as e:
        convert_hf(d, tmp_path / "m.oinf")
    assert _msg(e) == f"{d}: missing tensor lm_head.weight (tie_word_embeddings is false)"
    d = _custom(tmp_path, _set(num_hidden_layers=3), name="ck3")  # config says 3 layers, checkpoint has 2
    with pytest.raises(OiError) as e:
        convert_hf(d, tmp_path / "m.oinf")
    assert _msg(e) == f"{d}: missing tensor model.layers.2.input_layernorm.weight and 8 more"
    assert not (tmp_path / "m.oinf").exists()


def test_shape_mismatch_names_tensor_and_both_shapes(tmp_path):
    def wrong(w):
        w["model.layers.0.self_attn.k_proj.weight"] = np.zeros((32, 32), np.float32)  # MHA shape, config GQA
    d = _custom(tmp_path, weights_edit=wrong)
    with pytest.raises(OiError) as e:
        convert_hf(d, tmp_path / "m.oinf")
    assert _msg(e) == (f"{d / 'model.safetensors'}: tensor model.layers.0.self_attn.k_proj.weight has shape "
                            f"[32, 32], expected [16, 32] (num_key_value_heads*head_dim, hidden_size) from config.json")


def test_transposed_projection_is_a_shape_error(tmp_path):
    def transposed(w):
        w["model.layers.1.mlp.gate_proj.weight"] = w["model.layers.1.mlp.gate_proj.weight"].T.copy()
    d = _custom(tmp_path, weights_edit=transposed)
    with pytest.raises(OiError, match=r"gate_proj.weight has shape \[32, 48\], expected \[48, 32\]"):
        convert_hf(d, tmp_path / "m.oinf")


def test_unexpected_tensor_is_an_error_but_rotary_buffers_are_skipped(tmp_path):
    def bias(w):
        w["model.layers.0.self_attn.q_proj.bias"] = np.zeros(32, np.float32)
    d = _custom(tmp_path, weights_edit=bias)
    with pytest.raises(OiError) as e:
        convert_hf(d, tmp_path / "m.oinf")
    assert _msg(e) == (f"{d / 'model.safetensors'}: unexpected tensor model.layers.0.self_attn.q_proj.bias: not part of a "
                            f"LlamaForCausalLM with this config (a bias? another architecture?)")

    def inv_freq(w):  # what older transformers versions saved: derived, recomputed from rope_theta
        for i in range(2):
            w[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)
    d = _custom(tmp_path, weights_edit=inv_freq, name="ck2")
    summary = convert_hf(d, tmp_path / "m.oinf")
    assert summary.notes == ("skipped 2 derived tensor(s) (model.layers.0.self_attn.rotary_emb.inv_freq...): "
                             "the rotary frequencies are computed from the config (rope.inv_freq)",)
    assert [n for n in open_model(tmp_path / "m.oinf").tensors if "inv_freq" in n] == ["rope.inv_freq"]


def test_integer_tensor_is_rejected(tmp_path):
    def ints(w):
        w["model.norm.weight"] = np.ones(32, np.int32)
    d = _custom(tmp_path, weights_edit=ints)
    with pytest.raises(OiError) as e:
        convert_hf(d, tmp_path / "m.oinf")
    assert _msg(e) == (f"{d / 'model.safetensors'}: tensor model.norm.weight has dtype I32: only "
                            f"floating-point checkpoints (F32, BF16, F16, F64) are supported")


def test_shard_index_must_match_the_shards(tmp_path):
    d = ex.write_random_llama(tmp_path / "ck", sharded=2, **SIZES)
    index_path = d / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    good = dict(index["weight_map"])
    name = "model.norm.weight"
    index["weight_map"][name] = ("model-00002-of-00002.safetensors" if good[name].startswith("model-00001")
                                 else "model-00001-of-00002.safetensors")
    index_path.write_text(json.dumps(index))
    with pytest.raises(OiError) as e:
        convert_hf(d, tmp_path / "m.oinf")
    assert _msg(e) == (f"{index_path}: weight_map puts tensor {name} in {index['weight_map'][name]}, but "
                            f"{index['weight_map'][name]} does not hold it")
    index["weight_map"] = dict(good, **{name: "model-00003-of-00003.safetensors"})
    index_path.write_text(json.dumps(index))
    with pytest.raises(OiError) as e:
        convert_hf(d, tmp_path / "m.oinf")
    assert _msg(e) == (f"{index_path}: weight_map: shard model-00003-of-00003.safetensors (of tensor "
                            f"{name}) does not exist")


def test_directory_problems(tmp_path):
    with pytest.raises(OiError, match="not a directory"):
        convert_hf(tmp_path / "nope", tmp_path / "m.oinf")
    (tmp_path / "empty").mkdir()
    with pytest.raises(OiError, match="no config.json: not a Hugging Face checkpoint directory"):
        convert_hf(tmp_path / "empty", tmp_path / "m.oinf")
    (tmp_path / "empty" / "config.json").write_text(json.dumps(ex.llama_config(**SIZES)))
    (tmp_path / "empty" / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(OiError) as e:
        convert_hf(tmp_path / "empty", tmp_path / "m.oinf")
    assert _msg(e) == (f"{tmp_path / 'empty'}: no model.safetensors or model.safetensors.index.json (a "
                            f"PyTorch .bin checkpoint: save it with safe_serialization=True first)")
    (tmp_path / "empty" / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(OiError, match="model.safetensors: cannot read safetensors file"):
        convert_hf(tmp_path / "empty", tmp_path / "m.oinf")
    (tmp_path / "empty" / "config.json").write_text("{not json")
    with pytest.raises(OiError, match="config.json: cannot read the config"):
        convert_hf(tmp_path / "empty", tmp_path / "m.oinf")
    with pytest.raises(OiError, match="dtype must be one of f32, bf16, f16, got 'f64'"):
        convert_hf(tmp_path / "empty", tmp_path / "m.oinf", dtype="f64")
    assert not (tmp_path / "m.oinf").exists()


# ------------------------------------------------------------------------------ lazy, atomic

def test_bf16_without_numpy_bfloat16_in_safetensors(tmp_path, monkeypatch):
    """safetensors before NumPy bfloat16 support (0.4.x) fails on get_tensor for BF16; the
    converter then reads the bytes by the header offsets."""
    import safetensors
    real = safetensors.safe_open

    class OldHandle:
        def __init__(self, path, framework):
            self.inner = real(path, framework=framework)

        def __enter__(self):
            self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def keys(self):
            return self.inner.keys()

        def get_slice(self, name):
            return self.inner.get_slice(name)

        def get_tensor(self, name):
            if self.inner.get_slice(name).get_dtype() == "BF16":
                raise AttributeError("module 'numpy' has no attribute 'bfloat16'")
            return self.inner.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", OldHandle)
    d = ex.write_random_llama(tmp_path / "ck", dtype="bf16", sharded=2, **SIZES)
    convert_hf(d, tmp_path / "m.oinf")
    monkeypatch.setattr(safetensors, "safe_open", real)
    m = open_model(tmp_path / "m.oinf")
    for name, values in _checkpoint_tensors(d).items():
        assert values.dtype == BF16 and _bits(m.load(name)) == _bits(values), name


def test_a_failing_conversion_keeps_the_existing_file(tmp_path):
    d = ex.write_random_llama(tmp_path / "ck", **SIZES)
    out = tmp_path / "m.oinf"
    convert_hf(d, out)
    before = out.read_bytes()
    # a truncated checkpoint (failing while writing: test_narrowing_overflow_...): the old file stays whole
    (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-64])
    with pytest.raises(OiError, match="model.safetensors"):
        convert_hf(d, out, dtype="bf16")
    assert out.read_bytes() == before and _no_temp_files(tmp_path)


def test_output_over_an_input_is_refused(tmp_path):
    d = ex.write_random_llama(tmp_path / "ck", **SIZES)
    before = (d / "model.safetensors").read_bytes()
    with pytest.raises(OiError) as e:
        convert_hf(d, d / "model.safetensors")
    assert _msg(e) == (f"{d / 'model.safetensors'} is the checkpoint's model.safetensors: writing it would "
                            f"destroy the input; choose another path")
    assert (d / "model.safetensors").read_bytes() == before


def test_conversion_holds_about_one_tensor_in_memory(tmp_path):
    # the largest tensor large beside the converter's fixed allocations (headers, JSON, buffers of
    # tens of KiB), so that the bound measures the tensors held
    sizes = dict(SIZES, layers=6, hidden=64, intermediate=2048, vocab=256, heads=4, kv_heads=4)
    d = ex.write_random_llama(tmp_path / "ck", **sizes)
    total = sum(v.nbytes for v in _checkpoint_tensors(d).values())
    largest = 2048 * 64 * 4  # an MLP projection, f32
    assert total > 15 * largest  # the checkpoint is ~ 10 MB, its largest tensor 512 KiB
    convert_hf(d, tmp_path / "warm.oinf", dtype="f16")  # lazy imports done
    for dtype, bound in ((None, 2), ("f16", 4)):  # kept: the tensor read; narrowed: + result + masks
        tracemalloc.start()
        try:
            convert_hf(d, tmp_path / "m.oinf", dtype=dtype)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < bound * largest, (dtype, peak / largest)


def test_lazy_tensors_are_loaded_once_in_order_and_written_like_arrays(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(5).astype(ml_dtypes.bfloat16)
    c = np.array([1, -2, 3], np.int8)
    calls = []

    def lazy(name, dtype, value):
        return LazyTensor(dtype, value.shape, lambda: calls.append(name) or value)
    kwargs = dict(sizevars={"N": 2}, metadata={"eps": 1e-5, "arch": "x"})
    save(tmp_path / "eager.oinf", tensors={"a": a, "b": b, "c": c}, **kwargs)
    save(tmp_path / "lazy.oinf", tensors={"c": lazy("c", "i8", c), "a": lazy("a", "f32", a),
                                          "b": lazy("b", "bf16", b)}, **kwargs)
    assert calls == ["a", "b", "c"]  # file order, each once
    assert (tmp_path / "eager.oinf").read_bytes() == (tmp_path / "lazy.oinf").read_bytes()
    out = tmp_path / "bad.oinf"
    out.write_bytes(b"old")
    with pytest.raises(OiError, match=r"tensor a: load\(\) gave shape \[3, 2\], declared \[2, 3\]"):
        save(out, tensors={"a": LazyTensor("f32", (2, 3), lambda: a.T)})
    assert out.read_bytes() == b"old" and _no_temp_files(tmp_path)


def test_progress_counts_mib_to_the_end(tmp_path):
    d = ex.write_random_llama(tmp_path / "ck", **dict(SIZES, vocab=4096, hidden=128))  # ~4.5 MiB of f32
    seen, bars = [], []

    class Bar:
        def __call__(self, done):
            seen.append(done)

        def close(self):
            seen.append("closed")

    def factory(total):
        bars.append(total)
        return Bar()
    summary = convert_hf(d, tmp_path / "m.oinf", progress=factory)
    total = -(-summary.nbytes // 2**20)
    assert bars == [total] and total >= 4
    assert seen[-2:] == [total, "closed"] and seen[0] == 0
    assert seen[:-1] == sorted(seen[:-1])  # never backwards

    out = io.StringIO()  # the real bar renders MiB
    bar = ProgressBar(10, stream=out, label="MiB", unit="MiB", interval=0.0, clock=lambda: 1.0)
    bar(10)
    assert "MiB 10/10 [" in out.getvalue() and "MiB/s" in out.getvalue()


# ---------------------------------------------------------------------------------------- CLI

def test_cli_convert_hf_end_to_end(tmp_path, capsys):
    d = ex.write_random_llama(tmp_path / "ck", dtype="bf16", tied=True, sharded=2, rope_form="old", **SIZES)
    out = tmp_path / "m.oinf"
    code, stdout, stderr = run_cli(capsys, "convert-hf", d, "-o", out, "--dtype", "f32", "--max-positions", "64")
    assert code == 0 and stdout == ""
    assert stderr == (f"wrote {out}: 21 tensors (f32, 68.6 KiB); V=64 D=32 F=48 L=2 H=4 KVH=2 HD=8 T=64 QD=32 KVD=16 "
                      f"G=2 R=4; llama: run it with examples/llama_decode.oi\n")
    m = open_model(out)
    assert dict(m.sizevars) == dict(EXPECT_SIZEVARS, T=64)
    meta = {k: v.value for k, v in m.metadata.items()}
    assert meta.pop("tokenizer.stop_ids").tolist() == [2]  # config.json's eos_token_id (no generation_config.json)
    assert meta == {
        "architecture": "LlamaForCausalLM", "rms_norm_eps": np.float32(1e-5), "rope_theta": np.float32(1e4),
        "attn_scale": np.float32(8 ** -0.5), "alias.lm_head.weight": "model.embed_tokens.weight",
        "example_graph": "examples/llama_decode.oi", "tokenizer.bos_id": np.int32(1), "tokenizer.eos_id": np.int32(2)}
    assert {t.dtype for t in m.tensors.values()} == {"f32"} and "lm_head.weight" not in m.tensors
    code, stdout, _ = run_cli(capsys, "inspect", out)
    assert code == 0 and "model.layers.1.self_attn.o_proj.weight" in stdout and "rope_theta" in stdout
    code, stdout, stderr = run_cli(capsys, "convert-hf", d, "-o", out, "--quiet")
    assert (code, stdout, stderr) == (0, "", "")
    assert open_model(out).tensors["model.embed_tokens.weight"].dtype == "bf16"


def test_cli_convert_hf_errors(tmp_path, capsys):
    d = _custom(tmp_path, _set(rope_parameters={"rope_theta": 5e5, "rope_type": "yarn"}))
    out = tmp_path / "m.oinf"
    code, _, stderr = run_cli(capsys, "convert-hf", d, "-o", out)
    assert code == 1
    assert stderr == (f"error: {d / 'config.json'}: rope_parameters.rope_type is 'yarn': supported rope types are "
                      f"default, linear, llama3\n")
    assert not out.exists()
    for argv in (["convert-hf", d], ["convert-hf", d, "-o", out, "--dtype", "f64"],
                 ["convert-hf", d, "-o", out, "--max-positions", "x"]):
        with pytest.raises(SystemExit) as e:
            run_cli(capsys, *argv)
        assert e.value.code == 2
        assert "error:" in capsys.readouterr().err
    code, _, stderr = run_cli(capsys, "convert-hf", d, "-o", out, "--max-positions", "0")
    assert code == 2 and stderr == "error: --max-positions must be a positive integer, got 0\n"
    code, _, stderr = run_cli(capsys, "convert-hf", tmp_path / "missing", "-o", out)
    assert code == 1 and stderr.startswith("error: ") and "not a directory" in stderr


def test_example_script_writes_a_default_checkpoint(tmp_path):
    assert ex.main([str(tmp_path / "tiny"), "--dtype", "bf16", "--sharded"]) == 0
    files = sorted(p.name for p in (tmp_path / "tiny").iterdir())
    assert files == ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                     "model.safetensors.index.json"]
    assert ex.main([str(tmp_path / "tiny")]) == 0  # rewritten as one file: no stale shards left
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == ["config.json", "model.safetensors"]
    assert convert_hf(tmp_path / "tiny", tmp_path / "m.oinf").sizevars == {
        "V": 64, "D": 32, "L": 2, "H": 4, "KVH": 2, "HD": 8, "F": 64, "T": 128, "QD": 32, "KVD": 16, "G": 2, "R": 4}


# -------------------------------------------------------------------- tests/llama_ref.py itself

def _ref_inputs(tmp_path, **kw):
    d = ex.write_random_llama(tmp_path / "ref", std=0.3, **dict(SIZES, **kw))
    return _checkpoint_tensors(d), json.loads((d / "config.json").read_text())


@pytest.mark.parametrize("kw", [{}, {"tied": True, "kv_heads": 1}, {"kv_heads": 4, "rope_form": "old"}])
def test_llama_ref_decode_equals_full_causal_forward(tmp_path, kw):
    weights, config = _ref_inputs(tmp_path, **kw)
    tokens = [3, 17, 17, 60, 0, 42]
    ref = LlamaRef(weights, config)
    steps = np.stack([ref.step(t) for t in tokens])
    full = forward_full(weights, config, tokens)
    assert steps.shape == (6, 64)
    np.testing.assert_allclose(steps, full, rtol=1e-12, atol=1e-12)
    assert np.std(steps[:, :]) > 0.1  # not degenerate: the tokens' logits differ
    assert not np.allclose(steps[1], steps[2])  # same token, different position / context
    ref.reset()
    np.testing.assert_allclose(ref.step(tokens[0]), steps[0], rtol=1e-12)
    f32 = LlamaRef(weights, config, dtype=np.float32)
    np.testing.assert_allclose(np.stack([f32.step(t) for t in tokens]), steps, rtol=1e-4, atol=1e-4)


def test_llama_ref_first_token_by_hand(tmp_path):
    """Position 0: rotary is the identity and attention sees one key, so each query head's
    output is its kv head's value: one layer written out with plain NumPy."""
    weights, config = _ref_inputs(tmp_path, layers=1)
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    eps = config["rms_norm_eps"]

    def norm(x, g):
        return x / np.sqrt(np.mean(x ** 2) + eps) * g
    h = w["model.embed_tokens.weight"][5]
    v = w["model.layers.0.self_attn.v_proj.weight"] @ norm(h, w["model.layers.0.input_layernorm.weight"])
    heads = np.concatenate([v[0:8], v[0:8], v[8:16], v[8:16]])  # H=4 over KVH=2: heads 0,1 -> kv 0
    h = h + w["model.layers.0.self_attn.o_proj.weight"] @ heads
    x = norm(h, w["model.layers.0.post_attention_layernorm.weight"])
    g, u = w["model.layers.0.mlp.gate_proj.weight"] @ x, w["model.layers.0.mlp.up_proj.weight"] @ x
    h = h + w["model.layers.0.mlp.down_proj.weight"] @ (g / (1 + np.exp(-g)) * u)
    expect = w["lm_head.weight"] @ norm(h, w["model.norm.weight"])
    np.testing.assert_allclose(LlamaRef(weights, config).step(5), expect, rtol=1e-12, atol=1e-12)


def test_llama_ref_rotary_is_a_rotation_of_half_split_pairs():
    """HF's rotate_half form == rotating each pair (x[i], x[i + HD/2]) by pos * theta^(-2i/HD)."""
    rng = np.random.default_rng(1)
    HD, theta = 8, 10000.0
    x = rng.standard_normal(HD)
    for pos in (0, 1, 7, 1000):
        cos, sin = rotary_cos_sin([pos], HD, theta, np.float64)
        got = x * cos[0] + rotate_half(x) * sin[0]
        z = (x[:HD // 2] + 1j * x[HD // 2:]) * np.exp(1j * pos * theta ** (-np.arange(0, HD, 2) / HD))
        np.testing.assert_allclose(got, np.concatenate([z.real, z.imag]), rtol=1e-12, atol=1e-12)


def test_cli_progress_bar_wiring(tmp_path, capsys, monkeypatch):
    """The CLI asks progress_for for a MiB bar (terminal only, outputs of 64 MiB or more, not --quiet)."""
    import oi2jax.progress as progress
    d = ex.write_random_llama(tmp_path / "ck", **SIZES)
    calls, tty = [], io.StringIO()

    def fake(total, quiet=False, min_steps=100, **options):
        calls.append((total, quiet, min_steps, options))
        return ProgressBar(total, stream=tty, interval=0.0, **options)
    monkeypatch.setattr(progress, "progress_for", fake)
    assert run_cli(capsys, "convert-hf", d, "-o", tmp_path / "m.oinf")[0] == 0
    assert run_cli(capsys, "convert-hf", d, "-o", tmp_path / "m.oinf", "--quiet")[0] == 0
    assert calls == [(1, False, 64, {"label": "MiB", "unit": "MiB"}), (1, True, 64, {"label": "MiB", "unit": "MiB"})]
    text = tty.getvalue()  # the fake ignores quiet: two bars, each closed at 1/1
    assert text.count("\n") == 2 and text.count("MiB 1/1 [" + "#" * 30 + "] 100.0%") >= 2


def test_rope_parameters_keyed_by_layer_type_on_a_one_rope_family():
    """(helper probe) the nested settings were dropped: plain rope at theta 10000 was written, with
    a note only. Entries that agree are the one rope; entries that differ are refused by key."""
    from hf_ref import family_config
    from oi2jax.model.convert import read_config
    sizes = dict(vocab=48, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=40, max_positions=16)
    linear = {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}
    flat = read_config(family_config("llama", rope=linear, **sizes)).constants["rope.inv_freq"]
    keyed = dict(family_config("llama", **sizes), rope_parameters={"full_attention": linear,
                                                                   "sliding_attention": dict(linear)})
    np.testing.assert_array_equal(read_config(keyed).constants["rope.inv_freq"], flat)
    assert flat[0] == np.float32(0.25)
    keyed["rope_parameters"]["sliding_attention"] = {"rope_type": "default", "rope_theta": 1e4}
    with pytest.raises(OiError) as info:
        read_config(keyed)
    assert info.value.diagnostics[0].message == (
        "config.json: rope_parameters.full_attention is an object: rope_parameters keyed by layer type "
        "(full_attention, sliding_attention) with different settings, where llama has one rotary embedding "
        "for every layer")
