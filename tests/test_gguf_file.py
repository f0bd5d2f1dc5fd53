"""examples/gguf_file.py: a GGUF written offline from examples/llama_checkpoint.py's checkpoint
with a tokenizer converts (`convert-gguf`) to what `convert-hf` makes of the same checkpoint, and
chats the same: the F32 file's model equals the checkpoint's f32 conversion tensor for tensor; a
Q8_0 file, kept as blocks, generates (`oi2jax generate --chat`) the greedy ids and text of the
convert-hf conversion of the checkpoint holding gguf.quants' dequantized values; Q4_K blocks load
as gguf.quants.dequantize of the blocks written."""
from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest
from gguf import GGUFReader, quants
from gguf.constants import GGMLQuantizationType as T
from tokenizers import Tokenizer

from oi2jax.generation import Generator
from oi2jax.model import open_model
from oi2jax.model.convert import convert_hf
from oi2jax.model.gguf import convert_gguf, reverse_permute
from oi2jax.model.tokenizer import META

from conftest import EXAMPLES, run_cli

sys.path.insert(0, str(EXAMPLES))
import gguf_file  # noqa: E402
import llama_checkpoint  # noqa: E402

SIZES = dict(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, max_positions=48)
PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gguf_file")
    return tmp, llama_checkpoint.write_random_llama(tmp / "ck", tokenizer=True, std=0.3, seed=5, **SIZES)


def _tokenizer_meta(path):
    m = open_model(path)
    return {k: m.metadata[META[k]].value for k in ("chat_template", "bos", "eos")} | {
        "stop": np.ravel(m.metadata[META["stop"]].value).tolist()}


def test_checkpoint_tokenizer_decodes_every_id(ck):
    _, directory = ck
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    assert sorted(vocab.values()) == list(range(llama_checkpoint.TOKENIZER_VOCAB))  # exactly the model's V
    assert [tok.id_to_token(i) for i in range(3)] == list(llama_checkpoint.SPECIAL_TOKENS)
    assert all(tok.decode([i]) for i in range(3, len(vocab)))  # every other id is text (bytes or merges)
    text = "Any text at all: ÿ €, 日本, \t tabs\n"
    assert tok.decode(tok.encode(text).ids) == text  # byte-level: nothing is unknown


def test_f32_file_is_the_checkpoint(ck):
    tmp, directory = ck
    gguf_file.write_gguf(directory, tmp / "f32.gguf", "F32")
    convert_hf(directory, tmp / "hf.oinf", dtype="f32")
    convert_gguf(tmp / "f32.gguf", tmp / "gguf.oinf")
    a, b = open_model(tmp / "hf.oinf"), open_model(tmp / "gguf.oinf")
    assert dict(a.sizevars) == dict(b.sizevars) and sorted(a.tensors) == sorted(b.tensors)
    for name in a.tensors:
        assert a.load(name).tobytes() == b.load(name).tobytes(), name
    hf, gg = _tokenizer_meta(tmp / "hf.oinf"), _tokenizer_meta(tmp / "gguf.oinf")
    assert {k: v for k, v in hf.items() if k != "stop"} == {k: v for k, v in gg.items() if k != "stop"}
    # generation_config.json's EOS; the GGUF's as llama.cpp's end-of-generation set: its EOS, and id 0,
    # whose text <|endoftext|> is one of llama.cpp's end-of-generation texts (llama_vocab_is_eog: 0, 2)
    assert hf["stop"] == [2] and gg["stop"] == [2, 0]
    text = "<|im_start|>user\nWhat is the capital of France? Numbers: 12345, ünïcode.<|im_end|>\n"
    ids = [Tokenizer.from_str(m.metadata[META["tokenizer"]].value).encode(text).ids for m in (a, b)]
    assert ids[0] == ids[1] and ids[0][0] == 1 and max(ids[0]) >= 259  # specials and merges, as trained


