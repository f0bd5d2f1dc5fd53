"""Messages a user needs (issue 17): did-you-mean, wrong kinds of files, broken pipes, reused
states, complete outputs with a named `return`. Each test asserts the message text."""
from __future__ import annotations

import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import oi2jax
from oi2jax import ir, limits
from oi2jax.diagnostics import OiError

from conftest import EXAMPLES, REPO, run_both, run_cli


def test_unknown_op_and_setting_suggest_the_closest(capsys, tmp_path):
    g = tmp_path / "g.oi"
    g.write_text("dynamic { x: f32[2]; }\nvolatile { y: f32[2]; }\nblock entry {\n"
                 "    op reluu(x) >> y;\n    op relu(x, alppha=0.5) >> y;\n    return;\n}\n")
    code, _, err = run_cli(capsys, "check", g)
    assert code == 1
    assert f"{g}:4:8: error: unsupported op reluu (did you mean relu?)" in err
    assert "unsupported relu setting: alppha (did you mean alpha?)" in err


def test_a_suggestion_tie_goes_to_the_name_typed_as_a_prefix(capsys, tmp_path):
    """`ad` is as close to `and` as to `add` by difflib's score; the one it begins wins (difflib
    took the last of the ties: `and`)."""
    g = tmp_path / "g.oi"
    g.write_text("dynamic { x: f32[2]; }\nvolatile { y: f32[2]; }\nblock entry {\n"
                 "    op ad(x, x) >> y;\n    return;\n}\n")
    code, _, err = run_cli(capsys, "check", g)
    assert code == 1 and f"{g}:4:8: error: unsupported op ad (did you mean add?)" in err


def test_unknown_input_suggests(capsys, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((4, 16), np.float32))
    code, _, err = run_cli(capsys, "run", EXAMPLES / "mlp_regression.oi", "--input", f"xx={tmp_path / 'x.npy'}")
    assert code == 1 and err.strip() == (f"note: using model {EXAMPLES / 'mlp_regression.oinf'} (beside the graph)\n"
                                         "error: unknown input xx (did you mean x?): the graph's dynamic "
                                         "variables are x")


def test_model_given_as_graph_and_graph_given_as_input(capsys):
    model = EXAMPLES / "mlp_regression.oinf"
    code, _, err = run_cli(capsys, "check", model)
    assert code == 1 and err.startswith(f"error: cannot read {model}: not UTF-8 text, so not a .oi graph "
                                        f"(an .oinf model? pass it with --model)")
    code, _, err = run_cli(capsys, "run", EXAMPLES / "mlp_regression.oi", "--input",
                           f"x={EXAMPLES / 'mlp_regression.oi'}")
    assert code == 1 and err.strip() == (
        f"note: using model {EXAMPLES / 'mlp_regression.oinf'} (beside the graph)\n"
        f"error: cannot read input x from {EXAMPLES / 'mlp_regression.oi'}: not a .npy file (save arrays "
        f"with numpy.save; for one value per step use --inputs-per-step FILE.npz)")


def test_inspect_into_a_closed_pipe_is_quiet(tmp_path):
    from oi2jax.model import save
    save(tmp_path / "big.oinf", tensors={f"t{i}": np.zeros(2, np.float32) for i in range(3000)})
    proc = subprocess.run(f"{sys.executable} -m oi2jax inspect {tmp_path / 'big.oinf'} | head -n 1",
                          shell=True, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.stdout.count("\n") == 1 and proc.stderr == "", proc.stderr


def test_reusing_a_donated_state_says_what_to_do():
    prog = oi2jax.compile(EXAMPLES / "kv_cache_decode.oi", model=EXAMPLES / "kv_cache_decode.oinf")
    q = np.ones(prog.bound.shape("q"), np.float32)
    state = prog.init_state()
    new, _ = prog.step(state, q=q)
    with pytest.raises(OiError, match=r"this state was already used by a step, which took over \(donated\) its "
                                      r"buffers: pass the state that step returned"):
        prog.step(state, q=q)
    prog.step(new, q=q)
    sess = prog.session()
    live = sess.state  # the session's own buffers: its next step donates them
    sess.step(q=q)
    with pytest.raises(OiError, match=r"already used by a step, which took over \(donated\) its buffers: start the "
                                      r"session from host values instead \(`prog.session\(state=sess.values\(\)\)`\)"):
        prog.session(state=live)
    again = prog.session(state=sess.values())
    want, got = sess.step(q=q), again.step(q=q)
    for name in want:
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]))


def test_named_return_still_reports_every_variable():
    """`return y;` names the step's outputs; run / --out still hold every variable, every mode."""
    src = """
    dynamic { x: f32[2]; }
    volatile { h: f32[2]; y: f32[2]; }
    persistent { n: i32 @init(0); }
    block entry {
        op relu(x) >> h;
        op add(h, x) >> y;
        cache.increment n;
        return y;
    }
    """
    x = np.array([-1.0, 2.0], np.float32)
    out = run_both(src, {"x": x}, steps=2)  # compiled as interpreted, bit for bit
    assert sorted(out) == ["h", "n", "x", "y"]
    np.testing.assert_array_equal(out["h"], [0.0, 2.0])
    np.testing.assert_array_equal(out["y"], [-1.0, 4.0])
    assert int(out["n"]) == 2
    prog = oi2jax.compile(src)
    assert sorted(prog.session().step(x=x)) == ["y"]  # the step's outputs: what `return` names


@pytest.mark.parametrize("setting,op", [("keepdims", "sum_axis(x, axes=[1], {})"),
                                        ("select_first", "argmax_axis(x, axis=1, {})")])
