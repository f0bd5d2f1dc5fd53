"""Continuous batching (issue 40, item 2; oi2jax/runtime/batch.py): B sequences of a random
converted Llama decode in one compiled step (examples/llama_prefill.oi at S=1), each equal to its
solo run (the same graph: prompt steps at S=16, then S=1 steps) -- tokens exactly, logits
within the EXACTNESS tolerance; prompts of different lengths at once; a finished slot takes a new
prompt without a recompile and without disturbing the others; per-slot budgets and stop ids; a slot
that passes the cache's capacity ends with its tokens and the error; a 4-device mesh (data
parallel, and composed with a tensor-parallel spec) gives the tokens of one device."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from oi2jax.diagnostics import OiError
from oi2jax.generation import Generator
from oi2jax.runtime.buckets import buckets, prompt_steps

from conftest import EXAMPLES, REPO, assert_matches, device_platform, graph_ops, run_cli
from llama_ref import converted_random_llama

GRAPH = EXAMPLES / "llama_prefill.oi"
SIZES = dict(vocab=64, hidden=32, layers=2, heads=8, kv_heads=4, intermediate=48, max_positions=40)
BUCKET = 16
B = 4
CHUNK = 4  # small: every run crosses chunk boundaries
# The tolerance of a slot's logits against its solo run: a batched step multiplies B rows by each
# weight (a gemm) where the solo step multiplies one (a gemv), and XLA:CPU's kernels sum those in
# another order -- the accumulation-order difference the EXACTNESS table's accelerator row bounds
# (linear, einsum, rms_norm, softmax: rel 64 eps). Tokens are compared exactly.
REORDERED = "gpu" if device_platform() == "cpu" else device_platform()
PROMPTS = [np.random.default_rng(seed).integers(0, SIZES["vocab"], m).astype(np.int32)
           for seed, m in enumerate((5, 11, 3, 20, 9))]  # 20: two prompt steps (16 + 4)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(model, the S=1 program, the solo runs' cache, the Generator whose programs every test
    shares: its default graph is examples/llama_prefill.oi, beside the llama_decode.oi the model names)."""
    model, _, _ = converted_random_llama(tmp_path_factory.mktemp("batch"), seed=3, **SIZES)
    gen = Generator(model)
    assert Path(gen.graph_path).resolve() == GRAPH.resolve() and gen.buckets == (1, 16, 32)  # T = 40
    return model, gen.programs[1], {}, gen


def _batch(llama, size: int = B):
    """A batch of the shared S=1 program, its prompts in the Generator's S=16 program."""
    return llama[1].batch(size, chunk=CHUNK, buckets=(BUCKET,), programs=llama[3].programs)


def _solo(llama, k: int, steps: int, **settings):
    """Prompt k run alone: its prompt in steps of the S=16 program, then `steps - 1` S=1 steps (the
    programs' pure steps)
    feeding each token back, with sampling `settings`: (tokens, [steps - 1, V] decode logits).
    Cached per prompt and settings."""
    _, decode, cache, _ = llama
    key = (k, tuple(sorted(settings.items())))
    if key in cache and len(cache[key][0]) >= steps:
        toks, logits = cache[key]
        return toks[:steps], logits[:steps - 1]
    prompt = _prompt_program(llama)  # its pure step: the one the batch's prompts compiled
    ids = PROMPTS[k]
    state = prompt.init_state()
    for start in range(0, len(ids), BUCKET):
        part = ids[start:start + BUCKET]
        tokens = np.zeros(BUCKET, np.int32)
        tokens[:len(part)] = part
        state, out = prompt.step(state, tokens=tokens, n=np.int32(len(part)), **settings)
    toks = [int(np.asarray(out["next"])[0])]  # drawn after the last real row
    logits = []
    for _ in range(steps - 1):  # the S=1 program goes on from the same state
        state, out = decode.step(state, tokens=np.array([toks[-1]], np.int32), **settings)
        logits.append(np.asarray(out["logits"]))
        toks.append(int(np.asarray(out["next"])[0]))
    decode.check(state)
    cache[key] = (toks, np.stack(logits))
    return toks, np.stack(logits)


def _prompt_program(llama):
    return llama[3].program(BUCKET)  # the one the batches use


def test_each_slot_equals_its_solo_run(llama):
    batch = _batch(llama)
    for slot in range(B):
        batch.insert(slot, PROMPTS[slot], max_tokens=12)
    ops = graph_ops(GRAPH)
    for j in range(3):  # single steps: every slot's logits against its solo run's
        out = batch.step()
        for slot in range(B):
            want = _solo(llama, slot, 12)[1][j]
            assert_matches({"logits": np.asarray(out["logits"])[slot]}, {"logits": want}, ops=ops,
                           what=f"slot {slot} step {j}", platform=REORDERED)
    new = batch.run(100)  # stops early: every slot reaches its budget
    for slot in range(B):
        result = batch.result(slot)
        assert result.tokens == _solo(llama, slot, 12)[0], slot
        assert new[slot] == result.tokens[4:] and result.finish == "length"
        assert int(batch.read(slot, "pos")) == len(PROMPTS[slot]) + 11
    assert batch.active == []


