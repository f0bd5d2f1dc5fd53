"""Warm starts (`--cache-dir`, issue 11 part 4) and the `run --steps N` progress bar (part 5)."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import jax

from oi2jax import api
from oi2jax.cli import main
from oi2jax.progress import ProgressBar, progress_for

from conftest import EXAMPLES, REPO

PROBE = r"""
import sys, json
from jax._src import monitoring
counts = {"misses": 0, "hits": 0}
def _ev(name, **kw):
    if name == "/jax/compilation_cache/cache_misses": counts["misses"] += 1
    if name == "/jax/compilation_cache/cache_hits": counts["hits"] += 1
monitoring.register_event_listener(_ev)
from oi2jax.cli import main
rc = main(sys.argv[1:])
print("COUNTS " + json.dumps({"rc": rc, **counts}))
"""


def _run(args, env_extra=None):
    import os
    env = dict(os.environ, **(env_extra or {}))
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=str(REPO),
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("COUNTS ")][-1]
    return json.loads(line[len("COUNTS "):]), proc.stdout


def test_second_run_skips_xla_compilation(tmp_path):
    cache = tmp_path / "xla"
    args = ["run", str(EXAMPLES / "residual_mlp_stack.oi"), "--steps", "2", "--cache-dir", str(cache), "--zero-missing-inputs"]
    first, out1 = _run(args)
    assert first["rc"] == 0 and first["misses"] >= 1  # cold: the step (and helpers) compiled ...
    steps = [p.name for p in cache.iterdir() if p.name.startswith("jit_fused_steps-")]
    assert steps, sorted(p.name for p in cache.iterdir())  # ... and persisted
    second, out2 = _run(args)
    assert second["rc"] == 0
    assert second["misses"] == 0, second  # warm: no backend compile at all, the step included
    assert second["hits"] >= 1
    assert out1.split("COUNTS")[0] == out2.split("COUNTS")[0]  # same printed outputs


SWITCH = r"""
import sys
from pathlib import Path
import jax, numpy as np
from oi2jax import api
first, second = sys.argv[1:]
api.enable_compilation_cache(first)
jax.jit(lambda x: x + 1)(np.ones(3, np.float32))
api.enable_compilation_cache(second)  # a second directory in the same process is used, not ignored
jax.jit(lambda x: x * 3)(np.ones(3, np.float32))
def entries(d):  # the executables (XLA:GPU also keeps its autotuning results there, in a folder)
    return sorted(p.name.split("-")[0] for p in Path(d).iterdir() if p.is_file())
