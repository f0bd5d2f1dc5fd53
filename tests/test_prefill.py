"""The prompt in one step (issue 40, item 1): examples/llama_prefill.oi takes S tokens in one step
(S=1: the decode step) on a random converted Llama, against the NumPy Llama (tests/llama_ref.py)
and against token-by-token steps; decode goes on from the prompt step's state; the prompt
lengths that fall in one bucket S compile once; a prompt past the cache is an error naming its
step; the new constructs (slice writes, per-row rope positions and softmax lengths, `positions`)
agree compiled and interpreted; the S-row nn op attention against its NumPy reference; each
family's prefill graph (mistral, qwen2, qwen3, gemma2, gemma3_text, gpt2) against its NumPy
reference, prompt step then decode."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError

from conftest import EXAMPLES, assert_matches
from llama_ref import converted_random_llama, forward_full

GRAPH = EXAMPLES / "llama_prefill.oi"
SIZES = dict(vocab=64, hidden=32, layers=2, heads=8, kv_heads=4, intermediate=48, max_positions=40)
BUCKET = 16
TOL = 1e-4  # |logit - reference| / max |reference logit| (the bound)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    model, weights, config = converted_random_llama(tmp_path_factory.mktemp("prefill"), seed=3, **SIZES)
    prompt = oi2jax.compile(GRAPH, model=model, ops=["nn"], sizes={"S": BUCKET})
    decode = oi2jax.compile(GRAPH, model=model, ops=["nn"], sizes={"S": 1})
    return prompt, decode, model, weights, config


def _rel(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


def _padded(tokens, s: int = BUCKET) -> np.ndarray:
    out = np.full(s, 7, np.int32)  # padding ids: any, they change no real row
    out[:len(tokens)] = tokens
    return out


def _tokens(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SIZES["vocab"], n).astype(np.int32)


def _one_by_one(decode, tokens):
    """Token-by-token steps of the S=1 program: (session, [steps, V] logits)."""
    sess = decode.session()
    rows = [np.asarray(sess.step(tokens=np.array([t], np.int32))["logits"]) for t in tokens]
    return sess, np.stack(rows)


def _greedy(sess, first: int, steps: int):
    """Greedy decode from `first` with S=1 steps: (tokens, [steps, V] logits)."""
    toks, logits, tok = [], [], first
    for _ in range(steps):
        out = sess.step(tokens=np.array([tok], np.int32))
        logits.append(np.asarray(out["logits"]))
        tok = int(np.asarray(out["next"])[0])
        toks.append(tok)
    return toks, np.stack(logits)


def test_prompt_step_matches_the_numpy_llama_and_token_by_token(llama):
    """`logits` is the last real row's: a prompt of m tokens gives row m-1 of the full forward
    pass and of the token-by-token run, for every m of the bucket tried."""
    prompt, decode, _, weights, config = llama
    tokens = _tokens(11)
    full = forward_full(weights, config, tokens)
    one, by_one = _one_by_one(decode, tokens)
    assert _rel(by_one, full) <= TOL
    for m in (1, 6, 11):
        sess = prompt.session()
        out = sess.step(tokens=_padded(tokens[:m]), n=np.int32(m))
        got = np.asarray(out["logits"])
        assert got.shape == (SIZES["vocab"],)
        assert _rel(got, full[m - 1]) <= TOL and _rel(got, by_one[m - 1]) <= TOL
        assert np.asarray(out["next"]).tolist() == [int(np.argmax(got))]  # temperature 0: argmax
    assert int(sess.read("pos")) == 11 == int(one.read("pos"))
    kc, kc_one = sess.read("Kc"), one.read("Kc")
    assert _rel(kc[:, :11], kc_one[:, :11]) <= TOL
    assert not kc[:, 11:].any() and not sess.read("Vc")[:, 11:].any()  # no padding row written


def test_padding_changes_no_real_row(llama):
    prompt, *_ = llama
    tokens = _tokens(5, seed=1)
    a = prompt.session()
    la = np.asarray(a.step(tokens=_padded(tokens), n=np.int32(5))["logits"])
    b = prompt.session()
    other = _padded(tokens)
    other[5:] = _tokens(BUCKET - 5, seed=9)
    lb = np.asarray(b.step(tokens=other, n=np.int32(5))["logits"])
    assert np.array_equal(la, lb)
    assert np.array_equal(a.read("Kc"), b.read("Kc")) and np.array_equal(a.read("Vc"), b.read("Vc"))


def test_sampling_settings_are_runtime_values(llama):
    """`next` is the nn op sample's draw from the last real row's logits at position pos + n
    (its NumPy reference, same noise); changing the settings compiles nothing."""
    from oi2jax.ops.nn.sampling import _sample_ref
    prog, *_ = llama
    tokens = _padded(_tokens(9, seed=3))
    settings = [dict(), dict(temperature=1.0, seed=4), dict(temperature=0.8, top_k=5, seed=1),
                dict(temperature=1.5, top_p=0.7, min_p=0.05, seed=2)]
    compiled = None
    for kw in settings:
        sess = prog.session()
        sess.step(tokens=tokens, n=np.int32(4))  # pos 4: the draw is at position 4 + 9
        assert int(sess.read("pos")) == 4  # checked: the next step takes the clean kernel form, every time
        typed = {k: (np.int32 if k in ("top_k", "seed") else np.float32)(v) for k, v in kw.items()}
        out = sess.step(tokens=tokens, n=np.int32(9), **typed)
        want = _sample_ref(np.asarray(out["logits"]), position=13, **{"temperature": 0.0, **kw})
        assert np.asarray(out["next"]).tolist() == [int(want)], kw
        compiled = prog.compiles if compiled is None else compiled
        assert prog.compiles == compiled, prog.compile_log


def test_decode_after_a_prompt_step_equals_decode_after_token_by_token(llama):
    prompt, decode, _, weights, config = llama
    tokens = _tokens(13, seed=2)
    sess = prompt.session()
    first = int(np.asarray(sess.step(tokens=_padded(tokens), n=np.int32(13))["next"])[0])
    after_prompt = decode.session(state=sess.state)  # the same state goes on with 1-token steps
    toks, logits = _greedy(after_prompt, first, 8)
    one, by_one = _one_by_one(decode, tokens)
    assert first == int(np.argmax(by_one[-1]))
    toks_one, logits_one = _greedy(one, first, 8)
    assert toks == toks_one
    assert _rel(logits, logits_one) <= TOL
    seq = np.concatenate([tokens, [first], toks[:-1]]).astype(np.int32)
    assert _rel(logits, forward_full(weights, config, seq)[13:]) <= TOL
    assert int(after_prompt.read("pos")) == 21


def test_the_hand_written_prefill_is_the_same_math(llama):
    """benchmarks/llama_prompt.py's baseline (benchmarks/handwritten/llama.py `prefill`: one jitted
    causal step) gives the prompt step's logits, next token and K/V rows."""
    from benchmarks.handwritten.llama import LlamaJax
    prompt, _, model, weights, config = llama
    tokens = _tokens(BUCKET, seed=11)
    hand = LlamaJax.from_model(model)
    (k, v), logits, nxt = hand.prefill(hand.params, hand.init_cache(), tokens)
    sess = prompt.session()
    out = sess.step(tokens=tokens, n=np.int32(BUCKET))
    assert _rel(logits, forward_full(weights, config, tokens)[-1]) <= TOL
    assert _rel(out["logits"], np.asarray(logits, np.float64)) <= TOL
    assert np.asarray(out["next"]).tolist() == [int(nxt)]
    assert _rel(sess.read("Kc")[:, :BUCKET], np.asarray(k)[:, :BUCKET]) <= TOL
    assert _rel(sess.read("Vc")[:, :BUCKET], np.asarray(v)[:, :BUCKET]) <= TOL