def test_bool_settings_take_true_false_and_warn_on_0_1(capsys, tmp_path, setting, op):
    """SPEC-2026-03 §2.5 / D3: true/false; the 1fc5207 forms 0/1 still read (with a warning); 7 is an error."""
    from oi2jax.ops import REGISTRY
    name = op.split("(")[0]
    if name not in REGISTRY:
        name = next(n for n in REGISTRY if n.startswith("argmax"))
        op = f"{name}(x, axis=1, {{}})"
    g = tmp_path / "g.oi"
    for value, code_want, text in ((7, 1, f"error: op {name} setting {setting} must be true or false, got 7"),
                                   (1, 0, f"warning: {setting}=1: current OpenInfer accepts only true/false here; "
                                          f"read as true"),
                                   ("true", 0, None)):
        y = "f32[2, 1]" if setting == "keepdims" else "i64[2]"
        g.write_text("dynamic { x: f32[2, 3]; }\nvolatile { y: " + y + "; }\nblock entry {\n    op "
                     + op.format(f"{setting}={value}") + " >> y;\n    return;\n}\n")
        code, _, err = run_cli(capsys, "check", g)
        if text is None:
            assert code == 0 and err == "", err
        else:
            assert code == code_want and text in err and f"{g}:4:" in err, err


def test_unknown_variables_suggest_and_trace_marks_compilation(capsys, tmp_path):
    g = tmp_path / "g.oi"
    g.write_text("dynamic { xin: f32[2]; }\nvolatile { yout: f32[2]; }\nblock entry {\n"
                 "    op relu(xim) >> yout;\n    op relu(xin) >> yuot;\n    return;\n}\n")
    code, _, err = run_cli(capsys, "check", g)
    assert code == 1
    assert f"{g}:4:13: error: unknown input variable xim (did you mean xin?)" in err
    assert f"{g}:5:21: error: unknown output variable yuot (did you mean yout?)" in err
    code, out, err = run_cli(capsys, "run", EXAMPLES / "mlp_regression.oi", "--zero-missing-inputs", "--trace",
                             "--quiet", "--steps", "2", "--cache-dir", "none")
    lines = out.splitlines()
    assert code == 0 and lines[1].startswith("step 1 phase 0 step (whole graph, one kernel; includes XLA "
                                              "compilation) on ")
    assert lines[2].startswith("step 2 phase 0 step (whole graph, one kernel) on ")


def test_auto_dim_shape_mismatch_says_the_actual_shape():
    """SPEC.md §0 item 12 (revised): the read gives m the tensor's current shape [8, 4]; writing m
    back after the tensor grew again names both shapes, compiled as interpreted."""
    src = """
    persistent { i: i32 @init(3); j: i32 @init(2); M(r, c): f32[2, 2] @auto_dim(r, c); }
    volatile { m: f32[5, 4]; }
    block entry { cache.increment 3 i; cache.read M[i, j] >> m; return; }
    """
    out = oi2jax.compile(src).run({}, steps=1)
    assert out["m"].shape == (8, 4) and out["M"].shape == (8, 4)
    grown = src.replace("return; }", "cache.increment 3 i; cache.write m >> M[i, j]; return; }")
    with pytest.raises(OiError) as info:  # the same error every way (run_both asserts it)
        run_both(grown, {}, steps=1)
    assert "error: cache.write M expects shape [11, 4], got [8, 4]" in str(info.value), str(info.value)


def test_unknown_block_and_model_tensor_suggest(capsys, tmp_path):
    from oi2jax.model import save
    save(tmp_path / "m.oinf", tensors={"weight": np.zeros(2, np.float32)})
    g = tmp_path / "g.oi"
    g.write_text("dynamic { c: bool; }\nconstant { weigth: f32[2]; }\nblock entry {\n    branch c yes nope;\n"
                 "    return;\n}\nblock yes { return; }\nblock nop { return; }\n")
    code, _, err = run_cli(capsys, "check", g, "--model", tmp_path / "m.oinf")
    assert code == 1
    assert f"{g}:4:18: error: branch target block not found: nope (did you mean nop?)" in err
    assert f"{g}:2:12: error: constant weigth not found in model (no tensor or metadata entry) " \
           f"(did you mean weight?)" in err


