"""Hostile and malformed checkpoints for convert-hf (issue #41): every one is an `error:` naming
the file and the key or tensor, exit 1 from the CLI, nothing written, and a hostile number is
refused before anything is built from it."""
from __future__ import annotations

import json
import struct
import tracemalloc

import numpy as np
import pytest

from oi2jax.diagnostics import OiError
from oi2jax.model import open_model
from oi2jax.model.convert import convert_hf
from oi2jax.model.hf.config import MAX_LAYERS, MAX_SIZE

from conftest import run_cli
from hf_ref import write_family

SIZES = dict(vocab=16, hidden=16, layers=1, heads=2, kv_heads=1, intermediate=24, max_positions=8)
DEEP = "[" * 100_000 + "]" * 100_000


def _msg(excinfo) -> str:
    return excinfo.value.diagnostics[0].message


@pytest.fixture
def ck(tmp_path):
    return write_family(tmp_path / "ck", "llama", **SIZES)[0]


def _edit_config(ck, **changes):
    config = json.loads((ck / "config.json").read_text())
    config.update(changes)
    (ck / "config.json").write_text(json.dumps(config))


def test_deeply_nested_config_json_names_the_file(ck, tmp_path, capsys):
    (ck / "config.json").write_text(DEEP)
    out = tmp_path / "m.oinf"
    with pytest.raises(OiError) as e:
        convert_hf(ck, out)
    assert _msg(e) == f"{ck / 'config.json'}: cannot read the config: JSON nested too deeply"
    code, stdout, stderr = run_cli(capsys, "convert-hf", ck, "-o", out)
    assert (code, stdout) == (1, "") and stderr == f"error: {_msg(e)}\n" and not out.exists()


def test_deeply_nested_shard_index_names_the_file(ck, tmp_path):
    (ck / "model.safetensors").rename(ck / "model-00001-of-00001.safetensors")
    (ck / "model.safetensors.index.json").write_text(DEEP)
    with pytest.raises(OiError) as e:
        convert_hf(ck, tmp_path / "m.oinf")
    assert _msg(e) == f"{ck / 'model.safetensors.index.json'}: cannot read the shard index: JSON nested too deeply"


@pytest.mark.parametrize("key,value,limit", [("num_hidden_layers", 10**30, MAX_LAYERS),
                                             ("num_hidden_layers", 10**7, MAX_LAYERS),
                                             ("max_position_embeddings", 10**30, MAX_SIZE),
                                             ("vocab_size", 2**40, MAX_SIZE),
                                             ("intermediate_size", 10**30, MAX_SIZE),
                                             ("head_dim", 10**30, MAX_SIZE)])
def test_hostile_sizes_are_refused_by_key_before_anything_is_built(ck, tmp_path, key, value, limit):
    _edit_config(ck, **{key: value})
    tracemalloc.start()
    try:
        with pytest.raises(OiError) as e:
            convert_hf(ck, tmp_path / "m.oinf")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert _msg(e) == f"{ck / 'config.json'}: {key} {value} is out of range (1..{limit})"
    assert peak < 4 << 20  # nothing sized by the hostile number was built
    assert not (tmp_path / "m.oinf").exists()


def test_hostile_max_positions_names_the_flag(ck, tmp_path, capsys):
    out = tmp_path / "m.oinf"
    with pytest.raises(OiError) as e:
        convert_hf(ck, out, max_positions=10**30)
    assert _msg(e) == f"max_positions (--max-positions) must be an integer in 1..{MAX_SIZE}, got {10**30}"
    code, _, stderr = run_cli(capsys, "convert-hf", ck, "-o", out, "--max-positions", str(10**30))
    assert code == 2 and stderr == f"error: --max-positions {10**30} is out of range (1..{MAX_SIZE})\n"
    assert not out.exists()