def test_ctrl_c_in_a_batch_run_keeps_its_tokens_and_the_batch_goes_on(llama, monkeypatch):
    """Ctrl-C during `Batch.run` (sent while the second compiled call's tokens are taken): raised
    after that call, its `partial` the tokens so far; the batch goes on to each slot's solo run."""
    import signal
    from oi2jax.runtime.batch import Batch
    batch = _batch(llama)
    for slot in range(B):
        batch.insert(slot, PROMPTS[slot], max_tokens=12)
    takes, take = [], Batch._take

    def taking(self, slots, tokens):
        takes.append(len(tokens))
        if len(takes) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return take(self, slots, tokens)
    monkeypatch.setattr(Batch, "_take", taking)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a script's (an xdist worker's may differ)
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            batch.run(100)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert takes == [CHUNK, CHUNK]  # no call after the one in flight
    assert caught.value.partial == {slot: batch.result(slot).tokens[1:] for slot in range(B)}
    assert all(len(t) == 2 * CHUNK for t in caught.value.partial.values())
    batch.run(100)
    for slot in range(B):
        assert batch.result(slot).tokens == _solo(llama, slot, 12)[0], slot


def test_a_finished_slot_takes_a_new_prompt_without_recompiling_or_disturbing_the_others(llama):
    decode = llama[1]
    solo = {k: _solo(llama, k, 14)[0] for k in range(5)}  # before the compile counts are taken
    batch = _batch(llama)
    batch.insert(0, PROMPTS[0], max_tokens=3)
    for slot in (1, 2, 3):
        batch.insert(slot, PROMPTS[slot], max_tokens=14)
    batch.run(5)
    assert batch.result(0).finish == "length" and batch.active == [1, 2, 3]
    prompt = _prompt_program(llama)
    compiles = decode.compiles, prompt.compiles
    batch.insert(0, PROMPTS[4], max_tokens=8)  # the finished slot takes a new prompt: no recompile
    batch.run(2)
    evicted = batch.evict(2)  # slot 2 stops here: the others go on
    assert evicted.tokens == solo[2][:len(evicted.tokens)] and 2 not in batch.active
    assert evicted.finish == "evicted"  # it was still generating (it said None: running)
    batch.run(20)
    assert (decode.compiles, prompt.compiles) == compiles
    assert batch.result(0).tokens == solo[4][:8]
    assert batch.result(2) is None
    for slot in (1, 3):
        assert batch.result(slot).tokens == solo[slot], slot
    again = _batch(llama)  # a new batch of the program compiles nothing either
    again.insert(1, PROMPTS[1], max_tokens=2)
    again.run(3)
    assert again.result(1).tokens == solo[1][:2] and (decode.compiles, prompt.compiles) == compiles


SAMPLED = dict(temperature=np.float32(0.9), top_k=np.int32(20), top_p=np.float32(0.95), seed=np.int32(7))


def test_per_slot_sampling_settings(llama):
    batch = _batch(llama)
    batch.insert(0, PROMPTS[0], max_tokens=10, **SAMPLED)
    batch.insert(1, PROMPTS[1], max_tokens=10)  # greedy, beside a sampled slot
    batch.insert(2, PROMPTS[0], max_tokens=10, **{**SAMPLED, "seed": np.int32(8)})
    batch.run(20)
    sampled = _solo(llama, 0, 10, **SAMPLED)[0]
    assert batch.result(0).tokens == sampled
    assert batch.result(1).tokens == _solo(llama, 1, 10)[0]
    assert batch.result(2).tokens == _solo(llama, 0, 10, **{**SAMPLED, "seed": np.int32(8)})[0]
    assert sampled != _solo(llama, 0, 10)[0] and batch.result(2).tokens != sampled  # the settings count


def test_stops_per_slot(llama):
    solo = [_solo(llama, k, 12)[0] for k in range(3)]
    cut = next(i for i in range(1, 12) if solo[0][i] not in solo[0][:i])  # a first occurrence past the first token
    common = next(t for t in range(SIZES["vocab"]) if t not in solo[0] + solo[2])
    cut1 = next((i for i in range(1, 12) if solo[1][i] not in solo[1][:i]), None)
    batch = _batch(llama)
    batch.insert(0, PROMPTS[0], stop=[solo[0][cut]], max_tokens=12)
    batch.insert(1, PROMPTS[1], max_tokens=12)
    batch.insert(2, PROMPTS[2], max_tokens=12, stop=[solo[2][0]])  # the first token is a stop: nothing
    assert batch.result(2).tokens == [] and batch.result(2).finish == "stop"
    stop = [common] if cut1 is None else [common, solo[1][cut1]]
    batch.run(30, stop=stop)  # `stop` ends any slot, with its own
    assert batch.result(0).tokens == solo[0][:cut] and batch.result(0).finish == "stop"
    want1 = solo[1] if cut1 is None else solo[1][:cut1]
    assert batch.result(1).tokens == want1
    assert batch.result(1).finish == ("length" if cut1 is None else "stop")
    assert batch.active == [] and batch.run(5) == {0: [], 1: [], 2: [], 3: []}