def test_model_changed_during_a_run_is_a_clean_error_or_the_old_bytes(tmp_path):
    """Issue 19 item 3: tensor data is read with pread, not through the mapping (no SIGBUS), and
    oi2jax's writer replaces a model by rename (a reader keeps the old bytes)."""
    code = f"""
import numpy as np
from oi2jax.model import save, open_model
from oi2jax.diagnostics import OiError
p = {str(tmp_path / 'm.oinf')!r}
save(p, tensors={{"a": np.arange(100000, dtype=np.float32), "b": np.ones(100000, np.float32)}})
m = open_model(p)
m.load("a")
with open(p, "r+b") as f:
    f.truncate(1000)  # another tool rewriting the file in place
try:
    m.load("b")
    print("LOADED")
except OiError as e:
    print(str(e))
q = {str(tmp_path / 'q.oinf')!r}
save(q, tensors={{"a": np.arange(10, dtype=np.float32)}})
m2 = open_model(q)
save(q, tensors={{"a": np.zeros(3, dtype=np.float32)}})
print(m2.load("a")[:4].tolist())
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)  # -7 would be SIGBUS
    lines = proc.stdout.splitlines()
    assert lines[0].endswith("tensor b: data truncated (the file changed while it was in use: 0 of 400000 "
                             "bytes left)")
    assert lines[1] == "[0.0, 1.0, 2.0, 3.0]"


def test_outputs_never_overwrite_inputs_and_platforms_are_checked(capsys, tmp_path):
    """Issue 19 items 13 and 18."""
    import shutil
    g = tmp_path / "g.oi"
    shutil.copy(EXAMPLES / "mlp_regression.oi", g)
    model = tmp_path / "g.oinf"
    shutil.copy(EXAMPLES / "mlp_regression.oinf", model)
    before = g.read_bytes(), model.read_bytes()
    code, _, err = run_cli(capsys, "compile", g, "-o", g)
    assert code == 1 and err.strip() == f"note: using model {model} (beside the graph)\n" \
                                        f"error: -o {g} is the graph: writing it would destroy the input; " \
                                        f"choose another path"
    code, _, err = run_cli(capsys, "export", g, "-o", model)
    assert code == 1 and f"error: -o {model} is the model" in err
    np.save(tmp_path / "x.npy", np.ones((4, 16), np.float32))
    code, _, err = run_cli(capsys, "run", g, "--input", f"x={tmp_path / 'x.npy'}", "--out", tmp_path / "x.npy")
    assert code == 1 and f"error: --out {tmp_path / 'x.npy'} is the --input file of x" in err
    assert (g.read_bytes(), model.read_bytes()) == before
    code, _, err = run_cli(capsys, "export", g, "-o", tmp_path / "s.jaxexport", "--platforms", "cpu,junk")
    assert code == 1 and err.strip() == (f"note: using model {model} (beside the graph)\n"
                                         "error: unknown platform 'junk' (jax.export platforms: cpu, cuda, "
                                         "rocm, tpu)")
    assert not (tmp_path / "s.jaxexport").exists()


def test_bom_and_caret_lines_count_like_the_lexer(capsys, tmp_path):
    """Issue 19 item 19: a UTF-8 BOM is accepted; a form feed / U+2028 inside a comment does not
    shift the caret's line."""
    g = tmp_path / "g.oi"
    g.write_bytes("\ufeffdynamic { x: f32[2]; }\nblock entry { return; }\n".encode())
    assert run_cli(capsys, "check", g)[0] == 0
    g.write_text("// a\fb \u2028 c\ndynamic { x: f32[2]; }\nblock entry {\n    op frob(x) >> x;\n}\n")
    code, _, err = run_cli(capsys, "check", g)
    lines = err.splitlines()
    assert code == 1 and lines[0].startswith(f"{g}:4:8: error: unsupported op frob")
    assert lines[1].strip() == "op frob(x) >> x;"


def test_checking_and_rendering_split_the_source_once():
    """Issue 19 item 4: name_span and every rendered diagnostic used to split the whole source
    again (quadratic in the graph's size); now it is split once."""
    import dataclasses
    from oi2jax.check import check
    from oi2jax.grammar import parse

    class CountingStr(str):
        splits = 0

        def split(self, *args, **kwargs):
            CountingStr.splits += 1
            return super().split(*args, **kwargs)

        def splitlines(self, *args, **kwargs):
            CountingStr.splits += 1
            return super().splitlines(*args, **kwargs)

    n = 400
    body = "    op frob(x) >> x;\n" * n
    graph = parse("dynamic { x: f32[2]; }\nblock entry {\n" + body + "}\n")
    graph = dataclasses.replace(graph, source=CountingStr(graph.source))
    diags = check(graph)
    assert len(diags) == n and CountingStr.splits <= 1
    text = OiError(diags, source=graph.source).render()
    assert text.count("unsupported op frob") == n and CountingStr.splits <= 2


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
@pytest.mark.parametrize("bound", [np.inf, -np.inf, np.nan])
def test_non_finite_loop_bound_is_an_error_in_both_modes(mode, bound):
    """Issue 19 item 6: compiled once looped forever on inf (and ran NaN/-inf 0 times silently)."""
    src = """
    dynamic { n: f32; x: f32[2]; }
    volatile { y: f32[2]; }
    block entry { loop l (i in 0..n) { op add(y, x) >> y; } return; }
    """
    with pytest.raises(OiError, match=r"<string>:4:19: error: loop bound n is not finite"):
        oi2jax.compile(src, mode=mode).run({"n": np.float32(bound), "x": np.ones(2, np.float32)})


@pytest.mark.parametrize("source,message", [
    ("persistent { K(i): f32[2] @table @fixed(i=2, i=5); }", "1:34: error: @fixed gives i twice"),
    ("persistent { K(i, i): f32[2] @table; }", "1:15: error: index parameter i is listed twice"),
    ("persistent { M(r, r): f32[2] @auto_dim(r, r); }", "1:15: error: index parameter r is listed twice"),
    ("persistent { p: f16 @init(100000.0); }", "1:21: error: f16 init 100000.0 is out of range (largest finite "
                                               "f16 is 65504)"),
    ("persistent { p: f32 @init(1e999); }", "1:27: error: float literal 1e999 overflows to infinity"),
    ("persistent { t: i64 @init(0); }\nblock entry { cache.increment 100000000000000000000 t; }",
     "2:31: error: integer literal 100000000000000000000 is out of the 64-bit range"),
    ("dynamic { x: i32[2]; }\nvolatile { y: i32[2]; }\nblock entry { op div(x, x, div_by_zero_mask="
     "100000000000000000000) >> y; }", "3:45: error: integer literal 100000000000000000000 is out of the 64-bit"),
])
def test_duplicates_and_out_of_range_literals_are_located_errors(capsys, tmp_path, source, message):
    """Issue 19 item 17."""
    g = tmp_path / "g.oi"
    g.write_text(source + ("\nblock entry { return; }\n" if "block" not in source else "\n"))
    code, _, err = run_cli(capsys, "check", g)
    assert code == 1 and f"{g}:{message}" in err, err