def _rewrite_header(path, edit):
    """The safetensors file at `path` with its JSON header changed by `edit(header)`."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


@pytest.mark.parametrize("edit,problem", [
    (lambda h: h["model.norm.weight"].update(dtype="Q4"), "tensor model.norm.weight: unknown dtype 'Q4'"),
    (lambda h: h["model.norm.weight"].update(shape=[16, -1]),
     "tensor model.norm.weight: shape [16, -1] is not a list of sizes"),
    (lambda h: h["model.norm.weight"].update(data_offsets=[0, 10**12]),
     "tensor model.norm.weight: 1000000000000 bytes for F32[16]"),
])
def test_safetensors_header_errors_name_the_file_and_the_tensor(ck, tmp_path, edit, problem):
    _rewrite_header(ck / "model.safetensors", edit)
    with pytest.raises(OiError) as e:
        convert_hf(ck, tmp_path / "m.oinf")
    assert _msg(e) == f"{ck / 'model.safetensors'}: cannot read safetensors file: {problem}"


def test_truncated_safetensors_names_the_tensor_past_the_end(ck, tmp_path):
    path = ck / "model.safetensors"
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    path.write_bytes(raw[:-4])
    with pytest.raises(OiError) as e:
        convert_hf(ck, tmp_path / "m.oinf")
    assert _msg(e).startswith(f"{path}: cannot read safetensors file: tensor {last}: data [")
    assert _msg(e).endswith("is past the end of the file")


def test_nonfinite_weights_are_noted_by_tensor_and_count_or_refused(tmp_path, capsys):
    ck, weights, _ = write_family(tmp_path / "ck", "llama", **SIZES)
    w = dict(weights)
    w["model.layers.0.mlp.up_proj.weight"] = w["model.layers.0.mlp.up_proj.weight"].copy()
    w["model.layers.0.mlp.up_proj.weight"][0, :3] = [np.nan, np.inf, -np.inf]
    w["model.norm.weight"] = np.full(16, np.nan, np.float32)
    from safetensors.numpy import save_file
    save_file(w, ck / "model.safetensors")
    for dtype in (None, "f16"):
        summary = convert_hf(ck, tmp_path / "m.oinf", dtype=dtype)
        where = ck / "model.safetensors"
        assert summary.notes == (f"{where}: tensor model.layers.0.mlp.up_proj.weight holds 1 NaN and 2 infinite value(s)",
                                 f"{where}: tensor model.norm.weight holds 16 NaN and 0 infinite value(s)")
        assert np.isnan(open_model(tmp_path / "m.oinf").load("model.norm.weight").astype(np.float32)).all()
    out = tmp_path / "refused.oinf"
    code, _, stderr = run_cli(capsys, "convert-hf", ck, "-o", out, "--nonfinite", "error")
    assert code == 1 and not out.exists()
    assert stderr == (f"error: {where}: tensor model.layers.0.mlp.up_proj.weight holds 1 NaN and 2 infinite "
                      f"value(s) (refused: --nonfinite error)\n")
    code, _, stderr = run_cli(capsys, "convert-hf", ck, "-o", out, "--quiet")
    assert code == 0 and stderr.count("note: ") == 2 and "model.norm.weight holds 16 NaN" in stderr


def test_head_dim_times_heads_need_not_be_hidden_size(tmp_path):
    ck, _, _ = write_family(tmp_path / "ck", "llama", head_dim=24, **SIZES)  # 2 heads x 24 = 48 != 16
    summary = convert_hf(ck, tmp_path / "m.oinf")
    assert (summary.sizevars["HD"], summary.sizevars["QD"], summary.sizevars["D"]) == (24, 48, 16)
    assert open_model(summary.path).tensors["model.layers.0.self_attn.o_proj.weight"].shape == (16, 48)


def test_unknown_names_suggest_a_close_known_one(ck, tmp_path):
    _edit_config(ck, model_type="mistal", architectures=None)
    with pytest.raises(OiError) as e:
        convert_hf(ck, tmp_path / "m.oinf")
    assert _msg(e).startswith(f"{ck / 'config.json'}: model_type is 'mistal' (did you mean mistral?): supported model "
                              f"types are ")
    _edit_config(ck, model_type="llama", architectures=["LlamaForCausalLM"],
                 rope_parameters={"rope_type": "lama3", "rope_theta": 1e4})
    with pytest.raises(OiError) as e:
        convert_hf(ck, tmp_path / "m.oinf")
    assert _msg(e) == (f"{ck / 'config.json'}: rope_parameters.rope_type is 'lama3' (did you mean llama3?): "
                       f"supported rope types are default, linear, llama3")


@pytest.mark.parametrize("changes,message", [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e300}},
     "rope_parameters.rope_theta 1e+300 is beyond f32's range (transformers computes the rotary frequencies in f32)"),
    ({"rope_parameters": None, "rope_theta": 1e300, "rope_scaling": None},
     "rope_theta 1e+300 is beyond f32's range (transformers computes the rotary frequencies in f32)"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 1.0, "original_max_position_embeddings": 64}},
     "rope_parameters.high_freq_factor equals low_freq_factor (1.0): llama3 rope divides by their difference"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 0}},
     "rope_parameters.factor must be a positive number, got 0"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, "rope_scaling": {"rope_type": "linear",
                                                                                         "factor": 2.0}},
     "rope_scaling {'rope_type': 'linear', 'factor': 2.0} disagrees with rope_parameters {'rope_type': 'default', "
     "'rope_theta': 10000.0}: which one?"),
    ({"vocab_size": 1e9}, "vocab_size must be a positive integer, got 1000000000.0"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be a positive integer, got True"),
])
def test_hostile_rope_and_size_values_name_the_key(ck, tmp_path, changes, message):
    _edit_config(ck, **changes)
    with pytest.raises(OiError) as e:
        convert_hf(ck, tmp_path / "m.oinf")
    assert _msg(e) == f"{ck / 'config.json'}: {message}"


def test_an_oversized_config_is_not_read(ck, tmp_path, monkeypatch):
    import oi2jax.model.hf.config as C
    monkeypatch.setattr(C, "MAX_JSON_BYTES", 100)
    with pytest.raises(OiError) as e:
        convert_hf(ck, tmp_path / "m.oinf")
    size = (ck / "config.json").stat().st_size
    assert _msg(e) == (f"{ck / 'config.json'}: cannot read the config: {size} bytes is more than a JSON file of "
                       f"this kind holds (at most 100)")
