"""yield/await run by the host driver (oi2jax/runtime/driver.py, docs/yield_await.md).

Every graph here runs in both yield modes and the results must agree bit for bit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError
from oi2jax.grammar.parse import parse
from oi2jax.phases import analyze

ROOT = Path(__file__).resolve().parents[1]
from conftest import MODELS, assert_matches, assert_same, graph_ops

MODEL = MODELS / "streaming_pipeline.oinf"


def both(src, inputs=None, steps=1, **kw) -> tuple[dict, oi2jax.Program]:
    """Run fused and driver; assert they agree (conftest.assert_matches: bit for bit on a CPU, within
    the device's EXACTNESS tolerance for the graph's ops elsewhere: two compiled kernels need not
    accumulate in one order there); return the driver's outputs and program (the tests look at
    its kernels)."""
    fused = oi2jax.compile(src, yield_mode="fused", **kw)
    drv = oi2jax.compile(src, **kw)
    assert drv.driver is not None and fused.driver is None
    out_f = fused.run(inputs or {}, steps=steps)
    out_d = drv.run(inputs or {}, steps=steps)
    assert_matches(out_f, out_d, ops=graph_ops(src))
    return out_d, drv


X = np.array([3.0, -1.5], np.float32)
Y = np.array([0.25, 2.0], np.float32)

WRITER_READER = """
dynamic { x: f32[2]; }
volatile { seen: f32[2]; h: f32[2]; }
block entry {
    yield x;
    op add(x, x) >> h;
    await x;
    return;
}
block writer { await x; op mul(x, x) >> x; yield x; }
block reader { await x; op add(x, x) >> seen; yield x; }
"""


def test_driver_is_default_and_plain_graphs_stay_single_jit():
    assert oi2jax.compile(WRITER_READER).driver is not None
    plain = oi2jax.compile("dynamic { x: f32[2]; } block entry { op add(x, x) >> x; }")
    assert type(plain).__name__ == "Program"


def test_reader_sees_snapshot_entry_sees_writer():
    out, _ = both(WRITER_READER, {"x": X})
    np.testing.assert_array_equal(out["x"], X * X)  # entry sees the writer's result after await
    np.testing.assert_array_equal(out["seen"], 2 * X)  # the reader saw the yielded value
    np.testing.assert_array_equal(out["h"], 2 * X)  # entry's window saw the snapshot too


def test_reader_sorted_before_writer_still_sees_snapshot():
    src = WRITER_READER.replace("block writer", "block zz_writer").replace("block reader", "block aa_reader")
    out, _ = both(src, {"x": X})
    np.testing.assert_array_equal(out["seen"], 2 * X)
    np.testing.assert_array_equal(out["x"], X * X)


MULTI = """
dynamic { a: f32[2]; b: f32[2]; }
volatile { r1: f32[2]; r2: f32[2]; r3: f32[2]; w: f32[2]; }
block entry {
    op mul(a, b) >> w;
    yield a, b;
    op sub(w, a) >> r3;
    await a, b;
    return;
}
block ma { await a; op mul(a, a) >> a; yield a; }
block mb { await b; op neg(b) >> b; yield b; }
block r_both { await a, b; op add(a, b) >> r1; yield a, b; }
block r_w { await a; op add(w, a) >> r2; yield a; }
"""


def test_multi_variable_yield_mutator_per_variable_and_several_readers():
    out, drv = both(MULTI, {"a": X, "b": Y})
    np.testing.assert_array_equal(out["a"], X * X)  # ma's result
    np.testing.assert_array_equal(out["b"], -Y)  # mb's result
    np.testing.assert_array_equal(out["r1"], X + Y)  # reader: snapshot of both, not the mutated ones
    np.testing.assert_array_equal(out["r2"], X * Y + X)  # reader sees entry's non-yielded w (whole state)
    np.testing.assert_array_equal(out["r3"], X * Y - X)
    kernels = {k["kernel"]: k for k in drv.driver.kernels()}
    assert set(kernels) == {"entry:0", "entry:1", "entry:2", "ma", "mb", "r_both", "r_w"}
    assert kernels["ma"]["writes"] == ["a"] and kernels["mb"]["writes"] == ["b"]
    assert kernels["r_w"]["reads"] == ["a", "w"]  # only what it reads moves


def test_non_yielded_consumer_writes_kept_and_window_write_not_seen():
    src = """
    dynamic { x: f32[2]; }
    volatile { h: f32[2]; h2: f32[2]; g: f32[2]; }
    block entry {
        op add(x, x) >> h;
        yield x;
        op mul(x, x) >> h;
        await x;
    }
    block reader { await x; op add(h, x) >> h2; op neg(h) >> g; yield x; }
    """
    out, _ = both(src, {"x": X})
    np.testing.assert_array_equal(out["h2"], 3 * X)  # the consumer read h as it was at the yield
    np.testing.assert_array_equal(out["g"], -2 * X)
    np.testing.assert_array_equal(out["h"], X * X)  # entry's own window write stands


def test_two_windows_branch_loop_and_return_outputs():
    src = """
    dynamic { x: f32[2]; y: f32[2]; flag: bool; }
    volatile { r: f32[2]; s: f32[2]; }
    block entry {
        yield x;
        loop rep (i in 0..3) { op add(r, y) >> r; }
        await x;
        op add(x, r) >> s;
        yield y;
        await y;
        return x, y, s;
    }
    block cx { await x; branch flag up down; yield x; }
    block up { op mul(x, x) >> x; }
    block down { op neg(x) >> x; }
    block cy { await y; op add(y, x) >> y; yield y; }
    """
    for flag in (True, False):
        out, drv = both(src, {"x": X, "y": Y, "flag": np.bool_(flag)}, steps=2)
        fx = X * X if flag else -X
        assert set(out) == {"x", "y", "s"} or set(out) >= {"x", "y", "s"}
        np.testing.assert_array_equal(out["x"], fx)
        np.testing.assert_array_equal(out["s"], fx + 3 * Y)
        np.testing.assert_array_equal(out["y"], Y + fx)
    assert len(drv.driver.analysis.phases) == 5


CACHE = """
dynamic { x: f32[2]; }
volatile { first: f32[2]; n: i32; }
persistent {
    t: i32 @init(0);
    K(i): f32[2] @table;
}
block entry {
    yield x;
    await x;
    cache.read K[0] >> first;
    cache.read t >> n;
}
block logger { await x; cache.write x >> K[t]; cache.increment t; yield x; }
"""


def test_persistent_state_and_cache_growth_in_a_consumer():
    out, drv = both(CACHE, {"x": X}, steps=9)  # capacity 4 -> 8 -> 16: re-planned kernels
    np.testing.assert_array_equal(out["first"], X)
    assert int(out["n"]) == 9
    assert out["K"].shape == (9, 2)
    assert drv.compiles > 0


def test_runtime_guard_in_a_consumer_undoes_the_step():
    src = CACHE.replace("@table;", "@table @fixed(i=2);")
    messages = []
    for mode in ("fused", "driver"):
        prog = oi2jax.compile(src, yield_mode=mode)
        state = prog.init_state()
        for _ in range(2):
            state, _ = prog.step(state, x=X)
        with pytest.raises(OiError) as info:
            prog.run({"x": X}, steps=3)
        messages.append(str(info.value))
        assert int(np.asarray(state.vars["t"])) == 2
    assert messages[0] == messages[1]


def test_step_contract_and_repeated_runs_identical():
    drv = oi2jax.compile(MULTI)
    first = drv.run({"a": X, "b": Y})
    for _ in range(20):
        assert_same(first, drv.run({"a": X, "b": Y}))
    state = drv.init_state()
    state, outputs = drv.step(state, a=X, b=Y)
    assert set(outputs) == {"a", "b", "r1", "r2", "r3", "w"}
    np.testing.assert_array_equal(np.asarray(outputs["a"]), X * X)
    assert "stablehlo" in drv.emit("stablehlo") or "func" in drv.emit("stablehlo")


def test_streaming_pipeline_example_bit_exact():
    from oi2jax.model import open_model
    model = open_model(MODEL)
    b, d = model.sizevars["B"], model.sizevars["D"]
    x = np.random.default_rng(7).standard_normal((b, d)).astype(np.float32) * 4
    out, drv = both(ROOT / "examples" / "streaming_pipeline.oi", {"x": x}, steps=3, model=model)
    w = model.load("w")
    np.testing.assert_array_equal(out["h2"], np.clip(x, 0, 6))
    np.testing.assert_allclose(out["h"], np.clip(x @ w, 0, 6), rtol=1e-5, atol=1e-5)
    drv.run({"x": x}, trace=True)
    kernels = [e["kernel"] for e in drv.last_trace]
    assert kernels[:3] == ["entry:0", "reader", "writer"] and "entry:1" in kernels
    assert all(set(e) == {"step", "phase", "kernel", "device", "ms"} for e in drv.last_trace)
    import jax
    from oi2jax.runtime.placement import device_name
    assert f"reader on {device_name(jax.devices()[0])}" in drv.trace_text()  # the device's name


# ------------------------------------------------------------------------ diagnostics


def loc(src: str, needle: str, nth: int = 0) -> tuple[int, int]:
    pos = -1
    for _ in range(nth + 1):
        pos = src.index(needle, pos + 1)
    line = src.count("\n", 0, pos) + 1
    col = pos - (src.rfind("\n", 0, pos) + 1) + 1
    return line, col


def where(span) -> tuple[int, int]:
    return span.line, span.col


def compile_error(src: str) -> OiError:
    with pytest.raises(OiError) as info:
        oi2jax.compile(src)
    return info.value


def error_with(err: OiError, text: str):
    found = [d for d in err.errors if text in d.message]
    assert found, err.render()
    return found[0]


HEAD = "dynamic { x: f32[2]; y: f32[2]; }\nvolatile { r: f32[2]; }\n"


def test_rule_await_without_yield():
    src = HEAD + "block entry {\n    await x;\n}\nblock c { await x; yield x; }\n"
    d = error_with(compile_error(src), "await x has no matching yield")
    assert where(d.span) == loc(src, "await x;")
    with pytest.raises(OiError) as info:  # the driver's own analysis words it the same way
        analyze(parse(src))
    assert where(info.value.diagnostics[0].span) == loc(src, "await x;")


def test_rule_second_yield_before_await():
    src = HEAD + "block entry {\n    yield x;\n    yield y;\n    await x, y;\n}\n" \
                 "block c { await x, y; yield x, y; }\n"
    d = error_with(compile_error(src), "await required before next yield")
    assert where(d.span) == loc(src, "yield y;")
    assert [where(s) for _, s in d.related] == [loc(src, "yield x;")]
    with pytest.raises(OiError) as info:
        analyze(parse(src))
    d2 = info.value.diagnostics[0]
    assert where(d2.span) == loc(src, "yield y;") and where(d2.related[0][1]) == loc(src, "yield x;")


def test_rule_yield_without_await():
    src = HEAD + "block entry {\n    yield x;\n}\nblock c { await x; yield x; }\n"
    d = error_with(compile_error(src), "has no matching await")
    assert where(d.span) == loc(src, "yield x;")


def test_rule_yield_whose_await_follows_the_return_every_way():
    """Issue 33: one yield plan for every way. An await after entry's top-level return never runs:
    the driver refused this graph while fused runs dropped the consumer's writes and the
    interpreter merged them at the step's end; now the checker refuses it for all of them."""
    src = HEAD + "block entry {\n    yield x;\n    return;\n    await x;\n}\n" \
                 "block c { await x; op neg(x) >> r; yield x; }\n"
    for kw in ({}, {"yield_mode": "fused"}, {"mode": "interpret"}):
        with pytest.raises(OiError) as info:
            oi2jax.compile(src, **kw)
        d = error_with(info.value, "yield x has no matching await")
        assert where(d.span) == loc(src, "yield x;")


