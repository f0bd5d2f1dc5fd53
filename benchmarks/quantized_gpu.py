"""Weights kept quantized on a GPU (issue 42's GPU item): `python -m benchmarks.quantized_gpu
[--shape tinyllama|tiny] [--kinds Q8_0,Q4_K] [--out DIR] [--skip-decode] [--skip-products] [--no-bf16] [--kv-dtype f16|bf16] [--profile STEPS] [--tiles R,V,W]
[--static-loop] [--work DIR]`.

On JAX's default device, in ONE process (the GPU is what it is for; `--shape tiny` is a smoke run
that works on any device):
  copy      the device's copy rate: a jitted `x + 1` over 1 GiB (bytes read + written / time)
  products  every layer matrix of the shape (L x [q, k, v, o, gate, up, down]) against one
            activation row, in one jitted call: `oi2jax.quantized.linear` on kept blocks (the fused
            reduction the decode step runs), the weight dequantized to f32 then an f32 dot
            (the prompt step's form), a bf16 dot with an f32 result, an f32 dot, and on a GPU
            (Q8_0, Q4_K) benchmarks/pallas_matvec.py's Triton kernel, a candidate not kept, at its
            default tiles and at each `--tiles ROWS,VALUES,WARPS` given (its products checked
            against the dequantized weight's f32 dot first). Per form: ms per call (host work
            included: one call passes every field of 154 weights) and device ms per pass (a
            `fori_loop` of passes in one call), GB/s of the weight bytes read
  decode    the shape's random Llama checkpoint (bf16, examples/llama_checkpoint.py) converted kept
            (bf16) and with `convert-hf --quantize KIND`; `oi2jax.generation.Generator` (what
            `oi2jax generate` runs) of G tokens after a P-token prompt, one first run then three
            (medians): prompt tokens/s, decode ms/token, the device's constant bytes a token reads
            (every weight but the embedding table, plus one row of it) and the floor they set at
            the copy rate; target: decode <= 1.5x that floor. `--static-loop`: also the same G
            decode steps as one jitted `lax.fori_loop` of `Program.step` (a trip count XLA knows:
            no loop condition read by the host between steps; the fused run's `while` reads one
            per step to stop at a stop id), its tokens checked equal to the fused run's. `--work
            DIR`: the random model's files kept in DIR and reused when there (a second process,
            under other XLA_FLAGS, skips writing and converting them)
Writes results/quantized_gpu[-gpu].md (results/ by default).
"""
from __future__ import annotations

import argparse
import gc
import os
import re
import statistics
import sys
import tempfile
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
from oi2jax.generation import Generator  # noqa: E402
from oi2jax.model import ggml  # noqa: E402
from oi2jax.model.convert import convert_hf  # noqa: E402
from oi2jax.npz import write_atomic  # noqa: E402
from oi2jax.quantized.blocks import dequantize_prepared  # noqa: E402

from benchmarks import pallas_matvec  # noqa: E402
from benchmarks.llama import copy_rate  # noqa: E402
from benchmarks.quantized_matvec import compare  # noqa: E402
from benchmarks.reporting import write_report  # noqa: E402

sys.path.insert(0, str(HERE.parent / "examples"))
import llama_checkpoint  # noqa: E402

SHAPES = {"tinyllama": dict(vocab=32000, hidden=2048, layers=22, heads=32, kv_heads=4, intermediate=5632,
                            max_positions=2048),
          "tiny": dict(vocab=512, hidden=256, layers=2, heads=4, kv_heads=2, intermediate=512, max_positions=256)}
RUNS = {"tinyllama": (512, 128), "tiny": (32, 16)}  # prompt tokens, generated tokens
TARGET = 1.5  # decode ms/token <= 1.5x the floor


def matrices(s: dict) -> list[tuple[int, int]]:
    """One layer's [out, in] matrices: q, k, v, o, gate, up, down."""
    d, f, hd = s["hidden"], s["intermediate"], s["hidden"] // s["heads"]
    kv = s["kv_heads"] * hd
    return [(d, d), (kv, d), (kv, d), (d, d), (f, d), (f, d), (d, f)]


