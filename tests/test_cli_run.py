"""`oi2jax run` / `oi2jax compile`: the CLI contract of DEVELOPERS.md, end to end, in-process."""
from __future__ import annotations

import numpy as np
import pytest

from oi2jax.cli import main

from conftest import MODELS


def _device() -> str:
    import jax
    from oi2jax.runtime.placement import device_name
    return device_name(jax.devices()[0])


DEVICE = _device()  # the default device's name in traces (cpu:0 here, gpu:0 on a GPU)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


@pytest.fixture
def graph(tmp_path):
    path = tmp_path / "g.oi"
    path.write_text("""
dynamic { x: bf16[2]; q: i4[3]; }
persistent { n: i32 @init(0); T(i): f32[2] @table @fixed(i=3) @init(7.0); }
volatile { y: f32[2]; z: i4[3]; s: f32; }
block entry {
    op cast(x, to=f32) >> y;
    cache.write y >> T[n];
    cache.increment n;
    op add(q, q) >> z;
    return;
}
""")
    return path


def test_run_writes_every_variable_with_widening(capsys, tmp_path, graph):
    np.save(tmp_path / "x.npy", np.array([1.5, -2.0], np.float32))
    np.save(tmp_path / "q.npy", np.array([3, -4, 7], np.int8))
    out = tmp_path / "out.npz"
    code, _, err = run_cli(capsys, "run", graph, "--input", f"x={tmp_path / 'x.npy'}",
                           "--input", f"q={tmp_path / 'q.npy'}", "--steps", "2", "--out", out, "--quiet")
    assert code == 0, err
    data = np.load(out)
    assert set(data.files) == {"x", "q", "n", "T", "y", "z", "s"}
    assert data["x"].dtype == np.float32  # bf16 widened
    np.testing.assert_array_equal(data["x"], [1.5, -2.0])
    assert data["z"].dtype == np.int8
    np.testing.assert_array_equal(data["z"], [6, -8, -2])  # i4 wraps: 7+7 = 14 -> -2
    assert data["s"].shape == () and data["n"].shape == () and int(data["n"]) == 2
    np.testing.assert_array_equal(data["T"], [[1.5, -2.0], [1.5, -2.0], [7.0, 7.0]])  # unwritten: @init


def test_run_rejects_out_of_range_input(capsys, tmp_path, graph):
    np.save(tmp_path / "q.npy", np.array([3, 9, 0], np.int8))
    code, _, err = run_cli(capsys, "run", graph, "--input", f"q={tmp_path / 'q.npy'}")
    assert code == 1
    assert "error: input q: value 9 is out of range for i4 [-8, 7]" in err


def test_run_rejects_lossy_float_input(capsys, tmp_path):
    path = tmp_path / "f.oi"
    path.write_text("dynamic { x: f32[1]; } volatile { y: f32[1]; } block entry { op add(x, x) >> y; }")
    np.save(tmp_path / "x.npy", np.array([0.1], np.float64))
    code, _, err = run_cli(capsys, "run", path, "--input", f"x={tmp_path / 'x.npy'}")
    assert code == 1 and "not exactly representable in f32" in err
    # a value the cast overflows: the same refusal, and no NumPy RuntimeWarning (it printed one, with
    # oi2jax's source line, before the error)
    np.save(tmp_path / "x.npy", np.array([1e40], np.float64))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, _, err = run_cli(capsys, "run", path, "--input", f"x={tmp_path / 'x.npy'}")
    assert code == 1 and "error: input x: value 1e+40 (float64) is not exactly representable in f32" in err


@pytest.mark.parametrize("argv, message", [
    (["--input", "nope=x.npy"], "error: input file not found: x.npy"),
    (["--input", "x"], "--input expects NAME=FILE.npy"),
    (["--size", "B"], "--size expects NAME=INT"),
    (["--model", "missing.oinf"], "missing.oinf"),
])
def test_run_usage_and_input_errors(capsys, graph, argv, message):
    code, _, err = run_cli(capsys, "run", graph, *argv)
    assert code in (1, 2)
    assert message in err