def test_a_run_refusing_its_stop_ids_leaves_every_slots_own_stop_ids(llama):
    # run(stop=) merges its ids into each slot's own; a slot with too many raised only after the
    # slots before it had taken them, and they kept them: slot 0 then stopped at a run's id in
    # every later run
    solo = [_solo(llama, k, 12)[0] for k in range(2)]
    unused = [t for t in range(SIZES["vocab"]) if t not in solo[1]][:15]
    batch = _batch(llama)
    batch.insert(0, PROMPTS[0], max_tokens=12)
    batch.insert(1, PROMPTS[1], max_tokens=12, stop=unused)
    extra = next(t for t in range(SIZES["vocab"]) if t not in unused and t != solo[0][3])
    with pytest.raises(OiError, match="slot 1: 17 stop ids, at most 16"):
        batch.run(30, stop=[solo[0][3], extra])  # slot 0 would stop at its 4th token
    batch.run(30)
    assert batch.result(0).tokens == solo[0] and batch.result(0).finish == "length"
    assert batch.result(1).tokens == solo[1] and batch.result(1).finish == "length"


def test_a_slot_past_the_cache_ends_with_its_tokens_and_the_error(llama):
    batch = _batch(llama)
    batch.insert(3, PROMPTS[3])  # 20 prompt tokens, no budget: T = 40 fills after 21 tokens
    batch.insert(1, PROMPTS[1], max_tokens=14)
    batch.run(40)
    full = batch.result(3)
    assert full.finish == "error" and len(full.tokens) == 21 and int(batch.read(3, "pos")) == 40
    assert full.tokens == _solo(llama, 3, 21)[0]
    assert "(in step 23)" in str(full.error) and full.error.step == 23  # 2 prompt steps, 21 decode steps
    assert batch.result(1).tokens == _solo(llama, 1, 14)[0]


def test_batch_errors(llama):
    decode = llama[1]
    batch = _batch(llama, 2)
    with pytest.raises(OiError, match=r"Batch.step: no slot is generating \(every slot is free or finished\): "
                                      r"insert a prompt first"):
        batch.step()  # its rows would mean nothing
    assert batch.run(3) == {0: [], 1: []}
    batch.insert(0, PROMPTS[2], max_tokens=5)
    with pytest.raises(OiError, match=r"slot 2 is not in 0\.\.1"):
        batch.insert(2, PROMPTS[0])
    with pytest.raises(OiError, match="slot 0 is still generating: evict it"):
        batch.insert(0, PROMPTS[0])
    with pytest.raises(OiError, match=r"no sampling input temprature \(did you mean temperature\?\)"):
        batch.insert(1, PROMPTS[0], temprature=0.5)
    with pytest.raises(OiError, match="a prompt is a non-empty vector"):
        batch.insert(1, np.zeros((0,), np.int32))
    v = SIZES["vocab"]  # ids outside the vocabulary (the graph's logits: f32[V]), refused before the prompt runs
    with pytest.raises(OiError, match=rf"token id {v} \(index 1\) is outside the vocabulary 0\.\.{v - 1} \(the graph's "
                                      rf"logits: f32\[{v}\]\)"):
        batch.insert(1, np.array([1, v, 2]))
    with pytest.raises(OiError, match=r"token id 1099511627776 \(index 0\) is outside the vocabulary"):
        batch.insert(1, np.array([2**40]))  # failed in NumPy's cast to int32 before
    with pytest.raises(OiError, match=r"token id -1 \(index 0\) is outside"):
        batch.insert(1, np.array([-1, 3]))
    with pytest.raises(OiError, match=rf"stop ids: {v + 7} is outside the vocabulary .*: it can never be drawn"):
        batch.insert(1, PROMPTS[0], stop=[3, v + 7])
    with pytest.raises(OiError, match=rf"stop ids: {v} is outside the vocabulary"):
        batch.run(1, stop=[v])
    with pytest.raises(OiError, match="batch size must be a positive integer"):
        decode.batch(0)
    with pytest.raises(OiError, match=r"poss is not a persistent variable of the graph \(did you mean pos\?\)"):
        batch.read(0, "poss")
    with pytest.raises(OiError, match=r"a batch of 1000000000 slots needs \d+ bytes for their states and a call's "
                                      r"tokens \(\d+ a slot, chunk 32\): too large to allocate \(the limit is \d+ bytes.*\); "
                                      r"use fewer slots or a smaller chunk"):
        decode.batch(10**9)  # refused before allocating: it was NumPy's MemoryError (10**6 slots: out of memory)
    with pytest.raises(OiError, match=r"a batch of 1024 slots needs \d+ bytes .*chunk 2147483647\)"):
        decode.batch(1024, chunk=2**31 - 1)  # 8 TiB of tokens a call: past any machine's limit (at most 1 TiB)
    for chunk in (0, 2.5, True, 2**31):  # 2.5 and True were taken as 2 and 1, 2**31 an OverflowError in the run
        with pytest.raises(OiError, match=rf"chunk must be a whole number 1\.\.2147483647, got {chunk!r}"):
            decode.batch(2, chunk=chunk)
    with pytest.raises(OiError, match="axis='data' needs a mesh"):
        decode.batch(2, axis="data")
    # a prompt bucket is a whole number of rows up to T = 40: 2.5 was taken as 2, a bucket of 64
    # failed in every prompt step that took it, a string was read as its characters
    for given, bad in (((16, 64), 64), ((2.5,), 2.5), ((0,), 0), ((True,), True)):
        with pytest.raises(OiError, match=rf"a prompt bucket must be a whole number 1\.\.40, got {bad!r}"):
            decode.batch(2, buckets=given)
    for given in ("16", (), 16):
        with pytest.raises(OiError, match="prompt buckets: expected a list of sizes"):
            decode.batch(2, buckets=given)
    prompt = _prompt_program(llama)
    with pytest.raises(OiError, match="a batch runs a step graph at S=1"):
        prompt.batch(2)
    # a prompt longer than the cache is refused before it runs, as `generate` refuses it (it failed
    # in its third prompt step, after two had run)
    with pytest.raises(OiError, match=r"^error: the prompt has 41 tokens, more than the 40 positions the model's cache "
                                      r"holds \(its size T\): shorten the prompt$"):
        batch.insert(1, np.arange(41, dtype=np.int32) % SIZES["vocab"])
    assert batch.result(1) is None and batch.active == [0]


