"""`oi2jax generate` / `oi2jax.generation`: text in and out with a converted model.

A random Llama checkpoint with a project-trained byte-level BPE, a chat template and stop ids
(tokenizer.json, tokenizer_config.json, generation_config.json beside it), converted with
convert-hf: greedy generation equals the NumPy Llama's greedy continuation token for token; a stop
id ends it with nothing after it; sampling is reproducible for a seed; a run past the cache's
capacity returns what it generated before the failing step; the CLI prints the text and the
`--stats` lines other tools read."""
from __future__ import annotations

import json
import re
import sys

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from oi2jax.diagnostics import OiError
from oi2jax.generation import Generator
from oi2jax.model import open_model
from oi2jax.model.convert import convert_hf

from conftest import EXAMPLES, run_cli
from llama_ref import LlamaRef

sys.path.insert(0, str(EXAMPLES))
import llama_checkpoint  # noqa: E402

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
VOCAB = 80


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gen")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, show_progress=False)
    tok.train_from_iterator(["hello world the quick brown fox jumps over the lazy dog, hi there"] * 20, trainer)
    vocab = tok.get_vocab(with_added_tokens=True)  # every id the model can draw decodes to text
    ck = llama_checkpoint.write_random_llama(tmp / "ck", vocab=len(vocab), hidden=32, layers=2, heads=4, kv_heads=2,
                                             intermediate=64, max_positions=40, seed=3, std=0.3)
    (ck / "tokenizer.json").write_text(tok.to_str())
    (ck / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHATML, "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>", "pad_token": None,
        "sep_token": {"content": "<|im_start|>", "special": True}, "additional_special_tokens": ["<|im_start|>"]}))
    (ck / "generation_config.json").write_text(json.dumps({"eos_token_id": [vocab["<|im_end|>"]]}))
    path = tmp / "m.oinf"
    convert_hf(ck, path)
    weights = load_file(str(ck / "model.safetensors"))
    config = json.loads((ck / "config.json").read_text())
    return {"path": path, "weights": weights, "config": config, "tok": tok, "vocab": vocab, "tmp": tmp}


@pytest.fixture(scope="module")
def gen(model):
    """The default: the model names llama_decode.oi; the step graph llama_prefill.oi beside it runs."""
    g = Generator(model["path"])
    assert g.mode == "prompt steps" and g.graph_path.endswith("llama_prefill.oi")
    return g


@pytest.fixture(scope="module")
def token_gen(model):
    """The token-by-token interface (llama_decode.oi): greedy through its `next`."""
    return Generator(model["path"], EXAMPLES / "llama_decode.oi")


@pytest.fixture
def shared_cli(model, gen, token_gen, monkeypatch):
    """The CLI's `Generator(...)` hands out the module's generators (their programs compiled once):
    `gen` for the model's default graph, `token_gen` for `--graph llama_decode.oi`; the arguments
    it was called with are recorded."""
    from oi2jax import generation
    made = []

    def shared(path, graph=None, **options):
        made.append((str(path), graph, options))
        assert str(path) == str(model["path"]) and options == {"tokenizer": None, "ops": ["nn"], "kernels": "jax", "kv_dtype": None}
        return gen if graph is None else {str(EXAMPLES / "llama_decode.oi"): token_gen}[str(graph)]
    monkeypatch.setattr(generation, "Generator", shared)
    return made


def greedy_reference(model, prompt_ids, n):
    ref = LlamaRef(model["weights"], model["config"])
    for t in prompt_ids[:-1]:
        ref.step(t)
    logits = ref.step(prompt_ids[-1])
    out = []
    for _ in range(n):
        t = int(np.argmax(logits))
        out.append(t)
        logits = ref.step(t)
    return out


def test_greedy_text_equals_the_numpy_llama(model, gen):
    pieces = []
    res = gen.generate("hello world", max_tokens=8, ignore_eos=True, on_text=pieces.append)
    want = greedy_reference(model, res.prompt_ids, 8)
    assert res.prompt_ids == model["tok"].encode("hello world").ids
    assert res.ids == want and res.finish == "length"
    assert res.text == model["tok"].decode(want, skip_special_tokens=True) == "".join(pieces)
    assert res.stats.prompt_tokens == len(res.prompt_ids) and res.stats.generated_tokens == 8


def test_the_decode_loop_compiled_ahead_is_the_one_the_run_takes(model, gen):
    """`compile_ahead`: the fused decode loop, compiled in a second thread while the prompt runs,
    is the executable the decode run then calls (JAX's cache of the jitted loop holds one entry,
    not two), once per loop length; the tokens are those of a generator compiling it in turn,
    and no compiling of that thread is taken from the prompt's or the decode's seconds. By
    default only where JAX's persistent cache is off (the tests' processes have one on)."""
    import jax

    from oi2jax.runtime import runstats
    assert jax.config.jax_compilation_cache_dir and gen.compile_ahead is None
    apart = runstats.apart_seconds()
    gen.generate(prompt_ids=[2, 6], max_tokens=5, ignore_eos=True)
    assert runstats.apart_seconds() == apart  # the default here: nothing compiled ahead
    ahead, plain = Generator(model["path"], compile_ahead=True), Generator(model["path"], compile_ahead=False)
    apart = runstats.apart_seconds()
    a = ahead.generate(prompt_ids=[3, 5, 7], max_tokens=6, ignore_eos=True)
    loop = ahead.greedy_programs[1].executable.kernels.multi_jit  # a greedy generation's programs
    assert runstats.apart_seconds() > apart and loop._cache_size() == 1
    assert a.ids == plain.generate(prompt_ids=[3, 5, 7], max_tokens=6, ignore_eos=True).ids
    assert a.ids == greedy_reference(model, [3, 5, 7], 6)
    assert a.stats.prompt_s > 0 and a.stats.generate_s > 0 and a.stats.compile_s > 0
    apart = runstats.apart_seconds()
    b = ahead.generate(prompt_ids=[9, 4], max_tokens=6, ignore_eos=True)  # the same loop: nothing ahead
    assert runstats.apart_seconds() == apart and loop._cache_size() == 1
    assert b.ids == greedy_reference(model, [9, 4], 6)


