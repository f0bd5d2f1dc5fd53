"""The ten example programs (examples/*.oi, SPEC §9) against their reference models.

Every expected value is a NumPy computation of the same maths, written here from the
SPEC (§3 execution, §4 caches, §3.6 snapshot yield/await, §6 ops), with the weights read
from the model through `oi2jax.model.open_model(path).load(name)`. Each case runs in both
modes: the compiled JAX program and the reference interpreter.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import EXAMPLES, MODELS, run_cli

NAMES = (
    "cache_window_slice",
    "kv_cache_decode",
    "linear_attention",
    "mlp_regression",
    "moe_routing",
    "online_weight_update",
    "quantized_linear",
    "residual_mlp_stack",
    "stability_guard",
    "streaming_pipeline",
)
MODES = ("compiled", "interpret")
RTOL = ATOL = 1e-5


def graph_path(name: str) -> str:
    return str(EXAMPLES / f"{name}.oi")


def model_path(name: str) -> str:
    return str(MODELS / f"{name}.oinf")


# ---------------------------------------------------------------------------------------
# shared fixtures: one compiled program per (example, mode), one weight loader per model


@pytest.fixture(scope="module")
def program():
    import oi2jax
    cache: dict = {}

    def get(name: str, mode: str):
        key = (name, mode)
        if key not in cache:
            cache[key] = oi2jax.compile(graph_path(name), model=model_path(name), mode=mode)
        return cache[key]

    return get


@pytest.fixture(scope="module")
def weights():
    from oi2jax.model import open_model
    models: dict = {}

    def load(name: str, tensor: str) -> np.ndarray:
        if name not in models:
            models[name] = open_model(model_path(name))
        return np.asarray(models[name].load(tensor))

    return load


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def normal(seed: int, shape, scale: float = 1.0) -> np.ndarray:
    return (scale * rng(seed).standard_normal(shape)).astype(np.float32)


def close(actual, expected, name: str = ""):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    if np.issubdtype(expected.dtype, np.floating):
        np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL, err_msg=name)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=name)


def check_outputs(out: dict, expected: dict):
    for name, value in expected.items():
        assert name in out, f"output {name} missing (have {sorted(out)})"
        close(out[name], value, name)


def messages(error) -> str:
    """The diagnostics' own messages (not the rendered source snippet)."""
    return " | ".join(d.message for d in error.diagnostics)


def relu(a):
    return np.where(a >= 0, a, np.float32(0.0)).astype(np.float32)


def relu6(a):
    return np.minimum(relu(a), np.float32(6.0))


def run_steps(prog, per_step_inputs: list[dict]) -> dict:
    """Run one step per input dict through the compiled step API (`init_state`, `step`);
    returns the last step's outputs (dynamic and volatile variables; persistent state
    stays in `state`)."""
    state = prog.init_state()
    out = None
    for inputs in per_step_inputs:
        state, out = prog.step(state, **inputs)
    return {k: np.asarray(v) for k, v in out.items()}


# ---------------------------------------------------------------------------------------
# every example parses and checks clean (in-process and through the CLI)


@pytest.mark.parametrize("name", NAMES)
def test_example_parses_and_checks(name):
    from oi2jax.check import check
    from oi2jax.grammar.parse import parse_file
    from oi2jax.model import open_model
    graph = parse_file(graph_path(name))
    assert any(b.name == "entry" for b in graph.blocks)
    errors = [d for d in check(graph, model=open_model(model_path(name))) if d.severity == "error"]
    assert not errors, [d.message for d in errors]


@pytest.mark.parametrize("name", NAMES)
def test_cli_check_exits_zero(name, capsys):
    """`oi2jax check G --model M` in-process (`main`'s code is the exit status: test_cli_frontend)."""
    code, _, err = run_cli(capsys, "check", graph_path(name), "--model", model_path(name))
    assert code == 0, err


# ---------------------------------------------------------------------------------------
# single-step examples


@pytest.mark.parametrize("mode", MODES)
def test_mlp_regression(program, weights, mode):
    name = "mlp_regression"
    x = normal(1, (4, 16))
    w1, b1, w2, b2 = (weights(name, t) for t in ("w1", "b1", "w2", "b2"))
    h = relu(x @ w1 + b1)
    y = h @ w2 + b2
    out = program(name, mode).run({"x": x}, steps=1)
    check_outputs(out, {"x": x, "h": h, "y": y})


