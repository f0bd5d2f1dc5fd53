"""`Program.specialized({name: value})`: dynamic scalars fixed at compile time (`BoundGraph.fixed`).
An op attribute that reads one is a value known while tracing, as a literal is; the program
computes what the general program computes with that input, bit for bit; a run may not give a
fixed input; a name that is not a dynamic scalar, or a value its dtype cannot hold exactly, is an
OiError. `generate` runs such programs for greedy generations (tests/test_generate.py)."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError

from test_sampling import SAMPLE_GRAPH

V = 16


@pytest.fixture(scope="module")
def general():
    return oi2jax.compile(SAMPLE_GRAPH, sizes={"V": V}, ops=["nn"], model=False)


def draws(prog, logits, **inputs):
    sess = prog.session()
    return [int(np.asarray(sess.step(logits=row, **inputs)["next"])) for row in logits]


@pytest.mark.parametrize("t", [0.0, 0.75, float(np.float32(1e-40))])
def test_a_fixed_temperature_draws_what_the_input_draws(general, t):
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((6, V)).astype(np.float32)
    fixed = general.specialized({"temperature": t})
    assert fixed.bound.fixed == {"temperature": t} and fixed.consts.keys() == general.consts.keys()
    for k in (0, 3):
        want = draws(general, logits, temperature=np.float32(t), top_k=np.int32(k), seed=np.int32(2))
        assert draws(fixed, logits, top_k=np.int32(k), seed=np.int32(2)) == want
    if t < 1e-38:  # greedy: the draw is argmax, its HLO has no sampler
        assert draws(fixed, logits, top_k=np.int32(0), seed=np.int32(0)) == list(np.argmax(logits, axis=1))
        text = fixed.lower(logits=logits[0], top_k=np.int32(0), seed=np.int32(0)).as_text()
        assert "stablehlo.case" not in text and "stablehlo.while" not in text
    assert fixed.rebound({"V": V}).bound.fixed == {"temperature": t}  # a rebinding keeps them


def test_a_fixed_input_cannot_be_given(general):
    fixed = general.specialized({"top_k": 3})
    message = r"input top_k is fixed at 3 in this program \(Program.specialized\): a run cannot give it"
    logits = np.zeros(V, np.float32)
    with pytest.raises(OiError, match=message):
        fixed.session().step(logits=logits, top_k=np.int32(3))
    with pytest.raises(OiError, match=message):
        fixed.run({"logits": logits, "top_k": np.int32(3)})
    with pytest.raises(OiError, match=message):
        fixed.step(fixed.init_state(), logits=logits, top_k=np.int32(3))


@pytest.mark.parametrize("values, message", [
    ({"temprature": 0.0}, r"specialized: temprature is not a dynamic variable of <string> \(did you mean temperature\?\)"),
    ({"pos": 1}, "specialized: pos is not a dynamic variable"),
    ({"logits": 0.0}, r"specialized: logits is f32\[16\]: only a scalar input can be fixed at compile time"),
    ({"temperature": 1e40}, r"input temperature: value 1e\+40 \(float64\) is not exactly representable in f32"),
    ({"top_k": 1.5}, "input top_k: expected integer values for i32"),
    ({"top_k": True}, "specialized: top_k: expected a i32 number, got True"),
    ({"seed": "3"}, "specialized: seed: expected a i32 number, got '3'"),
])
def test_what_cannot_be_fixed_is_refused(general, values, message):
    with pytest.raises(OiError, match=message):
        general.specialized(values)
