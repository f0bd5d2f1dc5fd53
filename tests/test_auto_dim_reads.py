"""Reads of `@auto_dim` tensors give the destination the tensor's current shape (SPEC.md §0 item 12,
revised; issue 16 part 5): OpenInfer's cache_auto_dim example, exact values, O(log n) compiles,
located errors for what cannot take a runtime shape."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError

from conftest import run_cli

CACHE_AUTO_DIM = """\
// OpenInfer's cache_auto_dim example: three growing tensors read whole into [D, H] volatiles
dynamic {
    bias: f32;
}

volatile {
    a: f32[D, H];
    b: f32[D, H];
    c: f32[D, H];
}

persistent {
    l_rows: i32 @init(0);
    l_cols: i32 @init(0);
    m_cols: i32 @init(0);
    n_rows: i32 @init(0);
    L(r, c): f32[D, H] @auto_dim(r, c);
    M(r, c): f32[D, H] @auto_dim(r, c);
    N(r, c): f32[D, H] @auto_dim(r, c);
}

block entry {
    cache.increment 3 l_rows;
    cache.increment 2 l_cols;
    cache.increment 5 m_cols;
    cache.increment 5 n_rows;
    cache.read L[l_rows, l_cols] >> a;
    cache.read M[0, m_cols] >> b;
    cache.read N[n_rows, 0] >> c;
    op add(a, bias) >> a;
    op add(b, bias) >> b;
    op add(c, bias) >> c;
    cache.write a >> L[l_rows, l_cols];
    cache.write b >> M[0, m_cols];
    cache.write c >> N[n_rows, 0];
    return;
}
"""
SIZES = {"D": 2, "H": 2}


def numpy_model(biases):
    """The tensors and volatiles after each step: grow (zero padding at the end), add bias, write back."""
    L, M, N = (np.zeros((2, 2), np.float32) for _ in range(3))
    counts = {"l": [0, 0], "m": [0, 0], "n": [0, 0]}
    history = []
    for bias in biases:
        counts["l"] = [counts["l"][0] + 3, counts["l"][1] + 2]
        counts["m"] = [0, counts["m"][1] + 5]
        counts["n"] = [counts["n"][0] + 5, 0]

        def grown(t, key):
            shape = (2 + counts[key][0], 2 + counts[key][1])
            out = np.zeros(shape, np.float32)
            out[:t.shape[0], :t.shape[1]] = t
            return out

        L, M, N = grown(L, "l") + np.float32(bias), grown(M, "m") + np.float32(bias), grown(N, "n") + np.float32(bias)
        history.append({"a": L.copy(), "b": M.copy(), "c": N.copy(), "L": L.copy(), "M": M.copy(), "N": N.copy()})
    return history


@pytest.fixture(scope="module")
def program():
    return oi2jax.compile(CACHE_AUTO_DIM, sizes=SIZES)


def test_three_steps_shapes_and_values(program):
    biases = [1.5, -2.0, 0.25]
    expected = numpy_model(biases)
    session = program.session()
    shapes = []
    for step, bias in enumerate(biases):
        out = session.step(bias=np.float32(bias))
        shapes.append((out["a"].shape, out["b"].shape, out["c"].shape))
        for name in ("a", "b", "c"):
            np.testing.assert_array_equal(np.asarray(out[name]), expected[step][name])
        for name in ("L", "M", "N", "a"):
            np.testing.assert_array_equal(session.read(name), expected[step][name])
    assert shapes == [((5, 4), (2, 7), (7, 2)), ((8, 6), (2, 12), (12, 2)), ((11, 8), (2, 17), (17, 2))]


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_run_matches_numpy_both_ways(program, mode):
    prog = program if mode == "compiled" else oi2jax.compile(CACHE_AUTO_DIM, sizes=SIZES, mode=mode)
    out = prog.run({"bias": np.float32(0.5)}, steps=3)
    expected = numpy_model([0.5] * 3)[-1]
    for name, value in expected.items():
        np.testing.assert_array_equal(out[name], value, err_msg=name)
    assert int(out["l_rows"]) == 9 and int(out["m_cols"]) == 15


def test_per_step_inputs_fused_and_200_steps_compile_log_n(program):
    biases = np.arange(1, 4, dtype=np.float32)
    out = program.run({"bias": biases})
    expected = numpy_model(biases)[-1]
    for name, value in expected.items():
        np.testing.assert_array_equal(out[name], value, err_msg=name)
    prog = oi2jax.compile(CACHE_AUTO_DIM, sizes=SIZES)
    before = prog.compiles
    out = prog.run({"bias": np.ones(200, np.float32)})
    assert out["a"].shape == (602, 402) and out["b"].shape == (2, 1002) and out["c"].shape == (1002, 2)
    assert out["L"].shape == (602, 402) and float(out["L"][0, 0]) == 200.0 and float(out["L"][601, 401]) == 1.0
    # capacity doubling: 4 growing dims of at most 1002 -> at most 4 * 9 growth events (measured: 13, dims 3/4 full growing together)
    assert prog.compiles - before <= 4 * 9 + 2, prog.compiles - before
    session = prog.session()
    before = prog.compiles
    for _ in range(40):
        session.step(bias=np.float32(1))
    assert session.read("a").shape == (122, 82) and prog.compiles - before <= 2 * 6 + 2


def test_cli_out_holds_the_current_shapes(tmp_path, capsys):
    g = tmp_path / "g.oi"
    g.write_text(CACHE_AUTO_DIM)
    np.save(tmp_path / "bias.npy", np.float32(2.0))
    code, _, err = run_cli(capsys, "run", g, "--size", "D=2", "--size", "H=2", "--input", f"bias={tmp_path / 'bias.npy'}",
                           "--steps", "2", "--out", tmp_path / "o.npz", "--quiet")
    assert code == 0, err
    with np.load(tmp_path / "o.npz") as npz:
        expected = numpy_model([2.0, 2.0])[-1]
        for name, value in expected.items():
            np.testing.assert_array_equal(npz[name], value, err_msg=name)


@pytest.mark.parametrize("body, message", [
    ("cache.read L[l_rows, l_cols] >> a;\n    op matmul(a, a) >> a;",
     "op matmul cannot take a runtime-shaped operand: a has the current shape of @auto_dim tensor L"),
    ("cache.read L[l_rows, l_cols] >> a;\n    op sum_axis(a, axes=[0]) >> s;",
     "op sum_axis cannot take a runtime-shaped operand: a has the current shape of @auto_dim tensor L"),
    ("cache.read L[l_rows, l_cols] >> a;\n    op add(a, w) >> a;",
     "op add: w has the fixed shape [2, 2] but a has the current shape of @auto_dim tensor L; only scalars"),
    ("cache.read L[l_rows, l_cols] >> a;\n    transfer a >> w2;", "a cannot be used in transfer"),
    ("cache.read L[l_rows, l_cols] >> a;\n    cache.write a >> P;",
     "cache.write a >> P: a has the current shape of @auto_dim tensor L; only an @auto_dim tensor can take it"),
    ("cache.read L[l_rows, l_cols] >> s;", "s takes the current shape of @auto_dim tensor L: it needs 2 "
                                           "dimensions, like L (it is declared with 1)"),
    ("cache.read L[l_rows, l_cols] >> a;\n    cache.read P >> a;\n    cache.read K[l_rows, 1] >> a;",
     "a takes the current shapes of two @auto_dim tensors (L and K)"),
])
def test_uses_that_cannot_take_a_runtime_shape(tmp_path, capsys, body, message):
    g = tmp_path / "g.oi"
    g.write_text("dynamic { w: f32[2, 2]; }\nvolatile { a: f32[2, 2]; w2: f32[2, 2]; s: f32[2]; t: f32[3, 3]; }\n"
                 "persistent {\n    l_rows: i32;\n    l_cols: i32;\n    P: f32[2, 2];\n"
                 "    L(r, c): f32[2, 2] @auto_dim(r, c);\n    K(r, c): f32[2, 2] @auto_dim(r, c);\n}\n"
                 f"block entry {{\n    {body}\n    return;\n}}\n")
    code, _, err = run_cli(capsys, "check", g)
    assert code == 1 and message in err and f"{g}:" in err, err


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_write_back_after_further_growth_is_a_runtime_error(mode):
    """`a` holds L's shape at the read; writing it after L grew again is a located error."""
    text = ("volatile { a: f32[2, 2]; }\npersistent {\n    L(r, c): f32[2, 2] @auto_dim(r, c);\n}\n"
            "block entry {\n    cache.read L[1, 1] >> a;\n    cache.write a >> L[3, 1];\n    return;\n}\n")
    with pytest.raises(OiError) as exc:
        oi2jax.compile(text, mode=mode).run({}, steps=1)
    text_ = exc.value.render()
    assert "<string>:7:" in text_ and "a" in text_ and "L" in text_, text_


def test_reads_at_the_declared_shape_still_work_as_before():
    """A read whose current shape equals the declaration behaves exactly as a fixed-shape read."""
    text = ("volatile { a: f32[2, 3]; y: f32[2, 3]; }\npersistent {\n    M(r, c): f32[2, 3] @auto_dim(r, c);\n}\n"
            "block entry {\n    cache.read M >> a;\n    op add(a, a) >> y;\n    cache.write y >> M;\n    return;\n}\n")
    out = oi2jax.compile(text).run({}, steps=2)
    assert out["a"].shape == (2, 3) and out["y"].shape == (2, 3) and out["M"].shape == (2, 3)
