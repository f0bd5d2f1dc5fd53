"""Checker: one failing program per rule, asserting the message and its exact line:column."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax

from oi2jax import ir
from oi2jax.check import check, check_or_raise
from oi2jax.diagnostics import OiError
from oi2jax.grammar import parse
from oi2jax.model.reader import TensorInfo

from conftest import REPO, WIDEN_HINT

HEAD = """\
dynamic { x: f32[4]; c: bool; n: i32; m: f32[2, 3]; }
volatile { v: f32[4]; w: f32[4]; h: i8[4]; }
constant { k: f32[4]; W(l): f32[4] @pattern("w.{l}"); }
persistent { s: i32 @init(0); f: f32 @init(0.0); P: f32[4]; T(i): f32[4] @table @fixed(i=3);
  A(r, q): f32[2, 2] @auto_dim(r, q); }
"""  # 5 lines: block bodies start on line 6


def diags(body: str, head: str = HEAD, **kw):
    g = parse(head + body, "t.oi")
    return check(g, **kw)


def errors(body: str, **kw):
    return [(d.span.line, d.span.col, d.message) for d in diags(body, **kw) if d.severity == "error"]


def test_valid_head_program_is_clean():
    assert diags("block entry {\n  op add(x, k) >> v;\n  return;\n}\n") == []


@pytest.mark.parametrize("body,line,col,message", [
    # ops (messages from oi2jax.ops)
    ("block entry {\n  op frob(x) >> v;\n}", 7, 6, "unsupported op frob"),
    ("block entry {\n  op add(x) >> v;\n}", 7, 6, "op add expects Fixed(2) inputs, got 1"),
    # a surplus literal input is the arity's error, not the literal's dtype (`write 2.0`, then the arity)
    ("block entry {\n  op neg(x, 2) >> v;\n}", 7, 6, "op neg expects Fixed(1) inputs, got 2"),
    ("block entry {\n  op add(x, 1.0, 2) >> v;\n}", 7, 6, "op add expects Fixed(2) inputs, got 3"),
    ("block entry {\n  op add(x, q) >> v;\n}", 7, 13, "unknown input variable q"),
    ("block entry {\n  op add(x, k) >> zz;\n}", 7, 19, "unknown output variable zz"),
    ("block entry {\n  op add(x, k) >> k;\n}", 7, 19, "cannot write to constant memory: k"),
    ("block entry {\n  op add(x, k) >> P;\n}", 7, 19, "persistent cache P must be written via cache.write"),
    ("block entry {\n  op add(x, P) >> v;\n}", 7, 13, "persistent cache P must be read via cache.read"),
    ("block entry {\n  op add(x, k, frob=1) >> v;\n}", 7, 16, "unsupported add setting: frob"),
    ("block entry {\n  op relu(x, alpha=[1]) >> v;\n}", 7, 14, "unsupported relu setting type: alpha"),
    ("block entry {\n  op relu(x, alpha=zz) >> v;\n}", 7, 14, "unknown attribute variable zz"),
    ("block entry {\n  op relu(x, alpha=m) >> v;\n}", 7, 14, "attribute m must be scalar"),
    ("block entry {\n  op add(x, h) >> v;\n}", 7, 13, "input 1 has dtype i8, expected f32"),
    ("block entry {\n  op add(x, k) >> h;\n}", 7, 19, "op add output dtype mismatch for h: expected i8, got f32"),
    ("block entry {\n  op add(x, m) >> v;\n}", 7, 6, "incompatible broadcast dims"),
    ("block entry {\n  op add(m, m) >> v;\n}", 7, 19, "op add output shape mismatch for v"),
    ("block entry {\n  op add(x, k, acc=i32) >> v;\n}", 7, 16, "op add does not support f32 -> i32 for mode accumulate"),
    ("block entry {\n  op add(W[0, 1], k) >> v;\n}", 7, 10, "prefix table W expects 1 indices, got 2"),
    # a family named without its index: the checker typed the member, the backends read the family
    ("block entry {\n  op add(W, k) >> v;\n}", 7, 10, "prefix table W expects 1 index, got none: name one member (W[l])"),
    ("block entry {\n  transfer W >> v;\n}", 7, 12, "prefix table W expects 1 index, got none"),
    ("block entry {\n  cache.write W >> P;\n}", 7, 15, "prefix table W expects 1 index, got none"),
    ("block entry {\n  op add(v[0], k) >> v;\n}", 7, 10, "v is not a prefix table and cannot be indexed"),
    ("block entry {\n  loop L (i in 0..2) {\n    op add(i, k) >> v;\n  }\n}", 8, 12, "loop index i is not a variable"),
    # transfer
    ("block entry {\n  transfer q >> v;\n}", 7, 12, "unknown transfer source q"),
    ("block entry {\n  transfer x >> q;\n}", 7, 17, "unknown transfer destination q"),
    ("block entry {\n  transfer x >> k;\n}", 7, 17, "cannot transfer into k"),
    ("block entry {\n  transfer x >> h;\n}", 7, 17, "transfer dtype mismatch"),
    ("block entry {\n  transfer x >> f;\n}", 7, 17, "cannot transfer into f"),
    ("dynamic { y: f32[5]; }\nblock entry {\n  transfer x >> y;\n}", 8, 17, "transfer shape mismatch"),
    # cache (§4.7)
    ("block entry {\n  cache.read q >> v;\n}", 7, 14, "unknown cache variable q"),
    ("block entry {\n  cache.read w >> v;\n}", 7, 14, "cache.read expects persistent variable, got Volatile w"),
    ("block entry {\n  cache.write x >> v;\n}", 7, 20, "cache.write expects persistent variable, got Volatile v"),
    ("block entry {\n  cache.read T >> v;\n}", 7, 14, "cache table T requires indices"),
    ("block entry {\n  cache.read T[0, 1] >> v;\n}", 7, 14, "cache access T expects at most 1 indices, got 2"),
    ("block entry {\n  cache.read P[0, 1] >> v;\n}", 7, 14, "cache access expects at most 1 indices, got 2"),
    ("block entry {\n  cache.read A[0..1] >> m;\n}", 7, 14, "cache access A does not support slice indices"),
    ("block entry {\n  cache.read T[-1] >> v;\n}", 7, 14, "cache index cannot be negative"),
    ("block entry {\n  cache.read T[f] >> v;\n}", 7, 14, "cache index must be integer"),
    ("block entry {\n  cache.read T[n] >> v;\n}", 7, 14, "unknown cache index n"),
    ("block entry {\n  cache.read T[0] >> k;\n}", 7, 22, "cannot write to constant memory: k"),
    ("block entry {\n  cache.read T[0] >> h;\n}", 7, 22, "cache.read T -> h dtype mismatch"),
    ("block entry {\n  cache.read T[..] >> v;\n}", 7, 23, "cache.read T -> v shape mismatch: the read gives [3, 4], v is [4]"),
    ("block entry {\n  cache.read P[0] >> v;\n}", 7, 14, "cache P does not support indexed access"),
    ("block entry {\n  cache.write x >> T[0..2];\n}", 7, 20, "cache.write T does not support slice indices"),
    ("block entry {\n  cache.write x >> P[0];\n}", 7, 20, "cache.write P does not support indexed writes"),
    ("block entry {\n  cache.write h >> T[0];\n}", 7, 15, "cache.write h -> T dtype mismatch"),
    ("block entry {\n  cache.write m >> P;\n}", 7, 15, "cache.write P expects shape [4], got [2, 3]"),
    ("dynamic { y: f32[5]; }\nblock entry {\n  cache.write y >> T[0];\n}", 8, 15, "cache.write T expects shape [4], got [5]"),
    ("block entry {\n  cache.reset T[0..1];\n}", 7, 15, "cache.reset T requires scalar indices"),
    ("block entry {\n  cache.increment v;\n}", 7, 3, "cache.increment expects persistent variable, got Volatile v"),
    ("block entry {\n  cache.increment P;\n}", 7, 3, "cache.increment P requires a scalar persistent variable"),
    ("persistent { b: bool; }\nblock entry {\n  cache.decrement b;\n}", 8, 3, "cache.decrement b does not support dtype bool"),
    # control
    ("block entry {\n  branch nope;\n}", 7, 10, "branch target block not found: nope"),
    ("block entry {\n  branch zz entry entry;\n}", 7, 10, "unknown variable zz"),
    ("block entry {\n  branch x a a;\n}\nblock a { return; }", 7, 10, "x must be scalar"),
    ("block entry {\n  branch a;\n}\nblock a {\n  branch entry;\n}", 10, 3, "recursion through branches: entry -> a -> entry"),
    ("block entry {\n  loop L (i in x..3) { barrier; }\n}", 7, 16, "loop start bound x is invalid: x must be scalar"),
    ("block entry {\n  loop L (i in 0..2) {\n    loop M (j in 0..i) { barrier; }\n  }\n}", 8, 21, "loop end bound i is invalid: loop index i is not a variable"),
    ("block entry {\n  loop L (i in 0..2) {\n    loop M (i in 0..2) { barrier; }\n  }\n}", 8, 5, "loop index i shadows an enclosing loop index"),
    ("block entry {\n  branch a;\n}\nblock a {\n  return x;\n}", 10, 3, "return with values is only allowed at the top level of entry"),
    ("block entry {\n  loop L (i in 0..2) {\n    return x;\n  }\n}", 8, 5, "not inside a loop"),
    ("block entry {\n  return zz;\n}", 7, 3, "unknown variable: zz"),
    # declarations / structure
    ("volatile { x: f32; }\nblock entry { return; }", 6, 12, "duplicate variable declaration x"),
    ("block entry { return; }\nblock entry { return; }", 7, 1, "duplicate block entry"),
    ("block main { return; }", 1, 1, "graph has no entry block"),
    ("block entry {\n  assign x: f32;\n}", 7, 3, "assign shadows declared variable x"),
    ("block entry {\n  assign t: f32;\n  assign t: f32;\n}", 8, 3, "duplicate temporary t"),
    ("persistent { Q(i): f32 @table @table; }", 0, 0, None),
    ("persistent { R: f32 @table; }\nblock entry { return; }", 6, 21, "persistent table R missing table indices"),
    ("persistent { R(i): i4[2] @table; }\nblock entry { return; }", 6, 14, "cache table packed dtypes not supported"),
    ("volatile { z: f32 @init(5); }\nblock entry { return; }", 6, 19, "int init requires an integer, bool or bitset dtype"),
    ("volatile { z: i32 @init(5.0); }\nblock entry { return; }", 6, 19, "float init requires f8/bf16/f16/f32/f64 dtype"),
    ("volatile { z: i32 @init(true); }\nblock entry { return; }", 6, 19, "bool init requires bool dtype"),
    ("volatile { z: i8 @init(128); }\nblock entry { return; }", 6, 18, "i8 init out of range"),
    ("volatile { z: i4 @init(-9); }\nblock entry { return; }", 6, 18, "i4 init out of range"),
    ("volatile { z: bool @init(2); }\nblock entry { return; }", 6, 20, "bool init out of range"),
    ("volatile { z: t1 @init(0); }\nblock entry { return; }", 6, 18, "t1 init out of range"),
    ("volatile { z: u8 @init(-1); }\nblock entry { return; }", 6, 18, "u8 init out of range"),
    ("volatile { z(i): f32 @table; }\nblock entry { return; }", 6, 22, "@table is only allowed on persistent variables"),
    # yield / await
    ("block entry {\n  yield x;\n  yield x;\n  await x;\n}\nblock b {\n  await x;\n  yield x;\n}", 8, 3, "await required before next yield"),
    ("block entry {\n  await x;\n}", 7, 3, "await x has no matching yield"),
    ("block entry {\n  yield x;\n}\nblock b {\n  await x;\n  yield x;\n}", 7, 3, "yield x has no matching await"),
    ("block entry {\n  yield x;\n  await k;\n}", 8, 9, "await may not name constant k"),
    ("block entry {\n  yield zz;\n  await x;\n}", 7, 9, "unknown variable: zz"),
    ("block entry {\n  yield x;\n  await x;\n}\nblock b {\n  await x;\n  yield x;\n  barrier;\n}", 12, 3, "yield in block b must be the final node"),
    ("block entry {\n  yield x;\n  await x;\n}\nblock b {\n  await x;\n  barrier;\n}", 11, 3, "block b awaits [x] but never yields them"),
    ("block entry {\n  yield x, n;\n  await x, n;\n}\nblock b {\n  await x, n;\n  yield x;\n}", 11, 3, "block b awaits n but does not yield it"),
    ("block entry {\n  yield x;\n  op add(x, k) >> x;\n  await x;\n}\nblock b {\n  await x;\n  yield x;\n}", 8, 3, "entry writes yielded variable x between yield and await"),
])
def test_rule(body, line, col, message):
    if message is None:
        with pytest.raises(OiError, match="duplicate @table attribute"):
            parse(HEAD + body, "t.oi")
        return
    errs = errors(body)
    hits = [e for e in errs if message in e[2]]
    assert hits, errs
    assert (hits[0][0], hits[0][1]) == (line, col), errs


def test_two_consumers_mutating_same_var_names_both_places():
    body = ("block entry {\n  yield x;\n  await x;\n}\n"
            "block b1 {\n  await x;\n  op add(x, k) >> x;\n  yield x;\n}\n"
            "block b2 {\n  await x;\n  op mul(x, k) >> x;\n  yield x;\n}\n")
    ds = [d for d in diags(body) if d.severity == "error"]
    assert len(ds) == 1
    d = ds[0]
    assert d.message.startswith("multiple blocks mutated x")
    assert (d.span.line, d.span.col) == (17, 3)
    assert d.related[0][1] == ir.Span("t.oi", 12, 3) and "block b1" in d.related[0][0]


def test_consumer_and_entry_write_same_nonyielded_var():
    body = ("block entry {\n  yield x;\n  op add(x, k) >> v;\n  await x;\n}\n"
            "block b1 {\n  await x;\n  op mul(x, k) >> v;\n  yield x;\n}\n")
    ds = [d for d in diags(body) if d.severity == "error"]
    assert [(d.span.line, d.span.col) for d in ds] == [(13, 3)]
    assert ds[0].related[0] == ("v also written here (entry)", ir.Span("t.oi", 8, 3))


def test_dead_block_is_a_warning():
    ds = diags("block entry { return; }\nblock lost { return; }")
    assert [(d.severity, d.span.line, d.span.col) for d in ds] == [("warning", 7, 1)]
    assert "block lost is never run" in ds[0].message


def test_entry_await_list_that_differs_from_its_yield_is_a_warning():
    """Entry's await merges every yielded variable and waits for every consumer, whatever it names
    (§3.5): a name the yield did not list, or a yielded name left out, is told, not an error."""
    body = ("block entry {\n  yield x, v;\n  await x, w;\n  return;\n}\n"
            "block b1 {\n  await x, v;\n  op add(x, k) >> x;\n  yield x, v;\n}\n")
    ds = diags(body)
    assert [(d.severity, d.span.line, d.span.col) for d in ds] == [("warning", 8, 3)] * 2
    assert ds[0].message.startswith("entry awaits w, which its yield at line 7 does not yield: naming it selects nothing")
    assert ds[1].message.startswith("entry's await does not name v, which its yield at line 7 yields: merged")
    same = "block entry {\n  yield x;\n  await x;\n  return;\n}\nblock b1 {\n  await x;\n  yield x;\n}\n"
    assert diags(same) == []


@pytest.mark.parametrize("word", ["yield", "await"])
def test_a_name_listed_twice_is_a_warning(word):
    lists = {"yield": "x, x, x", "await": "x"} if word == "yield" else {"yield": "x", "await": "x, x"}
    body = (f"block entry {{\n  yield {lists['yield']};\n  await {lists['await']};\n  return;\n}}\n"
            "block b1 {\n  await x;\n  yield x;\n}\n")
    ds = diags(body)
    n = 3 if word == "yield" else 2
    assert [(d.severity, d.span.line, d.message) for d in ds] == [
        ("warning", 7 if word == "yield" else 8, f"{word} lists x {n} times: the same as once")]


def test_all_errors_reported_sorted():
    errs = errors("block entry {\n  op add(x, q1) >> v;\n  op add(x, q2) >> v;\n  branch nope;\n}")
    assert [(l, c) for l, c, _ in errs] == [(7, 13), (8, 13), (9, 10)]


def test_no_blocks():
    errs = errors("")
    assert (1, 1, "graph has no blocks") in errs


def test_duplicates_name_both_locations():
    d = [d for d in diags("volatile { x: f32; }\nblock entry { return; }") if d.severity == "error"][0]
    assert d.related == (("x first declared here", ir.Span("t.oi", 1, 11)),)


# ---------------------------------------------------------------- sizes and models

SIZED = "dynamic { x: f32[B, D]; }\nvolatile { y: f32[B, 3]; }\nblock entry {\n  op relu(x) >> y;\n}\n"


def test_unknown_sizes_are_fine_without_model():
    assert errors(SIZED, head="") == []


def test_shapes_checked_with_sizes():
    errs = errors(SIZED, head="", sizes={"B": 2, "D": 4})
    assert errs == [(4, 17, "op relu output shape mismatch for y: y is [2, 3], the result is [2, 4]")]


def test_unknown_size_with_sizes_is_error():
    errs = errors(SIZED, head="", sizes={"B": 2})
    assert (1, 11, "invalid dims for x: unknown size: D") in errs


class FakeModel:
    def __init__(self, sizevars=None, metadata=None, tensors=None):
        self.sizevars = sizevars or {}
        self.metadata = metadata or {}
        self.tensors = tensors or {}


def TI(dtype, shape):  # a model tensor as the checker reads it
    return TensorInfo("t", dtype, tuple(shape), True, 0, 0)


class MV:
    def __init__(self, type_, value=None):
        self.type, self.value = type_, value


MODEL_HEAD = ('dynamic { x: f32[D]; }\nconstant { w: f32[D]; c2: f32 @ref("zz"); missing: f32; '
              'F(l): f32[D] @pattern("f.{l}"); }\nvolatile { y: f32[D]; }\n')


def test_model_rules():
    model = FakeModel({"D": 4}, {}, {"w": TI("f16", (4,)), "x": TI("f32", (5,)), "f.0": TI("f32", (4,))})
    g = parse(MODEL_HEAD + "block entry {\n  op add(x, w) >> y;\n}\n", "t.oi")
    errs = [(d.span.line, d.span.col, d.message) for d in check(g, model=model) if d.severity == "error"]
    assert (1, 11, "model shape mismatch for x: model [5], graph [4]") in errs
    assert (2, 12, "model dtype mismatch for w: model f16, graph f32" + WIDEN_HINT) in errs
    assert (2, 31, "model variable not found: zz") in errs
    assert (2, 43, "constant missing not found in model (no tensor or metadata entry)") in errs
    assert not any("F" in e[2] for e in errs)


def test_model_constant_found_as_metadata_and_metadata_string_attr():
    model = FakeModel({}, {"mode": MV("string", "floor"), "q": MV("i32"), "bad": MV("string", "Floor")}, {})
    text = ("constant { q: i32; }\ndynamic { x: f32[2]; }\nvolatile { y: i32[2]; }\nblock entry {\n"
            "  op cast(x, to=i32, rounding_mode=mode) >> y;\n  op cast(x, to=i32, rounding_mode=nomode) >> y;\n"
            "  op cast(x, to=i32, rounding_mode=bad) >> y;\n}\n")
    errs = [(d.span.line, d.span.col, d.message) for d in check(parse(text, "t.oi"), model=model)
            if d.severity == "error"]
    # a metadata string that is no rounding mode is refused before the run (it failed inside the kernel)
    assert errs == [(6, 22, "unknown attribute string: nomode"),
                    (7, 22, "unsupported cast rounding_mode 'Floor', the model's metadata string bad (expected trunc, "
                            "floor, ceil or nearest); did you mean floor?")]


def test_check_or_raise():
    g = parse(HEAD + "block entry {\n  op frob(x) >> v;\n}\n", "t.oi")
    with pytest.raises(OiError) as info:
        check_or_raise(g)
    assert "t.oi:7:6: error: unsupported op frob" in info.value.render()
    assert check_or_raise(parse(HEAD + "block entry { return; }\nblock z { return; }")) [0].severity == "warning"


def test_examples_check_clean(shared):
    import glob
    from pathlib import Path
    from oi2jax.grammar import parse_file
    from oi2jax.ops import load
    files = sorted(glob.glob(str(Path(__file__).resolve().parent.parent / "examples" / "*.oi")))
    registry = load(["nn"])  # the Llama examples use the nn set; the SPEC examples check the same with it
    assert len(files) >= 12
    for f in files:
        assert [d for d in check(parse_file(f), ops=registry) if d.severity == "error"] == [], f


def test_loop_bound_unknown_is_error_once_sizes_are_known():
    body = "block entry {\n  loop L (i in 0..zz) { barrier; }\n}"
    assert errors(body) == []  # zz may be a size variable of a model bound later
    got = [(d.span and d.span.line, d.span and d.span.col, d.message) for d in diags(body, sizes={"N": 1})]
    assert got == [(None, None, "unknown size N: the graph and model sizes are zz"),
                   (7, 19, "loop end bound zz is invalid: unknown variable zz")]


def test_unknown_size_names_are_errors_with_suggestions(capsys):
    from oi2jax.cli import main
    graph = str(REPO / "examples" / "mlp_regression.oi")
    model = str(REPO / "examples" / "mlp_regression.oinf")
    assert main(["run", graph, "--model", model, "--size", "b=8", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "error: unknown size b (did you mean B?): the graph and model sizes are B, D, H, O"
    assert main(["check", graph, "--model", model, "--size", "Q=3"]) == 1
    assert "error: unknown size Q: the graph and model sizes are B, D, H, O" in capsys.readouterr().err
    assert main(["check", graph, "--model", model, "--size", "B=8"]) == 0


# ---------------------------------------------------------------- resize (BoundGraph.rebind, issue 38 item 5)

RESIZED = """dynamic { a: f32[T]; b: f32[S]; }
volatile { y: f32[T]; t: f32[N]; }
persistent { n: i32 @init(0); K(i): f32[T] @table; }
block entry {
    op add(a, b) >> y;
    op mul(y, 2.0) >> y;
    cache.write y >> K[n];
    op sum_axis(y, axes=[0], keepdims=true) >> t;
    cache.increment n;
    yield y;
    await y;
    return;
}
"""


def test_resize_retypes_the_ops_and_keeps_what_reads_no_size():
    from oi2jax.check import check_graph, resize
    checked = check_graph(parse(RESIZED), sizes={"T": 4, "S": 4, "N": 1})
    again = resize(checked, sizes={"T": 2, "S": 2, "N": 1})
    fresh = check_graph(parse(RESIZED), sizes={"T": 2, "S": 2, "N": 1})
    ops = [n for n in checked.graph.blocks[0].nodes if isinstance(n, ir.Op)]
    assert [again.op_sig(n).out_shape for n in ops] == [fresh.op_sig(n).out_shape for n in ops] == [(2,), (2,), (1,)]
    assert [checked.op_sig(n).out_shape for n in ops] == [(4,), (4,), (1,)]
    for kept in ("graph", "ops", "warnings", "yield_phases", "writes", "read_before_written", "runtime_shaped",
                 "literals"):
        assert getattr(again, kept) is getattr(checked, kept), kept


@pytest.mark.parametrize("sizes,message", [
    ({"T": 2, "S": 3, "N": 1}, "5:8: error: incompatible broadcast dims 2 and 3"),
    ({"T": 2, "S": 2, "N": 2}, "8:48: error: op sum_axis output shape mismatch for t: t is [2], the result is [1]"),
])
def test_resize_reports_what_the_new_sizes_break_as_the_checker_does(sizes, message):
    from oi2jax.check import check_graph, resize
    checked = check_graph(parse(RESIZED), sizes={"T": 4, "S": 4, "N": 1})
    with pytest.raises(OiError) as resized:
        resize(checked, sizes=sizes)
    with pytest.raises(OiError) as fresh:
        check_graph(parse(RESIZED), sizes=sizes)
    assert str(resized.value) == str(fresh.value) and message in str(resized.value)


def test_messages_for_a_model_that_lacks_a_name(tmp_path):
    """An unknown size in a dim suggests a close one; a constant missing from the model with an
    @init says that the @init is its value only without a model (helper probe, 2026-11-28)."""
    from oi2jax.check import check
    from oi2jax.grammar import parse
    from oi2jax.model import open_model, save
    save(tmp_path / "m.oinf", sizevars={"D": 4}, tensors={"w": np.ones(4, np.float32)})
    model = open_model(tmp_path / "m.oinf")
    graph = parse("dynamic { x: f32[Dd]; }\nconstant { one: f32 @init(1.0); w: f32[D]; }\nblock entry { return; }\n")
    messages = [d.message for d in check(graph, model=model)]
    assert any(m.startswith("invalid dims for x: unknown size: Dd (did you mean D?) (not a size variable of model")
               for m in messages), messages
    assert "constant one not found in model (no tensor or metadata entry) (its @init is its value only when no " \
           "model is given: add the tensor to the model, or declare it volatile, whose @init is its value at every " \
           "step and which ops read as they read a constant)" in messages, messages
    # the advice works: declared volatile, the @init is read by an op (a persistent one needs cache.read: an error)
    text = ("dynamic { x: f32[D]; }\nvolatile { one: f32 @init(1.0); y: f32[D]; }\n"
            "block entry { op add(x, one) >> y; return; }\n")
    assert [d.message for d in check(parse(text), model=model) if d.severity == "error"] == []
    out = oi2jax.compile(text, model=str(tmp_path / "m.oinf")).run({"x": np.float32([1, 2, 3, 4])})
    assert out["y"].tolist() == [2.0, 3.0, 4.0, 5.0]


def test_a_fixed_arity_error_names_the_inputs():
    """The SPEC's wording (`expects Fixed(k) inputs, got m`), then the op's inputs by name (the
    helper probe read `Fixed(3)` as an internal name, with nothing saying which three)."""
    diags = check(parse("dynamic { x: f32[2]; }\nvolatile { y: f32[2]; }\nblock entry { op add(x) >> y; return; }\n"))
    assert [d.message for d in diags if d.severity == "error"] == ["op add expects Fixed(2) inputs, got 1 (a, b)"], diags


def test_a_table_write_naming_fewer_indices_than_the_table_says_which():
    """SPEC §4.4: a missing position is a slice ("does not support slice indices", OpenInfer's
    words); the message goes on to say how many the table takes."""
    head = HEAD.replace("T(i): f32[4] @table @fixed(i=3);", "T(i, j): f32[4] @table @fixed(i=3, j=2);")
    assert errors("block entry {\n  cache.write x >> T[s];\n}", head=head) == [
        (7, 20, "cache.write T does not support slice indices (T takes 2 indices (i, j), the write names 1: "
                "a write replaces one entry)")]


def test_oi2jax_check_is_callable_once_its_module_is_imported():
    """`oi2jax.check` is the function (oi2jax.__all__); Python binds the submodule `oi2jax.check`
    over it once anything imports it (this file, the CLI, `oi2jax.compile`), and `oi2jax.check(g)`
    was then `TypeError: 'module' object is not callable` (frontend probe)."""
    import oi2jax
    g = parse("dynamic { x: f32; }\ndynamic { x: f32; }\nblock entry { return; }\n", "t.oi")
    for _ in range(2):  # the first access (the package's __getattr__) and every later one
        assert [d.message for d in oi2jax.check(g) if d.severity == "error"] == ["duplicate variable declaration x"]
    assert oi2jax.check.check_graph is not None  # still the module for its other names


@pytest.mark.parametrize("given", ["dynamic { x: f32; }\nblock entry { return; }\n", None, {"blocks": {}}])
def test_check_of_something_not_a_graph_is_an_oierror(given):
    """Program text given to `check` was `AttributeError: 'str' object has no attribute 'vars'`."""
    with pytest.raises(OiError) as info:
        check(given)
    assert str(info.value).startswith("error: check: expected a parsed graph (oi2jax.parse(text) or "
                                      "oi2jax.pipeline.load_graph(path)), got ")


@pytest.mark.parametrize("consumer", [
    "block c {\n  await x, y;\n  op add(x, y) >> z;\n}",
    "block c {\n  await x, y;\n  op add(x, y) >> z;\n  yield x;\n}",
    "block c {\n  await x, y;\n  yield x, y;\n  op add(x, y) >> z;\n}",
])
def test_consumer_yield_rules_are_in_the_yield_await_docs(consumer):
    """docs/yield_await.md's table of compile-time rules names each consumer rule with its message
    (the user probe wrote a consumer that awaited x and yielded only its own result: the message
    was not in the table)."""
    text = ("dynamic { x: f32[2]; y: f32[2]; }\nvolatile { z: f32[2]; }\n"
            "block entry {\n  yield x, y;\n  await x, y;\n  return;\n}\n" + consumer + "\n")
    errs = [d.message for d in check(parse(text, "t.oi")) if d.severity == "error"]
    assert errs, text
    doc = (REPO / "docs" / "yield_await.md").read_text()
    for message in errs:
        assert f"`{message}`" in doc, (message, errs)
