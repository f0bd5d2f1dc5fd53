"""User-defined ops end to end (issue: ops the OpenInfer way, but open): a test-local `.py` op
file and an ops.json-form schema file, checked exactly like a built-in (each message pinned),
compiled == interpreted, the yield/await driver, sessions, export without the module, HLO
names, fmt and graph JSON, an entry point of the `oi2jax.ops` group."""
from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import oi2jax
from oi2jax import ops
from oi2jax.cli import main
from oi2jax.diagnostics import OiError
from oi2jax.graph_json import from_json, to_json
from oi2jax.grammar.fmt import format_graph
from oi2jax.grammar.parse import parse

from conftest import run_cli

HERE = Path(__file__).resolve().parent / "user_ops"
SCALED = str(HERE / "scaled.py")
BROKEN = str(HERE / "broken.py")

GRAPH = """\
dynamic { x: f32[4]; b: f32[3]; }
volatile { y: f32[4]; o: f32[4, 3]; s: f32[4]; }
block entry {
    op scaled_tanh(x, scale=2.0) >> y;
    op outer(y, b) >> o;
    op leaky_softplus(x, slope=0.25) >> s;
    return;
}
"""
INPUTS = {"x": np.array([-2.0, -0.5, 0.25, 3.0], np.float32), "b": np.array([1.0, -1.0, 0.5], np.float32)}


def _line(text: str, what: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if what in line)


def _src_line(path: str, what: str) -> int:
    return _line(Path(path).read_text(), what)


@pytest.fixture(scope="module")
def registry():
    return ops.load([SCALED, str(HERE / "schema_ops.json")])


def test_loaded_ops_carry_their_declaration(registry):
    d = registry["scaled_tanh"]
    assert d.source == f"{SCALED}:{_src_line(SCALED, 'def scaled_tanh') - 2}" and not d.builtin
    assert d.arity == 1 and d.attrs["scale"].kind == "float" and d.attrs["scale"].default == 1.0
    assert d.doc == "tanh(x) * scale." and d.elementwise
    s = registry["leaky_softplus"]
    assert s.inplace and s.attrs["slope"].default == 0.5 and s.normal_dtypes == {"f16", "bf16", "f32", "f64"}
    assert len(registry) == 47 + 3 and registry.sets[-1].endswith("schema_ops.json")


def test_compiled_equals_interpreted_and_numpy(registry):
    outs = {}
    for mode in ("compiled", "interpret"):
        outs[mode] = oi2jax.compile(GRAPH, ops=registry, mode=mode).run(INPUTS)
    y = np.tanh(INPUTS["x"].astype(np.float64)) * 2
    for mode in outs:  # the compiled kernel (f32 tanh) and the interpreter's NumPy reference (f64, rounded)
        np.testing.assert_allclose(outs[mode]["y"], y, rtol=1e-6)
        np.testing.assert_allclose(outs[mode]["o"], np.outer(outs[mode]["y"], INPUTS["b"]), rtol=1e-6)
    xs = INPUTS["x"].astype(np.float64)
    np.testing.assert_allclose(outs["compiled"]["s"], np.logaddexp(xs, 0) + 0.25 * np.minimum(xs, 0), rtol=1e-6)
    # leaky_softplus has no reference: the interpreter runs its kernel, bit for bit
    np.testing.assert_array_equal(outs["compiled"]["s"], outs["interpret"]["s"])


def test_interpreter_says_once_that_it_runs_a_kernel(registry, capsys):
    from oi2jax import interpret
    interpret._NOTED.discard(registry["outer"].source)
    prog = oi2jax.compile(GRAPH, ops=registry, mode="interpret")
    prog.run(INPUTS)
    prog.run(INPUTS)
    err = capsys.readouterr().err
    assert err.count(f"note: op outer (defined in {registry['outer'].source}) has no NumPy reference; "
                     f"the interpreter runs its JAX kernel") == 1


PIPELINE = """dynamic { x: f32[4]; }
volatile { y: f32[4]; z: f32[4]; }
persistent { acc: f32[4] @init(0.0); }
block entry {
    op scaled_tanh(x, scale=0.5) >> y;
    yield y;
    cache.read acc >> z;
    op add(z, y) >> z;
    cache.write z >> acc;
    await y;
    return;
}
block consumer {
    await y;
    op leaky_softplus(y, slope=0.5) >> y;
    yield y;
}
"""


