"""OpenInfer graph JSON (SPEC §8.1) as input: api.load_graph and `oi2jax check|run|compile` (issue 11, part 2)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from oi2jax import api, ir
from oi2jax.cli import main
from oi2jax.diagnostics import OiError
from oi2jax.grammar.fmt import strip_spans
from oi2jax.grammar.parse import parse, parse_file
from oi2jax.graph_json import to_json

from conftest import EXAMPLES

EXAMPLE_GRAPHS = sorted(EXAMPLES.glob("*.oi"))

# The residual MLP stack with extra declarations covering every init-scalar shape, as .oi text ...
OI_TEXT = """
dynamic {
    x: f32[B, D];
}
constant {
    bias0: f32[D];
    W(layer): f32[D, D] @pattern("res.mlp.w.{layer}");
    b(layer): f32[D] @pattern("res.mlp.b.{layer}");
}
volatile {
    scale: f32 @init(5.0);
    y: f32[B, D];
    h: f32[B, D];
    half: f16[D] @init(1.0);
}
persistent {
    count: i32 @init(0);
    q: i4 @init(-1);
    flag: bool @init(true);
}
block entry {
    op add(x, bias0) >> y;
    loop layers (l in 0..num_layers) {
        op matmul(y, W[l]) >> h;
        op add(h, b[l]) >> h;
        op relu(h, alpha=0.0, clamp_max=6.0) >> h;
        op add(y, h) >> y;
    }
    op mul(y, scale) >> y;
    cache.increment count;
    return;
}
"""


def _var(name, dtype, dims, kind, init=None, pattern=None, table_indices=()):
    return {"init": init, "kind": kind, "dims": dims, "dtype": dtype, "fixed": [], "auto_dim": [],
            "table": False, "table_indices": list(table_indices), "pattern": pattern, "ref_name": None,
            "name": name}


def _op(index, uuid, op, inputs, output, attrs=()):
    return {"uuid": uuid, "kind": {"Op": {"output": output, "inputs": inputs, "op": op,
                                          "attrs": {"items": [{"value": v, "name": n} for n, v in attrs]}}},
            "index": index}


# ... and hand-written in OpenInfer's serializer shape: uuid4s, map keys in another order, attrs in
# hash order, "W[l]" input strings, externally tagged enums, {"F32": 5.0} / {"F16": {"bits": ..}} inits.
FIXTURE = {
    "vars": {
        "flag": _var("flag", "Bool", [], "Persistent", {"Bool": True}),
        "q": _var("q", "I4", [], "Persistent", {"I4": {"bits": 15}}),
        "count": _var("count", "I32", [], "Persistent", {"I32": 0}),
        "half": _var("half", "F16", ["D"], "Volatile", {"F16": {"bits": 15360}}),
        "h": _var("h", "F32", ["B", "D"], "Volatile"),
        "y": _var("y", "F32", ["B", "D"], "Volatile"),
        "scale": _var("scale", "F32", [], "Volatile", {"F32": 5.0}),
        "b": _var("b", "F32", ["D"], "Constant", pattern="res.mlp.b.{layer}", table_indices=["layer"]),
        "W": _var("W", "F32", ["D", "D"], "Constant", pattern="res.mlp.w.{layer}", table_indices=["layer"]),
        "bias0": _var("bias0", "F32", ["D"], "Constant"),
        "x": _var("x", "F32", ["B", "D"], "Dynamic"),
    },
    "next_index": 9,
    "blocks": {"entry": {"nodes": [
        _op(0, "0f8fad5b-d9cb-469f-a165-70867728950e", "add", ["x", "bias0"], "y"),
        {"index": 5, "uuid": "7c9e6679-7425-40de-944b-e07fc1f90ae7", "kind": {"Loop": {
            "body": [
                _op(1, "3b241101-e2bb-4255-8caf-4136c566a962", "matmul", ["y", "W[l]"], "h"),
                _op(2, "5a8d4a2e-8c3b-4f7e-9a1d-2b6c7d8e9f01", "add", ["h", "b[l]"], "h"),
                _op(3, "e4eaaaf2-d142-11e1-b3e4-080027620cdd", "relu", ["h"], "h",
                    attrs=[("clamp_max", {"Float": 6.0}), ("alpha", {"Double": 0.0})]),
                _op(4, "16fd2706-8baf-433b-82eb-8c7fada847da", "add", ["y", "h"], "y"),
            ],
            "end": "num_layers", "start": "0", "index": "l", "name": "layers"}}},
        _op(6, "886313e1-3b8a-4372-9b90-0c9aee199e5d", "mul", ["y", "scale"], "y"),
        {"index": 7, "uuid": "a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d",
         "kind": {"CacheIncrement": {"amount": 1, "target": "count"}}},
        {"index": 8, "uuid": "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a", "kind": "Return"},
    ], "name": "entry"}},
}


def _normalized(graph: ir.Graph):
    """IR up to spans, with the order-free parts of §8.1 (var map order, attrs items) sorted."""
    graph = strip_spans(graph)

    def fix(node):
        if isinstance(node, ir.Op):
            return dataclasses.replace(node, attrs=tuple(sorted(node.attrs, key=lambda a: a.name)))
        if isinstance(node, ir.Loop):
            return dataclasses.replace(node, body=tuple(fix(n) for n in node.body))
        return node
    blocks = tuple(dataclasses.replace(b, nodes=tuple(fix(n) for n in b.nodes)) for b in graph.blocks)
    return ir.Graph(tuple(sorted(graph.vars, key=lambda v: v.name)), blocks, "<string>", "")


@pytest.mark.parametrize("path", EXAMPLE_GRAPHS, ids=lambda p: p.stem)
def test_round_trip_equals_parsed_ir(path, tmp_path):
    parsed = parse_file(str(path))
    text = json.dumps(to_json(parsed))
    json_file = tmp_path / f"{path.stem}.json"
    json_file.write_text(text)
    assert strip_spans(api.load_graph(json.loads(text))) == strip_spans(parsed)  # a dict
    assert strip_spans(api.load_graph(str(json_file))) == strip_spans(parsed)  # a .json path (str)
    assert strip_spans(api.load_graph(json_file)) == strip_spans(parsed)  # a PathLike


def test_openinfer_shaped_fixture_loads_as_the_oi_text():
    loaded = api.load_graph(FIXTURE)
    assert _normalized(loaded) == _normalized(parse(OI_TEXT))
    assert loaded.var("half").init == ir.Literal("float", 1.0)
    assert loaded.var("q").init == ir.Literal("int", -1)
    assert loaded.var("scale").init == ir.Literal("float", 5.0)
    assert loaded.var("flag").init == ir.Literal("bool", True)


def test_fixture_runs_like_the_oi_text(tmp_path, capsys):
    model = EXAMPLES / "residual_mlp_stack.oinf"
    fixture = tmp_path / "stack.json"
    fixture.write_text(json.dumps(FIXTURE))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    from_oi = api.compile(OI_TEXT, model=model).run({"x": x}, steps=2)
    from_json = api.compile(str(fixture), model=model).run({"x": x}, steps=2)
    assert set(from_oi) == set(from_json)
    for name in from_oi:
        np.testing.assert_array_equal(from_oi[name], from_json[name], err_msg=name)
    assert int(from_json["count"]) == 2 and int(from_json["q"]) == -1
    # the CLI: check, run (--out), compile
    np.save(tmp_path / "x.npy", x)
    assert main(["check", str(fixture), "--model", str(model)]) == 0
    out = tmp_path / "out.npz"
    assert main(["run", str(fixture), "--model", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--steps", "2",
                 "--out", str(out), "--quiet", "--cache-dir", "none"]) == 0
    np.testing.assert_array_equal(np.load(out)["y"], from_oi["y"])
    assert main(["compile", str(fixture), "--model", str(model), "--emit", "jaxpr", "--cache-dir", "none"]) == 0
    assert "dot_general" in capsys.readouterr().out


def test_json_model_defaults_next_to_graph(tmp_path, capsys):
    (tmp_path / "g.json").write_text(json.dumps(to_json(parse_file(str(EXAMPLES / "mlp_regression.oi")))))
    (tmp_path / "g.oinf").write_bytes((EXAMPLES / "mlp_regression.oinf").read_bytes())
    assert main(["run", str(tmp_path / "g.json"), "--cache-dir", "none", "--zero-missing-inputs"]) == 0
    assert "y: float32[4, 8]" in capsys.readouterr().out  # sizes from g.oinf, found next to g.json
    assert main(["check", str(tmp_path / "g.json")]) == 0


def test_bad_json_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["check", str(bad)]) == 1
    assert "cannot read graph JSON" in capsys.readouterr().err
    bad.write_text(json.dumps({"blocks": {}, "vars": {"x": {"name": "x"}}}))
    assert main(["check", str(bad)]) == 1
    assert "not an OpenInfer graph JSON (SPEC §8.1)" in capsys.readouterr().err
    assert main(["check", str(tmp_path / "missing.json")]) == 1
    assert "graph file not found" in capsys.readouterr().err
    with pytest.raises(OiError, match="not an OpenInfer graph JSON"):
        api.load_graph({"vars": {}})
    good = tmp_path / "good.json"
    good.write_text(json.dumps(FIXTURE))
    assert main(["fmt", str(good), "-i"]) == 2  # would overwrite JSON with .oi text
    assert json.loads(good.read_text()) == FIXTURE
    assert main(["fmt", str(good)]) == 0  # .json -> canonical .oi text on stdout
    assert _normalized(parse(capsys.readouterr().out)) == _normalized(parse(OI_TEXT))


def test_a_member_reference_without_its_closing_bracket_is_refused():
    data = to_json(parse("constant { W(l): f32[2] @pattern(\"w.{l}\"); }\nvolatile { y: f32[2]; }\n"
                         "block entry { op add(y, W[1]) >> y; return; }"))
    op = data["blocks"]["entry"]["nodes"][0]["kind"]["Op"]
    assert op["inputs"][1] == "W[1]" and api.load_graph(data).entry.nodes[0].inputs[1].indices == (1,)
    op["inputs"][1] = "W[1"
    with pytest.raises(OiError, match=r"variable reference 'W\[1': expected NAME or NAME\[INDEX, \.\.\.\]"):
        api.load_graph(data)


@pytest.mark.parametrize("mutate,message", [
    (lambda op: op.update(op=None), "an op name must be a name, got None"),
    (lambda op: op.update(op=True), "an op name must be a name, got True"),
    (lambda op: op.update(inputs=[op["inputs"][0], {"Literal": {"Int": "7"}, "dtype": None}]),
     "an Int value must be an integer, got '7'"),
    (lambda op: op.update(inputs=[op["inputs"][0], {"Literal": {"Double": "1"}, "dtype": None}]),
     "a Double value must be a number, got '1'"),
    (lambda op: op["attrs"]["items"].append({"name": None, "value": {"Double": 1.0}}),
     "a setting's name must be a name, got None"),
    (lambda op: op["attrs"]["items"].append({"name": "axes", "value": {"IntList": ["1"]}}),
     "an IntList item must be a name, got '1'"),
    (lambda op: op["attrs"]["items"].append({"name": "axes", "value": {"IntList": [1.5]}}),
     "an IntList item must be an integer, got 1.5"),
    (lambda op: op["attrs"]["items"].append({"name": "keepdims", "value": {"Bool": 1}}),
     "a Bool value must be true or false, got 1"),
    (lambda op: op["attrs"]["items"].append({"name": "acc", "value": {"DTypeList": ["I32", 5]}}),
     "a DTypeList setting must be a list of dtype names, got ['I32', 5]"),  # was AttributeError: 'int' ... 'lower'
    (lambda op: op["attrs"]["items"].append({"name": "acc", "value": {"DTypeList": "I64"}}),
     "a DTypeList setting must be a list of dtype names, got 'I64'"),  # was read as acc=[i, 6, 4]
    (lambda op: op["attrs"]["items"].append({"name": "acc", "value": {"DType": 3}}),
     "a DType setting must be a dtype name, got 3"),
])
def test_an_ops_fields_of_the_wrong_type_are_refused_with_the_file(tmp_path, capsys, mutate, message):
    """An op's name or setting name of null or true, or a literal `{"Int": "7"}`, went on to the
    checker and ended as an internal error (TypeError); each is now the file's error."""
    data = json.loads(json.dumps(FIXTURE))
    op = next(n["kind"]["Op"] for b in data["blocks"].values() for n in b["nodes"]
              if isinstance(n["kind"], dict) and "Op" in n["kind"])
    mutate(op)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {bad}: not an OpenInfer graph JSON (SPEC §8.1): ValueError: {message}\n", err


