"""The nn op `sample` against NumPy's transformers-order filtered softmax: the empirical distribution
of a few thousand draws (different positions) within sampling noise of the exact one; runtime
settings change without recompiling; seeds and positions independent; greedy at temperature 0."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oi2jax
from oi2jax.ops.nn.sampling import sample

DRAWS = 6000


def filtered_softmax(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The distribution `sample` draws from, written from transformers' warpers (float64)."""
    z = np.asarray(logits, np.float64) / temperature
    v = z.size
    if 0 < top_k < v:
        z = np.where(z < np.sort(z)[::-1][top_k - 1], -np.inf, z)
    if top_p < 1:
        order = np.argsort(z)  # ascending, as TopPLogitsWarper
        p = np.exp(z[order] - z.max())
        cum = np.cumsum(p / p.sum())
        remove = cum <= 1 - top_p
        remove[-1] = False
        z[order[remove]] = -np.inf
    if min_p > 0:
        p = np.exp(z - z.max())
        p /= p.sum()
        z = np.where(p < min_p * p.max(), -np.inf, z)
    p = np.exp(z - z.max())
    return p / p.sum()


@pytest.fixture(scope="module")
def draw_many():
    @jax.jit
    def many(logits, temperature, top_k, top_p, min_p, seed):
        positions = jnp.arange(DRAWS, dtype=jnp.int32)
        return jax.vmap(lambda p: sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                         seed=seed, position=p, ctx=_Ctx()))(positions)
    return many


class _Ctx:
    """The op context a kernel sees outside a graph: no runtime errors expected here."""

    def fail_if(self, cond, message, value):
        pass


SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=5), dict(temperature=1.3, top_p=0.8),
            dict(temperature=1.0, min_p=0.15), dict(temperature=0.9, top_k=8, top_p=0.9, min_p=0.05)]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_draws_follow_the_filtered_softmax(draw_many, settings):
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(24) * 1.5).astype(np.float32)
    full = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, **settings}
    want = filtered_softmax(logits, **full)
    got = np.asarray(draw_many(logits, np.float32(full["temperature"]), np.int32(full["top_k"]),
                               np.float32(full["top_p"]), np.float32(full["min_p"]), np.int32(11)))
    freq = np.bincount(got, minlength=logits.size) / DRAWS
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(want)), "a filtered-out token was drawn"
    tv = 0.5 * np.abs(freq - want).sum()
    # sampling noise of the total variation over 24 tokens and 6000 draws is ~0.02 (the draws are
    # a fixed function of the seed: this is deterministic, not flaky)
    assert tv < 0.04, tv


def test_settings_are_runtime_values_and_seeds_positions_independent(draw_many):
    logits = np.linspace(-1, 1, 16).astype(np.float32)
    a = np.asarray(draw_many(logits, np.float32(1.0), np.int32(0), np.float32(1.0), np.float32(0.0), np.int32(1)))
    compiled = draw_many._cache_size()
    b = np.asarray(draw_many(logits, np.float32(1.0), np.int32(0), np.float32(1.0), np.float32(0.0), np.int32(2)))
    assert draw_many._cache_size() == compiled  # other seeds: the same compiled function
    c = np.asarray(draw_many(logits, np.float32(0.5), np.int32(4), np.float32(0.9), np.float32(0.1), np.int32(1)))
    assert draw_many._cache_size() == compiled  # other settings too
    assert (a != b).mean() > 0.5  # two seeds: independent streams
    assert set(np.unique(c)) <= set(range(12, 16))  # top-4
    again = np.asarray(draw_many(logits, np.float32(1.0), np.int32(0), np.float32(1.0), np.float32(0.0), np.int32(1)))
    np.testing.assert_array_equal(a, again)  # reproducible for a seed
    greedy = np.asarray(draw_many(logits, np.float32(0.0), np.int32(0), np.float32(1.0), np.float32(0.0), np.int32(1)))
    assert (greedy == 15).all()


