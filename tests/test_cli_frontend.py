"""`oi2jax check` and `oi2jax fmt` through `python -m oi2jax` (exit codes, located diagnostics)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli

REPO = Path(__file__).resolve().parent.parent
GOOD = "dynamic {\n    x: f32[4];\n}\n\nvolatile {\n    y: f32[4];\n}\n\nblock entry {\n    op relu(x) >> y;\n    return;\n}\n"


def run(*args, cwd=None):
    """`python -m oi2jax ARGS...` as a process: the tests whose claim is the process's exit status."""
    p = subprocess.run([sys.executable, "-m", "oi2jax", *map(str, args)], capture_output=True, text=True,
                       cwd=cwd or REPO, timeout=60)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    return p


@pytest.fixture
def cli(capsys):
    """`oi2jax ARGS...` in-process (conftest.run_cli) as a `CompletedProcess`: the tests of
    messages and of the code `main` returns, which `run` shows to be the process's exit status."""
    def call(*args):
        code, out, err = run_cli(capsys, *args)
        return subprocess.CompletedProcess(args, code, out, err)
    return call


@pytest.fixture
def files(tmp_path):
    good = tmp_path / "good.oi"
    good.write_text(GOOD)
    messy = tmp_path / "messy.oi"
    messy.write_text("dynamic{x:f32[4];} volatile { y : f32[ 4 ] ; }\nblock entry{op relu(x)>>y;return;}")
    bad = tmp_path / "bad.oi"
    bad.write_text("dynamic { x: f32[4]; }\nblock entry {\n    op frob(x) >> x;\n    op relu(q) >> x;\n}\n")
    syntax = tmp_path / "syntax.oi"
    syntax.write_text("dynamic { x: f32[4] }\n")
    return {"good": good, "messy": messy, "bad": bad, "syntax": syntax}


def test_check_valid(files):
    p = run("check", files["good"])
    assert p.returncode == 0 and p.stderr == ""


def test_check_errors_all_reported(files):
    p = run("check", files["bad"])
    assert p.returncode == 1
    path = files["bad"]
    assert f"{path}:3:8: error: unsupported op frob\n        op frob(x) >> x;\n           ^" in p.stderr
    assert f"{path}:4:13: error: unknown input variable q" in p.stderr


def test_check_syntax_error(files, cli):
    p = cli("check", files["syntax"])
    assert p.returncode == 1
    assert p.stderr.startswith(f"{files['syntax']}:1:21: error: unexpected '}}'; expected one of ")
    assert "';'" in p.stderr and "^" in p.stderr


def test_check_missing_file(tmp_path, cli):
    p = cli("check", tmp_path / "none.oi")
    assert p.returncode == 1 and p.stderr.startswith("error: cannot read ")


def test_check_with_sizes(files, tmp_path, cli):
    sized = tmp_path / "sized.oi"
    sized.write_text("dynamic { x: f32[B]; }\nvolatile { y: f32[B]; }\nblock entry { op relu(x) >> y; return; }\n")
    p = cli("check", sized, "--size", "B=2")
    assert p.returncode == 0 and p.stderr == ""
    # a size nothing uses is no longer silently ignored (issue 17)
    p = cli("check", files["good"], "--size", "B=2")
    assert p.returncode == 1 and p.stderr == "error: unknown size B: the graph and model sizes are (none)\n"
    p = cli("check", files["good"], "--size", "B")
    assert p.returncode == 2


def test_check_shape_error_with_sizes(tmp_path, cli):
    f = tmp_path / "s.oi"
    f.write_text("dynamic { x: f32[B]; }\nvolatile { y: f32[3]; }\nblock entry { op relu(x) >> y; }\n")
    assert cli("check", f).returncode == 0
    p = cli("check", f, "--size", "B=4")
    assert p.returncode == 1 and f"{f}:3:29: error: op relu output shape mismatch for y" in p.stderr


def test_usage_errors():
    assert run().returncode == 2
    assert run("check").returncode == 2
    assert run("fmt", "--bogus", "x.oi").returncode == 2


def test_fmt_stdout_check_and_in_place(files, cli):
    p = cli("fmt", files["messy"])
    assert p.returncode == 0 and p.stdout == GOOD
    assert cli("fmt", "--check", files["good"]).returncode == 0
    p = cli("fmt", "--check", files["messy"])
    assert p.returncode == 1 and "would be reformatted" in p.stderr
    assert cli("fmt", "-i", files["messy"]).returncode == 0
    assert files["messy"].read_text() == GOOD


def test_fmt_syntax_error(files, cli):
    p = cli("fmt", files["syntax"])
    assert p.returncode == 1 and f"{files['syntax']}:1:21: error:" in p.stderr and p.stdout == ""


def test_warning_only_exits_zero(tmp_path, cli):
    f = tmp_path / "w.oi"
    f.write_text("block entry { return; }\nblock lost { return; }\n")
    p = cli("check", f)
    assert p.returncode == 0 and f"{f}:2:1: warning: block lost is never run" in p.stderr


MISMATCH = ("dynamic { x: f32[B, D]; }\nconstant { w: f32[E, H]; }\nvolatile { y: f32[B, H]; }\n"
            "block entry {\n    op matmul(x, w) >> y;\n    return;\n}\n")


