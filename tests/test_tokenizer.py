"""The tokenizer in the model file (issue #39 item 4): a project-trained byte-level BPE stored by
convert-hf (its tokenizer.json) and by convert-gguf (rebuilt from tokenizer.ggml.*) reads back
encoding the same ids; the chat template renders as jinja2 renders it, with transformers' globals;
`oi2jax inspect` summarises the entries (tests/test_gguf.py runs a model holding them)."""
from __future__ import annotations

import json

import jinja2
import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from oi2jax.diagnostics import OiError
from oi2jax.model import open_model
from oi2jax.model.convert import convert_hf
from oi2jax.model.gguf import convert_gguf
from oi2jax.model.chat_template import render_chat
from oi2jax.model.tokenizer import META, encode_prompt, gguf_tokenizer_json, gguf_tokenizer_metadata, \
    hf_tokenizer_metadata, stored_special_ids

from conftest import run_cli
from test_gguf import SMALL, _twin

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{ bos_token if loop.first }}<|im_start|>{{ message['role'] }}\n"
          "{{ message['content'] }}<|im_end|>\n{% endfor %}\n"
          "{% if add_generation_prompt %}\n  <|im_start|>assistant\n{% endif %}")
TEXTS = ["hello world, the quick brown fox", "héllo wörld 12345 ünïcode ✓", "<|im_start|>user\nhi<|im_end|>\n",
         "  spaces\tand\nnewlines  ", "", "I'LL say it's 1234567\r\n\n\n  tabs\t\tend  "]


# the pre-tokenizers of the published tokenizer.json files each GGUF `tokenizer.ggml.pre` stands for
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")
PRE = {
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False)]),
    "llama-bpe": lambda: pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
                                                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
    "qwen2": lambda: pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2), behavior="isolated"),
                                              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
}
# llama.cpp's own names of these splits (`gpt-2` is the one its converter writes; `gpt2` it refuses)
PRE.update({"gpt-2": PRE["gpt2"], "deepseek-r1-qwen": PRE["qwen2"], "llama3": PRE["llama-bpe"]})


@pytest.fixture(scope="module", params=list(PRE))
def bpe(request):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = PRE[request.param]()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, the quick brown fox jumps over the lazy dog"] * 50
                            + ["héllo wörld 12345 tokens merge merge I'LL it's 2024\r\n\n  x"], trainer)
    if request.param in ("llama-bpe", "llama3"):  # Llama 3's tokenizer.json
        data = json.loads(tok.to_str())
        data["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(data))
    tok.pre = request.param
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
        w.add_tokenizer_pre(bpe.pre)
        w.add_token_list(tokens)
        w.add_token_merges(merges)
        w.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
        w.add_bos_token_id(vocab["<|endoftext|>"])
        w.add_eos_token_id(vocab["<|im_end|>"])
        w.add_add_bos_token(False)  # (as the trained tokenizer: absent, llama.cpp adds one for Llama 3's split)
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
    # generation_config's list; the GGUF's llama.cpp's end-of-generation set: its EOS, and <|endoftext|> by its text
    stop = [vocab["<|im_end|>"], 0]
    assert m.metadata[META["stop"]].value.tolist() == stop
    assert m.metadata[META["graph"]].value == "examples/llama_decode.oi"


def test_inspect_summarises_the_tokenizer(converted, capsys):
    code, stdout, _ = run_cli(capsys, "inspect", converted["tmp"] / "gguf.oinf")
    assert code == 0
    assert f"tokenizer: BPE, {len(converted['vocab'])} tokens (" in stdout
    assert f"chat template: {len(CHATML)} characters" in stdout
    assert "special ids: bos 0; eos 2; stop 2" in stdout and "example graph: examples/llama_decode.oi" in stdout


def test_chat_template_renders_as_jinja2_does():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1 < 2 & \"x\""}]
    for gen in (False, True):
        want = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(CHATML).render(
            messages=messages, add_generation_prompt=gen, bos_token="<s>", eos_token="</s>")
        assert render_chat(CHATML, messages, add_generation_prompt=gen, bos_token="<s>", eos_token="</s>") == want
    assert render_chat(CHATML, messages, add_generation_prompt=True).endswith("<|im_start|>assistant\n")


