"""The tokenizer in the model file (issue #39 item 4): a project-trained byte-level BPE stored by
convert-hf (its tokenizer.json) and by convert-gguf (rebuilt from tokenizer.ggml.*) reads back
encoding the same ids; the chat template renders as jinja2 renders it, with transformers' globals;
`oi2jax inspect` summarises the entries; a model without them runs."""
from __future__ import annotations

import json

import jinja2
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import oi2jax
from oi2jax.diagnostics import OiError
from oi2jax.model import open_model
from oi2jax.model.convert import convert_hf
from oi2jax.model.gguf import convert_gguf
from oi2jax.model.tokenizer import META, encode_prompt, gguf_tokenizer_json, render_chat

from conftest import EXAMPLES, run_cli
from test_gguf import SMALL, _twin

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{ bos_token if loop.first }}<|im_start|>{{ message['role'] }}\n"
          "{{ message['content'] }}<|im_end|>\n{% endfor %}\n"
          "{% if add_generation_prompt %}\n  <|im_start|>assistant\n{% endif %}")
TEXTS = ["hello world, the quick brown fox", "héllo wörld 12345 ünïcode ✓", "<|im_start|>user\nhi<|im_end|>\n",
         "  spaces\tand\nnewlines  ", ""]


@pytest.fixture(scope="module")
def bpe():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, the quick brown fox jumps over the lazy dog"] * 50
                            + ["héllo wörld 12345 tokens merge merge"], trainer)
    return tok


@pytest.fixture(scope="module")
def converted(bpe, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tok")
    data = json.loads(bpe.to_str())
    vocab = bpe.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]

    def kv(w):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt2")
        w.add_token_list(tokens)
        w.add_token_merges(merges)
        w.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
        w.add_bos_token_id(vocab["<|endoftext|>"])
        w.add_eos_token_id(vocab["<|im_end|>"])
        w.add_chat_template(CHATML)
    hf_dir, path, _ = _twin(tmp, "F32", SMALL, kv=kv)
    config = json.loads((hf_dir / "config.json").read_text())  # the model's ids, as the tokenizer's
    config.update(bos_token_id=vocab["<|endoftext|>"], eos_token_id=vocab["<|im_end|>"])
    (hf_dir / "config.json").write_text(json.dumps(config))
    (hf_dir / "tokenizer.json").write_text(bpe.to_str())
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHATML, "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}))
    (hf_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [vocab["<|im_end|>"], 0]}))
    convert_hf(hf_dir, tmp / "hf.oinf")
    convert_gguf(path, tmp / "gguf.oinf")
    return {"hf": open_model(tmp / "hf.oinf"), "gguf": open_model(tmp / "gguf.oinf"), "vocab": vocab, "tmp": tmp}


@pytest.mark.parametrize("which", ["hf", "gguf"])
def test_stored_tokenizer_encodes_as_the_trained_one(bpe, converted, which):
    m = converted[which]
    back = Tokenizer.from_str(m.metadata[META["tokenizer"]].value)
    for text in TEXTS:
        assert back.encode(text).ids == bpe.encode(text).ids, text
        assert back.decode(back.encode(text).ids, skip_special_tokens=False) == text
    assert m.metadata[META["chat_template"]].value == CHATML
    vocab = converted["vocab"]
    assert int(m.metadata[META["bos"]].value) == vocab["<|endoftext|>"]
    assert int(m.metadata[META["eos"]].value) == vocab["<|im_end|>"]
    stop = {"hf": [vocab["<|im_end|>"], 0], "gguf": [vocab["<|im_end|>"]]}[which]  # generation_config's list
    assert m.metadata[META["stop"]].value.tolist() == stop
    assert m.metadata[META["graph"]].value == "examples/llama_decode.oi"


def test_inspect_summarises_the_tokenizer(converted, capsys):
    code, stdout, _ = run_cli(capsys, "inspect", converted["tmp"] / "gguf.oinf")
    assert code == 0
    assert "tokenizer: BPE, 322 tokens (" in stdout  # 319 in the model's vocab + its 3 added tokens
    assert f"chat template: {len(CHATML)} characters" in stdout
    assert "special ids: bos 0; eos 2; stop 2" in stdout and "example graph: examples/llama_decode.oi" in stdout


def test_a_model_with_the_entries_still_runs(converted):
    out = oi2jax.compile(EXAMPLES / "llama_decode.oi", model=converted["gguf"].path, ops=["nn"]).run(
        {"token": np.int32(3)})
    assert out["logits"].shape == (SMALL["vocab"],)


def test_chat_template_renders_as_jinja2_does():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1 < 2 & \"x\""}]
    for gen in (False, True):
        want = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(CHATML).render(
            messages=messages, add_generation_prompt=gen, bos_token="<s>", eos_token="</s>")
        assert render_chat(CHATML, messages, add_generation_prompt=gen, bos_token="<s>", eos_token="</s>") == want
    assert render_chat(CHATML, messages, add_generation_prompt=True).endswith("<|im_start|>assistant\n")


def test_chat_template_globals_are_transformers():
    # tojson: json.dumps (no HTML escaping, key order kept); raise_exception; strftime_now; a sandbox
    assert render_chat("{{ messages | tojson }}", [{"b": "<&>", "a": 1}]) == '[{"b": "<&>", "a": 1}]'
    assert render_chat("{{ x | tojson(indent=2) }}", [], x={"k": [1]}) == json.dumps({"k": [1]}, indent=2)
    with pytest.raises(OiError, match="chat template: roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", [])
    assert len(render_chat("{{ strftime_now('%Y') }}", [])) == 4
    with pytest.raises(OiError, match="chat template: .*unsafe|chat template: .*immutable"):
        render_chat("{{ messages.append(1) }}", [])


def test_never_a_second_bos(bpe):
    tok = Tokenizer.from_str(bpe.to_str())
    bos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A",
                                                       special_tokens=[("<|endoftext|>", bos)])
    text = render_chat(CHATML, [{"role": "user", "content": "hi"}], bos_token="<|endoftext|>")
    ids = encode_prompt(tok, text, bos)
    assert ids[0] == bos and ids[1] != bos and ids == tok.encode(text).ids[1:]
    assert encode_prompt(tok, "hi", bos) == tok.encode("hi").ids  # a text without one gets the tokenizer's


@pytest.mark.parametrize("fields, message", [
    ({"tokenizer.ggml.model": "llama"}, r"tokenizer.ggml.model is 'llama': supported GGUF tokenizer models are gpt2"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2"},
     r"tokenizer.ggml.pre is 'qwen2': supported pre-tokenizers are default, gpt2"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": ["ab"]},
     r"tokenizer.ggml.merges: 'ab' is not two tokens"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "a"]}, r"tokenizer.ggml.tokens holds a token twice"),
])
def test_unsupported_gguf_tokenizers_are_named(fields, message):
    with pytest.raises(OiError, match=f"f.gguf: metadata {message}"):
        gguf_tokenizer_json(fields, "f.gguf")