def test_yield_await_driver_fused_interpreted_and_sessions(registry):
    steps = np.stack([np.full(4, v, np.float32) for v in (0.5, -1.0, 2.0)])
    runs = {}
    for name, kw in (("driver", {"yield_mode": "driver"}), ("fused", {"yield_mode": "fused"})):
        prog = oi2jax.compile(PIPELINE, ops=registry, **kw)
        sess = prog.session()
        for x in steps:
            sess.step(x=x)
        runs[name] = {"acc": sess.read("acc"), "y": sess.read("y")}
        fused_run = prog.session().run({"x": steps}, collect=("y",))
        np.testing.assert_array_equal(fused_run["acc"], runs[name]["acc"])
    interp = oi2jax.compile(PIPELINE, ops=registry, mode="interpret")
    out = interp.run({"x": steps[0]})
    np.testing.assert_array_equal(runs["driver"]["acc"], runs["fused"]["acc"])
    np.testing.assert_array_equal(runs["driver"]["y"], runs["fused"]["y"])
    first = oi2jax.compile(PIPELINE, ops=registry).run({"x": steps[0]})
    np.testing.assert_allclose(first["acc"], out["acc"], rtol=1e-6)
    np.testing.assert_allclose(first["y"], out["y"], rtol=1e-6)


@pytest.mark.parametrize("body,line_has,message", [
    ("op scaled_tanh(x, x) >> y;", "op scaled_tanh", "op scaled_tanh expects Fixed(1) inputs, got 2"),
    ("op scaled_tanh(x, scale=x) >> y;", "scale=", "attribute x must be scalar"),
    ("op scaled_tanh(x, scal=2.0) >> y;", "scal=", "unsupported scaled_tanh setting: scal (did you mean scale?)"),
    ("op scaled_tanh(x, scale=true) >> y;", "scale=", "op scaled_tanh setting scale must be a number, got bool True"),
    ("op scaled_tanh(n) >> y;", "(n)", None),  # the dtype message names the file: below
    ("op scaled_tanhh(x) >> y;", "op scaled_tanhh", "unsupported op scaled_tanhh (did you mean scaled_tanh?)"),
    ("op outer(x, n) >> o;", "n) >> o", None),
])
def test_check_errors_are_located_and_pinned(tmp_path, capsys, body, line_has, message):
    g = tmp_path / "g.oi"
    text = f"dynamic {{ x: f32[4]; n: i32[4]; }}\nvolatile {{ y: f32[4]; o: f32[4, 4]; }}\nblock entry {{\n    {body}\n" \
           f"    return;\n}}\n"
    g.write_text(text)
    code, _, err = run_cli(capsys, "check", str(g), "--ops", SCALED)
    where = f"{SCALED}:{_src_line(SCALED, 'def scaled_tanh') - 2}"
    if message is None and "outer" in body:
        message = "op outer input 1 has dtype i32, expected f32 (all inputs must match the first)"
    elif message is None:
        message = f"op scaled_tanh (defined in {where}) input 0 (x) has dtype i32, expected one of f16, f32, f64, bf16"
    line = text.splitlines()[3]
    col = line.index(line_has) + 1 + (1 if line_has.startswith("(") else 0)
    if line_has.startswith("op "):
        col += 3  # the caret points at the op's name
    assert code == 1 and f"{g}:4:{col}: error: {message}" in err, err


def test_declared_scalar_kinds_are_enforced(registry):
    """Issue 33: an attribute's `scalar_kinds` (OpenInfer's schema field) is checked, not just
    stored: schema_ops.json declares leaky_softplus's slope float or int, so true is refused."""
    from oi2jax.check import check
    for value, ok in (("0.25", True), ("2", True), ("true", False)):
        src = f"dynamic {{ x: f32[4]; }}\nvolatile {{ s: f32[4]; }}\nblock entry {{\n" \
              f"    op leaky_softplus(x, slope={value}) >> s;\n}}\n"
        errors = [d.message for d in check(parse(src), ops=registry) if d.severity == "error"]
        assert errors == ([] if ok else ["op leaky_softplus setting slope must be float or int, got bool True"])


