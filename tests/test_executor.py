"""Concurrent vs sequential builds and dataflow vs linear schedules of the yield/await driver
(oi2jax/runtime/executor.py, docs/executor.md). Results must agree bit for bit."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import oi2jax
from oi2jax import dtypes as dt
from oi2jax.diagnostics import OiError
from oi2jax.runtime import executor, faults

from conftest import EXAMPLES, MODELS, SPEC_EXAMPLE_NAMES as NAMES


def same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k


def random_inputs(prog, seed: int = 0) -> dict:
    r = np.random.default_rng(seed)
    out = {}
    for name in prog.dynamic_names:
        shape = prog.bound.shape(name)
        d = dt.get(prog.bound.dtype(name))
        if d.family == dt.FLOAT:
            out[name] = r.standard_normal(shape).astype(np.float32)
        elif d.family == dt.BOOL:
            out[name] = r.integers(0, 2, shape).astype(bool)
        elif d.name.startswith("u"):
            out[name] = r.integers(0, 2, shape).astype(np.int64)
        else:
            out[name] = r.integers(-2, 2, shape).astype(np.int64)
    return out


def no_compile_threads() -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not any(t.name.startswith("oi2jax-compile") for t in threading.enumerate()):
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("name", NAMES)
def test_examples_identical_in_every_build_and_schedule(name):
    model = MODELS / f"{name}.oinf"
    results = []
    for build, schedule in (("sequential", "linear"), ("concurrent", "dataflow"), ("concurrent", "linear")):
        prog = oi2jax.compile(EXAMPLES / f"{name}.oi", model=model, build=build, schedule=schedule)
        inputs = random_inputs(prog)
        results.append(prog.run(inputs, steps=2))
    for other in results[1:]:
        same(results[0], other)
    assert no_compile_threads()


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
block r_w { await b; op add(w, b) >> r2; yield b; }
"""
A = np.array([3.0, -1.5], np.float32)
B = np.array([0.25, 2.0], np.float32)


def test_yield_graph_identical_across_builds_schedules_and_fused():
    fused = oi2jax.compile(MULTI, yield_mode="fused").run({"a": A, "b": B}, steps=3)
    for build in ("sequential", "concurrent"):
        for schedule in ("dataflow", "linear"):
            prog = oi2jax.compile(MULTI, build=build, schedule=schedule)
            assert prog.driver is not None
            same(fused, prog.run({"a": A, "b": B}, steps=3))
            kinds = {k["kernel"] for k in prog.driver.kernels()}
            assert kinds >= {"entry:0", "entry:1", "ma", "mb", "r_both", "r_w"}


def test_unknown_build_or_schedule_is_an_error():
    with pytest.raises(OiError, match="unknown build"):
        oi2jax.compile(MULTI, build="eager")
    with pytest.raises(OiError, match="unknown schedule"):
        oi2jax.compile(MULTI, schedule="random")


def test_compile_error_in_a_consumer_surfaces_once_naming_the_block():
    calls = []
    real = executor.compile_kernel

    def failing(kernel, lowered):
        if kernel.name == "r_w":
            calls.append(kernel.name)
            raise RuntimeError("injected XLA failure")
        return real(kernel, lowered)

    for build in ("concurrent", "sequential"):
        prog = oi2jax.compile(MULTI, build=build)
        prog.driver.compile = failing  # the documented hook: a kernel's XLA compilation
        with pytest.raises(OiError) as info:
            prog.run({"a": A, "b": B})
        text = str(info.value)
        assert len(info.value.diagnostics) == 1
        assert "compile of block r_w failed" in text and "injected XLA failure" in text
        assert "block r_w { await b;" in text  # the DSL location: r_w's block
        assert text.count("injected") == 1
        assert no_compile_threads()
    assert calls == ["r_w", "r_w"]
    same(oi2jax.compile(MULTI).run({"a": A, "b": B}),
         oi2jax.compile(MULTI, yield_mode="fused").run({"a": A, "b": B}))


def test_runtime_error_in_a_consumer_kernel_surfaces_once():
    prog = oi2jax.compile(MULTI)
    prog.run({"a": A, "b": B})  # built
    kern = next(k for k in prog.driver.built.all() if k.block == "mb")
    with faults.injected(faults.KERNEL, RuntimeError("device fault"), where=kern.name) as fault, \
            pytest.raises(OiError) as info:
        prog.run({"a": A, "b": B})
    text = str(info.value)
    assert len(info.value.diagnostics) == 1 and fault.reached == 1
    assert "run of block mb failed: RuntimeError: device fault" in text
    assert "block mb {" in text