def test_compile_graph_json_refuses_flags_that_only_shape_a_compile(tmp_path, capsys):
    """`compile --emit graph-json` compiles nothing: --precision, --unroll, --kernels, --device and
    --zero-missing-inputs were dropped without a word; they are usage errors now (with --dump-dir,
    which compiles the forms it dumps, they apply). --size checks the graph and says that the JSON
    keeps the names; --widen-floats reaches the check."""
    graph = str(EXAMPLES / "mlp_regression.oi")
    out = str(tmp_path / "g.json")
    for flag in (["--precision", "high"], ["--unroll", "full"], ["--kernels", "ggml"], ["--device", "cpu"],
                 ["--zero-missing-inputs"]):
        assert main(["compile", graph, "--emit", "graph-json", *flag, "-o", out]) == 2
        err = capsys.readouterr().err
        assert f"error: {flag[0]} has no effect on --emit graph-json: nothing is compiled" in err, err
        assert not (tmp_path / "g.json").exists()
    # given at its default value too: `--precision highest` shapes no JSON either (it was taken without a word)
    for flag in (["--precision", "highest"], ["--unroll", "auto"], ["--kernels", "jax"]):
        assert main(["compile", graph, "--emit", "graph-json", *flag, "-o", out]) == 2
        err = capsys.readouterr().err
        assert f"error: {flag[0]} has no effect on --emit graph-json: nothing is compiled" in err, err
        assert not (tmp_path / "g.json").exists()
    assert main(["compile", graph, "--emit", "graph-json", "--size", "B=9", "-o", out]) == 0
    assert "note: --size checks the graph at those sizes; graph JSON keeps the size names" in capsys.readouterr().err
    assert '"B"' in (tmp_path / "g.json").read_text()


