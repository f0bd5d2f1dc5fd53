"""`acc=[A, O]` (SPEC-2026-03 §2, decision D2) for every rule of every op that takes it, and the Rust
literal forms of SPEC-2026-03 §1.2-1.3 / D1 (issue 16)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import oi2jax
from oi2jax import ops
from oi2jax.grammar import parse
from oi2jax.ops.accumulate import RULES

from conftest import run_cli

NP = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64, "u8": np.uint8, "u16": np.uint16,
      "u32": np.uint32, "u64": np.uint64, "f16": np.float16, "f32": np.float32, "f64": np.float64, "bool": np.bool_,
      "bf16": ml_dtypes.bfloat16, "i4": np.int8, "u4": np.uint8}


def _values(dtype: str, shape, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype == "i4":
        return rng.integers(-8, 8, shape).astype(np.int8)
    if dtype == "u4":
        return rng.integers(0, 16, shape).astype(np.uint8)
    if dtype in ("f16", "f32", "f64", "bf16"):
        return (rng.standard_normal(shape) * 3).astype(np.float32).astype(NP[dtype])
    info = np.iinfo(NP[dtype])
    return rng.integers(info.min, info.max, shape, endpoint=True, dtype=np.int64 if dtype != "u64" else np.uint64
                        ).astype(NP[dtype])


def _reference(op: str, xs, in_dtype: str, a: str, o: str, axes=(1,)):
    """D2 in NumPy: inputs I -> A, compute in A (integers wrap modulo 2^bits(A)), A -> O; mean: the
    sum in A, converted to O, divided by the count in O."""
    A, O = NP[a], NP[o]
    conv = [x.astype(np.float32) if in_dtype in ("f16", "bf16") else x for x in xs]
    conv = [x.astype(np.int64).astype(A) if in_dtype == "bool" else x.astype(A) for x in conv]
    integer = np.issubdtype(A, np.integer)
    wide = np.uint64 if a.startswith("u") else np.int64
    with np.errstate(over="ignore"):
        if op == "matmul":
            y = (conv[0].astype(wide) @ conv[1].astype(wide)).astype(A) if integer else conv[0] @ conv[1]
        elif op in ("sum_axis", "mean_axis"):
            y = conv[0].sum(axis=axes, dtype=wide).astype(A) if integer else conv[0].sum(axis=axes, dtype=A)
        else:
            y = conv[0].prod(axis=axes, dtype=wide).astype(A) if integer else conv[0].prod(axis=axes, dtype=A)
        y = np.asarray(y).astype(O)
        if op == "mean_axis":
            y = (y / O(np.prod([xs[0].shape[i] for i in axes]))).astype(O)
    return y


def _inputs_for(a: str):
    """Input dtypes worth testing with accumulator A (floats only into float A, D2.1)."""
    ints = ["i8", "i32", "u8", "bool", "i4", "u64"]  # narrow, native, unsigned, bool, packed, 64-bit
    return ints + (["f16", "bf16", "f32", "f64"] if a.startswith("f") else [])


CASES = [(op, rule, i) for op, rules in RULES.items() for rule in rules for i in _inputs_for(rule[0])
         if i in ops.REGISTRY[op].normal_dtypes]


@pytest.mark.parametrize("op, rule, in_dtype", CASES, ids=[f"{o}-{r[0]}-{r[1]}-{i}" for o, r, i in CASES])
def test_every_rule_of_every_op(op, rule, in_dtype):
    a, o = rule
    shapes = [(3, 5), (5, 4)] if op == "matmul" else [(3, 6)]
    if op == "prod_axis":
        shapes = [(3, 3)]
    xs = [_values(in_dtype, s, seed) for seed, s in enumerate(shapes)]
    attrs = {"acc": (a, o)} if op == "matmul" else {"acc": (a, o), "axes": (1,)}
    from oi2jax.ir import Literal
    sig = ops.infer(op, [in_dtype] * len(xs), [x.shape for x in xs],
                    {k: Literal("dtype_list" if k == "acc" else "int_list", v) for k, v in attrs.items()})
    assert sig.mode == "acc_rule" and sig.out_dtype == o
    import jax
    with jax.enable_x64(True):
        got = np.asarray(ops.apply(op, [np.asarray(x) for x in xs], attrs, in_dtypes=[in_dtype] * len(xs),
                                   out_dtype=o, mode="acc_rule"))
    want = _reference(op, xs, in_dtype, a, o)
    assert got.dtype == np.dtype(NP[o]) and got.shape == want.shape
    if np.issubdtype(got.dtype, np.integer):
        np.testing.assert_array_equal(got, want)  # exact: wrapping in A
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5 if o == "f32" or a == "f32" else 1e-12, atol=1e-5)


def test_integer_accumulation_wraps_in_a():
    """[i32, i64]: the products and the sum wrap in i32, then widen: not the exact i64 sum."""
    x = np.full((1, 2), 50000, np.int32)
    w = np.full((2, 1), 50000, np.int32)
    import jax
    with jax.enable_x64(True):
        got = np.asarray(ops.apply("matmul", [x, w], {"acc": ("i32", "i64")}, in_dtypes=["i32", "i32"],
                                   out_dtype="i64", mode="acc_rule"))
        wide = np.asarray(ops.apply("matmul", [x, w], {"acc": ("i64", "i64")}, in_dtypes=["i32", "i32"],
                                    out_dtype="i64", mode="acc_rule"))
    exact = 2 * 50000 * 50000
    assert got.dtype == np.int64 and got[0, 0] == (exact + 2 ** 31) % 2 ** 32 - 2 ** 31 != exact
    assert wide[0, 0] == exact
    # old dialect acc=i64 on i32 (SPEC §6.2) keeps its meaning: computed in 64 bits
    old = oi2jax.compile("dynamic { x: i32[1, 2]; w: i32[2, 1]; }\nvolatile { y: i64[1, 1]; }\n"
                         "block entry { op matmul(x, w, acc=i64) >> y; return; }\n")
    assert old.run({"x": x, "w": w})["y"][0, 0] == exact


PROGRAM = """\
dynamic { a: i8[2, 3]; b: i8[3, 2]; f: f16[2, 3]; u: u32[2, 3]; }
volatile {
    m32: i32[2, 2]; m64: i64[2, 2]; s: i32[2]; p: i64[2]; mf: f32[2]; mu: f64[2, 1]; fs: f64[2];
}
block entry {
    op matmul(a, b, acc=[i32, i32]) >> m32;
    op matmul(a, b, acc=[i32 i64,]) >> m64;
    op sum_axis(a, axes=[1], acc=[i32, i32]) >> s;
    op prod_axis(a, axes=[1], acc=[i64, i64]) >> p;
    op mean_axis(a, axes=[1], acc=[i32, f32]) >> mf;
    op mean_axis(u, axes=[1], keepdims=true, acc=[u64, f64]) >> mu;
    op sum_axis(f, axes=[1], acc=[f64, f64]) >> fs;
    return;
}
"""


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_acc_lists_in_a_program(mode):
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (2, 3)).astype(np.int8)
    b = rng.integers(-128, 128, (3, 2)).astype(np.int8)
    f = (rng.standard_normal((2, 3)) * 100).astype(np.float16)
    u = rng.integers(0, 2 ** 32, (2, 3), dtype=np.uint64).astype(np.uint32)
    out = oi2jax.compile(PROGRAM, mode=mode).run({"a": a, "b": b, "f": f, "u": u})
    np.testing.assert_array_equal(out["m32"], a.astype(np.int32) @ b.astype(np.int32))
    np.testing.assert_array_equal(out["m64"], (a.astype(np.int64) @ b.astype(np.int64)))
    np.testing.assert_array_equal(out["s"], a.astype(np.int32).sum(axis=1))
    np.testing.assert_array_equal(out["p"], a.astype(np.int64).prod(axis=1))
    np.testing.assert_array_equal(out["mf"], (a.astype(np.int32).sum(axis=1).astype(np.float32) / np.float32(3)))
    np.testing.assert_array_equal(out["mu"], (u.astype(np.uint64).sum(axis=1, keepdims=True).astype(np.float64) / 3.0))
    np.testing.assert_allclose(out["fs"], f.astype(np.float64).sum(axis=1), rtol=1e-12)


@pytest.mark.parametrize("body, message", [
    ("op matmul(a, b, acc=[f16, f16]) >> m;",
     "op matmul: acc=[F16, F16] does not match any accumulation rule; valid: [[I32, I32], [I32, I64], [I64, I64], "
     "[U32, U32], [U32, U64], [U64, U64], [F32, F32], [F32, F64], [F64, F64]]"),
    ("op sum_axis(a, axes=[1], acc=[i16, i16]) >> s;", "op sum_axis: acc=[I16, I16] does not match any accumulation"),
    ("op add(a, a, acc=[i32, i32]) >> a;", "op add: acc is not supported (no accumulation rules)"),
    ("op relu(a, acc=[i32, i32]) >> a;", "op relu: acc is not supported (no accumulation rules)"),
    ("op matmul(x, y, acc=[i32, i32]) >> m;", "op matmul: acc=[i32, i32] cannot accumulate float input f32 in "
                                              "integer type i32"),
    ("op matmul(a, b, acc=[i32, i64]) >> m;", "m"),  # O = i64 but m is declared i32
])
def test_acc_list_errors(tmp_path, capsys, body, message):
    g = tmp_path / "g.oi"
    g.write_text("dynamic { a: i8[2, 2]; b: i8[2, 2]; x: f32[2, 2]; y: f32[2, 2]; }\n"
                 "volatile { m: i32[2, 2]; s: i32[2]; }\n"
                 f"block entry {{\n    {body}\n    return;\n}}\n")
    code, _, err = run_cli(capsys, "check", g)
    assert code == 1 and f"{g}:4:" in err and message in err, err


@pytest.mark.parametrize("setting, message", [
    ("acc=[]", "acc must be a dtype list (e.g. acc=[i32, i64])"),
    ("acc=[i2, i32]", "expected dtype (e.g. i32, f32), got i2"),
    ("acc=[I32]", "expected dtype (e.g. i32, f32), got I32"),
    ("acc=[i32, 1]", "expected dtype identifier (e.g. i32, f32)"),  # a non-name later in the list (§1.4)
    ("acc=[i32, -i64]", "expected dtype identifier (e.g. i32, f32)"),
    ("acc=1", "acc must be a dtype list"),
    ("axes=[a]", "op sum_axis setting axes: a is a variable; a list takes integers and size names"),
    ("axes=[i32]", "DTypeList only supported for acc attribute"),
])
def test_dtype_list_syntax_errors(tmp_path, capsys, setting, message):
    g = tmp_path / "g.oi"
    g.write_text(f"dynamic {{ a: i8[2, 2]; }}\nvolatile {{ s: i32[2]; }}\n"
                 f"block entry {{\n    op sum_axis(a, axes=[1], {setting}) >> s;\n    return;\n}}\n"
                 .replace("axes=[1], axes", "axes"))
    code, _, err = run_cli(capsys, "check", g)
    assert code == 1 and message in err and f"{g}:4:" in err, err


def test_to_must_be_a_dtype_identifier(tmp_path, capsys):
    g = tmp_path / "g.oi"
    g.write_text("dynamic { a: i8[2]; }\nvolatile { s: i32[2]; }\nblock entry {\n"
                 "    op cast(a, to=[i32]) >> s;\n    return;\n}\n")
    code, _, err = run_cli(capsys, "check", g)
    assert code == 1 and "to must be a dtype identifier" in err and f"{g}:4:" in err


def test_graph_json_dtype_list_round_trip(tmp_path, capsys):
    g = tmp_path / "g.oi"
    g.write_text(PROGRAM)
    code, out, err = run_cli(capsys, "compile", g, "--emit", "graph-json")
    assert code == 0, err
    assert '"DTypeList": [\n' in out and '"I32",\n' in out
    (tmp_path / "g.json").write_text(out)
    code, fmt_out, err = run_cli(capsys, "fmt", tmp_path / "g.json")
    assert code == 0 and "acc=[i32, i64]" in fmt_out and "acc=[u64, f64]" in fmt_out


# ---------------------------------------------------------------- Rust literal forms (D1)

LITERALS = """\
dynamic {
    a: u8[4];
    x: f64[2];
}

