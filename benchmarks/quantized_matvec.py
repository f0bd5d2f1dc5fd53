"""Quantized matrix-vector products on XLA's CPU backend (issue 42, item 2):
`python -m benchmarks.quantized_matvec [--quick] [--kinds Q8_0,Q4_1,Q4_K] [--no-prompt]`.

At the 135M Llama's shapes (D=576, F=1536; per layer q [576,576], k/v [192,576], o [576,576],
gate/up [1536,576], down [576,1536]; 30 layers: 106M weights; --quick: 6 layers), in ONE process,
candidates interleaved round by round (min and median of the rounds; the machine is shared):
  copy      the machine's copy rate: a donated 256 MB f32 `a + 1` (bytes read + written / time)
  f32       all the layers' `w @ x` over f32 weights (the baseline)
  fused     oi2jax.quantized.linear on one token: dequantization fused into one XLA reduction
  deq+dot   the weight dequantized to f32 inside the step, then the f32 dot
  bf16      the same weights in bf16: upcast then dot, a bf16 dot with an f32 result, a fused reduce
  ggml ffi  ggml's own CPU kernels (llama.cpp's vec_dot, activations quantized to the kind's
            vec_dot_type) through jax.ffi: `kernels="ggml"`'s product (oi2jax/quantized/ggml.py),
            when ggml is installed (pip install llama-cpp-python)
and for a 512-token prompt: f32 GEMMs against oi2jax.quantized.linear (dequantize once, f32 GEMM).
K-quants need rows of 256: the 576-wide rows are not, so Q4_K/Q5_K/Q6_K run as [576, 1536]
matrices of the same total weight count. GB/s = the weight bytes read (quantized bytes + scales) /
time. Writes results/quantized_matvec[-quick].md; docs/performance.md reads it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from oi2jax import quantized as Q  # noqa: E402
from oi2jax.quantized.blocks import FORMATS, dequantize_prepared  # noqa: E402

D, F = 576, 1536


def shapes(layers: int, kind: str | None = None) -> list:
    per_layer = [(D, D), (192, D), (192, D), (D, D), (F, D), (F, D), (D, F)]
    out = per_layer * layers
    if kind and kind.endswith("_K"):
        return [(D, F)] * (sum(a * b for a, b in out) // (D * F))
    return out


def random_raw(rng, kind: str, shape) -> np.ndarray:
    """GGUF bytes of `kind` for a weight of `shape`: random quants, every scale 0.01 (speed does not
    depend on the values)."""
    per, size = Q.block_size(kind)
    raw = rng.integers(0, 256, size=(shape[0], shape[1] // per, size), dtype=np.uint8)
    at = 0
    for name, width, _ in FORMATS[kind].split:
        if name in ("d", "m", "dmin"):
            raw[..., at:at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        at += width
    return raw.reshape(shape[0], -1)


def compare(cands: dict, rounds: int) -> dict:
    """name -> (min, median) seconds of jitted `fn(*args)`, warmed, the candidates interleaved."""
    jitted = {}
    for name, (fn, args) in cands.items():
        f = jax.jit(fn)
        jax.block_until_ready(f(*args))
        jax.block_until_ready(f(*args))
        jitted[name] = f, args
    times: dict = {name: [] for name in jitted}
    for _ in range(rounds):
        for name, (f, args) in jitted.items():
            t = time.perf_counter()
            jax.block_until_ready(f(*args))
            times[name].append(time.perf_counter() - t)
    return {name: (min(v), statistics.median(v)) for name, v in times.items()}


def copy_rate(rounds: int) -> float:
    """Bytes read + written per second by a donated elementwise pass over 256 MB of f32."""
    f = jax.jit(lambda a: a + 1.0, donate_argnums=0)
    a = jnp.zeros(64 << 20, jnp.float32)
    for _ in range(2):
        a = f(a)
    a.block_until_ready()
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        a = f(a)
        a.block_until_ready()
        ts.append(time.perf_counter() - t)
    return 2 * a.nbytes / min(ts)


def ggml_ffi():
    """`kernels="ggml"`'s product (oi2jax.quantized.ggml) when ggml is installed (llama-cpp-python), else None."""
    from oi2jax.diagnostics import OiError
    from oi2jax.quantized import ggml
    try:
        ggml.ensure()
    except OiError:
        return None

    def linear(x, raw, kind, out):
        return ggml.matvec(x, raw.reshape(out, -1), kind)
    return linear