def test_repeated_size_flag_is_a_usage_error(capsys):
    code, _, err = run_cli(capsys, "check", EXAMPLES / "mlp_regression.oi", "--size", "B=2", "--size", "B=3")
    assert code == 2 and err.strip() == "error: --size B is given twice"


@pytest.mark.parametrize("field,value,message", [
    ("block", "x/../../OUT", "unexpected character '/'; expected one of '{' (in `block x/../../OUT {`)"),
    ("var", "../../../../tmp/X", "unexpected '..'"),
    ("var", "", "not a valid graph"),
    ("dim", "-5", "unexpected '-'"),
])
def test_graph_json_names_are_validated_like_the_grammar(capsys, tmp_path, field, value, message):
    """Issue 19 item 14: names from JSON become dump file names and npz member names."""
    import json
    from oi2jax.grammar import parse_file
    from oi2jax.graph_json import to_json
    data = json.loads(json.dumps(to_json(parse_file(str(EXAMPLES / "mlp_regression.oi")))))
    if field == "block":
        data["blocks"]["entry"]["name"] = value
    elif field == "var":
        data["vars"]["x"]["name"] = value
    else:
        data["vars"]["x"]["dims"] = [value, "D"]
    g = tmp_path / "g.json"
    g.write_text(json.dumps(data))
    code, _, err = run_cli(capsys, "compile", g, "--model", EXAMPLES / "mlp_regression.oinf",
                           "--dump-dir", tmp_path / "dump")
    assert code == 1 and err.startswith(f"error: {g}: not a valid graph: ") and message in err, err
    assert not (tmp_path / "dump").exists() and not (tmp_path.parent / "OUT").exists()


def test_integer_inputs_to_float_variables_are_checked_exactly():
    """Issue 19 item 16 (integer part): int64 2**53 + 1 is not a float64; the old check compared
    after rounding both sides through float64 and let it through."""
    from oi2jax.values import convert_input
    with pytest.raises(OiError, match=r"input x: value 9007199254740993 \(int64\) is not exactly representable "
                                      r"in f64"):
        convert_input("x", np.array([2**53 + 1], np.int64), "f64", (1,))
    assert convert_input("x", np.array([2**53], np.int64), "f64", (1,))[0] == 2.0**53
    with pytest.raises(OiError, match="not exactly representable in f32"):
        convert_input("x", np.array([2**24 + 1], np.int64), "f32", (1,))
    np.testing.assert_array_equal(convert_input("x", np.array([-3, 2**11], np.int32), "f16", (2,)), [-3, 2048])


def test_scalar_integer_inputs_to_float_variables_are_checked_exactly():
    """A scalar (0-d) integer input to a float variable past the float's exact integers (2**24 for
    f32) was an internal error (ValueError: np.nonzero of a 0-d array), 20000000 (an f32) included."""
    from oi2jax.values import convert_input
    assert convert_input("x", np.int64(20000000), "f32", ()) == np.float32(20000000)
    assert convert_input("x", np.uint64(2**63), "f32", ()) == np.float32(2**63)
    with pytest.raises(OiError, match=r"input x: value 16777217 \(int64\) is not exactly representable in f32"):
        convert_input("x", np.int64(2**24 + 1), "f32", ())
    with pytest.raises(OiError, match="not exactly representable in f64"):
        convert_input("x", np.int64(2**53 + 1), "f64", ())


def test_huge_comment_and_string_parse_in_bounded_memory():
    """Issue 19 item 5: the old lexer regexes kept ~150 bytes of backtracking state per character
    (a 50 MB comment needed 7.5 GB); under a 2 GiB address-space limit 16 MB of each now parse."""
    code = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from oi2jax.grammar import parse
n = 16 << 20
g = parse("/*" + "a*b/" * (n // 4) + "*/\\nconstant { w: f32[2] @ref(\\"" + "xy\\\\\\"z" * (n // 5)
          + "\\"); }\\nblock entry { return; }\\n")