SAMPLE_GRAPH = """
dynamic { logits: f32[V]; temperature: f32; top_k: i32; seed: i32; }
volatile { next: i32; }
persistent { pos: i32 @init(0); }
block entry {
    assign p: i32;
    cache.read pos >> p;
    op sample(logits, temperature=temperature, top_k=top_k, seed=seed, position=p) >> next;
    cache.increment pos;
    return;
}
"""


def test_sample_in_a_graph_equals_the_interpreter(tmp_path):
    """The compiled step and the interpreter (NumPy filters, the same noise) draw the same tokens,
    step after step (the position advances the counter)."""
    g = tmp_path / "s.oi"
    g.write_text(SAMPLE_GRAPH)
    rng = np.random.default_rng(2)
    progs = {mode: oi2jax.compile(str(g), sizes={"V": 32}, ops=["nn"], model=False, mode=mode)
             for mode in ("compiled", "interpret")}
    for temperature, top_k, seed in [(1.0, 0, 9), (0.8, 5, 9), (0.0, 0, 1), (1.2, 3, 4)]:
        inputs = {"logits": rng.standard_normal(32).astype(np.float32), "temperature": np.float32(temperature),
                  "top_k": np.int32(top_k), "seed": np.int32(seed)}
        for steps in (1, 3):
            got = {mode: int(np.asarray(p.run(inputs, steps=steps)["next"])) for mode, p in progs.items()}
            assert got["compiled"] == got["interpret"], (temperature, top_k, seed, steps)
            if temperature == 0.0:
                assert got["compiled"] == int(np.argmax(inputs["logits"]))


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_a_temperature_too_small_to_divide_by_draws_the_greedy_token(tmp_path, mode):
    """A subnormal temperature (XLA:CPU reads it as 0: greedy; the interpreter drew token 0 from
    NaNs), one whose logits / t overflow to +inf (both drew a NaN's token), a +inf logit: each
    row draws the softmax's limit, the greedy token, in the compiled step and the interpreter alike;
    a small normal temperature whose quotients stay finite still samples."""
    g = tmp_path / "s.oi"
    g.write_text(SAMPLE_GRAPH)
    prog = oi2jax.compile(str(g), sizes={"V": 8}, ops=["nn"], model=False, mode=mode)
    logits = np.array([-4, 3, 1, 6, 2, -1, 0, 5], np.float32)
    cases = [(logits, 1e-40), (logits, 1e-38), (logits, 1e-37), (np.where(logits == 2, np.inf, logits), 1.0)]
    for x, t in cases:
        got = [int(np.asarray(prog.run({"logits": x, "temperature": np.float32(t), "top_k": np.int32(k),
                                        "seed": np.int32(s)})["next"])) for k in (0, 3) for s in (0, 5)]
        assert got == [int(np.argmax(x))] * 4, (t, got)
    assert int(np.asarray(prog.run({"logits": logits, "temperature": np.float32(1e-30), "top_k": np.int32(0),
                                    "seed": np.int32(0)})["next"])) == 3  # 6e30 and 5e30: finite, still sampled