@pytest.mark.parametrize("name,message", [
    ("raises", "op raises (defined in {f}:{l}): its kernel raised ValueError while tracing: boom"),
    ("wrong_dtype", "op wrong_dtype (defined in {f}:{l}): its kernel returned dtype int32, but the op's dtype "
                    "rule gives f32 (held as float32)"),
    ("wrong_shape", "op wrong_shape (defined in {f}:{l}): its kernel returned shape [8], expected [4]"),
])
def test_a_kernel_that_breaks_its_declaration_is_a_located_error(tmp_path, capsys, name, message):
    g = tmp_path / "g.oi"
    g.write_text(f"dynamic {{ x: f32[4]; }}\nvolatile {{ y: f32[4]; }}\nblock entry {{\n    op {name}(x) >> y;\n"
                 f"    return;\n}}\n")
    code, _, err = run_cli(capsys, "run", str(g), "--ops", BROKEN, "--zero-missing-inputs", "--quiet")
    line = _src_line(BROKEN, f"def {name}") - 1
    col = 5 if name == "wrong_shape" else 8  # found lowering the node / checking it (the op's name)
    assert code == 1 and f"{g}:4:{col}: error: {message.format(f=BROKEN, l=line)}" in err, err
    assert "Traceback" not in err


def test_a_name_clash_names_both_definitions(capsys):
    clash = str(HERE / "clash.py")
    with pytest.raises(OiError) as e:
        ops.load([clash])
    line = _src_line(clash, "def add") - 1
    assert str(e.value) == (f"error: op add is defined twice: in the built-in ops (OpenInfer's ops.json) and in "
                            f"{clash}:{line}")
    with pytest.raises(OiError) as e:
        ops.load([SCALED, str(HERE / "clash2.py")])
    assert str(e.value) == (f"error: op scaled_tanh is defined twice: in {SCALED}:"
                            f"{_src_line(SCALED, 'def scaled_tanh') - 2} and in {HERE / 'clash2.py'}:"
                            f"{_src_line(str(HERE / 'clash2.py'), 'def scaled_tanh') - 1}")


def test_malformed_schema_and_bad_specs_are_errors(tmp_path, capsys):
    bad = HERE / "bad_schema.json"
    with pytest.raises(OiError, match=r'bad_schema.json: ops\[0\] \(nope\): missing "type_rule"'):
        ops.load([str(bad)])
    no_kernel = tmp_path / "k.json"
    schema = json.loads((HERE / "schema_ops.json").read_text())
    del schema["ops"][0]["devices"]
    no_kernel.write_text(json.dumps(schema))
    with pytest.raises(OiError, match=r'ops\[0\] \(leaky_softplus\): no JAX kernel \(add "devices": '):
        ops.load([str(no_kernel)])
    with pytest.raises(OiError, match=r"unknown op set nnn \(did you mean nn\?\)"):
        ops.load(["nnn"])
    syntax = tmp_path / "syn.py"
    syntax.write_text("from oi2jax.ops import op\n\nraise RuntimeError('no')\n")
    with pytest.raises(OiError, match=rf"--ops {syntax}: importing it raised RuntimeError: no \(at {syntax}:3\)"):
        ops.load([str(syntax)])
    code, _, err = run_cli(capsys, "check", str(HERE.parent.parent / "examples" / "mlp_regression.oi"),
                           "--ops", str(syntax))
    assert code == 1 and err.startswith("error: --ops") and "Traceback" not in err


def test_hlo_names_and_locations(registry):
    prog = oi2jax.compile(GRAPH, ops=registry)
    text = prog.emit("stablehlo")
    assert "entry/0:scaled_tanh" in text and "entry/2:leaky_softplus" in text
    assert "<string>:4:" in text or ":4:5" in text