GUARDED = """
dynamic { x: f32[2]; }
volatile { first: f32[2]; n: i32; }
persistent {
    t: i32 @init(0);
    K(i): f32[2] @table @fixed(i=2);
}
block entry {
    yield x;
    await x;
    cache.read K[0] >> first;
    cache.read t >> n;
}
block logger { await x; cache.write x >> K[t]; cache.increment t; yield x; }
"""


def test_runtime_guard_in_a_consumer_reported_once_with_its_location():
    messages = []
    for build, schedule in (("concurrent", "dataflow"), ("sequential", "linear")):
        prog = oi2jax.compile(GUARDED, build=build, schedule=schedule)
        with pytest.raises(OiError) as info:
            prog.run({"x": np.ones(2, np.float32)}, steps=3)
        messages.append(str(info.value))
        assert len(info.value.diagnostics) == 1
        assert "cache.write x >> K[t]" in messages[-1]  # located in block logger
    assert messages[0] == messages[1]
    fused = oi2jax.compile(GUARDED, yield_mode="fused")
    with pytest.raises(OiError) as info:
        fused.run({"x": np.ones(2, np.float32)}, steps=3)
    assert str(info.value) == messages[0]


TINY = """
dynamic { x: f32[2]; }
volatile { h: f32[2]; s: f32[2]; }
block entry { yield x; op add(x, x) >> h; await x; return; }
block c1 { await x; op mul(x, x) >> x; yield x; }
block c2 { await x; op add(x, x) >> s; yield x; }
"""


def test_concurrent_runs_never_hang():
    """20 fresh concurrent builds and runs (100 in the nightly profile)."""
    x = np.array([1.5, -2.0], np.float32)
    expect = oi2jax.compile(TINY, yield_mode="fused").run({"x": x})
    prog = oi2jax.compile(TINY, build="concurrent")
    failures = []

    def one(i):
        try:
            prog.driver.forget()  # force a fresh concurrent build of every kernel
            same(expect, prog.run({"x": x}))
        except BaseException as exc:  # reported by the main thread
            failures.append((i, exc))

    from conftest import NIGHTLY
    for i in range(100 if NIGHTLY else 20):
        t = threading.Thread(target=one, args=(i,), daemon=True)
        t.start()
        t.join(timeout=30)
        assert not t.is_alive(), f"run {i} hung"
        assert not failures, failures
        assert prog.driver.kernel_builder is None  # the builder was closed: no compile pending
    assert no_compile_threads()


TWO_WINDOWS = """
dynamic { x: f32[2]; y: f32[2]; }
volatile { p: f32[2]; q: f32[2]; e: f32[2]; }
block entry {
    yield x;
    await x;
    op mul(y, y) >> e;
    yield y;
    await y;
    return;
}
block a_late { await y; op add(y, y) >> q; yield y; }
block b_early { await x; op mul(x, x) >> p; yield x; }
"""


@pytest.mark.parametrize("schedule", ["dataflow", "linear"])
def test_ready_consumer_starts_before_earlier_declared_waiting_one(schedule):
    prog = oi2jax.compile(TWO_WINDOWS, schedule=schedule)
    x, y = np.array([2.0, 3.0], np.float32), np.array([-1.0, 4.0], np.float32)
    out = prog.run({"x": x, "y": y}, trace=True)
    np.testing.assert_array_equal(out["p"], x * x)
    np.testing.assert_array_equal(out["q"], y + y)
    order = [e["kernel"] for e in prog.last_trace]
    # a_late is declared first but waits for the second yield; b_early is ready at the first
    assert order.index("b_early") < order.index("entry:2") < order.index("a_late")
    assert order == prog.driver.last_order


def test_dataflow_dispatches_the_consumer_whose_kernel_is_built_first():
    src = """
    dynamic { x: f32[2]; }
    volatile { p: f32[2]; q: f32[2]; }
    block entry { yield x; await x; return; }
    block a_slow { await x; op mul(x, x) >> p; yield x; }
    block b_fast { await x; op add(x, x) >> q; yield x; }
    """
    real = executor.compile_kernel

    def slow(kernel, lowered):
        if kernel.name == "a_slow":
            time.sleep(1.0)
        return real(kernel, lowered)

    x = np.array([2.0, 3.0], np.float32)
    outs, orders = [], {}
    for schedule in ("dataflow", "linear"):
        prog = oi2jax.compile(src, build="concurrent", schedule=schedule)
        prog.driver.compile = slow  # the documented hook: a kernel's XLA compilation
        outs.append(prog.run({"x": x}, trace=True))
        orders[schedule] = [e["kernel"] for e in prog.last_trace]
    same(outs[0], outs[1])
    assert orders["dataflow"].index("b_fast") < orders["dataflow"].index("a_slow")
    assert orders["linear"] == ["entry:0", "a_slow", "b_fast"]  # entry:1 writes nothing: skipped