def test_subnormal_logits_draw_the_same_token_compiled_and_interpreted(tmp_path):
    """XLA:CPU flushes f32 subnormals to zero: logits of 1e-44 are ties in its kernel. XLA:GPU
    and NumPy keep them: they were distinct values there (6 of 30 draws differed between the CPU
    kernel and the interpreter; on an H200 the kernel differed from the interpreter). The draw
    flushes them itself, on every device and in the interpreter."""
    g = tmp_path / "s.oi"
    g.write_text(SAMPLE_GRAPH)
    progs = {mode: oi2jax.compile(str(g), sizes={"V": 8}, ops=["nn"], model=False, mode=mode)
             for mode in ("compiled", "interpret")}
    rng = np.random.default_rng(1)
    for logits in ((rng.standard_normal(8) * 1e-44).astype(np.float32),
                   np.where(np.arange(8) % 3 == 0, rng.standard_normal(8) * 1e-42, rng.standard_normal(8)).astype(np.float32)):
        for t, k in ((1.0, 0), (0.5, 3), (1e10, 5)):
            for seed in range(4):
                inputs = {"logits": logits, "temperature": np.float32(t), "top_k": np.int32(k), "seed": np.int32(seed)}
                got = {mode: int(np.asarray(p.run(inputs)["next"])) for mode, p in progs.items()}
                assert got["compiled"] == got["interpret"], (logits, t, k, seed, got)


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_nan_logits_or_temperature_are_a_runtime_error(tmp_path, mode):
    """A NaN temperature compared as no temperature > 0: it drew greedily, silently."""
    g = tmp_path / "s.oi"
    g.write_text(SAMPLE_GRAPH)
    prog = oi2jax.compile(str(g), sizes={"V": 4}, ops=["nn"], model=False, mode=mode)
    logits = np.array([0, 3, 1, 2], np.float32)
    # each names what is wrong (one message for all four said "(flag 1)": helper probe)
    for bad, message in (({"logits": np.array([0, np.nan, 1, 2], np.float32)}, "sample: a logit is NaN: no token can "
                                                                                 "be drawn (in step 1)"),
                         ({"temperature": np.float32(np.nan)}, "sample: temperature is NaN (in step 1)")):
        with pytest.raises(oi2jax.OiError) as info:
            prog.run({"logits": logits, "temperature": np.float32(1), "top_k": np.int32(0), "seed": np.int32(0),
                      **bad})
        assert info.value.diagnostics[0].message == message
    assert int(np.asarray(prog.run({"logits": logits, "temperature": np.float32(-1), "top_k": np.int32(0),
                                    "seed": np.int32(0)})["next"])) == 1  # temperature <= 0: greedy


def test_a_vmapped_draw_is_each_rows_draw_and_keeps_its_greedy_skip():
    """Under `jax.vmap` (`Program.batch`: one slot per sequence) each row draws what it draws alone
    (greedy rows their argmax beside sampled ones); the greedy test stays one `lax.cond` over the
    batch (vmap's own rule for a cond is a select that runs the sort and the noise of every row
    at every step, greedy or not: 2.8x the batched step's time at B = 8)."""
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((4, 50)).astype(np.float32)
    temps = np.array([0.0, 0.8, 0.0, 1.2], np.float32)
    seeds, positions = np.array([1, 2, 3, 4], np.int32), np.array([7, 7, 9, 11], np.int32)

    def draw(x, t, s, p):
        return sample(x, temperature=t, top_k=np.int32(5), top_p=np.float32(0.9), seed=s, position=p, ctx=_Ctx())
    got = np.asarray(jax.jit(jax.vmap(draw))(rows, temps, seeds, positions))
    want = [int(jax.jit(draw)(rows[i], temps[i], seeds[i], positions[i])) for i in range(4)]
    assert got.tolist() == want and want[0] == int(np.argmax(rows[0])) and want[2] == int(np.argmax(rows[2]))
    jaxpr = jax.make_jaxpr(jax.vmap(draw))(rows, np.zeros(4, np.float32), seeds, positions)
    assert "cond[" in str(jaxpr)  # one branch taken for the whole batch
    assert np.asarray(jax.jit(jax.vmap(draw, in_axes=(0, None, None, 0)))(rows, np.float32(0.8), np.int32(5),
                                                                        positions)).shape == (4,)


