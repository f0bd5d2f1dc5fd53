"""Issue 15 item 5: pyflakes clean (package, tests, examples, benchmarks) and no dead code that
vulture finds at high confidence, as part of `make test`."""
from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_pyflakes_clean():
    result = _run("pyflakes", "oi2jax", "tests", "examples", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_dead_code_at_high_confidence():
    result = _run("vulture", "--min-confidence", "80", "oi2jax")
    assert result.returncode == 0, result.stdout + result.stderr
