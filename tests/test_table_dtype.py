"""`table_dtype` (oi2jax/tables.py, docs/semantics.md "Table dtype"): a graph's float cache tables
stored in f16 or bf16. The option is the hand-written bf16-cache graph of docs/decode.md bit for
bit; an f16 KV cache matches the NumPy Llama whose K and V rows are rounded to f16 when cached,
prompt step and decode; the compiled program equals the interpreter; the tables hold half the
bytes; an op that cannot take the narrower values is an error with a note saying why; `generate
--kv-dtype` runs it."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError
from oi2jax.generation import Generator
from oi2jax.grammar.fmt import format_graph
from oi2jax.grammar.parse import parse
from oi2jax.model.convert import convert_hf
from oi2jax.tables import narrow_tables

from conftest import EXAMPLES, assert_matches, graph_ops, run_cli
from hf_ref import FamilyRef, write_family
from test_attention_filled import SIZES, STEPS, TOL, bf16_cache_form


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("table_dtype")
    ck, weights, config = write_family(d / "ck", "llama", seed=3, **SIZES)
    convert_hf(ck, d / "m.oinf")
    return d / "m.oinf", weights, config


def _tokens(config, n: int, seed: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, config["vocab_size"], n).astype(np.int32)


class _Rounded(list):
    """The reference's per-layer K or V rows, each stored as the program stores it: f32, then `dtype`."""

    def __init__(self, rows, dtype):
        super().__init__(rows)
        self.dtype = dtype

    def __setitem__(self, i, rows):
        super().__setitem__(i, rows.astype(np.float32).astype(self.dtype).astype(np.float64))