def kept_by_sorting(z, top_k, top_p, min_p):
    """The logits each filter keeps (the others -inf), found with a sort as transformers' warpers
    do, in f32, ties at a threshold kept: the rule `sample`'s bit-by-bit searches must give exactly."""
    z = np.array(z, np.float32)
    v = z.size
    if 0 < top_k < v:
        z = np.where(z < np.sort(z)[v - top_k], np.float32(-np.inf), z)
    if top_p < 1:
        asc = np.sort(z)
        e = np.exp(asc - asc[-1])
        cum = np.cumsum(e / np.sum(e))
        first = asc[np.sum(cum[:-1] <= np.float32(1) - np.float32(top_p))]  # the smallest value kept
        z = np.where(z < first, np.float32(-np.inf), z)
    if min_p > 0:
        e = np.exp(z - np.max(z))
        p = e / np.sum(e)
        z = np.where(p < np.float32(min_p) * np.max(p), np.float32(-np.inf), z)
    return z


def test_the_bisected_thresholds_keep_what_a_sort_keeps():
    """top-k's k-th largest and top-p's first kept value are built bit by bit over the ordered f32
    keys (no sort: ops/nn/sampling.py); on rows with ties, -inf, neighbouring floats (a threshold
    one bit off keeps another set) and every kind of setting, the kernel and the NumPy reference
    keep exactly the logits a sort keeps."""
    from oi2jax.ops.nn.sampling import _filter
    rng = np.random.default_rng(3)
    rows, v = 300, 29
    z = np.where(rng.random((rows, v)) < 0.5, rng.integers(-3, 4, (rows, v)),
                 rng.standard_normal((rows, v)) * rng.choice([0.1, 1.0, 5.0], (rows, 1))).astype(np.float32)
    z[rng.random((rows, v)) < 0.1] = -np.inf
    z[:, 0] = np.maximum(z[:, 0], 0)  # a finite logit in every row
    for r in range(0, rows, 3):  # every third row: v neighbouring floats (consecutive bit patterns)
        base = np.float32(rng.choice([-2.5, -0.75, 0.3, 1.0, 7.0])).view(np.int32)
        z[r] = (base + (rng.permutation(v) * rng.choice([1, 2, 3])).astype(np.int32)).view(np.float32)
    top_k = rng.integers(-1, v + 2, rows).astype(np.int32)
    top_p = rng.choice([1.0, 0.999, 0.9, 0.5, 0.1, 1e-6], rows).astype(np.float32)
    min_p = rng.choice([0.0, 0.0, 0.05, 0.5, 1.0], rows).astype(np.float32)
    # on the neighbouring rows a p with 1 - p far from every j/m (m <= v), and no min_p of 1:
    # near-equal probabilities summed in another order, or an exp one ulp apart, must not decide
    top_p[::3] = rng.choice([1.0, 0.5569, 0.1237], len(top_p[::3]))
    min_p[::3] = rng.choice([0.0, 0.05, 0.5], len(min_p[::3]))
    want = np.stack([kept_by_sorting(*row) for row in zip(z, top_k, top_p, min_p)])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(_filter(z, top_k, top_p, min_p, np), want)
    kernel = jax.jit(lambda *a: _filter(*a, jnp))
    np.testing.assert_array_equal(np.asarray(kernel(z, top_k, top_p, min_p)), want)


@pytest.mark.parametrize("seed,position,n", [(0, 0, 7), (7, 5, 49152), (2**31 - 1, 12345, 1000), (-1, 3, 100)])
def test_the_noise_is_jax_randoms_gumbel_bit_for_bit(seed, position, n):
    """gumbel_noise writes threefry out (one fusion, not jax.random's loop): the same bits."""
    from oi2jax.ops.nn.sampling import gumbel_noise
    ours = np.asarray(jax.jit(lambda s, p: gumbel_noise(s, p, n))(jnp.int32(seed), jnp.int32(position)))
    words = jnp.stack([jnp.int32(seed).astype(jnp.uint32), jnp.int32(position).astype(jnp.uint32)])
    theirs = np.asarray(jax.random.gumbel(jax.random.wrap_key_data(words, impl="threefry2x32"), (n,), jnp.float32))
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
