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
# the example programs of the OpenInfer SPEC (each with its model beside it); examples/llama_decode*.oi
# need `ops=["nn"]` and a converted checkpoint (tests/test_llama.py)
SPEC_EXAMPLE_NAMES = sorted(p.stem for p in EXAMPLES.glob("*.oi") if p.with_suffix(".oinf").exists())
# `make test` runs the default profile (under 5 minutes on an idle 2-core machine); `make
# test-nightly` (OI2JAX_PROFILE=nightly) adds the long variants: the random differential test in
# driver mode too, the 100-run concurrency stress test
NIGHTLY = os.environ.get("OI2JAX_PROFILE") == "nightly"


# the ways out that a model dtype mismatch of an f16 tensor under an f32 declaration names
WIDEN_HINT = (" (convert the model with --dtype f32, or read its f16 tensors as their exact f32 values "
              "with --widen-floats / widen_floats=True)")  # the mismatch's ways out (messages.model_dtype_mismatch)

# a graph whose step fails at run time when n is not finite (its loop bound), otherwise adds x to
# acc n times: the session and unchecked-step tests run steps after a failing one with it
# a table that grows (no @fixed): 10 steps double its capacity several times (executable and session tests)
GROW_SOURCE = """\
dynamic { x: f32[2]; }
volatile { last: f32[2]; }
persistent { t: i32 @init(0); A(i): f32[2] @table; }
block entry {
    cache.write x >> A[t];
    cache.read A[t] >> last;
    cache.increment t;
    return;
}
"""

PLAIN_FAIL_SOURCE = """
dynamic { n: f32; x: f32[2]; }
volatile { y: f32[2]; }
persistent { acc: f32[2] @init(0.0); count: i32 @init(0); }
block entry {
    cache.read acc >> y;
    loop l (i in 0..n) { op add(y, x) >> y; }
    cache.write y >> acc;
    cache.increment count;
    return;
}
"""
# the same step with a state larger than runtime.kernels.SELECT_SKIP_BYTES (80000 bytes of `pad`):
# a step skipped after an unreported error keeps its state entry by entry, not by one select
PLAIN_FAIL_LARGE_SOURCE = PLAIN_FAIL_SOURCE.replace("count: i32 @init(0); }",
                                                    "count: i32 @init(0); pad: f32[20000] @init(0.0); }")


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



def rewrite_model(model) -> dict:
    """Everything in an open model as `oi2jax.model.save` arguments (version and quantization included)."""
    from oi2jax.model import Tensor
    tensors = {}
    for name, info in model.tensors.items():
        tensors[name] = (Tensor(info.dtype, model.load(name), quant=info.quant) if info.has_data
                         else Tensor(info.dtype, None, info.shape, quant=info.quant))
    return dict(sizevars=model.sizevars, metadata=model.metadata, tensors=tensors, version=model.version)


def open_everything(path) -> bool:
    """Open a (maybe corrupted) model and touch all of it: every tensor loaded (plain and
    packed), every quantization described and re-encoded, the whole rendered. False when it is
    refused with a ModelError; any other exception fails the test."""
    from oi2jax.model import ModelError, open_model
    from oi2jax.model.inspect import render_model
    try:
        m = open_model(path)
    except ModelError:
        return False
    for name, info in m.tensors.items():
        if info.has_data:
            assert m.load(name).shape == info.shape
            m.load_packed(name)
        if info.quant is not None:
            info.quant.describe()
            info.quant.encode()
    render_model(m)
    return True


# ------------------------------------------------------------------ running a graph every way
# The one helper that runs a graph interpreted (the oracle), compiled with the yield/await driver
# and compiled fused, and holds them to the same result: bit for bit, or the same error.
WAYS = {"interpreted": {"mode": "interpret", "yield_mode": "driver"},
        "driver": {"mode": "compiled", "yield_mode": "driver"},
        "fused": {"mode": "compiled", "yield_mode": "fused"}}