def test_unknown_input_name(capsys, tmp_path, graph):
    np.save(tmp_path / "w.npy", np.zeros(2, np.float32))
    code, _, err = run_cli(capsys, "run", graph, "--input", f"w={tmp_path / 'w.npy'}")
    assert code == 1 and "unknown input w" in err


def test_run_example_with_model_and_explain_recompiles(capsys, tmp_path):
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "o.npz"
    code, _, err = run_cli(capsys, "run", "examples/mlp_regression.oi", "--model", MODELS / "mlp_regression.oinf",
                           "--input", f"x={tmp_path / 'x.npy'}", "--out", out, "--quiet", "--explain-recompiles",
                           "--steps", "3")
    assert code == 0, err
    assert "note: compile #1: first call" in err and "compile #2" not in err
    from oi2jax.model import open_model
    m = open_model(MODELS / "mlp_regression.oinf")
    ref = np.maximum(x @ m.load("w1") + m.load("b1"), 0) @ m.load("w2") + m.load("b2")
    np.testing.assert_allclose(np.load(out)["y"], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind, needle", [("jaxpr", "dot_general"), ("stablehlo", "stablehlo.dot_general"),
                                          ("hlo", "dot("), ("optimized-hlo", "dot"),
                                          ("graph-json", '"Op"')])
def test_compile_emits(capsys, tmp_path, kind, needle):
    target = tmp_path / "out.txt"
    code, _, err = run_cli(capsys, "compile", "examples/mlp_regression.oi", "--model",
                           MODELS / "mlp_regression.oinf", "--emit", kind, "-o", target)
    assert code == 0, err
    assert needle in target.read_text()


def test_compile_dump_dir_names_blocks(capsys, tmp_path):
    code, out, err = run_cli(capsys, "compile", "examples/moe_routing.oi", "--model", MODELS / "moe_routing.oinf",
                             "--emit", "hlo", "--dump-dir", tmp_path / "dump")
    assert code == 0, err
    names = sorted(p.name for p in (tmp_path / "dump").iterdir())
    assert "block.expert0.stablehlo.mlir" in names and "step.optimized-hlo.txt" in names
    assert "conditional" in out


def test_compile_dump_dir_refuses_clashes_before_writing(capsys, tmp_path):
    """Probe (sharding) 3-5: `-o` naming a dump file overwrote it with another form (exit 0);
    `-o DIR --dump-dir DIR` wrote the dump and then failed; a dump failing partway left its
    first files; `--dump-dir FILE` said "File exists". Each is refused before any file is
    written now, and a failed dump removes the files it created."""
    model = ["--model", MODELS / "mlp_regression.oinf"]
    d = tmp_path / "d"
    d.mkdir()
    code, _, err = run_cli(capsys, "compile", "examples/mlp_regression.oi", *model, "--dump-dir", d,
                           "--emit", "jaxpr", "-o", d / "step.hlo.txt")
    assert code == 1 and f"error: -o {d / 'step.hlo.txt'} is the file step.hlo.txt of the --dump-dir {d}: " in err
    assert list(d.iterdir()) == []
    new = tmp_path / "new"
    code, _, err = run_cli(capsys, "compile", "examples/mlp_regression.oi", *model, "--dump-dir", new, "-o", new)
    assert code == 1 and f"-o and --dump-dir name the same path ({new})" in err and not new.exists()
    (tmp_path / "afile").write_text("keep")
    code, _, err = run_cli(capsys, "compile", "examples/mlp_regression.oi", *model, "--dump-dir", tmp_path / "afile")
    assert code == 1 and f"error: {tmp_path / 'afile'}: not a directory" in err
    assert (tmp_path / "afile").read_text() == "keep"
    bad = tmp_path / "bad"
    (bad / "step.hlo.txt").mkdir(parents=True)  # the third file cannot be written
    (bad / "step.jaxpr.txt").write_text("an earlier dump")
    code, _, err = run_cli(capsys, "compile", "examples/mlp_regression.oi", *model, "--dump-dir", bad / "x" / "..",
                           "-o", tmp_path / "o.txt")
    assert code == 1 and "step.hlo.txt: is a directory" in err
    # the file it created is removed; the one it replaced is replaced (atomically), the directory kept
    assert sorted(p.name for p in bad.iterdir()) == ["step.hlo.txt", "step.jaxpr.txt"]
    assert (bad / "step.jaxpr.txt").read_text().startswith("{ lambda") and not (tmp_path / "o.txt").exists()
    deep = tmp_path / "p" / "q"
    (tmp_path / "o.txt").mkdir()
    code, _, err = run_cli(capsys, "compile", "examples/mlp_regression.oi", *model, "--dump-dir", deep)
    assert code == 0, err
    code, _, err = run_cli(capsys, "compile", "examples/mlp_regression.oi", *model, "--dump-dir", deep,
                           "-o", deep / "other.txt")  # a file of its own inside the dump is fine
    assert code == 0, err
    assert "module @" in (deep / "other.txt").read_text()