@pytest.mark.parametrize("literal,dtype", [({"Int": 7}, "F32"), ({"Bool": True}, "I32"), ({"Bool": True}, "Bool"),
                                           ({"Double": 1.5}, "I32"), ({"Double": float("inf")}, "F32")])
def test_a_literal_input_with_a_dtype_no_suffix_writes_is_the_files_error(tmp_path, capsys, literal, dtype):
    """A literal op input whose dtype its value cannot take as a suffix (`{"Int": 7}` with F32):
    `fmt G.json` wrote `7f32`, which parses as another literal, and its guard called that an oi2jax
    bug (the review of 2026-11-28); the file is refused as it is read now, by every command."""
    data = json.loads(json.dumps(FIXTURE))
    op = next(n["kind"]["Op"] for b in data["blocks"].values() for n in b["nodes"]
              if isinstance(n["kind"], dict) and "Op" in n["kind"])
    op["inputs"] = [op["inputs"][0], {"Literal": literal, "dtype": dtype}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    for command in ("fmt", "check"):
        assert main([command, str(bad)]) == 1
        err = capsys.readouterr().err
        assert f"error: {bad}: not an OpenInfer graph JSON (SPEC §8.1): ValueError: literal op input" in err, err
        assert "cannot have dtype" in err and "oi2jax bug" not in err, err


@pytest.mark.parametrize("mutate, where, message", [
    (lambda d: d["blocks"]["entry"]["nodes"][0]["kind"]["Op"]["inputs"].__setitem__(1, "bias9"),
     "#/blocks/entry/nodes/0", "unknown input variable bias9 (did you mean bias0?)"),
    (lambda d: d["blocks"]["entry"]["nodes"][1]["kind"]["Loop"]["body"][2]["kind"]["Op"].__setitem__("op", "relux"),
     "#/blocks/entry/nodes/1/kind/Loop/body/2", "unsupported op relux (did you mean relu?)"),
    (lambda d: d["vars"]["W"].__setitem__("pattern", "res.mlp.w.{lay}"),
     "#/vars/W", None),
])
def test_a_json_graphs_diagnostics_name_the_place_by_json_pointer(tmp_path, capsys, mutate, where, message):
    """A graph read from JSON has no lines: its diagnostics name the node, block or variable by
    its JSON pointer (RFC 6901), `g.json#/blocks/entry/nodes/1`, never `g.json:0:0`."""
    data = json.loads(json.dumps(FIXTURE))
    mutate(data)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(data))
    code = main(["check", str(path), "--model", str(EXAMPLES / "residual_mlp_stack.oinf")])
    err = capsys.readouterr().err
    assert code == 1 and ":0:0" not in err
    first = err.splitlines()[0]
    assert first.startswith(f"{path}{where}: error: "), err
    if message is not None:
        assert first == f"{path}{where}: error: {message}"