def assert_same(a: dict, b: dict, what: str = "") -> None:
    """Bit for bit: same names, shapes and dtypes; equal values, NaNs equal to NaNs and the sign
    of a zero counting."""
    import numpy as np
    assert set(a) == set(b), f"output names differ: {sorted(set(a) ^ set(b))}\n{what}"
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        assert x.shape == y.shape, f"{name}: shape {x.shape} vs {y.shape}\n{what}"
        assert x.dtype == y.dtype, f"{name}: dtype {x.dtype} vs {y.dtype}\n{what}"
        if x.dtype.kind == "f" or x.dtype.name in ("bfloat16", "float8_e5m2"):
            xf, yf = x.astype(np.float64), y.astype(np.float64)
            same = (xf == yf) & (np.signbit(xf) == np.signbit(yf)) | (np.isnan(xf) & np.isnan(yf))
            assert np.all(same), f"{name} differs: {xf[~same][:4]} vs {yf[~same][:4]}\n{what}"
        else:
            np.testing.assert_array_equal(x, y, err_msg=f"{name} differs\n{what}")


# ------------------------------------------------------------------ exactness by device
# What a compiled result may differ by from the interpreter's (the oracle), per op and per kind
# of device: the table of docs/semantics.md ("Exactness by device"). On a CPU nothing: oi2jax
# pins XLA:CPU's arithmetic (correctly rounded division, no FMA contraction, one fixed order of
# accumulation), so every comparison is bit for bit and nothing is loosened there. On a GPU
# (and a TPU, untested) XLA's division may be its approximate form and matmuls / reductions
# accumulate in another order; no XLA option makes them equal to the CPU's
# (`--xla_gpu_deterministic_ops` only makes a GPU agree with itself from run to run).
#   ("ulp", n): |a - b| <= n * eps(dtype) * |b| (n units in the last place, an elementwise op);
#   ("rel", k): |a - b| <= k * eps(dtype) * max|b| over the array (an accumulation).
# An op not listed is exact on that device. Integer, bool and NaN results are always exact.
# The bundled nn set (ops=["nn"]): its transcendental functions are XLA:GPU's (libdevice) where the
# CPU has XLA's own polynomials, and its composite ops accumulate (normalizations, softmax, linear).
EXACTNESS = {
    "cpu": {},
    "gpu": {"div": ("ulp", 2), "recip": ("ulp", 2), "mean_axis": ("rel", 64), "sum_axis": ("rel", 64),
            "prod_axis": ("rel", 64), "matmul": ("rel", 64),
            **{op: ("ulp", 4) for op in ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "silu", "gelu", "sin",
                                         "cos")},
            **{op: ("rel", 64) for op in ("softmax", "attention", "rms_norm", "layer_norm", "rope", "linear",
                                          "matmul_t", "einsum")}},
}
EXACTNESS["tpu"] = EXACTNESS["gpu"]
# weights kept in GGML blocks (docs/models.md) against their dequantized f32 twin, on every device:
# the products are summed in another order (dequantization fused into the reduction, block sums
# with the scale factored out), so the claim is relative to the largest |value| (issue #42)
KEPT_QUANTIZED_REL = 1e-4


def assert_kept_close(got, want, what: str = "") -> None:
    """A result computed from weights kept quantized within KEPT_QUANTIZED_REL of max |want|, the
    result of their dequantized f32 twin (never all zeros)."""
    import numpy as np
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = np.abs(want).max()
    assert got.shape == want.shape and scale > 0, (got.shape, want.shape, what)
    err = np.abs(got - want).max()
    assert err <= KEPT_QUANTIZED_REL * scale, f"{what}: max error {err:.3g} is {err / scale:.3g} of max |value|"


def device_platform() -> str:
    """The kind of device tests run on: `cpu`, `gpu` or `tpu` (JAX's default device)."""
    import jax
    return jax.devices()[0].platform


def tolerance(ops, platform: str | None = None) -> dict:
    """The tolerance of a result computed with `ops` on `platform` (default: this machine's):
    {"ulp": n, "rel": k} (the loosest of the ops' entries), {} when it must be bit for bit."""
    table = EXACTNESS.get(platform or device_platform(), EXACTNESS["gpu"])
    tol: dict = {}
    for op in ops:
        kind, amount = table.get(op, (None, 0))
        if kind is not None:
            tol[kind] = max(tol.get(kind, 0), amount)
    return tol