def test_compile_shows_loop_and_barrier(capsys, tmp_path):
    path = tmp_path / "l.oi"
    path.write_text("""
dynamic { x: f32[2]; }
volatile { y: f32[2]; }
block entry { loop l (i in 0..4) { op add(y, x) >> y; } barrier; op mul(y, y) >> y; }
""")
    code, out, err = run_cli(capsys, "compile", path, "--emit", "hlo")
    assert code == 0, err
    assert "while" in out and "opt-barrier" in out


def test_run_trace_interpreted_follows_openinfer_order(capsys, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((4, 16), np.float32))
    np.save(tmp_path / "r.npy", np.array(False))
    code, out, err = run_cli(capsys, "run", "examples/moe_routing.oi", "--model", MODELS / "moe_routing.oinf",
                             "--input", f"x={tmp_path / 'x.npy'}", "--input", f"route={tmp_path / 'r.npy'}",
                             "--interpret", "--trace", "--quiet", "--trace-json", tmp_path / "t.json")
    assert code == 0, err
    heads = [line.split(" -- ")[0:2] for line in out.splitlines()]
    assert heads == [["0 [entry]", "op matmul(x,w_gate) >> gate"], ["1 [entry]", "branch route expert0 expert1"],
                     ["6 [expert1]", "op matmul(x,w1) >> y"], ["7 [expert1]", "op add(y,b1) >> y"],
                     ["8 [expert1]", "return"], ["2 [entry]", "return"]]
    import json
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["granularity"] == "node" and [e["node_index"] for e in data["events"]] == [0, 1, 6, 7, 8, 2]