def test_prompts_of_several_lengths_in_one_bucket_compile_once(llama):
    _, _, model, *_ = llama
    prog = oi2jax.compile(GRAPH, model=model, ops=["nn"], sizes={"S": BUCKET})
    prog.session().step(tokens=_padded(_tokens(3)), n=np.int32(3))
    compiled = prog.compiles
    assert compiled >= 1
    for n in (1, 6, 9, 15, 16):
        sess = prog.session()
        sess.step(tokens=_padded(_tokens(n, seed=n)), n=np.int32(n))
        assert int(sess.read("pos")) == n
    assert prog.compiles == compiled, prog.compile_log


def test_a_prompt_past_the_cache_is_an_error_naming_its_step(llama):
    prompt, *_ = llama
    sess = prompt.session()
    sess.step(tokens=_padded(_tokens(16)), n=np.int32(16))
    sess.step(tokens=_padded(_tokens(16, seed=4)), n=np.int32(16))  # 32 of T=40 positions
    with pytest.raises(OiError) as exc:
        sess.step(tokens=_padded(_tokens(9, seed=5)), n=np.int32(9))  # 41 > 40
        sess.read("pos")
    assert exc.value.step == 3
    assert "slice end 41 is past its fixed size 40 (in step 3)" in str(exc.value)
    assert not sess.read("Kc")[:, 32:].any()  # the failing write is skipped whole, never clamped