print(len(g.vars[0].ref))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout) == 4 * ((16 << 20) // 5)


def _nested_loops(n: int) -> str:
    body = "op add(y, x) >> y;"
    for i in range(n):
        body = f"loop l{i} (i{i} in 0..1) {{ {body} }}"
    return f"dynamic {{ x: f32[2]; }}\nvolatile {{ y: f32[2]; }}\nblock entry {{\n    {body}\n    return;\n}}\n"


def _branch_chain(n: int) -> str:
    lines = ["dynamic { c: bool; x: f32[2]; }", "block entry {", "    branch c b0 b0;", "}"]
    for i in range(n):
        lines += [f"block b{i} {{", f"    branch {f'b{i + 1}' if i + 1 < n else 'leaf'};", "}"]
    return "\n".join(lines + ["block leaf {", "    op add(x, x) >> x;", "}"]) + "\n"


def test_deep_nesting_is_supported_up_to_a_named_limit(tmp_path):
    """Issue 19 item 7: 46 nested loops, 1000 nested loops, a chain of 1000 branch blocks and
    deeply nested graph JSON were internal RecursionErrors."""
    out = oi2jax.compile(_nested_loops(32)).run({"x": np.ones(2, np.float32)})
    np.testing.assert_array_equal(out["y"], [1.0, 1.0])  # 32 levels, each running once
    for n in (46, 1000):
        with pytest.raises(OiError) as info:
            oi2jax.compile(_nested_loops(n))
        assert "error: loops nest 33 deep here; the limit is 32" in str(info.value)
        assert str(info.value).startswith("<string>:4:")
    out = oi2jax.compile(_branch_chain(60)).run({"c": np.bool_(True), "x": np.ones(2, np.float32)})
    np.testing.assert_array_equal(out["x"], [2.0, 2.0])
    # issue 34 item 4: the chain of 1000 blocks (refused as "the limit is 64" since) compiles and runs,
    # compiled and interpreted (test_chains_of_blocks_compile_linearly below)
    for mode in ("compiled", "interpret"):
        out = oi2jax.compile(_branch_chain(1000), mode=mode).run({"c": np.bool_(True), "x": np.ones(2, np.float32)})
        np.testing.assert_array_equal(out["x"], [2.0, 2.0])
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(OiError, match="nested too deeply"):
        oi2jax.api.load_graph_json(str(deep))


def _layer_chain(n: int) -> str:
    """n blocks generated per layer, each calling the next: entry -> l0 -> l1 -> ... -> l{n-1},
    with work before and after each call, a conditional exit every 50 layers and a cache write."""
    lines = ["dynamic { x: f32[4]; c: bool; }", "constant { w: f32[4] @init(0.5); }",
             "persistent { n: i32 @init(0); }", "volatile { y: f32[4]; }",
             "block entry {", "    branch c l0 stop;", "    op add(x, x) >> y;", "    return;", "}",
             "block stop {", "    op neg(x) >> x;", "}"]
    for i in range(n):
        call = (f"    branch l{i + 1};" if i % 50 != 49 else f"    branch c l{i + 1} stop;") if i + 1 < n else ""
        lines += [f"block l{i} {{", "    op mul(x, w) >> x;", "    op add(x, w) >> x;", call,
                  "    cache.increment n;", "}"]
    return "\n".join(line for line in lines if line) + "\n"


def test_chains_of_blocks_compile_linearly(monkeypatch):
    """Issue 34 item 4: a chain of more than 64 blocks joined by branches was refused ("the limit
    is 64"); graphs generated per layer or per stage reach that. No limit now: each block is
    lowered once (unconditional calls inline, without Python recursion; op names do not grow with
    the call depth), so traced ops and HLO grow linearly, and the values are the interpreter's."""
    calls = _count_op_lowerings(monkeypatch)
    counts, sizes = {}, {}
    for n in (100, 300):
        calls[0] = 0
        prog = oi2jax.compile(_layer_chain(n))
        text = prog.emit("stablehlo")
        counts[n], sizes[n] = calls[0], len(text.splitlines())
        # op names hold no chain of unconditional calls (only the conditionals a name sits under)
        assert "/10:branch/l2/" in text and not re.search(r":branch/l\d+/\d+:branch/l\d+/", text)
    assert counts[300] <= 3 * counts[100] + 16, counts  # every block traced once (both arms of `c`)
    assert sizes[300] <= 3.2 * sizes[100], sizes
    monkeypatch.undo()
    from conftest import assert_same
    compiled, interpreted = (oi2jax.compile(_layer_chain(300), mode=mode) for mode in ("compiled", "interpret"))
    for c in (True, False):
        ins = {"x": np.array([1, -2, 0.25, 3], np.float32), "c": np.bool_(c)}
        out = compiled.run(ins, steps=2)
        assert_same(out, interpreted.run(ins, steps=2), f"c={c}")
        assert int(out["n"]) == (600 if c else 0)


def test_deep_conditionals_run_as_the_state_machine_with_a_stack_as_deep_as_the_chain(monkeypatch):
    """Issue 34 item 4: conditionals nested deeper than machine.INLINE_COND_DEPTH run as the state
    machine (flat: no Python recursion), whose return stack is as deep as the longest call chain
    below the branch (it was fixed at the old limit, 65). Lowered with a threshold of 0 here, so
    that a 70-block chain stays quick to compile."""
    from oi2jax.lowering import machine
    used = []
    real = machine.run_branch
    monkeypatch.setattr(machine, "INLINE_COND_DEPTH", 0)
    monkeypatch.setattr(machine, "run_branch", lambda *a: used.append(1) or real(*a))
    prog = oi2jax.compile(_branch_chain(70))
    for c in (True, False):  # the interpreter's [2, 2] (test_deep_nesting_is_supported_up_to_a_named_limit)
        out = prog.run({"c": np.bool_(c), "x": np.ones(2, np.float32)}, steps=2)
        np.testing.assert_array_equal(out["x"], [2.0, 2.0])
    assert used


def test_memory_exhaustion_is_a_clear_error_naming_the_variable_and_bytes(capsys):
    """Issue 19 item 8: tables count in the size guard (capacity x entry), growth is refused before
    allocating, the guard knows this machine's memory, and an allocation that still fails is a clear
    error, not `internal error (MemoryError / RESOURCE_EXHAUSTED)`."""
    with pytest.raises(OiError, match=r"<string>:1:14: error: K would need 409600000000000 bytes \(table capacity "
                                      r"\[100000000000\] x \[1024\]\): too large to allocate"):
        oi2jax.compile("persistent { K(i): f32[1024] @table @fixed(i=100000000000); }\nblock entry { return; }\n")
    src = ("persistent { t: i64 @init(1000000000); A(i): f32[1024] @table; }\ndynamic { x: f32[1024]; }\n"
           "block entry { cache.write x >> A[t]; return; }\n")
    with pytest.raises(OiError, match=r"cache A would need 4398046511104 bytes to grow to capacity \[1073741824\] "
                                      r"\(a write needs 1000000001 entries\): too large to allocate"):
        oi2jax.compile(src).run({"x": np.ones(1024, np.float32)})
    # under the 1 TiB bound, over this machine's memory (or the default device's, a GPU's): refused
    # by what this machine has (a fixed 64 GiB passed on a host of 128 GiB with a GPU of 139 GiB)
    limit = limits.memory_limit(jax.devices()[0])
    n = limit // 4 + 1
    note = r", (this machine's memory|the memory of \S+)" if limit < limits.MAX_VALUE_BYTES else ""
    with pytest.raises(OiError, match=rf"x would need {4 * n} bytes \(shape \[{n}\]\): too large to "
                                      rf"allocate \(the limit is {limit} bytes{note}\)"):
        oi2jax.compile("dynamic { x: f32[N]; }\nblock entry { return; }\n", sizes={"N": n})
    from oi2jax.runtime import faults
    prog = oi2jax.compile("persistent { P: f32[8] @init(1.0); }\nblock entry { return; }\n")
    with faults.injected(faults.ALLOCATE, MemoryError()), \
            pytest.raises(OiError, match=r"cannot allocate P \(32 bytes\): out of memory"):
        prog.init_state()
    exhausted = RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 68719476736 bytes.")
    with faults.injected(faults.RUN, exhausted):
        code, _, err = run_cli(capsys, "run", EXAMPLES / "mlp_regression.oi", "--zero-missing-inputs", "--quiet")
    assert code == 1 and err.startswith("error: cannot allocate memory for the program's values: out of memory "
                                        "(RuntimeError: RESOURCE_EXHAUSTED: Out of memory")



class _DeviceWithOwnMemory:
    """A stand-in for a GPU as limits.memory_limit sees one: its platform and allocator limit
    (1 GiB: less than any machine's memory, so the device's is the limit)."""
    platform = "gpu"

    def memory_stats(self):
        return {"bytes_limit": 1 << 30}

    def __str__(self):
        return "cuda:0"


def test_a_device_with_its_own_memory_bounds_a_value_and_a_refused_placement_is_said(monkeypatch):
    """Seen on an H100: a 64 GiB input default passed the host-memory guard (the machine had 128 GB)
    and the GPU's allocator refused it with a JAX traceback. The guard counts the device's memory
    where it has its own, and an allocation refused while placing the program is a clear error."""
    from oi2jax import pipeline
    from oi2jax.limits import check_sizes, memory_limit
    gpu = _DeviceWithOwnMemory()
    assert memory_limit(gpu) == 1 << 30 < memory_limit()
    bound = pipeline.bound("dynamic { x: f32[N]; }\nblock entry { return; }\n", None, {"N": 2**29}, None)
    check_sizes(bound)  # 2 GiB: within this machine's memory
    with pytest.raises(OiError, match=r"x would need 2147483648 bytes \(shape \[536870912\]\): too large to "
                                      r"allocate \(the limit is 1073741824 bytes, the memory of cuda:0\)"):
        check_sizes(bound, gpu)
    from oi2jax.runtime.placement import Placer
    refused = RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 64.00GiB with allocator "
                           "GPU_0_bfc on device 0.")

    def put(self, *args, **kw):
        raise refused
    monkeypatch.setattr(Placer, "put", put)
    with pytest.raises(OiError, match=r"cannot allocate the program's constants and input defaults on the device: "
                                      r"out of memory \(RuntimeError: RESOURCE_EXHAUSTED: Out of memory"):
        oi2jax.compile("dynamic { x: f32[4]; }\nblock entry { return; }\n")

