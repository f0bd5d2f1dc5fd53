"""A tiny-size run of the benchmark harness (benchmarks/run.py, profile "tiny").

Correctness only: the hand-written JAX models (benchmarks/handwritten/) compute the same
values as oi2jax, the yield driver the same as fused mode, the growable table holds every
row. Timing is never asserted here (the speed targets are reported by `python -m benchmarks`).
"""
from __future__ import annotations

import jax
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


def test_llamacpp_benchmark_smoke(tmp_path):
    """benchmarks/llamacpp.py's parts that need no llama-cpp-python: the GGUF files (their blocks
    checked against gguf.quants.dequantize when written) load in oi2jax's converter; generate's
    --stats lines parse; an HLO op is attributed to its DSL op; the report renders every row."""
    import jax
    import jax.numpy as jnp
    from benchmarks import llamacpp as L
    from benchmarks.step_profile import hlo_scopes
    from oi2jax.generation import Stats
    from oi2jax.model.gguf import convert_gguf
    from oi2jax.model.reader import open_model

    files = L.model_files(L.QUICK, ["Q4_K", "BF16"], cache=tmp_path, log=lambda *a: None)
    assert L.tensor_bytes(files["Q4_K"]["path"]) < L.tensor_bytes(files["BF16"]["path"])
    convert_gguf(files["Q4_K"]["path"], tmp_path / "m.oinf", max_positions=L.QUICK.ctx)
    with open_model(tmp_path / "m.oinf") as m:
        assert m.ggml_type("model.layers.0.mlp.up_proj.weight") == "Q4_K"
        assert m.load("model.embed_tokens.weight").shape == (L.QUICK.vocab, L.QUICK.hidden)

    stats = Stats(prompt_tokens=512, prompt_s=2.5, generated_tokens=64, generate_s=0.5)
    assert L.parse_stats("compile 3.2 s (g.oi)\n" + "\n".join(stats.lines())) == dict(
        compile_s=3.2, prompt_tokens=512, prompt_s=2.5, gen_tokens=64, generate_s=0.5)
    from oi2jax.runtime.runstats import memory_line
    line = memory_line({"weights": 84_200_000, "state": 23_600_000, "where": "cpu:0"})
    assert L.parse_stats(line) == dict(weights_bytes=84.2e6, state_bytes=23.6e6)

    def step(w, x):
        with jax.named_scope("7:linear"):
            return jnp.tanh(w @ x)
    hlo = jax.jit(step).lower(jnp.ones((24, 8)), jnp.ones(8)).compile().as_text()
    assert "linear (lm_head)" in hlo_scopes(hlo, 24).values()

    row = dict(kind="Q4_1", gguf_bytes=10**8, tensor_bytes=10**8, write_s=1.0, floor_ms=4.0, ref_mem=1.1e8,
               lcp_decode=(100.0, 90.0, 110.0), lcp_prompt=(300.0, 280.0, 320.0), lcp_ms=10.0, lcp_rss=2e8,
               lcp_bytes=1e8, lcp_gbs=10.0, oi_decode=10.0, oi_prompt=9.0, oi_ms=100.0, oi_rss=1e9, oi_compile_s=5.0,
               oinf_bytes=5e8, oi_bytes=6e8, oi_gbs=6.0, decode_ratio=0.1, prompt_ratio=0.03, same_prefix=3,
               profile=dict(parts={"linear (Wq)": 20.0, "linear (lm_head)": 10.0, "attention": 5.0}, position=514,
                            step_ms_untraced=40.0, step_ms_traced=45.0, bytes_accessed=6e8, flops=2e8))
    meta = dict(shape=vars(L.QUICK) | {"name": "quick"}, cpu="cpu", cores=2, memory="1 kB", python="3", jax="j",
                numpy="n", gguf="g", llama_cpp_python=None, oi2jax_commit="c", uptime_before="u", uptime_after="u",
                peer=False, copy_rate=2.5e10, baseline_rss={"oi2jax": 4e8}, threads=2)
    row.update(oi_warm_decode=(20.0, 19.0, 21.0), oi_warm_prompt=(400.0, 390.0, 410.0), oi_first_prompt=200.0,
               warm_decode_ratio=0.2, warm_prompt_ratio=1.33)
    ggml_row = dict(row, kind="Q4_1 --kernels ggml", decode_ratio=1.2, oi_device=1.2e8, oi_device_ref=1.25e8)
    ggml_row.pop("profile")
    kv_row = dict(ggml_row, kind=f"Q4_1 {L._variant('ggml', 'f16')}", decode_ratio=0.7)
    text = L.report({"meta": meta, "rows": [row, ggml_row, kv_row, dict(kind="BF16", gguf_bytes=1, tensor_bytes=1,
                                                                        write_s=0.0, floor_ms=1.0, ref_mem=2,
                                                                        oi_error="generate: boom")]})
    assert "| Q4_1 | 100.0 (90.0-110.0) | 10.0 | 0.10x MISSED |" in text
    assert "| Q4_1 --kernels ggml | 100.0 (90.0-110.0) | 10.0 | 1.20x met |" in text  # a targeted type's row too
    assert "| Q4_1 --kernels ggml --kv-dtype f16 | 100.0 (90.0-110.0) | 10.0 | 0.70x MISSED |" in text
    assert text.split("## The model files")[1].count("| Q4_1 |") == 1  # each type's file once
    assert "| Q4_1 | 100.0 (90.0-110.0) | 20.0 (19.0-21.0) | 0.20x MISSED | 300 (280-320) | 200 | 400 (390-410) | 1.33x met |" \
        in text  # the warm runs
    assert "| 1000 MB | 9.09x MISSED | 120 MB (0.96x met) |" in text and "| 1000 MB | 9.09x MISSED | n/a |" in text
    assert "| layers' linear (matvecs) | 20.00 | 57% |" in text and "BF16 oi: generate: boom" in text
    assert "llama-cpp-python is not installed" in text