def test_a_generation_that_raises_leaves_no_compile_running(model):
    """The decode loop compiled ahead, in a daemon thread, is joined when the prompt step raises
    too: a thread still inside XLA when the interpreter exits aborts the process (`terminate
    called ...`, exit 134; seen from `oi2jax generate` with its XLA cache off)."""
    import threading
    ahead = Generator(model["path"], compile_ahead=True)
    ahead.prompt_step = lambda ids, **settings: (_ for _ in ()).throw(OiError("the prompt step failed"))
    with pytest.raises(OiError, match="the prompt step failed"):
        ahead.generate(prompt_ids=[3, 5], max_tokens=4, ignore_eos=True)
    assert not [t for t in threading.enumerate() if t.name == "oi2jax-compile-decode"]


def test_compiling_apart_is_not_counted_in_the_calling_threads_seconds():
    import threading

    import jax
    import jax.numpy as jnp

    from oi2jax.runtime import runstats
    before, apart = runstats.compile_seconds(), runstats.apart_seconds()

    def compile_apart():
        with runstats.apart():
            jax.jit(lambda v: jnp.sin(v) * 3.0 + 1.25).lower(np.ones(7, np.float32)).compile()
    thread = threading.Thread(target=compile_apart)
    thread.start()
    thread.join()
    assert runstats.compile_seconds() == before and runstats.apart_seconds() > apart


def test_a_stop_id_ends_the_generation_with_nothing_after_it(model, gen):
    ids = greedy_reference(model, [5, 6, 7], 10)
    stop = ids[4]
    first = ids.index(stop)
    res = gen.generate(prompt_ids=[5, 6, 7], max_tokens=10, stop_ids=[stop], ignore_eos=True)
    assert res.ids == ids[:first] and res.finish == "stop" and res.stop_id == stop


def test_chat_renders_the_template_and_sampling_is_reproducible(model, gen):
    ids = gen.prompt_ids("hi there", chat=True)
    text = "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    assert ids == model["tok"].encode(text).ids
    a = gen.generate("hi", chat=True, max_tokens=12, temperature=1.0, top_k=20, seed=1, ignore_eos=True)
    b = gen.generate("hi", chat=True, max_tokens=12, temperature=1.0, top_k=20, seed=1, ignore_eos=True)
    c = gen.generate("hi", chat=True, max_tokens=12, temperature=1.0, top_k=20, seed=2, ignore_eos=True)
    assert a.ids == b.ids and a.ids != c.ids


def test_a_chat_prompt_gets_no_special_tokens_the_template_did_not_write(model, gen, monkeypatch):
    """The model's tokenizer adds a BOS and an EOS around a text (a post-processor; a GGUF with
    add_bos_token / add_eos_token builds one): a chat prompt is the template's text alone (no EOS
    after `assistant\\n`, no BOS the template never wrote), a plain prompt keeps them."""
    tok = Tokenizer.from_str(model["tok"].to_str())
    bos, eos = model["vocab"]["<|endoftext|>"], model["vocab"]["<|im_end|>"]
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A <|im_end|>",
                                                       special_tokens=[("<|endoftext|>", bos), ("<|im_end|>", eos)])
    monkeypatch.setattr(gen, "tokenizer", tok)
    text = "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    assert gen.prompt_ids("hi there", chat=True) == model["tok"].encode(text).ids
    assert gen.prompt_ids("hi there") == [bos, *model["tok"].encode("hi there").ids, eos]


def test_a_chat_template_receives_every_special_token(model, gen, monkeypatch):
    """transformers renders a template with its special_tokens_map (tokenizer_config.json's bos,
    eos, unk, sep, pad, ... tokens and additional_special_tokens): they rendered as empty strings."""
    monkeypatch.setattr(gen, "chat_template", "{{ bos_token }}o{{ eos_token }}o{{ unk_token }}o{{ sep_token }}o"
                                              "{{ pad_token }}o{{ additional_special_tokens | join('e') }}o"
                                              "{{ messages[0]['content'] }}")  # (letters of the small vocabulary)
    ids = gen.prompt_ids("hi", chat=True)
    bos = model["tok"].id_to_token(model["config"]["bos_token_id"])  # config.json's bos: no bos_token in the config
    assert model["tok"].decode(ids, skip_special_tokens=False) == \
        f"{bos}o<|im_end|>o<|endoftext|>o<|im_start|>oo<|im_start|>ohi"
    assert gen.special_tokens == {"eos_token": "<|im_end|>", "unk_token": "<|endoftext|>", "sep_token": "<|im_start|>",
                                  "additional_special_tokens": ["<|im_start|>"]}