volatile {
    b: u8[4];
    c: u8[4];
    d: u16[4];
    e: f64[2];
    g: u8[4];
}

persistent {
    p: u8 @init(255u8);
    q: i32 @init(0x10);
    r: i32 @init(1_000);
    s: i16 @init(200u8);
    w: f64 @init(0.1f32);
    v: f64 @init(0.1);
    z: i8 @init(-128i8);
    o: i32 @init(0o17);
    n: i32 @init(0b101);
    h: i64 @init(-0x10);
    k: i32 @init(-0);
    f: f32 @init(2.5e0f32);
    K(i): f64[2] @table @fixed(i=0x6);
}

block entry {
    op fill(a, value=1u8) >> b;
    op fill(a, value=255u8) >> c;
    op fill(a, value=0xFFu8) >> g;
    op add(x, x) >> e;
    op fill(x, value=0.1f32) >> e;
    op fill(a, value=1_0) >> c;
    cache.increment 2u8 q;
    cache.write x >> K[0x1];
    return;
}
"""


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_suffixed_literals_values_exact(tmp_path, mode):
    out = oi2jax.compile(LITERALS, mode=mode, zero_missing_inputs=True).run({"x": np.array([1.0, 2.0])})
    assert out["b"].tolist() == [1] * 4 and out["g"].tolist() == [255] * 4 and out["c"].tolist() == [10] * 4
    assert out["e"].tolist() == [0.1, 0.1]  # a setting's 0.1f32 is the f64 value of its digits (upstream)
    assert int(out["p"]) == 255 and int(out["q"]) == 16 + 2 and int(out["r"]) == 1000 and int(out["s"]) == 200
    assert float(out["w"]) == float(np.float32(0.1)) == 0.10000000149011612  # @init: `0.1f32 as f64`
    assert float(out["v"]) == 0.1 and int(out["z"]) == -128 and int(out["o"]) == 15 and int(out["n"]) == 5
    assert int(out["h"]) == -16 and int(out["k"]) == 0 and float(out["f"]) == 2.5
    assert out["K"].shape == (6, 2) and out["K"][1].tolist() == [1.0, 2.0]


def test_fmt_keeps_literals_as_written(tmp_path, capsys):
    g = tmp_path / "g.oi"
    g.write_text(LITERALS)
    code, out, err = run_cli(capsys, "fmt", g)
    assert code == 0 and out == LITERALS, err


def test_fmt_keeps_plain_float_spellings_as_written(tmp_path, capsys):
    """docs/semantics.md: fmt writes every literal back as the user wrote it; a float without `_`
    or a suffix was printed from its value instead (`1E3` -> `1000.0`, `2.` -> `2.0`,
    `0.000001` -> `1e-6`, `-1e30` -> `-1e+30`) (frontend probe)."""
    text = ("dynamic {\n    x: f32[4];\n    a: f32 @init(2.);\n    b: f32 @init(1E3);\n"
            "    c: f64 @init(0.000001);\n}\n\nvolatile {\n    y: f32[4];\n}\n\nblock entry {\n"
            "    op clamp(x, min=-1e30, max=1E3) >> y;\n    op mul(x, 2.) >> y;\n    op mul(y, 0.5) >> y;\n"
            "    return;\n}\n")
    g = tmp_path / "g.oi"
    g.write_text(text)
    code, out, err = run_cli(capsys, "fmt", g)
    assert code == 0 and out == text, err
    graph = parse(text, "g.oi")
    assert [d.init.value for d in graph.vars if d.init is not None] == [2.0, 1000.0, 1e-6]


@pytest.mark.parametrize("text, message", [
    ("persistent { p: i32 @init(1foo); }", "invalid literal suffix `foo` in 1foo"),
    ("persistent { p: f32 @init(1.0f16); }", "invalid literal suffix `f16` in 1.0f16 (floats take f32 or f64)"),
    ("persistent { p: i16 @init(300u8); }", "literal 300u8 is out of range for its suffix type u8 (0..255)"),
    ("persistent { p: i16 @init(128i8); }", "literal 128i8 is out of range for its suffix type i8"),
    ("persistent { p: i8 @init(-1u8); }", "cannot apply '-' to the unsigned literal 1u8"),
    ("persistent { p: i32 @init(0b102); }", "invalid digit 2 in base-2 literal 0b102"),
    ("persistent { p: i32 @init(0o8); }", "invalid digit 8 in base-8 literal 0o8"),
    ("persistent { p: i32 @init(0x1f32u8); }", None),  # hex 0x1f32 with suffix u8: 7986 > 255
    ("dynamic { x: f32[4u32]; }", 'dimension 4u32 must be plain decimal digits (OpenInfer keeps the text "4u32" '
                                  'as a size name and fails: unknown size: 4u32)'),
    ("dynamic { x: f32[0x10]; }", "dimension 0x10 must be plain decimal digits"),
    ("dynamic { x: f32[1_000]; }", "dimension 1_000 must be plain decimal digits"),
    ("block entry { loop l (i in 0..3u8) { } return; }", "loop bound 3u8 must be plain decimal digits"),
    ("constant { W(l): f32[2] @pattern(\"w.{l}\"); }\nvolatile { y: f32[2]; }\n"
     "block entry { op relu(W[0u8]) >> y; return; }", "prefix-table index 0u8 must be plain decimal digits"),
    ("dynamic { x: f32[2]; }\nblock entry { op fill(x, value=1.0foo) >> x; return; }", "invalid literal suffix `foo`"),
    ("dynamic { x: f32[2]; }\nblock entry { op fill(x, value=99999999999999999999) >> x; return; }",
     "out of the 64-bit range"),
])
def test_rejected_literal_forms_are_located_errors(tmp_path, capsys, text, message):
    g = tmp_path / "g.oi"
    g.write_text(text + ("\nblock entry { return; }\n" if "block" not in text else "\n"))
    code, _, err = run_cli(capsys, "check", g)
    assert code == 1 and f"{g}:" in err and "^" in err, err
    if message is None:
        message = "literal 0x1f32u8 is out of range for its suffix type u8"
    assert message in err, err


def test_float_suffixed_integer_is_an_integer(tmp_path):
    """`1f32` is the integer 1 (syn's reading): in a setting it is an Int."""
    from oi2jax.grammar.parse import parse
    g = parse("dynamic { x: f32[2]; }\nblock entry { op fill(x, value=1f32) >> x; op fill(x, value=2.5f32) >> x; "
              "return; }\n")
    ops_ = [n for n in g.blocks[0].nodes]
    assert ops_[0].attrs[0].value.kind == "int" and ops_[0].attrs[0].value.value == 1
    assert ops_[1].attrs[0].value.kind == "float" and ops_[1].attrs[0].value.value == 2.5


def test_setting_beyond_its_suffix_type_warns(tmp_path, capsys):
    """D1 (c): `value=300u8` runs as 300 (upstream ignores the suffix) and says so."""
    g = tmp_path / "g.oi"
    g.write_text("dynamic { a: u16[2]; }\nvolatile { b: u16[2]; }\n"
                 "block entry { op fill(a, value=300u8) >> b; op fill(a, value=0xFFu8) >> a; return; }\n")
    code, _, err = run_cli(capsys, "check", g)
    assert code == 0 and err.count("warning:") == 1
    assert f"{g}:3:26: warning: setting value=300u8: 300 does not fit its suffix type u8 (0..255); OpenInfer " \
           f"ignores the suffix and uses 300" in err
    assert oi2jax.compile(str(g), zero_missing_inputs=True).run({})["b"].tolist() == [300, 300]


def test_u64_values_above_i64s_range(capsys, tmp_path):
    """A u64 `@init` or literal of 2^63 and more (valid: SPEC §2.3) was an internal error
    (OverflowError: the value went through an int64) after `check` had passed; both modes now
    hold it, and wrap as u64 does."""
    src = ("volatile { a: u64 @init(18446744073709551615); b: u64 @init(9223372036854775808); s: u64; t: u64; }\n"
           "block entry { op add(a, 18446744073709551615u64) >> s; op add(b, 1u64) >> t; return; }\n")
    for mode in ("compiled", "interpret"):
        out = oi2jax.compile(src, mode=mode).run({})
        assert out["a"].dtype == np.uint64 and int(out["a"]) == 2 ** 64 - 1, mode
        assert int(out["s"]) == 2 ** 64 - 2 and int(out["t"]) == 2 ** 63 + 1, mode
    (tmp_path / "u.oi").write_text(src)
    code, out, err = run_cli(capsys, "run", tmp_path / "u.oi")
    assert code == 0 and "s: uint64[]\n18446744073709551614\n" in out, err


@pytest.mark.parametrize("setting", ["min=9223372036854775808", "max=18446744073709551615u64", "max=0x8000000000000000"])
def test_a_setting_literal_past_i64_is_a_located_error(tmp_path, capsys, setting):
    """D1 (c): a setting is an i64 as upstream reads it ("number too large to fit in target
    type"); 2^63 and more was taken (a u64 clamp bound of 2^64 - 1 clamped nothing). An i64's
    largest value still is one; a u64 input literal past it (above) is a value, not a setting."""
    g = tmp_path / "g.oi"
    g.write_text(f"dynamic {{ x: u64[2]; }}\nvolatile {{ y: u64[2]; }}\nblock entry {{\n    op clamp(x, {setting}) >> y;\n"
                 "    return;\n}\n")
    code, _, err = run_cli(capsys, "check", g)
    name, value = setting.split("=")
    assert code == 1 and f"{g}:4:17: error: op clamp setting {name}: {value} is past " \
                         "i64's largest value, 9223372036854775807 (a setting is an i64, as upstream reads it: " \
                         "SPEC-2026-03 D1(c))" in err, err
    g.write_text("dynamic { x: u64[2]; }\nvolatile { y: u64[2]; }\nblock entry {\n"
                 "    op clamp(x, min=9223372036854775807) >> y;\n    return;\n}\n")
    out = oi2jax.compile(str(g)).run({"x": np.array([0, 2 ** 64 - 1], np.uint64)})
    assert [int(v) for v in out["y"]] == [2 ** 63 - 1, 2 ** 64 - 1]
