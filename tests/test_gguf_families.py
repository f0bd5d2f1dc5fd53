"""convert-gguf per GGUF architecture (qwen2, qwen3, phi3, gemma2, gemma3): a project-written GGUF
twin of each family's tiny Hugging Face checkpoint (tests/hf_ref.py, tests/gemma_gpt2_checkpoints.py),
written with gguf.GGUFWriter as llama.cpp's converter writes that family (its tensor names and
metadata keys; gemma's norms stored as `w + 1`, phi3's fused tensors kept fused), F32 and with
its matrices quantized by gguf.quants.quantize. Each converts to the same model as the HF form:
f32 bit-equal, Q8_0 equal to gguf.quants.dequantize, kept Q8_0 blocks equal to the f32
conversion once loaded, and the family's example graph gives the same logits on either."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGMLQuantizationType as T
from safetensors.numpy import save_file

import oi2jax
from oi2jax.model import open_model
from oi2jax.model.convert import convert_hf
from oi2jax.model.gguf import ARCHITECTURES, convert_gguf

import gemma_gpt2_checkpoints as gemma_ck
import hf_ref
from conftest import EXAMPLES, assert_kept_close
from test_gguf import _same_model

SIZES = dict(vocab=48, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, max_positions=16)
GEMMA = dict(vocab=48, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=64, max_positions=16,
             sliding_window=4)
CASES = {  # GGUF architecture -> (HF model_type, writer of the HF form)
    "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3", "gemma2": "gemma2", "gemma3": "gemma3_text"}


def _hf_form(tmp, arch: str):
    """(HF directory, config, weights) of the family's tiny checkpoint. Gemma: query_pre_attn_scalar
    = head_dim (what llama.cpp uses; GGUF does not carry it)."""
    model_type = CASES[arch]
    directory = tmp / f"hf-{arch}"
    if model_type.startswith("gemma"):
        make = gemma_ck.gemma2_config if model_type == "gemma2" else gemma_ck.gemma3_text_config
        config = make(**GEMMA, query_pre_attn_scalar=GEMMA["head_dim"])
        weights = gemma_ck.random_weights(config, seed=1)
        gemma_ck.write_checkpoint(directory, config, weights)
    else:
        directory, weights, config = hf_ref.write_family(directory, model_type, seed=1, **SIZES,
                                                         head_dim=24 if model_type == "qwen3" else None)
    return directory, config, weights


def _write_twin(path, arch: str, config: dict, weights: dict, kind: str) -> dict:
    """The GGUF llama.cpp's converter would write for this checkpoint; returns {GGUF name: stored}."""
    to_gguf = {}
    for g, h in ARCHITECTURES[arch].tensors.items():
        to_gguf[h] = g
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    rope = config.get("rope_parameters") or {}
    theta = rope.get("full_attention", rope).get("rope_theta", config.get("rope_theta"))
    w.add_rope_freq_base(theta)
    if config.get("head_dim"):
        w.add_key_length(config["head_dim"])
        w.add_value_length(config["head_dim"])
        w.add_rope_dimension_count(config["head_dim"])
    if arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(config["original_max_position_embeddings"])
    if config.get("sliding_window") is not None:
        w.add_sliding_window(config["sliding_window"])
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if config.get(key) is not None:
            w.add_float32(f"{arch}.{key}", config[key])
    written = {}
    for name, value in weights.items():
        g = None
        for h, candidate in to_gguf.items():
            if "{i}" in h:
                prefix, suffix = h.split("{i}")
                layer = name[len(prefix):len(name) - len(suffix)]
                if name.startswith(prefix) and name.endswith(suffix) and layer.isdigit():
                    g = candidate.replace("{i}", layer)
            elif h == name:
                g = candidate
        assert g is not None, name
        if arch.startswith("gemma") and name.endswith("norm.weight"):  # llama.cpp: data_torch + 1
            value = (value + np.float32(1)).astype(np.float32)
        if value.ndim == 2 and kind != "F32":
            w.add_tensor(g, quants.quantize(value, T[kind]), raw_dtype=T[kind])
        else:
            w.add_tensor(g, np.ascontiguousarray(value), raw_dtype=T.F32)
        written[g] = value
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


@pytest.fixture(scope="module", params=list(CASES))
def family(request, tmp_path_factory):
    arch = request.param
    tmp = tmp_path_factory.mktemp(arch)
    directory, config, weights = _hf_form(tmp, arch)
    out = {"arch": arch, "tmp": tmp, "config": config}
    _write_twin(tmp / "f32.gguf", arch, config, weights, "F32")
    _write_twin(tmp / "q8.gguf", arch, config, weights, "Q8_0")
    convert_hf(directory, tmp / "hf.oinf")
    # the HF form of the Q8_0 twin: the same checkpoint with its matrices as dequantized Q8_0
    deq = {k: (quants.dequantize(quants.quantize(v, T.Q8_0), T.Q8_0) if v.ndim == 2 else v) for k, v in weights.items()}
    save_file(deq, str(directory / "model.safetensors"), metadata={"format": "pt"})
    convert_hf(directory, tmp / "hf-q8.oinf")
    convert_gguf(tmp / "f32.gguf", tmp / "gguf.oinf")
    convert_gguf(tmp / "q8.gguf", tmp / "gguf-q8-f32.oinf", dtype="f32")
    convert_gguf(tmp / "q8.gguf", tmp / "gguf-q8.oinf")
    return out


def _gemma(family) -> bool:
    return family["arch"].startswith("gemma")


def _logits(model, steps=(3, 1, 4)):
    graph = EXAMPLES / open_model(model).metadata["example_graph"].value.removeprefix("examples/")
    sess = oi2jax.compile(graph, model=model, ops=["nn"]).session()
    out = []
    for tok in steps:
        sess.step(token=np.int32(tok))
        out.append(np.asarray(sess.read("logits")))
    return np.stack(out)


def test_f32_twin_converts_bit_equal(family):
    tmp = family["tmp"]
    _same_model(tmp / "hf.oinf", tmp / "gguf.oinf", norms_hold_one_plus_w=_gemma(family))
    if family["arch"] == "gemma2":  # norms `1 + w` with offset 0 compute what `w` with offset 1 computes
        got, want = _logits(tmp / "gguf.oinf"), _logits(tmp / "hf.oinf")
        assert got.tobytes() == want.tobytes() and np.abs(want).max() > 0


def test_q8_twin_dequantizes_as_gguf_quants(family):
    tmp = family["tmp"]
    _same_model(tmp / "hf-q8.oinf", tmp / "gguf-q8-f32.oinf", norms_hold_one_plus_w=_gemma(family))


def test_kept_q8_blocks_load_and_run_as_the_f32_conversion(family):
    tmp = family["tmp"]
    kept, f32 = open_model(tmp / "gguf-q8.oinf"), open_model(tmp / "gguf-q8-f32.oinf")
    assert any(t.ggml == "Q8_0" for t in kept.tensors.values())
    assert sorted(kept.tensors) == sorted(f32.tensors)
    for name in kept.tensors:
        assert kept.load(name).tobytes() == f32.load(name).tobytes(), name
    if family["arch"] != "phi3":  # the values are bit-equal above; phi3 (fused rows of blocks) also runs
        return
    got, want = _logits(tmp / "gguf-q8.oinf"), _logits(tmp / "hf-q8.oinf")
    assert_kept_close(got, want, "phi3")  # the blocks stay packed on the device: another summation order