def test_fmt_and_graph_json_round_trip(registry):
    g = parse(GRAPH)
    assert format_graph(parse(format_graph(g))) == format_graph(g)
    back = from_json(json.loads(json.dumps(to_json(g))), "<json>")
    assert format_graph(back) == format_graph(g)
    a = oi2jax.compile(to_json(g), ops=registry).run(INPUTS)
    b = oi2jax.compile(GRAPH, ops=registry).run(INPUTS)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_export_runs_without_the_op_module(tmp_path, registry):
    from test_export import LOADER
    graph = tmp_path / "g.oi"
    graph.write_text(GRAPH)
    art = tmp_path / "out" / "step.jaxexport"
    assert main(["export", str(graph), "-o", str(art), "--ops", SCALED, "--ops", str(HERE / "schema_ops.json")]) == 0
    inp = tmp_path / "inputs.npz"
    np.savez(inp, **INPUTS)
    job = {"artifact": str(art), "steps": 1, "inputs": str(inp), "result": str(tmp_path / "res.npz")}
    loader = LOADER.replace('sys.modules["oi2jax"] = None', 'sys.modules["oi2jax"] = None\n'
                            'for m in [m for m in list(sys.modules) if "scaled" in m or "schema_kernels" in m]:\n'
                            '    sys.modules[m] = None')
    proc = subprocess.run([sys.executable, "-c", loader, json.dumps([job])], capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = np.load(job["result"])
    want = oi2jax.compile(GRAPH, ops=registry).run(INPUTS)
    for k in ("y", "o", "s"):
        np.testing.assert_array_equal(res["out." + k], want[k])


def test_pure_step_vmap_and_grad(registry):
    import jax
    import jax.numpy as jnp
    prog = oi2jax.compile(GRAPH, ops=registry)
    state = prog.init_state()
    xs = jnp.stack([INPUTS["x"], INPUTS["x"] * 2])
    ys = jax.vmap(lambda x: prog.step(state, x=x, b=INPUTS["b"])[1]["y"])(xs)
    np.testing.assert_allclose(np.asarray(ys[1]), np.tanh(INPUTS["x"] * 2) * 2, rtol=1e-6)
    state = prog.init_state()  # the step donates the state it is given: a fresh one
    g = jax.grad(lambda x: jnp.sum(prog.step(state, x=x, b=INPUTS["b"])[1]["y"]))(jnp.asarray(INPUTS["x"]))
    np.testing.assert_allclose(np.asarray(g), 2 * (1 - np.tanh(INPUTS["x"].astype(np.float64)) ** 2), atol=1e-6)


def test_an_entry_point_package(tmp_path, monkeypatch):
    """An installed package's op set, found through the `oi2jax.ops` entry-point group (simulated
    with importlib.metadata: a module on sys.path and its EntryPoint)."""
    pkg = tmp_path / "myorg_ops"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(Path(SCALED).read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint(name="myorg", value="myorg_ops", group="oi2jax.ops")
    from oi2jax.ops import loading
    monkeypatch.setattr(loading, "_entry_points_cached", lambda: (ep,))
    reg = ops.load(["myorg"])
    assert "scaled_tanh" in reg and reg.sets == ("myorg",)
    out = oi2jax.compile("dynamic { x: f32[2]; }\nvolatile { y: f32[2]; }\nblock entry {\n"
                         "    op scaled_tanh(x) >> y;\n    return;\n}\n", ops=["myorg"]).run(
        {"x": np.array([0.5, -1.0], np.float32)})
    np.testing.assert_allclose(out["y"], np.tanh([0.5, -1.0]), rtol=1e-6)


def test_runtime_check_of_an_op_is_a_located_error_both_ways(tmp_path):
    (tmp_path / "take.py").write_text(
        "import jax.numpy as jnp\nfrom oi2jax.ops import op\n\n"
        "@op(inputs={'table': 'float', 'ids': 'index'}, shape=lambda s, a: s[1] + s[0][1:])\n"
        "def take_rows(table, ids, *, ctx):\n"
        "    n = table.shape[0]\n"
        "    bad = (ids < 0) | (ids >= n)\n"
        "    ctx.fail_if(bad, 'take_rows: id {value} is outside the rows', jnp.max(jnp.where(bad, ids, -1)))\n"
        "    return table[jnp.clip(ids, 0, n - 1)]\n")
    src = ("dynamic { ids: i32[2]; tab: f32[4, 3]; }\nvolatile { y: f32[2, 3]; }\n"
           "block entry {\n    op take_rows(tab, ids) >> y;\n    return;\n}\n")
    tab = np.arange(12, dtype=np.float32).reshape(4, 3)
    for mode in ("compiled", "interpret"):
        prog = oi2jax.compile(src, ops=[str(tmp_path / "take.py")], mode=mode)
        np.testing.assert_array_equal(prog.run({"ids": np.array([3, 1], np.int32), "tab": tab})["y"], tab[[3, 1]])
        with pytest.raises(OiError) as e:
            prog.run({"ids": np.array([2, 9], np.int32), "tab": tab})
        assert "<string>:4:5: error: take_rows: id 9 is outside the rows (in step 1)" in e.value.render()


def _op_file(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text("import jax.numpy as jnp\nfrom oi2jax.ops import Attr, op\n\n" + text)
    return str(path)


G1 = "dynamic { x: f32[4]; }\nvolatile { y: f32[4]; }\nblock entry {\n    op myop(x) >> y;\n    return;\n}\n"


def test_out_dtype_rules_are_checked_at_declaration_and_guarded(tmp_path, capsys):
    """Probe (ops) 5: `input:N` past the inputs (or not a number, or an optional input) is refused
    where the op is declared; an `out_dtype` function that raises or returns a non-dtype is an
    error naming the op and its definition at the node: never `error: internal error (...)`."""
    for i, (rule, message) in enumerate((
            ("input:3", "out_dtype 'input:3' names no input of the op (N is one of 0 (x), 1 (b))"),
            ("input:z", "out_dtype 'input:z' names no input of the op (N is one of 0 (x), 1 (b))"),
            ("input:1", "out_dtype 'input:1' names input 1 (b), which is optional: a node may leave it out"))):
        f = _op_file(tmp_path, f"o{i}.py", f"@op(inputs={{'x': 'float', 'b?': 'same'}}, out_dtype={rule!r})\n"
                                       f"def myop(x, b=None):\n    return x\n")
        with pytest.raises(OiError) as e:
            ops.load([f])
        assert str(e.value).startswith(f"error: {f}:4: ") and message in str(e.value), str(e.value)
    g = tmp_path / "g.oi"
    g.write_text(G1)
    for rule, message in (("lambda d, a: d[5]", "its output dtype rule raised IndexError: list index out of range "
                                                "(at {f}:4, in <lambda>)"),
                          ("lambda d, a: 3", "its output dtype rule returned 3, not a dtype name")):
        f = _op_file(tmp_path, f"fn{len(rule)}.py", f"@op(inputs={{'x': 'float'}}, out_dtype={rule})\n"
                                                    f"def myop(x):\n    return x\n")
        code, _, err = run_cli(capsys, "check", str(g), "--no-model", "--ops", f)
        assert code == 1 and f"{g}:4:8: error: op myop (defined in {f}:4): {message.format(f=f)}" in err, err
        assert "internal error" not in err


def _schema(tmp_path, edit) -> str:
    """schema_ops.json with its kernel named by absolute path, changed by `edit(data, entry)`."""
    data = json.loads((HERE / "schema_ops.json").read_text())
    entry = data["ops"][0]
    entry["devices"]["jax"]["kernel"] = str(HERE / "schema_kernels.py") + ":leaky_softplus"
    edit(data, entry)
    path = tmp_path / f"s{abs(hash(json.dumps(data, sort_keys=True)))}.json"
    path.write_text(json.dumps(data))
    return str(path)


E = "ops[0] (leaky_softplus): "


@pytest.mark.parametrize("edit,message", [
    # probe (ops) 5: were `error: internal error (AttributeError ...)`
    (lambda d, e: e.update(outputs=[1]), E + '"outputs" must be an object {"arity": "fixed", "count": 1}, got [1] '
                                              '(a list)'),
    (lambda d, e: d.update(attr_defs=[1, 2]), "attr_defs: expected an object (attribute name -> definition), got "
                                               "[1, 2] (a list)"),
    (lambda d, e: d.update(dtype_sets={"SOFTPLUS_DTYPES": [1]}),
     'dtype_sets.SOFTPLUS_DTYPES: expected an object with a "normal" list, got [1] (a list)'),
    # probe (ops) 6: hostile or wrong-typed content, never allocated, coerced or ignored
    (lambda d, e: e["inputs"].update(count=10 ** 11), E + "inputs.count must be a whole number in 1..256, got "
                                                          "100000000000 (a number)"),
    (lambda d, e: e["inputs"].update(count=True), E + "inputs.count must be a whole number in 1..256, got true "
                                                      "(a boolean)"),
    (lambda d, e: d["ops"].append(dict(e)), "ops[1]: op leaky_softplus is defined twice in the file: ops[0] and "
                                            "ops[1]"),
    (lambda d, e: d["attr_defs"]["slope"].update(required="false"),
     'attr_defs.slope: "required" must be true or false, got "false" (a string)'),
    (lambda d, e: d["attr_defs"]["slope"].update(scalar_kinds="int"),
     'attr_defs.slope: "scalar_kinds" must be a list of float, int, uint, bool, got "int" (a string)'),
    (lambda d, e: d["attr_defs"]["slope"].update(default="hello"),
     'attr_defs.slope: "default" "hello" (a string) is not a float or int scalar value'),
    (lambda d, e: d["attr_defs"]["slope"].update(default=True),
     'attr_defs.slope: "default" true (a boolean) is not a float or int scalar value'),
    (lambda d, e: e.update(broadcasts="allow"), E + 'unknown key "broadcasts" (did you mean broadcast?) (known keys: '),
    (lambda d, e: d.update(attr_def={}), 'unknown key "attr_def" (did you mean attr_defs?)'),
    (lambda d, e: d["attr_defs"]["slope"].update(defualt=1.0), 'attr_defs.slope: unknown key "defualt" (did you '
                                                                'mean default?)'),
    (lambda d, e: e["type_rule"].update(dtype="f32"), E + 'type_rule (same_as_input): unknown key "dtype"'),
    (lambda d, e: e.update(type_rule={"kind": "fixed", "dtype": ["f32"]}),
     E + 'type_rule fixed dtype ["f32"] (a list) is not a dtype'),
    (lambda d, e: e.update(type_rule={"kind": "same_as_input", "index": True}),
     E + "type_rule index true (a boolean) is not an input (0..0)"),
    (lambda d, e: e.update(dtype_support_ref=["SOFTPLUS_DTYPES"]),
     E + 'dtype_support_ref ["SOFTPLUS_DTYPES"] (a list) is not in dtype_sets'),
    (lambda d, e: e.update(inplace=True), E + '"inplace" must be "allow" or "deny", got true (a boolean)'),
    (lambda d, e: e.update(attrs=["slope", 3]), E + '"attrs" must list attribute names, got 3 (a number)'),
    (lambda d, e: e.update(attrs=["slop"]), E + "attribute slop has no attr_defs entry (did you mean slope?)"),
    (lambda d, e: e.update(devices=["jax"]), E + '"devices" must be an object of objects'),
    (lambda d, e: e["devices"]["jax"].update(kernal="x"), E + 'devices.jax: unknown key "kernal" (did you mean '
                                                              'kernel?)'),
])
def test_wrong_schema_content_is_an_error_naming_the_key(tmp_path, capsys, edit, message):
    """Probe (ops) 5 and 6: every key of an ops.json-form file is checked with its type; the error
    names the file and the key (`error: FILE: KEY: message`), exit 1, no internal error."""
    path = _schema(tmp_path, edit)
    with pytest.raises(OiError) as e:
        ops.load([path])
    assert str(e.value).startswith(f"error: {path}: {message}"), str(e.value)
    code, _, err = run_cli(capsys, "check", str(HERE.parent.parent / "examples" / "mlp_regression.oi"),
                           "--ops", path)
    assert code == 1 and err.startswith(f"error: {path}: {message}") and "internal error" not in err, err


def test_a_schema_default_and_required_flag_are_read_as_declared(tmp_path):
    """`"required": true` with no default is required; false is optional; an int default of a
    `["float", "int"]` scalar is accepted as written."""
    def edit(d, e):
        d["attr_defs"]["slope"] = {"kind": "scalar", "required": True}

    reg = ops.load([_schema(tmp_path, edit)])
    assert reg["leaky_softplus"].attrs["slope"].required

    def edit2(d, e):
        d["attr_defs"]["slope"].update(required=False, default=1)

    reg = ops.load([_schema(tmp_path, edit2)])
    assert not reg["leaky_softplus"].attrs["slope"].required and reg["leaky_softplus"].attrs["slope"].default == 1


@pytest.mark.parametrize("text,message", [
    ("OPS = 5\n", "error: --ops {f}: OPS must be a list of ops (OpDefs or @oi2jax.ops.op functions), got int 5"),
    ("OPS = [len]\n", "error: --ops {f}: OPS[0] is not an op (an OpDef or an @oi2jax.ops.op function), got "
                      "builtin_function_or_method <built-in function len>"),
    ("import sys\nsys.exit(3)\n", "error: {f}: the op file called sys.exit(3) while being imported (at {f}:2)"),
    ("import sys\nsys.exit('bye')\n", "error: {f}: the op file called sys.exit('bye') while being imported "
                                      "(at {f}:2)"),
])
def test_a_bad_op_file_is_an_error_never_an_exit(tmp_path, capsys, text, message):
    """Probe (ops) 5 and 9: `OPS = 5` was an internal error; a file calling sys.exit() while being
    imported ended the command silently with its code (3), or printed `bye` and exited 1."""
    f = tmp_path / f"m{len(text)}.py"
    f.write_text(text)
    code, out, err = run_cli(capsys, "check", str(HERE.parent.parent / "examples" / "mlp_regression.oi"),
                             "--ops", str(f))
    assert code == 1 and err.strip() == message.format(f=f) and not out, (code, out, err)


@pytest.mark.parametrize("decl,message", [
    ("@op(inputs={'x': 'float'}, attrs={'k': Attr('int', default=1.5)})\ndef myop(x, *, k):\n    return x\n",
     "attribute k: default 1.5 is not an int value"),
    ("@op(inputs={'x': 'float'}, attrs={'k': Attr('bool', default=0)})\ndef myop(x, *, k):\n    return x\n",
     "attribute k: default 0 is not a bool value"),
    ("@op(inputs={'x': 'float'}, attrs={'k': Attr('dtype', default='f33')})\ndef myop(x, *, k):\n    return x\n",
     "attribute k: default 'f33' is not a dtype value"),
    ("@op(name='match', inputs={'x': 'float'})\ndef myop(x):\n    return x\n",
     "op name 'match' is a reserved word and cannot be used as a name"),
    ("@op(name='_', inputs={'x': 'float'})\ndef myop(x):\n    return x\n",
     "op name '_' is a reserved word and cannot be used as a name"),
])
def test_declarations_that_cannot_be_right_are_refused(tmp_path, decl, message):
    """Probe (ops) 10: a default of another kind than its attribute's reached the kernel (1.5 as an
    "int"); an op named by a Rust keyword or `_` loaded, though no graph may use the word as a name."""
    f = _op_file(tmp_path, f"d{abs(hash(decl))}.py", decl)
    with pytest.raises(OiError) as e:
        ops.load([f])
    assert str(e.value).startswith(f"error: {f}:4: {message}"), str(e.value)


def test_an_op_name_that_is_a_keyword_is_refused_by_the_parser():
    """The graph side of probe (ops) 10: `op match(x)` is refused as `volatile { match: ... }` is."""
    with pytest.raises(OiError) as e:
        parse("dynamic { x: f32[4]; }\nvolatile { y: f32[4]; }\nblock entry {\n    op match(x) >> y;\n"
              "    return;\n}\n")
    assert "<string>:4:8: error: 'match' is a reserved word and cannot be used as a name" in e.value.render()


def test_the_interpreter_jits_a_reference_less_kernel(tmp_path):
    """Probe (ops) 7: the interpreter ran a kernel without a NumPy reference eagerly, op by op: a
    kernel branching in Python on its input ran (the compiled program refuses it), and a pure
    kernel's values differed from the compiled op's (1171 of 16448 elements for this one). Now it
    is jitted, one function per declaration and static settings: the same error, the same bits."""
    f = _op_file(tmp_path, "k.py", "@op(inputs={'x': 'float'}, shape='same')\ndef branchy(x):\n"
                                   "    if x[0, 0] > 0:\n        return x\n    return -x\n\n"
                                   "@op(inputs={'x': 'float'}, shape='same')\ndef pure(x):\n"
                                   "    return jnp.log1p(jnp.exp(x)) * 0.1 + x / 3.0\n")
    src = "dynamic {{ x: f32[64, 257]; }}\nvolatile {{ y: f32[64, 257]; }}\nblock entry {{\n    op {}(x) >> y;\n" \
          "    return;\n}}\n"
    x = np.random.default_rng(0).normal(size=(64, 257)).astype(np.float32) * 5
    errors, values = {}, {}
    for mode in ("compiled", "interpret"):
        with pytest.raises(OiError) as e:
            oi2jax.compile(src.format("branchy"), ops=[f], mode=mode).run({"x": x})
        errors[mode] = e.value.diagnostics[0].message.replace(" (in step 1)", "")
        values[mode] = oi2jax.compile(src.format("pure"), ops=[f], mode=mode).run({"x": x})["y"]
    assert errors["compiled"] == errors["interpret"], errors
    assert errors["compiled"].startswith(f"op branchy (defined in {f}:4): its kernel raised "
                                         f"TracerBoolConversionError: ") and f"(at {f}:6, in branchy)" in errors["compiled"]
    np.testing.assert_array_equal(values["compiled"], values["interpret"])
    prog = oi2jax.compile(src.format("pure"), ops=[f], mode="interpret")
    first = prog.run({"x": x})["y"]
    fns = {id(v[0]) for v in prog._op_calls.values() if v[2].name == "pure"}
    assert len(fns) == 1
    second = prog.run({"x": x + 1})["y"]
    assert {id(v[0]) for v in prog._op_calls.values() if v[2].name == "pure"} == fns  # traced once
    np.testing.assert_array_equal(first, values["compiled"])
    np.testing.assert_array_equal(
        second, oi2jax.compile(src.format("pure"), ops=[f]).run({"x": x + 1})["y"])


@pytest.mark.parametrize("interpret", [[], ["--interpret"]])
def test_a_failing_step_prints_no_uncomputed_values_in_either_mode(tmp_path, capsys, interpret):
    """Probe (ops) 8: `--interpret` printed `e: [[0. 0.] [0. 0.]]` (never computed) before the
    failing step's error; a compiled run prints no value of the failing step, and neither does
    the interpreter now."""
    g = tmp_path / "emb.oi"
    g.write_text("dynamic { t: f32[4, 2]; ids: i32[2]; }\nvolatile { e: f32[2, 2]; }\nblock entry {\n"
                 "    op embedding(t, ids) >> e;\n    return;\n}\n")
    np.save(tmp_path / "t.npy", np.ones((4, 2), np.float32))
    np.save(tmp_path / "ids.npy", np.array([1, 9], np.int32))
    code, out, err = run_cli(capsys, "run", str(g), "--no-model", "--ops", "nn", "--input", f"t={tmp_path / 't.npy'}",
                             "--input", f"ids={tmp_path / 'ids.npy'}", *interpret)
    assert code == 1 and out == "", out
    assert f"{g}:4:5: error: embedding: id 9 is outside 0..3 (in step 1)" in err and "note: not shown: t, ids, e, " in err


def test_openinfers_own_ops_json_form_reads_with_its_output_dtype_sets(tmp_path, capsys, shared):
    """OpenInfer's ops.json has `output_dtype_sets` (file) and `output_dtypes_ref` (entry): the
    checked schema refused them as unknown keys (this session), before them they were ignored. Both
    are read: an op's output dtype must be in its set."""
    from oi2jax.ops.define import load_schema
    assert len(load_schema(shared / "ops.json")) == 47

    def limited(data, entry):
        data["output_dtype_sets"] = {"HALF_OUT": ["f16", "bf16"]}
        entry["output_dtypes_ref"] = "HALF_OUT"
    path = _schema(tmp_path, limited)
    graph = tmp_path / "g.oi"
    for dtype, ok in (("f16", True), ("f32", False)):
        graph.write_text(f"dynamic {{ x: {dtype}[2]; }}\nvolatile {{ y: {dtype}[2]; }}\n"
                         "block entry {\n    op leaky_softplus(x) >> y;\n    return;\n}\n")
        code, _, err = run_cli(capsys, "check", str(graph), "--no-model", "--ops", path)
        if ok:
            assert code == 0, err
        else:
            assert code == 1 and "output dtype f32 is not in its output_dtypes_ref set HALF_OUT (f16, bf16)" in err, err
    path = _schema(tmp_path, lambda d, e: e.update(output_dtypes_ref="HALF"))
    with pytest.raises(OiError, match=r'output_dtypes_ref "HALF" \(a string\) is not in output_dtype_sets'):
        ops.load([path])


def test_an_added_op_name_may_hold_upper_case_letters(tmp_path):
    """Ops probe leftover: `Foo`, a SPEC §1.2 identifier (names are case-sensitive), was refused as
    "not a DSL identifier (lower-case letters, digits, _)"; `1foo` and `foo-bar` still are."""
    f = _op_file(tmp_path, "k.py", "@op(inputs={'x': 'float'}, shape='same', reference=lambda x: x * 2)\n"
                                   "def TwiceX(x):\n    return x * 2\n")
    src = "dynamic { x: f32[4]; }\nvolatile { y: f32[4]; }\nblock entry {\n    op TwiceX(x) >> y;\n    return;\n}\n"
    x = np.arange(4, dtype=np.float32)
    for mode in ("compiled", "interpret"):
        np.testing.assert_array_equal(oi2jax.compile(src, ops=[f], mode=mode).run({"x": x})["y"], 2 * x)
    from oi2jax.ops.define import make_op
    for bad in ("1foo", "foo-bar", "fé"):
        with pytest.raises(ops.OpTypeError, match=f"op name '{bad}' is not a DSL identifier"):
            make_op(lambda x: x, bad)