def test_a_consumers_write_merges_the_same_fused_and_driven():
    """Issue 33: one rule for the keys an await takes from a consumer. The fused lowering skipped
    variables whose names start with `__` (the driver and the interpreter merged them)."""
    src = "dynamic { x: f32[2]; }\nvolatile { __v: f32[2]; }\nblock entry {\n    yield x;\n    await x;\n" \
          "    return;\n}\nblock c { await x; op neg(x) >> __v; yield x; }\n"
    out, _ = both(src, {"x": X})
    np.testing.assert_array_equal(out["__v"], -X)
    np.testing.assert_array_equal(oi2jax.compile(src, mode="interpret").run({"x": X})["__v"], -X)


def test_rule_one_mutating_consumer_per_variable():
    src = HEAD + "block entry {\n    yield x;\n    await x;\n}\n" \
                 "block c1 { await x; op neg(x) >> x; yield x; }\n" \
                 "block c2 { await x; op add(x, x) >> x; yield x; }\n"
    d = error_with(compile_error(src), "multiple blocks mutated x")
    assert where(d.span) == loc(src, "op add(x, x) >> x")
    assert [where(s) for _, s in d.related] == [loc(src, "op neg(x) >> x")]


def test_rule_entry_writes_yielded_variable_in_window():
    src = HEAD + "block entry {\n    yield x;\n    op neg(y) >> x;\n    await x;\n}\n" \
                 "block c { await x; op neg(x) >> r; yield x; }\n"
    d = error_with(compile_error(src), "entry writes yielded variable x")
    assert where(d.span) == loc(src, "op neg(y) >> x")
    assert [where(s) for _, s in d.related] == [loc(src, "yield x;")]


