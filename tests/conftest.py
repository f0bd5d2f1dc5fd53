"""Shared test fixtures: where the OpenInfer reference material lives, and small helpers."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# The CLI turns on JAX's persistent compilation cache by default; tests must not fill the
# user's ~/.cache (tests of the cache itself pass their own --cache-dir).
os.environ.setdefault("OI2JAX_CACHE_DIR", "none")

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("OI2JAX_SHARED", REPO.parent / "shared" / "openinfer"))
MODELS = SHARED / "models"
BASELINE = SHARED / "baseline"
EXAMPLES = REPO / "examples"
# `make test` runs the default profile (under 5 minutes on an idle 2-core machine); `make
# test-nightly` (OI2JAX_PROFILE=nightly) adds the long variants: the random differential test in
# driver mode too, the 100-run concurrency stress test
NIGHTLY = os.environ.get("OI2JAX_PROFILE") == "nightly"


@pytest.fixture(scope="session")
def shared() -> Path:
    assert SHARED.is_dir(), f"reference material not found at {SHARED} (set OI2JAX_SHARED)"
    return SHARED


def run_cli(capsys, *argv):
    """`oi2jax ARGV...` in-process: (exit code, stdout, stderr); never a traceback."""
    from oi2jax.cli import main
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err

