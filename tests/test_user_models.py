"""Models no example covers, written from the docs by the user probe (2026-11-28): a diagonal
state-space stack whose state lives in a per-layer table, run over a prompt by a loop with a
run-time trip count (the token of iteration t picked by `embedding` at a counter), and a top-2 of
4 experts chosen by `branch` inside a loop. Compiled and interpreted, against NumPy in float64."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax

SSM = """
dynamic { tokens: i32[T]; n: i32 @init(1); }
constant {
    E: f32[V, D];
    Win(l): f32[N, D] @pattern("layers.{l}.in");
    Wg(l): f32[N, D] @pattern("layers.{l}.gate");
    A(l): f32[N] @pattern("layers.{l}.a");
    Wout(l): f32[D, N] @pattern("layers.{l}.out");
    head: f32[V, D];
}
persistent { S(l): f32[N] @table @fixed(l=L); pos: i32 @init(0); }
volatile {
    x: f32[D]; u: f32[N]; g: f32[N]; decay: f32[N]; s: f32[N]; y: f32[D];
    logits: f32[V]; tok: i32; ti: i32;
}
block entry {
    loop toks (t in 0..n) {
        op embedding(tokens, ti) >> tok;
        op embedding(E, tok) >> x;
        loop layers (l in 0..L) {
            op linear(x, Win[l]) >> u;
            op linear(x, Wg[l]) >> g;
            op silu(g) >> g;
            op sigmoid(A[l]) >> decay;
            cache.read S[l] >> s;
            op mul(s, decay) >> s;
            op add(s, u) >> s;
            cache.write s >> S[l];
            op mul(s, g) >> u;
            op linear(u, Wout[l]) >> y;
            op add(x, y) >> x;
        }
        op add(ti, 1) >> ti;
        cache.increment pos;
    }
    op linear(x, head) >> logits;
    return;
}
"""

MOE = """
dynamic { x: f32[D]; }
constant { Wg: f32[E, D]; W1(e): f32[F, D] @pattern("experts.{e}.w1"); W2(e): f32[D, F] @pattern("experts.{e}.w2"); }
volatile {
    logits: f32[E]; iota: i32[E]; d: i32[E]; df: f32[E]; d2f: f32[E]; neg: f32[E] @init(-1e30);
    masked: f32[E]; gl: f32[E]; gates: f32[E]; i1: i32; i2: i32; zero: i32; ei: i32; ge: f32; zf: f32;
    sel: bool; h: f32[F]; ye: f32[D]; y: f32[D]; used: i32; w1: f32[F, D]; w2: f32[D, F];
}
block entry {
    op linear(x, Wg) >> logits;
    op argmax(logits) >> i1;
    op positions(zero, shape=[E]) >> iota;
    op sub(iota, i1) >> d;
    op cast(d, to=f32) >> df;
    op filter(logits, neg, df) >> masked;
    op argmax(masked) >> i2;
    op sub(iota, i2) >> d;
    op cast(d, to=f32) >> d2f;
    op mul(df, d2f) >> d2f;
    op filter(neg, logits, d2f) >> gl;
    op softmax(gl) >> gates;
    transfer x >> y;
    loop experts (e in 0..E) {
        op embedding(gates, ei) >> ge;
        op gt(ge, zf) >> sel;
        transfer W1[e] >> w1;
        transfer W2[e] >> w2;
        branch sel run skip;
        op add(ei, 1) >> ei;
    }
    return;
}
block run {
    op linear(x, w1) >> h;
    op gelu(h) >> h;
    op linear(h, w2) >> ye;
    op mul(ye, ge) >> ye;
    op add(y, ye) >> y;
    op add(used, 1) >> used;
    return;
}
block skip { return; }
"""

# the same layer with the router ops: the top K experts' indices, their logits, their weights
# gathered from [E, ...] tables by `embedding`, all K experts in one einsum each
MOE_TOP_K = """
dynamic { x: f32[D]; }
constant { Wg: f32[E, D]; W1: f32[E, F, D]; W2: f32[E, D, F]; }
volatile {
    logits: f32[E]; top: i32[K]; top_logits: f32[K]; gates: f32[K];
    w1: f32[K, F, D]; w2: f32[K, D, F]; h: f32[K, F]; ye: f32[K, D]; y: f32[D];
}
block entry {
    op linear(x, Wg) >> logits;
    op top_k(logits, k=K) >> top;
    op take_along(logits, top) >> top_logits;
    op softmax(top_logits) >> gates;
    op embedding(W1, top) >> w1;
    op embedding(W2, top) >> w2;
    op einsum(w1, x, spec="kfd,d->kf") >> h;
    op gelu(h) >> h;
    op einsum(w2, h, spec="kdf,kf->kd") >> ye;
    op einsum(gates, ye, spec="k,kd->d") >> y;
    op add(y, x) >> y;
    return;
}
"""


def _sig(v):
    return 1 / (1 + np.exp(-v))


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_state_space_prompt_loop(tmp_path, mode):
    rng = np.random.default_rng(0)
    V, D, N, L, T = 11, 8, 6, 3, 8
    t = {"E": rng.standard_normal((V, D)), "head": rng.standard_normal((V, D))}
    for l in range(L):
        t[f"layers.{l}.in"] = 0.5 * rng.standard_normal((N, D))
        t[f"layers.{l}.gate"] = 0.5 * rng.standard_normal((N, D))
        t[f"layers.{l}.a"] = rng.standard_normal(N)
        t[f"layers.{l}.out"] = 0.5 * rng.standard_normal((D, N))
    t = {k: v.astype(np.float32) for k, v in t.items()}
    oi2jax.model.save(tmp_path / "m.oinf", sizevars={"V": V, "D": D, "N": N, "L": L, "T": T}, tensors=t)
    W = {k: v.astype(np.float64) for k, v in t.items()}
    tokens = np.array([1, 5, 9, 2, 7, 0, 0, 0], np.int32)
    prog = oi2jax.compile(SSM, model=str(tmp_path / "m.oinf"), ops=["nn"], mode=mode)
    for n in (5, 8, 0):
        S = np.zeros((L, N))
        x = np.zeros(D)
        for tok in tokens[:n]:
            x = W["E"][tok].copy()
            for l in range(L):
                g = W[f"layers.{l}.gate"] @ x
                S[l] = S[l] * _sig(W[f"layers.{l}.a"]) + W[f"layers.{l}.in"] @ x
                x = x + W[f"layers.{l}.out"] @ (S[l] * g * _sig(g))
        out = prog.run({"tokens": tokens, "n": np.int32(n)}, steps=1)
        assert int(out["pos"]) == n
        np.testing.assert_allclose(out["S"], S, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["logits"], W["head"] @ x, rtol=1e-5, atol=1e-5)


def _experts(D=8, F=16, E=4):
    """A router [E, D] and E experts' GELU MLPs (w1 [F, D], w2 [D, F]), f32."""
    rng = np.random.default_rng(1)
    return (rng.standard_normal((E, D)).astype(np.float32), (0.4 * rng.standard_normal((E, F, D))).astype(np.float32),
            (0.4 * rng.standard_normal((E, D, F))).astype(np.float32), rng.standard_normal((6, D)).astype(np.float32))