def test_rule_deadlock_reported_at_compile_time_with_both_locations():
    src = HEAD + "block entry {\n    yield x;\n    await x;\n    yield y;\n    await y;\n}\n" \
                 "block c { await x; await y; op add(x, y) >> r; yield x, y; }\n"
    for mode in ("driver", "fused"):
        with pytest.raises(OiError) as info:
            oi2jax.compile(src, yield_mode=mode)
        d = error_with(info.value, "deadlock: block c awaits y")
        assert where(d.span) == loc(src, "await y;", 1)  # the consumer's await
        assert [where(s) for _, s in d.related] == [loc(src, "yield y;"), loc(src, "await x;")]
    for mode in ("compiled", "interpret"):  # a graph error, whatever runs it; `oi2jax check` too
        with pytest.raises(OiError, match="deadlock: block c awaits y"):
            oi2jax.compile(src, mode=mode)
    from oi2jax.check import check
    from oi2jax.grammar.parse import parse
    assert any("deadlock" in d.message for d in check(parse(src)))
    # awaiting y is fine when y is yielded at or before the window that starts the consumer
    ok = HEAD + "block entry {\n    yield x, y;\n    await x, y;\n    yield x;\n    await x;\n}\n" \
                "block c { await x; await y; op add(x, y) >> r; yield x, y; }\n"
    out, _ = both(ok, {"x": X, "y": Y})
    np.testing.assert_array_equal(out["r"], X + Y)