print(entries(first), entries(second))
"""


def test_a_second_cache_directory_is_used(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SWITCH, str(tmp_path / "a"), str(tmp_path / "b")], capture_output=True,
                          text=True, cwd=str(REPO), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["['jit__lambda']", "['jit__lambda']"], proc.stdout


def test_cache_dir_none_and_default(tmp_path, monkeypatch, capsys):
    before = jax.config.jax_compilation_cache_dir
    monkeypatch.setenv("OI2JAX_CACHE_DIR", str(tmp_path / "env-cache"))
    assert api.default_cache_dir() == tmp_path / "env-cache"
    monkeypatch.delenv("OI2JAX_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert api.default_cache_dir() == tmp_path / "xdg" / "oi2jax" / "xla"
    assert api.enable_compilation_cache(None) is None and api.enable_compilation_cache("none") is None
    monkeypatch.setenv("OI2JAX_CACHE_DIR", "none")
    assert api.enable_compilation_cache("default") is None  # OI2JAX_CACHE_DIR=none turns the default off
    assert main(["run", str(EXAMPLES / "mlp_regression.oi"), "--quiet", "--cache-dir", "none", "--zero-missing-inputs"]) == 0
    assert jax.config.jax_compilation_cache_dir == before  # untouched
    assert not (tmp_path / "xdg").exists()
    assert "--cache-dir DIR|none" in _help(["run", "--help"]) and "--cache-dir" in _help(["compile", "--help"])
    capsys.readouterr()


def _help(argv):
    import contextlib
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            main(argv)
        except SystemExit:
            pass
    return buf.getvalue()


# ------------------------------------------------------------------ progress bar

class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_renders_rate_and_eta():
    now = [0.0]
    out = _Tty()
    bar = ProgressBar(1000, stream=out, width=10, interval=0.0, clock=lambda: now[0])
    now[0] = 2.0
    bar(500)
    assert "step 500/1000 [#####-----]  50.0% 250.0 steps/s" in out.getvalue()
    assert "eta 00:02" in out.getvalue()
    now[0] = 4.0
    bar(1000)
    bar.close()
    bar.close()  # idempotent
    text = out.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1 and "1000/1000 [##########] 100.0%" in text


def test_progress_bar_throttles_redraws():
    now = [0.0]
    out = _Tty()
    bar = ProgressBar(10_000, stream=out, interval=0.5, clock=lambda: now[0])
    for i in range(1, 1001):
        now[0] = i * 0.001  # 1000 steps in 1 s -> about 3 redraws
        bar(i)
    redraws = out.getvalue().count("\r")
    assert redraws in range(1, 5)


def test_progress_only_on_a_terminal_for_many_steps():
    assert progress_for(1000, stream=_Tty()) is not None
    assert progress_for(1000, stream=io.StringIO()) is None  # not a terminal
    assert progress_for(1000, quiet=True, stream=_Tty()) is None
    assert progress_for(10, stream=_Tty()) is None  # few steps: no bar


def test_run_shows_progress_on_a_terminal(monkeypatch, capsys):
    graph = str(EXAMPLES / "kv_cache_decode.oi")
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["run", str(EXAMPLES / "mlp_regression.oi"), "--steps", "300", "--cache-dir", "none", "--zero-missing-inputs"]) == 0
    text = tty.getvalue()
    assert "step 300/300" in text and "steps/s" in text and text.endswith("\n")
    tty.truncate(0)
    tty.seek(0)
    assert main(["run", str(EXAMPLES / "mlp_regression.oi"), "--steps", "300", "--quiet", "--cache-dir", "none", "--zero-missing-inputs"]) == 0
    assert tty.getvalue() == ""  # --quiet: no bar
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert main(["run", str(EXAMPLES / "mlp_regression.oi"), "--steps", "300", "--cache-dir", "none", "--zero-missing-inputs"]) == 0
    assert "steps/s" not in sys.stderr.getvalue()  # not a terminal: no bar
    assert main(["run", graph, "--steps", "2", "--quiet", "--cache-dir", "none", "--zero-missing-inputs"]) == 0
    capsys.readouterr()


def test_damaged_cache_entries_give_one_warning_line_then_compile_again(tmp_path):
    """Issue 34 item 4: damaged persistent-cache entries leaked JAX's own warnings (a Python
    file:line per entry) on every run. Now: one `warning:` line, the step compiled again, the
    damaged entries replaced (the next run reads the cache cleanly)."""
    cache = tmp_path / "xla"
    args = ["run", str(EXAMPLES / "residual_mlp_stack.oi"), "--steps", "2", "--cache-dir", str(cache),
            "--zero-missing-inputs", "--quiet"]
    first, _ = _run(args)
    entries = sorted(p for p in cache.iterdir() if p.name.endswith("-cache"))
    assert first["rc"] == 0 and entries
    for p in entries:
        p.write_bytes(b"garbage" if p.name.startswith("jit_fused_steps-") else p.read_bytes()[: p.stat().st_size // 2])
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=str(REPO),
                          timeout=120)
    counts = json.loads(proc.stdout.split("COUNTS ")[-1])
    assert counts["rc"] == 0 and counts["misses"] >= 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: compilation cache {cache}: cannot read the entry for "), \
        proc.stderr
    assert lines[0].endswith("; compiling again; the entry was removed and is written again")
    third = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=str(REPO),
                           timeout=120)
    counts = json.loads(third.stdout.split("COUNTS ")[-1])
    assert third.stderr == "" and counts["rc"] == 0 and counts["misses"] == 0 and counts["hits"] >= 1