def graph_ops(source) -> set:
    """The op names a graph uses (`source`: text, a path or a graph-JSON dict)."""
    from oi2jax import ir
    from oi2jax.api import load_graph
    graph = load_graph(source)
    return {node.op for block in graph.blocks for node in block.walk() if isinstance(node, ir.Op)}


def assert_matches(a: dict, b: dict, ops=(), what: str = "", platform: str | None = None) -> None:
    """`assert_same` where the ops used are exact on this device (always on a CPU), else the
    floats within `tolerance(ops)`: the comparison every compiled-vs-interpreted test makes."""
    import numpy as np
    tol = tolerance(ops, platform)
    if not tol:
        return assert_same(a, b, what)
    assert set(a) == set(b), f"output names differ: {sorted(set(a) ^ set(b))}\n{what}"
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        assert x.shape == y.shape and x.dtype == y.dtype, f"{name}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}\n{what}"
        if not (x.dtype.kind == "f" or x.dtype.name in ("bfloat16", "float8_e5m2")):
            np.testing.assert_array_equal(x, y, err_msg=f"{name} differs\n{what}")
            continue
        import ml_dtypes
        xf, yf = x.astype(np.float64), y.astype(np.float64)
        nan = np.isnan(yf)
        assert np.array_equal(np.isnan(xf), nan), f"{name}: NaNs differ\n{what}"
        info = ml_dtypes.finfo(x.dtype)
        eps, tiny = float(info.eps), float(info.tiny)
        scale = float(np.max(np.abs(yf[~nan]), initial=0.0))
        bound = tol.get("ulp", 0) * eps * np.maximum(np.abs(yf), tiny) + tol.get("rel", 0) * eps * scale
        diff = np.where(nan | (xf == yf), 0.0, np.abs(xf - yf))
        bad = diff > bound
        assert not np.any(bad), (f"{name} differs beyond the {platform or device_platform()} tolerance {tol} "
                                 f"of {sorted(ops)}: {xf[bad][:4]} vs {yf[bad][:4]}\n{what}")


def outcome(source, inputs=None, steps: int = 1, way: str = "fused", **compile_kw):
    """(outputs, None) or (None, the OiError) of one way of running `source`."""
    import oi2jax
    from oi2jax.diagnostics import OiError
    try:
        return oi2jax.compile(source, **WAYS[way], **compile_kw).run(inputs or {}, steps=steps), None
    except OiError as exc:
        return None, exc


def run_both(source, inputs=None, steps: int = 1, ways=("interpreted", "driver", "fused"), **compile_kw) -> dict:
    """Run `source` each of `ways` (WAYS) and return the outputs, after asserting that every way
    gave the same outputs bit for bit (on a CPU; elsewhere within the device's tolerance for the
    graph's ops, `assert_matches`), or that every way failed with the same message (that
    error is raised, as an OiError, for the caller to inspect)."""
    results = {way: outcome(source, inputs, steps, way, **compile_kw) for way in ways}
    first, (out, err) = next(iter(results.items()))
    what = source if isinstance(source, str) and "\n" in source else str(source)
    ops = graph_ops(source) if device_platform() != "cpu" else ()  # on a CPU: bit for bit, whatever the ops
    for way, (other, other_err) in results.items():
        err_text, other_text = (e.render() if e else None for e in (err, other_err))
        if err or other_err:
            assert err and other_err, f"only one way failed:\n{first}: {err_text}\n{way}: {other_text}\n{what}"
            assert err_text == other_text, \
                f"the ways fail differently:\n{first}: {err_text}\n{way}: {other_text}\n{what}"
        else:
            assert_matches(out, other, ops, f"{first} vs {way}\n{what}")
    if err:
        raise err
    return out