def _top2_layer(wg, w1, w2, x):
    """NumPy, float64: the two experts of the largest router logits (ties: the lower expert), their
    softmax weights, x + the weighted experts' outputs -> (experts, y)."""
    from scipy.special import erf
    wg, w1, w2, x = (a.astype(np.float64) for a in (wg, w1, w2, x))
    lg = wg @ x
    top = np.argsort(-lg, kind="stable")[:2]
    g = np.exp(lg[top] - lg[top].max())
    g /= g.sum()
    y = x.copy()
    for gi, e in zip(g, top):
        h = w1[e] @ x
        y += gi * (w2[e] @ (0.5 * h * (1 + erf(h / np.sqrt(2)))))
    return top.tolist(), y


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_top2_of_4_experts_by_branch_in_a_loop(tmp_path, mode):
    wg, w1, w2, xs = _experts()
    t = {"Wg": wg, **{f"experts.{e}.w1": w1[e] for e in range(4)}, **{f"experts.{e}.w2": w2[e] for e in range(4)}}
    oi2jax.model.save(tmp_path / "m.oinf", sizevars={"D": 8, "F": 16, "E": 4}, tensors=t)
    prog = oi2jax.compile(MOE, model=str(tmp_path / "m.oinf"), ops=["nn"], mode=mode)
    res = prog.run({"x": xs}, collect=("y", "used", "i1", "i2"))
    for k, x in enumerate(xs):
        top, y = _top2_layer(wg, w1, w2, x)
        assert [int(res["i1"][k]), int(res["i2"][k])] == top
        assert int(res["used"][k]) == 2
        np.testing.assert_allclose(res["y"][k], y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_top2_of_4_experts_with_the_router_ops(tmp_path, mode):
    """top_k, take_along and embedding over stacked expert weights: the loop-and-branch layer above
    in 11 nodes, the same values (a tie between two logits goes to the lower expert)."""
    wg, w1, w2, xs = _experts()
    xs[5] = 0.0  # every logit 0: experts 0 and 1
    oi2jax.model.save(tmp_path / "m.oinf", sizevars={"D": 8, "F": 16, "E": 4, "K": 2},
                      tensors={"Wg": wg, "W1": w1, "W2": w2})
    prog = oi2jax.compile(MOE_TOP_K, model=str(tmp_path / "m.oinf"), ops=["nn"], mode=mode)
    res = prog.run({"x": xs}, collect=("y", "top"))
    for k, x in enumerate(xs):
        top, y = _top2_layer(wg, w1, w2, x)
        assert res["top"][k].tolist() == top
        np.testing.assert_allclose(res["y"][k], y, rtol=1e-5, atol=1e-5)