def _guard_chain(k: int) -> str:
    """k blocks, each branching to the next along both arms (a chain of guards)."""
    lines = ["dynamic { x: f32[4]; c: bool; d: bool; }", "persistent { n: i32 @init(0); }", "block entry {",
             "    op add(x, x) >> x;", "    branch c g0 h0;", "    op mul(x, x) >> x;", "    return;", "}"]
    for i in range(k):
        nxt, alt = (f"g{i + 1}", f"h{i + 1}") if i + 1 < k else ("leaf", "leaf")
        lines += [f"block g{i} {{", "    op add(x, x) >> x;", f"    branch d {nxt} {alt};", "    cache.increment n;",
                  "}", f"block h{i} {{", "    op relu(x) >> x;", f"    branch c {nxt} {alt};", "    return;",
                  "    op neg(x) >> x;", "}"]
    return "\n".join(lines + ["block leaf {", "    op sub(x, x) >> x;", "    cache.increment 3 n;", "}"]) + "\n"


def _count_op_lowerings(monkeypatch) -> list:
    """[n]: how many op nodes the lowering has traced since (the op rule wrapped by a counter)."""
    from oi2jax.lowering import rules
    real = rules.load()[ir.Op]
    calls = [0]

    def counting(*args):
        calls[0] += 1
        return real(*args)

    monkeypatch.setitem(rules.RULES, ir.Op, counting)
    return calls


def test_conditional_call_chains_lower_each_block_once(monkeypatch):
    """Issue 19 item 2: blocks reachable from both arms of k nested conditionals were traced (and
    compiled) 2^k times; now op lowerings and HLO size grow linearly with k, values unchanged."""
    calls = _count_op_lowerings(monkeypatch)
    counts, sizes = {}, {}
    for k in (4, 8, 12, 16):
        calls[0] = 0
        prog = oi2jax.compile(_guard_chain(k))
        sizes[k] = len(prog.emit("stablehlo").splitlines())
        counts[k] = calls[0]
        for c in (True, False):
            for d in (True, False):
                ins = {"x": np.array([1, -2, 0.5, 3], np.float32), "c": np.bool_(c), "d": np.bool_(d)}
                got = prog.run(ins, steps=2)
                want = oi2jax.compile(_guard_chain(k), mode="interpret").run(ins, steps=2)
                for name in want:
                    np.testing.assert_array_equal(got[name], want[name], err_msg=f"{k} {c} {d} {name}")
    assert counts[16] <= 8 * 16 + 16, counts  # 2**16 traced ops before
    assert counts[16] - counts[12] <= 2 * (counts[12] - counts[8]) + 8, counts  # linear, not exponential
    assert sizes[16] <= 4 * sizes[4] + 400, sizes