def test_the_generation_tag_renders_its_body_as_transformers_does():
    """transformers' AssistantTracker extension defines `{% generation %}...{% endgeneration %}`
    (templates mark the assistant's part with it); rendering a prompt, its body is output as it is.
    It was an error: "Encountered unknown tag 'generation'"."""
    tagged = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}"
              "{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}{% else %}{{ m['content'] }}"
              "<|im_end|>{% endif %}\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "bye"}]
    plain = tagged.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    want = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(plain).render(
        messages=messages, add_generation_prompt=True)
    assert "hello<|im_end|>" in want and want.endswith("<|im_start|>assistant\n")
    assert render_chat(tagged, messages, add_generation_prompt=True) == want
    assert render_chat("{% generation %}{% for i in range(3) %}{{ i }}{% endfor %}{% endgeneration %}", []) == "012"


def test_chat_template_globals_are_transformers():
    # tojson: json.dumps (no HTML escaping, key order kept); raise_exception; strftime_now; a sandbox
    assert render_chat("{{ messages | tojson }}", [{"b": "<&>", "a": 1}]) == '[{"b": "<&>", "a": 1}]'
    assert render_chat("{{ x | tojson(indent=2) }}", [], x={"k": [1]}) == json.dumps({"k": [1]}, indent=2)
    with pytest.raises(OiError, match="chat template: roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", [])
    assert len(render_chat("{{ strftime_now('%Y') }}", [])) == 4
    with pytest.raises(OiError, match="chat template: .*unsafe|chat template: .*immutable"):
        render_chat("{{ messages.append(1) }}", [])


@pytest.mark.parametrize("template, message", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "more than 1,000,000 items in one rendering \\(of ranges and repeated strings or lists\\)"),
    ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
     "more than 100,000 calls in one rendering"),
    ("{{ 'x' * 10000000000 }}", "a str of 1 times 10000000000"),
    ("{{ [0] * 10000000000 }}", "a list of 1 times 10000000000"),
    ("{{ 2 ** 100000000 }}", "2 \\*\\* 100000000"),
    ("{{ ((9 ** 4096) ** 4096) ** 4096 }}", "\\(an integer of 12985 bits\\) \\*\\* 4096"),
    ("{% for i in range(99999) %}{{ messages[0].content }}{% endfor %}", "more than 16,777,216 characters"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     "a str of more than 16,777,216 items"),
    ("{% set ns = namespace(n=9**4096) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
     "an argument of \\(an integer of 12985 bits\\)"),
    ("{{ 'x'|center(2000000000) }}", "an argument of 2000000000"),
    ("{{ '{:>2000000000}'.format('x') }}", "a format field of 10\\^6 characters or more"),
    ("{{ '%2000000000d' % 1 }}", "a format field of 10\\^6 characters or more"),
    ("{{ '%2000000000d'|format(1) }}", "a format field of 10\\^6 characters or more"),
    ("{% for i in [0] * 16000000 %}{% for j in [0] * 16000000 %}{% endfor %}{% endfor %}",
     "more than 1,000,000 items"),
    ("{% macro f(s, n) %}{% if n %}{{ f(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ f('x', 40) }}",
     "a str of more than 16,777,216 items"),
])
def test_a_chat_template_that_runs_away_is_an_error_not_a_hang(template, message):
    """A model file's template is bounded (RENDER_LIMITS): nested ranges and repeated lists, recursive
    macros, growing strings and integers, wide format fields and the output's size stop with an
    error, nothing larger than the limits made first (the review of 2026-11-28 found the ways
    around the first version: `~`, `+`, integer `*`, filters' widths, `%` and `.format`)."""
    messages = [{"role": "user", "content": "x" * 1000}]
    with pytest.raises(OiError, match="chat template: it runs away: " + message):
        render_chat(template, messages)


