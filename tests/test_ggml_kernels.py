"""kernels="ggml" (oi2jax/quantized/ggml.py): a few rows' quantized `linear` through ggml's own CPU
kernels with jax.ffi, against a NumPy re-derivation of llama.cpp's numerics written here: each row of
x rounded per block to the kind's vec_dot_type (Q8_0 / Q8_1: 32 values, scale max|x| / 127 kept as
f16, Q8_1 with the f16 block sum s; Q8_K: 256 values, scale -max / 127 in f32), then exact integer
sums scaled per block: y = W . x_hat (+ sum over blocks of m (s - d sum q) for Q4_1 / Q5_1), up to
f32 rounding. Everything else a raw-block weight does (more rows, embedding rows, other ops) is the
exact pure-JAX path, bit for bit.

The ggml tests run where ggml's headers and libraries are installed (llama-cpp-python, the
benchmark extra); the option's errors are tested everywhere."""
from __future__ import annotations

import os
import subprocess
import sys

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import oi2jax
from oi2jax import quantized as Q
from oi2jax.diagnostics import OiError
from oi2jax.model.writer import save
from oi2jax.quantized import ggml
from oi2jax.quantized.kernels import FUSED_MAX_ROWS

from conftest import run_cli
from test_quantized import random_blocks

EPS32 = float(np.finfo(np.float32).eps)
VEC_DOT = {"Q8_0": "Q8_0", "Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q4_1": "Q8_1", "Q5_1": "Q8_1",
           "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K"}


def _has_ggml() -> bool:
    try:
        ggml.ensure()
    except OiError:
        return False
    return True


needs_ggml = pytest.mark.skipif(not _has_ggml(), reason="ggml's headers and libraries (pip install "
                                                        "llama-cpp-python) are not installed")