def _rel(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


def test_the_option_is_the_hand_written_bf16_cache_bit_for_bit(llama, tmp_path):
    model, _, config = llama
    (tmp_path / "g.oi").write_text(bf16_cache_form((EXAMPLES / "llama_decode.oi").read_text()))
    hand = oi2jax.compile(tmp_path / "g.oi", model=model, ops=["nn"]).session()
    option = oi2jax.compile(EXAMPLES / "llama_decode.oi", model=model, ops=["nn"], table_dtype="bf16").session()
    for tok in _tokens(config, STEPS):
        want, got = hand.step(token=tok), option.step(token=tok)
        assert_matches({"logits": got["logits"]}, {"logits": want["logits"]}, graph_ops(tmp_path / "g.oi"))
    for name in ("Kc", "Vc"):  # bit for bit on a CPU (conftest's EXACTNESS: a device's own entry elsewhere)
        assert option.state.caches[name].data.dtype == ml_dtypes.bfloat16
        assert_matches({name: np.asarray(option.state.caches[name].data)},
                       {name: np.asarray(hand.state.caches[name].data)}, graph_ops(tmp_path / "g.oi"))


def test_an_f16_cache_is_the_reference_with_f16_rows_prompt_step_then_decode(llama):
    model, weights, config = llama
    prompt = oi2jax.compile(EXAMPLES / "llama_prefill.oi", model=model, ops=["nn"], sizes={"S": 8}, table_dtype="f16")
    decode = oi2jax.compile(EXAMPLES / "llama_prefill.oi", model=model, ops=["nn"], sizes={"S": 1}, table_dtype="f16")
    state = decode.init_state()
    for name in ("Kc", "Vc"):  # the tables' bytes: 2 a value (f32: 4)
        assert state.caches[name].data.dtype == np.float16 and state.caches[name].data.itemsize == 2
    ref = FamilyRef(weights, config)
    ref.k, ref.v = _Rounded(ref.k, np.float16), _Rounded(ref.v, np.float16)
    tokens = _tokens(config, 6)
    sess = prompt.session()
    out = sess.step(tokens=np.concatenate([tokens, np.zeros(2, np.int32)]), n=np.int32(6))  # 6 real rows, 2 padding
    for tok in tokens:
        want = ref.step(int(tok))
    assert _rel(out["logits"], want) <= TOL, _rel(out["logits"], want)
    sess = decode.session(state=sess.state)
    for k, tok in enumerate(_tokens(config, STEPS - 6, seed=5)):
        got = sess.step(tokens=np.array([tok], np.int32))["logits"]
        want = ref.step(int(tok))
        assert _rel(got, want) <= TOL, (k, _rel(got, want))


def test_compiled_equals_the_interpreter(llama):
    """The interpreter runs the same rewritten graph (its nn ops' NumPy references: within TOL)."""
    model, _, config = llama
    kw = dict(model=model, ops=["nn"], table_dtype="f16")
    sess = oi2jax.compile(EXAMPLES / "llama_decode.oi", **kw).session()
    interp = oi2jax.compile(EXAMPLES / "llama_decode.oi", mode="interpret", **kw)
    for k, tok in enumerate(_tokens(config, 5)):
        got = sess.step(token=tok)["logits"]
        interp.run({"token": tok}, 1) if k == 0 else interp.step({"token": tok})
        want = interp.outputs()["logits"]
        assert _rel(got, want) <= TOL, (k, _rel(got, want))
    assert interp.outputs()["Kc"].dtype == np.float16


ADD_READ = """
dynamic { x: f32[4]; }
volatile { y: f32[4]; }
persistent { K(i): f32[4] @table @fixed(i=8); n: i32 @init(0); }
block entry {
    assign r: f32[4];
    cache.write x >> K[0];
    cache.read K[0] >> r;
    op add(x, r) >> y;
    return;
}
"""


def test_the_rewrite_as_written():
    """The graph a user would write by hand: the table declared f16, the read's temporary f16, a
    cast (with its temporary) before the write; the integer variable left as it is."""
    text = format_graph(narrow_tables(parse(ADD_READ), "f16"))
    assert "K(i): f16[4] @table @fixed(i=8);" in text and "n: i32 @init(0);" in text
    assert "assign x_f16: f16[4];" in text and "assign r: f16[4];" in text
    assert text.index("op cast(x, to=f16) >> x_f16;") < text.index("cache.write x_f16 >> K[0];")
    graph = parse(ADD_READ)
    assert narrow_tables(graph, None) is graph and narrow_tables(graph, "f32") is graph  # as declared: unchanged


def test_an_op_that_cannot_take_the_narrower_values_is_an_error_with_a_note(tmp_path, capsys):
    with pytest.raises(OiError) as err:
        oi2jax.compile(ADD_READ, table_dtype="f16")
    text = str(err.value)
    assert "op add input 1 has dtype f16, expected f32" in text
    assert "note: table_dtype f16 (--table-dtype / --kv-dtype) stores the cache tables K in f16" in text
    (tmp_path / "g.oi").write_text(ADD_READ)
    code, _, out = run_cli(capsys, "check", tmp_path / "g.oi", "--table-dtype", "bf16")
    assert code == 1 and f"{tmp_path / 'g.oi'}:9:15: error: op add input 1 has dtype bf16" in out and "note:" in out
    assert run_cli(capsys, "check", tmp_path / "g.oi", "--table-dtype", "f32")[0] == 0  # as declared
    with pytest.raises(OiError, match=r"unknown table dtype 'f8' \(expected one of f16, bf16, f32\)"):
        oi2jax.compile(ADD_READ, table_dtype="f8")
    with pytest.raises(SystemExit) as usage:  # a flag error: argparse's exit 2
        run_cli(capsys, "check", tmp_path / "g.oi", "--table-dtype", "f8")
    assert usage.value.code == 2 and "invalid choice: 'f8'" in capsys.readouterr().err


def test_generate_with_an_f16_kv_cache(llama, tmp_path, capsys, monkeypatch):
    model, weights, config = llama
    gen = Generator(model, kv_dtype="f16")
    assert all(p.init_state().caches["Kc"].data.dtype == np.float16 for p in gen.programs.values())
    ids = _tokens(config, 5)
    result = gen.generate(prompt_ids=ids, max_tokens=1, ignore_eos=True)  # the prompt's bucket step draws it
    sess = gen.programs[1].session()  # the same token, token by token through the f16-cache decode step
    for tok in ids:
        want = [int(np.asarray(sess.step(tokens=np.array([tok], np.int32))["next"])[0])]
    assert result.ids == want
    # the CLI's --kv-dtype reaches the Generator (this one, its programs compiled once)
    from oi2jax import generation
    made = []

    def shared(path, graph=None, **options):
        made.append(options)
        return gen
    monkeypatch.setattr(generation, "Generator", shared)
    np.save(tmp_path / "ids.npy", ids)
    code, out, err = run_cli(capsys, "generate", model, "--prompt-ids", tmp_path / "ids.npy", "--kv-dtype", "f16",
                             "--max-tokens", "1", "--ignore-eos", "--ids-out", tmp_path / "out.npy")
    assert code == 0, err
    assert [m["kv_dtype"] for m in made] == ["f16"] and np.load(tmp_path / "out.npy").tolist() == want