def test_past_the_cache_capacity_what_was_generated_is_kept(model, gen):
    prompt = [5, 6, 7, 8]
    res = gen.generate(prompt_ids=prompt, max_tokens=60, ignore_eos=True)  # T = 40 positions
    assert res.finish == "error" and "40" in str(res.error)
    want = greedy_reference(model, prompt, len(res.ids))
    assert res.ids == want and len(prompt) + len(res.ids) == 41  # the token of step 40 was drawn, not fed
    # the failing step counts the sequence's steps, its prompt step included (as a batch's slot
    # and a token-by-token prompt count them): 1 prompt step + 37 decode steps
    assert res.error.step == 38 and "(in step 38)" in str(res.error), res.error


def test_a_token_budget_too_large_to_hold_is_refused_before_the_prompt(gen):
    """max_tokens 10**12: the decode's token rows (a power of two >= the steps) would be 4 TiB.
    Refused before anything runs or is allocated (it failed inside XLA's run: a JAX
    RESOURCE_EXHAUSTED error, or a generation that hung)."""
    with pytest.raises(OiError, match=r"max_tokens 1000000000000 needs 4398046511104 bytes for the rows it collects .*too "
                                      r"large to allocate .*ask for fewer tokens"):
        gen.generate(prompt_ids=[5, 6, 7], max_tokens=10**12)


def test_ctrl_c_returns_what_was_generated(model, gen):
    """Ctrl-C during `generate` (sent from the text callback, between two fused calls): a
    KeyboardInterrupt whose `partial` is the generation so far, the NumPy Llama's tokens."""
    import os
    import signal
    pieces = []

    def on_text(piece):
        pieces.append(piece)
        if len(pieces) == 2:
            os.kill(os.getpid(), signal.SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a script's (an xdist worker's may differ)
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            gen.generate(prompt_ids=[5, 6, 7], max_tokens=30, ignore_eos=True, on_text=on_text)
    finally:
        signal.signal(signal.SIGINT, previous)
    res = caught.value.partial
    assert res.finish == "interrupted" and 1 < len(res.ids) < 30
    assert res.ids == greedy_reference(model, [5, 6, 7], len(res.ids))
    assert res.text == model["tok"].decode(res.ids, skip_special_tokens=True) and res.text.startswith("".join(pieces))
    assert res.stats.generated_tokens == len(res.ids)
    again = gen.generate(prompt_ids=[5, 6, 7], max_tokens=30, ignore_eos=True)  # the generator goes on
    assert again.ids[:len(res.ids)] == res.ids and again.finish == "length"


BAD_SETTINGS = [dict(temperature=-1.0), dict(temperature=float("nan")), dict(top_p=0.0), dict(min_p=2.0),
                dict(top_k=-1), dict(top_k=2.5), dict(max_tokens=-2), dict(seed=-1),
                # fine as Python floats, but not as the sampler's f32 inputs: inf, off, or 0
                dict(temperature=1e39), dict(temperature=1e-50), dict(top_p=0.99999999999), dict(top_p=1e-50),
                dict(min_p=1e-50),
                # sampling settings at temperature 0 (greedy) would be ignored
                dict(top_k=5), dict(top_p=0.9), dict(min_p=0.1), dict(seed=7)]


@pytest.mark.parametrize("bad", BAD_SETTINGS)
def test_bad_settings_are_named(gen, bad):
    with pytest.raises(OiError, match=next(iter(bad))):
        gen.generate(prompt_ids=[1, 2], **bad)


def test_generate_refuses_max_tokens_none_naming_it(gen):
    """(runtime probe) max_tokens=None (generate_batch's and Batch.insert's "no budget") passed the
    settings check and failed as a TypeError at `max_tokens - 1`, after the prompt's programs were built."""
    with pytest.raises(OiError, match=r"max_tokens must be a whole number >= 0, got None"):
        gen.generate(prompt_ids=[1, 2], max_tokens=None)


def test_a_batch_checks_the_settings_as_a_generation_does(gen):
    """generate_batch (`generate --batch`) took a NaN or negative temperature as greedy and a
    negative seed, and failed each prompt at run time on a top_p of 0: now the one check of
    `Generator.generate`, before any prompt runs."""
    from oi2jax.batch_generate import generate_batch
    for bad in BAD_SETTINGS:
        with pytest.raises(OiError, match=next(iter(bad))):
            generate_batch(gen.programs[1], [np.array([1, 2])], programs=gen.programs, **bad)