def test_sampling_benchmark_smoke():
    """benchmarks/sampling.py on a small vocabulary: the bit-by-bit thresholds and the sort form draw the same
    token at each batch size and setting (asserted inside), the report has its rows."""
    from benchmarks.sampling import measure, report
    rows = measure(v=64, reps=1, batches=(2,))
    assert len(rows) == 2 and all(r["ours_ms"] > 0 and r["sort_ms"] > 0 for r in rows)
    assert report(rows).count("\n| ") == 3


def test_batch_dots_benchmark_smoke():
    """benchmarks/batch_dots.py on two small matrices: a row per batch size, the bound line."""
    from benchmarks.batch_dots import measure, report
    rows = measure([(8, 4), (6, 4)], rows=(1, 8), rounds=1)
    assert [r["rows"] for r in rows] == [1, 8] and all(r["ms"] > 0 and r["rows_first_ms"] > 0 for r in rows)
    text = report(rows, step_b1_ms=2.0)
    assert text.count("\n| ") == 3 and "Bound on B=8 / B=1 tokens/s" in text and "With a B=1 step of 2.00 ms" in text


def test_quantized_gpu_benchmark_smoke():
    """benchmarks/quantized_gpu.py's products at the tiny shape (any device): a row per form, each
    with its weight bytes and a time."""
    from benchmarks.quantized_gpu import SHAPES, products
    lines = products(SHAPES["tiny"], ["Q8_0"], rounds=1, rate=1e10, device=False)
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| form")]
    names = ["f32 dot", "bf16 dot (f32 result)", "Q8_0 linear (fused XLA)", "Q8_0 dequantize + f32 dot"]
    if jax.default_backend() == "gpu":  # the Pallas candidate, its products checked first
        names.append("Q8_0 Pallas kernel")
    assert [r.split(" | ")[0][2:] for r in rows] == names
    assert all(float(r.split(" | ")[2]) > 0 for r in rows)


