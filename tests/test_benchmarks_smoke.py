"""A tiny-size run of the benchmark harness (benchmarks/run.py, profile "tiny").

Correctness only: the hand-written JAX models (benchmarks/handwritten/) compute the same
values as oi2jax, the yield driver the same as fused mode, the growable table holds every
row. Timing is never asserted here (the speed targets are reported by `python -m benchmarks`).
"""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks import handwritten
from benchmarks.cases import cases
from benchmarks.run import run_benchmarks


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_benchmarks("tiny", out_dir=tmp_path_factory.mktemp("bench"), log=lambda *a: None)


def test_every_example_is_covered():
    assert {c.example for c in cases("tiny")} == set(handwritten.NAMES)
    assert {c.example for c in cases("quick")} == set(handwritten.NAMES)


def test_handwritten_matches_oi2jax(results):
    for r in results["cases"]:
        assert r["compared"], r["name"]
        assert r["max_abs_diff"] == 0.0, (r["name"], r["max_abs_diff"])


def test_driver_matches_fused(results):
    streams = [r for r in results["cases"] if "driver_max_abs_diff" in r]
    assert streams
    assert all(r["driver_max_abs_diff"] == 0.0 for r in streams)


def test_growable_table_values(results):
    assert all(g["values_ok"] for g in results["growth"])


def test_reports_written(results, tmp_path):
    from benchmarks.run import markdown
    text = markdown(results)
    assert "| case |" in text and "Recompiles" in text
    assert all(np.isfinite(r["a_s"]) and np.isfinite(r["b_s"]) for r in results["cases"])