@pytest.mark.parametrize("settings, message", [
    # the rule of a single generation (runtime/settings.py), before the prompt runs: these were
    # taken as given (a negative temperature ran greedy, top_k=-3 kept every token, a top_k with
    # temperature 0 was ignored) or failed in the sampler after the prompt step, naming no setting
    (dict(temperature=np.float32(-1)), r"temperature must be a number >= 0 \(0: greedy\), got np.float32\(-1.0\)"),
    (dict(temperature=float("inf")), "temperature must be a number >= 0"),
    (dict(temperature=float("nan")), "temperature must be a number >= 0"),
    (dict(top_k=5), r"top_k=5: sampling settings, but temperature 0 is greedy"),  # the graph's default: 0
    (dict(temperature=0.0, seed=3), r"seed=3: sampling settings, but temperature 0 is greedy"),
    (dict(temperature=0.5, top_k=-3), r"top_k must be a whole number 0\.\.2147483647, got -3"),
    (dict(temperature=0.5, seed=-1), r"seed must be a whole number 0\.\.2147483647, got -1"),
    (dict(temperature=0.5, top_p=0.0), r"top_p must be in \(0, 1\] \(1: off\), got 0.0"),
    (dict(temperature=0.5, top_p=2.0), r"top_p must be in \(0, 1\]"),
    (dict(temperature=0.5, min_p=-1.0), r"min_p must be in \[0, 1\] \(0: off\), got -1.0"),
    (dict(temperature=1e-50), r"temperature 1e-50 is 0.0 in f32, the sampler's precision, which turns it off"),
])
def test_a_slots_settings_are_checked_as_a_generations(llama, settings, message):
    batch = _batch(llama, 2)
    with pytest.raises(OiError, match=message):
        batch.insert(0, PROMPTS[0], max_tokens=3, **settings)
    assert batch.result(0) is None and batch.active == []


def test_a_slots_settings_are_rounded_as_a_generations(llama):
    """Python floats are the graph's f32 inputs, the f32 nearest each (0.9 is not an f32): it was
    refused ("not exactly representable in f32; pass a float32 array"), so `generate --batch
    --temperature 0.7` generated nothing. The tokens are those of the same settings as f32."""
    batch = _batch(llama)
    batch.insert(0, PROMPTS[0], max_tokens=10, temperature=0.9, top_k=20, top_p=0.95, seed=7)
    batch.insert(1, PROMPTS[0], max_tokens=0)  # no token asked for: nothing runs, nothing returned
    assert (batch.result(1).tokens, batch.result(1).finish, batch.active) == ([], "length", [0])
    batch.run(20)
    assert batch.result(0).tokens == _solo(llama, 0, 10, **SAMPLED)[0]


