"""The hand-written JAX Llama of benchmarks/llama.py (benchmarks/handwritten/llama.py) against the
NumPy Llama (tests/llama_ref.py) on a tiny random checkpoint converted with convert-hf: logits of
every step within 1e-4 of the largest reference logit, both layer forms, the donated scan
generation equal to a loop of jitted steps."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from oi2jax.model import open_model

from benchmarks.handwritten.llama import LlamaJax
from llama_ref import LlamaRef, converted_random_llama

SIZES = dict(vocab=64, hidden=32, layers=2, heads=8, kv_heads=4, intermediate=48, max_positions=24)
STEPS = 6
TOL = 1e-4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return converted_random_llama(tmp_path_factory.mktemp("hwllama"), seed=5, **SIZES)


def _rel(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("layers", ["unrolled", "scan"])
def test_steps_match_the_numpy_llama(ckpt, layers):
    model, weights, config = ckpt
    m = LlamaJax.from_model(open_model(str(model)), layers=layers)
    ref = LlamaRef(weights, config)
    cache = m.init_cache()
    tokens = np.random.default_rng(0).integers(0, SIZES["vocab"], STEPS)
    for pos, tok in enumerate(tokens):
        old = cache
        cache, logits, nxt = m.step(m.params, cache, np.int32(tok), np.int32(pos))
        want = ref.step(int(tok))
        assert _rel(logits, want) <= TOL, (pos, _rel(logits, want))
        assert int(nxt) == int(np.argmax(np.asarray(logits))) and np.asarray(nxt).dtype == np.int32
        assert all(a.is_deleted() for a in old)  # the cache was donated
    K = np.asarray(cache[0])
    assert np.all(K[:, :STEPS] != 0) and np.all(K[:, STEPS:] == 0)


def test_generate_equals_a_loop_of_steps(ckpt):
    model, *_ = ckpt
    m = LlamaJax.from_model(model)
    prompt = np.array([3, 9, 27, 1], np.int32)
    n = 9
    cache, nexts, logits = m.generate(m.params, m.init_cache(), prompt, n)
    loop_cache, tok, want = m.init_cache(), None, []
    for k in range(n):
        tok = prompt[k] if k < len(prompt) else tok
        loop_cache, last, tok = m.step(m.params, loop_cache, tok, np.int32(k))
        want.append(int(tok))
    assert np.asarray(nexts).tolist() == want
    np.testing.assert_allclose(np.asarray(logits), np.asarray(last), rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(cache[1]), np.asarray(loop_cache[1]), rtol=0, atol=1e-6)
    # from the middle: pos0 continues a cache (the benchmark's generation after the prompt)
    first, tail = m.generate(m.params, m.init_cache(), prompt, 4), None
    tail = m.generate(m.params, first[0], first[1][-1:], n - 4, np.int32(4))
    assert np.asarray(tail[1]).tolist() == want[4:]
    assert jax.tree.leaves(first[0])[0].is_deleted()