def _x_hat(x, kind):
    """llama.cpp's rounding of the rows x f32 [rows, n] to `kind`'s vec_dot_type -> (x_hat f64 [rows,
    n], per-block (d16, s) for Q8_1 else None): ggml-cpu's x86 quantize_row_q8_0/q8_1 (scale and
    inverse from max|x| in f32, round half to even) and quantize_row_q8_K_ref."""
    rows, n = x.shape
    if VEC_DOT[kind] == "Q8_K":
        xb = x.reshape(rows, n // 256, 256)
        mx = np.take_along_axis(xb, np.abs(xb).argmax(-1)[..., None], -1)[..., 0]
        iscale = np.float32(-127) / mx
        q = np.minimum(127, np.rint(xb * iscale[..., None]))
        d = np.float32(1) / iscale
        return (q * d.astype(np.float64)[..., None]).reshape(rows, n), None
    xb = x.reshape(rows, n // 32, 32)
    amax = np.abs(xb).max(-1)
    d = amax / np.float32(127)
    inv = np.where(amax != 0, np.float32(127) / np.where(amax != 0, amax, 1), np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[..., None])
    d16 = d.astype(np.float16).astype(np.float64)
    s = (d * q.sum(-1).astype(np.float32)).astype(np.float16).astype(np.float64)
    return (q * d16[..., None]).reshape(rows, n), (d16, s, q.sum(-1))


def _mins(raw, kind, out, n):
    """Q4_1 / Q5_1: each weight block's min m (its f16 at bytes 2..3), f64 [out, n / 32]."""
    per, size = Q.block_size(kind)
    blocks = raw.reshape(out, n // per, size)
    return blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)


def _llama_cpp(raw, kind, w, x):
    """(llama.cpp's y [rows, out] in f64, the f32 rounding bound [rows, out])."""
    x_hat, q8_1 = _x_hat(x, kind)
    y = x_hat @ w.astype(np.float64).T
    size = np.abs(x_hat) @ np.abs(w.astype(np.float64)).T
    if q8_1 is not None and kind in ("Q4_1", "Q5_1"):  # m x s, where s is the f16 block sum, not d16 x sum q
        d16, s, qsum = q8_1
        m = _mins(raw, kind, w.shape[0], w.shape[1])
        y += (s - d16 * qsum) @ m.T
        size += np.abs(s) @ np.abs(m).T
    return y, 4 * w.shape[1] * EPS32 * size


def _weight(kind, out=24, blocks=2, seed=0):
    rng = np.random.default_rng(seed)
    raw = random_blocks(rng, kind, out, blocks)
    shape = (out, blocks * Q.block_size(kind)[0])
    return raw, shape, gguf.quants.dequantize(raw, T[kind])


@needs_ggml
@pytest.mark.parametrize("kind", Q.KINDS)
@pytest.mark.parametrize("rows", [1, 3])
def test_ggml_linear_is_llama_cpps_arithmetic(kind, rows):
    raw, shape, w = _weight(kind)
    x = np.random.default_rng(1).standard_normal((rows, shape[1])).astype(np.float32)
    got = np.asarray(jax.jit(Q.linear)(jnp.asarray(x if rows > 1 else x[0]), Q.raw_tensor(kind, raw, shape)))
    want, bound = _llama_cpp(raw, kind, w, x)
    assert got.shape == ((rows, shape[0]) if rows > 1 else (shape[0],))
    err = np.abs(got.reshape(rows, -1) - want)
    assert np.all(err <= bound), (kind, float((err / bound).max()))
    # not the exact product of x: llama.cpp rounds x to 8 bits (what kernels="ggml" documents)
    assert not np.allclose(got.reshape(rows, -1), x.astype(np.float64) @ w.astype(np.float64).T, rtol=1e-5, atol=0)


@needs_ggml
def test_a_large_product_splits_its_rows_over_the_pool_with_the_same_values():
    """Two rows of a 17 MB Q8_0 weight (past the handler's 32 MB of row work: rows split over XLA's
    thread pool) equal each row's own product (one row: shared with the spinning helper threads
    where the machine has more than one CPU) bit for bit, and llama.cpp's."""
    raw, shape, w = _weight("Q8_0", out=4096, blocks=128, seed=9)
    q = jax.device_put(Q.raw_tensor("Q8_0", raw, shape))
    xs = np.random.default_rng(10).standard_normal((2, shape[1])).astype(np.float32)
    both = np.asarray(jax.jit(Q.linear)(jnp.asarray(xs), q))
    alone = np.stack([np.asarray(jax.jit(Q.linear)(jnp.asarray(r), q)) for r in xs])
    np.testing.assert_array_equal(both, alone)
    want, bound = _llama_cpp(raw, "Q8_0", w, xs)
    assert np.all(np.abs(both - want) <= bound)


@needs_ggml
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_helper_threads_share_a_product_with_the_same_values(kind):
    """A decode step's product (one row, 40-68 KB of weight bytes: past the handler's 32 KB) shared
    with 0, 1 and 3 spinning helper threads (`Oi2jaxGgmlSetThreads`, what OI2JAX_GGML_THREADS sets)
    is the same bit for bit, over repeated calls: each output row is one thread's row dot product,
    whoever computes it; and llama.cpp's."""
    import ctypes
    lib = ctypes.CDLL(str(ggml.build()))  # the loaded handler (dlopen returns the same library)
    raw, shape, w = _weight(kind, out=1000, blocks=2, seed=21)
    q = jax.device_put(Q.raw_tensor(kind, raw, shape))
    x = np.random.default_rng(22).standard_normal((1, shape[1])).astype(np.float32)
    fn = jax.jit(Q.linear)
    got = {}
    try:
        for n in (1, 2, 4):
            lib.Oi2jaxGgmlSetThreads(ctypes.c_int(n))
            assert lib.Oi2jaxGgmlHelpers() == n - 1
            got[n] = [np.asarray(fn(jnp.asarray(x), q)) for _ in range(20)]
    finally:
        lib.Oi2jaxGgmlSetThreads(ctypes.c_int(ggml.threads()))
    for n, ys in got.items():
        for y in ys:
            np.testing.assert_array_equal(y, got[1][0])
    want, bound = _llama_cpp(raw, kind, w, x)
    assert np.all(np.abs(got[1][0] - want) <= bound)


@needs_ggml
def test_ggml_attention_in_chunks_is_the_same_whoever_runs_them():
    """A long decode row's attention (n = 333 rows: 6 chunks of 64 positions, each chunk's softmax
    against its own max, merged in chunk order) shared with 0, 1 and 3 helper threads is the same bit
    for bit over repeated calls, and within the f32 rounding bound of the float64 reference (a
    window of 200 rows too)."""
    import ctypes
    from oi2jax.ops import apply, load
    lib = ctypes.CDLL(str(ggml.build()))
    attention = {d.name: d for d in load(["nn"]).added()}["attention"]
    rng = np.random.default_rng(31)
    k = rng.standard_normal((2, 400, 3, 64)).astype(np.float16)
    v = rng.standard_normal((2, 400, 3, 64)).astype(np.float16)
    q = (2 * rng.standard_normal((1, 3, 3, 64))).astype(np.float32)
    for window in (None, 200):
        attrs = {"layer": np.int32(1), "valid": np.int32(333), "scale": 0.125}
        if window is not None:
            attrs["window"] = np.int32(window)
        fn = jax.jit(lambda q: apply(attention, [q, k, v], attrs, in_dtypes=["f32", "f16", "f16"], out_dtype="f32",
                                     mode="normal", guards=[], kernels="ggml"))
        got = {}
        try:
            for n in (1, 2, 4):
                lib.Oi2jaxGgmlSetThreads(ctypes.c_int(n))
                got[n] = [np.asarray(fn(q)) for _ in range(10)]
        finally:
            lib.Oi2jaxGgmlSetThreads(ctypes.c_int(ggml.threads()))
        for ys in got.values():
            for y in ys:
                np.testing.assert_array_equal(y, got[1][0])
        lo = 0 if window is None else 333 - window
        want, bound = _attention_ggml_ref(q[0], k[1].astype(np.float32), v[1].astype(np.float32), np.float16, 333,
                                          lo, 0.125)
        assert np.all(np.abs(got[1][0][0] - want) <= bound), np.abs(got[1][0][0] - want).max()


def test_ggml_threads_come_from_the_environment_or_the_cpus():
    """OI2JAX_GGML_THREADS: a positive integer, else an error naming the variable (never ignored);
    unset or empty: the CPUs this process may run on."""
    assert ggml.threads({"OI2JAX_GGML_THREADS": "3"}) == 3
    assert ggml.threads({"OI2JAX_GGML_THREADS": " 1 "}) == 1
    assert ggml.threads({}) == len(os.sched_getaffinity(0)) >= 1
    assert ggml.threads({"OI2JAX_GGML_THREADS": ""}) == ggml.threads({})
    for bad in ("0", "-2", "two", "1.5", "2000"):
        with pytest.raises(OiError, match=r"OI2JAX_GGML_THREADS='.*': expected the number of threads"):
            ggml.threads({"OI2JAX_GGML_THREADS": bad})


@needs_ggml
def test_ggml_linear_under_vmap_is_each_row_alone():
    raw, shape, w = _weight("Q4_1")
    q = Q.raw_tensor("Q4_1", raw, shape)
    xs = np.random.default_rng(2).standard_normal((5, shape[1])).astype(np.float32)
    batched = np.asarray(jax.jit(jax.vmap(Q.linear, in_axes=(0, None)))(jnp.asarray(xs), q))
    alone = np.stack([np.asarray(jax.jit(Q.linear)(jnp.asarray(r), q)) for r in xs])
    np.testing.assert_array_equal(batched, alone)


@needs_ggml
@pytest.mark.parametrize("kind", ["Q4_1", "Q4_K"])
def test_raw_blocks_elsewhere_are_the_exact_kernels_bit_for_bit(kind):
    """More rows than FUSED_MAX_ROWS (a prompt step) and embedding rows dequantize the raw blocks
    exactly as the prepared fields do."""
    raw, shape, w = _weight(kind)
    raw_q, prepared = Q.raw_tensor(kind, raw, shape), Q.prepare(kind, raw, shape)
    xs = jnp.asarray(np.random.default_rng(3).standard_normal((FUSED_MAX_ROWS + 4, shape[1])).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(jax.jit(Q.linear)(xs, raw_q)), np.asarray(jax.jit(Q.linear)(xs, prepared)))
    ids = jnp.asarray([0, 5, 23, 5], jnp.int32)
    np.testing.assert_array_equal(np.asarray(jax.jit(Q.embedding)(raw_q, ids)), w[np.asarray(ids)])
    np.testing.assert_array_equal(np.asarray(Q.dequantize_prepared(raw_q)), w)


GRAPH = """dynamic {
    x: f32[I];
    ids: i32[2];
}
constant {
    W: f32[O, I];
}
volatile {
    y: f32[O];
    e: f32[2, I];
}
block entry {
    op linear(x, W) >> y;
    op embedding(W, ids) >> e;
}
"""


@pytest.fixture(scope="module")
def kept_model(tmp_path_factory):
    raw, shape, w = _weight("Q8_0", out=16, blocks=4, seed=5)
    path = tmp_path_factory.mktemp("ggml") / "m.oinf"
    save(path, sizevars={"O": shape[0], "I": shape[1]}, metadata={"ggml_type.W": "Q8_0"}, tensors={"W": raw})
    (path.parent / "g.oi").write_text(GRAPH)
    return path, raw, shape, w


@needs_ggml
def test_a_program_with_ggml_kernels_holds_the_raw_blocks_and_computes_llama_cpps_product(kept_model):
    path, raw, shape, w = kept_model
    program = oi2jax.compile(GRAPH, model=path, ops=["nn"], kernels="ggml")
    consts = program.executable.consts
    assert Q.is_raw(consts["W"]) and consts["W"].nbytes == raw.nbytes  # GGUF's bytes, nothing added
    x = np.random.default_rng(6).standard_normal(shape[1]).astype(np.float32)
    out = program.run({"x": x, "ids": np.array([3, 15], np.int32)})
    want, bound = _llama_cpp(raw, "Q8_0", w, x[None])
    assert np.all(np.abs(out["y"] - want[0]) <= bound[0])
    np.testing.assert_array_equal(out["e"], w[[3, 15]])
    exact = oi2jax.compile(GRAPH, model=path, ops=["nn"]).run({"x": x, "ids": np.array([3, 15], np.int32)})
    assert not Q.is_raw(oi2jax.compile(GRAPH, model=path, ops=["nn"]).executable.consts["W"])
    np.testing.assert_array_equal(exact["e"], out["e"])


@needs_ggml
def test_the_cli_takes_kernels_ggml(kept_model, tmp_path, capsys):
    path, raw, shape, w = kept_model
    x = np.random.default_rng(7).standard_normal(shape[1]).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "ids.npy", np.array([0, 1], np.int32))
    code, _, err = run_cli(capsys, "run", path.parent / "g.oi", "--model", path, "--ops", "nn", "--kernels", "ggml",
                           "--input", f"x={tmp_path / 'x.npy'}", "--input", f"ids={tmp_path / 'ids.npy'}",
                           "--out", tmp_path / "o.npz", "--quiet")
    assert code == 0, err
    want, bound = _llama_cpp(raw, "Q8_0", w, x[None])
    assert np.all(np.abs(np.load(tmp_path / "o.npz")["y"] - want[0]) <= bound[0])


def test_kernels_errors_name_the_choice(kept_model, monkeypatch, tmp_path):
    path, *_ = kept_model
    with pytest.raises(OiError, match=r"unknown kernels 'fast' \(expected one of jax, ggml\)"):
        oi2jax.compile(GRAPH, model=path, ops=["nn"], kernels="fast")
    with pytest.raises(OiError, match="kernels='ggml' applies to compiled programs"):
        oi2jax.compile(GRAPH, model=path, ops=["nn"], kernels="ggml", mode="interpret")
    with pytest.raises(OiError, match="cannot be combined with mesh"):
        oi2jax.compile(GRAPH, model=path, ops=["nn"], kernels="ggml", mesh="data=1", shard={"O": "data"})
    monkeypatch.setenv("OI2JAX_GGML_DIR", str(tmp_path))  # no ggml there: said, with what is missing
    with pytest.raises(OiError, match=r"kernels='ggml': OI2JAX_GGML_DIR=.* lacks .*ggml\.h"):
        ggml.ggml_dirs()
    # a fresh process (this one may have registered ggml's handler already): one line, exit 1
    r = subprocess.run([sys.executable, "-m", "oi2jax", "run", str(path.parent / "g.oi"), "--model", str(path),
                        "--ops", "nn", "--kernels", "ggml", "--quiet"], capture_output=True, text=True,
                       env={**os.environ, "OI2JAX_GGML_DIR": str(tmp_path), "JAX_PLATFORMS": "cpu"})  # ggml's device
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("error: kernels='ggml': OI2JAX_GGML_DIR="), r.stderr


def test_the_handler_builds_atomically_into_the_cache(monkeypatch, tmp_path):
    """A failed compile leaves nothing behind in the cache (no partial library), and says why."""
    try:
        ggml.ggml_dirs()
    except OiError:
        pytest.skip("no ggml to build against")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a compiler that fails
    with pytest.raises(OiError, match="building ggml_matvec.cc failed"):
        ggml.build()
    assert [p.name for p in (tmp_path / "oi2jax" / "ggml").iterdir()] == []


def test_kernels_ggml_without_quantized_weights_is_an_error_not_ignored(tmp_path):
    """Nothing for ggml to multiply: said, rather than a flag that silently changes nothing."""
    path = tmp_path / "f32.oinf"
    save(path, sizevars={"O": 4, "I": 32}, tensors={"W": np.ones((4, 32), np.float32)})
    with pytest.raises(OiError, match=r"kernels='ggml' multiplies weights kept in GGML blocks or widened bf16/f16 "
                                      r"weights, and .*f32\.oinf has none: nothing would change"):
        oi2jax.compile(GRAPH.replace("    op embedding(W, ids) >> e;\n", ""), model=path, ops=["nn"], kernels="ggml",
                       device=jax.devices("cpu")[0])  # ggml's kernels run on the CPU (elsewhere: that error)


HALF_GRAPH = """
dynamic { x: f32[I]; xs: f32[R, I]; ids: i32[2]; }
constant { W: f32[O, I]; }
volatile { y: f32[O]; ys: f32[R, O]; e: f32[2, I]; }
block entry {
    op linear(x, W) >> y;
    op linear(xs, W) >> ys;
    op embedding(W, ids) >> e;
}
"""


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_bytes_read_back_as_their_exact_values(dtype):
    """A bf16 / f16 matrix held as its bytes (types BF16 / F16, one value a block): dequantized
    and gathered as rows, its exact f32 values."""
    w = np.random.default_rng(13).standard_normal((6, 10)).astype(dtype)
    q = Q.raw_tensor(dtype.replace("bfloat16", "BF16").replace("float16", "F16"), w.view(np.uint8), w.shape)
    np.testing.assert_array_equal(np.asarray(jax.jit(Q.dequantize_prepared)(q)), w.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(jax.jit(Q.embedding)(q, jnp.array([4, 0]))), w[[4, 0]].astype(np.float32))


@needs_ggml
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_widened_half_model_with_ggml_kernels_holds_its_bytes(dtype, tmp_path):
    """kernels="ggml" on an f32 graph over a bf16 / f16 model (widen_floats): the matrix is held
    as its own bytes, not widened (half the memory); a few rows' `linear` is ggml's row dot
    product (x rounded to the weight's type, as llama.cpp: within f32 rounding of that product);
    many rows (a prompt step) and embedding rows read its exact values, as the widened program."""
    rng = np.random.default_rng(14)
    w = rng.standard_normal((24, 64)).astype(dtype)
    path = tmp_path / "half.oinf"
    save(path, sizevars={"O": 24, "I": 64, "R": FUSED_MAX_ROWS + 1}, tensors={"W": w})
    inputs = {"x": rng.standard_normal(64).astype(np.float32),
              "xs": rng.standard_normal((FUSED_MAX_ROWS + 1, 64)).astype(np.float32), "ids": np.array([5, 0], np.int32)}
    program = oi2jax.compile(HALF_GRAPH, model=path, ops=["nn"], kernels="ggml", widen_floats=True)
    held = program.executable.consts["W"]
    assert Q.is_raw(held) and held.nbytes == w.nbytes
    out = program.run(inputs)
    w64 = w.astype(np.float64)
    x_hat = inputs["x"].astype(dtype).astype(np.float64)
    bound = 4 * 64 * EPS32 * (np.abs(x_hat) @ np.abs(w64).T)
    assert np.all(np.abs(out["y"] - w64 @ x_hat) <= bound)
    np.testing.assert_array_equal(out["e"], w[[5, 0]].astype(np.float32))
    widened = oi2jax.compile(HALF_GRAPH, model=path, ops=["nn"], widen_floats=True).run(inputs)
    xs = inputs["xs"].astype(np.float64)
    assert np.all(np.abs(out["ys"] - xs @ w64.T) <= 4 * 64 * EPS32 * (np.abs(xs) @ np.abs(w64).T))
    assert np.all(np.abs(widened["ys"] - xs @ w64.T) <= 4 * 64 * EPS32 * (np.abs(xs) @ np.abs(w64).T))


# ------------------------------------------------------------------ attention under kernels="ggml"


def _attention_ggml_ref(q, k, v, dtype, n, lo=0, scale=1.0):
    """What the handler computes, in float64: q [KVH, G, HD] rounded to the table's dtype (llama.cpp's
    vec_dot_type), the scores of rows lo..n-1 of k [T, KVH, HD], their softmax, times v -> (out
    [KVH, G, HD], a bound on its f32 rounding: the scores' dot products (HD terms), the exp and the
    softmax's sum over the rows, the weighted sum of the V rows, each a few f32 ulps)."""
    qh = q.astype(dtype).astype(np.float64)
    k64, v64 = k[lo:n].astype(np.float64), v[lo:n].astype(np.float64)
    s = np.einsum("kgd,tkd->kgt", qh, k64) * scale
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    out = np.einsum("kgt,tkd->kgd", p, v64)
    hd, rows = q.shape[-1], n - lo
    dot_err = (hd + 2) * EPS32 * np.einsum("kgd,tkd->kgt", np.abs(qh), np.abs(k64)) * abs(scale)
    weight_err = p * (2 * dot_err.max(-1, keepdims=True) + (rows + 4) * EPS32)  # exp(s - max), the sum
    bound = np.einsum("kgt,tkd->kgd", weight_err, np.abs(v64)) + (rows + 2) * EPS32 * np.einsum(
        "kgt,tkd->kgd", p, np.abs(v64))
    return out, bound


@needs_ggml
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kvh,g,hd", [(2, 3, 16), (3, 3, 64), (1, 5, 128), (2, 1, 64)])
def test_ggml_attention_is_llama_cpps_arithmetic(dtype, kvh, g, hd):
    """The nn op `attention` of one query row under kernels="ggml": the handler's result against the
    float64 reference of q rounded to the table's dtype, within the f32 rounding bound; a stacked
    [L, T, KVH, HD] table at a layer, windows, fill counts on and off the handler's blocks of 8 and 32
    positions, q [KVH, HD], one row of S [1, KVH, G, HD]; S > 1 rows and softcap take the pure-JAX path (its own
    result, bit for bit).
    HD 16 takes the handler's plain loop; HD a multiple of 64 its AVX2 form on such CPUs, with G
    query heads per KV head in groups of 3 (G=5: a group of 3 and one of 2)."""
    from oi2jax.ops import apply, load
    attention = {d.name: d for d in load(["nn"]).added()}["attention"]
    np_dtype = {"f32": np.float32, "f16": np.float16, "bf16": jnp.bfloat16}[dtype]
    rng = np.random.default_rng(11)
    L, T, KVH, G, HD = 3, 80, kvh, g, hd
    k = rng.standard_normal((L, T, KVH, HD)).astype(np_dtype)
    v = rng.standard_normal((L, T, KVH, HD)).astype(np_dtype)
    q = rng.standard_normal((KVH, G, HD)).astype(np.float32)

    def run(q, kernels, **attrs):
        fn = jax.jit(lambda q, k, v: apply(attention, [q, k, v], attrs, in_dtypes=["f32", dtype, dtype],
                                           out_dtype="f32", mode="normal", guards=[], kernels=kernels))
        text = fn.lower(q, k, v).as_text()
        return np.asarray(fn(q, k, v)), "oi2jax_ggml_attention" in text
    for layer, n, window in ((1, 29, None), (2, 40, 7), (0, 1, None), (2, 80, 67), (1, 70, None)):
        attrs = {"layer": np.int32(layer), "valid": np.int32(n), "scale": 0.25}
        if window is not None:
            attrs["window"] = np.int32(window)
        got, called = run(q, "ggml", **attrs)
        assert called
        lo = 0 if window is None else max(n - window, 0)
        want, bound = _attention_ggml_ref(q, k[layer].astype(np.float32), v[layer].astype(np.float32),
                                          np_dtype, n, lo, 0.25)
        assert np.all(np.abs(got - want) <= bound), (layer, n, window, np.abs(got - want).max(), bound.min())
        if dtype != "f32" and n - lo > 1:  # llama.cpp's arithmetic, not the exact one: q is rounded first
            exact, _ = run(q, "jax", **attrs)
            assert not np.array_equal(exact, got)
        one_row, called = run(q[None], "ggml", **attrs)  # S=1 rows [1, KVH, G, HD]: a decode step's q
        assert called and np.array_equal(one_row, got[None])
    got, _ = run(q[:, 0, :], "ggml", layer=np.int32(1), valid=np.int32(29), scale=0.25)
    want, bound = _attention_ggml_ref(q[:, :1, :], k[1].astype(np.float32), v[1].astype(np.float32), np_dtype,
                                      29, 0, 0.25)
    assert got.shape == (KVH, HD) and np.all(np.abs(got - want[:, 0, :]) <= bound[:, 0, :])
    for attrs in ({"layer": np.int32(1), "valid": np.int32(29), "softcap": np.float32(5.0)},):
        got, called = run(q, "ggml", **attrs)
        exact, _ = run(q, "jax", **attrs)
        assert not called and np.array_equal(got, exact)
    rows = rng.standard_normal((4, KVH, G, HD)).astype(np.float32)  # S > 1 rows: the pure-JAX loop
    got, called = run(rows, "ggml", layer=np.int32(1), valid=np.arange(26, 30, dtype=np.int32))
    exact, _ = run(rows, "jax", layer=np.int32(1), valid=np.arange(26, 30, dtype=np.int32))
    assert not called and np.array_equal(got, exact)


@needs_ggml
def test_ggml_attention_under_vmap_is_each_row_alone():
    """A batch's slots (`Program.batch` vmaps the step): one handler call for the batch (a table
    shared by the rows), each row equal to that row's call alone, bit for bit."""
    from oi2jax.ops import apply, load
    attention = {d.name: d for d in load(["nn"]).added()}["attention"]
    rng = np.random.default_rng(12)
    k = rng.standard_normal((3, 24, 2, 8)).astype(np.float16)
    v = rng.standard_normal((3, 24, 2, 8)).astype(np.float16)
    q = rng.standard_normal((4, 2, 2, 8)).astype(np.float32)
    n = np.array([3, 24, 11, 1], np.int32)

    def one(q, n):
        return apply(attention, [q, k, v], {"layer": np.int32(2), "valid": n}, in_dtypes=["f32", "f16", "f16"],
                     out_dtype="f32", mode="normal", guards=[], kernels="ggml")
    batched = np.asarray(jax.jit(jax.vmap(one))(q, n))
    for i in range(4):
        np.testing.assert_array_equal(batched[i], np.asarray(jax.jit(one)(q[i], n[i])))


@needs_ggml
def test_ggml_attention_reads_each_slots_own_table_under_vmap():
    """`Program.batch`'s slots each hold their own K/V tables: under jax.vmap the handler takes the
    batch in one call (vmap_method="expand_dims") and each row reads its slot's table in place,
    bit for bit that slot's call alone; under two vmaps too (slots x the rows of a slot, a table
    shared by the inner rows: an axis of 1 broadcast), with a single table [T, KVH, HD]."""
    from oi2jax.ops import apply, load
    attention = {d.name: d for d in load(["nn"]).added()}["attention"]
    rng = np.random.default_rng(13)
    k = rng.standard_normal((4, 3, 40, 3, 64)).astype(np.float16)  # [B, L, T, KVH, HD]: a table per slot
    v = rng.standard_normal((4, 3, 40, 3, 64)).astype(np.float16)
    q = rng.standard_normal((4, 3, 2, 64)).astype(np.float32)
    n = np.array([3, 40, 11, 1], np.int32)

    def one(q, k, v, n, layer=np.int32(1)):
        return apply(attention, [q, k, v], {"layer": layer, "valid": n}, in_dtypes=["f32", "f16", "f16"],
                     out_dtype="f32", mode="normal", guards=[], kernels="ggml")
    batched = np.asarray(jax.jit(jax.vmap(one))(q, k, v, n))
    for i in range(4):
        alone = np.asarray(jax.jit(one)(q[i], k[i], v[i], n[i]))
        np.testing.assert_array_equal(batched[i], alone)
        assert np.isfinite(alone).all()
    # two vmaps: 4 slots x 2 rows; the tables and layer per slot, the rows' own q and fill counts
    q2 = rng.standard_normal((4, 2, 3, 2, 64)).astype(np.float32)
    n2 = np.array([[3, 7], [40, 1], [11, 12], [1, 2]], np.int32)
    single = lambda q, k, v, n: one(q, k[1], v[1], n, None)  # a slot's single table [T, KVH, HD]
    inner = jax.vmap(single, in_axes=(0, None, None, 0))
    got = np.asarray(jax.jit(jax.vmap(inner))(q2, k, v, n2))
    for i in range(4):
        for j in range(2):
            np.testing.assert_array_equal(got[i, j], np.asarray(jax.jit(single)(q2[i, j], k[i], v[i], n2[i, j])))


@needs_ggml
def test_a_batch_with_ggml_kernels_gives_each_prompt_its_solo_tokens(tmp_path):
    """`generate --batch` with kernels="ggml" on a kept-Q8_0 Llama (head dim 64: the handler's AVX2
    attention where the machine has it) and an f16 KV cache: prompts of different lengths decode
    side by side in 2 slots, each at its own position, a finished slot taking the next prompt; every
    product and decode row's attention takes the batch's rows in one handler call, each slot
    reading its own K/V table. Each prompt's tokens equal its solo generation's."""
    from oi2jax.batch_generate import generate_batch
    from oi2jax.generation import Generator
    from oi2jax.model.convert import convert_hf
    from test_gguf import ex
    ck = ex.write_random_llama(tmp_path / "ck", vocab=96, hidden=128, layers=2, heads=2, kv_heads=1,
                               intermediate=128, max_positions=64, seed=7, std=0.3)
    convert_hf(ck, tmp_path / "q8.oinf", quantize="q8_0")
    gen = Generator(tmp_path / "q8.oinf", kernels="ggml", kv_dtype="f16")
    prompts = [[5, 6, 7], list(range(3, 22)), [9], [40, 41, 42, 43, 44]]
    solo = [gen.generate(prompt_ids=p, max_tokens=7, ignore_eos=True).ids for p in prompts]
    programs = gen.programs_for({"temperature": 0.0})
    results = generate_batch(programs[1], prompts, programs=programs, size=2, max_tokens=7)
    assert [r.tokens for r in results] == solo and all(r.finish == "length" for r in results)
    assert len({tuple(t) for t in solo}) > 1  # the prompts' continuations differ