def test_a_long_chat_stays_within_the_render_limits():
    messages = [{"role": ("user", "assistant")[i % 2], "content": f"message {i} " * 20} for i in range(2000)]
    want = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(CHATML).render(
        messages=messages, add_generation_prompt=True, bos_token="", eos_token="")
    assert render_chat(CHATML, messages, add_generation_prompt=True) == want


@pytest.mark.parametrize("config_template,jinja,want", [
    ("FROM_CONFIG", "FROM_JINJA", "FROM_JINJA"),  # both: the file wins (the config's was stored)
    ([{"name": "default", "template": "FROM_CONFIG"}], "FROM_JINJA", "FROM_JINJA"),
    ("FROM_CONFIG", None, "FROM_CONFIG"),
    (None, "FROM_JINJA", "FROM_JINJA"),
])
def test_a_standalone_chat_template_file_takes_priority(tmp_path, config_template, jinja, want):
    """transformers' rule (PreTrainedTokenizerBase._from_pretrained): a chat_template.jinja overrides
    tokenizer_config.json's chat_template; fine-tunes often edit the .jinja alone."""
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {} if config_template is None else {"chat_template": config_template}))
    if jinja is not None:
        (tmp_path / "chat_template.jinja").write_text(jinja)
    assert hf_tokenizer_metadata(tmp_path, {})[META["chat_template"]] == want


def test_an_unreadable_chat_template_file_is_named(tmp_path):
    (tmp_path / "chat_template.jinja").write_bytes(b"{{ bos_token }}\xff")
    with pytest.raises(OiError, match=r"chat_template.jinja: cannot read the chat template: 'utf-8' codec"):
        hf_tokenizer_metadata(tmp_path, {})


def test_the_special_tokens_map_is_stored_as_tokenizer_config_names_them(tmp_path):
    """transformers passes `special_tokens_map` to a template: tokenizer_config.json's bos, eos,
    unk, sep, pad, cls, mask tokens (a string or an AddedToken's content) and its
    additional_special_tokens; only bos_token and eos_token reached it, by their ids' texts."""
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}, "unk_token": "<unk>",
        "pad_token": None, "mask_token": {"content": "<mask>"}, "additional_special_tokens": ["<a>", {"content": "<b>"}]}))
    entries = hf_tokenizer_metadata(tmp_path, {})
    assert json.loads(entries[META["special"]]) == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                                    "mask_token": "<mask>", "additional_special_tokens": ["<a>", "<b>"]}
    for bad, key in (({"unk_token": 3}, "unk_token"), ({"additional_special_tokens": "<a>"}, "additional_special_tokens"),
                     ({"additional_special_tokens": ["<a>", 5]}, r"additional_special_tokens\[1\]")):
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(bad))
        with pytest.raises(OiError, match=f"tokenizer_config.json: {key}: expected "):
            hf_tokenizer_metadata(tmp_path, {})
    fields = {**GPT2, "tokenizer.ggml.tokens": ["<s>", "</s>", "<unk>", "x"], "tokenizer.ggml.merges": [],
              "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1,
              "tokenizer.ggml.unknown_token_id": 2, "tokenizer.ggml.padding_token_id": 1}
    entries, _ = gguf_tokenizer_metadata(fields, "f.gguf")  # a GGUF: the tokens of its special ids
    assert json.loads(entries[META["special"]]) == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                                    "pad_token": "</s>"}
    with pytest.raises(OiError, match=r"f.gguf: metadata tokenizer.ggml.padding_token_id 9 is not a token of the "
                                      r"vocabulary \(0..3\)"):
        gguf_tokenizer_metadata({**fields, "tokenizer.ggml.padding_token_id": 9}, "f.gguf")


def test_never_a_second_bos(bpe):
    tok = Tokenizer.from_str(bpe.to_str())
    bos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A",
                                                       special_tokens=[("<|endoftext|>", bos)])
    text = render_chat(CHATML, [{"role": "user", "content": "hi"}], bos_token="<|endoftext|>")
    ids = encode_prompt(tok, text, bos)
    assert ids[0] == bos and ids[1] != bos and ids == tok.encode(text).ids[1:]
    assert encode_prompt(tok, "hi", bos) == tok.encode("hi").ids  # a text without one gets the tokenizer's