WORKER = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[2])
    import numpy as np, oi2jax
    from oi2jax.runtime.sharding import make_mesh
    graph, model, prompts = sys.argv[1], sys.argv[3], [np.array(p, np.int32) for p in json.loads(sys.argv[4])]

    def tokens(prog, **options):
        batch = prog.batch(4, chunk=4, buckets=(16,), **options)
        for slot, p in enumerate(prompts):
            batch.insert(slot, p, max_tokens=9)
        batch.run(20)
        return [batch.result(slot).tokens for slot in range(4)], str(getattr(batch._state.caches["Kc"].data.sharding, "spec", None))

    compile = lambda **kw: oi2jax.compile(graph, model=model, ops=["nn"], sizes={"S": 1}, **kw)
    data = tokens(compile(), mesh=make_mesh({"data": 4}))
    sharded = compile(mesh=make_mesh({"data": 2, "model": 2}), shard={"KVH": "model"})
    both = tokens(sharded, axis="data")
    try:  # a sharded program's slots go on its own mesh: another mesh was silently ignored
        sharded.batch(4, mesh=make_mesh({"x": 4}))
        other = "no error"
    except oi2jax.OiError as exc:
        other = str(exc)
    print("REPORT " + json.dumps({"data": data, "both": both, "other": other}))
