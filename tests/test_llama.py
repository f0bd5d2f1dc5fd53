"""examples/llama_decode.oi on a project-written random Hugging Face checkpoint (converted with
convert-hf) against an independent NumPy Llama (tests/llama_ref.py): logits at every step of a
teacher-forced run, greedy generation inside the fused loop (`feedback`) equal to a host loop of
session steps, save/resume, a step past T, the CLI, and a 4-device CPU mesh equal to unsharded."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError

from conftest import EXAMPLES, REPO, assert_matches, graph_ops, run_cli
from llama_ref import LlamaRef, converted_random_llama

GRAPH = EXAMPLES / "llama_decode.oi"
SIZES = dict(vocab=64, hidden=32, layers=2, heads=8, kv_heads=4, intermediate=48, max_positions=40)
STEPS = 32
TOL = 1e-4  # |logit - reference| / max |reference logit|, every step (the bound)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llama")
    model, weights, config = converted_random_llama(tmp, seed=3, **SIZES)
    prog = oi2jax.compile(GRAPH, model=model, ops=["nn"])
    return prog, model, weights, config, tmp


def _rel(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


def test_logits_match_the_numpy_llama_at_every_step(llama):
    prog, _, weights, config, _ = llama
    ref = LlamaRef(weights, config)
    tokens = np.random.default_rng(0).integers(0, SIZES["vocab"], STEPS)
    sess = prog.session()
    worst = 0.0
    for k, tok in enumerate(tokens):
        sess.step(token=np.int32(tok))
        want = ref.step(int(tok))
        got = sess.read("logits")
        worst = max(worst, _rel(got, want))
        assert _rel(got, want) <= TOL, (k, _rel(got, want))
        assert int(sess.read("next")) == int(np.argmax(got))
    assert int(sess.read("pos")) == STEPS and worst > 0  # really computed in f32


def test_interpreter_agrees_on_the_first_step(llama):
    """The reference interpreter (the nn ops' NumPy references, node by node) on step 0."""
    _, model, weights, config, _ = llama
    out = oi2jax.compile(GRAPH, model=model, ops=["nn"], mode="interpret").run({"token": np.int32(5)})
    assert _rel(out["logits"], LlamaRef(weights, config).step(5)) <= TOL


def test_fused_greedy_generation_equals_a_host_loop(llama):
    prog, *_ = llama
    prompt = np.array([3, 9, 27, 1, 40], np.int32)
    n = 14
    res = prog.session().run({"token": prompt}, steps=n, feedback={"token": "next"}, collect=("next", "logits"))
    sess = prog.session()
    tokens, logits = [], []
    tok = None
    for k in range(n):
        tok = prompt[k] if k < len(prompt) else tok
        sess.step(token=np.int32(tok))
        tok = np.int32(sess.read("next"))
        tokens.append(int(tok))
        logits.append(sess.read("logits"))
    assert res["next"].tolist() == tokens
    # bit for bit on a CPU; elsewhere the fused loop and the step kernel are two compilations that
    # may accumulate in other orders: the device's EXACTNESS tolerance of the graph's ops
    assert_matches({"logits": res["logits"]}, {"logits": np.stack(logits)}, ops=graph_ops(GRAPH))


def test_save_and_resume_mid_way_equals_an_uninterrupted_run(llama, tmp_path):
    prog, *_ = llama
    tokens = np.random.default_rng(1).integers(0, SIZES["vocab"], 10).astype(np.int32)
    whole = prog.session().run({"token": tokens}, collect=("logits",))
    first = prog.session()  # both halves 5 steps collecting logits: one compiled loop for the two
    np.testing.assert_array_equal(first.run({"token": tokens[:5]}, collect=("logits",))["logits"], whole["logits"][:5])
    first.save(tmp_path / "s.npz")
    rest = prog.session(state=tmp_path / "s.npz").run({"token": tokens[5:]}, collect=("logits",))
    np.testing.assert_array_equal(rest["logits"], whole["logits"][5:])
    np.testing.assert_array_equal(rest["Kc"], whole["Kc"])


def test_a_step_past_T_is_an_error_not_a_wrap(llama):
    prog, *_ = llama
    sess = prog.session()
    sess.run({"token": np.zeros(SIZES["max_positions"], np.int32)})
    with pytest.raises(OiError) as e:
        sess.step(token=np.int32(1))
        sess.read("logits")
    text = e.value.render()
    assert "Kc" in text and "40" in text and f"(in step {SIZES['max_positions'] + 1})" in text


def test_cli_generation(llama, tmp_path, capsys):
    prog, model, *_ = llama
    prompt = np.array([3, 9, 27, 1, 40], np.int32)
    np.savez(tmp_path / "prompt.npz", token=prompt)
    code, _, err = run_cli(capsys, "run", str(GRAPH), "--model", str(model), "--ops", "nn", "--inputs-per-step",
                           str(tmp_path / "prompt.npz"), "--feedback", "token=next", "--steps", "14", "--collect",
                           "next", "--out", str(tmp_path / "gen.npz"), "--quiet")
    assert code == 0, err
    gen = np.load(tmp_path / "gen.npz")
    # the run of test_fused_greedy_generation_equals_a_host_loop (its compiled loop, shared through `prog`)
    want = prog.session().run({"token": prompt}, steps=14, feedback={"token": "next"}, collect=("next", "logits"))
    assert gen["next"].tolist() == want["next"].tolist()


MESH_WORKER = r"""
import json, sys
import numpy as np
import jax
import oi2jax
from oi2jax.runtime.sharding import make_mesh
graph, model = sys.argv[1], sys.argv[2]
assert jax.device_count() == 4, jax.devices()
tokens = np.array([3, 9, 27, 1, 40, 7], np.int32)
plain = oi2jax.compile(graph, model=model, ops=["nn"]).session().run({"token": tokens}, collect=("logits",))
shard = {"QD": "model", "KVD": "model", "F": "model", "H": "model", "KVH": "model"}
prog = oi2jax.compile(graph, model=model, ops=["nn"], mesh=make_mesh({"model": 4}), shard=shard)
sharded = prog.session().run({"token": tokens}, collect=("logits",))
a, b = plain["logits"].astype(np.float64), sharded["logits"].astype(np.float64)
tied = sys.argv[3]  # a tied model: its embedding placed once on the mesh, read as embed and lm_head
tied_plain = oi2jax.compile(graph, model=tied, ops=["nn"]).session().run({"token": tokens}, collect=("logits",))
tied_prog = oi2jax.compile(graph, model=tied, ops=["nn"], mesh=make_mesh({"model": 4}), shard={**shard, "V": "model"})
tied_sharded = tied_prog.session().run({"token": tokens}, collect=("logits",))
c, d = tied_plain["logits"].astype(np.float64), tied_sharded["logits"].astype(np.float64)
print(json.dumps({"rel": float(np.max(np.abs(a - b)) / np.max(np.abs(a))),
                  "next_equal": plain["next"].tolist() == sharded["next"].tolist(),
                  "tied_rel": float(np.max(np.abs(c - d)) / np.max(np.abs(c))),
                  "tied_once": tied_prog.consts["embed"] is tied_prog.consts["lm_head"],
                  "tied_sharded": not tied_prog.consts["embed"].sharding.is_fully_replicated}))
"""


def test_tensor_parallel_over_a_4_device_mesh_equals_unsharded(llama):
    _, model, *_, tmp = llama
    tied, *_ = converted_random_llama(tmp / "tied", seed=4, **{**SIZES, "tied": True})
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", MESH_WORKER, str(GRAPH), str(model), str(tied)], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["rel"] <= 1e-6 and res["next_equal"], res
    assert res["tied_rel"] <= 1e-6 and res["tied_once"] and res["tied_sharded"], res