def test_a_rendered_chat_is_encoded_without_the_post_processors_tokens(bpe):
    """A chat is encoded as transformers' apply_chat_template(tokenize=True) does: with
    add_special_tokens=False, the template alone deciding BOS and EOS. A post-processor that adds
    an EOS (a GGUF's add_eos_token) put one after the generation prompt, before the model wrote
    anything; one that adds a BOS put one before a template that writes none."""
    tok = Tokenizer.from_str(bpe.to_str())
    bos, eos = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A <|im_end|>",
                                                       special_tokens=[("<|endoftext|>", bos), ("<|im_end|>", eos)])
    text = render_chat(CHATML, [{"role": "user", "content": "hi"}], add_generation_prompt=True)  # no bos_token
    assert text == "<|im_start|>user\nhi<|im_end|>\n  <|im_start|>assistant\n"
    plain = Tokenizer.from_str(bpe.to_str())  # the same model without a post-processor
    ids = encode_prompt(tok, text, bos, chat=True)
    assert ids == plain.encode(text).ids and ids[0] == tok.token_to_id("<|im_start|>") and ids[-1] != eos
    assert encode_prompt(tok, "hi", bos) == [bos, *plain.encode("hi").ids, eos]  # a plain prompt: as before


GPT2 = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt2"}


@pytest.mark.parametrize("fields, message", [
    ({"tokenizer.ggml.model": "bert"}, r"tokenizer.ggml.model is 'bert': supported GGUF tokenizer models are gpt2, "
                                       r"llama"),
    ({"tokenizer.ggml.model": "gpt2"}, r"tokenizer.ggml.pre is missing \(llama.cpp then uses its 'default' "
                                       r"pre-tokenizer\): supported pre-tokenizers are gpt-2, smollm, "
                                       r"starcoder, refact, codeshell, llama-bpe, qwen2"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default"},
     r"tokenizer.ggml.pre is 'default': supported pre-tokenizers are gpt-2"),
    ({**GPT2, "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": ["ab"]},
     r"tokenizer.ggml.merges: 'ab' is not two tokens"),
    ({**GPT2, "tokenizer.ggml.tokens": ["a", "a"]}, r"tokenizer.ggml.tokens holds a token twice"),
])
def test_unsupported_gguf_tokenizers_are_named(fields, message):
    with pytest.raises(OiError, match=f"f.gguf: metadata {message}"):
        gguf_tokenizer_json(fields, "f.gguf")
    if "tokens" not in message and "merges" not in message:  # an unsupported one: left out, with a note
        entries, notes = gguf_tokenizer_metadata({**fields, "tokenizer.ggml.bos_token_id": 1}, "f.gguf")
        assert META["tokenizer"] not in entries and int(entries[META["bos"]]) == 1
        assert len(notes) == 1 and "f.gguf: no tokenizer.json stored: metadata " in notes[0]
    else:  # a damaged one: an error
        with pytest.raises(OiError, match=f"f.gguf: metadata {message}"):
            gguf_tokenizer_metadata(fields, "f.gguf")