def _checked(kind, fn, q, v):
    """fn(v, q) against the dequantized weight's f32 dot: the largest difference over the largest
    |value|, which must be an f32 sum's rounding (< 1e-5), else the benchmark stops."""
    got = np.asarray(fn(v, q), np.float64)
    ref = np.asarray(dequantize_prepared(q), np.float64) @ np.asarray(v, np.float64)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    if not err < 1e-5:
        raise SystemExit(f"{kind}: the kernel's products are off by {err:.2e} of the largest")
    return err


def products(s: dict, kinds, rounds: int, rate: float, tiles=(), device: bool = True) -> list[str]:
    """The products table (`device`: with the device-time columns, two more compiles a form)."""
    rng = np.random.default_rng(0)
    layers = s["layers"]
    base = [(rng.standard_normal(shape) * 0.02).astype(np.float32) for shape in matrices(s)]
    x = jnp.asarray(rng.standard_normal(s["hidden"]).astype(np.float32))
    xf = jnp.asarray(rng.standard_normal(s["intermediate"]).astype(np.float32))

    def per_layer(make):  # the layers' weights: one value per matrix, a buffer of its own per layer
        made = [make(w) for w in base]
        return [[jax.tree.map(lambda a: jnp.array(a, copy=True), m) for m in made] for _ in range(layers)]

    def apply(fn):
        def run(x, xf, ws):
            return [fn(xf if i == 6 else x, w) for layer in ws for i, w in enumerate(layer)]
        return run

    cands, nbytes = {}, {}
    f32 = per_layer(jnp.asarray)
    cands["f32 dot"] = (apply(lambda v, w: jnp.dot(w, v, precision=lax.Precision.HIGHEST)), (x, xf, f32))
    nbytes["f32 dot"] = sum(w.nbytes for layer in f32 for w in layer)
    bf = per_layer(lambda w: jnp.asarray(w, jnp.bfloat16))
    cands["bf16 dot (f32 result)"] = (apply(lambda v, w: jnp.dot(w, v.astype(jnp.bfloat16),
                                                                  preferred_element_type=jnp.float32)), (x, xf, bf))
    nbytes["bf16 dot (f32 result)"] = sum(w.nbytes for layer in bf for w in layer)
    for kind in kinds:
        qs = per_layer(lambda w, kind=kind: Q.prepare(kind, ggml.quantize(kind, w), w.shape))
        n = sum(q.nbytes for layer in qs for q in layer)
        cands[f"{kind} linear (fused XLA)"] = (apply(lambda v, q: Q.linear(v, q)), (x, xf, qs))
        cands[f"{kind} dequantize + f32 dot"] = (apply(lambda v, q: jnp.dot(
            dequantize_prepared(q), v, precision=lax.Precision.HIGHEST)), (x, xf, qs))
        nbytes[f"{kind} linear (fused XLA)"] = nbytes[f"{kind} dequantize + f32 dot"] = n
        if kind in pallas_matvec.KINDS and jax.default_backend() == "gpu":
            for t in (None,) + tuple(tiles):
                label = f"{kind} Pallas kernel" + (f" tiles {','.join(map(str, t))}" if t else "")
                fn = lambda v, q, t=t: pallas_matvec.matvec(v, q, tiles=t)  # noqa: E731
                errs = [_checked(kind, fn, qs[0][i], xf if i == 6 else x) for i in range(7)]
                print(f"{label}: products within {max(errs):.1e} of the largest", flush=True)
                cands[label] = (apply(fn), (x, xf, qs))
                nbytes[label] = n
    res = compare(cands, rounds)
    dev = {name: device_s(fn, args) if device else float("nan") for name, (fn, args) in cands.items()}
    lines = [f"All {layers} layers' matrix-vector products ({7 * layers} matrices, "
             f"{sum(a * b for a, b in matrices(s)) * layers / 1e6:.0f}M weights) in one jitted call; "
             f"min and median of {rounds} calls; GB/s of the weight bytes (min); floor = bytes / copy rate. "
             f"Device ms: the same products as {DEVICE_REPS} passes of a `fori_loop` in one call, less one pass, "
             f"over {DEVICE_REPS - 1} (the call's host work taken out); its GB/s and x floor.", "",
             "| form | weight MiB | ms min | ms median | GB/s | x floor | device ms | device GB/s | device x floor |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, (lo, med) in res.items():
        b, d = nbytes[name], dev[name]
        lines.append(f"| {name} | {b / 2**20:.0f} | {lo * 1e3:.3f} | {med * 1e3:.3f} | {b / lo / 1e9:.0f} | "
                     f"{lo / (b / rate):.2f} | {d * 1e3:.3f} | {b / d / 1e9:.0f} | {d / (b / rate):.2f} |")
    return lines


DEVICE_REPS = 11


def device_s(fn, args, tries: int = 5) -> float:
    """Seconds per pass of fn(*args) on the device: a jitted fori_loop of 1 and of DEVICE_REPS passes,
    each pass's x moved by a vanishing multiple of every product's sum (nothing dropped) and the
    weights behind a barrier with x (nothing hoisted),
    the difference of their best times over DEVICE_REPS - 1."""
    def looped(n):
        @jax.jit
        def run(x, xf, ws):
            def body(_, carry):
                # the weights pass through a barrier with x: nothing of theirs is loop-invariant, so
                # no decoding is hoisted out of the loop
                x, xf, w = lax.optimization_barrier((*carry, ws))
                ys = fn(x, xf, w)
                s = jnp.sum(jnp.concatenate([jnp.ravel(y) for y in ys])) * 1e-30
                return x + s, xf + s
            return lax.fori_loop(0, n, body, (x, xf))
        return run

    best = []
    for n in (1, DEVICE_REPS):
        run = looped(n)
        jax.block_until_ready(run(*args))
        times = []
        for _ in range(tries):
            t = time.perf_counter()
            jax.block_until_ready(run(*args))
            times.append(time.perf_counter() - t)
        best.append(min(times))
    return max(best[1] - best[0], 1e-9) / (DEVICE_REPS - 1)


def trace_tables(events, steps: int) -> list[str]:
    """A perfetto trace's device lines (events a step, their µs a step, span a step) and the busiest
    line's kernels by name (trailing numbers stripped), per step."""
    events = events["traceEvents"] if isinstance(events, dict) else events
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    lines: dict = {}
    for e in events:
        if e.get("ph") == "X" and "GPU" in str(procs.get(e.get("pid"), "")):
            key = (procs[e["pid"]], threads.get((e["pid"], e.get("tid")), str(e.get("tid"))))
            lines.setdefault(key, []).append((e["name"], float(e.get("dur", 0.0)), float(e.get("ts", 0.0))))
    rows = ["Device trace lines: events a step, their µs a step, span (first start to last end) a step.", "",
            "| process | line | events / step | busy µs / step | span µs / step |", "|---|---|---|---|---|"]
    for (proc, thread), evs in sorted(lines.items(), key=lambda t: -len(t[1])):
        span = max(ts + d for _, d, ts in evs) - min(ts for _, _, ts in evs)
        rows.append(f"| {proc} | {thread} | {len(evs) / steps:.1f} | {sum(d for _, d, _ in evs) / steps:.1f} | "
                    f"{span / steps:.1f} |")
    if lines:
        busiest = max(lines.values(), key=lambda evs: sum(d for _, d, _ in evs))
        by: dict = {}
        for name, d, _ in busiest:
            kind = re.sub(r"[._]\d+$", "", name)
            n, t = by.get(kind, (0, 0.0))
            by[kind] = (n + 1, t + d)
        rows += ["", "The busiest line's kernels by name (numbers stripped), per step:", "",
                 "| kernel | count / step | µs / step |", "|---|---|---|"]
        rows += [f"| {k} | {n / steps:.1f} | {t / steps:.1f} |"
                 for k, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:25]]
    return rows


