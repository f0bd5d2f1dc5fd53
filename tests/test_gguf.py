"""`oi2jax convert-gguf` (issue #39 item 2, 5) on project-written GGUF twins of Hugging Face
checkpoints: written with gguf.GGUFWriter, quantized with gguf.quants.quantize, Q/K permuted as
llama.cpp's converter does. A twin converts to the same model as its Hugging Face form (f32
bit-equal; each quantized type equal to gguf.quants.dequantize); kept blocks round-trip their
bytes and run examples/llama_decode.oi with the logits of the f32 conversion; hostile files are
errors naming the file and key or tensor, with nothing written."""
from __future__ import annotations

import importlib.util
import math
import struct

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

import oi2jax
from oi2jax.diagnostics import OiError
from oi2jax.model import open_model
from oi2jax.model.convert import convert_hf
from oi2jax.model.gguf import (ARCHITECTURES, convert_gguf, gguf_config, hf_name, permute, reverse_permute)

from conftest import EXAMPLES, assert_kept_close, run_cli

spec = importlib.util.spec_from_file_location("llama_checkpoint", EXAMPLES / "llama_checkpoint.py")
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)

LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
KQUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
SMALL = dict(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, max_positions=16)
WIDE = dict(vocab=16, hidden=256, layers=1, heads=2, kv_heads=1, intermediate=256, max_positions=8)
# where each K-quant block keeps its f16 scales (d, and dmin where it has one): ggml-common.h
_K_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
_TO_GGUF = {v: k for k, v in ARCHITECTURES["llama"].tensors.items()}


def _gguf_name(hf: str) -> str:
    for g, h in ARCHITECTURES["llama"].tensors.items():
        if "{i}" in h:
            prefix, suffix = h.split("{i}")
            if hf.startswith(prefix) and hf.endswith(suffix) and hf[len(prefix):-len(suffix)].isdigit():
                return g.replace("{i}", hf[len(prefix):-len(suffix)])
        elif h == hf:
            return g
    raise KeyError(hf)