@pytest.mark.parametrize("key,value,message", [
    ("tokenizer.ggml.eos_token_id", "2", "expected a token id (a whole number >= 0), got '2' (a string)"),
    ("tokenizer.ggml.eos_token_id", 2.0, "expected a token id (a whole number >= 0), got 2.0 (a number with a "
                                         "fraction)"),
    ("tokenizer.ggml.bos_token_id", True, "expected a token id (a whole number >= 0), got True (a boolean)"),
    ("tokenizer.ggml.eot_token_id", -1, "expected a token id (a whole number >= 0), got -1"),
    ("tokenizer.ggml.add_bos_token", "false", "expected true or false, got 'false' (a string)"),
    ("tokenizer.ggml.add_eos_token", 1, "expected true or false, got 1 (int)"),
    ("tokenizer.ggml.add_space_prefix", "no", "expected true or false, got 'no' (a string)"),
    ("tokenizer.chat_template", 7, "expected the template's text (a string), got 7 (int)"),
])
def test_wrong_typed_gguf_tokenizer_entries_are_errors_naming_the_key(key, value, message):
    """An EOS id stored as a string or a float was dropped (no stop id: generate ran to its token
    budget), `add_bos_token: "false"` read as true (a BOS added), a chat template of another type
    stored as it was (`generate --chat`: 'no chat template'): each now an error naming file and key."""
    fields = {**GPT2, "tokenizer.ggml.tokens": ["a", "b", "c"], "tokenizer.ggml.merges": [],
              "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 2, key: value}
    for read in (gguf_tokenizer_metadata, gguf_tokenizer_json):
        with pytest.raises(OiError) as e:
            read(fields, "f.gguf")
        assert str(e.value) == f"error: f.gguf: metadata {key}: {message}"
    valid = {"tokenizer.chat_template": "x"}.get(key, False if ".add_" in key else 1)  # the same entry, well typed
    entries = gguf_tokenizer_metadata({**fields, key: valid}, "f.gguf")[0]
    assert int(entries[META["eos"]]) == (1 if key.endswith("eos_token_id") else 2)
    assert entries[META["stop"]].tolist() == [int(entries[META["eos"]])] + ([1] if key.endswith("eot_token_id") else [])
    assert Tokenizer.from_str(entries[META["tokenizer"]]).encode("ab").ids == [0, 1]  # no BOS added


def test_gguf_eom_id_is_a_stop_id():
    """llama.cpp ends a generation at EOS, EOT and EOM (`tokenizer.ggml.eom_token_id`, Llama 3.1's
    <|eom_id|> after a tool call); the EOM id was read by no one, and generate ran past it."""
    fields = {**GPT2, "tokenizer.ggml.tokens": ["a", "b", "c", "d"], "tokenizer.ggml.merges": [],
              "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.eot_token_id": 2, "tokenizer.ggml.eom_token_id": 3}
    entries = gguf_tokenizer_metadata(fields, "f.gguf")[0]
    assert entries[META["stop"]].tolist() == [1, 2, 3]
    entries = gguf_tokenizer_metadata({**fields, "tokenizer.ggml.eom_token_id": 1}, "f.gguf")[0]
    assert entries[META["stop"]].tolist() == [1, 2]  # once each


@pytest.mark.parametrize("key", ["tokenizer.ggml.model", "tokenizer.ggml.pre"])
def test_a_gguf_tokenizer_name_of_another_type_is_an_error_naming_the_key(key):
    """`tokenizer.ggml.pre` stored as an array of strings was an internal error (TypeError:
    unhashable type: 'list') of convert-gguf; `tokenizer.ggml.model` as one was taken for another
    tokenizer model and dropped with a note."""
    fields = {**GPT2, "tokenizer.ggml.tokens": ["a", "b", "c"], "tokenizer.ggml.merges": [], key: [GPT2[key]]}
    for read in (gguf_tokenizer_metadata, gguf_tokenizer_json):
        with pytest.raises(OiError) as e:
            read(fields, "f.gguf")
        assert str(e.value) == f"error: f.gguf: metadata {key}: expected a name (a string), got ['gpt2'] (an array)"


def test_stored_special_ids_are_token_ids_or_errors_naming_the_key(tmp_path):
    """A model file's tokenizer.bos_id / eos_id / stop_ids of another type (a string, a float, an array
    for one id) were an internal error of `generate` and `inspect` (int('abc')), or truncated
    (1.5 -> 1) and used; a negative id was used as it was."""
    meta = {META["bos"]: np.int32(1), META["eos"]: np.uint32(2), META["stop"]: np.array([2, 7], np.int32)}
    assert stored_special_ids(meta, "m.oinf") == (1, 2, [2, 7])
    assert stored_special_ids({}, "m.oinf") == (None, None, None)
    assert stored_special_ids({META["stop"]: np.int32(5)}, "m.oinf") == (None, None, [5])
    for key, value, shown in ((META["bos"], "abc", "'abc'"), (META["bos"], np.float32(1.5), "1.5"),
                              (META["eos"], np.int32(-3), "-3"), (META["eos"], np.array([1, 2], np.int32), "array"),
                              (META["bos"], np.bool_(True), "True"), (META["stop"], np.array([1.0, 2.0]), "array"),
                              (META["stop"], np.array([-1, 5], np.int32), "array"), (META["stop"], "x", "'x'")):
        with pytest.raises(OiError, match=rf"^error: m.oinf: metadata {key}: expected .* got {shown}"):
            stored_special_ids({key: value}, "m.oinf")
    from oi2jax.generation import Generator
    from oi2jax.model import Meta, save
    path = tmp_path / "m.oinf"
    save(path, metadata={META["bos"]: Meta("f32", np.float32(1.5))}, tensors={"w": np.zeros(1, np.float32)})
    with pytest.raises(OiError, match=r"m.oinf: metadata tokenizer.bos_id: expected a token id \(a whole number "
                                      r">= 0\), got 1.5$"):
        Generator(path)  # refused before anything compiles


def test_a_gguf_with_a_string_eos_id_is_refused_by_convert_gguf(tmp_path, capsys):
    def kv(w):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt2")
        w.add_token_list(["a", "b", "c"])
        w.add_token_merges([])
        w.add_string("tokenizer.ggml.eos_token_id", "2")
    _, path, _ = _twin(tmp_path, "F32", SMALL, kv=kv)
    code, out, err = run_cli(capsys, "convert-gguf", path, "-o", tmp_path / "m.oinf")
    assert (code, out, err) == (1, "", f"error: {path}: metadata tokenizer.ggml.eos_token_id: expected a token id "
                                       f"(a whole number >= 0), got '2' (a string)\n")
    assert not (tmp_path / "m.oinf").exists()


def test_add_bos_and_eos_token_become_the_post_processor(bpe):
    vocab = bpe.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.get)
    fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": bpe.pre, "tokenizer.ggml.tokens": tokens,
              "tokenizer.ggml.merges": [m if isinstance(m, str) else " ".join(m)
                                        for m in json.loads(bpe.to_str())["model"]["merges"]],
              "tokenizer.ggml.token_type": [3 if t in SPECIAL else 1 for t in tokens],
              "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 2,
              "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True}
    tok = Tokenizer.from_str(gguf_tokenizer_json(fields, "f.gguf"))
    assert tok.encode("hello").ids == [0, *bpe.encode("hello").ids, 2]
    with pytest.raises(OiError, match=r"add_eos_token is set but tokenizer.ggml.eos_token_id is None"):
        gguf_tokenizer_json({**fields, "tokenizer.ggml.eos_token_id": None}, "f.gguf")