def test_a_top_k_above_the_vocabulary_is_refused(model, gen):
    """top_k > V keeps every token: top-k off, which was accepted in silence (the same text as no
    top_k). Refused by generate, generate_batch and Batch.insert; top_k = V is taken."""
    from oi2jax.batch_generate import generate_batch
    v = gen.vocab
    assert v == len(model["vocab"])
    message = (f"top_k {v + 1} is more than the vocabulary's {v} tokens: it keeps every token, which turns top-k off "
               f"(top_k 0); give 1..{v}, or 0 for off")
    for run in (lambda: gen.generate(prompt_ids=[1, 2], temperature=1.0, top_k=v + 1),
                lambda: generate_batch(gen.programs[1], [np.array([1, 2])], programs=gen.programs, temperature=1.0,
                                       top_k=v + 1),
                lambda: gen.programs[1].batch(2).insert(0, [1, 2], temperature=1.0, top_k=v + 1)):
        with pytest.raises(OiError) as e:
            run()
        assert str(e.value) == f"error: {message}"
    assert len(gen.generate(prompt_ids=[1, 2], max_tokens=3, temperature=1.0, top_k=v, ignore_eos=True).ids) == 3


def test_ids_outside_the_vocabulary_and_a_prompt_past_the_cache_are_refused_before_anything_compiles(model, gen):
    """A prompt id or stop id outside 0..V-1 (V: the graph's logits: f32[V]), an id past int32
    (an OverflowError in NumPy's cast before), a prompt that is not a 1-D integer vector (it was
    flattened, or its floats truncated) and a prompt longer than the cache's T = 40 positions:
    each named before any program compiles or runs (they failed in the prompt's step, after its
    compile, or were taken silently)."""
    v, compiles, programs = len(model["vocab"]), gen.compiles, set(gen.programs)
    outside = rf"is outside the vocabulary 0\.\.{v - 1} \(the graph's logits: f32\[{v}\]\)"
    for ids, where in (([1, v, 2], rf"token id {v} \(index 1\)"), ([-3], r"token id -3 \(index 0\)"),
                       (np.array([5, 2**40]), r"token id 1099511627776 \(index 1\)")):
        with pytest.raises(OiError, match=rf"^error: prompt_ids: {where} {outside}$"):
            gen.generate(prompt_ids=ids, max_tokens=3)
    with pytest.raises(OiError, match=r"prompt_ids: a prompt is a non-empty vector of token ids, got shape \[2, 2\]"):
        gen.generate(prompt_ids=[[1, 2], [3, 4]], max_tokens=3)
    with pytest.raises(OiError, match=r"prompt_ids: prompt token ids must be integers, got float64"):
        gen.generate(prompt_ids=[1.5, 2.0], max_tokens=3)
    with pytest.raises(OiError, match=rf"^error: stop ids: {v + 9} {outside}: it can never be drawn$"):
        gen.generate(prompt_ids=[1, 2], max_tokens=3, stop_ids=[4, v + 9])
    with pytest.raises(OiError, match=r"^error: the prompt has 41 tokens, more than the 40 positions the model's cache holds "
                                      r"\(its size T\): shorten the prompt$"):
        gen.generate(prompt_ids=list(range(3, 44)), max_tokens=1)
    assert gen.compiles == compiles and set(gen.programs) == programs  # nothing compiled for them
    assert gen.generate(prompt_ids=list(range(3, 43)), max_tokens=1, ignore_eos=True).ids == \
        greedy_reference(model, list(range(3, 43)), 1)  # 40 tokens fill the cache: its first token is drawn


def test_cli_names_the_prompt_ids_file_of_an_id_outside_the_vocabulary(model, tmp_path, capsys, shared_cli):
    v = len(model["vocab"])
    np.save(tmp_path / "p.npy", np.array([1, 2, v + 3], np.int64))
    code, out, err = run_cli(capsys, "generate", model["path"], "--prompt-ids", tmp_path / "p.npy")
    assert (code, out) == (1, "") and err == (f"error: {tmp_path / 'p.npy'}: token id {v + 3} (index 2) is outside "
                                              f"the vocabulary 0..{v - 1} (the graph's logits: f32[{v}])\n"), err


def test_cli_prints_the_text_and_the_stats_lines(model, tmp_path, capsys, shared_cli):
    ids_out = tmp_path / "ids.npy"
    code, out, err = run_cli(capsys, "generate", model["path"], "--prompt", "hello world", "--max-tokens", "6",
                             "--ignore-eos", "--stats", "--ids-out", ids_out)
    assert code == 0, err
    ids = np.load(ids_out)
    prompt = model["tok"].encode("hello world").ids
    assert ids.tolist() == greedy_reference(model, prompt, 6)
    assert out == model["tok"].decode(ids.tolist(), skip_special_tokens=True) + "\n"
    assert re.search(rf"^prompt {len(prompt)} tokens in [0-9.]+ s \([0-9.]+ tok/s\)$", err, re.M), err
    assert re.search(r"^generated 6 tokens in [0-9.]+ s \([0-9.]+ tok/s\)$", err, re.M), err
    assert re.search(r"^compile [0-9.]+ s \(.*llama_prefill.oi: prompt steps\)$", err, re.M), err
    assert re.search(r"^memory 0\.1 MB weights \+ 0\.0 MB state on \w+:0, peak resident [0-9]+ MB \(the process\)$",
                     err, re.M), err  # the bytes: test_memory_is_the_weights_once_and_one_sequences_state
    assert [graph for _, graph, _ in shared_cli] == [None]  # the model's default graph