def _k_blocks(kind: str, rows: int, cols: int, rng) -> np.ndarray:
    """Valid `kind` blocks for a [rows, cols] tensor: gguf.quants has no K-quant quantizer, so the
    quants are random bytes and the f16 scales small finite numbers."""
    block, size = gguf.GGML_QUANT_SIZES[T[kind]]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at in _K_SCALES[kind]:
        scale = (rng.uniform(0.5, 1.0, (rows, cols // block)) * 1e-3).astype(np.float16)
        raw[:, :, at:at + 2] = scale.view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, cols // block * size)


def _twin(tmp, kind: str, sizes: dict, tied: bool = False, seed: int = 0, edit=None, kv=None, rope=None):
    """(HF directory, GGUF path, GGUF tensors as written): a random Llama, its 2-D weights stored
    as `kind` in the GGUF (norms F32) and as their dequantized values in the HF form."""
    rng = np.random.default_rng(seed)
    config = ex.llama_config(**sizes, tied=tied)
    if rope:
        config["rope_parameters"] = rope
    weights = ex.random_llama_weights(config, seed=seed)
    H, KVH = config["num_attention_heads"], config["num_key_value_heads"]
    hf, written = {}, {}
    for name, w in weights.items():
        if w.ndim == 1 or kind in ("F32", "F16", "BF16"):
            if kind == "F16" and w.ndim == 2:
                w = w.astype(np.float16)
            elif kind == "BF16" and w.ndim == 2:
                w = w.astype(ml_dtypes.bfloat16)
            hf[name] = w
            stored = w
        else:
            blocks = quants.quantize(w, T[kind]) if kind in LEGACY else _k_blocks(kind, *w.shape, rng)
            hf[name] = quants.dequantize(blocks, T[kind])
            stored = blocks
        if name.endswith("q_proj.weight"):  # llama.cpp: LlamaModel.permute(data, n_head, n_head)
            stored = permute(stored, H, H)
            if kind in LEGACY:  # permute-then-quantize == quantize-then-permute: whole rows move
                np.testing.assert_array_equal(quants.quantize(permute(w, H, H), T[kind]), stored)
        elif name.endswith("k_proj.weight"):
            stored = permute(stored, H, KVH)
        written[_gguf_name(name)] = stored
    if edit:
        edit(written)
    directory = ex.write_checkpoint(tmp / f"hf-{kind}-{seed}", config,
                                    {k: np.asarray(v) for k, v in hf.items()})
    path = tmp / f"twin-{kind}-{seed}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(KVH)
    w.add_rope_dimension_count(config["head_dim"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    if kv:
        kv(w)
    for name, arr in written.items():
        gkind = kind if arr.dtype == np.uint8 else {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}[arr.dtype.name]
        if gkind == "BF16":
            w.add_tensor(name, np.ascontiguousarray(arr).view(np.uint8), raw_dtype=T.BF16)
        else:
            w.add_tensor(name, np.ascontiguousarray(arr), raw_dtype=T[gkind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return directory, path, written


def _same_model(hf, gguf_model, norms_hold_one_plus_w=False):
    """The GGUF's conversion is the HF one's: sizes, metadata (but the tokenizer entries, which the
    HF form takes from its config.json ids), every tensor bit for bit. `norms_hold_one_plus_w`
    (gemma): the norms are llama.cpp's stored `1 + w`, exactly fl(1 + w) of the HF weight, and
    norm_offset 0 instead of 1, which makes the graphs' factor `norm_offset + weight` the same."""
    ma, mb = open_model(hf), open_model(gguf_model)
    assert dict(ma.sizevars) == dict(mb.sizevars)

    def model_meta(m):
        return {k: v for k, v in m.metadata.items() if not k.startswith(("tokenizer.", "ggml_type."))}
    meta_a, meta_b = model_meta(ma), model_meta(mb)
    if norms_hold_one_plus_w:
        assert (meta_a.pop("norm_offset").value, meta_b.pop("norm_offset").value) == (1.0, 0.0)
    assert meta_a == meta_b and "architecture" in meta_a
    assert sorted(ma.tensors) == sorted(mb.tensors)
    for name in ma.tensors:
        x, y = ma.load(name), mb.load(name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        if norms_hold_one_plus_w and name.endswith("norm.weight"):
            x = (np.float32(1) + x).astype(np.float32)
        assert x.tobytes() == y.tobytes(), name


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16", *LEGACY, *KQUANTS])
def test_twin_converts_to_the_hf_model(tmp_path, kind):
    sizes = WIDE if kind in KQUANTS else SMALL
    hf_dir, path, written = _twin(tmp_path, kind, sizes, tied=kind == "Q8_0")
    convert_hf(hf_dir, tmp_path / "hf.oinf", dtype="f32")
    convert_gguf(path, tmp_path / "gguf.oinf", dtype="f32")
    _same_model(tmp_path / "hf.oinf", tmp_path / "gguf.oinf")
    # the values are gguf.quants.dequantize of the file's blocks (Q/K rows put back in HF order)
    m = open_model(tmp_path / "gguf.oinf")
    H, KVH = sizes["heads"], sizes["kv_heads"]
    for hf in ("model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.k_proj.weight"):
        raw = written[_gguf_name(hf)]
        want = quants.dequantize(raw.view(np.uint8) if kind == "BF16" else raw, T[kind])
        if "k_proj" in hf:
            want = reverse_permute(want, H, KVH)
        assert m.load(hf).tobytes() == np.asarray(want, np.float32).tobytes()


@pytest.mark.parametrize("kind", ["F16", "BF16"])
def test_float_types_keep_their_dtype(tmp_path, kind):
    hf_dir, path, _ = _twin(tmp_path, kind, SMALL)
    convert_hf(hf_dir, tmp_path / "hf.oinf")
    convert_gguf(path, tmp_path / "gguf.oinf")
    _same_model(tmp_path / "hf.oinf", tmp_path / "gguf.oinf")
    assert open_model(tmp_path / "gguf.oinf").tensors["model.layers.1.mlp.up_proj.weight"].dtype == kind.lower()


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kept")
    out = {}
    for kind, sizes in (("Q4_1", SMALL), ("Q4_K", WIDE)):  # metadata the graph does not read: a chat template
        _, path, written = _twin(tmp, kind, sizes, tied=True, kv=lambda w: w.add_chat_template("{{ messages }}"))
        convert_gguf(path, tmp / f"{kind}.oinf")
        convert_gguf(path, tmp / f"{kind}-f32.oinf", dtype="f32")
        out[kind] = (tmp / f"{kind}.oinf", tmp / f"{kind}-f32.oinf", written, sizes)
    return out


@pytest.mark.parametrize("kind", ["Q4_1", "Q4_K"])
def test_kept_blocks_round_trip_their_bytes(kept, kind):
    path, f32_path, written, sizes = kept[kind]
    m, f = open_model(path), open_model(f32_path)
    H, KVH = sizes["heads"], sizes["kv_heads"]
    for name, info in m.tensors.items():
        if info.ggml is None:
            assert info.dtype == "f32" and len(info.shape) == 1
            continue
        assert info.ggml == m.ggml_type(name) == kind and info.dtype == "u8"
        assert info.value_shape == f.tensors[name].shape and info.value_dtype == "f32"
        raw = written[_gguf_name("model.embed_tokens.weight" if name == "lm_head.weight" else name)]
        if "q_proj" in name:
            raw = reverse_permute(raw, H, H)
        elif "k_proj" in name:
            raw = reverse_permute(raw, H, KVH)
        assert m.load_packed(name).tobytes() == np.ascontiguousarray(raw).tobytes(), name
        assert m.load(name).tobytes() == f.load(name).tobytes(), name  # dequantized at load, exactly
    assert m.metadata["ggml_type.model.layers.0.mlp.up_proj.weight"].value == kind


@pytest.mark.parametrize("kind", ["Q4_1", "Q4_K"])
def test_kept_blocks_run_the_llama_graph_like_the_f32_conversion(kept, kind, tmp_path, capsys):
    """The f32 conversion through the API; the kept one through the CLI (`oi2jax run`), its weights
    packed on the device: the f32 logits up to the products' summation order (conftest's
    KEPT_QUANTIZED_REL); interpreted (blocks dequantized at load), the f32 conversion's bit for bit."""
    path, f32_path, _, sizes = kept[kind]
    tokens = np.array([3, 1, 4, 1, 5][:sizes["max_positions"]], np.int32) % sizes["vocab"]
    sess = oi2jax.compile(EXAMPLES / "llama_decode.oi", model=f32_path, ops=["nn"]).session()
    want = []
    for tok in tokens:
        sess.step(token=np.int32(tok))
        want.append(np.asarray(sess.read("logits")))
    np.savez(tmp_path / "prompt.npz", token=tokens)
    code, _, err = run_cli(capsys, "run", EXAMPLES / "llama_decode.oi", "--model", path, "--ops", "nn",
                           "--inputs-per-step", tmp_path / "prompt.npz", "--steps", str(len(tokens)),
                           "--collect", "logits", "--out", tmp_path / "out.npz", "--quiet")
    assert code == 0, err
    got = np.load(tmp_path / "out.npz")["logits"]
    assert_kept_close(got, np.stack(want), kind)
    if kind != "Q4_K":  # the oracle's claim once, on the one-layer model
        return
    got, want = (oi2jax.compile(EXAMPLES / "llama_decode.oi", model=m, ops=["nn"], mode="interpret")
                 .run({"token": tokens[0]})["logits"] for m in (path, f32_path))
    assert got.tobytes() == want.tobytes() and np.abs(got).max() > 0


def test_inspect_shows_kept_blocks(kept, capsys):
    code, stdout, _ = run_cli(capsys, "inspect", kept["Q4_1"][0])
    assert code == 0
    assert "ggml Q4_1 blocks of f32[64, 32] (kept packed when compiled)" in stdout
    assert "ggml_type.* entries" in stdout and "example graph: examples/llama_decode.oi" in stdout


def test_cli_convert_gguf(tmp_path, capsys):
    _, path, _ = _twin(tmp_path, "Q8_0", SMALL)
    out = tmp_path / "m.oinf"
    code, stdout, stderr = run_cli(capsys, "convert-gguf", path, "-o", out, "--max-positions", "8")
    assert code == 0 and stdout == "" and stderr == (f"wrote {out}: 22 tensors (f32, u8, 24.0 KiB); V=64 D=32 F=64 L=2 H=4 KVH=2 HD=8 T=8 QD=32 KVD=16 G=2 R=4; llama: run it with examples/llama_decode.oi\n")
    assert open_model(out).sizevars["T"] == 8
    code, _, stderr = run_cli(capsys, "convert-gguf", path, "-o", out, "--dtype", "bf16", "--quiet")
    assert (code, stderr) == (0, "") and open_model(out).tensors["model.norm.weight"].dtype == "bf16"


# ------------------------------------------------------------------------- the mapping tables

def test_config_mapping_per_architecture():
    tensors = {}
    fields = {"general.architecture": "qwen3", "qwen3.context_length": 64, "qwen3.block_count": 2,
              "qwen3.embedding_length": 32, "qwen3.feed_forward_length": 48, "qwen3.attention.head_count": 4,
              "qwen3.attention.head_count_kv": 2, "qwen3.attention.key_length": 16,
              "qwen3.attention.layer_norm_rms_epsilon": 1e-6, "qwen3.rope.freq_base": 1e6, "qwen3.vocab_size": 80}
    assert gguf_config(fields, tensors, "f.gguf") == {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_act": "silu",
        "max_position_embeddings": 64, "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 48,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
        "rope_theta": 1e6, "vocab_size": 80, "tie_word_embeddings": True}
    scaled = {**fields, "qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0,
              "qwen3.rope.scaling.original_context_length": 32}  # the converter accepts or refuses it by key
    assert gguf_config(scaled, tensors, "f.gguf")["rope_scaling"] == {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    assert "rope_scaling" not in gguf_config({**fields, "qwen3.rope.scaling.type": "none"}, tensors, "f.gguf")
    with pytest.raises(OiError, match=r"f.gguf: metadata qwen3.rope.scaling.factor is given without "):
        gguf_config({**fields, "qwen3.rope.scaling.factor": 2.0}, tensors, "f.gguf")
    with pytest.raises(OiError, match=r"metadata qwen3.rope.dimension_count is 8, head dim is 16: a partial"):
        gguf_config({**fields, "qwen3.rope.dimension_count": 8}, tensors, "f.gguf")
    with pytest.raises(OiError, match=r"metadata qwen3.expert_count is not supported"):
        gguf_config({**fields, "qwen3.expert_count": 8}, tensors, "f.gguf")
    with pytest.raises(OiError, match=r"general.architecture is 'mamba': supported GGUF architectures are llama, "):
        gguf_config({"general.architecture": "mamba"}, tensors, "f.gguf")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("sub, value", [("attention.sliding_window", 4), ("attn_logit_softcapping", 50.0),
                                        ("final_logit_softcapping", 30.0)])
def test_a_window_or_softcap_the_family_does_not_read_is_an_error(arch, sub, value):
    """A sliding window or soft-capping in a llama / qwen2 / qwen3 file: the family's graph has none,
    so the key is refused by name (it was mapped into the config and never read: a silent full
    attention, uncapped logits)."""
    fields = {"general.architecture": arch, f"{arch}.block_count": 1, f"{arch}.embedding_length": 32,
              f"{arch}.attention.head_count": 4, f"{arch}.vocab_size": 9, f"{arch}.{sub}": value}
    with pytest.raises(OiError, match=rf"f.gguf: metadata {arch}\.{sub} is not supported: its setting would be lost"):
        gguf_config(fields, {}, "f.gguf")
    if sub == "attention.sliding_window":  # phi3 reads it
        phi3 = {k.replace(arch, "phi3", 1): v for k, v in fields.items()} | {"general.architecture": "phi3"}
        assert gguf_config(phi3, {}, "f.gguf")["sliding_window"] == 4


@pytest.mark.parametrize("arch, layers, scalar", [("gemma2", 2, 16), ("gemma3", 2, 16), ("gemma2", 46, 12),
                                                  ("gemma3", 62, 12), ("gemma3", 46, 16)])
def test_gemma_query_scale_is_llama_cpps(arch, layers, scalar):
    """GGUF has no query_pre_attn_scalar: llama.cpp uses head_dim, or D/H for the 27B models."""
    fields = {"general.architecture": arch, f"{arch}.block_count": layers, f"{arch}.embedding_length": 48,
              f"{arch}.attention.head_count": 4, f"{arch}.attention.key_length": 16,
              f"{arch}.attn_logit_softcapping": 50.0, f"{arch}.attention.sliding_window": 8, f"{arch}.vocab_size": 9}
    config = gguf_config(fields, {"token_embd.weight": None, "output.weight": None}, "g.gguf")
    assert config["query_pre_attn_scalar"] == scalar and config["tie_word_embeddings"] is False
    assert config["attn_logit_softcapping"] == 50.0 and config["sliding_window"] == 8
    assert config["hidden_activation"] == "gelu_pytorch_tanh"


@pytest.mark.parametrize("arch, gguf_name, hf", [
    ("llama", "blk.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight"),
    ("qwen2", "blk.0.attn_k.bias", "model.layers.0.self_attn.k_proj.bias"),
    ("qwen3", "blk.1.attn_q_norm.weight", "model.layers.1.self_attn.q_norm.weight"),
    ("phi3", "blk.0.attn_qkv.weight", "model.layers.0.self_attn.qkv_proj.weight"),
    ("phi3", "blk.0.ffn_up.weight", "model.layers.0.mlp.gate_up_proj.weight"),
    ("gemma2", "blk.2.ffn_norm.weight", "model.layers.2.pre_feedforward_layernorm.weight"),
    ("gemma2", "blk.2.post_ffw_norm.weight", "model.layers.2.post_feedforward_layernorm.weight"),
    ("gemma3", "blk.0.attn_k_norm.weight", "model.layers.0.self_attn.k_norm.weight"),
    ("llama", "blk.0.attn_q.bias", None), ("phi3", "blk.0.attn_q.weight", None),
    ("llama", "rope_freqs.weight", None),
])
def test_tensor_names_per_architecture(arch, gguf_name, hf):
    assert hf_name(ARCHITECTURES[arch], gguf_name) == hf


def test_permute_is_llama_cpps_and_reverse_undoes_it():
    w = np.arange(16 * 3).reshape(16, 3)
    # llama.cpp: per head, rows [x0..x_{d/2-1}, y0..] -> interleaved [x0, y0, x1, y1, ...]
    head = permute(w, 2)[:8, 0] // 3
    assert head.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    for n, kv in ((2, None), (4, 2), (8, 1)):
        assert (reverse_permute(permute(w, n, kv), n, kv) == w).all()


# ------------------------------------------------------------------------------ hostile files

def _kv_string(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, len(v)) + v


def _header(kvs: bytes, n_kv: int, tensors: bytes = b"", n_tensors: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kvs + tensors


def _tensor_info(name: str, ne: list[int], code: int, offset: int) -> bytes:
    n = name.encode()
    return struct.pack("<Q", len(n)) + n + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) + \
        struct.pack("<IQ", code, offset)


def _hostile(tmp_path, data: bytes):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case, message", [
    ("empty", r"not a GGUF file \(wrong magic"),
    ("magic", r"not a GGUF file \(wrong magic"),
    ("version", r"GGUF version 1 is not supported"),
    ("huge array", r"metadata tokenizer.ggml.tokens: an array of 1099511627776 items does not fit"),
    ("huge string", r"truncated: metadata general.name needs 1099511627776 bytes"),
    ("unknown type", r"tensor token_embd.weight: unknown tensor type 99"),
    ("past the end", r"tensor token_embd.weight: data \(offset 128, 1024 bytes\) runs past the end of the file \(126 bytes\)"),
    ("truncated", r"truncated: the length of a tensor name"),
    ("bad alignment", r"general.alignment is 3: not a power of two"),
    ("iq type", r"tensor token_embd.weight has type IQ2_XXS: supported types are F32, F16, BF16, Q4_0"),
    ("duplicate tensor", r"tensor token_embd.weight appears twice"),
    ("duplicate key", r"metadata general.architecture appears twice"),
    ("nested array", r"metadata general.tags: array of value type 9 is not supported"),
    ("zero dim", r"tensor token_embd.weight: dims \[16, 0\] are not a tensor this file can hold"),
    ("partial block", r"tensor token_embd.weight: row of 16 values is not a whole number of Q4_0 blocks \(32\)"),
    ("bad utf-8", r"a metadata key is not UTF-8"),
    # a string value, and an item of a string array (a fuzzed vocabulary): an internal
    # UnicodeDecodeError of gguf's reader before
    ("bad utf-8 value", r"metadata general.name is not UTF-8"),
    ("bad utf-8 item", r"metadata tokenizer.ggml.tokens\[1\] is not UTF-8"),
    ("huge tensor count", r"1 metadata entries and 1152921504606846976 tensors cannot fit in"),
    ("overlapping tensors", r"tensor output.weight: data \(offset 224\) overlaps tensor token_embd.weight's "
                            r"\(offset 192, 64 bytes\)"),
])
def test_hostile_files_are_errors_naming_file_and_key(tmp_path, case, message):
    arch = _kv_string("general.architecture", "llama")
    data = {
        "empty": b"",
        "magic": b"GGUX" + bytes(20),
        "version": b"GGUF" + struct.pack("<IQQ", 1, 0, 0),
        "huge array": _header(arch + struct.pack("<Q", 21) + b"tokenizer.ggml.tokens" + struct.pack("<IIQ", 9, 8, 1 << 40),
                              2),
        "huge string": _header(struct.pack("<Q", 12) + b"general.name" + struct.pack("<IQ", 8, 1 << 40), 1),
        "unknown type": _header(arch, 1, _tensor_info("token_embd.weight", [16, 16], 99, 0), 1),
        "past the end": _header(arch, 1, _tensor_info("token_embd.weight", [16, 16], 0, 0), 1),
        "truncated": _header(arch, 1, b"", 1),
        "bad alignment": _header(arch + struct.pack("<Q", 17) + b"general.alignment" + struct.pack("<II", 4, 3), 2),
        "iq type": _header(arch, 1, _tensor_info("token_embd.weight", [256, 1], 16, 0), 1) + bytes(4096),
        "duplicate tensor": _header(arch, 1, _tensor_info("token_embd.weight", [4], 0, 0) * 2, 2) + bytes(64),
        "duplicate key": _header(arch * 2, 2),
        "nested array": _header(struct.pack("<Q", 12) + b"general.tags" + struct.pack("<IIQ", 9, 9, 1), 1),
        "zero dim": _header(arch, 1, _tensor_info("token_embd.weight", [16, 0], 0, 0), 1),
        "partial block": _header(arch, 1, _tensor_info("token_embd.weight", [16, 2], 2, 0), 1) + bytes(256),
        "bad utf-8": _header(struct.pack("<Q", 2) + b"\xff\xfe" + struct.pack("<IQ", 8, 0), 1),
        "bad utf-8 value": _header(arch + struct.pack("<Q", 12) + b"general.name" + struct.pack("<IQ", 8, 2) + b"\xc3(",
                                   2),
        "bad utf-8 item": _header(arch + struct.pack("<Q", 21) + b"tokenizer.ggml.tokens" + struct.pack("<IIQ", 9, 8, 2)
                                  + struct.pack("<Q", 1) + b"a" + struct.pack("<Q", 1) + b"\xff", 2),
        "huge tensor count": b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 1) + arch,
        # two f32 tensors of 16 values (64 bytes), the second starting 32 bytes into the first
        "overlapping tensors": _header(arch, 1, _tensor_info("token_embd.weight", [16], 0, 0) +
                                       _tensor_info("output.weight", [16], 0, 32), 2) + bytes(128),
    }[case]
    path = _hostile(tmp_path, data)
    out = tmp_path / "m.oinf"
    out.write_bytes(b"keep me")
    with pytest.raises(OiError, match=message) as e:
        convert_gguf(path, out)
    assert str(path) in str(e.value)
    assert out.read_bytes() == b"keep me"


LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _llama_cpp_rope_factors(theta, head_dim, factor, low, high, original):
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors, in Python floats."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def test_llama3_rope_factors_become_the_hf_rope_scaling(tmp_path):
    """Llama 3.1-3.3 GGUFs carry the llama3 rope as rope_freqs.weight: read back into rope_scaling, the
    model equals the HF conversion (whose rope.inv_freq the converter computes)."""
    factors = _llama_cpp_rope_factors(5e5, 8, 32.0, 1.0, 4.0, 8192)
    assert 1.0 < factors[2] < 32.0 and factors[3] == 32.0 and factors[0] == 1.0  # each branch taken

    def add(written):
        written["rope_freqs.weight"] = factors
    hf_dir, path, _ = _twin(tmp_path, "F32", SMALL, edit=add, rope=LLAMA3)
    convert_hf(hf_dir, tmp_path / "hf.oinf")
    summary = convert_gguf(path, tmp_path / "gguf.oinf")
    _same_model(tmp_path / "hf.oinf", tmp_path / "gguf.oinf")
    assert any("rope_freqs.weight read as rope_scaling" in n for n in summary.notes)

    def bogus(written):
        written["rope_freqs.weight"] = np.array([1, 2, 3, 5], np.float32)
    _, path, _ = _twin(tmp_path, "F32", SMALL, seed=2, edit=bogus, rope=LLAMA3)
    with pytest.raises(OiError, match=r"tensor rope_freqs.weight: these rope factors are not a llama3 rope"):
        convert_gguf(path, tmp_path / "m.oinf")


def test_unsupported_tensors_and_key_types_are_named(tmp_path):

    def extra(written):
        written["blk.0.attn_q.bias"] = np.ones(32, np.float32)
    _, path, _ = _twin(tmp_path, "F32", SMALL, seed=1, edit=extra)
    with pytest.raises(OiError, match=r"tensor blk.0.attn_q.bias: not part of a GGUF llama model"):
        convert_gguf(path, tmp_path / "m.oinf")
    fields = {"general.architecture": "llama", "llama.block_count": "2", "llama.vocab_size": 4}
    with pytest.raises(OiError, match=r"f.gguf: metadata llama.block_count must be an integer, got '2'"):
        gguf_config(fields, {}, "f.gguf")
    with pytest.raises(OiError, match=r"f.gguf: metadata llama.rope.freq_base must be a number, got 'x'"):
        gguf_config({**fields, "llama.block_count": 2, "llama.rope.freq_base": "x"}, {}, "f.gguf")
    assert not (tmp_path / "m.oinf").exists()


def test_wrong_shapes_and_cli_errors(tmp_path, capsys):
    def swap(written):
        written["blk.0.ffn_up.weight"] = written["blk.0.ffn_down.weight"]
    _, path, _ = _twin(tmp_path, "F32", SMALL, edit=swap)
    out = tmp_path / "m.oinf"
    code, stdout, stderr = run_cli(capsys, "convert-gguf", path, "-o", out)
    assert code == 1 and stdout == "" and not out.exists()
    assert stderr.startswith("error: ") and "model.layers.0.mlp.up_proj.weight (GGUF blk.0.ffn_up.weight)" in stderr \
        and "has shape [32, 64], expected [64, 32]" in stderr and "Traceback" not in stderr
    code, _, stderr = run_cli(capsys, "convert-gguf", tmp_path / "nope.gguf", "-o", out)
    assert code == 1 and stderr == f"error: {tmp_path / 'nope.gguf'}: file not found\n"


def test_metadata_errors_name_the_gguf_keys(tmp_path):
    """convert-gguf reads a GGUF's `{arch}.` keys into a Hugging Face config; an error about one of
    them names the GGUF key it was read from, not the config key it became."""
    from oi2jax.model.gguf import _in_gguf_keys
    where = "m.gguf (metadata)"
    arch = type("Arch", (), {"keys": {}})()
    for hf, want in (("max_position_embeddings must be a positive integer, got 0",
                      "llama.context_length must be a positive integer, got 0"),
                     ("num_key_value_heads 3 does not divide num_attention_heads 4",
                      "llama.attention.head_count_kv 3 does not divide llama.attention.head_count 4")):
        assert str(_in_gguf_keys(OiError(f"{where}: {hf}"), where, "llama", arch)) == f"error: {where}: {want}"
    _, path, _ = _twin(tmp_path, "F32", SMALL, kv=lambda w: w.add_eos_token_id(99999))
    with pytest.raises(OiError, match=r"\(metadata\): tokenizer.ggml.eos_token_id 99999 is not a token of the "
                                      r"vocabulary"):
        convert_gguf(path, tmp_path / "m.oinf")


def test_another_architectures_keys_are_named_not_dropped_unseen(tmp_path):
    """A llama file with a gemma2 key: llama.cpp reads only the file's own architecture's keys, as
    the converter does; the key is named in a note, and the model equals the file without it."""
    def foreign(w):
        w.add_float32("gemma2.attn_logit_softcapping", 50.0)
    hf_dir, path, _ = _twin(tmp_path, "F32", SMALL, kv=foreign)
    convert_hf(hf_dir, tmp_path / "hf.oinf")
    summary = convert_gguf(path, tmp_path / "gguf.oinf")
    _same_model(tmp_path / "hf.oinf", tmp_path / "gguf.oinf")
    assert [n for n in summary.notes if "another architecture" in n] == [
        f"{path}: 1 metadata key(s) of another architecture than this file's llama are not read: "
        "gemma2.attn_logit_softcapping"]


@pytest.mark.parametrize("name,hint", [("Llama", " (did you mean llama?)"), ("qwen-2", " (did you mean qwen2?)"),
                                       ("llama4", ""), ("gemma", ""), ("mamba", ""), ("bert", "")])
def test_a_near_miss_architecture_gets_a_suggestion(name, hint):
    """`general.architecture` close to a supported one gets "did you mean" (as convert-hf's
    model_type does); another of llama.cpp's own architectures (llama4, gemma, mamba: other
    models) does not."""
    with pytest.raises(OiError) as e:
        gguf_config({"general.architecture": name}, {}, "f.gguf")
    assert str(e.value) == (f"error: f.gguf: metadata general.architecture is {name!r}{hint}: supported GGUF "
                            f"architectures are {', '.join(ARCHITECTURES)}")


def test_a_near_miss_tokenizer_model_gets_a_suggestion(tmp_path, capsys):
    from oi2jax.model.tokenizer import gguf_tokenizer_unsupported
    assert gguf_tokenizer_unsupported({"tokenizer.ggml.model": "GPT2"}) == (
        "metadata tokenizer.ggml.model is 'GPT2' (did you mean gpt2?): supported GGUF tokenizer models are gpt2, llama")
    assert gguf_tokenizer_unsupported({"tokenizer.ggml.model": "t5"}) == (
        "metadata tokenizer.ggml.model is 't5': supported GGUF tokenizer models are gpt2, llama")
    _, path, _ = _twin(tmp_path, "F32", SMALL, kv=lambda w: w.add_tokenizer_model("Llama"))
    code, _, err = run_cli(capsys, "convert-gguf", path, "-o", tmp_path / "m.oinf", "--quiet")
    assert code == 0 and f"note: {path}: no tokenizer.json stored: metadata tokenizer.ggml.model is 'Llama' (did you " \
                          f"mean llama?): supported GGUF tokenizer models are gpt2, llama" in err, err


@pytest.mark.parametrize("value", [["llama"], 5])
def test_an_architecture_of_another_type_is_an_error_naming_the_key(value):
    """`general.architecture` stored as an array of strings was an internal error (TypeError:
    unhashable type: 'list')."""
    with pytest.raises(OiError) as e:
        gguf_config({"general.architecture": value}, {}, "f.gguf")
    assert str(e.value) == f"error: f.gguf: metadata general.architecture must be a string, got {value!r}"


def test_a_gguf_that_is_not_a_regular_file_is_refused(tmp_path):
    """A FIFO given as the GGUF file blocked convert-gguf forever (its open() waits for a writer);
    the .oinf reader already refused one."""
    import os
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(OiError, match=r"pipe.gguf: the GGUF file: not a regular file \(a FIFO\)"):
        convert_gguf(fifo, tmp_path / "m.oinf")
    assert not (tmp_path / "m.oinf").exists()


def test_missing_layers_name_the_gguf_file(tmp_path):
    """A block_count larger than the file's layers named the directory holding the file
    (`error: .: missing tensor ...`), and a shape the metadata contradicts said `from config.json`."""
    _, path, _ = _twin(tmp_path, "F32", SMALL, kv=lambda w: w.add_uint32("llama.vocab_size", 100))
    with pytest.raises(OiError, match=rf"^error: {path}: tensor model.embed_tokens.weight \(GGUF token_embd.weight\) "
                                      r"has shape \[64, 32\], "
                                      r"expected \[100, 32\] \(vocab_size, hidden_size\) from its metadata$"):
        convert_gguf(path, tmp_path / "m.oinf")
    _, path, _ = _twin(tmp_path, "F32", SMALL, seed=1, edit=lambda w: [w.pop(k) for k in list(w) if k.startswith("blk.1.")])
    with pytest.raises(OiError, match=rf"^error: {path}: missing tensor model.layers.1.input_layernorm.weight and "
                                      r"8 more$"):
        convert_gguf(path, tmp_path / "m.oinf")


def test_a_big_endian_gguf_says_so(tmp_path):
    """A big-endian GGUF (llama.cpp's converter writes one with --bigendian) was reported as
    `GGUF version 50331648 is not supported`."""
    path = tmp_path / "be.gguf"
    w = gguf.GGUFWriter(str(path), "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(OiError, match=rf"^error: {path}: a big-endian GGUF file \(version 3, its bytes swapped\): "
                                      r"only little-endian GGUF files are supported$"):
        convert_gguf(path, tmp_path / "m.oinf")


@pytest.mark.parametrize("kind", ["Q2_K", "Q3_K"])
def test_kept_types_without_kernels_run_compiled_as_their_values(tmp_path, kind):
    """Q2_K and Q3_K are kept as blocks by convert-gguf (a Q3_K_M file's bulk), but no packed kernel
    reads them: a compiled program failed at load ('ggml type 'Q2_K' has no quantized kernels').
    It now places their exact f32 values (gguf.quants.dequantize): the f32 conversion's logits."""
    _, path, _ = _twin(tmp_path, kind, {**WIDE, "layers": 2}, tied=True)  # (layers stacked or one by one)
    convert_gguf(path, tmp_path / "kept.oinf")
    convert_gguf(path, tmp_path / "f32.oinf", dtype="f32")
    assert open_model(tmp_path / "kept.oinf").tensors["model.layers.0.mlp.up_proj.weight"].ggml == kind
    from oi2jax import quantized
    from oi2jax.model.ggml import BLOCK_TYPES, UNPACKED_TYPES
    assert set(BLOCK_TYPES) - set(UNPACKED_TYPES) == set(quantized.KINDS) and not quantized.has_kernels(kind)
    from oi2jax.model.inspect import render_model
    assert (f"ggml {kind} blocks of f32[256, 256] (placed as f32 values when compiled: no packed kernel)"
            in render_model(open_model(tmp_path / "kept.oinf")))
    tokens = np.array([3, 1, 4, 1, 5], np.int32) % WIDE["vocab"]
    logits = []
    for model, unroll in (("kept.oinf", "none"), ("kept.oinf", "full"), ("f32.oinf", "none")):
        sess = oi2jax.compile(EXAMPLES / "llama_decode.oi", model=tmp_path / model, ops=["nn"],
                              unroll=unroll).session()
        steps = []
        for tok in tokens:
            sess.step(token=np.int32(tok))
            steps.append(np.asarray(sess.read("logits")))
        logits.append(np.stack(steps))
    assert np.abs(logits[2]).max() > 0
    np.testing.assert_array_equal(logits[0], logits[2])
    np.testing.assert_array_equal(logits[1], logits[2])


def test_a_part_of_a_split_gguf_says_so(tmp_path, capsys):
    """The first part of a llama-gguf-split model (split.count 2) was converted as if whole: its
    missing layers were an error naming tensors (`missing tensor model.layers.1...`), never the
    split; a split.count of 1 is a whole model."""
    _, path, _ = _twin(tmp_path, "F32", SMALL, kv=lambda w: (w.add_uint16("split.no", 0), w.add_uint16("split.count", 2)))
    out = tmp_path / "m.oinf"
    code, _, err = run_cli(capsys, "convert-gguf", path, "-o", out)
    assert code == 1 and not out.exists()
    assert err == (f"error: {path}: metadata split.count is 2: this file is part 1 of 2 of a split GGUF model; merge "
                   f"the parts into one file first (llama-gguf-split --merge FIRST_PART.gguf OUT.gguf)\n")
    _, whole, _ = _twin(tmp_path, "F32", SMALL, seed=1, kv=lambda w: (w.add_uint16("split.no", 0), w.add_uint16("split.count", 1)))
    assert convert_gguf(whole, out).path == str(out) and out.exists()


def test_a_nonfinite_block_scale_is_noted_without_numpy_warnings(tmp_path, capsys):
    """A Q8_0 block whose f16 scale is inf, dequantized (--dtype f32): the converter's note names the
    tensor; gguf.quants' NumPy 'RuntimeWarning: invalid value encountered in multiply' (inf * 0)
    went to stderr as well."""
    def poison(written):
        written["output.weight"][0, 0:2] = np.array([np.inf], np.float16).view(np.uint8)
        written["output.weight"][0, 2] = 0  # inf * 0: a NaN
    import warnings
    _, path, _ = _twin(tmp_path, "Q8_0", SMALL, edit=poison)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # (as printed on stderr outside pytest)
        code, _, err = run_cli(capsys, "convert-gguf", path, "-o", tmp_path / "m.oinf", "--dtype", "f32")
    assert code == 0 and "RuntimeWarning" not in err
    assert f"note: {path}: tensor lm_head.weight (GGUF output.weight) holds 1 NaN and 31 infinite value(s)" in err


@pytest.mark.parametrize("kind, offset", [("Q8_0", 0), ("Q4_1", 2), ("Q4_K", 2), ("Q6_K", 208)])
def test_kept_blocks_with_a_nonfinite_scale_are_noted_or_refused(tmp_path, capsys, kind, offset):
    """(gguf probe) Kept blocks (no --dtype) were stored unread: a block scale of inf gave NaN/Inf
    weights with no note, and `--nonfinite error` did not refuse them. The counts are those of
    gguf.quants.dequantize over the whole tensor."""
    def poison(written):
        written["output.weight"][1, offset:offset + 2] = np.array([np.inf], np.float16).view(np.uint8)
    _, path, written = _twin(tmp_path, kind, WIDE if kind in KQUANTS else SMALL, edit=poison)
    with np.errstate(all="ignore"):
        values = quants.dequantize(written["output.weight"], T[kind])
    nan, inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
    assert nan + inf > 0
    code, _, err = run_cli(capsys, "convert-gguf", path, "-o", tmp_path / "m.oinf")
    assert code == 0
    assert f"note: {path}: tensor lm_head.weight (GGUF output.weight) holds {nan} NaN and {inf} infinite value(s)" in err
    code, _, err = run_cli(capsys, "convert-gguf", path, "-o", tmp_path / "n.oinf", "--nonfinite", "error")
    assert code == 1 and "(refused: --nonfinite error)" in err and not (tmp_path / "n.oinf").exists()


@pytest.mark.parametrize("kind", LEGACY + KQUANTS)
def test_nonfinite_counts_read_the_scales_as_gguf_quants_dequantizes(kind):
    """ggml.nonfinite_counts: the NaN and Inf counts of a full gguf.quants.dequantize, for blocks
    whose scales are finite, inf or NaN (one of each field, one block each)."""
    from oi2jax.model.ggml import nonfinite_counts
    rng = np.random.default_rng(4)
    block, size = gguf.GGML_QUANT_SIZES[T[kind]]
    offsets = _K_SCALES.get(kind, (0, 2) if kind in ("Q4_1", "Q5_1") else (0,))
    raw = rng.integers(0, 256, (6, size), dtype=np.uint8)
    for at in offsets:
        raw[:, at:at + 2] = np.full(6, 1e-3, np.float16).view(np.uint8).reshape(6, 2)
    assert nonfinite_counts(kind, raw) == (0, 0)
    for row, (at, bad) in enumerate(zip(offsets * 2, (np.inf, np.nan, -np.inf, np.nan))):
        raw[row + 1, at:at + 2] = np.array([bad], np.float16).view(np.uint8)
    with np.errstate(all="ignore"):
        values = quants.dequantize(raw, T[kind])
    assert nonfinite_counts(kind, raw) == (int(np.isnan(values).sum()), int(np.isinf(values).sum())) != (0, 0)