# ------------------------------------------------------------------ SentencePiece (`llama`) GGUFs

SPM_CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, hello there", "tokens merge merge merged",
              "théâtre et café", "the other thing then"]


def _spm_vocab():
    """A SentencePiece-like vocabulary as llama.cpp's GGUF holds it: <unk> <s> </s>, the 256 byte
    pieces, single characters and frequent multi-character pieces (`▁` for spaces), each with a
    distinct score (higher: merged first)."""
    counts: dict[str, int] = {}
    for line in SPM_CORPUS:
        text = "\u2581" + line.replace(" ", "\u2581")
        for n in range(2, 7):
            for i in range(len(text) - n + 1):
                counts[text[i:i + n]] = counts.get(text[i:i + n], 0) + 1
    chars = sorted({c for line in SPM_CORPUS for c in "\u2581" + line.replace(" ", "\u2581")} - {"\u00e2"})
    pieces = [p for p, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:120] if "\u00e2" not in p]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + chars + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * (len(chars) + len(pieces))
    scores = [0.0] * 259 + [-1000.0 - i for i in range(len(chars))] + [-float(i) for i in range(len(pieces))]
    return tokens, types, scores


def _llama_cpp_spm(text: str, tokens, scores, special=("<s>", "</s>")) -> list[int]:
    """llama.cpp's llm_tokenizer_spm, written out: special tokens split first; each text fragment gets
    a leading space after a special token (or at the start), spaces become `▁`, then the adjacent
    pair whose concatenation is a piece with the highest score merges (ties: leftmost) until none
    does; a symbol that is no piece becomes its UTF-8 byte pieces."""
    ids = {t: i for i, t in enumerate(tokens)}
    score = dict(zip(tokens, scores))
    out, prev_special, rest = [], True, text
    while rest:
        at = min(((rest.find(s), s) for s in special if s in rest), default=(len(rest), None))
        if at[0] > 0:
            symbols = list(((" " if prev_special else "") + rest[:at[0]]).replace(" ", "\u2581"))
            while True:
                best = None
                for i in range(len(symbols) - 1):
                    merged = symbols[i] + symbols[i + 1]
                    if merged in ids and (best is None or score[merged] > best[0]):
                        best = (score[merged], i)
                if best is None:
                    break
                i = best[1]
                symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
            for sym in symbols:
                out += [ids[sym]] if sym in ids else [ids[f"<0x{b:02X}>"] for b in sym.encode()]
            prev_special = False
        if at[1] is None:
            break
        out.append(ids[at[1]])
        prev_special = True
        rest = rest[at[0] + len(at[1]):]
    return out