def test_cli_reader_gone_still_writes_the_ids_and_the_stats(model, tmp_path, capsys, shared_cli, monkeypatch):
    """`generate ... --ids-out ids.npy --stats | head -c 10`: the reader of standard output leaves at
    the first streamed piece; the generation goes on, --ids-out holds every token and --stats is
    printed, exit 0. It ended at the broken pipe: no --ids-out, no --stats, still exit 0."""
    class Gone:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(sys, "stdout", Gone())
    ids_out = tmp_path / "ids.npy"
    code, _, err = run_cli(capsys, "generate", model["path"], "--prompt", "hello world", "--max-tokens", "20",
                           "--ignore-eos", "--stats", "--ids-out", ids_out)
    assert code == 0, err
    prompt = model["tok"].encode("hello world").ids
    assert np.load(ids_out).tolist() == greedy_reference(model, prompt, 20)
    assert re.search(r"^generated 20 tokens in [0-9.]+ s \([0-9.]+ tok/s\)$", err, re.M), err


def test_cli_ctrl_c_prints_writes_and_reports_what_was_generated(model, gen, tmp_path, capsys, shared_cli,
                                                                  monkeypatch):
    """Ctrl-C during `generate` (raised as the third streamed piece is due, before it is shown,
    where the CLI's handler raises it: in oi2jax's code, after a fused call): the text of every
    token drawn so far (those of the piece not shown too), --ids-out with them, the --stats lines,
    then `error: interrupted`, exit 130. It printed only the streamed pieces and wrote no --ids-out."""
    original = gen.generate
    pieces = []

    def interrupted(*a, on_text, **k):
        def piece(text):
            if len(pieces) == 2:
                raise KeyboardInterrupt
            on_text(text)
            pieces.append(text)
        return original(*a, on_text=piece, **k)
    monkeypatch.setattr(gen, "generate", interrupted)
    ids_out = tmp_path / "ids.npy"
    code, out, err = run_cli(capsys, "generate", model["path"], "--prompt", "hello world", "--max-tokens", "30",
                             "--ignore-eos", "--stats", "--ids-out", ids_out)
    assert code == 130 and err.endswith("error: interrupted\n"), err
    ids = np.load(ids_out).tolist()
    prompt = model["tok"].encode("hello world").ids
    assert 2 < len(ids) < 30 and ids == greedy_reference(model, prompt, len(ids)), (pieces, ids, out)
    text = model["tok"].decode(ids, skip_special_tokens=True)
    assert out == text + "\n" and out.startswith("".join(pieces)) and len(out) > len("".join(pieces)) + 1
    assert re.search(rf"^generated {len(ids)} tokens in [0-9.]+ s \([0-9.]+ tok/s\)$", err, re.M), err
    assert re.search(rf"^prompt {len(prompt)} tokens in ", err, re.M), err


def _extra_constant_bytes(path) -> int:
    """What llama_prefill.oi's constants hold beyond the checkpoint's tensors: the converter's
    rope.inv_freq and two f32 scalars from the metadata (rms_norm_eps, attn_scale)."""
    return open_model(path).tensors["rope.inv_freq"].nbytes + 2 * 4


def test_memory_is_the_weights_once_and_one_sequences_state(model, gen, tmp_path):
    """`Generator.memory` (the `--stats` memory line): the checkpoint's tensors, a tied embedding
    once; the state is the KV cache (2 tables of L x T x KVH x HD f32) and pos, end (i32)."""
    c = model["config"]
    hd = c["hidden_size"] // c["num_attention_heads"]
    state = 2 * c["num_hidden_layers"] * c["max_position_embeddings"] * c["num_key_value_heads"] * hd * 4 + 2 * 4
    weights = sum(w.nbytes for w in model["weights"].values())
    device = jax.devices()[0]
    assert gen.memory() == {"weights": weights + _extra_constant_bytes(model["path"]), "state": state,
                            "where": f"{device.platform}:{device.id}"}
    vocab = c["vocab_size"]
    tied = llama_checkpoint.write_random_llama(tmp_path / "tied", tied=True, vocab=vocab, hidden=32, layers=2, heads=4,
                                               kv_heads=2, intermediate=64, max_positions=40, seed=3)
    convert_hf(tied, tmp_path / "tied.oinf")
    stored = load_file(str(tied / "model.safetensors"))
    assert "lm_head.weight" not in stored  # the embedding is both embed and lm_head: placed once, counted once
    mem = Generator(tmp_path / "tied.oinf").memory()
    assert mem["weights"] == sum(w.nbytes for w in stored.values()) + _extra_constant_bytes(tmp_path / "tied.oinf")
    assert mem["weights"] == weights - vocab * 32 * 4 + _extra_constant_bytes(tmp_path / "tied.oinf")
    assert mem["state"] == state


