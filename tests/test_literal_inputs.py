"""A scalar literal as an op input (an oi2jax extension, docs/semantics.md; issue 41): parsed with its
span and suffix dtype, typed by the checker from the op's other inputs under the `@init` rule, a
constant of that dtype compiled and interpreted (exact, against NumPy), written back by `fmt`, held
by graph JSON and the trace."""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import oi2jax
from oi2jax import ir
from oi2jax.check import check, check_graph
from oi2jax.diagnostics import OiError
from oi2jax.grammar.fmt import format_graph, strip_spans
from oi2jax.grammar.parse import parse
from oi2jax.graph_json import from_json, to_json
from oi2jax.trace import Trace

GRAPH = """dynamic { x: f32[4]; i: i32[4]; h: f16[2]; u: u8[2]; b: bool[2]; g: bf16[2]; k: f32; }
volatile {
    y1: f32[4]; y2: f32[4]; j1: i32[4]; j2: i32[4]; h1: f16[2]; u1: u8[2]; b1: bool[2]; g1: bf16[2];
    s: f32; t: i8; m: f32;
}
block entry {
    op mul(x, 0.125) >> y1;
    op sub(x, -2.5e-1) >> y2;
    op add(i, -1) >> j1;
    op mul(i, 0x10) >> j2;
    op add(h, 0.1) >> h1;
    op add(u, 255) >> u1;
    op add(b, true) >> b1;
    op mul(g, 0.1) >> g1;
    op add(2.0f32, 0.5) >> s;
    op mul(3i8, - 4i8) >> t;
    op max(k, 1_0.0) >> m;
    return;
}
"""

INPUTS = {"x": np.float32([1.5, -3.0, 100.0, 0.1]), "i": np.int32([0, 1, -7, 2**31 - 1]),
          "h": np.float16([1.0, 2048.0]), "u": np.uint8([0, 7]), "b": np.bool_([False, False]),
          "g": np.float32([3.0, 1.0]), "k": np.float32(2.5)}


def _want() -> dict:
    x, i, h, u, g = INPUTS["x"], INPUTS["i"], INPUTS["h"], INPUTS["u"], INPUTS["g"]
    bf = ml_dtypes.bfloat16
    return {"y1": x * np.float32(0.125), "y2": x - np.float32(-0.25), "j1": i - np.int32(1),
            "j2": (i.astype(np.int64) * 16).astype(np.int32),  # wraps as i32 does
            "h1": h + np.float16(0.1), "u1": u + np.uint8(255), "b1": np.bool_([True, True]),
            # bf16 values come back widened to f32; 0.1 goes through f32 to bf16 (the @init rule)
            "g1": (g.astype(bf) * np.float32(0.1).astype(bf)).astype(np.float32),
            "s": np.float32(2.5), "t": np.int8(-12), "m": np.float32(10.0)}


def test_literal_inputs_parse_with_their_span_value_and_suffix_dtype():
    ops = [n for n in parse(GRAPH).blocks[0].nodes if isinstance(n, ir.Op)]
    lits = [(str(r.value.value), r.value.kind, r.dtype, r.span.line, r.span.col)
            for n in ops for r in n.inputs if isinstance(r, ir.LiteralInput)]
    assert lits == [("0.125", "float", None, 7, 15), ("-2.5e-1", "float", None, 8, 15), ("-1", "int", None, 9, 15),
                    ("0x10", "int", None, 10, 15), ("0.1", "float", None, 11, 15), ("255", "int", None, 12, 15),
                    ("True", "bool", None, 13, 15), ("0.1", "float", None, 14, 15),
                    ("2.0f32", "float", "f32", 15, 12), ("0.5", "float", None, 15, 20),
                    ("3i8", "int", "i8", 16, 12), ("-4i8", "int", "i8", 16, 17), ("1_0.0", "float", None, 17, 15)]
    assert [r.name for r in ops[0].refs] == ["x"] and ops[8].refs == ()
    one = parse("volatile { y: f32; } block entry { op add(1f32, 2f64) >> y; }").blocks[0].nodes[0]
    assert [(r.value.kind, float(r.value.value), r.dtype) for r in one.inputs] == [("float", 1.0, "f32"),
                                                                                  ("float", 2.0, "f64")]