def test_sentencepiece_gguf_tokenizer_encodes_as_llama_cpp():
    tokens, types, scores = _spm_vocab()
    fields = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
              "tokenizer.ggml.scores": scores, "tokenizer.ggml.unknown_token_id": 0,
              "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
              "tokenizer.ggml.add_bos_token": False}  # (the split alone; absent, a BOS is added: below)
    tok = Tokenizer.from_str(gguf_tokenizer_json(fields, "f.gguf"))
    texts = [*SPM_CORPUS, "the brown dog merged  twice", "a théâtre ✓ 😀 fox", "<s>hello world</s>",
             "  leading spaces and the end ", "hello<s>the fox"]
    for text in texts:
        want = _llama_cpp_spm(text, tokens, scores)
        assert tok.encode(text).ids == want, text
        if "<s>" not in text:  # the prefix space is stripped again
            assert tok.decode(want) == text, text
    assert len(tok.encode("a théâtre ✓").ids) > len("a théâtre ✓")  # â and ✓: byte pieces
    with pytest.raises(OiError, match=r"f.gguf: metadata tokenizer.ggml.scores must hold one finite number per token"):
        gguf_tokenizer_json({**fields, "tokenizer.ggml.scores": scores[:-1]}, "f.gguf")


@pytest.mark.parametrize("add_bos, bos_id, first", [(None, 1, [1]), (True, 1, [1]), (False, 1, []), (None, None, [])])
def test_sentencepiece_gguf_adds_a_bos_unless_it_says_not_to(add_bos, bos_id, first):
    """llama.cpp (and transformers' LlamaTokenizerFast) add a BOS to a SentencePiece vocabulary's
    text when tokenizer.ggml.add_bos_token is absent, as GGUF files written before the key existed
    (Llama 2, TinyLlama) are; the rebuilt tokenizer added none, so their prompts ran without one."""
    tokens, types, scores = _spm_vocab()
    fields = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
              "tokenizer.ggml.scores": scores, "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.eos_token_id": 2}
    if bos_id is not None:
        fields["tokenizer.ggml.bos_token_id"] = bos_id
    if add_bos is not None:
        fields["tokenizer.ggml.add_bos_token"] = add_bos
    tok = Tokenizer.from_str(gguf_tokenizer_json(fields, "f.gguf"))
    text = "the quick fox merged"
    assert tok.encode(text).ids == [*first, *_llama_cpp_spm(text, tokens, scores)]
    assert 2 not in tok.encode(text).ids  # never an EOS by default