def test_quantized_gpu_decode_static_loop(tmp_path):
    """benchmarks/quantized_gpu.py's decode at the tiny shape (any device), `--static-loop`: the
    fori_loop of `Program.step` draws the fused run's tokens; `--work`: the model files kept
    under the shape's name, and a second decode reuses them."""
    from benchmarks.quantized_gpu import SHAPES, decode
    lines = decode(tmp_path, SHAPES["tiny"], "tiny", ["Q8_0"], rate=1e10, bf16=False, static_loop=True)
    rows = [line for line in lines if line.startswith("| Q8_0")]
    assert len(rows) == 2 and rows[1].startswith("| Q8_0, `fori_loop` of `Program.step` |")
    assert rows[1].endswith("| same tokens |") and float(rows[1].split(" | ")[5]) > 0
    assert sorted(p.name for p in tmp_path.glob("*.oinf")) == ["tiny-Q8_0.oinf"]
    assert lines[0].startswith("Random checkpoint written and converted in ")


def test_quantized_gpu_trace_tables():
    """benchmarks/quantized_gpu.py --profile's reading of a perfetto trace: per device line, events,
    busy µs and span per step; the busiest line's kernels by name, numbers stripped; host lines
    left out. A hand-made trace of 2 steps."""
    from benchmarks.quantized_gpu import trace_tables
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #14(Compute)"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 8, "args": {"name": "Stream #15(MemcpyH2D)"}}]
    kernels = [("input_reduce_fusion.3", 10.0, 0.0), ("input_reduce_fusion_12", 6.0, 10.0), ("gemm_fusion_dot.1", 4.0, 16.0),
               ("input_reduce_fusion", 8.0, 100.0), ("loop_add_fusion", 2.0, 108.0)]
    events = meta + [{"ph": "X", "pid": 1, "tid": 7, "name": n, "dur": d, "ts": t} for n, d, t in kernels]
    events += [{"ph": "X", "pid": 1, "tid": 8, "name": "MemcpyH2D", "dur": 1.0, "ts": 50.0},
               {"ph": "X", "pid": 2, "tid": 9, "name": "python", "dur": 500.0, "ts": 0.0}]
    rows = trace_tables({"traceEvents": events}, steps=2)
    assert "| /device:GPU:0 | Stream #14(Compute) | 2.5 | 15.0 | 55.0 |" in rows  # 30 µs, span 0..110
    assert "| /device:GPU:0 | Stream #15(MemcpyH2D) | 0.5 | 0.5 | 0.5 |" in rows
    assert not any("python" in r or "CPU" in r for r in rows)
    kinds = [r for r in rows if r.startswith("| ") and r.count("|") == 4 and not r.startswith("| kernel")]
    assert kinds == ["| input_reduce_fusion | 1.5 | 12.0 |", "| gemm_fusion_dot | 0.5 | 2.0 |",
                     "| loop_add_fusion | 0.5 | 1.0 |"]


def test_pallas_matvec_candidate_values(kind="Q4_K"):
    """benchmarks/pallas_matvec.py's kernel (timed on a GPU, not kept), through Pallas' interpreter:
    the f32 product of gguf's dequantized weight, up to the summation order; two programs of the
    grid, two chunks of each row's walk (Q4_K, the kind with more to decode; the benchmark checks
    both kinds' products on the GPU before timing them)."""
    import gguf
    import jax.numpy as jnp

    from benchmarks import pallas_matvec
    from oi2jax import quantized as Q
    from test_quantized import _assert_matmul_close, random_blocks
    per = Q.block_size(kind)[0]
    blocks = 1024 // per
    raw = random_blocks(np.random.default_rng(0), kind, 16, blocks)
    w = Q.prepare(kind, raw, (16, blocks * per))
    x = np.random.default_rng(1).normal(size=(blocks * per,)).astype(np.float32)
    y = np.asarray(pallas_matvec.matvec(jnp.asarray(x), w, interpret=True))
    _assert_matmul_close(y, x, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]))