def test_more_real_tokens_than_rows_is_an_error(llama):
    prompt, *_ = llama
    sess = prompt.session()
    with pytest.raises(OiError, match=r"cache.write Kc: slice of 17 rows, but the value holds 16 \(in step 1\)"):
        sess.step(tokens=_padded(_tokens(16)), n=np.int32(17))
        sess.read("pos")


def _both(source, steps, exact=True, **kw):
    """Step by step, compiled (a session) and interpreted: (outputs, error text) of each; the
    interpreter's error gets its step number as a compiled guard's has. Equal bit for bit, or
    (`exact=False`: the interpreter runs the nn ops' NumPy references) floats within TOL."""
    comp, interp = oi2jax.compile(source, **kw), oi2jax.compile(source, mode="interpret", **kw)
    results = []
    sess = comp.session()
    try:
        for inputs in steps:
            sess.step(**inputs)
        results.append(({name: sess.read(name) for name in interp.run(steps[0], 0)}, None))
    except OiError as exc:
        results.append((None, str(exc)))
    try:
        interp.run(steps[0], 1)
        for k, inputs in enumerate(steps[1:], start=2):
            try:
                interp.step(inputs)
            except OiError as exc:
                raise exc.in_step(k) from None
        results.append((interp.outputs(), None))
    except OiError as exc:
        results.append((None, str(exc)))
    (a, err_a), (b, err_b) = results
    assert err_a == err_b, (err_a, err_b)
    if a is not None and exact:
        assert_matches(a, b)  # bit for bit on a CPU
    elif a is not None:
        assert set(a) == set(b)
        for name in a:
            if a[name].dtype.kind == "f" and np.any(b[name]):
                assert _rel(a[name], b[name]) <= TOL, name
            else:
                assert np.array_equal(a[name], b[name]), name
    return a, err_a


def test_interpreter_agrees_on_a_prompt_step_then_a_second(llama):
    _, _, model, weights, config = llama
    tokens = [_padded(_tokens(3), 4), _padded(_tokens(4, seed=6), 4)]
    steps = [{"tokens": t, "n": np.int32(n)} for t, n in zip(tokens, (3, 4))]
    out, _ = _both(GRAPH, steps, exact=False, model=model, ops=["nn"], sizes={"S": 4})
    assert int(out["pos"]) == 7
    seq = np.concatenate([tokens[0][:3], tokens[1]])
    assert _rel(out["logits"], forward_full(weights, config, seq)[-1]) <= TOL


ROWS = """
constant { w: f32[2, 8] @init(0.5); }
dynamic { x: f32[3, 2]; n: i32; }
volatile { y: f32[5, 2]; z: f32[3, 8]; r: f32[3, 2, 4] @init(0.25); ps: i32[3]; one: i32 @init(1); v: i32[3]; }
persistent {
    pos: i32 @init(POS);
    end: i32 @init(0);
    K(layer, slot): f32[2] @table @fixed(layer=2, slot=5);
}
block entry {
    assign p: i32;
    assign e: i32;
    assign s: f32[3, 8];
    cache.read pos >> p;
    op add(p, n) >> e;
    cache.write e >> end;
    cache.write x >> K[1, pos..end];
    cache.write e >> pos;
    cache.read K[1] >> y;
    op positions(p, shape=[3]) >> ps;
    op add(ps, one) >> v;
    op matmul(x, w) >> s;
    op softmax(s, valid=v, window=2) >> z;
    op rope(r, ps) >> r;
    return;
}
"""