def test_t1_init_bits_are_its_storage_pattern():
    """A t1 value is -1 or +1, stored as bit 0 / bit 1 (SPEC §5). Graph JSON wrote `value & 1`, so
    `t1 @init(1)` and `t1 @init(-1)` both became {"bits": 1}, read back as -1: a round trip
    through graph JSON turned +1 into -1 (upstream probe)."""
    g = parse("persistent { a: t1 @init(1); b: t1 @init(-1); c: t2 @init(-1); }\nblock entry { return; }\n")
    inits = {name: v["init"] for name, v in to_json(g)["vars"].items()}
    assert inits == {"a": {"T1": {"bits": 1}}, "b": {"T1": {"bits": 0}}, "c": {"T2": {"bits": 3}}}
    back = api.load_graph(to_json(g))
    assert [back.var(n).init for n in "abc"] == [ir.Literal("int", 1), ir.Literal("int", -1), ir.Literal("int", -1)]
    out = api.compile(to_json(g)).run({})
    assert (int(out["a"]), int(out["b"]), int(out["c"])) == (1, -1, -1)


def test_fmt_takes_a_graph_json_whose_nodes_are_not_numbered_in_order(tmp_path, capsys):
    """Export probe: `compile --table-dtype f16 --emit graph-json` writes the rewritten graph, whose
    inserted cast nodes take the next free numbers (entry's nodes read 5, 0, 6, 1, ...); `fmt` of
    that JSON said "fmt would change the program ... (an oi2jax bug)" because its guard compared
    node numbers, which `.oi` text cannot carry. Node numbers are not compared now; the printed
    text runs as the JSON does."""
    gj = tmp_path / "kv16.json"
    assert main(["compile", str(EXAMPLES / "kv_cache_decode.oi"), "--table-dtype", "f16", "--emit", "graph-json",
                 "-o", str(gj)]) == 0
    indices = [n["index"] for n in json.loads(gj.read_text())["blocks"]["entry"]["nodes"]]
    assert indices != sorted(indices)  # the case: numbers out of source order
    capsys.readouterr()
    assert main(["fmt", str(gj)]) == 0
    text = capsys.readouterr().out
    assert "K(i): f16[D] @table @fixed(i=4);" in text and "op cast(q, to=f16) >> q_f16;" in text
    q = (np.arange(16) / 7).astype(np.float32)
    model = EXAMPLES / "kv_cache_decode.oinf"
    want = api.compile(EXAMPLES / "kv_cache_decode.oi", model=model, table_dtype="f16").run({"q": q}, steps=2)
    for graph in (text, str(gj)):
        got = api.compile(graph, model=model).run({"q": q}, steps=2)
        for k in want:
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), err_msg=k)
    # K (4 fixed rows) holds each query rounded to f16 once (NumPy: q.astype(float16)) in rows 0, 1
    np.testing.assert_array_equal(np.asarray(want["K"]),
                                  np.stack([q.astype(np.float16)] * 2 + [np.zeros(16, np.float16)] * 2))
    # a real change is still caught: the guard compares everything but the numbers
    from oi2jax.cli import same_program
    g = api.load_graph(str(gj))
    with pytest.raises(OiError, match="fmt would change the program"):
        same_program(g, text.replace("cache.increment t;", "cache.increment 2 t;"))
