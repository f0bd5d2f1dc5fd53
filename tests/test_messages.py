"""Messages a user needs (issue 17): did-you-mean, wrong kinds of files, broken pipes, reused
states, complete outputs with a named `return`. Each test asserts the message text."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import oi2jax
from oi2jax.cli import main
from oi2jax.diagnostics import OiError

from conftest import EXAMPLES, REPO


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def test_unknown_op_and_setting_suggest_the_closest(capsys, tmp_path):
    g = tmp_path / "g.oi"
    g.write_text("dynamic { x: f32[2]; }\nvolatile { y: f32[2]; }\nblock entry {\n"
                 "    op reluu(x) >> y;\n    op relu(x, alppha=0.5) >> y;\n    return;\n}\n")
    code, _, err = run_cli(capsys, "check", g)
    assert code == 1
    assert f"{g}:4:8: error: unsupported op reluu (did you mean relu?)" in err
    assert "unsupported relu setting: alppha (did you mean alpha?)" in err


def test_unknown_input_suggests(capsys, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((4, 16), np.float32))
    code, _, err = run_cli(capsys, "run", EXAMPLES / "mlp_regression.oi", "--input", f"xx={tmp_path / 'x.npy'}")
    assert code == 1 and err.strip() == ("error: unknown input xx (did you mean x?): the graph's dynamic "
                                         "variables are x")


def test_model_given_as_graph_and_graph_given_as_input(capsys):
    model = EXAMPLES / "mlp_regression.oinf"
    code, _, err = run_cli(capsys, "check", model)
    assert code == 1 and err.startswith(f"error: cannot read {model}: not UTF-8 text, so not a .oi graph "
                                        f"(an .oinf model? pass it with --model)")
    code, _, err = run_cli(capsys, "run", EXAMPLES / "mlp_regression.oi", "--input",
                           f"x={EXAMPLES / 'mlp_regression.oi'}")
    assert code == 1 and err.strip() == (
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
    results = [oi2jax.compile(src, mode=mode).run({"x": x}, steps=2) for mode in ("compiled", "interpret")]
    for out in results:
        assert sorted(out) == ["h", "n", "x", "y"]
        np.testing.assert_array_equal(out["h"], [0.0, 2.0])
        np.testing.assert_array_equal(out["y"], [-1.0, 4.0])
        assert int(out["n"]) == 2
    prog = oi2jax.compile(src)
    assert sorted(prog.session().step(x=x)) == ["y"]  # the step's outputs: what `return` names