def test_run_trace_compiled_is_per_kernel(capsys, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((4, 16), np.float32))
    code, out, err = run_cli(capsys, "run", "examples/streaming_pipeline.oi", "--model",
                             MODELS / "streaming_pipeline.oinf", "--input", f"x={tmp_path / 'x.npy'}",
                             "--trace", "--quiet", "--steps", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("# compiled mode: nodes run fused inside kernels")
    kernels = [line.split(" on ")[0] for line in lines[1:]]
    assert len(kernels) == 8
    # per step: entry's first phase, then the two consumers and entry's window phase in ready-queue
    # order (whichever kernel is ready first)
    for step in (1, 2):  # counted from 1, as a runtime error's (in step k)
        mine = kernels[4 * (step - 1):4 * step]
        assert mine[0] == f"step {step} phase 0 entry:0"
        assert sorted(mine[1:]) == sorted([f"step {step} phase 0 reader", f"step {step} phase 0 writer",
                                           f"step {step} phase 1 entry:1"])
    assert all(f" on {DEVICE}: " in line for line in lines[1:])  # the device's own name


def test_run_trace_fused_names_the_device(capsys):
    """A trace names the device a kernel ran on as the device says (`cpu:0`, `gpu:0`), not a literal."""
    code, out, err = run_cli(capsys, "run", "examples/mlp_regression.oi", "--zero-missing-inputs", "--trace",
                             "--quiet", "--steps", "2")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3, err
    assert all(line.startswith(f"step {i} phase 0 step (whole graph") and f" on {DEVICE}: " in line
               for i, line in enumerate(lines[1:], start=1))


@pytest.mark.parametrize("argv", [["run", "examples/quantized_linear.oi", "--quiet", "--out"],
                                  ["compile", "examples/mlp_regression.oi", "--emit", "hlo", "-o"]])
def test_unwritable_output_path_is_a_clean_error(capsys, tmp_path, argv):
    target = tmp_path / "missing-dir" / ("out.npz" if argv[0] == "run" else "out.hlo")
    code, _, err = run_cli(capsys, *argv, target)
    assert code == 1
    note = "" if argv[0] == "run" else "note: using model examples/mlp_regression.oinf (beside the graph)\n"  # not --quiet
    assert err.strip() == f"{note}error: {target}: no such directory: {target.parent}"  # told before any work


def test_constants_without_a_value_are_errors_unless_zeros_are_asked_for(capsys, tmp_path):
    """Issue 34 item 3: with no model and every size given by --size, `run` printed all-zero outputs
    (every constant silently zeros); without --size, `unknown size: B` did not say that no model was
    found, nor where it looked, and had no source line."""
    from conftest import EXAMPLES
    g = tmp_path / "g.oi"
    g.write_text((EXAMPLES / "mlp_regression.oi").read_text())  # no g.oinf beside it
    sizes = ["--size", "B=2", "--size", "D=2", "--size", "H=2", "--size", "O=2"]
    code, out, err = run_cli(capsys, "run", g, *sizes, "--zero-missing-inputs", "--quiet")
    assert code == 0 and out == "" and err == ""  # asked for: OpenInfer's zeros
    code, out, err = run_cli(capsys, "run", g, *sizes, "--zero-missing-inputs", "--out", tmp_path / "o.npz")
    assert code == 0 and "y: float32[2, 2]" in out
    with np.load(tmp_path / "o.npz") as npz:
        assert not npz["y"].any()
    code, out, err = run_cli(capsys, "run", g, *sizes, "--input", f"x={_npy(tmp_path, np.ones((2, 2), np.float32))}")
    assert code == 1 and out == ""
    why = f"no model given and none found at {tmp_path / 'g.oinf'}, and no @init"
    hint = "give a model, or ask for OpenInfer's zeros with --zero-missing-inputs (zero_missing_inputs=True)"
    assert err == "".join(f"{g}:{line}:5: error: constant {name} has no value ({why}); {hint}\n        {decl}\n        ^\n"
                          for line, name, decl in [(8, "w1", "w1: f32[D, H];"), (9, "b1", "b1: f32[H];"),
                                                   (10, "w2", "w2: f32[H, O];"), (11, "b2", "b2: f32[O];")])
    code, out, err = run_cli(capsys, "compile", g, *sizes)  # compile and export say the same
    assert code == 1 and err.count("error: constant") == 4 and f"{g}:8:5: error: constant w1 has no value" in err
    code, _, _ = run_cli(capsys, "compile", g, *sizes, "--zero-missing-inputs", "--emit", "jaxpr")
    assert code == 0
    # no --size: every declaration with an unknown size says that no model was found, and where it looked
    code, out, err = run_cli(capsys, "run", g, "--quiet")
    where = f"no model given and none found at {tmp_path / 'g.oinf'}"
    expected = [(4, "x", "B", "x: f32[B, D];"), (8, "w1", "D", "w1: f32[D, H];"), (9, "b1", "H", "b1: f32[H];"),
                (10, "w2", "H", "w2: f32[H, O];"), (11, "b2", "O", "b2: f32[O];"), (15, "h", "B", "h: f32[B, H];"),
                (16, "y", "B", "y: f32[B, O];")]
    assert code == 1 and err == "".join(f"{g}:{line}:5: error: invalid dims for {var}: unknown size: {size} "
                                        f"({where})\n        {decl}\n        ^\n" for line, var, size, decl in expected)
    code, _, err = run_cli(capsys, "run", g, "--quiet", "--no-model", "--size", "B=2")
    assert code == 1 and f"{g}:4:5: error: invalid dims for x: unknown size: D (no model (--no-model / " \
                         f"model=False))\n" in err
    # @init constants have a value: no error, no flag needed
    g.write_text("constant { c: f32[2] @init(1.5); }\nvolatile { y: f32[2]; }\n"
                 "block entry { op add(c, c) >> y; return; }\n")
    code, out, err = run_cli(capsys, "run", g, "--out", tmp_path / "o.npz", "--quiet")
    assert code == 0, err
    with np.load(tmp_path / "o.npz") as npz:
        assert npz["y"].tolist() == [3.0, 3.0]


def _npy(tmp_path, array):
    path = tmp_path / f"in{len(list(tmp_path.glob('in*.npy')))}.npy"
    np.save(path, array)
    return path


def test_inputs_are_never_reshaped_or_broadcast(capsys, tmp_path):
    """Issue 34 item 4: an array of shape [1] for a scalar input and a 0-d array for a [4, 16]
    input: every way in is an error naming the input, the expected and the given shape (`--input`
    is the value of every step: a [1] array for a scalar was run as one value per step)."""
    import oi2jax
    from oi2jax.diagnostics import OiError
    g = tmp_path / "g.oi"
    g.write_text("dynamic { s: f32; x: f32[4, 16]; }\nvolatile { y: f32[4, 16]; }\n"
                 "block entry { op mul(x, s) >> y; return; }\n")
    s1, x0 = _npy(tmp_path, np.ones(1, np.float32)), _npy(tmp_path, np.float32(1))
    s, x = _npy(tmp_path, np.float32(2)), _npy(tmp_path, np.ones((4, 16), np.float32))
    for extra in ([], ["--interpret"]):
        code, _, err = run_cli(capsys, "run", g, "--input", f"s={s1}", "--input", f"x={x}", "--quiet", *extra)
        assert code == 1 and err.strip() == ("error: input s: expected shape [], got [1] (--input gives the value of "
                                             "every step; one value per step goes in --inputs-per-step FILE.npz)")
        code, _, err = run_cli(capsys, "run", g, "--input", f"s={s}", "--input", f"x={x0}", "--quiet", *extra)
        assert code == 1 and err.strip().startswith("error: input x: expected shape [4, 16], got []")
    # the right rank, other dims: --input's own rule is said, not the per-step one's `[N, 4, 16]`
    # (which --input refuses: that offer was a dead end)
    x8 = _npy(tmp_path, np.ones((4, 8), np.float32))
    for extra in ([], ["--interpret"]):
        code, _, err = run_cli(capsys, "run", g, "--input", f"s={s}", "--input", f"x={x8}", "--quiet", *extra)
        assert code == 1 and err.strip() == ("error: input x: expected shape [4, 16], got [4, 8] (--input gives the "
                                             "value of every step; one value per step goes in --inputs-per-step "
                                             "FILE.npz)"), err
    code, _, err = run_cli(capsys, "run", g, "--input", f"s={s}", "--input", f"x={x}", "--quiet")
    assert code == 0, err
    # the Python ways in: a step's value is exactly the declared shape
    good = {"s": np.float32(2), "x": np.ones((4, 16), np.float32)}
    bad = {"[1] for a scalar": ({"s": np.ones(1, np.float32)}, "input s: expected shape [], got [1]"),
           "0-d for [4, 16]": ({"x": np.float32(1)}, "input x: expected shape [4, 16], got []")}
    prog, interp = oi2jax.compile(str(g)), oi2jax.compile(str(g), mode="interpret")
    for what, (change, message) in bad.items():
        ins = {**good, **change}
        ways = {"Session.step": lambda: prog.session().step(**ins), "Program.step": lambda: prog.step(None, **ins)}
        for way, call in ways.items():
            with pytest.raises(OiError) as info:
                call()
            assert str(info.value).startswith(f"error: {message}"), (what, way, str(info.value))
    # Program.run / Session.run: [N, ...] is one value per step, [] never
    ins = {**good, "x": np.float32(1)}  # the interpreter's run takes inputs as Program.run does
    for call in (lambda: prog.run(ins), lambda: prog.session().run(ins, steps=1), lambda: interp.run(ins)):
        with pytest.raises(OiError) as info:
            call()
        assert str(info.value) == ("error: input x: expected shape [4, 16] (the same every step) or [N, 4, 16] "
                                   "(one value per step), got []")
    # in a session's run, [N] for a scalar is N values, one per step (docs/decode.md), never a reshape
    out = prog.session().run({"s": np.array([2.0, 3.0], np.float32), "x": good["x"]}, collect=("y",))
    assert out["y"].shape == (2, 4, 16) and out["y"][1, 0, 0] == 3.0


def test_interpret_refuses_the_session_flags_and_says_so(capsys, tmp_path, graph):
    """Issue 34 item 5: `--interpret` with a flag only a compiled run has is refused, as
    docs/cli.md says (--inputs-per-step is not one since 2026-11-28: the interpreter takes per-step
    inputs, tests/test_interpret.py; nor are --collect, --feedback and --stop since 2026-11-28
    (later): tests/test_stops.py)."""
    from conftest import REPO
    np.savez(tmp_path / "per.npz", x=np.ones((2, 2), np.float32))
    for flag, value in (("--state-in", tmp_path / "per.npz"), ("--state-out", tmp_path / "s.npz"), ("--stats", None)):
        code, _, err = run_cli(capsys, "run", graph, "--interpret", flag, *([value] if value else []), "--quiet")
        assert code == 2 and err.strip() == f"error: {flag} needs a compiled run (not --interpret)"
    assert ("`--state-in`, `--state-out` and `--stats` need a compiled run and are refused with it"
            ) in " ".join((REPO / "docs" / "cli.md").read_text().split())


@pytest.mark.parametrize("argv", [["examples/streaming_pipeline.oi", "--model", MODELS / "streaming_pipeline.oinf"],
                                  ["examples/kv_cache_decode.oi", "--trace"]])
def test_stats_line_from_stepwise_runs(capsys, tmp_path, argv):
    """`--stats` prints its line for the runs that go one step at a time from the host (the
    yield/await driver, a traced run), failing or not; it printed nothing there (docs/cli.md)."""
    rows = 4 if "streaming" in str(argv[0]) else 16
    shape = (rows, 16) if rows == 4 else (16,)
    np.save(tmp_path / "x.npy", np.ones(shape, np.float32))
    name = "x" if rows == 4 else "q"
    stats = r"compile [0-9.]+ s, first step [0-9.]+ s, steady [0-9.]+ steps/s \((\d) steps in [0-9.]+ s\)"
    code, _, err = run_cli(capsys, "run", *argv, "--input", f"{name}={tmp_path / 'x.npy'}", "--steps", "3",
                           "--stats", "--quiet")
    assert code == 0, err
    import re
    found = re.findall(stats, err)
    assert found == ["3"], err
    if name == "q":  # K holds 4 rows: step 5 fails, the line counts the 4 before it
        code, _, err = run_cli(capsys, "run", *argv, "--input", f"{name}={tmp_path / 'x.npy'}", "--steps", "6",
                               "--stats", "--quiet")
        assert code == 1 and "(in step 5)" in err, err
        assert re.findall(stats, err) == ["4"], err