@pytest.mark.parametrize("pre, first", [("llama-bpe", [3]), ("llama3", [3]), ("gpt-2", []), ("qwen2", [])])
def test_llama3_split_adds_a_bos_unless_it_says_not_to(pre, first):
    """llama.cpp adds a BOS for Llama 3's split (its LLAMA3 pre-tokenizer type) when
    tokenizer.ggml.add_bos_token is absent, none for the other byte-level BPE splits."""
    fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
              "tokenizer.ggml.tokens": ["a", "b", "ab", "<|begin_of_text|>"], "tokenizer.ggml.merges": ["a b"],
              "tokenizer.ggml.token_type": [1, 1, 1, 3], "tokenizer.ggml.bos_token_id": 3}
    assert Tokenizer.from_str(gguf_tokenizer_json(fields, "f.gguf")).encode("ab").ids == [*first, 2]
    fields["tokenizer.ggml.add_bos_token"] = False
    assert Tokenizer.from_str(gguf_tokenizer_json(fields, "f.gguf")).encode("ab").ids == [2]


def test_sentencepiece_tokenizer_through_convert_gguf(tmp_path):
    tokens, types, scores = _spm_vocab()

    def kv(w):
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_scores(scores)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
    _, path, _ = _twin(tmp_path, "F32", SMALL, kv=kv)
    summary = convert_gguf(path, tmp_path / "m.oinf")
    m = open_model(summary.path)
    tok = Tokenizer.from_str(m.metadata[META["tokenizer"]].value)
    text = "the quick fox merged"
    assert tok.encode(text).ids == [1, *_llama_cpp_spm(text, tokens, scores)]  # add_bos_token: BOS first


def test_a_range_of_few_items_with_large_bounds_renders():
    """(helper probe) `range(0, 3000000, 1000000)` makes 3 items, counted as made: its bounds are
    no width, so the limit on wide arguments does not refuse it; a range of too many items still is."""
    messages = [{"role": "user", "content": "x"}]
    assert render_chat("{% for i in range(0, 3000000, 1000000) %}{{ i }},{% endfor %}", messages) == \
        "0,1000000,2000000,"
    assert render_chat("{{ range(10 ** 12, 10 ** 12 + 2) | list }}", messages) == "[1000000000000, 1000000000001]"
    with pytest.raises(OiError, match=r"chat template: it runs away: a range of 3,000,000 items \(one range holds at "
                                      r"most 100,000\)"):
        render_chat("{% for i in range(0, 3000000) %}{% endfor %}", messages)  # jinja2's sandbox's bound
    with pytest.raises(OiError, match=r"chat template: it runs away: a range of more than"):
        render_chat("{{ range(10 ** 30) | length }}", messages)


@pytest.mark.parametrize("extra, keys, want", [
    # the sets llama.cpp's llama_vocab_is_eog gives for these vocabularies (llama-cpp-python 0.3.36;
    # the vocabulary: <unk> <s> <x> a..t, then `extra` from id 23; EOS 2)
    (["<start_of_turn>", "<end_of_turn>", "<eos>"], {}, [2, 24, 25]),  # Gemma: the end of a turn
    (["<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"], {},
     [2, 24, 26, 27, 28]),  # Qwen 2.5: ChatML's end, and the FIM pad/repo/separator found by text
    (["<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"],
     {"tokenizer.ggml.fim_pad_token_id": 25}, [2, 25, 24, 27, 28]),  # a key's id, not its texts
    (["<|return|>", "<|call|>", "<|end|>"], {}, [2, 23, 24]),  # gpt-oss: <|end|> is no end there
    (["<|calls|>", "<|flush|>", "<|end|>"], {}, [2, 23, 24]),
    (["<|tool_response>", "</s>"], {}, [2, 23]),
])
def test_gguf_stop_ids_are_llama_cpps_end_of_generation_tokens(extra, keys, want):
    """(gguf probe) A GGUF stored EOS, EOT and EOM only: a Gemma or Phi-3 file, which names no EOT,
    ran past <end_of_turn> / <|end|> where llama.cpp stops (it ends at every token of its list of
    end-of-generation texts)."""
    from oi2jax.model.tokenizer import gguf_stop_ids
    tokens = ["<unk>", "<s>", "<x>"] + [chr(97 + i) for i in range(20)] + extra
    assert gguf_stop_ids({"tokenizer.ggml.eos_token_id": 2, **keys}, tokens) == want