''')


def test_a_four_device_mesh_gives_the_tokens_of_one_device(llama):
    model = llama[0]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    prompts = json.dumps([p.tolist() for p in PROMPTS[:4]])
    proc = subprocess.run([sys.executable, "-c", WORKER, str(GRAPH), str(REPO / "tests"), str(model), prompts],
                          env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")][-1][len("REPORT "):])
    one = [_solo(llama, k, 9)[0] for k in range(4)]  # = one device's batch (the tests above)
    assert report["data"][0] == one and report["both"][0] == one
    assert report["data"][1] == "P('data',)"  # the slots over the mesh
    assert report["both"][1] == "P('data', None, None, 'model')"  # and the KV heads over the model axis
    assert report["other"] == ("error: this program is compiled sharded on its own mesh (data=2, model=2): the slots "
                               "go on a free axis of it (axis=); leave out mesh= (given x=4)")


def test_generate_batch_cli_keeps_the_prompts_order_and_equals_solo_runs(llama, tmp_path, capsys, monkeypatch):
    """`oi2jax generate MODEL --batch FILE` without --graph runs on the Generator's programs (the
    module's Generator, made with the CLI's arguments): greedy, its programs with the temperature
    fixed at 0 (`greedy_programs`: its S=1 program and its bucket programs); the general ones
    are not compiled again. A slot of such a batch cannot set the temperature."""
    from oi2jax import generation
    from oi2jax.batch_generate import read_prompts
    model, decode, _, gen = llama
    solo = {k: _solo(llama, k, 6)[0] for k in (0, 1, 2)}
    made = []

    def shared(path, graph=None, **options):
        made.append((str(path), graph, options))
        return gen
    monkeypatch.setattr(generation, "Generator", shared)
    programs, compiles = dict(gen.programs), gen.programs[BUCKET].compiles
    prompts = tmp_path / "p.npz"
    np.savez(prompts, a=PROMPTS[0], b=PROMPTS[2], c=PROMPTS[1])  # 3 prompts through 2 slots, all in S = 16
    out = tmp_path / "ids.npz"
    code, printed, err = run_cli(capsys, "generate", model, "--batch", prompts, "--batch-size", "2",
                                 "--max-tokens", "6", "--ids-out", out, "--stats")
    assert code == 0, err
    # --stats: a single generation's lines over the batch (prompt steps, batched decode, compiling apart)
    n_prompt = len(PROMPTS[0]) + len(PROMPTS[2]) + len(PROMPTS[1])
    assert re.search(r"^compile [0-9.]+ s \(.*: batch of 3 prompts in 2 slots\)$", err, re.M), err
    assert re.search(rf"^prompt {n_prompt} tokens in [0-9.]+ s \([0-9.]+ tok/s\)$", err, re.M), err
    assert re.search(rf"^generated {sum(len(v) for v in solo.values())} tokens in [0-9.]+ s", err, re.M), err
    mem = gen.greedy_programs[1].memory()
    assert f"memory {mem['weights'] / 1e6:.1f} MB weights + {2 * mem['state'] / 1e6:.1f} MB state on " in err, err
    assert made == [(str(model), None, {"tokenizer": None, "ops": ["nn"], "kernels": "jax", "kv_dtype": None})]
    assert gen.programs == programs and gen.programs[BUCKET].compiles == compiles  # nothing compiled again
    assert BUCKET in gen.greedy_programs  # the batch's prompt steps: the greedy bucket program
    with pytest.raises(OiError, match=r"temperature is fixed at 0.0 in this batch's program \(Program.specialized\)"):
        gen.greedy_programs[1].batch(2, buckets=(BUCKET,), programs=gen.greedy_programs).insert(
            0, PROMPTS[0], temperature=0.5)
    ids = np.load(out)
    for name, k in zip(("prompt_0", "prompt_1", "prompt_2"), (0, 2, 1)):
        assert ids[name].tolist() == solo[k], name
    assert printed.index("=== 0 (length) ===") < printed.index("=== 1 (length) ===") < printed.index("=== 2")
    rows = tmp_path / "rows.npy"
    np.save(rows, np.stack([PROMPTS[0], PROMPTS[0]]))
    assert [p.tolist() for p in read_prompts(rows)] == [PROMPTS[0].tolist()] * 2
    text = tmp_path / "p.txt"
    text.write_text("one\n\ntwo\n")
    assert [p.tolist() for p in read_prompts(text, encode=lambda s: [len(s)])] == [[3], [3]]
    assert "p.txt: blank line 2 skipped: a prompt's index K counts the prompts" in capsys.readouterr().err
    with pytest.raises(OiError, match="text prompts need a tokenizer"):
        read_prompts(text)
    np.save(rows, np.zeros((2, 2), np.float32))
    with pytest.raises(OiError, match="row 0: a prompt is a non-empty 1-D array of integer token ids"):
        read_prompts(rows)
    # a prompt outside the vocabulary, or a stop id that can never be drawn, is refused before any
    # prompt runs: the prompts before it are not cut off by its error (it failed mid-batch before)
    v = SIZES["vocab"]
    np.savez(prompts, a=PROMPTS[0], b=np.array([4, 2**40]), c=PROMPTS[1])
    code, printed, err = run_cli(capsys, "generate", model, "--batch", prompts, "--max-tokens", "3")
    assert (code, printed) == (1, "") and err == (f"error: prompt 1: token id 1099511627776 (index 1) is outside the "
                                                  f"vocabulary 0..{v - 1} (the graph's logits: f32[{v}])\n"), err
    np.savez(prompts, a=PROMPTS[0])
    # a slot's 16 stop ids: the model's and --stop-id's counted together, named as such ("18 stop ids, at most 16")
    many = [x for t in range(3, 20) for x in ("--stop-id", str(t))]
    code, printed, err = run_cli(capsys, "generate", model, "--batch", prompts, *many)
    assert (code, printed) == (1, "") and err == ("error: --batch: 18 stop ids (the model's 1 and --stop-id's), at most 16 "
                                                  "a slot: give fewer --stop-id (or --ignore-eos)\n"), err
    code, printed, err = run_cli(capsys, "generate", model, "--batch", prompts, "--stop-id", str(v + 1))
    assert (code, printed) == (1, "") and f"error: stop ids: {v + 1} is outside the vocabulary" in err, err
    # the chat template renders text: with a file of ids, --chat / --system are refused, not ignored
    for flags, named in ((["--chat"], "--chat"), (["--system", "be brief", "--chat"], "--chat"), (["--system", "x"], "--system")):
        code, printed, err = run_cli(capsys, "generate", model, "--batch", prompts, *flags)
        assert (code, printed) == (1, "") and f"{prompts}: {named} renders text prompts" in err, err
    assert gen.programs == programs and gen.programs[BUCKET].compiles == compiles


def test_the_benchmarks_handwritten_batched_step_gives_the_batchs_tokens(llama):
    """benchmarks/batch.py's baseline computes what it is compared with: from each slot's cache
    after its prompt, the hand-written batched decode draws the batch's greedy tokens."""
    import jax.numpy as jnp

    from oi2jax.model import open_model

    from benchmarks.handwritten.llama_batch import LlamaBatchJax
    model = llama[0]
    batch = _batch(llama)
    for slot in range(B):
        batch.insert(slot, PROMPTS[slot], max_tokens=7)
    caches = tuple(jnp.asarray(np.stack([batch.read(slot, name) for slot in range(B)])) for name in ("Kc", "Vc"))
    first = np.array([batch.result(slot).tokens[0] for slot in range(B)], np.int32)
    pos = np.array([len(p) for p in PROMPTS[:B]], np.int32)
    batch.run(10)
    hand = LlamaBatchJax.from_model(open_model(str(model)), batch=B)
    _, nexts = hand.decode(hand.params, caches, first, pos, 6)
    assert np.asarray(nexts).T.tolist() == [batch.result(slot).tokens[1:] for slot in range(B)]


def test_the_default_buckets_are_the_generators_and_a_one_token_prompt_runs_at_s_1(llama):
    """One rule (runtime/buckets.py): a batch's default buckets are the Generator's; a 1-token
    prompt runs in the bucket S = 1, the batch's own program (from a fresh state: its solo run)."""
    decode, gen = llama[1], llama[3]
    assert buckets(40) == (1, 16, 32) and buckets(5000)[-2:] == (512, 1024) and buckets(8) == (1,)
    assert prompt_steps(2100, buckets(4096)) == [(1024, 1024), (1024, 1024), (64, 52)]
    assert prompt_steps(1, buckets(40)) == [(1, 1)] and prompt_steps(17, buckets(40)) == [(32, 17)]
    before = dict(gen.programs)
    batch = decode.batch(B, chunk=CHUNK, programs=gen.programs)
    assert batch.buckets == gen.buckets and batch.prompt_program(1) is decode
    batch.insert(2, PROMPTS[1][:1], max_tokens=5)
    batch.run(10)
    state, toks = decode.init_state(), []
    for tok in [int(PROMPTS[1][0])] + [None] * 4:
        state, out = decode.step(state, tokens=np.array([toks[-1] if tok is None else tok], np.int32))
        toks.append(int(np.asarray(out["next"])[0]))
    decode.check(state)
    assert batch.result(2).tokens == toks and gen.programs == before  # no bucket program made


def test_a_batch_multiplies_its_rows_weight_first_in_one_product():
    """nn `linear` under `jax.vmap` (a batch's step): the slots' rows in ONE dot_general with the
    weight as its left operand (XLA's CPU dot runs a few rows 25-35% faster so:
    benchmarks/batch_dots.py); one row unbatched keeps x first. Values: NumPy's."""
    import jax
    from jax import lax
    from oi2jax.ops.nn.matmul import _product_fn
    product = _product_fn(lax.Precision.HIGHEST, np.dtype(np.float32))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    x = rng.standard_normal((8, 1, 4)).astype(np.float32)

    def dots(jaxpr):  # every dot_general, inside the custom_jvp / custom_vmap calls too
        for e in jaxpr.eqns:
            if e.primitive.name == "dot_general":
                yield [v.aval.shape for v in e.invars]
            for p in e.params.values():
                inner = getattr(p, "jaxpr", p)
                if hasattr(inner, "eqns"):
                    yield from dots(inner)
    assert list(dots(jax.make_jaxpr(jax.vmap(lambda r: product(r, w)))(x).jaxpr)) == [[(5, 4), (8, 1, 4)]]
    assert list(dots(jax.make_jaxpr(lambda r: product(r, w))(x[0]).jaxpr)) == [[(1, 4), (5, 4)]]
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(lambda r: product(r, w)))(x)), x @ w.T, rtol=1e-6)


def test_generate_batch_cli_samples_with_any_temperature_and_checks_every_prompt_first(llama, tmp_path, capsys,
                                                                                         monkeypatch):
    """`generate --batch FILE --temperature 0.7 --top-p 0.9` (settings f32 does not hold exactly)
    samples as the same settings in f32 do; `--max-tokens 0` gives empty results, as a single
    generate does; a prompt longer than the cache is named by its index before any prompt runs
    (it failed in its own prompt step, and the error cut off the prompts before it); no prompts
    at all is said so in the Python API too."""
    from oi2jax import generation
    from oi2jax.batch_generate import generate_batch
    model, decode, _, gen = llama
    monkeypatch.setattr(generation, "Generator", lambda path, graph=None, **options: gen)
    prompts = tmp_path / "p.npz"
    np.savez(prompts, a=PROMPTS[0], b=PROMPTS[1])
    out = tmp_path / "ids.npz"
    code, _, err = run_cli(capsys, "generate", model, "--batch", prompts, "--max-tokens", "5", "--temperature", "0.7",
                           "--top-p", "0.9", "--seed", "4", "--ids-out", out)
    assert code == 0, err
    settings = dict(temperature=np.float32(0.7), top_p=np.float32(0.9), seed=np.int32(4))
    got = np.load(out)
    assert [got["prompt_0"].tolist(), got["prompt_1"].tolist()] == [_solo(llama, k, 5, **settings)[0] for k in (0, 1)]
    code, printed, err = run_cli(capsys, "generate", model, "--batch", prompts, "--max-tokens", "0", "--ids-out", out)
    assert (code, err) == (0, ""), err
    assert printed == "=== 0 (length) ===\n\n=== 1 (length) ===\n\n", printed
    assert [np.load(out)[k].tolist() for k in ("prompt_0", "prompt_1")] == [[], []]
    np.savez(prompts, a=PROMPTS[0], b=np.arange(41) % SIZES["vocab"])
    code, printed, err = run_cli(capsys, "generate", model, "--batch", prompts)
    assert (code, printed) == (1, "") and err == ("error: prompt 1 has 41 tokens, more than the 40 positions the "
                                                  "model's cache holds (its size T): shorten the prompt\n"), err
    with pytest.raises(OiError, match=r"generate_batch: no prompts \(give a list of token-id prompts\)"):
        generate_batch(decode, [])
    # a prompt whose decode passes the cache: its error on stderr names the prompt (the other's
    # text goes on around it); its 21 tokens are printed under its header
    np.savez(prompts, a=PROMPTS[3], b=PROMPTS[0])
    code, printed, err = run_cli(capsys, "generate", model, "--batch", prompts, "--ignore-eos", "--max-tokens", "30")
    assert code == 1 and "=== 0 (error) ===" in printed and "=== 1 (length) ===" in printed, (printed, err)
    assert "slice end 41 is past its fixed size 40 (in step 22)" in err and err.endswith(  # 1 prompt step (S=32) + 21
        "note: prompt 0: 21 tokens were generated before the failing step (shown under === 0 (error) ===)\n"), err


def test_read_prompts_names_what_an_npz_or_npy_holds(tmp_path):
    """An .npz member that is no .npy array was an internal error (NumPy hands such a member's
    bytes); a uint64 id past int64 was named wrapped negative (the ids were cast to int64)."""
    import zipfile

    from oi2jax.batch_generate import read_prompts
    from oi2jax.runtime.tokens import prompt_ids
    path = tmp_path / "notes.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(OiError, match=r"notes.npz: member readme.txt: a prompt is a non-empty 1-D array of integer "
                                      r"token ids, got a file that is not an .npy array"):
        read_prompts(path)
    path = tmp_path / "u64.npy"
    np.save(path, np.array([[1, 2**63 + 5]], np.uint64))
    prompts = read_prompts(path)
    assert prompts[0].tolist() == [1, 2**63 + 5]
    with pytest.raises(OiError, match=rf"prompt 0: token id {2**63 + 5} \(index 1\) is outside the vocabulary"):
        prompt_ids(prompts[0], SIZES["vocab"], "prompt 0")  # generate_batch's check of every prompt
    with pytest.raises(OiError, match=r"prompt 0: a prompt is a non-empty vector of token ids, got text 'hello': "
                                      r"encode it first"):  # (batch probe) it said "got shape \[\]"
        prompt_ids("hello", SIZES["vocab"], "prompt 0")
    upper = tmp_path / "P.NPY"  # (batch probe) read as a text file: a UTF-8 decoding error
    with open(upper, "wb") as f:  # (np.save to a path would add ".npy")
        np.save(f, np.array([[3, 4]], np.int32))
    assert [p.tolist() for p in read_prompts(upper)] == [[3, 4]]


def test_ctrl_c_in_generate_batch_cli_shows_and_writes_what_was_generated(llama, tmp_path, capsys, monkeypatch):
    """Ctrl-C during `generate --batch` (raised after a compiled call whose tokens were taken, as
    the CLI's handler does): the prompts in flight are shown as they stand (`interrupted`),
    --ids-out holds every prompt started (not those never started), --stats is printed, then
    `error: interrupted`, exit 130. It printed the finished prompts only and wrote no --ids-out."""
    from oi2jax import generation
    from oi2jax.runtime.batch import Batch
    model, _, _, gen = llama
    monkeypatch.setattr(generation, "Generator", lambda path, graph=None, **options: gen)
    run, calls = Batch.run, []

    def two_steps(self, steps, stop=()):  # runs of 2 steps: prompts are in flight between them
        out = run(self, min(steps, 2), stop)
        calls.append(steps)
        if len(calls) == 4:  # the first two prompts finished in the third run (6 tokens)
            raise KeyboardInterrupt
        return out
    monkeypatch.setattr(Batch, "run", two_steps)
    prompts, ids_out = tmp_path / "p.npz", tmp_path / "ids.npz"
    np.savez(prompts, **{f"p{k}": PROMPTS[k] for k in range(5)})
    code, printed, err = run_cli(capsys, "generate", model, "--batch", prompts, "--batch-size", "2",
                                 "--max-tokens", "6", "--ignore-eos", "--ids-out", ids_out, "--stats")
    assert code == 130 and err.endswith("error: interrupted\n"), err
    ids = np.load(ids_out)
    assert sorted(ids.files) == ["prompt_0", "prompt_1", "prompt_2", "prompt_3"]
    for k, n in ((0, 6), (1, 6), (2, 3), (3, 3)):
        assert ids[f"prompt_{k}"].tolist() == _solo(llama, k, 6)[0][:n], k
    for k, finish in ((0, "length"), (1, "length"), (2, "interrupted"), (3, "interrupted")):
        assert f"=== {k} ({finish}) ===\n{' '.join(map(str, _solo(llama, k, 6)[0][:6 if k < 2 else 3]))}\n" in printed
    assert "=== 4" not in printed
    assert re.search(r"^generated 18 tokens in [0-9.]+ s", err, re.M), err


def test_a_text_prompt_files_byte_order_mark_is_not_part_of_its_first_prompt(tmp_path):
    """A UTF-8 file with a byte-order mark (as editors write them): the mark was encoded into the
    first prompt's ids (3 more tokens with a byte-level tokenizer)."""
    from oi2jax.batch_generate import read_prompts
    path = tmp_path / "p.txt"
    path.write_bytes("\ufeffhello\nthere\n".encode("utf-8"))
    prompts = read_prompts(path, encode=lambda text: list(text.encode("utf-8")))
    assert [p.tolist() for p in prompts] == [list(b"hello"), list(b"there")]


def test_a_prompt_step_error_in_insert_leaves_the_slot_free(llama, monkeypatch):
    """(batch probe) An insert whose prompt step raised left the slot's earlier, finished result in
    `result(slot)`, where the docs say the slot stays free (None)."""
    batch = _batch(llama, 2)
    done = batch.insert(0, PROMPTS[0], max_tokens=1)
    assert batch.result(0) is done and done.finish == "length"

    def failing(ids, values):
        raise OiError("attention: valid length 0 is not in 1..16 (in step 1)")
    monkeypatch.setattr(batch, "_prefill", failing)
    with pytest.raises(OiError, match="in step 1"):
        batch.insert(0, PROMPTS[1])
    assert batch.result(0) is None and batch.active == []