def test_q8_0_file_chats_as_its_dequantized_checkpoint(ck, capsys):
    tmp, directory = ck
    gguf_file.write_gguf(directory, tmp / "q8.gguf", "Q8_0")
    convert_gguf(tmp / "q8.gguf", tmp / "q8.oinf")  # blocks kept
    assert open_model(tmp / "q8.oinf").ggml_type("model.layers.0.self_attn.q_proj.weight") == "Q8_0"
    # the same checkpoint with each 2-D weight replaced by its Q8_0 values, quantized here
    deq = tmp / "ck-q8"
    shutil.copytree(directory, deq)
    weights = {n: (quants.dequantize(quants.quantize(w, T.Q8_0), T.Q8_0) if w.ndim == 2 else w)
               for n, w in gguf_file.read_weights(directory).items()}
    config = llama_checkpoint.llama_config(vocab=llama_checkpoint.TOKENIZER_VOCAB, **SIZES)
    llama_checkpoint.write_checkpoint(deq, config, {n: np.asarray(w, np.float32) for n, w in weights.items()})
    convert_hf(deq, tmp / "hf-q8.oinf", dtype="f32")
    want = Generator(tmp / "hf-q8.oinf").generate(PROMPT, chat=True, max_tokens=10, ignore_eos=True)
    assert want.prompt_ids[0] == 1 and len(set(want.ids)) > 1  # <|im_start|>, then not one token repeated
    code, out, err = run_cli(capsys, "generate", tmp / "q8.oinf", "--chat", "--prompt", PROMPT, "--max-tokens", "10",
                             "--ignore-eos", "--ids-out", tmp / "ids.npy", "--stats")
    assert code == 0, err
    assert np.load(tmp / "ids.npy").tolist() == want.ids
    assert out == (want.text + "\n" if want.text else "")
    assert "generated 10 tokens" in err
    # the device holds the GGUF's blocks, no dequantized copy: its tensor bytes, plus the converter's
    # rope.inv_freq and two f32 scalars of the metadata (rms_norm_eps, attn_scale)
    file_bytes = sum(int(t.n_bytes) for t in GGUFReader(tmp / "q8.gguf").tensors)
    extra = open_model(tmp / "q8.oinf").tensors["rope.inv_freq"].nbytes + 2 * 4
    assert Generator(tmp / "q8.oinf").memory()["weights"] == file_bytes + extra


def test_q4_k_blocks_load_as_gguf_dequantizes_them(tmp_path):
    directory = llama_checkpoint.write_random_llama(tmp_path / "wide", vocab=8, hidden=256, layers=1, heads=2,
                                                    kv_heads=1, intermediate=256, max_positions=8)
    gguf_file.write_gguf(directory, tmp_path / "q4k.gguf", "Q4_K")
    convert_gguf(tmp_path / "q4k.gguf", tmp_path / "q4k.oinf")
    m, hf = open_model(tmp_path / "q4k.oinf"), gguf_file.read_weights(directory)
    for name in ("model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.down_proj.weight"):
        assert m.ggml_type(name) == "Q4_K"
        blocks = gguf_file.quantize_q4_k(gguf_file.permute(hf[name], 2, 1) if "k_proj" in name else hf[name])
        want = quants.dequantize(blocks, T.Q4_K)
        if "k_proj" in name:
            want = reverse_permute(want, 2, 1)
        assert m.load(name).tobytes() == np.asarray(want, np.float32).tobytes()
        assert np.abs(m.load(name) - hf[name]).max() < 0.25 * np.abs(hf[name]).max()  # a quantizer, not noise


def test_sizes_a_type_cannot_hold_are_refused(ck, capsys):
    tmp, directory = ck
    assert gguf_file.main([str(directory), str(tmp / "bad.gguf"), "--type", "Q4_K"]) == 1
    assert "needs a multiple of 256" in capsys.readouterr().err
    assert not (tmp / "bad.gguf").exists() and not (tmp / "bad.gguf.tmp").exists()
    with pytest.raises(ValueError, match="at least 260"):
        llama_checkpoint.write_random_llama(tmp / "small", vocab=64, tokenizer=True)
