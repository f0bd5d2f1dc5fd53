"""An op's kernel is traced once per call signature in a step's trace (ops/calls.py): an
unrolled loop's layers reuse the first layer's trace, the step is the inline form (same jaxpr,
same values, each call site's own named scope), and each call's runtime checks report that
call's own values."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError

OPS = '''
import jax.numpy as jnp
import numpy as np
from oi2jax.ops import op

TRACES = []  # one entry per time the kernel's Python runs


def _ref(x, w, ctx=None):
    x = np.asarray(x, np.float64)
    if ctx is not None and np.any(x > 100):
        ctx.fail_if(np.bool_(True), "counted_step: {value} is over 100", int(x.reshape(-1)[np.argmax(x.reshape(-1) > 100)]))
    return x * 0.5 + np.asarray(w, np.float64)


@op(inputs={"x": "float", "w": "float"}, reference=_ref)
def counted_step(x, w, *, ctx):
    """x / 2 + w; a runtime error where an element of x is over 100 (the message names it)."""
    TRACES.append(tuple(x.shape))
    bad = (x > 100).reshape(-1)
    ctx.fail_if(bad, "counted_step: {value} is over 100", x.reshape(-1)[jnp.argmax(bad)].astype(jnp.int32))
    return x * 0.5 + w
'''

GRAPH = """\
dynamic { x: f32[3]; v: f32[2]; }
volatile { y: f32[3]; z: f32[2]; }
constant { w(l): f32[3] @pattern("w.{l}"); }
block entry {
    op add(x, 0.0) >> y;
    loop layers (l in 0..L) {
        op counted_step(y, w[l]) >> y;
        op mul(y, 4.0) >> y;
        op add(y, 1.0) >> y;
    }
    op counted_step(v, v) >> z;
    return;
}
"""
LAYERS = 5


@pytest.fixture()
def files(tmp_path):
    from oi2jax.model import save
    (tmp_path / "counted_ops.py").write_text(OPS)
    rng = np.random.default_rng(3)
    ws = {f"w.{i}": rng.standard_normal(3).astype(np.float32) for i in range(LAYERS)}
    save(tmp_path / "m.oinf", sizevars={"L": LAYERS}, tensors=ws)
    (tmp_path / "g.oi").write_text(GRAPH)
    return tmp_path, ws


def _compile(tmp, mode="compiled"):
    return oi2jax.compile(str(tmp / "g.oi"), model=str(tmp / "m.oinf"), ops=[str(tmp / "counted_ops.py")],
                          mode=mode, **({"unroll": "full"} if mode == "compiled" else {}))


def _traces() -> list:
    import sys
    return next(m for n, m in sys.modules.items() if n.startswith("oi2jax_user_ops_counted_ops_")).TRACES


def _layer_inputs(x, ws) -> list:
    """The input of counted_step in each layer, as the graph computes it (f32, op by op)."""
    y, seen = x.astype(np.float32), []
    for i in range(LAYERS):
        seen.append(y)
        y = (y * np.float32(0.5) + ws[f"w.{i}"]).astype(np.float32)
        y = (y * np.float32(4.0)).astype(np.float32)
        y = (y + np.float32(1.0)).astype(np.float32)
    return seen + [y]


def test_unrolled_layers_trace_the_kernel_once_per_signature(files):
    tmp, ws = files
    prog = _compile(tmp)
    x, v = np.array([1.0, -2.0, 3.5], np.float32), np.array([0.25, 4.0], np.float32)
    traces = _traces()
    traces.clear()
    out = prog.run({"x": x, "v": v})
    # 5 unrolled layers of counted_step over [3] and one call over [2]: the kernel runs twice, not
    # six times per trace of the step (the fused run traces it twice)
    assert sorted(traces) == [(2,), (3,)]
    np.testing.assert_array_equal(out["y"], _layer_inputs(x, ws)[-1])  # elementwise f32: exact
    np.testing.assert_array_equal(out["z"], (v * np.float32(0.5) + v).astype(np.float32))
    jaxpr = prog.emit("jaxpr")  # the equations are inlined at every call: no call of a traced function
    assert not any(f"name={name}" in jaxpr for name in ("counted_step", "add", "mul"))
    hlo = prog.emit("optimized-hlo")  # each call site keeps its own named scope
    assert all(f"loop_layers.{i}/" in hlo for i in range(LAYERS))
    interp = _compile(tmp, mode="interpret").run({"x": x, "v": v})
    np.testing.assert_array_equal(out["y"], interp["y"])
    np.testing.assert_array_equal(out["z"], interp["z"])


def test_each_call_reports_its_own_runtime_error(files):
    tmp, ws = files
    prog = _compile(tmp)
    # y doubles per layer: from 12 the first layers pass and a later one's input is over 100.
    # The layers share one trace; the error names the value of the call that failed
    x = np.array([1.0, 12.0, 3.0], np.float32)
    inputs = _layer_inputs(x, ws)
    failing = next(i for i, y in enumerate(inputs[:LAYERS]) if np.any(y > 100))
    assert failing >= 2
    value = int(inputs[failing][np.argmax(inputs[failing] > 100)])
    for mode in ("compiled", "interpret"):
        with pytest.raises(OiError, match=f"counted_step: {value} is over 100"):
            _compile(tmp, mode=mode).run({"x": x, "v": np.array([0.5, 2.0], np.float32)})
    with pytest.raises(OiError, match="counted_step: 250 is over 100"):  # the call outside the loop
        prog.run({"x": np.array([1.0, 2.0, 3.0], np.float32), "v": np.array([0.5, 250.0], np.float32)})


def test_calls_differing_only_in_a_known_setting_are_traced_apart():
    """Known settings are part of the signature by their bits: -0.0 and 0.0 differ (x * -0.0 is
    -0.0 for a positive x), so the second call is not the first one's trace."""
    from pathlib import Path
    scaled = str(Path(__file__).resolve().parent / "user_ops" / "scaled.py")  # tanh(x) * scale
    prog = oi2jax.compile("""
    dynamic { x: f32[2]; }
    volatile { a: f32[2]; b: f32[2]; c: f32[2]; d: f32[2]; e: f32[2]; }
    block entry {
        op mul(x, 0.0) >> a;
        op mul(x, -0.0) >> b;
        op mul(x, 0.0) >> c;
        op scaled_tanh(x, scale=0.0) >> d;
        op scaled_tanh(x, scale=-0.0) >> e;
        return;
    }
    """, ops=[scaled])
    out = prog.run({"x": np.array([1.5, 2.0], np.float32)})
    assert not np.signbit(out["a"]).any() and np.signbit(out["b"]).all() and not np.signbit(out["c"]).any()
    assert not np.signbit(out["d"]).any() and np.signbit(out["e"]).all()
