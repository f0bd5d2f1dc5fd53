"""`generate` and `convert-hf` under inputs a user gets wrong (a probe of the CLI, 2026-11-27):
a conversion never replaces a file it reads, special token ids are whole ids of the vocabulary
(never dropped, never wrapped), and generate's input files and texts are refused with their names
before anything runs -- never read without end, never an internal error."""
from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from conftest import EXAMPLES, run_cli


def _example():
    spec = importlib.util.spec_from_file_location("llama_checkpoint", EXAMPLES / "llama_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """A random Llama checkpoint with a tokenizer (V=320) and its conversion."""
    root = tmp_path_factory.mktemp("chat")
    directory = _example().write_random_llama(root / "ck", tokenizer=True, layers=1, max_positions=64)
    from oi2jax.model.convert import convert_hf
    convert_hf(directory, root / "chat.oinf")
    return directory, root / "chat.oinf"


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "generation_config.json"])
def test_convert_hf_never_writes_over_a_file_it_reads(capsys, chat, name):
    directory, _ = chat
    before = (directory / name).read_bytes()
    code, _, err = run_cli(capsys, "convert-hf", directory, "-o", directory / name)
    assert code == 1 and f"is the checkpoint's {name}: writing it would destroy the input" in err
    assert (directory / name).read_bytes() == before


def _variant(tmp_path, chat, edit):
    directory, _ = chat
    copy = tmp_path / "ck"
    copy.mkdir()
    for f in directory.iterdir():
        os.symlink(f, copy / f.name)
    edit(copy)
    return copy


@pytest.mark.parametrize("value,why", [
    ("2", "expected a token id (a whole number >= 0) or a list of them, got '2'"),
    (2.0, "expected a token id (a whole number >= 0) or a list of them, got 2.0"),
    (2**40, "expected a token id (a whole number >= 0) or a list of them, got 1099511627776"),
    (-1, "expected a token id (a whole number >= 0) or a list of them, got -1"),
    ([2, 5000], "5000 is not a token of the vocabulary (0..319)"),
    (999, "999 is not a token of the vocabulary (0..319)")])
def test_special_ids_are_whole_ids_of_the_vocabulary(capsys, tmp_path, chat, value, why):
    def edit(copy):
        (copy / "generation_config.json").unlink()
        (copy / "generation_config.json").write_text(json.dumps({"eos_token_id": value}))
    copy = _variant(tmp_path, chat, edit)
    code, _, err = run_cli(capsys, "convert-hf", copy, "-o", tmp_path / "m.oinf")
    assert code == 1 and why in err, err
    assert f"error: {copy / 'generation_config.json'}: " in err, err  # the file the id came from
    assert not (tmp_path / "m.oinf").exists()


@pytest.mark.parametrize("key", ["bos_token_id", "eos_token_id"])
def test_a_bad_special_id_in_config_json_names_the_checkpoint_file(capsys, tmp_path, chat, key):
    """config.json's bad bos/eos id was `error: config.json bos_token_id: ...`, naming no
    directory; now `DIR/config.json: KEY: ...`, as generation_config.json's and every config key's."""
    def edit(copy):
        config = json.loads((copy / "config.json").read_text())
        config[key] = -1
        (copy / "config.json").unlink()
        (copy / "config.json").write_text(json.dumps(config))
    copy = _variant(tmp_path, chat, edit)
    code, _, err = run_cli(capsys, "convert-hf", copy, "-o", tmp_path / "m.oinf")
    assert code == 1, err
    assert err == (f"error: {copy / 'config.json'}: {key}: expected a token id (a whole number >= 0) "
                   "or a list of them, got -1\n"), err
    assert not (tmp_path / "m.oinf").exists()


def test_a_tokenizer_file_that_is_a_directory_is_an_error_not_left_out(capsys, tmp_path, chat):
    def edit(copy):
        (copy / "tokenizer.json").unlink()
        (copy / "tokenizer.json").mkdir()
    copy = _variant(tmp_path, chat, edit)
    code, _, err = run_cli(capsys, "convert-hf", copy, "-o", tmp_path / "m.oinf")
    assert code == 1 and "tokenizer.json: not a regular file" in err


def test_generate_refuses_bad_input_files_and_text_before_running(capsys, tmp_path, chat):
    _, model = chat
    np.savez(tmp_path / "ids.npz", a=np.array([1, 2, 3], np.int32))
    code, _, err = run_cli(capsys, "generate", model, "--prompt-ids", tmp_path / "ids.npz")
    assert code == 1 and "--prompt-ids: an .npz of arrays (a); --prompt-ids takes one .npy array" in err
    code, _, err = run_cli(capsys, "generate", model, "--prompt", "hi", "--prompt-ids", tmp_path / "ids.npz")
    assert (code, err) == (2, "error: give --prompt TEXT or --prompt-ids IDS.npy, not both\n"), err
    code, _, err = run_cli(capsys, "generate", model)
    assert (code, err) == (2, "error: give --prompt TEXT, --prompt-ids IDS.npy or --batch FILE\n"), err
    (tmp_path / "prompts.txt").write_text("hello\nworld\n")
    code, _, err = run_cli(capsys, "generate", model, "--batch", tmp_path / "prompts.txt", "--batch-size", "0")
    assert code == 2 and "--batch-size must be >= 1, got 0" in err
    np.savez(tmp_path / "p.npz", a=np.array([1, 2], np.int32))
    (tmp_path / "cut.npz").write_bytes((tmp_path / "p.npz").read_bytes()[:40])
    code, _, err = run_cli(capsys, "generate", model, "--batch", tmp_path / "cut.npz")
    assert code == 1 and "cut.npz: cannot read the prompts" in err
    # what Python makes of bytes that are not UTF-8 in argv (the surrogateescape error handler)
    code, _, err = run_cli(capsys, "generate", model, "--prompt", b"ab\xff\xfe".decode("utf-8", "surrogateescape"))
    assert code == 2 and "--prompt: not UTF-8 text (bytes b'\\xff\\xfe' at character 2)" in err
    if os.path.exists("/dev/zero"):  # a device: read without end, were it read
        for flag, what in (("--tokenizer", "the tokenizer"), ("--batch", "the prompts"),
                           ("--prompt-ids", "--prompt-ids")):
            argv = [flag, "/dev/zero"] + ([] if flag == "--batch" else ["--prompt", "hi"] if flag == "--tokenizer"
                                          else [])
            code, _, err = run_cli(capsys, "generate", model, *argv)
            assert code == 1 and f"/dev/zero: {what}: not a regular file (a character device)" in err, err


def test_generate_batch_takes_no_size_below_one(chat):
    from oi2jax.diagnostics import OiError
    from oi2jax.generation import Generator
    from oi2jax.batch_generate import generate_batch
    _, model = chat
    gen = Generator(model)
    with pytest.raises(OiError, match="size"):
        generate_batch(gen.programs[1], [[1, 2]], size=0, programs=gen.programs, max_tokens=1)


def test_config_numbers_must_survive_f32(capsys, tmp_path, chat):
    def edit(copy):
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").unlink()
        (copy / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e300}))
    copy = _variant(tmp_path, chat, edit)
    code, _, err = run_cli(capsys, "convert-hf", copy, "-o", tmp_path / "m.oinf")
    assert code == 1 and "rms_norm_eps 1e+300 is inf in f32, in which the model file holds it" in err
    assert "Warning" not in err


def test_a_chat_template_that_fails_is_named(capsys):
    from oi2jax.diagnostics import OiError
    from oi2jax.model.chat_template import render_chat
    with pytest.raises(OiError, match=r"chat template: it runs away: a range of 1,000,000,000 items \(one range holds "
                                      r"at most 100,000\)"):
        render_chat("{% for i in range(10**9) %}x{% endfor %}", [{"role": "user", "content": "hi"}])


def test_a_gguf_given_as_a_model_says_how_to_convert_it(capsys, tmp_path, chat):
    (tmp_path / "m.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(200))
    code, _, err = run_cli(capsys, "inspect", tmp_path / "m.gguf")
    assert code == 1 and "a GGUF file: convert it first (oi2jax convert-gguf FILE.gguf -o MODEL.oinf)" in err


def test_graph_diagnostics_show_control_characters_and_a_window_of_a_long_line(capsys, tmp_path):
    (tmp_path / "nul.oi").write_text("dynamic { x: f32[2]; }\nblock en\0try {\n    return;\n}\n")
    code, _, err = run_cli(capsys, "check", tmp_path / "nul.oi", "--no-model")
    assert code == 1 and "unexpected character U+0000" in err and "\0" not in err
    assert "block en\ufffdtry {" in err
    (tmp_path / "long.oi").write_text("dynamic { x: f32[2]; }\nblock entry {\n" + " " * 1_000_000 + "?\n}\n")
    code, _, err = run_cli(capsys, "check", tmp_path / "long.oi", "--no-model")
    lines = err.splitlines()
    assert code == 1 and len(err) < 1000, len(err)
    shown, caret = lines[1], lines[2]
    assert shown.startswith("    ...") and shown.endswith("?") and caret.index("^") == shown.index("?")


def test_gguf_merges_of_tokens_outside_the_vocabulary_are_named():
    from oi2jax.diagnostics import OiError
    from oi2jax.model.tokenizer import _byte_level_bpe
    with pytest.raises(OiError, match="m.gguf: metadata tokenizer.ggml.merges: the tokenizer cannot be built"):
        _byte_level_bpe({"tokenizer.ggml.merges": ["a Q"], "tokenizer.ggml.pre": "gpt2"}, "m.gguf", ["a", "b", "ab"])


def test_a_batch_slot_must_be_an_integer(chat):
    from oi2jax.diagnostics import OiError
    from oi2jax.generation import Generator
    _, model = chat
    batch = Generator(model).programs[1].batch(2)
    for slot in (1.0, True):
        with pytest.raises(OiError, match=f"slot must be an integer in 0..1, got {type(slot).__name__} {slot!r}"):
            batch.evict(slot)


def test_blank_lines_of_a_prompts_file_are_said_to_be_skipped(capsys, tmp_path):
    from oi2jax.batch_generate import read_prompts
    (tmp_path / "p.txt").write_text("hello\nworld\n\nfoo\n\n")
    prompts = read_prompts(tmp_path / "p.txt", encode=lambda text: [len(text)])
    assert [list(p) for p in prompts] == [[5], [5], [3]]
    assert capsys.readouterr().err == (f"note: {tmp_path / 'p.txt'}: blank line 3 skipped: a prompt's index K counts "
                                       f"the prompts, not the lines\n")
    (tmp_path / "q.txt").write_text("hello\nworld\n\n")  # trailing: no index moves, nothing said
    assert len(read_prompts(tmp_path / "q.txt", encode=lambda text: [1])) == 2
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("extra,code_want,said", [
    ({"embedding_multiplier": 12.0}, 1, "embedding_multiplier is 12.0: this family's forward pass has no such setting"),
    ({"final_logit_softcapping": 30.0}, 1, "final_logit_softcapping is 30.0: this family's forward pass"),
    ({"embedding_multiplier": 1.0, "final_logit_softcapping": None}, 0, ""),  # neutral: nothing changes
    ({"rope_scalling": {"rope_type": "linear", "factor": 4.0}}, 0,
     "config.json: key rope_scalling is not read (did you mean rope_scaling?)")])
def test_config_keys_a_llama_does_not_read(capsys, tmp_path, chat, extra, code_want, said):
    def edit(copy):
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").unlink()
        (copy / "config.json").write_text(json.dumps({**config, **extra}))
    copy = _variant(tmp_path, chat, edit)
    code, _, err = run_cli(capsys, "convert-hf", copy, "-o", tmp_path / "m.oinf")
    assert code == code_want and said in err, err


def test_prompt_ids_that_are_text_say_so(capsys, tmp_path, chat):
    _, model = chat
    (tmp_path / "ids.txt").write_text("1 2 3\n")
    code, _, err = run_cli(capsys, "generate", model, "--prompt-ids", tmp_path / "ids.txt")
    assert code == 1 and "ids.txt: --prompt-ids: not a .npy array (not a NumPy file)" in err and "pickle" not in err


@pytest.mark.parametrize("argv, hint", [
    (["run", "GRAPH", "--mode", "compiled"], "unrecognized arguments: --mode compiled (did you mean --model?)"),
    (["run", "GRAPH", "--step", "3"], "unrecognized arguments: --step 3 (did you mean --steps?)"),
    (["run", "GRAPH", "--in", "x"], "(did you mean --input or --inputs-per-step or --interpret?)"),
    (["run", "GRAPH", "--zero-mising-inputs"], "(did you mean --zero-missing-inputs?)"),
    (["generate", "m.oinf", "--temp", "0.5"], "unrecognized arguments: --temp 0.5 (did you mean --temperature?)"),
])
def test_a_flag_is_never_read_as_the_abbreviation_of_another(capsys, argv, hint):
    """argparse read `--mode compiled` as `--model compiled` (and `--step` as `--steps`): a flag added
    later would change what a script's abbreviation means. Abbreviations are usage errors (exit 2),
    naming what they would have read."""
    from oi2jax.cli import main
    argv = [str(EXAMPLES / "mlp_regression.oi") if a == "GRAPH" else a for a in argv]
    with pytest.raises(SystemExit) as usage:  # a flag error: argparse's exit 2
        main(argv)
    err = capsys.readouterr().err
    assert usage.value.code == 2 and hint in err and "Traceback" not in err, err


def test_a_per_step_file_of_the_wrong_shape_says_what_each_step_would_get():
    """`--inputs-per-step` with a scalar input given as [2, 1]: the message showed `[N, ]` and
    spoke of a missing step axis, where the array has one and each step's value is [1]."""
    from oi2jax.diagnostics import OiError
    from oi2jax.run_rules import check_per_step
    with pytest.raises(OiError) as info:
        check_per_step("token", np.zeros((2, 1), np.int32), (), "--inputs-per-step")
    assert info.value.diagnostics[0].message == (
        "--inputs-per-step token: expected a leading step axis [N], got shape [2, 1]; with the first as the step "
        "axis each step's value would be [1], where token is []")


def test_run_input_files_must_be_regular_files_and_numpys_advice_is_not_repeated(capsys, tmp_path):
    """`run`'s --input, --inputs-per-step and --state-in take regular files: a FIFO (shell process
    substitution) was read twice (its first bytes, then the array) and failed with "No data left in
    file"; a directory or device is named as such. A file that is not NumPy's says so, without
    NumPy's advice to pass `allow_pickle=` (not an option of oi2jax)."""
    graph = EXAMPLES / "mlp_regression.oi"
    fifo = tmp_path / "x.fifo"
    os.mkfifo(fifo)  # never opened: the check reads its type, not its contents
    for flag, what in (("--input", "--input x"), ("--inputs-per-step", "--inputs-per-step"),
                       ("--state-in", "the state file")):
        for path, kind in ((fifo, "a FIFO"), (tmp_path, "a directory")):
            arg = f"x={path}" if flag == "--input" else path
            code, out, err = run_cli(capsys, "run", graph, flag, arg, "--quiet")
            assert (code, out) == (1, "") and err.strip().endswith(f"error: {path}: {what}: not a regular file ({kind})"), err
    (tmp_path / "p.npz").write_bytes(b"\x80\x04K\x01.")  # a pickle, not NumPy's format
    code, _, err = run_cli(capsys, "run", graph, "--inputs-per-step", tmp_path / "p.npz", "--quiet")
    assert code == 1 and err.strip().endswith(f"error: cannot read --inputs-per-step {tmp_path / 'p.npz'}: "
                                              "not a NumPy file"), err


def test_a_bfloat16_npy_read_back_as_raw_bytes_is_explained(tmp_path, capsys):
    """Emit probe 9: NumPy saves an ml_dtypes bfloat16 array as |V2 and reads back raw records:
    `expected bf16 values, got a |V2 array` gave no way out."""
    import ml_dtypes
    np.save(tmp_path / "bf.npy", np.ones((4, 16), ml_dtypes.bfloat16))
    g = tmp_path / "bf.oi"
    g.write_text("dynamic { x: bf16[4, 16]; }\nvolatile { y: bf16[4, 16]; }\nblock entry { op add(x, x) >> y; return; }\n")
    code, _, err = run_cli(capsys, "run", g, "--no-model", "--input", f"x={tmp_path / 'bf.npy'}")
    assert code == 1 and err.strip() == (
        "error: input x: expected bf16 values, got a |V2 array (raw 2-byte records: NumPy's .npy stores an "
        "ml_dtypes bfloat16 array as |V2 and reads it back as bytes; save it as float32, which converts exactly)")
