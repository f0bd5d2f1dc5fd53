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


def test_chart_units_and_legend(tmp_path):
    """Axis labels in lowercase units (ms, µs: never read as 'MS'/'US'); the legend sits right
    of the plot area, so no series line runs under it."""
    from benchmarks import png
    assert [png.fmt_time(t) for t in (2.0, 2e-3, 2e-5, 2e-8)] == ["2s", "2ms", "20µs", "20ns"]
    assert png._UNITS["m"] != png._FONT["m"] and png._UNITS["s"][0] == 0  # x-height glyphs
    drawn = []
    real = png.Canvas.text

    def spy(self, x, y, s, *a, **kw):
        drawn.append((x, s, kw.get("units", False)))
        return real(self, x, y, s, *a, **kw)

    png.Canvas.text = spy
    try:
        png.loglog_chart(tmp_path / "c.png", {"(a) one": [(64, 1e-5), (128, 2e-5)], "(b) two": [(64, 3e-5)]},
                         "t", "w")
    finally:
        png.Canvas.text = real
    legend_x = min(x for x, s, _ in drawn if s.startswith("("))
    ticks = [x for x, s, _ in drawn if s in ("64", "128")]
    assert legend_x > max(ticks)  # right of the last x tick, i.e. outside the plot
    assert all(units for _, s, units in drawn if s.endswith("s") and s[0].isdigit())
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_decode_benchmark_smoke(tmp_path):
    """benchmarks/decode.py runs end to end on a tiny case (values checked by tests/test_session.py)."""
    from pathlib import Path
    from benchmarks.decode import bench, decode_cases
    case, tiny = decode_cases("tiny")[1]
    r = bench(case, tiny, Path(tmp_path), None, reps=1)
    assert r["n_fused"] > 0 and all(np.isfinite(r[k]) and r[k] > 0 for k in ("a/b", "c/d", "c/b"))


def test_llama_benchmark_smoke(tmp_path):
    """benchmarks/llama.py end to end on a one-layer Llama: oi2jax and the hand-written model agree
    (asserted inside bench), (a)-(d) measured, a fresh-process worker's measurements, the report."""
    from benchmarks.llama import LlamaCase, bench, make_model, report, worker
    case = LlamaCase("smoke", vocab=64, hidden=32, layers=1, heads=4, kv_heads=2, intermediate=48,
                     max_positions=24, prompt=6, gen=4)
    model = make_model(case, tmp_path)
    r = bench(case, model, None, reps=1, cd_reps=1, scan_form=False)
    assert r["rel_err"] <= 1e-4 and r["same_tokens"]
    assert all(np.isfinite(r[k]) and r[k] > 0 for k in ("a/b", "c/d", "floor_s"))
    w = worker("hand", case, model, None)
    assert w["ttft_s"] > 0 and w["peak_bytes"] >= 0 and len(w["last_tokens"]) == 4
    r.update(ttft_oi2jax_s=1.0, ttft_hand_s=w["ttft_s"], ttft_ratio=1.0 / w["ttft_s"], peak_oi2jax_bytes=1,
             peak_hand_bytes=w["peak_bytes"], mem_ratio=1.0, mem_method=w["mem_method"], fresh_repeats=1)
    text = report([r], ["a skipped case"], dict(machine="m", device="cpu", jax="x", profile="smoke", gpu=False,
                                               load_before=0.0, load_after=0.0))
    assert "| smoke (D=32 L=1" in text and "Skipped: a skipped case" in text and "TTFT" in text


def test_driver_overhead_runs():
    """benchmarks/driver_overhead.py at 3 iterations: the driver's steps and the bare kernel calls
    run (its five kernels: three entry phases, two consumers); the ratio is reported, not asserted."""
    from benchmarks.driver_overhead import driver_overhead
    r = driver_overhead(3)
    assert r["kernels_per_step"] == 5
    assert np.isfinite(r["ratio"]) and r["ratio"] > 0
