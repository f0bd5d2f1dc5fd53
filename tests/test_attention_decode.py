"""The single-head attention decode step of the ops issue (examples/attention_decode.oi), written
with the nn set over `@fixed(slot=T)` caches with T from the model: equal to NumPy at every step,
compiled and interpreted, and a step past T is an error."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError

from conftest import EXAMPLES

GRAPH = EXAMPLES / "attention_decode.oi"
D, T = 16, 12


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    w = {n: (rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for n in ("Wq", "Wk", "Wv", "Wo")}
    w["norm_w"] = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    w["scale"] = np.float32(1 / np.sqrt(D))
    return w


def _numpy_steps(w, xs):
    """Attention decode in float64, written from the math (not from the graph)."""
    f = {k: np.asarray(v, np.float64) for k, v in w.items()}
    ks, vs, outs = [], [], []
    for x in np.asarray(xs, np.float64):
        h = x / np.sqrt(np.mean(x * x) + 1e-6) * f["norm_w"]
        q, k, v = f["Wq"] @ h, f["Wk"] @ h, f["Wv"] @ h
        ks.append(k)
        vs.append(v)
        s = np.stack(ks) @ q * f["scale"]
        p = np.exp(s - s.max())
        p /= p.sum()
        outs.append(f["Wo"] @ (p @ np.stack(vs)) + x)
    return np.stack(outs)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("attn") / "attention_decode.oinf"
    oi2jax.model.save(str(path), sizevars={"D": D, "T": T}, tensors=_weights())
    return path


def test_equal_to_numpy_at_every_step(model):
    xs = np.random.default_rng(1).standard_normal((T, D)).astype(np.float32)
    want = _numpy_steps(_weights(), xs)
    prog = oi2jax.compile(GRAPH, model=model, ops=["nn"])
    sess = prog.session()
    for k in range(T):
        sess.step(x=xs[k])
        np.testing.assert_allclose(sess.read("y"), want[k], rtol=2e-5, atol=2e-6, err_msg=f"step {k}")
    fused = prog.session().run({"x": xs}, collect=("y",))
    np.testing.assert_allclose(fused["y"], want, rtol=2e-5, atol=2e-6)
    interp = oi2jax.compile(GRAPH, model=model, ops=["nn"], mode="interpret").run({"x": xs[0]})
    np.testing.assert_allclose(interp["y"], want[0], rtol=2e-5, atol=2e-6)


def test_T_comes_from_the_model_and_a_step_past_it_is_an_error(model):
    prog = oi2jax.compile(GRAPH, model=model, ops=["nn"])
    assert prog.bound.sizes["T"] == T and prog.bound.shape("kc") == (T, D)
    sess = prog.session(max_unchecked=1)
    sess.run({"x": np.zeros((T, D), np.float32)})
    with pytest.raises(OiError) as e:
        sess.step(x=np.zeros(D, np.float32))
        sess.check()
    assert f"(in step {T + 1})" in e.value.render() and "K" in e.value.render()