def test_packed_reserved_pattern_rank_huge_dims_and_unusable_home(capsys, tmp_path, monkeypatch):
    """Issue 19 item 18: a t2 tensor holding the reserved pattern 0b10 is refused on load (as an
    --input is); rank > 64 and a dim of 2**63 - 1 are located errors; an unusable $HOME only turns
    the default compilation cache off, with a warning."""
    from oi2jax.model import Tensor, open_model, save
    save(tmp_path / "t.oinf", tensors={"w": Tensor("t2", np.array([1, 0, -1, 1], np.int8))})
    raw = bytearray((tmp_path / "t.oinf").read_bytes())
    info = open_model(tmp_path / "t.oinf").info("w")
    raw[info.offset] = (raw[info.offset] & 0b11111100) | 0b10  # element 0 <- the reserved pattern
    (tmp_path / "bad.oinf").write_bytes(bytes(raw))
    with pytest.raises(OiError, match=r"tensor w: t2 value at index \[0\] uses the reserved pattern 0b10"):
        open_model(tmp_path / "bad.oinf").load("w")
    g = tmp_path / "g.oi"
    g.write_text("dynamic { x: f32[" + ", ".join(["1"] * 65) + "]; }\nblock entry { return; }\n")
    code, _, err = run_cli(capsys, "check", g)
    assert code == 1 and f"{g}:1:11: error: x has 65 dimensions; the limit is 64" in err
    g.write_text("dynamic { x: f32[0, 9223372036854775807]; }\nblock entry { return; }\n")
    code, _, err = run_cli(capsys, "run", g, "--quiet", "--zero-missing-inputs")
    assert code == 1 and f"{g}:1:11: error: x: dimension 1 is 9223372036854775807, too large to allocate" in err
    home = tmp_path / "home"
    home.write_text("not a directory")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("OI2JAX_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    np.save(tmp_path / "x.npy", np.ones((4, 16), np.float32))
    code, _, err = run_cli(capsys, "run", EXAMPLES / "mlp_regression.oi", "--input", f"x={tmp_path / 'x.npy'}",
                           "--quiet")
    assert code == 0 and err.startswith("warning: compilation cache disabled (cannot use the default cache "
                                        "directory: "), err
    code, _, err = run_cli(capsys, "run", EXAMPLES / "mlp_regression.oi", "--input", f"x={tmp_path / 'x.npy'}",
                           "--quiet", "--cache-dir", str(home / "sub"))
    assert code == 1 and err.startswith(f"error: cannot use cache directory {home / 'sub'}: "), err
    code, _, err = run_cli(capsys, "run", EXAMPLES / "mlp_regression.oi", "--input", f"x={tmp_path / 'x.npy'}",
                           "--quiet", "--cache-dir", str(home))  # the directory named is a file
    assert code == 1 and err == f"error: cannot use cache directory {home}: {home} is a file, not a directory\n", err


def test_bf16_and_f8_inputs_are_converted_only_when_exact():
    """Issue 19 item 16 (float part): float64 0.1 into a bf16 / f8 input was rounded silently."""
    from oi2jax.values import convert_input
    with pytest.raises(OiError, match=r"input x: value 0.1 \(float64\) is not exactly representable in bf16 "
                                      r"\(nearest 0.10009765625\)"):
        convert_input("x", np.array([0.1]), "bf16", (1,))
    with pytest.raises(OiError, match=r"not exactly representable in f8 \(nearest 0.09375\)"):
        convert_input("x", np.array([0.1]), "f8", (1,))
    assert float(convert_input("x", np.array([0.5]), "bf16", (1,))[0]) == 0.5
    assert float(convert_input("x", np.array([-1.5]), "f8", (1,))[0]) == -1.5


def test_compile_finds_the_model_beside_the_graph_as_the_cli_does(tmp_path):
    """Issue 34 item 2: `oi2jax.compile("examples/kv_cache_decode.oi")`, as docs/decode.md shows it,
    failed with `unknown size: D`: the Python API never looked beside the graph. One rule
    (pipeline.choose_model) for the API, export and the CLI; `program.model_path` says which file."""
    graph, model = EXAMPLES / "kv_cache_decode.oi", EXAMPLES / "kv_cache_decode.oinf"
    prog = oi2jax.compile(str(graph))  # as docs/decode.md
    assert prog.model_path == str(model)
    assert oi2jax.compile(graph, mode="interpret").model_path == str(model)  # a PathLike too
    q = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(prog.session().step(q=q)["k_hist"][0], q)
    assert oi2jax.compile(str(graph), model=model).model_path == str(model)
    with pytest.raises(OiError) as info:  # model=False: no model, even with one beside the graph
        oi2jax.compile(str(graph), model=False)
    assert str(info.value).startswith(f"{graph}:5:5: error: invalid dims for q: unknown size: D (no model "
                                      f"(--no-model / model=False))\n        q: f32[D];\n        ^")
    with pytest.raises(OiError) as info:  # program text has no "beside"
        oi2jax.compile(graph.read_text())
    assert str(info.value).startswith("<string>:5:5: error: invalid dims for q: unknown size: D (no model given)\n")
    g = tmp_path / "g.oi"
    g.write_text(graph.read_text())
    with pytest.raises(OiError) as info:
        oi2jax.compile(str(g))
    assert f"unknown size: D (no model given and none found at {tmp_path / 'g.oinf'})" in str(info.value)
    assert oi2jax.compile(str(g), sizes={"D": 2}, zero_missing_inputs=True).model_path is None


def test_literals_of_thousands_of_digits_and_arrays_of_65_dimensions_are_diagnostics(capsys, tmp_path):
    """Issue 34 item 4: a size literal with thousands of digits (Python refuses int() of more than
    4300) and a model metadata array with more than 64 dimensions (NumPy's limit) were internal
    errors. Every integer literal is refused before conversion when it is past 64 bits, and quoted
    by its ends; the model reader names the array."""
    import struct
    from oi2jax.model import Tensor, save
    big = "9" * 5000
    shown = "99999999999999999999...99999999 (5000 characters)"
    cases = [("dynamic { x: f32[" + big + "]; }\nblock entry { return; }\n", "1:18"),
             ("dynamic { x: f32[2]; }\nblock entry { loop l (i in 0.." + big + ") { op add(x, x) >> x; } }\n", "2:31"),
             ("persistent { T(i): f32 @table @fixed(i=" + big + "); }\nblock entry { return; }\n", "1:40"),
             ("dynamic { x: f32[2]; }\nblock entry { op fill(x, value=" + big + ") >> x; }\n", "2:32"),
             ("persistent { T(i): f32[2] @table; }\ndynamic { x: f32[2]; }\nblock entry { cache.write x >> T["
              + big + "]; }\n", "3:34")]
    for src, where in cases:
        with pytest.raises(OiError) as info:
            oi2jax.compile(src, zero_missing_inputs=True)
        assert str(info.value).startswith(f"<string>:{where}: error: integer literal {shown} is out of the 64-bit "
                                          f"range\n"), str(info.value)[:300]
    with pytest.raises(OiError, match=r"<string>:1:25: error: integer literal -99999999999999999999\.\.\.99999999 "
                                      r"\(5000 characters\) is out of the 64-bit range"):
        oi2jax.compile("dynamic { x: i32 @init(-" + big + "); }\nblock entry { return; }\n")
    with pytest.raises(OiError, match=r"integer literal 0xffffffffffffffffff\.\.\.ffffffff \(5002 characters\) is out"):
        oi2jax.compile("dynamic { x: i64[2]; }\nblock entry { op fill(x, value=0x" + "f" * 5000 + ") >> x; }\n")
    with pytest.raises(OiError, match=r"float literal 99999999999999999999\.\.\.999999\.0 \(5002 characters\) overflows"):
        oi2jax.compile("dynamic { x: f32[2]; }\nblock entry { op fill(x, value=" + big + ".0) >> x; }\n")
    zeros = oi2jax.compile("dynamic { x: i32[2]; }\nblock entry { op fill(x, value=" + "0" * 5000 + "7) >> x; }\n",
                           zero_missing_inputs=True)  # 5001 digits, value 7: fine
    assert zeros.run({})["x"].tolist() == [7, 7]
    g = tmp_path / "g.oi"
    g.write_text("dynamic { x: f32[B]; }\nblock entry { return; }\n")
    code, _, err = run_cli(capsys, "check", g, "--size", f"B={big}")
    assert code == 2 and err.strip().endswith("error: --size B: a number of 5000 digits is too large")
    # a metadata array of 65 dimensions: written as 64 (NumPy's most), its rank patched to 65 (the
    # 65th dim reads the f64 zero that was the data: 0 elements, the same payload size)
    save(tmp_path / "m.oinf", metadata={"a": np.zeros((1,) * 64, np.float64)})
    raw = bytearray((tmp_path / "m.oinf").read_bytes())
    at = raw.find(struct.pack("<I", 64) + struct.pack("<Q", 1) * 64)
    raw[at:at + 4] = struct.pack("<I", 65)
    (tmp_path / "m.oinf").write_bytes(bytes(raw))
    code, _, err = run_cli(capsys, "inspect", tmp_path / "m.oinf")
    assert code == 1 and err.strip() == f"error: {tmp_path / 'm.oinf'}: metadata a: ndarray has 65 dimensions; " \
                                        f"the limit is 64"
    save(tmp_path / "t.oinf", tensors={"w": Tensor("f32", None, (1,) * 65)})  # a tensor too (no data to load)
    code, _, err = run_cli(capsys, "check", g, "--model", tmp_path / "t.oinf")
    assert code == 1 and err.strip() == f"error: {tmp_path / 't.oinf'}: tensor w has 65 dimensions; the limit is 64"


def test_an_unknown_size_has_the_checkers_wording_whichever_stage_finds_it():
    """An `@fixed` size or an int-list size that is unknown: the checker says it when it knows the
    sizes, binding when it does not (no model, no sizes) -- one function in messages.py words both."""
    from oi2jax.messages import op_unknown_size, unknown_fixed_size
    src = ("dynamic { a: f32[2, 3]; }\nvolatile { s: f32[2]; }\npersistent { K(i): f32[2] @table @fixed(i=T); }\n"
           "block entry { op sum_axis(a, axes=[Q]) >> s; return; }\n")
    fixed, axes = unknown_fixed_size("i", "T", "K"), op_unknown_size("sum_axis", "axes", "Q")
    with pytest.raises(OiError) as bound:  # no model and no sizes: binding finds them
        oi2jax.compile(src)
    with pytest.raises(OiError) as checked:  # sizes given: the checker finds them
        oi2jax.compile(src, sizes={"R": 1})
    for exc in (bound.value, checked.value):
        messages = [d.message for d in exc.diagnostics]
        assert fixed in messages and axes in messages, messages
    assert axes == "op sum_axis setting axes: unknown size Q"