def profile_decode(g, ids, steps: int, out: Path, label: str) -> list[str]:
    """A `jax.profiler` trace of `steps` decode steps (the fused `Session.run` generate makes, after
    the prompt `ids`): the device's kernel events summed per trace line, the busiest line's kernels
    by name, and the trace itself written to `out` (perfetto JSON, for reading elsewhere)."""
    import gzip
    import json
    import shutil
    settings = g._inputs({"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0})
    first = g.prompt_step(ids)
    sess = first.session
    run = dict(steps=steps, feedback={g.token_input: "next"}, collect="next")
    token = np.asarray([first.next], np.int32)
    sess.run({g.token_input: token, **settings}, **run)  # the loop compiled and warm
    trace = Path(tempfile.mkdtemp(prefix="oi2jax-gpu-trace-"))
    jax.profiler.start_trace(str(trace), create_perfetto_trace=True)
    t0 = time.perf_counter()
    sess.run({g.token_input: token, **settings}, **run)
    wall = time.perf_counter() - t0  # the run alone (writing the trace after it left out)
    jax.profiler.stop_trace()
    sess.close()
    path = next(trace.rglob("perfetto_trace.json.gz"))
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"trace-{label}.json.gz", lambda f: f.write(path.read_bytes()))
    shutil.rmtree(trace, ignore_errors=True)
    events = json.loads(gzip.decompress((out / f"trace-{label}.json.gz").read_bytes()))
    rows = [f"`jax.profiler` trace of {steps} decode steps ({label}, one fused `Session.run` after the "
            f"{len(ids)}-token prompt): {wall * 1e3 / steps:.3f} ms a step traced.", "", *trace_tables(events, steps)]
    print("\n".join(rows), flush=True)
    return rows


def decode(tmp: Path, s: dict, shape: str, kinds, rate: float, bf16: bool = True, profile: int = 0,
           out: Path | None = None, kv_dtype: str | None = None, static_loop: bool = False) -> list[str]:
    t0 = time.perf_counter()
    names = (["bf16"] if bf16 else []) + list(kinds)
    reused = all((tmp / f"{shape}-{name}.oinf").is_file() for name in names)  # `--work`: an earlier process's
    if not reused:
        ck = llama_checkpoint.write_random_llama(tmp / "hf", dtype="bf16", **s)
        for name in names:
            convert_hf(ck, tmp / f"{shape}-{name}.oinf", quantize=None if name == "bf16" else name)
    paths = {("bf16 (kept)" if name == "bf16" else name): tmp / f"{shape}-{name}.oinf" for name in names}
    made = time.perf_counter() - t0
    P, G = RUNS[shape]
    ids = np.random.default_rng(1).integers(0, s["vocab"], P).astype(np.int32)
    lines = [f"Random checkpoint {'reused from --work' if reused else 'written and converted'} in {made:.0f} s. Prompt {P} tokens, then {G} generated "
             f"(`Generator.generate(prompt_ids=..., max_tokens={G}, ignore_eos=True)`): a first run, then three "
             f"(medians), KV cache {kv_dtype or 'f32'}. Bytes/token: the device constants but the embedding "
             f"table, plus one row of it.", "",
             "| weights | file MiB | compile s | first run prompt tok/s | prompt tok/s | decode ms/token | "
             "bytes/token MiB | floor ms | x floor | GB/s | first tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, path in paths.items():
        g = Generator(path, kv_dtype=kv_dtype)
        consts = g.programs[1].executable.consts
        total = sum(a.nbytes for a in jax.tree.leaves(consts))
        emb = sum(a.nbytes for a in jax.tree.leaves(consts["embed"]))
        per_token = total - emb + emb // s["vocab"]
        runs = [g.generate(None, prompt_ids=ids, max_tokens=G, ignore_eos=True) for _ in range(4)]
        first, warm = runs[0], runs[1:]
        prompt_rate = statistics.median(P / r.stats.prompt_s for r in warm)
        ms = statistics.median(r.stats.generate_s / max(r.stats.generated_tokens - 1, 1) for r in warm) * 1e3
        floor = per_token / rate * 1e3
        lines.append(f"| {label} | {os.path.getsize(path) / 2**20:.0f} | {g.compile_s:.1f} | "
                     f"{P / first.stats.prompt_s:.0f} | {prompt_rate:.0f} | {ms:.3f} | {per_token / 2**20:.0f} | "
                     f"{floor:.3f} | {'**' if ms / floor > TARGET else ''}{ms / floor:.2f}"
                     f"{'**' if ms / floor > TARGET else ''} | {per_token / ms / 1e6:.0f} | "
                     f"{list(map(int, first.ids[:6]))} |")
        print(lines[-1], flush=True)
        if static_loop:
            lines.append(static_loop_row(g, ids, G, label, floor, [int(i) for i in first.ids]))
            print(lines[-1], flush=True)
        if profile:
            lines += ["", *profile_decode(g, ids, profile, out, label.split()[0]), ""]
        del g, consts, runs, first, warm
        gc.collect()
    return lines


def static_loop_row(g, ids, G: int, label: str, floor: float, fused: list[int]) -> str:
    """The decode's G - 1 steps after the prompt as ONE jitted `lax.fori_loop` of the decode
    program's pure step (`Program.apply`, the weights an argument; greedy, the token fed back on the device): a trip count XLA
    knows, so no loop condition goes to the host between steps. Its tokens must equal the fused
    run's (`fused`: the first generation's ids). A row of the decode table: warm ms/token, the
    median of three after a compiling one."""
    from oi2jax.generation import SETTINGS
    prog, n = g.programs[1], G - 1
    given = g._inputs({k: off for k, (_, off) in SETTINGS.items()})

    @jax.jit
    def loop(consts, state, token):  # the weights an argument (`Program.apply`), not compiled in
        def body(i, carry):
            st, tok, got = carry
            st, outs = prog.apply(consts, st, **{g.token_input: tok}, **given)
            nxt = outs["next"].reshape(tok.shape).astype(tok.dtype)
            return st, nxt, got.at[i].set(nxt.reshape(-1)[0])
        return lax.fori_loop(0, n, body, (state, token, jnp.zeros((n,), jnp.int32)))

    times, toks = [], None
    for _ in range(4):
        first = g.prompt_step(ids)
        token = jnp.asarray(np.asarray([first.next] if np.ndim(g.programs[1].executable.defaults[g.token_input])
                                       else first.next, np.int32))
        state = first.session.state
        jax.block_until_ready(state)
        t = time.perf_counter()
        _, _, got = loop(prog.consts, state, token)
        toks = [first.next] + [int(v) for v in jax.device_get(got)]
        times.append(time.perf_counter() - t)
        first.session.close()
    ms = statistics.median(times[1:]) / n * 1e3
    same = "same tokens" if toks == fused[:len(toks)] else f"OTHER tokens {toks[:6]}"
    return (f"| {label}, `fori_loop` of `Program.step` | | {times[0]:.1f} (first call) | | | {ms:.3f} | | {floor:.3f} | "
            f"{ms / floor:.2f} | | {same} |")


def _tiles(text: str) -> tuple[int, int, int]:
    """--tiles ROWS,VALUES,WARPS: three positive integers, else argparse's error (exit 2)."""
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not ROWS,VALUES,WARPS (three positive integers)")
    return tuple(int(p) for p in parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=tuple(SHAPES), default="tinyllama")
    p.add_argument("--kinds", default="Q8_0,Q4_K")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--skip-decode", action="store_true", help="the products only")
    p.add_argument("--no-bf16", action="store_true", help="decode the quantized models only")
    p.add_argument("--kv-dtype", choices=("f16", "bf16"), default=None, help="the decode's KV cache dtype")
    p.add_argument("--skip-products", action="store_true", help="the decode only")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="also trace STEPS decode steps per model (the trace written beside the report)")
    p.add_argument("--tiles", action="append", default=[], metavar="ROWS,VALUES,WARPS", type=_tiles,
                   help="also time the Pallas kernel at these tiles (repeatable)")
    p.add_argument("--static-loop", action="store_true",
                   help="also the decode as a jitted fori_loop of Program.step (no host turn between steps)")
    p.add_argument("--work", metavar="DIR", help="keep the random model's files in DIR; reuse them when there")
    args = p.parse_args(argv)
    kinds = args.kinds.split(",")
    s = SHAPES[args.shape]
    dev = jax.devices()[0]
    rate = copy_rate(dev)
    out = [f"# Weights kept quantized on {dev.device_kind} ({dev.platform})", "",
           f"`python -m benchmarks.quantized_gpu {' '.join(argv if argv is not None else sys.argv[1:])}`: XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; jax {jax.__version__}, "
           f"{os.cpu_count()} CPUs; shape {', '.join(f'{k}={v}' for k, v in s.items())}; "
           f"copy rate {rate / 1e9:.0f} GB/s (read + written)."]
    if not args.skip_products:
        out += ["", "## Matrix-vector products", ""]
        out += products(s, kinds, rounds=20, rate=rate, tiles=args.tiles)
    print("\n".join(out), flush=True)
    if not args.skip_decode:
        out += ["", "## Decode (a random model, end to end)", ""]
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(args.work) if args.work else Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            out += decode(work, s, args.shape, kinds, rate, bf16=not args.no_bf16, profile=args.profile,
                          out=Path(args.out), kv_dtype=args.kv_dtype, static_loop=args.static_loop)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_report(Path(args.out), f"quantized_gpu{'-' + args.shape if args.shape != 'tinyllama' else ''}",
                 "\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