@pytest.mark.parametrize("mode", MODES)
def test_linear_attention(program, weights, mode):
    name = "linear_attention"
    x = normal(2, (4, 32))
    out_acc = np.zeros((4, 32), np.float32)
    for head in range(2):  # num_heads = 2
        q = x @ weights(name, f"attn.wq.{head}")
        k = x @ weights(name, f"attn.wk.{head}")
        h = q + k
        head_out = h @ weights(name, f"attn.wv.{head}")
        out_acc = out_acc + head_out
    final = out_acc @ weights(name, "w_out")
    out = program(name, mode).run({"x": x}, steps=1)
    # q, k, h, head_out keep the last head's values
    check_outputs(out, {"out": final, "q": q, "k": k, "h": h, "head_out": head_out})


@pytest.mark.parametrize("mode", MODES)
def test_residual_mlp_stack(program, weights, mode):
    name = "residual_mlp_stack"
    x = normal(3, (4, 32))
    y = x + weights(name, "bias0")
    for layer in range(3):  # num_layers = 3; W[l] -> res.mlp.w.{l}
        h = relu(y @ weights(name, f"res.mlp.w.{layer}") + weights(name, f"res.mlp.b.{layer}"))
        y = y + h
    out = program(name, mode).run({"x": x}, steps=1)
    check_outputs(out, {"y": y, "h": h})
    # the prefix tables must really be loaded (the Rust runtime reads zeros, §11 item 1)
    assert not np.allclose(out["y"], x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("route", [True, False])
def test_moe_routing(program, weights, mode, route):
    name = "moe_routing"
    x = normal(4, (4, 16))
    gate = x @ weights(name, "w_gate")
    expert = "0" if route else "1"  # branch route expert0 expert1: true -> expert0
    y = x @ weights(name, "w" + expert) + weights(name, "b" + expert)
    out = program(name, mode).run({"x": x, "route": np.array(route)}, steps=1)
    check_outputs(out, {"gate": gate, "y": y})


@pytest.mark.parametrize("mode", MODES)
def test_quantized_linear_exact(program, weights, mode):
    name = "quantized_linear"
    x = weights(name, "x")
    w = weights(name, "w")
    assert x.shape == (4, 16) and w.shape == (16, 8)
    # SPEC §9: packed LSB-first; first values x = 7, 0, 6, -1, ..., w = -1, 6, -7, 2, ...
    assert x.reshape(-1)[:4].tolist() == [7, 0, 6, -1]
    assert w.reshape(-1)[:4].tolist() == [-1, 6, -7, 2]
    assert x.min() >= -8 and x.max() <= 7 and w.min() >= -8 and w.max() <= 7
    y = (x.astype(np.int64) @ w.astype(np.int64)).astype(np.int32)
    out = program(name, mode).run({}, steps=1)
    close(out["y"], y, "y")  # exact int32


@pytest.mark.parametrize("mode", MODES)
def test_stability_guard_finite(program, weights, mode):
    name = "stability_guard"
    x = normal(5, (4, 16))
    out = program(name, mode).run({"x": x}, steps=1)
    check_outputs(out, {"cond": np.array(True), "y": x + weights(name, "bias")})


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_stability_guard_non_finite(program, mode, bad):
    name = "stability_guard"
    x = normal(6, (4, 16))
    x[1, 3] = bad
    out = program(name, mode).run({"x": x}, steps=1)
    # is_finite reduces to one false bool; `bad` zero-fills y
    check_outputs(out, {"cond": np.array(False), "y": np.zeros((4, 16), np.float32)})


@pytest.mark.parametrize("mode", MODES)
def test_streaming_pipeline_snapshot(program, weights, mode):
    """SPEC §3.6 + §0 item 3: both consumers start from the snapshot at `yield x`;
    writer's x = x + bias comes back at `await`; reader's h2 (not yielded) is kept;
    the entry's relu6 of h runs between yield and await on its own h."""
    name = "streaming_pipeline"
    x = normal(7, (4, 16), scale=4.0)  # large enough that relu6 clips on both sides
    w, bias = weights(name, "w"), weights(name, "bias")
    h = relu6(x @ w)
    assert (x @ w > 6).any() and (x > 6).any() and (x < 0).any()
    expected = {"x": x + bias, "h": h, "h2": relu6(x)}  # h2 from the ORIGINAL x (snapshot)
    out = program(name, mode).run({"x": x}, steps=1)
    check_outputs(out, expected)


# ---------------------------------------------------------------------------------------
# multi-step state


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("steps", [1, 2, 3])
def test_online_weight_update(program, mode, steps):
    """y at step k+1 is x·(k·delta): step 1 sees W = 0, step 2 sees W = delta."""
    name = "online_weight_update"
    x = normal(8, (4, 16))
    delta = normal(9, (16, 8), scale=0.1)
    zero = np.zeros((16, 8), np.float32)
    W = np.zeros((16, 8), np.float32)  # persistent @init(0.0)
    for _ in range(steps):
        w = W + zero
        y = x @ w
        w = w + delta
        W = w
    out = program(name, mode).run({"x": x, "delta": delta}, steps=steps)
    check_outputs(out, {"y": y, "w": w, "W": W})
    if steps == 1:
        assert not out["y"].any()
    if steps == 2:
        close(out["y"], x @ delta, "y")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("steps", [1, 2, 3, 4])
def test_kv_cache_decode(program, mode, steps):
    """K(i) @fixed(i=4): after n steps rows 0..n-1 of k_hist hold q, the rest zeros."""
    name = "kv_cache_decode"
    q = normal(10, (16,))
    k_hist = np.zeros((4, 16), np.float32)
    k_hist[:steps] = q
    out = program(name, mode).run({"q": q}, steps=steps)
    check_outputs(out, {"k_hist": k_hist, "q": q, "t": np.array(steps, np.int32)})


# Different inputs per step: only the compiled Program has a public per-step API
# (`init_state()` / `step(state, **dynamic)`); `run` repeats the same inputs.
def test_kv_cache_decode_distinct_queries(program):
    name = "kv_cache_decode"
    qs = [normal(20 + i, (16,)) for i in range(3)]
    out = run_steps(program(name, "compiled"), [{"q": q} for q in qs])
    k_hist = np.zeros((4, 16), np.float32)
    k_hist[:3] = np.stack(qs)  # filled in order
    check_outputs(out, {"k_hist": k_hist, "q": qs[-1]})


@pytest.mark.parametrize("mode", MODES)
def test_kv_cache_decode_fixed_size_exceeded(program, mode):
    """Step 5 writes K[4]: "dimension 0 of K: index 4 is past its fixed size 4" (SPEC §4.2)."""
    from oi2jax import OiError
    with pytest.raises(OiError) as info:
        program("kv_cache_decode", mode).run({"q": normal(10, (16,))}, steps=5)
    msg = messages(info.value)
    assert re.search(r"\bK\b", msg) and "fixed size" in msg, msg


def window_expected(x_per_step: list[np.ndarray]) -> np.ndarray:
    """NumPy model of cache_window_slice, steps 1..4 (SPEC §9 item 1, §4.2).

    Step k (1-based) writes A[k-1] = x_k, then reads A[start..end] with start = k-1,
    end = k+2 (clamped into [0, 6], which changes nothing for k <= 4): slices 0..3, 1..4,
    2..5, 3..6. Only row 0 of each window has been written; rows 1, 2 are defaults (0).
    """
    table = np.zeros((6, 8), np.float32)
    start, end, write_idx = 0, 3, 0
    window = None
    for x in x_per_step:
        table[write_idx] = x
        write_idx += 1
        start = min(max(start, 0), 6)
        end = min(max(end, 0), 6)
        window = table[start:end].copy()
        start += 1
        end += 1
    return window, start, end, write_idx


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("steps", [1, 2, 3, 4])
def test_cache_window_slice(program, mode, steps):
    name = "cache_window_slice"
    x = normal(11, (8,))
    window, start, end, write_idx = window_expected([x] * steps)
    assert window.shape == (3, 8)
    np.testing.assert_array_equal(window[0], x)
    assert not window[1:].any()
    out = program(name, mode).run({"x": x}, steps=steps)
    check_outputs(out, {
        "window": window,
        "start": np.array(start, np.int32),
        "end": np.array(end, np.int32),
        "write_idx": np.array(write_idx, np.int32),
    })
    assert int(out["start"]) == steps and int(out["end"]) == steps + 3


def test_cache_window_slice_distinct_inputs(program):
    xs = [normal(30 + i, (8,)) for i in range(4)]
    window, *_ = window_expected(xs)
    np.testing.assert_array_equal(window[0], xs[3])  # slice 3..6 after writing A[3]
    out = run_steps(program("cache_window_slice", "compiled"), [{"x": x} for x in xs])
    check_outputs(out, {"window": window})


@pytest.mark.parametrize("mode", MODES)
def test_cache_window_slice_step5_window_too_short(program, mode):
    """Step 5: write A[4] (fine, 5 <= 6); start = 4, end = min(7, limit=6) = 6, so the slice
    A[4..6] has 2 rows, which no longer fits `window: f32[3, D]`. The table itself stays
    within @fixed(i=6) (the slice end 6 is allowed), so this is NOT "past its fixed size":
    it is the destination-shape check oi2jax adds (SPEC §0 item 12, §4.3). The reference
    would silently replace window with a [2, D] tensor; oi2jax must report an error that
    names the cache and the destination.
    """
    from oi2jax import OiError
    with pytest.raises(OiError) as info:
        program("cache_window_slice", mode).run({"x": normal(11, (8,))}, steps=5)
    msg = messages(info.value)
    assert re.search(r"\bA\b", msg) and ("window" in msg or "destination" in msg), msg
    assert "2" in msg and "3" in msg, msg  # the slice length and the declared length


# ---------------------------------------------------------------------------------------
# examples/models.py: the project's own models match the reference models' layout


def _load_models_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("example_models", EXAMPLES / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_built_models_match_reference_layout(tmp_path):
    from oi2jax.model import open_model
    models = _load_models_module()
    assert tuple(models.NAMES) == NAMES
    for name in NAMES:
        path = models.build(name, tmp_path / f"{name}.oinf")
        ours, ref = open_model(str(path)), open_model(model_path(name))
        assert dict(ours.sizevars) == dict(ref.sizevars), name
        assert set(ours.metadata) == set(ref.metadata), name
        assert set(ours.tensors) == set(ref.tensors), name
        for t, info in ref.tensors.items():
            mine = ours.tensors[t]
            assert (mine.dtype, tuple(mine.shape)) == (info.dtype, tuple(info.shape)), f"{name}: {t}"
            assert mine.has_data
        # deterministic: a second build gives the same bytes
        again = models.build(name, tmp_path / f"{name}.again.oinf")
        assert path.read_bytes() == again.read_bytes(), name


def test_committed_example_models_are_what_models_py_builds(tmp_path):
    """examples/<name>.oinf ship with the repo (so `oi2jax run examples/<name>.oi` needs no
    flags); they must be exactly what the project's own builder writes."""
    models = _load_models_module()
    for name in NAMES:
        committed = EXAMPLES / f"{name}.oinf"
        assert committed.exists(), name
        assert models.build(name, tmp_path / f"{name}.oinf").read_bytes() == committed.read_bytes(), name


def test_run_example_without_flags(capsys, tmp_path):
    """`oi2jax run examples/<name>.oi` picks up examples/<name>.oinf by itself."""
    from oi2jax.cli import main
    from oi2jax.model import open_model
    assert main(["run", str(EXAMPLES / "quantized_linear.oi"), "--quiet", "--out", str(tmp_path / "o.npz")]) == 0
    m = open_model(str(EXAMPLES / "quantized_linear.oinf"))
    want = m.load("x").astype(np.int32) @ m.load("w").astype(np.int32)
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], want)


def test_example_runs_with_built_model(tmp_path):
    import oi2jax
    from oi2jax.model import open_model
    models = _load_models_module()
    path = models.build("mlp_regression", tmp_path / "mlp_regression.oinf")
    m = open_model(str(path))
    x = normal(12, (4, 16))
    y = relu(x @ m.load("w1") + m.load("b1")) @ m.load("w2") + m.load("b2")
    out = oi2jax.compile(graph_path("mlp_regression"), model=str(path)).run({"x": x})
    close(out["y"], y, "y")