def test_prompt_programs_on_a_cpu_roll_a_long_layer_loop_on_the_decode_programs_weights(gen, tmp_path):
    """runtime/buckets.py: on a CPU, a bucket program of a step graph whose layer loop unrolls to
    ROLL_FROM_TRIPS (8) layers or more is rebound with its loops rolled (`rebound(rolled=True)`),
    reading the decode program's member buffers (one copy of the weights), and draws the unrolled
    program's tokens; a 2-layer model's stays unrolled (it compiles faster so), and so does every
    bucket program on an accelerator."""
    from oi2jax.runtime.buckets import ROLL_FROM_TRIPS, rolls_prompts
    assert not rolls_prompts(gen.programs[1]) and gen.program(16).lowering.loop_policy.unroll == "auto"
    ck = llama_checkpoint.write_random_llama(tmp_path / "ck", vocab=64, hidden=16, layers=ROLL_FROM_TRIPS, heads=2,
                                             kv_heads=1, intermediate=32, max_positions=32, seed=5, std=0.3)
    convert_hf(ck, tmp_path / "m.oinf")
    deep = Generator(tmp_path / "m.oinf")
    # the greedy programs, which the generations below run (the general ones are built the same way)
    prompt, decode = deep.program(16, deep.greedy_programs), deep.greedy_programs[1]
    if decode.first_device().platform != "cpu":  # an accelerator: a switch in a loop is a host round trip
        assert not rolls_prompts(decode) and prompt.lowering.loop_policy.unroll == "auto"
        return
    assert rolls_prompts(decode) and prompt.lowering.loop_policy.unroll == "none" and prompt.lowering.loop_policy.members
    assert decode.lowering.loop_policy.unroll == "auto" and "Wq" in prompt.lowering.split
    assert all(prompt.executable.consts[k] is v for k, v in decode.executable.consts.items())
    assert prompt.memory()["weights"] == decode.memory()["weights"]
    ids = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    unrolled = {1: decode, 16: decode.rebound({"S": 16})}  # the bucket program as it was, unrolled
    want = Generator(tmp_path / "m.oinf")
    want.greedy_programs = unrolled
    assert deep.generate(prompt_ids=ids, max_tokens=6, ignore_eos=True).ids == \
        want.generate(prompt_ids=ids, max_tokens=6, ignore_eos=True).ids


def test_cli_past_capacity_prints_the_tokens_then_the_error(model, tmp_path, capsys, shared_cli):
    np.save(tmp_path / "p.npy", np.arange(30, dtype=np.int32))
    code, out, err = run_cli(capsys, "generate", model["path"], "--graph", EXAMPLES / "llama_decode.oi",
                             "--prompt-ids", tmp_path / "p.npy", "--max-tokens", "50", "--ignore-eos")
    assert code == 1 and "error:" in err and "11 tokens were generated before the failing step" in err, err
    assert out.strip()  # the text of the 11 tokens


def test_cli_ids_out_is_refused_before_any_work(model, tmp_path, capsys, shared_cli):
    """A directory, a FIFO, a path in a missing directory, the model itself: each was refused
    only when the ids were written, after the whole generation (its text already printed)."""
    import os
    fifo = tmp_path / "f.npy"
    os.mkfifo(fifo)
    missing = tmp_path / "no" / "o.npy"
    for out, message in ((tmp_path, f"{tmp_path}: is a directory"),
                         (fifo, f"{fifo}: not a regular file (a FIFO); refusing to replace it"),
                         (missing, f"{missing}: no such directory: {missing.parent}"),
                         (model["path"], f"--ids-out {model['path']} is the model: writing it would destroy the "
                                         f"input; choose another path")):
        code, out_text, err = run_cli(capsys, "generate", model["path"], "--prompt", "hello", "--ids-out", out)
        assert (code, out_text, err) == (1, "", f"error: {message}\n")
    assert shared_cli == []  # no Generator made: nothing compiled or run


def test_cli_usage_errors(model, tmp_path, capsys):
    code, _, err = run_cli(capsys, "generate", model["path"])
    assert code == 2 and "give --prompt TEXT, --prompt-ids IDS.npy or --batch FILE" in err  # names the batch form too
    (tmp_path / "bad.npy").write_text("no")
    code, _, err = run_cli(capsys, "generate", model["path"], "--graph", EXAMPLES / "llama_decode.oi", "--prompt-ids",
                           tmp_path / "bad.npy")
    assert code == 1 and "not a .npy array" in err
    # flags that would otherwise be ignored: refused, exit 2, before the model is read
    np.save(tmp_path / "ids.npy", np.array([5, 6], np.int32))
    for flags, message in ((["--prompt", "hi", "--batch-size", "4"], "--batch-size sets the slots of --batch FILE"),
                           (["--prompt-ids", tmp_path / "ids.npy", "--chat"], "--chat renders a text prompt"),
                           (["--prompt-ids", tmp_path / "ids.npy", "--system", "x"], "--system renders a text prompt")):
        code, out, err = run_cli(capsys, "generate", tmp_path / "no-such-model.oinf", *flags)
        assert (code, out) == (2, "") and message in err, err


def test_chat_settings_with_prompt_ids_are_refused(gen):
    for options in ({"chat": True}, {"system": "be brief"}):
        with pytest.raises(OiError, match="the chat template renders a text prompt; prompt_ids are the model's input"):
            gen.generate(prompt_ids=[5, 6], max_tokens=2, **options)