def test_the_checker_types_each_literal_from_the_other_inputs():
    checked = check_graph(parse(GRAPH))
    ops = [n for n in checked.graph.blocks[0].nodes if isinstance(n, ir.Op)]
    typed = [checked.literal(n, p) for n in ops for p, r in enumerate(n.inputs) if isinstance(r, ir.LiteralInput)]
    assert [t.dtype for t in typed] == ["f32", "f32", "i32", "i32", "f16", "u8", "bool", "bf16", "f32", "f32", "i8",
                                        "i8", "f32"]
    assert all(t.value.shape == () for t in typed)
    assert typed[4].value.dtype == np.float16 and typed[4].value == np.float16(0.1)
    assert typed[7].value.dtype == ml_dtypes.bfloat16 and typed[7].value == np.float32(0.1).astype(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def outputs():
    return {mode: oi2jax.compile(GRAPH, mode=mode).run(INPUTS) for mode in ("compiled", "interpret")}


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_literal_inputs_compute_as_numpy_exactly(outputs, mode):
    out = outputs[mode]
    for name, want in _want().items():
        assert out[name].dtype == np.asarray(want).dtype, name
        np.testing.assert_array_equal(out[name], want, err_msg=name)


def _errors(body: str, decls: str = "dynamic { x: f32[2]; i: i32; b: i8; u: u8; } volatile { y: f32[2]; j: i32; "
                                      "k: i8; w: u8; bb: bool; }") -> list[tuple[str, int, int]]:
    return [(d.message, d.span.line, d.span.col) for d in check(parse(f"{decls}\nblock entry {{\n{body}\n}}"))
            if d.severity == "error"]


@pytest.mark.parametrize("body,message,col", [
    ("op add(b, 300) >> k;", "op add input 1: the literal 300 takes i8 (the dtype of b): i8 literal out of range", 11),
    ("op add(u, -1) >> w;", "op add input 1: the literal -1 takes u8 (the dtype of u): u8 literal out of range", 11),
    ("op add(i, 0.5) >> j;", "op add input 1: the literal 0.5 takes i32 (the dtype of i): float literal requires "
                             "f8/bf16/f16/f32/f64 dtype", 11),
    ("op mul(x, 2) >> y;", "op mul input 1: the literal 2 takes f32 (the dtype of x): int literal requires an "
                           "integer, bool or bitset dtype, got f32 (write 2.0)", 11),
    ("op add(x, 1e39) >> y;", "op add input 1: the literal 1e39 takes f32 (the dtype of x): f32 literal 1e+39 is out "
                              "of range (largest finite f32 is 3.40282e+38)", 11),
    ("op add(300u8, b) >> k;", "op add input 0: the literal 300u8 takes u8 (its suffix): u8 literal out of range", 8),
    ("op add(i, true) >> j;", "op add input 1: the literal true takes i32 (the dtype of i): bool literal requires "
                              "bool dtype", 11),
    ("op add(1, 2) >> k;", "op add: every input is a literal, so nothing gives 1 a dtype; write its dtype as a "
                           "suffix (`1i8`), or declare a variable holding it, e.g. `c: i8 @init(1);` in "
                           "`volatile { ... }`, and write c in its place", 8),  # the output's dtype
    ("op add(1, 2) >> y;", "op add: every input is a literal, so nothing gives 1 a dtype; write its dtype as a "
                           "suffix (`1i32`), or declare a variable holding it, e.g. `c: i32 @init(1);` in "
                           "`volatile { ... }`, and write c in its place", 8),  # 1 cannot be the output's f32
    ("op add(true, false) >> bb;", "op add: every input is a literal, so nothing gives true a dtype; declare a "
                                   "variable holding it, e.g. `c: bool @init(true);` in `volatile { ... }`, and write "
                                   "c in its place", 8),
    ("op add(- 0.5, 1.0) >> y;", "op add: every input is a literal, so nothing gives -0.5 a dtype; write its dtype as "
                                 "a suffix (`-0.5f32`), or declare a variable holding it, e.g. `c: f32 @init(-0.5);` "
                                 "in `volatile { ... }`, and write c in its place", 8),
    ("op mul(x, 2i8) >> y;", "op mul input 1 has dtype i8, expected f32 (all inputs must match the first)", 11),
])
def test_a_literal_that_cannot_be_its_inputs_value_is_an_error_at_the_literal(body, message, col):
    assert _errors(body) == [(message, 3, col)]


def test_an_unknown_variable_beside_a_literal_is_reported_once():
    assert _errors("op add(nope, 1.0) >> y;") == [("unknown input variable nope", 3, 8)]


@pytest.mark.parametrize("body,message", [
    ("op add(i, 1i128) >> j;", "<string>:3:11: error: literal 1i128: i128 is not an OpenInfer dtype (a literal "
                               "input's suffix is its dtype: i8, i16, i32, i64, u8, u16, u32, u64, f32, f64)"),
    ("op add(x, 1.0f16) >> y;", "<string>:3:11: error: invalid literal suffix `f16` in 1.0f16 (floats take f32 or "
                                "f64)"),
    ("op relu(x, alpha=0.5, 1.0) >> y;", "<string>:3:23: error: positional args must come before settings"),
])
def test_literal_input_syntax_errors_are_located(body, message):
    with pytest.raises(OiError) as info:
        parse(f"dynamic {{ x: f32[2]; i: i32; }} volatile {{ y: f32[2]; j: i32; }}\nblock entry {{\n{body}\n}}")
    assert str(info.value).splitlines()[0] == message


def test_fmt_writes_literal_inputs_back_as_written():
    text = format_graph(parse(GRAPH))
    for written in ("op mul(x, 0.125) >> y1;", "op sub(x, -2.5e-1) >> y2;", "op add(i, -1) >> j1;",
                    "op mul(i, 0x10) >> j2;", "op add(b, true) >> b1;", "op add(2.0f32, 0.5) >> s;",
                    "op mul(3i8, -4i8) >> t;", "op max(k, 1_0.0) >> m;"):
        assert written in text
    assert strip_spans(parse(text)) == strip_spans(parse(GRAPH))
    assert format_graph(parse(text)) == text


def test_graph_json_holds_literal_inputs_both_ways():
    graph = parse(GRAPH)
    data = json.loads(json.dumps(to_json(graph)))
    ops = [n["kind"]["Op"] for n in next(iter(data["blocks"].values()))["nodes"] if "Op" in n["kind"]]
    assert ops[0]["inputs"] == ["x", {"Literal": {"Double": 0.125}, "dtype": None}]
    assert ops[2]["inputs"] == ["i", {"Literal": {"Int": -1}, "dtype": None}]
    assert ops[6]["inputs"] == ["b", {"Literal": {"Bool": True}, "dtype": None}]
    assert ops[9]["inputs"] == [{"Literal": {"Int": 3}, "dtype": "I8"}, {"Literal": {"Int": -4}, "dtype": "I8"}]
    back = from_json(data)
    assert strip_spans(back) == strip_spans(graph)
    checked = check_graph(back)
    op = next(n for n in back.blocks[0].nodes if isinstance(n, ir.Op) and n.output == "t")
    assert checked.literal(op, 1).dtype == "i8" and checked.literal(op, 1).value == np.int8(-4)
    ops[0]["inputs"][1] = {"Literal": {"Str": "a"}, "dtype": None}
    with pytest.raises(ValueError, match="literal op input"):
        from_json(data)


def test_the_trace_shows_a_literal_input_as_written():
    tr = Trace()
    src = "dynamic { x: f32[2]; } volatile { y: f32[2]; }\nblock entry { op mul(x, 0.125) >> y; return; }"
    oi2jax.compile(src, mode="interpret", trace=tr).run({"x": np.float32([1, 2])})
    assert tr.events[0].text == "op mul(x,0.125) >> y" and tr.events[0].params == ["x", "0.125"]


AUTO_DIM = """dynamic { x: f32; }
volatile { a: f32[D]; }
persistent { n: i32 @init(0); L(r): f32[D] @auto_dim(r); }
block entry {
    cache.increment 2 n;
    cache.read L[n] >> a;
    op add(a, 0.5) >> a;
    cache.write a >> L[n];
    return;
}
"""


def test_a_literal_beside_a_runtime_shaped_operand():
    """`op add(a, 0.5)` on an `@auto_dim` read: the literal is a scalar beside the current shape."""
    out = oi2jax.compile(AUTO_DIM, sizes={"D": 1}).run({"x": np.float32(0)}, steps=2)
    np.testing.assert_array_equal(out["a"], np.float32([1.0, 1.0, 1.0, 0.5, 0.5]))
    np.testing.assert_array_equal(out["L"], out["a"])