@pytest.mark.parametrize("pos, ns, error", [
    (0, [2, 2], None),
    (0, [3, 3], "dimension 1 of K: slice end 6 is past its fixed size 5 (in step 2)"),
    (1, [0, 2], None),
    (0, [5, 0], "cache.write K: slice of 5 rows, but the value holds 3 (in step 1)"),
    (4, [1, 0], None),                                   # no real token: nothing written, pos stays
    (0, [4, 1], "cache.write K: slice of 4 rows, but the value holds 3 (in step 1)"),
    (2, [1, -2], "slice end 1 before start in K (in step 2)"),
])
def test_row_constructs_compiled_equal_interpreted(pos, ns, error):
    rng = np.random.default_rng(pos)
    steps = [{"x": rng.standard_normal((3, 2)).astype(np.float32), "n": np.int32(n)} for n in ns]
    out, err = _both(ROWS.replace("POS", str(pos)), steps, exact=False, ops=["nn"], model=False)
    if error is None:
        assert err is None and int(out["pos"]) == pos + sum(ns)
    else:
        assert err is not None and error in err, err


SAME_ROWS = """
dynamic { x: f32[3, 2]; n: i32; go: bool; }
persistent {
    pos: i32 @init(POS);
    end: i32 @init(0);
    K(layer, slot): f32[2] @table @fixed(layer=2, slot=5);
    V(layer, slot): f32[2] @table @fixed(layer=2, slot=5);
}
block entry {
    assign p: i32;
    assign e: i32;
    cache.read pos >> p;
    op add(p, n) >> e;
    cache.write e >> end;
    branch go early late;
    return;
}
block early {
    cache.write x >> V[1, pos..end];
    return;
}
block late {
    loop layers (l in 0..2) {
        cache.write x >> K[l, pos..end];
        cache.write x >> V[l, pos..end];
    }
    cache.write x >> V[1, pos..end];
    cache.write e >> pos;
    return;
}
"""


@pytest.mark.parametrize("unroll, checks", [("full", 8), ("none", 12)])
@pytest.mark.parametrize("pos, n, go, error", [
    (0, 3, False, None),
    (3, 3, False, "dimension 1 of K: slice end 6 is past its fixed size 5"),   # the first write's check
    (0, 4, False, "cache.write K: slice of 4 rows, but the value holds 3"),
    (3, 3, True, "dimension 1 of V: slice end 6 is past its fixed size 5"),    # the branch's own write
])
def test_the_same_rows_are_checked_once_per_trace_and_still_first(pos, n, go, error, unroll, checks):
    """A write of rows pos..end is checked where it first happens in straight-line code; the same
    rows written again at the same trace level (another layer of an unrolled loop, the V beside
    the K) make no second check -- the first one already decides which error comes first -- and
    the error is the one the interpreter raises. A check inside a branch or a loop body is that
    body's: the writes after it keep theirs. Counted as the lowering's error sites for rows (4
    per check): the branch's V, then the loop's first K write and, when the loop is a
    `fori_loop`, the V write after it."""
    steps = [{"x": np.ones((3, 2), np.float32), "n": np.int32(n), "go": np.bool_(go)}]
    source = SAME_ROWS.replace("POS", str(pos))
    prog = oi2jax.compile(source, model=False, unroll=unroll)
    sess, interp = prog.session(), oi2jax.compile(source, model=False, mode="interpret")
    try:
        sess.step(**steps[0])
        got = {name: sess.read(name) for name in ("pos", "K", "V")}  # a read raises the step's error
        err = None
    except OiError as exc:
        err = str(exc)
    try:
        interp.run(steps[0], 1)
        want = None
    except OiError as exc:
        want = str(exc)
    assert err == want, (err, want)
    if error is None:
        assert int(got["pos"]) == pos + n
        np.testing.assert_array_equal(got["K"], interp.outputs()["K"])
        np.testing.assert_array_equal(got["V"], interp.outputs()["V"])
    else:
        assert err is not None and error in err, err
    rows = [site.message for site in prog.executable.lowering.error_sites
            if any(part in site.message for part in ("slice start", "before start", "rows, but", "slice end"))]
    assert len(rows) == checks, rows