def test_the_prompt_step_equals_token_by_token(model, gen, token_gen):
    ids = [5, 6, 7, 8, 9, 10, 11]
    a, b = gen.prompt_step(ids), token_gen.prompt_step(ids)
    np.testing.assert_allclose(a.logits, b.logits, rtol=0, atol=1e-4)
    a.session.close()
    b.session.close()
    assert a.next == b.next == int(np.argmax(b.logits))
    want = greedy_reference(model, ids, 6)
    assert gen.generate(prompt_ids=ids, max_tokens=6, ignore_eos=True).ids == want
    assert token_gen.generate(prompt_ids=ids, max_tokens=6, ignore_eos=True).ids == want
    with pytest.raises(OiError, match="the graph has no dynamic `temperature`"):
        token_gen.generate(prompt_ids=ids, temperature=0.5)


def test_prompts_of_17_lengths_compile_only_their_buckets(model, gen):
    g = gen
    assert g.mode == "prompt steps" and g.buckets == (1, 16, 32)  # T = 40
    lengths = list(range(1, 18))
    seen = set()
    for m in (1, 16, 17):  # one prompt per bucket: each bucket's step program compiled once
        g.generate(prompt_ids=list(range(3, 3 + m)), max_tokens=1, ignore_eos=True)
        seen.add(min(s for s in g.buckets if s >= m))
    warm = g.compiles
    for m in lengths:
        g.generate(prompt_ids=[(7 * i) % 60 + 3 for i in range(m)], max_tokens=1, ignore_eos=True)
    assert sorted(g.greedy_programs) == sorted(seen) == [1, 16, 32]  # greedy generations run these
    assert g.compiles == warm  # 17 lengths: not one more trace
    long = list(range(3, 3 + 38))  # 38 tokens: one step of 32, then 6 in the bucket of 16
    res = g.generate(prompt_ids=long, max_tokens=1, ignore_eos=True)
    assert res.ids == greedy_reference(model, long, 1) and g.compiles == warm


def test_cli_batch_needs_the_step_graph_interface(model, tmp_path, capsys, shared_cli):
    np.save(tmp_path / "p.npy", np.array([[5, 6], [7, 8]], np.int32))
    code, _, err = run_cli(capsys, "generate", model["path"], "--batch", tmp_path / "p.npy", "--graph",
                           EXAMPLES / "llama_decode.oi")
    assert code == 1 and "llama_decode.oi: --batch runs the step-graph interface" in err, err


def test_a_prompt_that_is_not_text_and_an_on_text_that_is_not_a_function_are_named(gen):
    """Both failed as TypeErrors: the prompt inside the tokenizer, on_text after the prompt had run."""
    for prompt in (5, [1, 2]):
        with pytest.raises(OiError, match=rf"prompt: expected text \(a str\), got {type(prompt).__name__} \(token ids go "
                                          rf"in prompt_ids\)"):
            gen.generate(prompt, max_tokens=2)
    with pytest.raises(OiError, match="on_text: expected a function of the text piece, got int"):
        gen.generate(prompt_ids=[1, 2], max_tokens=2, on_text=5)


def test_ops_as_one_spec_string(model, gen):
    """`Generator(model, ops="nn")`, as `oi2jax.compile(..., ops="nn")` takes it: one op set (it was
    split into the sets "n" and "n")."""
    g = Generator(model["path"], ops="nn")
    assert g.generate(prompt_ids=[5, 6, 7], max_tokens=3, ignore_eos=True).ids == greedy_reference(model, [5, 6, 7], 3)


def test_the_family_graphs_ship_in_the_package(tmp_path, monkeypatch):
    """generate runs the graph a model file names (`examples/<family>_decode.oi`, and the
    `_prefill.oi` beside it) from the copy shipped in the package (oi2jax/graphs, package data; the
    examples/ files link to it): an installed oi2jax, run from any directory, has them."""
    import importlib
    import tomllib
    from pathlib import Path

    from oi2jax import generation
    importlib.import_module("oi2jax.model.hf")  # registers every family row
    from oi2jax.model.hf.families import FAMILIES
    names = {f.graph for f in FAMILIES.values()}
    assert names >= {"llama_decode.oi", "gemma2_decode.oi", "gpt2_decode.oi"}
    for name in names | {n.replace("_decode.oi", "_prefill.oi") for n in names}:
        shipped = generation.GRAPHS / name
        assert shipped.is_file() and not shipped.is_symlink(), name
        assert (EXAMPLES / name).resolve() == shipped.resolve(), name  # one file: examples/ links it
    config = tomllib.loads((EXAMPLES.parent / "pyproject.toml").read_text())
    assert "graphs/*.oi" in config["tool"]["setuptools"]["package-data"]["oi2jax"]
    monkeypatch.chdir(tmp_path)  # no examples/ here
    assert Path(generation._graph_path({"example_graph": "examples/llama_decode.oi"}, "m.oinf", None)) == \
        generation.GRAPHS / "llama_decode.oi"
    with pytest.raises(OiError, match="its example graph 'examples/nope.oi' is not a graph shipped with oi2jax "
                                      r"\(examples/gemma2_decode.oi, .*\): give the graph to run \(--graph G.oi\)"):
        generation._graph_path({"example_graph": "examples/nope.oi"}, "m.oinf", None)
    # a model file never chooses a local file to read (models probe: /etc/passwd was parsed)
    (tmp_path / "g.oi").write_text((EXAMPLES / "llama_decode.oi").read_text())
    for name in ("/etc/passwd", str(tmp_path / "g.oi"), "g.oi", "examples/../g.oi", "examples/llama_decode.oinf"):
        with pytest.raises(OiError, match="is not a graph shipped with oi2jax"):
            generation._graph_path({"example_graph": name}, "m.oinf", None)


