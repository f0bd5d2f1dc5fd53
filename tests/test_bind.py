"""Model binding (oi2jax.model.bind): shapes, initial values, prefix-table families, loop bounds, errors."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from oi2jax import dtypes as dt
from oi2jax import ir
from oi2jax.diagnostics import OiError
from oi2jax.model import Meta, Tensor, open_model, save
from oi2jax.host_numerics import fill_value
from oi2jax.model.bind import BoundGraph, bind

from conftest import MODELS, WIDEN_HINT

K = ir.MemKind


def span(line: int) -> ir.Span:
    return ir.Span("t.oi", line, 3)


def dims(*atoms) -> tuple[ir.Dim, ...]:
    out = []
    for a in atoms:
        if isinstance(a, str) and "*" in a:
            out.append(ir.Dim(tuple(int(x) if x.isdigit() else x for x in a.split("*"))))
        else:
            out.append(ir.Dim((a,)))
    return tuple(out)


def var(name, kind, dtype, *ds, line=1, **kw) -> ir.VarDecl:
    return ir.VarDecl(name=name, kind=kind, dtype=dtype, dims=dims(*ds), span=span(line), **kw)


def lit(value) -> ir.Literal:
    kind = "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "float"
    return ir.Literal(kind, value)


def graph(*vars, nodes=()) -> ir.Graph:
    return ir.Graph(vars=tuple(vars), blocks=(ir.Block("entry", tuple(nodes), span(90)),), path="t.oi")


def model(tmp_path, name="m.oinf", **kw):
    save(tmp_path / name, **kw)
    return open_model(tmp_path / name)


# ---------------------------------------------------------------- shapes and dtypes

def test_shapes_from_model_sizevars_and_overrides(tmp_path):
    g = graph(var("x", K.DYNAMIC, "f32", "B", "D"), var("y", K.VOLATILE, "f16", "B*D", 3),
              var("s", K.CONSTANT, "i32"), var("qkv", K.VOLATILE, "f32", "3*D"),
              nodes=[ir.Assign(index=0, span=span(91), name="t", dtype="bf16", dims=dims("D", 2))])
    m = model(tmp_path, sizevars={"B": 4, "D": 8})
    b = bind(g, m)
    assert isinstance(b, BoundGraph) and b.graph is g and b.model is m
    assert b.sizes == {"B": 4, "D": 8}
    assert b.shape("x") == (4, 8) and b.shape("y") == (32, 3) and b.shape("s") == () and b.shape("qkv") == (24,)
    assert b.shape("t") == (8, 2) and b.dtype("t") == "bf16" and b.dtype("y") == "f16"
    b2 = bind(g, m, sizes={"B": 2})
    assert b2.sizes == {"B": 2, "D": 8} and b2.shape("x") == (2, 8)
    b3 = bind(g, None, sizes={"B": 1, "D": 1}, zero_missing_inputs=True)  # no model: constant s is zeros when asked
    assert b3.shape("y") == (1, 3) and b3.model is None
    with pytest.raises(OiError, match="unknown variable nope"):
        b.shape("nope")


def test_unknown_size_reports_every_declaration():
    g = graph(var("x", K.DYNAMIC, "f32", "B", line=2), var("y", K.VOLATILE, "f32", "D*4", line=3),
              nodes=[ir.Assign(index=0, span=span(91), name="t", dtype="f32", dims=dims("Q"))])
    with pytest.raises(OiError) as exc:
        bind(g, None, sizes={"D": 2})
    msgs = [(d.message, d.span.line) for d in exc.value.diagnostics]
    assert ("invalid dims for x: unknown size: B", 2) in msgs
    assert ("invalid dims for t: unknown size: Q", 91) in msgs
    assert len(msgs) == 2
    assert "t.oi:2:3: error: invalid dims for x: unknown size: B" in exc.value.render()


def test_auto_dim_and_table_base_shape():
    g = graph(var("K", K.PERSISTENT, "f32", "D", index_params=("i",), table=True, fixed=(("i", 4),)),
              var("H", K.PERSISTENT, "f32", "D", 2, index_params=("n",), auto_dim=("n",), init=lit(1.5)))
    b = bind(g, None, {"D": 3})
    assert b.shape("K") == (3,) and b.shape("H") == (3, 2)
    assert b.initial("H").tolist() == [[1.5, 1.5]] * 3


# ---------------------------------------------------------------- initial values

def test_initial_values_by_kind(tmp_path):
    m = model(tmp_path, sizevars={"D": 2},
              metadata={"eps": Meta("f32", 0.5), "n_meta": 7, "arr": np.array([1, 2], np.int16),
                        "flags": Meta("bitset", np.array([1, 0, 1], bool)), "name": "relu"},
              tensors={"w": np.array([1.0, 2.0], np.float32), "stored": np.array([3, 4], np.int32),
                       "q": Tensor("i4", np.array([-8, 7], np.int8)), "pz": np.array([9.0, 9.0], np.float32),
                       "decl_only": Tensor("f32", None, shape=(2,))})
    g = graph(var("w", K.CONSTANT, "f32", "D"),
              var("alias", K.CONSTANT, "i32", 2, ref="stored"),
              var("q", K.CONSTANT, "i4", 2),
              var("eps", K.CONSTANT, "f32"),
              var("n_meta", K.CONSTANT, "i32"),  # u8 metadata, value-preserving conversion
              var("arr", K.VOLATILE, "i16", 2),
              var("flags", K.CONSTANT, "bitset"),
              var("x", K.DYNAMIC, "f16", "D", init=lit(0.25)),
              var("v", K.VOLATILE, "bool", 3, init=lit(True)),
              var("z", K.VOLATILE, "i8", 2, 2),
              var("pz", K.PERSISTENT, "f32", "D", init=lit(2.0)),  # persistent ignores the model
              var("decl_only", K.CONSTANT, "f32", 2, init=lit(-1.0)),
              nodes=[ir.Assign(index=0, span=span(91), name="t", dtype="u4", dims=dims(3))])
    b = bind(g, m)
    assert b.initial("w").tolist() == [1.0, 2.0] and b.initial("w").dtype == np.float32
    assert b.initial("alias").tolist() == [3, 4]
    assert b.initial("q").tolist() == [-8, 7] and b.initial("q").dtype == np.int8
    assert b.initial("eps").shape == () and b.initial("eps") == 0.5
    assert b.initial("n_meta").dtype == np.int32 and b.initial("n_meta") == 7
    assert b.initial("arr").tolist() == [1, 2]
    assert b.initial("flags").dtype == np.uint8 and b.initial("flags") == 0b101
    assert b.initial("x").dtype == np.float16 and b.initial("x").tolist() == [0.25, 0.25]
    assert b.initial("v").tolist() == [True] * 3
    assert b.initial("z").dtype == np.int8 and not b.initial("z").any() and b.initial("z").shape == (2, 2)
    assert b.initial("pz").tolist() == [2.0, 2.0]
    assert b.initial("decl_only").tolist() == [-1.0, -1.0]
    assert b.initial("t").dtype == np.uint8 and b.initial("t").tolist() == [0, 0, 0]
    assert b.const_value("w").tolist() == [1.0, 2.0] and b.const_value("x") is None
    assert b.const_value("pz") is None and b.const_value("nope") is None
    assert b.metadata_string("name") == "relu" and b.metadata_string("eps") is None
    assert b.metadata_string("missing") is None
    assert not b.initial("w").flags.writeable
    assert b.missing_constants() == []


def test_fill_value_low_precision():
    assert fill_value("f8", (2,), lit(1.9)).view(np.uint8).tolist() == [0x3C, 0x3C]  # carry dropped: 1.0
    assert fill_value("bf16", (), lit(1.0)).dtype == ml_dtypes.bfloat16
    assert fill_value("f64", (), lit(0.1)) == 0.1
    assert fill_value("t1", (2,), lit(-1)).tolist() == [-1, -1]
    assert fill_value("u2", (1,), lit(3)).dtype == np.uint8
    assert fill_value("f32", (2,), None).tolist() == [0.0, 0.0]


def test_missing_constants_listed(tmp_path):
    m = model(tmp_path, tensors={"a": np.zeros(1, np.float32)}, metadata={"k": 1})
    g = graph(var("a", K.CONSTANT, "f32", 1), var("k", K.CONSTANT, "u8"), var("gone", K.CONSTANT, "f32", 1))
    assert [d.name for d in bind(g, m).missing_constants()] == ["gone"]
    # without a model, a constant with no @init has no value: zeros only when asked for (issue 34 item 3)
    with pytest.raises(OiError) as exc:
        bind(g, None, no_model="no model given and none found at g.oinf")
    assert [(d.message, d.span.line) for d in exc.value.diagnostics] == [
        (f"constant {n} has no value (no model given and none found at g.oinf, and no @init); give a model, or ask "
         f"for OpenInfer's zeros with --zero-missing-inputs (zero_missing_inputs=True)", 1) for n in ("a", "k", "gone")]
    zeros = bind(g, None, zero_missing_inputs=True)
    assert zeros.missing_constants() == [] and zeros.zero_missing_inputs
    assert zeros.initial("gone").tolist() == [0.0]
    assert bind(graph(var("c", K.CONSTANT, "f32", 1, init=lit(2.0))), None).initial("c").tolist() == [2.0]


# ---------------------------------------------------------------- binding errors

def test_model_dtype_and_shape_mismatch(tmp_path):
    m = model(tmp_path, sizevars={"D": 4}, tensors={"w": np.zeros((4, 2), np.float16), "b": np.zeros(3, np.float32)})
    g = graph(var("w", K.CONSTANT, "f32", "D", 2, line=5), var("b", K.CONSTANT, "f32", "D", line=6))
    with pytest.raises(OiError) as exc:
        bind(g, m)
    msgs = [(d.message, d.span.line) for d in exc.value.diagnostics]
    assert msgs == [("model dtype mismatch for w: model f16, graph f32" + WIDEN_HINT, 5),
                    ("model shape mismatch for b: model [3], graph [4]", 6)]


def test_ref_to_missing_tensor(tmp_path):
    m = model(tmp_path, tensors={"a": np.zeros(1, np.float32)})
    ref_span = ir.Span("t.oi", 7, 20)
    g = graph(var("x", K.CONSTANT, "f32", 1, line=7, ref="nope", attr_spans=(("ref", ref_span),)))
    with pytest.raises(OiError, match="model variable not found: nope") as exc:
        bind(g, m)
    assert exc.value.diagnostics[0].span == ref_span
    # without a model, @ref is not checked (x reads as zeros when asked for)
    assert bind(g, None, zero_missing_inputs=True).initial("x").tolist() == [0.0]


def test_metadata_string_read_as_tensor(tmp_path):
    m = model(tmp_path, metadata={"act": "relu", "wide": Meta("bitset", np.ones(9, bool)), "k": 300})
    with pytest.raises(OiError, match="metadata act is a string and cannot be read as a tensor"):
        bind(graph(var("act", K.CONSTANT, "f32", line=3)), m)
    with pytest.raises(OiError, match="bitset of 9 bits"):
        bind(graph(var("wide", K.CONSTANT, "bitset")), m)
    with pytest.raises(OiError, match="model dtype mismatch for k: model u16 \\(metadata\\), graph i8"):
        bind(graph(var("k", K.CONSTANT, "i8")), m)
    with pytest.raises(OiError, match="model shape mismatch for k"):
        bind(graph(var("k", K.CONSTANT, "u16", 2)), m)
    # a dynamic variable of that name is host-supplied: binding does not read the metadata eagerly
    b = bind(graph(var("act", K.DYNAMIC, "f32")), m)
    with pytest.raises(OiError, match="string"):
        b.initial("act")


def test_integer_metadata_read_as_a_float_is_exact_or_refused(tmp_path):
    """An integer metadata entry read by a float constant converts only when exact, compared as
    integers: i64 2**53 + 1 read as f64, and u64 2**64 - 1 as f32, were rounded silently (both sides
    compared after rounding through float64), while i64 2**24 + 1 as f32 was refused."""
    m = model(tmp_path, metadata={"a": Meta("i64", np.int64(2**53 + 1)), "b": Meta("u64", np.uint64(2**64 - 1)),
                                  "c": Meta("i64", np.int64(2**24 + 1)), "d": Meta("i64", np.int64(2**53)),
                                  "e": Meta("u64", np.uint64(2**63)), "f": Meta("i64", np.int64(70000))})
    for name, dtype in (("a", "f64"), ("b", "f32"), ("c", "f32"), ("f", "f16")):
        with pytest.raises(OiError, match=rf"model dtype mismatch for {name}: model [iu]64 \(metadata\), graph {dtype}"):
            bind(graph(var(name, K.CONSTANT, dtype)), m)
    for name, dtype, value in (("d", "f64", 2.0**53), ("e", "f32", 2.0**63), ("c", "f64", 2.0**24 + 1)):
        got = bind(graph(var(name, K.CONSTANT, dtype)), m).initial(name)
        assert got.dtype == dt.get(dtype).np_dtype and float(got) == value, name


# ---------------------------------------------------------------- prefix tables

def test_family_from_residual_mlp_stack():
    m = open_model(MODELS / "residual_mlp_stack.oinf")
    W = var("W", K.CONSTANT, "f32", "D", "D", index_params=("layer",), pattern="res.mlp.w.{layer}")
    bvar = var("b", K.CONSTANT, "f32", "D", index_params=("layer",), pattern="res.mlp.b.{layer}")
    b = bind(graph(W, bvar, var("bias0", K.CONSTANT, "f32", "D")), m)
    fam = b.family("W")
    assert fam.shape == (3, 32, 32) and fam.dtype == np.float32
    for i in range(3):
        assert np.array_equal(fam[i], m.load(f"res.mlp.w.{i}"))
    assert b.family("b").shape == (3, 32)
    assert b.family("W") is fam
    assert b.member_name(W, (2,)) == "res.mlp.w.2"
    assert b.member_name("b", (0,)) == "res.mlp.b.0"
    assert b.family_counts("W") == (3,)
    assert b.loop_bound("num_layers") == 3


def test_family_two_params_by_name(tmp_path):
    tensors = {f"attn.{h}.qkv.{l}": np.full(2, 10 * l + h, np.float32) for l in range(2) for h in range(3)}
    m = model(tmp_path, tensors=tensors)
    qkv = var("QKV", K.CONSTANT, "f32", 2, index_params=("layer", "head"), pattern="attn.{head}.qkv.{layer}")
    b = bind(graph(qkv), m)
    assert b.member_name(qkv, (1, 0)) == "attn.0.qkv.1"
    fam = b.family("QKV")
    assert fam.shape == (2, 3, 2)
    assert fam[1, 2].tolist() == [12.0, 12.0] and fam[0, 1].tolist() == [1.0, 1.0]
    with pytest.raises(OiError, match="takes 2 indices, got 1"):
        b.member_name(qkv, (1,))


def test_family_hole_and_mismatch(tmp_path):
    m = model(tmp_path, tensors={"res.mlp.w.0": np.zeros(2, np.float32), "res.mlp.w.2": np.zeros(2, np.float32)})
    W = var("W", K.CONSTANT, "f32", 2, index_params=("layer",), pattern="res.mlp.w.{layer}", line=4)
    b = bind(graph(W), m)
    with pytest.raises(OiError, match="prefix table W: model tensor res.mlp.w.1 not found") as exc:
        b.family("W")
    assert exc.value.diagnostics[0].span.line == 4
    m2 = model(tmp_path, "m2.oinf", tensors={"res.mlp.w.0": np.zeros(2, np.float32),
                                            "res.mlp.w.1": np.zeros(3, np.float32)})
    with pytest.raises(OiError, match=r"model shape mismatch for W\[1\] \(res.mlp.w.1\): model \[3\], graph \[2\]"):
        bind(graph(W), m2)
    m3 = model(tmp_path, "m3.oinf", tensors={"res.mlp.w.0": np.zeros(2, np.float64)})
    with pytest.raises(OiError, match=r"model dtype mismatch for W\[0\]"):
        bind(graph(W), m3)
    # leading zeros / other names do not match the pattern
    m4 = model(tmp_path, "m4.oinf", tensors={"res.mlp.w.00": np.zeros(1, np.float64), "res.mlp.w.x": np.zeros(1)})
    with pytest.raises(OiError, match="no model tensor matches pattern"):
        bind(graph(W), m4).family("W")
    with pytest.raises(OiError, match="no model tensor matches"):
        bind(graph(W), None).family("W")
    with pytest.raises(OiError, match="not a prefix table"):
        bind(graph(W, var("x", K.CONSTANT, "f32")), None, zero_missing_inputs=True).family("x")


def test_family_packed_members(tmp_path):
    m = model(tmp_path, tensors={"q.0": Tensor("i4", np.array([-1, 2], np.int8)),
                                 "q.1": Tensor("i4", np.array([7, -8], np.int8))})
    b = bind(graph(var("Q", K.CONSTANT, "i4", 2, index_params=("i",), pattern="q.{i}")), m)
    fam = b.family("Q")
    assert fam.dtype == np.int8 and fam.tolist() == [[-1, 2], [7, -8]]


# ---------------------------------------------------------------- loop bounds

def test_loop_bounds(tmp_path):
    m = model(tmp_path, sizevars={"L": 3}, metadata={"n_meta": 5, "s": "x", "f": 1.5},
              tensors={"n_const": np.array(4, np.int32), "fc": np.array(2.9, np.float32)})
    g = graph(var("n_const", K.CONSTANT, "i32"), var("fc", K.CONSTANT, "f32"), var("n_dyn", K.DYNAMIC, "i32"),
              var("n_pers", K.PERSISTENT, "i32", init=lit(2)), var("n_init", K.CONSTANT, "i64", init=lit(6)))
    b = bind(g, m)
    assert b.loop_bound(7) == 7
    assert b.loop_bound("L") == 3
    assert b.loop_bound("n_meta") == 5
    assert b.loop_bound("n_const") == 4
    assert b.loop_bound("fc") == 2  # truncated toward zero
    assert b.loop_bound("n_init") == 6
    assert b.loop_bound("n_dyn") is None and b.loop_bound("n_pers") is None
    with pytest.raises(OiError, match="unknown variable zz"):
        b.loop_bound("zz")
    with pytest.raises(OiError, match="not an integer"):
        b.loop_bound("s")
    with pytest.raises(OiError, match="not an integer"):
        b.loop_bound("f")


def test_example_model_binding_mlp():
    m = open_model(MODELS / "mlp_regression.oinf")
    g = graph(var("x", K.DYNAMIC, "f32", "B", "D"), var("w1", K.CONSTANT, "f32", "D", "H"),
              var("b1", K.CONSTANT, "f32", "H"), var("w2", K.CONSTANT, "f32", "H", "O"),
              var("b2", K.CONSTANT, "f32", "O"), var("h", K.VOLATILE, "f32", "B", "H"),
              var("y", K.VOLATILE, "f32", "B", "O"))
    b = bind(g, m)
    assert b.shape("h") == (4, 32) and b.initial("w2").shape == (32, 8)
    assert np.array_equal(b.initial("w1"), m.load("w1"))
    assert not b.initial("x").any()
    assert m.bytes_loaded == (16 * 32 + 32 * 8) * 4  # only what was asked


# ---------------------------------------------------------------- the shipped examples, through the parser

@pytest.mark.parametrize("name", ["linear_attention", "residual_mlp_stack", "quantized_linear", "cache_window_slice",
                                  "mlp_regression", "streaming_pipeline"])
def test_examples_bind_to_their_models(name):
    from conftest import EXAMPLES
    from oi2jax.grammar.parse import parse_file
    g = parse_file(str(EXAMPLES / f"{name}.oi"))
    m = open_model(MODELS / f"{name}.oinf")
    b = bind(g, m)
    for decl in g.vars:
        if decl.is_prefix_table:
            fam = b.family(decl.name)
            assert fam.shape[len(decl.index_params):] == b.shape(decl.name)
            assert fam.shape[0] == m.sizevars.get("num_heads", m.sizevars.get("num_layers"))
        else:
            v = b.initial(decl.name)
            assert v.shape == b.shape(decl.name)
            assert v.dtype == dt.get(b.dtype(decl.name)).np_dtype
    assert b.missing_constants() == []
    if name == "quantized_linear":
        assert b.initial("x").reshape(-1)[:4].tolist() == [7, 0, 6, -1]


def test_a_compiled_program_keeps_no_host_copy_of_the_model():
    """Once its constants are on the device, a Program drops the host values it read (the
    model reader's and the bound graph's): a model's weights are not held twice. Anything read
    later comes from the file again, with the same values."""
    import oi2jax
    from conftest import EXAMPLES, assert_matches, graph_ops
    prog = oi2jax.compile(EXAMPLES / "mlp_regression.oi", model=EXAMPLES / "mlp_regression.oinf")
    model = prog.bound.model
    assert model.loaded_whole and model.held == []
    interp = oi2jax.compile(EXAMPLES / "mlp_regression.oi", model=EXAMPLES / "mlp_regression.oinf",
                            mode="interpret")
    x = np.random.default_rng(2).standard_normal(prog.bound.shape("x")).astype(np.float32)
    want = interp.run({"x": x})
    got = prog.run({"x": x})
    assert_matches({n: np.asarray(got[n]) for n in want}, {n: np.asarray(want[n]) for n in want},
                   graph_ops(EXAMPLES / "mlp_regression.oi"))  # bit for bit on a CPU



def test_check_finds_a_hole_in_a_family_as_run_does(tmp_path, capsys):
    """A layer's weight missing from a family (w.2 absent, w.3 present): `check` passed and `run`
    failed, its message without the source line. `check` now names the missing tensor at the
    declaration, with its caret, as the run's error does; a family far past its members (a
    member named w.1000000000) is the same error, found without walking the grid."""
    from conftest import run_cli
    src = ('constant { W(l): f32[2] @pattern("w.{l}"); }\nvolatile { y: f32[2]; }\n'
           "block entry {\n    loop ls (l in 0..3) { op add(y, W[l]) >> y; }\n    return;\n}\n")
    (tmp_path / "g.oi").write_text(src)
    for name, last in (("m.oinf", "w.3"), ("far.oinf", "w.1000000000")):
        save(tmp_path / name, tensors={t: np.ones(2, np.float32) for t in ("w.0", "w.1", last)})
        code, _, err = run_cli(capsys, "check", tmp_path / "g.oi", "--model", tmp_path / name)
        assert code == 1 and err == (f"{tmp_path / 'g.oi'}:1:12: error: prefix table W: model tensor w.2 not found\n"
                                     f"    constant {{ W(l): f32[2] @pattern(\"w.{{l}}\"); }}\n"
                                     f"               ^\n"), err
    save(tmp_path / "whole.oinf", tensors={f"w.{i}": np.ones(2, np.float32) for i in range(3)})
    assert run_cli(capsys, "check", tmp_path / "g.oi", "--model", tmp_path / "whole.oinf")[0] == 0


def test_family_hole_two_parameters():
    from oi2jax.naming import family_hole
    grid = {(a, b): f"t{a}{b}" for a in range(2) for b in range(3)}
    assert family_hole(grid) is None
    assert family_hole({k: v for k, v in grid.items() if k != (1, 0)}) == (1, 0)
    assert family_hole({(0, 0): "a", (0, 10**9): "b"}) == (0, 1)
    assert family_hole({}) is None
