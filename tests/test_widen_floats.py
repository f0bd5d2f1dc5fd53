"""`widen_floats` (docs/semantics.md): an f32 declaration reads a bf16/f16 model tensor as its exact
f32 values, opt-in. A Hugging Face checkpoint stored in bf16 (most are) converts, without
--dtype, to a bf16 model; the families' graphs are f32: `generate` widens, a bare compile or run
says how (the mismatch error names --dtype f32 and --widen-floats)."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError
from oi2jax.generation import Generator
from oi2jax.model.convert import convert_hf

from conftest import EXAMPLES, run_cli

sys.path.insert(0, str(EXAMPLES))
import llama_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The same bf16 checkpoint converted twice: kept bf16 (no --dtype) and widened to f32 (--dtype f32)."""
    tmp = tmp_path_factory.mktemp("widen")
    ck = llama_checkpoint.write_random_llama(tmp / "ck", dtype="bf16", layers=1, tokenizer=True, max_positions=64)
    convert_hf(ck, tmp / "bf16.oinf")
    convert_hf(ck, tmp / "f32.oinf", dtype="f32")
    return tmp / "bf16.oinf", tmp / "f32.oinf"


def test_an_f32_graph_reads_a_bf16_model_as_its_f32_conversion(models):
    bf16, f32 = models
    graph = EXAMPLES / "llama_decode.oi"
    with pytest.raises(OiError, match=r"model dtype mismatch for embed: model bf16, graph f32 \(convert the model with "
                                      r"--dtype f32, or read its bf16 tensors as their exact f32 values with "
                                      r"--widen-floats / widen_floats=True\)"):
        oi2jax.compile(graph, model=bf16, ops=["nn"])
    tokens = {"token": np.array([3, 17, 5, 9], np.int32)}
    wide = oi2jax.compile(graph, model=bf16, ops=["nn"], widen_floats=True).run(tokens, steps=4, collect=("logits",))
    want = oi2jax.compile(graph, model=f32, ops=["nn"]).run(tokens, steps=4, collect=("logits",))
    np.testing.assert_array_equal(np.asarray(wide["logits"]), np.asarray(want["logits"]))  # bit for bit


def test_generate_widens_and_the_cli_flag(models, tmp_path, capsys):
    bf16, f32 = models
    got = Generator(bf16).generate(prompt_ids=[1, 2, 3], max_tokens=6)
    want = Generator(f32).generate(prompt_ids=[1, 2, 3], max_tokens=6)
    assert got.ids == want.ids and len(got.ids) == 6
    graph = str(EXAMPLES / "llama_decode.oi")
    np.save(tmp_path / "t.npy", np.array(3, np.int32))
    code, out, err = run_cli(capsys, "run", graph, "--model", str(bf16), "--ops", "nn", "--input",
                             f"token={tmp_path / 't.npy'}", "--quiet")
    assert code == 1 and "--widen-floats" in err and "Traceback" not in err
    for model, extra in ((bf16, ["--widen-floats"]), (f32, [])):
        code, out, err = run_cli(capsys, "run", graph, "--model", str(model), "--ops", "nn", "--input",
                                 f"token={tmp_path / 't.npy'}", "--out", str(tmp_path / f"{model.stem}.npz"), "--quiet",
                                 *extra)
        assert code == 0, err
    a, b = np.load(tmp_path / "bf16.npz"), np.load(tmp_path / "f32.npz")
    np.testing.assert_array_equal(a["logits"], b["logits"])


def test_a_bf16_gguf_generates_as_its_f32_conversion(tmp_path):
    """A GGUF file of BF16 weights converted without --dtype keeps them bf16; generate reads them
    as the --dtype f32 conversion of the same file does."""
    from gguf_file import write_gguf

    from oi2jax.model.gguf import convert_gguf
    ck = llama_checkpoint.write_random_llama(tmp_path / "ck", layers=1, tokenizer=True, max_positions=64)
    gguf = write_gguf(ck, tmp_path / "m.gguf", "BF16")
    convert_gguf(gguf, tmp_path / "kept.oinf")
    convert_gguf(gguf, tmp_path / "f32.oinf", dtype="f32")
    from oi2jax.model.reader import open_model
    with open_model(tmp_path / "kept.oinf") as m:
        assert m.tensors["model.layers.0.mlp.up_proj.weight"].dtype == "bf16"
    got = Generator(tmp_path / "kept.oinf").generate(prompt_ids=[4, 5, 6], max_tokens=5)
    want = Generator(tmp_path / "f32.oinf").generate(prompt_ids=[4, 5, 6], max_tokens=5)
    assert got.ids == want.ids and len(got.ids) == 5


def test_check_takes_the_flag_too(models, capsys):
    bf16, _ = models
    graph = str(EXAMPLES / "llama_decode.oi")
    code, out, err = run_cli(capsys, "check", graph, "--model", str(bf16), "--ops", "nn")
    assert code == 1 and "model dtype mismatch for embed: model bf16, graph f32" in err
    code, out, err = run_cli(capsys, "check", graph, "--model", str(bf16), "--ops", "nn", "--widen-floats")
    assert code == 0, err