# ------------------------------------------------------------------ counting XLA compiles
# OI2JAX_COUNT_COMPILES=1 pytest ... prints, at the end, the XLA backend compiles of each test
# file (count and seconds, from JAX's `/jax/core/compile/backend_compile_duration` monitoring
# event, one per executable built) and of the tests that compile most, plus the seconds spent
# tracing and lowering to MLIR (the `jaxpr_trace` / `jaxpr_to_mlir_module` events). A compile
# is charged to the test running it, module-scoped fixtures to the first test that uses them.
# Compiles made in a subprocess (CLI tests run as a process) are not seen. Works under xdist
# (the workers send their counts to the controller). Compile counts do not depend on the
# machine's load; the seconds are wall time (a loaded machine inflates them). A count includes
# the tiny one-primitive compiles of eager JAX calls (the interpreter's ops, `jnp.stack`: about
# 0.01-0.1 s each), which a process makes once per shape: compare a file's counts from the same
# set of files run the same way.
COMPILE_EVENTS = {"/jax/core/compile/backend_compile_duration": "compile",
                  "/jax/core/compile/jaxpr_trace_duration": "trace",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower"}


class CompileCounter:
    def __init__(self):
        self.current = "(outside tests)"
        self.tests: dict = {}  # test id -> {"compiles": n, "compile": s, "trace": s, "lower": s}

    def listen(self, event, duration, **_):
        kind = COMPILE_EVENTS.get(event)
        if kind is not None:
            row = self.tests.setdefault(self.current, {"compiles": 0, "compile": 0.0, "trace": 0.0, "lower": 0.0})
            row[kind] += duration
            row["compiles"] += kind == "compile"

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        self.current = item.nodeid
        yield
        self.current = "(outside tests)"

    def pytest_sessionfinish(self, session):
        if hasattr(session.config, "workeroutput"):  # an xdist worker: hand the counts over
            session.config.workeroutput["oi2jax_compiles"] = self.tests

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):  # the xdist controller: a worker's counts
        self.tests.update(getattr(node, "workeroutput", {}).get("oi2jax_compiles", {}))

    def pytest_terminal_summary(self, terminalreporter):
        if hasattr(terminalreporter.config, "workeroutput"):
            return
        files: dict = {}
        for test, row in self.tests.items():
            total = files.setdefault(test.split("::")[0], {"compiles": 0, "compile": 0.0, "trace": 0.0, "lower": 0.0})
            for key, value in row.items():
                total[key] += value
        write = terminalreporter.write_line
        terminalreporter.section("XLA compiles (OI2JAX_COUNT_COMPILES)")
        write(f"{'compiles':>8} {'compile s':>9} {'trace s':>8} {'lower s':>8}  file")
        for name, row in sorted(files.items(), key=lambda kv: -kv[1]["compiles"]):
            write(f"{row['compiles']:>8} {row['compile']:>9.2f} {row['trace']:>8.2f} {row['lower']:>8.2f}  {name}")
        everything = {k: sum(row[k] for row in files.values()) for k in ("compiles", "compile", "trace", "lower")}
        write(f"{everything['compiles']:>8} {everything['compile']:>9.2f} {everything['trace']:>8.2f} "
              f"{everything['lower']:>8.2f}  (all)")
        write("the tests that compile most:")
        for test, row in sorted(self.tests.items(), key=lambda kv: -kv[1]["compiles"])[:15]:
            write(f"{row['compiles']:>8} {row['compile']:>9.2f} {row['trace']:>8.2f} {row['lower']:>8.2f}  {test}")


# ------------------------------------------------------------------ one XLA cache per test process
# The tests compile many identical programs (the same example graph, the same small Llama) in
# different tests: JAX's persistent compilation cache, the one the CLI turns on by default, serves
# a compile made once to every later test of the same process (about 8% of make test's CPU time).
# One fresh directory per process (each xdist worker), removed when it ends: nothing is read from
# an earlier run, another process or the user's cache, and JAX writes an entry (not atomically)
# only where the process that reads it wrote it. Processes the tests start (the CLI, docs snippets)
# do not use it. OI2JAX_TEST_XLA_CACHE=none turns it off.
def _use_process_cache(config) -> None:
    import shutil
    import tempfile
    if os.environ.get("OI2JAX_TEST_XLA_CACHE", "").lower() == "none":
        return
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # the xdist controller runs no test
    import jax
    directory = tempfile.mkdtemp(prefix="oi2jax-test-xla-")
    config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_configure(config):
    _use_process_cache(config)
    if os.environ.get("OI2JAX_COUNT_COMPILES") == "1":
        import jax.monitoring
        counter = CompileCounter()
        jax.monitoring.register_event_duration_secs_listener(counter.listen)
        config.pluginmanager.register(counter, "oi2jax_compile_counter")