def test_a_greedy_generation_runs_programs_with_the_temperature_fixed(model):
    """Greedy (temperature 0): the programs with the temperature fixed at 0 (`Program.specialized`,
    the same placed weights), whose steps compile the greedy draw alone -- no sampler's loops or
    conditional in their HLO. The first sampled generation compiles the general programs; the
    tokens are the NumPy Llama's either way, and a sampled run draws what it drew before."""
    g = Generator(model["path"])
    greedy, general = g.greedy_programs[1], g.programs[1]
    assert greedy.bound.fixed == {"temperature": 0.0} and not general.bound.fixed
    assert all(greedy.consts[k] is general.consts[k] for k in general.consts)  # not placed again
    assert "temperature" not in g._inputs({"temperature": 0.0, "top_k": 0})
    ids = [5, 9, 2]
    before = general.compiles
    res = g.generate(prompt_ids=ids, max_tokens=5, ignore_eos=True)
    assert res.ids == greedy_reference(model, ids, 5) and general.compiles == before  # nothing general compiled
    assert set(g.greedy_programs) == {1, 16} and set(g.programs) == {1}
    token = np.zeros(1, np.int32)
    fixed, full = (p.lower(tokens=token, n=np.int32(1)).as_text() for p in (greedy, general))
    assert fixed.count("stablehlo.case") == 0 < full.count("stablehlo.case")
    assert fixed.count("stablehlo.while") < full.count("stablehlo.while")
    sampled = g.generate(prompt_ids=ids, max_tokens=5, ignore_eos=True, temperature=0.7, top_k=5, seed=3)
    assert general.compiles > before and set(g.programs) == {1, 16}
    again = Generator(model["path"]).generate(prompt_ids=ids, max_tokens=5, ignore_eos=True, temperature=0.7,
                                              top_k=5, seed=3)
    assert sampled.ids == again.ids
    # a fixed input is no input of those programs
    with pytest.raises(OiError, match=r"input temperature is fixed at 0.0 in this program \(Program.specialized\)"):
        greedy.session().step(tokens=token, n=np.int32(1), temperature=np.float32(0))


def test_specialize_greedy_false_runs_the_general_programs_only(model):
    """`Generator(specialize_greedy=False)`: no greedy programs; greedy and sampled generations run
    the general programs, and changing the settings compiles nothing more."""
    g = Generator(model["path"], specialize_greedy=False)
    assert g.greedy_programs == {} and g.programs_for({"temperature": 0.0}) is g.programs
    ids = [5, 9, 2]
    assert g.generate(prompt_ids=ids, max_tokens=4, ignore_eos=True).ids == greedy_reference(model, ids, 4)
    compiles = g.compiles
    g.generate(prompt_ids=ids, max_tokens=4, ignore_eos=True, temperature=0.7, top_k=5, seed=3)
    assert g.compiles == compiles
    with pytest.raises(OiError, match="specialize_greedy: expected True or False, got 'no'"):
        Generator(model["path"], specialize_greedy="no")


def test_the_stats_decode_rate_counts_the_tokens_the_decode_steps_drew():
    """`generated M tokens in S s (R tok/s)`: S is the decode's seconds, and the first token is
    drawn by the prompt's last step (in the prompt's seconds), so R = (M - 1) / S (a batch: M less
    one token per prompt that drew one); it was M / S, 5835 tok/s for a 1-token generation."""
    from oi2jax.generation import Stats
    assert Stats(prompt_tokens=3, prompt_s=0.5, generated_tokens=6, generate_s=0.5).lines() == [
        "prompt 3 tokens in 0.500 s (6.0 tok/s)", "generated 6 tokens in 0.500 s (10.0 tok/s)"]
    assert Stats(prompt_tokens=3, prompt_s=0.5, generated_tokens=1, generate_s=0.0).lines()[1] == \
        "generated 1 tokens in 0.000 s (n/a tok/s)"
    assert Stats(prompt_tokens=3, prompt_s=0.5, generated_tokens=0, generate_s=0.0).lines()[1] == \
        "generated 0 tokens in 0.000 s (n/a tok/s)"
    assert Stats(prompt_tokens=9, prompt_s=1.0, generated_tokens=10, generate_s=2.0, from_prompt=2).lines()[1] == \
        "generated 10 tokens in 2.000 s (4.0 tok/s)"  # a batch of two prompts


def test_a_stored_stop_id_outside_the_vocabulary_is_an_error(model, monkeypatch):
    """Models probe: a model file's stop id past the logits' V was taken and never matched (the
    generation ran to --max-tokens); it is an error naming the key, as a --stop-id past V is."""
    from oi2jax import generation
    V = len(model["vocab"])
    monkeypatch.setattr(generation, "stored_special_ids", lambda meta, where: (None, None, [3, V + 2]))
    with pytest.raises(OiError, match=rf"m.oinf: metadata tokenizer.stop_ids: id {V + 2} is outside the vocabulary "
                                      rf"of .*llama_prefill.oi \(0..{V - 1}\): it can never be generated"):
        Generator(model["path"])