def _row_samples(name):
    """Per-row cases of rope and softmax (test_nn_ops holds at most five samples per dtype)."""
    from oi2jax.ops.nn._common import float_samples

    def rope(rng, d):
        inv = float_samples(rng, d, (4,), 0.1) ** 2
        return [((float_samples(rng, d, (3, 2, 8), 1.0), np.array([4, 5, 6], np.int32), inv), {}),
                ((float_samples(rng, d, (3, 2, 8), 1.0), np.array([[0, 7], [1, 9], [2, 30]], np.int32)), {})]

    def softmax(rng, d):
        masked = float_samples(rng, d, (3, 5), 2.0)
        masked[0, 4] = np.nan  # past row 0's valid length: never read
        return [((float_samples(rng, d, (2, 3, 5), 2.0),), {"valid": np.array([3, 4, 5], np.int32)}),  # causal rows
                ((masked,), {"valid": np.array([2, 3, 5], np.int32), "window": 2}),
                ((float_samples(rng, d, (4, 3), 2.0),), {"axis": 0, "valid": np.array([1, 4, 5], np.int32)})]  # error
    def attention(rng, d):
        def f(*shape):
            return float_samples(rng, d, shape, 1.0)
        rows = np.array([3, 4, 5], np.int32)  # a prompt step of 3 rows at pos 2: row i reads 0..2+i
        return [((f(3, 2, 2, 4), f(7, 2, 4), f(7, 2, 4)), {"valid": rows, "block": 2}),
                ((f(3, 2, 2, 4), f(7, 2, 4), f(7, 2, 4)), {"valid": rows, "window": np.array(2, np.int32), "block": 2}),
                ((f(3, 1, 2, 4), f(2, 9, 1, 4), f(2, 9, 1, 4)),   # blocks of 4 of 9: the last read at 5..8
                 {"layer": np.array(1, np.int32), "valid": np.array([6, 8, 9], np.int32), "block": 4,
                  "softcap": np.array(2.0, np.float32), "window": 5}),
                ((f(2, 2, 1, 4), f(5, 2, 4), f(5, 2, 4)), {"valid": np.array(4, np.int32)}),  # one length for all rows
                ((f(3, 2, 1, 4), f(5, 2, 4), f(5, 2, 4)), {"valid": np.array([2, 6, 3], np.int32)})]  # an error: 6
    return {"rope": rope, "softmax": softmax, "attention": attention}[name]


@pytest.mark.parametrize("name", ["rope", "softmax", "attention"])
def test_per_row_positions_and_lengths_against_the_references(name):
    """test_nn_ops's kernel-against-NumPy check, on per-row `pos` and `valid` (attention: S query
    rows, each its own causal length, with windows, soft-capping and a stacked cache)."""
    import dataclasses

    from test_nn_ops import NN_OPS, assert_close, cases_for, out_shape, reference_of, run_cases
    op_def = dataclasses.replace(NN_OPS[name], samples=_row_samples(name))
    cases = cases_for(op_def)
    got, fired = run_cases(op_def, cases)
    assert any(fired) == (name != "rope")
    for c, g, errs in zip(cases, got, fired):
        what = f"{name}[{c['in_dtypes']} {c['attrs']}]"
        want, want_errs = reference_of(op_def, c)
        assert errs == want_errs, what
        assert tuple(g.shape) == tuple(out_shape(op_def, c)), what
        if not errs:
            assert_close(g, want, name, c["sig"].out_dtype, what)


@pytest.mark.parametrize("decl, write, message", [
    ("K(i): f32[2] @table @fixed(i=4);", "cache.write x >> K[0..2];", "cache.write K does not support slice indices"),
    ("K(i, j): f32[2] @table @fixed(i=4, j=4);", "cache.write r >> K[0..2, 0..2];",
     "cache.write K: a write takes at most one slice index, got 2"),
    ("K(i): f32[2] @table @fixed(i=4);", "cache.write r >> K[1..];", "cache.write K: a slice write names both ends (a..b)"),
    ("K(i): f32[2] @table @fixed(i=4);", "cache.write r >> K[0..-1];",
     "cache.write K: a slice write's end cannot be negative"),
    ("K(i): f32[2] @table;", "cache.write r >> K[0..2];",
     "cache.write K: a slice write needs every table dimension @fixed (i is not)"),
    ("K(i): f32[3] @table @fixed(i=4);", "cache.write r >> K[0..2];",
     "cache.write K: a slice write takes S rows of [3] (shape [S] + [3]), got [3, 2]"),
])
def test_slice_write_check_errors(decl, write, message):
    src = (f"dynamic {{ x: f32[2]; r: f32[3, 2]; }}\npersistent {{ {decl} }}\n"
           f"block entry {{\n    {write}\n    return;\n}}\n")
    with pytest.raises(OiError) as exc:
        oi2jax.compile(src, model=False)
    assert message in str(exc.value) and ":4:" in str(exc.value), str(exc.value)