def _xs(rng, rows):
    return {n: jnp.asarray(rng.normal(size=rows + (n,)).astype(np.float32)) for n in (D, F)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 layers, 3 rounds, no prompt")
    ap.add_argument("--kinds", default="Q8_0,Q4_1,Q4_K")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--no-prompt", action="store_true")
    ap.add_argument("--out", default=str(HERE / "results"))
    a = ap.parse_args(argv)
    layers = a.layers or (6 if a.quick else 30)
    rounds = a.rounds or (3 if a.quick else 7)
    kinds = [k.strip().upper() for k in a.kinds.split(",") if k.strip()]
    rng = np.random.default_rng(0)
    ffi = ggml_ffi()
    lines = [f"# Quantized matrix-vector products ({'quick, ' if a.quick else ''}{layers} layers of the 135M "
             f"Llama, jax {jax.__version__}, {jax.devices()[0].device_kind})", ""]
    copy = copy_rate(rounds)
    lines += [f"copy rate (donated 256 MB f32 a + 1, read + written): {copy / 1e9:.1f} GB/s", ""]

    def table(title, results, nbytes, tokens=0):
        """Decode: GB/s and the copy-rate floor (weight bytes / copy rate); a prompt (`tokens`):
        the tokens per second of the matmuls alone."""
        f32 = results["f32"][0]
        last = "tokens/s (matmuls only)" if tokens else "vs copy-rate floor"
        rows = [f"## {title}", "", f"| candidate | min ms | median ms | GB/s (weights, min) | vs f32 | {last} |",
                "|---|---|---|---|---|---|"]
        for name, (mn, md) in results.items():
            end = f"{tokens / mn:.0f}" if tokens else f"{mn / (nbytes[name] / copy):.1f}x"
            rows.append(f"| {name} | {mn * 1e3:.2f} | {md * 1e3:.2f} | {nbytes[name] / mn / 1e9:.1f} | "
                        f"{mn / f32:.2f}x | {end} |")
        return rows + [""]

    weights = [jnp.asarray(rng.normal(size=s).astype(np.float32)) for s in shapes(layers)]
    x = _xs(rng, ())
    cands = {"f32": (lambda ws, x: [w @ x[w.shape[1]] for w in ws], (weights, x))}
    nbytes = {"f32": sum(w.nbytes for w in weights)}
    bf16 = [w.astype(jnp.bfloat16) for w in weights]
    size16 = sum(w.nbytes for w in bf16)
    cands["bf16 upcast then dot"] = (lambda ws, x: [w.astype(jnp.float32) @ x[w.shape[1]] for w in ws], (bf16, x))
    cands["bf16 dot, f32 result"] = (lambda ws, x: [lax.dot_general(w, x[w.shape[1]].astype(jnp.bfloat16), (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32) for w in ws], (bf16, x))
    cands["bf16 fused reduce"] = (lambda ws, x: [jnp.sum(w.reshape(w.shape[0], -1, 32).astype(jnp.float32) * x[w.shape[1]].reshape(-1, 32), (-2, -1)) for w in ws], (bf16, x))
    nbytes.update({k: size16 for k in cands if k.startswith("bf16")})
    prepared = {}
    for kind in kinds:
        raws = [random_raw(rng, kind, s) for s in shapes(layers, kind)]
        qs = jax.device_put([Q.prepare(kind, r, s) for r, s in zip(raws, shapes(layers, kind))])
        prepared[kind] = qs
        size = sum(q.nbytes for q in qs)
        cands[f"{kind} fused"] = (lambda qs, x: [Q.linear(x[q.shape[1]], q) for q in qs], (qs, x))
        cands[f"{kind} deq+dot"] = (lambda qs, x: [dequantize_prepared(q) @ x[q.shape[1]] for q in qs], (qs, x))
        nbytes[f"{kind} fused"] = nbytes[f"{kind} deq+dot"] = size
        if ffi is not None:
            dev = jax.device_put([jnp.asarray(r) for r in raws])
            cands[f"{kind} ggml ffi"] = (lambda raws, x, kind=kind: [ffi(x[r.shape[1] // Q.block_size(kind)[1] * Q.block_size(kind)[0]], r, kind, r.shape[0]) for r in raws], (dev, x))
            nbytes[f"{kind} ggml ffi"] = sum(r.nbytes for r in raws)
    lines += table("Decode: one token (x [576] or [1536]), all layers' matrix-vector products",
                   compare(cands, rounds), nbytes)
    print("\n".join(lines), flush=True)
    if not (a.quick or a.no_prompt):
        xp = _xs(rng, (512,))
        cands = {"f32": (lambda ws, x: [x[w.shape[1]] @ w.T for w in weights], (weights, xp))}
        for kind, qs in prepared.items():
            cands[f"{kind} linear"] = (lambda qs, x: [Q.linear(x[q.shape[1]], q) for q in qs], (qs, xp))
            nbytes[f"{kind} linear"] = nbytes[f"{kind} fused"]
        results = compare(cands, max(2, rounds // 2))
        flops = 2 * 512 * sum(w.size for w in weights)
        prompt = table("Prompt: 512 tokens (x [512, in]), all layers' GEMMs", results, nbytes, tokens=512)
        prompt += [f"f32 GEMM: {flops / results['f32'][0] / 1e9:.0f} GFLOP/s", ""]
        print("\n".join(prompt), flush=True)
        lines += prompt
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"quantized_matvec{'-quick' if a.quick else ''}.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