def test_check_uses_the_model_beside_the_graph_and_says_so(tmp_path, cli):
    """Issue 34 item 2: `check g.oi` ignored g.oinf beside the graph (exit 0 on a matmul inner-dim
    mismatch that `run` and `check --model` reported). One rule (pipeline.choose_model) for every
    command; a note names the model found; `--no-model` asks for none."""
    import numpy as np
    from oi2jax.model import save
    g, m = tmp_path / "g.oi", tmp_path / "g.oinf"
    g.write_text(MISMATCH)
    save(m, sizevars={"B": 2, "D": 3, "E": 4, "H": 5}, tensors={"w": np.ones((4, 5), np.float32)})
    error = f"{g}:5:18: error: matmul inner dim mismatch: 3 vs 4\n        op matmul(x, w) >> y;\n                     ^\n"
    p = cli("check", g)
    assert p.returncode == 1 and p.stderr == f"note: using model {m} (beside the graph)\n{error}"
    p = cli("check", g, "--model", m)  # given: no note
    assert p.returncode == 1 and p.stderr == error
    p = cli("check", g, "--no-model")  # sizes stay names: nothing to compare
    assert p.returncode == 0 and p.stderr == ""
    p = cli("check", g, "--no-model", "--model", m)
    assert p.returncode == 2 and p.stderr.strip() == "error: give either --model or --no-model, not both"
    p = cli("run", g, "--no-model", "--size", "B=2", "--size", "D=3", "--size", "E=3", "--size", "H=5",
            "--zero-missing-inputs", "--quiet", "--cache-dir", "none")
    assert p.returncode == 0 and p.stderr == ""


def test_a_closed_standard_output_is_an_error_for_a_command_that_prints(tmp_path):
    """`oi2jax fmt g.oi >&-` was an internal error (Python sets sys.stdout to None); now the printing
    command fails as an unwritable output does, and one that writes only files goes on."""
    graph = tmp_path / "g.oi"
    graph.write_text(GOOD.replace("    op", "  op"))  # not canonical: -i rewrites it

    def closed(*args):  # the shell closes fd 1 (no preexec_fn: a fork of a process with JAX's threads)
        return subprocess.run(["sh", "-c", 'exec "$0" -m oi2jax "$@" >&-', sys.executable, *map(str, args)],
                              stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=60)
    p = closed("fmt", graph)
    assert p.returncode == 1 and p.stderr == "error: standard output is closed: nowhere to print\n"
    p = closed("fmt", "-i", graph)
    assert p.returncode == 0 and p.stderr == "" and graph.read_text() == GOOD
    for args in (["--version"], ["fmt", "--help"]):  # argparse's own printing dropped the failed write: exit 0
        p = closed(*args)
        assert p.returncode == 1 and p.stderr == "error: standard output is closed: nowhere to print\n", args


@pytest.mark.parametrize("argv, flag, first, second", [
    (["compile", "G", "--emit", "jaxpr", "--emit", "hlo"], "--emit", "--emit jaxpr", "--emit hlo"),
    (["run", "G", "--steps", "1", "--steps=2"], "--steps", "--steps 1", "--steps 2"),
    (["compile", "G", "-o", "a", "-o", "b"], "-o", "-o a", "-o b"),
])
def test_a_flag_of_one_value_given_twice_is_a_usage_error(capsys, argv, flag, first, second):
    """Emit probe 7: argparse kept the last value without a word (`--emit jaxpr --emit hlo`
    printed HLO, `-o a -o b` wrote only b, `--steps 1 --steps 2` ran 2 steps)."""
    from oi2jax.cli import main
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {flag} given twice ({first}, {second}); give it once"


def test_check_keeps_its_exit_status_when_stderr_is_a_closed_pipe(tmp_path):
    """`oi2jax check bad.oi 2>&1 | head -1` under `set -o pipefail` took an invalid graph for a
    valid one: the diagnostics' write failed with a broken pipe, answered with exit 0 (frontend probe)."""
    bad = tmp_path / "bad.oi"
    bad.write_text("dynamic { x: f32; }\ndynamic { x: f32; }\nblock entry { return; }\n")
    p = subprocess.Popen([sys.executable, "-m", "oi2jax", "check", str(bad), "--no-model"], cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    p.stderr.close()  # the reader is gone before the first diagnostic is written
    assert p.wait(timeout=60) == 1


def test_a_size_past_u64_is_a_usage_error(cli, tmp_path):
    """`check --size B=10**23` said the graph was valid at a size no model can hold (a size
    variable is a u64, SPEC §7) (frontend probe)."""
    g = tmp_path / "g.oi"
    g.write_text("dynamic { x: f32[B]; }\nvolatile { y: f32[B]; }\nblock entry { op relu(x) >> y; return; }\n")
    p = cli("check", g, "--no-model", "--size", "B=99999999999999999999999")
    assert p.returncode == 2 and p.stderr.strip().endswith(
        "error: --size B: 99999999999999999999999 is past u64's largest value, 18446744073709551615 "
        "(a size variable is a u64)")
    assert cli("check", g, "--no-model", "--size", "B=18446744073709551615").returncode == 0