FAMILIES = {  # model_type: (its prefill graph, checkpoint settings)
    "mistral": ("mistral_prefill.oi", dict(sliding_window=3)),  # a window shorter than the run
    "qwen2": ("qwen2_prefill.oi", dict(tied=True)),
    "qwen3": ("qwen3_prefill.oi", dict(head_dim=16)),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """A tiny random checkpoint of the family (tests/hf_ref.py), converted; T = 16."""
    from hf_ref import write_family

    from oi2jax.model.convert import convert_hf
    tmp = tmp_path_factory.mktemp(request.param)
    prefill, kw = FAMILIES[request.param]
    ck, weights, config = write_family(tmp / "ck", request.param, seed=5, vocab=48, hidden=32, layers=2, heads=4,
                                       kv_heads=2, intermediate=40, max_positions=16, **kw)
    convert_hf(ck, tmp / "m.oinf")
    return tmp / "m.oinf", weights, config, EXAMPLES / prefill


def _prompt_then_decode(model, graph, ref, vocab: int):
    """A prompt of 7 tokens in one S=8 step, then 4 decode steps (S=1) from its state: the last
    real row's logits and every decode step's against `ref.step` (a NumPy reference fed the same
    tokens one by one), greedy `next` equal to its argmax."""
    prompt = oi2jax.compile(graph, model=model, ops=["nn"], sizes={"S": 8})
    decode = oi2jax.compile(graph, model=model, ops=["nn"], sizes={"S": 1})
    tokens = np.random.default_rng(8).integers(0, vocab, 7).astype(np.int32)
    want = [ref.step(int(t)) for t in tokens][-1]
    sess = prompt.session()
    out = sess.step(tokens=_padded(tokens, 8), n=np.int32(7))
    assert _rel(np.asarray(out["logits"]), want) <= TOL
    tok = int(np.asarray(out["next"])[0])
    assert tok == int(np.argmax(out["logits"]))
    dec = decode.session(state=sess.state)
    for _ in range(4):  # decode (past the windows), from the prompt step's state
        logits = np.asarray(dec.step(tokens=np.array([tok], np.int32))["logits"])
        assert _rel(logits, ref.step(tok)) <= TOL
        tok = int(np.argmax(logits))
    assert int(dec.read("pos")) == 11


def test_family_prompt_step_matches_the_reference(family):
    """The prompt step and decode after it, per family, against the NumPy reference (which
    test_families holds each family's decode graph to); mistral's window composes with the per-row
    lengths (each prompt row sees its own last 3 positions)."""
    from hf_ref import FamilyRef
    model, weights, config, graph = family
    _prompt_then_decode(model, graph, FamilyRef(weights, config), 48)


@pytest.mark.parametrize("name", ["gemma2", "gemma3_text", "gpt2"])
def test_gemma_gpt2_prompt_step_matches_the_reference(name, tmp_path):
    """gemma2 (soft-capped scores and logits, sliding-window layers alternating with full ones),
    gemma3_text (per-head q/k norms, a rotary embedding per layer type) and gpt2 (learned
    positions, one query head per kv head) against their NumPy references (tests/gemma_gpt2_ref.py)."""
    import gemma_gpt2_checkpoints
    from test_convert_gemma_gpt2 import config_of, reference

    from oi2jax.model.convert import convert_hf
    config = config_of(name)
    weights = gemma_gpt2_checkpoints.random_weights(config, seed=7)
    convert_hf(gemma_gpt2_checkpoints.write_checkpoint(tmp_path / "ck", config, weights), tmp_path / "m.oinf",
               max_positions=20 if name == "gpt2" else None)
    _prompt_then_decode(tmp_path / "m.oinf", EXAMPLES / f"{name}_prefill.oi", reference(name, weights, config), 64)