# ------------------------------------------------------------------------ placement


PLACED = r"""
import json, sys
import numpy as np
import jax
import oi2jax
src = sys.argv[1]
x = np.array([3.0, -1.5], np.float32); y = np.array([0.25, 2.0], np.float32)
fused = oi2jax.compile(src, yield_mode="fused").run({"a": x, "b": y}, steps=2)
devs = jax.devices("cpu")
prog = oi2jax.compile(src, placement={"ma": "cpu:1", "mb": devs[2], "r_both": "cpu:3"})
out = prog.run({"a": x, "b": y}, steps=2, trace=True)
print(json.dumps({"n": len(devs),
                  "same": all(out[k].tobytes() == fused[k].tobytes() for k in fused) and out.keys() == fused.keys(),
                  "trace": prog.last_trace}))
"""


def test_consumers_on_other_cpu_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", PLACED, MULTI], env=env, capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["n"] == 4 and result["same"]
    devices = {(e["step"], e["kernel"]): e["device"] for e in result["trace"]}
    for step in (1, 2):
        assert devices[(step, "ma")] == "cpu:1"
        assert devices[(step, "mb")] == "cpu:2"
        assert devices[(step, "r_both")] == "cpu:3"
        assert devices[(step, "r_w")] == "cpu:0"
        assert devices[(step, "entry:0")] == "cpu:0"
