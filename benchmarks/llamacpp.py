"""oi2jax against llama.cpp on the same GGUF files (issue 42): `python -m benchmarks.llamacpp [--quick]`.

The model: a random Llama with the 135M shapes (30 layers, D=576, 9 heads, 3 KV heads, F=1536,
V=49152, tied embeddings, rope theta 100000), weights from examples/llama_checkpoint.py's
`random_llama_weights` (normal, std 0.02; norms 1 + 0.1 N(0, 1): the activations stay finite and
the logits are spread, not flat), written as GGUF by examples/gguf_file.py's `write_llama_gguf`
in each of KINDS: every 2-D weight (the tied embedding too) as that type, the norms F32; Q4_1 /
Q8_0 / BF16 blocks by `gguf.quants.quantize`; Q4_K by gguf_file's `quantize_q4_k` (gguf-py has no
K-quant quantizer) and checked against `gguf.quants.dequantize`. A K-quant block holds 256 values
of a row, and D=576 is not a multiple of 256: as llama-quantize does, those weights fall back to
Q5_0, so the Q4_K file is Q4_K where rows are 1536 wide (the MLP's down projection) and Q5_0
elsewhere, as a real Q4_K file of this model is. The tokenizer is a minimal
SentencePiece vocabulary (`tokenizer.ggml.model` "llama": <unk> <s> </s>, the 256 byte pieces,
then filler pieces up to V) that both tools load; both are driven with token ids. The files are
cached under benchmarks/.cache/ (gitignored), keyed by the shape; writing them is timed once.

Measured, per type, in this one script run (the tools alternate: llama.cpp, oi2jax, llama.cpp):
- llama.cpp through llama-cpp-python (the `bench` extra), in a subprocess:
  `Llama(n_ctx=T, n_batch=512, n_threads=2, n_threads_batch=2)` (its defaults otherwise: f16 KV
  cache, flash attention off, weights mmapped), one warm-up eval, then `eval(prompt)` (the
  prompt tokens/s) and greedy decode (argmax of the last logits, `eval([tok])`) of N tokens, REPS
  times; the median and the range are reported.
- oi2jax through its CLI, in subprocesses: `oi2jax convert-gguf F.gguf -o M.oinf --max-positions T`
  then `oi2jax generate M.oinf --prompt-ids P.npy --stats --ignore-eos --max-tokens N`; its stderr
  lines `prompt N tokens in S s` / `generated M tokens in S s` are parsed (compiling is counted
  apart by generate). Both tools' token counts follow generate's: M tokens drawn, M - 1 steps.
  Then (after llama.cpp's second run) the same generation through the API, REPS + 1 times in one
  process: the first run cold, the rest warm (the "Warm" table: XLA's first execution of each
  program costs about as much again as the prompt step itself, a one-time cost llama.cpp's
  warm-up eval takes out of its own runs).
  Each GGML-block type runs twice, between the same two llama.cpp runs: with oi2jax's exact
  pure-JAX kernels (`--kernels jax`, the default) and with `--kernels ggml` (llama.cpp's own CPU
  row dot products through jax.ffi, llama.cpp's numerics: oi2jax/quantized/ggml.py), rows
  "TYPE" and "TYPE --kernels ggml" (`--kernels` here picks which; ggml needs llama-cpp-python).
- Peak resident memory of each tool's process (`os.wait4`'s ru_maxrss), next to GGUF size + the
  KV cache at T in f32, and next to the bare interpreter's (python + jax / python + llama_cpp).
- Bytes read per generated token and the GB/s they make: llama.cpp, the GGUF's tensor bytes + its
  f16 KV cache's filled rows; oi2jax, XLA's cost analysis ("bytes accessed") of its compiled step.
  The floor: the GGUF's tensor bytes / the machine's copy rate (a NumPy copy of 512 MB in this
  process, read + written bytes per second).
- Where oi2jax's step time goes (PROFILE_KIND; benchmarks/step_profile.py): decode steps of the
  program `generate` runs, after the prompt, traced with `jax.profiler` (XLA's per-op events), each
  event attributed through the optimized HLO's op_name metadata to the DSL op that made it (oi2jax
  names a scope `<node>:<op>` per node), in ms per step.

Targets (issue 42; reported, never asserted): oi2jax >= 1.0x llama.cpp on decode and prompt for
Q4_1, Q8_0 and Q4_K; resident memory <= 1.2x (GGUF + cache).

The context T (default 1024, `--ctx`) is the same for both tools: a 512-token prompt plus the
decode fit, and oi2jax's token-by-token prompt of today stays within the run's few minutes.
`--quick`: a 2-layer D=256 model of the same architecture (seconds; llama.cpp skipped with a note
when llama-cpp-python is not installed). Writes results/llamacpp[-quick].md and .json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EXAMPLES = REPO / "examples"
for _p in (REPO, EXAMPLES):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import numpy as np  # noqa: E402

from benchmarks.step_profile import cost_worker, gap, profile_table, profile_worker  # noqa: E402
from oi2jax.tables import TABLE_DTYPES  # noqa: E402

CACHE = HERE / ".cache"
KINDS = ("Q4_1", "Q8_0", "Q4_K", "F32", "BF16")
TARGETED = ("Q4_1", "Q8_0", "Q4_K")  # the types the >= 1.0x targets are for
# `--kernels ggml` applies: kept in GGML blocks, or bf16 held as its bytes (F32: not)
GGML_KINDS = ("Q4_1", "Q8_0", "Q4_K", "BF16")
PROFILE_KIND = "Q4_1"
# per type: (convert-gguf options, generate options) beyond the defaults: none. BF16 is converted
# as kept (bf16 weights, the GGUF's F32 norms) and `generate` runs the f32 family graph on its
# exact f32 values (widen_floats), as it does for a user; with `--kernels ggml` the bf16 matrices
# stay bf16 bytes (their decode products ggml's bf16 row dot product).
OI2JAX_OPTIONS: dict = {}
THREADS = 2
REPS = 3  # llama.cpp's measurements per subprocess (it runs before and after oi2jax)
FORMAT = 1  # the model files' writer version: a change regenerates the cache
_CONTROL, _NORMAL, _UNKNOWN, _BYTE = 3, 1, 2, 6  # llama.cpp's token types


@dataclass(frozen=True)
class Shape:
    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    ctx: int
    prompt: int
    gen: int
    rope_theta: float = 100000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def key(self) -> str:
        """The cache key of the model files (what the weights depend on: not ctx, prompt, gen)."""
        fields = (FORMAT, self.vocab, self.hidden, self.layers, self.heads, self.kv_heads, self.intermediate,
                  self.rope_theta)
        return hashlib.sha256(repr(fields).encode()).hexdigest()[:10]

    def kv_bytes(self, positions: int, itemsize: int) -> int:
        """K and V of every layer over `positions` positions."""
        return 2 * self.layers * positions * self.kv_heads * self.head_dim * itemsize


FULL = Shape("135M", vocab=49152, hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536,
             ctx=1024, prompt=512, gen=64)
QUICK = Shape("quick", vocab=512, hidden=256, layers=2, heads=4, kv_heads=2, intermediate=512,
              ctx=64, prompt=16, gen=8)


# ------------------------------------------------------------------------------- the model files

def spm_vocab(writer, vocab: int) -> None:
    """A minimal SentencePiece (`llama`) vocabulary of exactly `vocab` pieces: <unk> <s> </s>, the
    256 byte pieces, then filler pieces; BOS 1, EOS 2, no BOS added by the tokenizer."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(vocab - len(tokens))]
    types = [_UNKNOWN, _CONTROL, _CONTROL] + [_BYTE] * 256 + [_NORMAL] * (vocab - 259)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(vocab - 259)])
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)


def config_of(shape: Shape) -> dict:
    from llama_checkpoint import llama_config
    return llama_config(vocab=shape.vocab, hidden=shape.hidden, layers=shape.layers, heads=shape.heads,
                        kv_heads=shape.kv_heads, intermediate=shape.intermediate, max_positions=FULL.ctx * 8,
                        tied=True, rope_theta=shape.rope_theta)


def model_files(shape: Shape, kinds, cache: Path = CACHE, log=print) -> dict[str, dict]:
    """{kind: {"path", "write_s"}}: the GGUF file of each kind, written once into `cache`."""
    from gguf_file import write_llama_gguf
    from llama_checkpoint import random_llama_weights

    cache.mkdir(parents=True, exist_ok=True)
    out, weights, config = {}, None, config_of(shape)
    for kind in kinds:
        path = cache / f"llama-{shape.name}-{shape.key()}-{kind}.gguf"
        info = cache / (path.name + ".json")
        if not (path.is_file() and info.is_file()):
            if weights is None:
                t0 = time.perf_counter()
                weights = random_llama_weights(config, seed=0)
                log(f"  random weights: {sum(w.size for w in weights.values()) / 1e6:.1f}M in "
                    f"{time.perf_counter() - t0:.1f} s")
            t0 = time.perf_counter()
            write_llama_gguf(path, config, weights, kind, name=f"random-llama-{shape.name}", fallback=True,
                             tokenizer=lambda w: spm_vocab(w, shape.vocab))
            write_s = time.perf_counter() - t0
            check_blocks(path, weights, kind)
            info.write_text(json.dumps({"write_s": write_s}))
            log(f"  wrote {path.name} ({path.stat().st_size / 1e6:.1f} MB) in {write_s:.1f} s")
        out[kind] = {"path": path, **json.loads(info.read_text())}
    return out


def check_blocks(path: Path, weights: dict, kind: str) -> None:
    """The file's first layer's down projection dequantizes (gguf.quants) to the weights within
    its type's rounding: the blocks are what the file says."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    want = weights["model.layers.0.mlp.down_proj.weight"]
    t = next(t for t in GGUFReader(str(path)).tensors if t.name == "blk.0.ffn_down.weight")
    got = dequantize(np.asarray(t.data), t.tensor_type).reshape(want.shape)
    bound = {"F32": 0.0, "BF16": 2 ** -8, "Q8_0": 2 ** -7, "Q4_1": 2 ** -3, "Q4_K": 2 ** -3}[kind]
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    if t.tensor_type.name != kind or err > bound:
        raise RuntimeError(f"{path}: {t.tensor_type.name} blocks dequantize {err:.3g} off the weights "
                           f"(a {kind} file: bound {bound})")


def type_bytes(path: Path) -> dict[str, int]:
    """{GGML type: tensor bytes} of a GGUF file. Their sum is what one token reads of the weights
    (the tied embedding is the lm_head, read whole)."""
    from gguf import GGUFReader
    out: dict[str, int] = {}
    for t in GGUFReader(str(path)).tensors:
        out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + int(t.n_bytes)
    return out


def tensor_bytes(path: Path) -> int:
    return sum(type_bytes(path).values())


# ------------------------------------------------------------------------------------- the tools

# Runs `-m MODULE ARGS...` or `-c CODE` in a fresh interpreter and writes its VmHWM (peak RSS, kB) at
# exit: the peak of that program alone (a child's ru_maxrss starts from its parent's RSS at the fork).
_WRAP = """
import atexit, runpy, sys
def _hwm(path=sys.argv[1]):
    with open('/proc/self/status') as f:
        kb = next(line.split()[1] for line in f if line.startswith('VmHWM:'))
    with open(path, 'w') as f:
        f.write(kb)
atexit.register(_hwm)
mode, target = sys.argv[2], sys.argv[3]
sys.argv = [target] + sys.argv[4:]
if mode == '-m':
    runpy.run_module(target, run_name='__main__', alter_sys=True)
else:
    exec(compile(target, '<bench>', 'exec'), {'__name__': '__main__'})
"""


def _python(args, env=None):
    """Run `python ARGS` (`-m MODULE ...` or `-c CODE`) to the end: (returncode, stdout, stderr, peak
    RSS bytes of that process or None)."""
    with tempfile.TemporaryDirectory(prefix="oi2jax-bench-") as tmp:
        hwm, out, err = Path(tmp) / "hwm", Path(tmp) / "out", Path(tmp) / "err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            rc = subprocess.run([sys.executable, "-c", _WRAP, str(hwm), *args], stdout=fo, stderr=fe, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
                                     **(env or {})}).returncode
        rss = int(hwm.read_text()) * 1024 if hwm.is_file() else None
        return rc, out.read_text(errors="replace"), err.read_text(errors="replace"), rss


def have_llama_cpp() -> bool:
    import importlib.util
    return importlib.util.find_spec("llama_cpp") is not None


def llamacpp_worker(gguf: str, ids_path: str, gen: int, ctx: int, reps: int, threads: int = THREADS) -> dict:
    """In a subprocess: load the GGUF with llama.cpp and time the prompt and greedy decode."""
    import llama_cpp

    ids = [int(i) for i in np.load(ids_path)]
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    load_s = time.perf_counter() - t0
    llm.eval(ids[:8])  # warm-up
    runs = []
    for _ in range(reps):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        out = []
        while True:  # the last token's logits (llama-cpp-python keeps them only with logits_all)
            tok = int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                                      shape=(llm.n_vocab(),))))
            out.append(tok)
            if len(out) == gen:
                break
            llm.eval([tok])
        t2 = time.perf_counter()
        runs.append({"prompt_s": t1 - t0, "generate_s": t2 - t1, "ids": out})
    return {"load_s": load_s, "runs": runs, "version": f"{llama_cpp.__version__} ({Path(llama_cpp.__file__).parent})",
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}


def run_llamacpp(gguf: Path, ids_path: Path, shape: Shape, reps: int = REPS, threads: int = THREADS) -> dict:
    rc, out, err, rss = _python(["-m", "benchmarks.llamacpp", "--worker", "llamacpp", str(gguf), str(ids_path),
                                 str(shape.gen), str(shape.ctx), str(reps), str(threads)])
    if rc != 0:
        return {"error": _last_lines(err)}
    return {**json.loads(out.strip().splitlines()[-1]), "rss": rss}


STATS = {"compile": re.compile(r"compile ([\d.]+) s"),
         "prompt": re.compile(r"prompt (\d+) tokens in ([\d.]+) s"),
         "generated": re.compile(r"generated (\d+) tokens in ([\d.]+) s"),
         "memory": re.compile(r"memory ([\d.]+) MB weights \+ ([\d.]+) MB state")}


def parse_stats(stderr: str) -> dict:
    """generate --stats' stderr lines -> {compile_s, prompt_tokens, prompt_s, gen_tokens, generate_s,
    weights_bytes, state_bytes (the device's, to 0.05 MB)}."""
    out = {}
    for key, pattern in STATS.items():
        m = pattern.search(stderr)
        if m is None:
            continue
        if key == "compile":
            out["compile_s"] = float(m.group(1))
        elif key == "prompt":
            out["prompt_tokens"], out["prompt_s"] = int(m.group(1)), float(m.group(2))
        elif key == "memory":
            out["weights_bytes"], out["state_bytes"] = float(m.group(1)) * 1e6, float(m.group(2)) * 1e6
        else:
            out["gen_tokens"], out["generate_s"] = int(m.group(1)), float(m.group(2))
    return out


def _last_lines(text: str, n: int = 6) -> str:
    return " | ".join(text.strip().splitlines()[-n:])


def xla_cache(work: Path) -> dict:
    """The environment of every oi2jax process of a run: one persistent XLA cache, fresh per run (a
    later type whose step is the same program, and the profile, load its executable)."""
    return {"JAX_COMPILATION_CACHE_DIR": str(work / "xla-cache")}


def run_oi2jax(gguf: Path, kind: str, ids_path: Path, shape: Shape, work: Path, kernels: str = "jax",
               kv_dtype: str | None = None) -> dict:
    """convert-gguf, then generate --stats (with `--kernels kernels`, `--kv-dtype kv_dtype` when
    given), each in its own process."""
    oinf = work / (gguf.stem + ".oinf")
    t0 = time.perf_counter()
    convert_opts, generate_opts = OI2JAX_OPTIONS.get(kind, ([], []))
    generate_opts = [*generate_opts, "--kernels", kernels, *(["--kv-dtype", kv_dtype] if kv_dtype else [])]
    rc, _, err, convert_rss = _python(["-m", "oi2jax", "convert-gguf", str(gguf), "-o", str(oinf),
                                       "--max-positions", str(shape.ctx), "--quiet", *convert_opts], xla_cache(work))
    convert_s = time.perf_counter() - t0
    if rc != 0:
        return {"error": "convert-gguf: " + _last_lines(err)}
    ids_out = work / (gguf.stem + ".ids.npy")
    rc, _, err, rss = _python(["-m", "oi2jax", "generate", str(oinf), "--prompt-ids", str(ids_path), "--stats",
                               "--ignore-eos", "--max-tokens", str(shape.gen), "--ids-out", str(ids_out), *generate_opts],
                            xla_cache(work))
    stats = parse_stats(err)
    if rc != 0 or "generate_s" not in stats:
        return {"error": "generate: " + _last_lines(err)}
    return {**stats, "convert_s": convert_s, "convert_rss": convert_rss, "rss": rss, "oinf": str(oinf),
            "oinf_bytes": oinf.stat().st_size, "ids": [int(i) for i in np.load(ids_out)]}


def warm_worker(oinf: str, graph: str, ids_path: str, gen: int, kernels: str, reps: int, kv_dtype=None) -> dict:
    """In a subprocess: `generate`'s work through the API (oi2jax.generation.Generator, as the CLI
    runs it), `reps` + 1 times in one process: the first run (cold: XLA's first execution of each
    program; its compiling is left out, as generate --stats does) and the warm runs after it, as
    llama.cpp's runs come after its warm-up eval."""
    from oi2jax.generation import Generator

    g = Generator(oinf, graph or None, kernels=kernels, kv_dtype=kv_dtype)
    ids = np.load(ids_path)
    runs = []
    for _ in range(reps + 1):
        r = g.generate(None, prompt_ids=ids, max_tokens=gen, ignore_eos=True)
        runs.append({"prompt_s": r.stats.prompt_s, "generate_s": r.stats.generate_s,
                     "gen_tokens": r.stats.generated_tokens, "ids": [int(i) for i in r.ids]})
    return {"first": runs[0], "warm": runs[1:]}


def run_warm(oinf: str, kind: str, ids_path: Path, shape: Shape, work: Path, kernels: str = "jax",
             kv_dtype: str | None = None) -> dict:
    rc, out, err, _ = _python(["-m", "benchmarks.llamacpp", "--worker", "warm", oinf, _graph(kind), str(ids_path),
                               str(shape.gen), kernels, kv_dtype or ""], xla_cache(work))
    if rc != 0:
        return {"error": _last_lines(err)}
    return json.loads(out.strip().splitlines()[-1])


def baseline_rss() -> dict:
    """Peak RSS of a process that only imports each tool (and runs one jitted op / nothing)."""
    out = {}
    rc, _, _, rss = _python(["-c", "import jax, oi2jax; jax.jit(lambda x: x + 1)(jax.numpy.zeros(4)).block_until_ready()"])
    out["oi2jax"] = rss if rc == 0 else None
    if have_llama_cpp():
        rc, _, _, rss = _python(["-c", "import llama_cpp"])
        out["llamacpp"] = rss if rc == 0 else None
    return out


def copy_rate(nbytes: int = 512 << 20, reps: int = 5) -> float:
    """Bytes read + written per second by a NumPy copy of `nbytes` (best of `reps`)."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def _graph(kind: str) -> str:
    """The graph `generate` runs for `kind` ("": the model's example graph)."""
    opts = OI2JAX_OPTIONS.get(kind, ([], []))[1]
    return opts[opts.index("--graph") + 1] if "--graph" in opts else ""


def run_profile(oinf: str, kind: str, ids_path: Path, work: Path, kernels: str = "jax",
                kv_dtype: str | None = None) -> dict:
    rc, out, err, _ = _python(["-m", "benchmarks.llamacpp", "--worker", "profile", oinf, _graph(kind), str(ids_path),
                               kernels, kv_dtype or ""], xla_cache(work))
    if rc != 0:
        return {"error": _last_lines(err)}
    return json.loads(out.strip().splitlines()[-1])


def run_cost(oinf: str, kind: str, work: Path, kernels: str = "jax", kv_dtype: str | None = None) -> dict:
    rc, out, err, _ = _python(["-m", "benchmarks.llamacpp", "--worker", "cost", oinf, _graph(kind), kernels,
                               kv_dtype or ""],
                              xla_cache(work))
    if rc != 0:
        return {"error": _last_lines(err)}
    return json.loads(out.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------ the run

def _median_range(values):
    return (statistics.median(values), min(values), max(values)) if values else None


def summarize(kind: str, files: dict, shape: Shape, lcp: list, oi: dict, cost: dict, rate: float,
              baseline: dict) -> dict:
    types = type_bytes(files["path"])
    row = {"kind": kind, "gguf_bytes": files["path"].stat().st_size, "tensor_bytes": sum(types.values()),
           "types": types, "write_s": files["write_s"]}
    row["floor_ms"] = row["tensor_bytes"] / rate * 1e3
    row["ref_mem"] = row["gguf_bytes"] + shape.kv_bytes(shape.ctx, 4)
    position = shape.prompt + shape.gen // 2  # the mean position of the decode
    runs = [r for res in lcp if "runs" in res for r in res["runs"]]
    errors = [res["error"] for res in lcp if "error" in res]
    if errors:
        row["lcp_error"] = errors[0]
    if runs:
        row["lcp_decode"] = _median_range([shape.gen / r["generate_s"] for r in runs])
        row["lcp_prompt"] = _median_range([shape.prompt / r["prompt_s"] for r in runs])
        row["lcp_rss"] = max(res["rss"] for res in lcp if "rss" in res)
        row["lcp_version"] = next(res["version"] for res in lcp if "version" in res)
        row["lcp_system"] = next(res["system_info"] for res in lcp if "system_info" in res)
        row["lcp_load_s"] = statistics.median(res["load_s"] for res in lcp if "load_s" in res)
        row["lcp_bytes"] = row["tensor_bytes"] + shape.kv_bytes(position, 2)
        ms = 1e3 / row["lcp_decode"][0]
        row["lcp_ms"] = ms
        row["lcp_gbs"] = row["lcp_bytes"] / ms / 1e6
        row["lcp_ids"] = runs[0]["ids"]
    if "error" in oi:
        row["oi_error"] = oi["error"]
    else:
        row["oi_decode"] = oi["gen_tokens"] / oi["generate_s"]
        row["oi_prompt"] = oi["prompt_tokens"] / oi["prompt_s"]
        row["oi_ms"] = 1e3 / row["oi_decode"]
        if "weights_bytes" in oi:  # what the device holds: the weights and one sequence's state (its KV cache)
            row["oi_device"] = oi["weights_bytes"] + oi["state_bytes"]
            row["oi_device_ref"] = row["gguf_bytes"] + oi["state_bytes"]  # the GGUF + the cache as oi2jax keeps it
        row.update(oi_rss=oi["rss"], oi_compile_s=oi.get("compile_s"), oi_convert_s=oi["convert_s"],
                   oinf_bytes=oi["oinf_bytes"], oi_ids=oi["ids"])
        if "bytes_accessed" in cost:
            # --kernels ggml: XLA's cost analysis does not see into the jax.ffi calls; they read the
            # GGML-block weights once each (the F32 norms are XLA's)
            ffi = sum(n for t, n in types.items() if t != "F32") if "--kernels ggml" in kind else 0
            row["oi_bytes"] = cost["bytes_accessed"] + ffi
            row["oi_gbs"] = row["oi_bytes"] / row["oi_ms"] / 1e6
        elif "error" in cost:
            row["cost_error"] = cost["error"]
    warm = oi.get("warm") or {}
    if warm.get("warm"):  # the API's runs in one process: the first (cold) and the warm ones after it
        row["oi_warm_decode"] = _median_range([r["gen_tokens"] / r["generate_s"] for r in warm["warm"]])
        row["oi_warm_prompt"] = _median_range([shape.prompt / r["prompt_s"] for r in warm["warm"]])
        row["oi_first_prompt"] = shape.prompt / warm["first"]["prompt_s"]
    elif "error" in warm:
        row["warm_error"] = warm["error"]
    if "lcp_decode" in row and "oi_warm_decode" in row:
        row["warm_decode_ratio"] = row["oi_warm_decode"][0] / row["lcp_decode"][0]
        row["warm_prompt_ratio"] = row["oi_warm_prompt"][0] / row["lcp_prompt"][0]
    if "lcp_decode" in row and "oi_decode" in row:
        row["decode_ratio"] = row["oi_decode"] / row["lcp_decode"][0]
        row["prompt_ratio"] = row["oi_prompt"] / row["lcp_prompt"][0]
        same = 0
        for a, b in zip(row["oi_ids"], row["lcp_ids"]):
            if a != b:
                break
            same += 1
        row["same_prefix"] = same
    return row


def bench(shape: Shape, kinds=KINDS, *, cache: Path = CACHE, peer: bool | None = None, profile=(PROFILE_KIND,),
          reps: int = REPS, threads: int = THREADS, log=print, on_row=None, kernels=("jax",),
          kv_dtypes=(None,)) -> dict:
    """Every type's rows (one per kernel set in `kernels` that applies to it: "ggml" to the GGML block
    types, and per KV-cache dtype in `kv_dtypes`: None as the graph declares it, "f16" as llama.cpp
    keeps its own); `on_row(result so far)` after each type (a stopped run keeps its rows)."""
    peer = have_llama_cpp() if peer is None else peer
    start = time.perf_counter()
    meta = machine()
    meta.update(shape=asdict(shape), load_before=os.getloadavg(), uptime_before=_uptime(), peer=peer,
                threads=threads)
    if not peer:
        log("note: llama-cpp-python is not installed (pip install '.[bench]'): llama.cpp skipped, oi2jax only")
    meta["copy_rate"] = copy_rate()
    log(f"copy rate {meta['copy_rate'] / 1e9:.1f} GB/s; model files in {cache}")
    files = model_files(shape, kinds, cache, log)
    meta["baseline_rss"] = baseline_rss()
    rows = []
    with tempfile.TemporaryDirectory(prefix="oi2jax-llamacpp-") as tmp:
        work = Path(tmp)
        ids_path = work / "prompt.npy"
        np.save(ids_path, np.random.default_rng(1).integers(259, shape.vocab, shape.prompt).astype(np.int32))
        for kind in kinds:
            path = files[kind]["path"]
            log(f"{kind}: {path.name}")
            lcp = [run_llamacpp(path, ids_path, shape, reps, threads)] if peer else []
            runs = {}  # the oi2jax runs between llama.cpp's two: each kernel set asked for that applies to the type
            for k, kv in [(k, kv) for k in kernels if k == "jax" or kind in GGML_KINDS for kv in kv_dtypes]:
                runs[k, kv] = run_oi2jax(path, kind, ids_path, shape, work, kernels=k, kv_dtype=kv)
                log(f"  oi2jax {_variant(k, kv)}: {_brief(runs[k, kv])}")
            if peer:
                lcp.append(run_llamacpp(path, ids_path, shape, reps, threads))
                log(f"  llama.cpp: {'; '.join(_brief_lcp(r, shape) for r in lcp)}")
            for (k, kv), oi in runs.items():
                cost, prof = {}, None
                if "oinf" in oi:
                    warm = run_warm(oi["oinf"], kind, ids_path, shape, work, kernels=k, kv_dtype=kv)
                    oi["warm"] = warm
                    log(f"  warm ({_variant(k, kv)}): " + (warm.get("error") or ", ".join(
                        f"prompt {shape.prompt / r['prompt_s']:.0f} / decode {r['gen_tokens'] / r['generate_s']:.1f} tok/s"
                        for r in [warm["first"], *warm["warm"]])))
                    if kind in profile:
                        prof = run_profile(oi["oinf"], kind, ids_path, work, kernels=k, kv_dtype=kv)
                        cost = prof
                        log(f"  profile ({_variant(k, kv)}): " + (prof.get("error") or f"{prof['step_ms_untraced']:.1f} ms/step"))
                    else:
                        cost = run_cost(oi["oinf"], kind, work, kernels=k, kv_dtype=kv)
                label = " ".join([kind] + ([f"--kernels {k}"] if k != "jax" else []) + ([f"--kv-dtype {kv}"] if kv else []))
                row = summarize(label, files[kind], shape, lcp, oi, cost, meta["copy_rate"], meta["baseline_rss"])
                if prof is not None:
                    row["profile"] = prof
                rows.append(row)
            for oi in runs.values():
                if "oinf" in oi:
                    Path(oi["oinf"]).unlink(missing_ok=True)
            meta.update(load_after=os.getloadavg(), uptime_after=_uptime(), wall_s=time.perf_counter() - start)
            meta["llama_cpp_python"] = next((r["lcp_version"] for r in rows if "lcp_version" in r),
                                            meta["llama_cpp_python"])
            if on_row is not None:
                on_row({"meta": meta, "rows": rows})
    return {"meta": meta, "rows": rows}


def _variant(kernels: str, kv_dtype: str | None) -> str:
    """How oi2jax ran: `--kernels K[ --kv-dtype D]` (the row label after the type)."""
    return f"--kernels {kernels}" + (f" --kv-dtype {kv_dtype}" if kv_dtype else "")


def _brief(oi: dict) -> str:
    if "error" in oi:
        return "ERROR " + oi["error"]
    return (f"prompt {oi['prompt_tokens'] / oi['prompt_s']:.1f} tok/s, decode {oi['gen_tokens'] / oi['generate_s']:.1f} "
            f"tok/s, compile {oi.get('compile_s', float('nan')):.1f} s, rss {oi['rss'] / 1e6:.0f} MB")


def _brief_lcp(r: dict, shape: Shape) -> str:
    if "error" in r:
        return "ERROR " + r["error"]
    return ", ".join(f"prompt {shape.prompt / x['prompt_s']:.0f} / decode {shape.gen / x['generate_s']:.0f} tok/s"
                     for x in r["runs"])


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> dict:
    import jax
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    mem = ""
    try:
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory": mem, "python": platform.python_version(),
            "jax": jax.__version__, "numpy": np.__version__, "gguf": _version("gguf"),
            "llama_cpp_python": _version("llama_cpp_python"), "oi2jax_commit": _git_commit()}


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO,
                              timeout=10).stdout.strip()
    except OSError:
        return "?"


# ------------------------------------------------------------------------------------ the report

def _f(x, fmt="{:.1f}"):
    return "—" if x is None else fmt.format(x)


def _mb(n):
    return _f(None if n is None else n / 1e6, "{:.0f} MB")


def _rng(t, fmt="{:.1f}"):
    return "—" if t is None else f"{fmt.format(t[0])} ({fmt.format(t[1])}-{fmt.format(t[2])})"


def _target(ratio, ok):
    return "—" if ratio is None else f"{ratio:.2f}x {'met' if ok(ratio) else 'MISSED'}"


def report(res: dict) -> str:
    m, rows = res["meta"], res["rows"]
    s = m["shape"]
    lines = [f"# oi2jax against llama.cpp on the same GGUF files ({s['name']} shapes)", "",
             "`python -m benchmarks.llamacpp" + (" --quick" if s["name"] == "quick" else "") + "` (benchmarks/llamacpp.py: "
             "what is measured and how). Targets (issue 42): oi2jax >= 1.0x llama.cpp on decode and prompt for "
             f"{', '.join(TARGETED)}; resident memory <= 1.2x (GGUF + KV cache).", "",
             f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['threads']} threads for llama.cpp "
             f"(n_threads = n_threads_batch = {m['threads']}); XLA's CPU client uses its own thread pool",
             f"- load: before `{m['uptime_before']}`; after `{m['uptime_after']}` (a shared machine); the run took "
             f"{m.get('wall_s', 0) / 60:.1f} min",
             f"- versions: python {m['python']}, jax {m['jax']}, numpy {m['numpy']}, gguf {m['gguf']}, "
             f"llama-cpp-python {m['llama_cpp_python']}, oi2jax {m['oi2jax_commit']}",
             f"- model: Llama, {s['layers']} layers, D={s['hidden']}, {s['heads']} heads, {s['kv_heads']} KV heads, "
             f"F={s['intermediate']}, V={s['vocab']}, tied embeddings, rope theta {s['rope_theta']:g}; random weights "
             f"(std 0.02); context T={s['ctx']} for both tools; prompt {s['prompt']} tokens, then {s['gen']} greedy tokens",
             f"- copy rate (NumPy copy of 512 MB, read + written bytes): {m['copy_rate'] / 1e9:.1f} GB/s; the floor is "
             f"the GGUF's tensor bytes / this rate",
             f"- bare processes' peak RSS: python + jax + oi2jax {_mb(m['baseline_rss'].get('oi2jax'))}, python + "
             f"llama_cpp {_mb(m['baseline_rss'].get('llamacpp'))}"]
    sysinfo = next((r["lcp_system"] for r in rows if "lcp_system" in r), None)
    if sysinfo:
        lines.append(f"- llama.cpp system info: `{sysinfo}`")
    if not m["peer"]:
        lines.append("- llama-cpp-python is not installed here: llama.cpp's columns are empty")
    lines += ["", "## Decode (tokens/s after the prompt; llama.cpp: median (range) of its runs before and after oi2jax's)", "",
              "| type | llama.cpp tok/s | oi2jax tok/s | oi2jax / llama.cpp | llama.cpp ms/token | oi2jax ms/token | "
              "floor ms | llama.cpp / floor | oi2jax / floor | same greedy tokens |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        targeted = r["kind"].split()[0] in TARGETED
        lines.append(f"| {r['kind']} | {_rng(r.get('lcp_decode'))} | {_f(r.get('oi_decode'))} | "
                     f"{_target(r.get('decode_ratio'), lambda x: x >= 1.0) if targeted else _f(r.get('decode_ratio'), '{:.2f}x')} | "
                     f"{_f(r.get('lcp_ms'), '{:.2f}')} | {_f(r.get('oi_ms'), '{:.2f}')} | {r['floor_ms']:.2f} | "
                     f"{_f(r.get('lcp_ms') and r['lcp_ms'] / r['floor_ms'], '{:.1f}x')} | "
                     f"{_f(r.get('oi_ms') and r['oi_ms'] / r['floor_ms'], '{:.1f}x')} | "
                     f"{_f(r.get('same_prefix'), '{:d}')} of {s['gen']} |")
    lines += ["", f"## Prompt ({s['prompt']} tokens, tokens/s)", "",
              "| type | llama.cpp tok/s | oi2jax tok/s | oi2jax / llama.cpp | oi2jax compile s (apart; from the run's "
              "XLA cache when an earlier type compiled the same step) |", "|---|---|---|---|---|"]
    for r in rows:
        targeted = r["kind"].split()[0] in TARGETED
        lines.append(f"| {r['kind']} | {_rng(r.get('lcp_prompt'), '{:.0f}')} | {_f(r.get('oi_prompt'))} | "
                     f"{_target(r.get('prompt_ratio'), lambda x: x >= 1.0) if targeted else _f(r.get('prompt_ratio'), '{:.3f}x')} | "
                     f"{_f(r.get('oi_compile_s'))} |")
    if any("oi_warm_decode" in r or "warm_error" in r for r in rows):
        lines += ["", "## Warm: oi2jax's runs after its first, in one process (as llama.cpp's come after its warm-up eval)", "",
                  "`generate`'s work through the API, the same prompt and tokens, "
                  f"{REPS} + 1 times in one process: the first run pays XLA's first execution of each compiled "
                  "program (compiling left out, as `generate --stats` does: the columns above); the warm runs "
                  "do not. llama.cpp's runs all follow its warm-up. Median (range).", "",
                  "| type | llama.cpp decode | oi2jax warm decode | warm / llama.cpp | llama.cpp prompt | "
                  "oi2jax first prompt | oi2jax warm prompt | warm / llama.cpp |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "warm_error" in r:
                lines.append(f"| {r['kind']} | warm runs failed: {r['warm_error']} |")
                continue
            targeted = r["kind"].split()[0] in TARGETED
            ratio = (lambda key, fmt: _target(r.get(key), lambda x: x >= 1.0) if targeted else _f(r.get(key), fmt))
            lines.append(f"| {r['kind']} | {_rng(r.get('lcp_decode'))} | {_rng(r.get('oi_warm_decode'))} | "
                         f"{ratio('warm_decode_ratio', '{:.2f}x')} | {_rng(r.get('lcp_prompt'), '{:.0f}')} | "
                         f"{_f(r.get('oi_first_prompt'), '{:.0f}')} | {_rng(r.get('oi_warm_prompt'), '{:.0f}')} | "
                         f"{ratio('warm_prompt_ratio', '{:.2f}x')} |")
    lines += ["", "## Resident memory (peak RSS of each tool's process) and bytes read per token", "",
              "| type | GGUF | GGUF + KV cache (f32, T) | llama.cpp RSS (/ GGUF + cache) | oi2jax RSS | oi2jax / (GGUF + cache) | "
              "oi2jax device: weights + state (/ GGUF + that cache) | "
              "oi2jax .oinf | llama.cpp bytes/token | llama.cpp GB/s | oi2jax bytes/token (XLA) | oi2jax GB/s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r.get("oi_rss") and r["oi_rss"] / r["ref_mem"]
        lcp_mem = f" ({r['lcp_rss'] / r['ref_mem']:.2f}x)" if r.get("lcp_rss") else ""
        device = (f"{_mb(r['oi_device'])} ({_target(r['oi_device'] / r['oi_device_ref'], lambda x: x <= 1.2)})"
                  if r.get("oi_device") else "n/a")
        lines.append(f"| {r['kind']} | {_mb(r['gguf_bytes'])} | {_mb(r['ref_mem'])} | {_mb(r.get('lcp_rss'))}{lcp_mem} | "
                     f"{_mb(r.get('oi_rss'))} | {_target(ratio or None, lambda x: x <= 1.2)} | {device} | "
                     f"{_mb(r.get('oinf_bytes'))} | "
                     f"{_mb(r.get('lcp_bytes'))} | {_f(r.get('lcp_gbs'))} | {_mb(r.get('oi_bytes'))} | {_f(r.get('oi_gbs'))} |")
    lines += ["", "oi2jax device: the bytes the device holds for the generation (`generate --stats`' memory line: "
              "the placed weights, each buffer once, and one sequence's state, its KV cache at capacity), against the "
              "GGUF's size plus that cache. The process's RSS also holds Python and JAX (the bare process's above), XLA's "
              "compiled programs and the compiler's own peak.",
              "", "llama.cpp's bytes/token: the GGUF's tensor bytes + its f16 KV cache's filled rows at the mean decode "
              "position; oi2jax's: XLA's cost analysis of the compiled step (`bytes accessed`: every operand and "
              "result of every HLO op, so it counts intermediates too; a loop body once; with `--kernels ggml`, plus the "
              "GGML-block weights its jax.ffi calls read, which XLA does not see).", ""]
    errors = [(r["kind"], k, r[k]) for r in rows for k in ("lcp_error", "oi_error", "cost_error") if k in r]
    if errors:
        lines += ["## Errors", ""] + [f"- {kind} {k.split('_')[0]}: {e}" for kind, k, e in errors] + [""]
    lines += ["## The model files", "", "| type | GGUF | tensor bytes by GGML type | written in (s; NumPy quantizers, "
              "the random weights apart) |", "|---|---|---|---|"]
    firsts = {r["kind"].split()[0]: r for r in reversed(rows)}  # each type once (its first row)
    lines += [f"| {kind} | {_mb(r['gguf_bytes'])} | "
              f"{', '.join(f'{t} {_mb(n)}' for t, n in sorted(r.get('types', {}).items(), key=lambda t: -t[1]))} | "
              f"{r['write_s']:.1f} |" for kind, r in reversed(firsts.items())]
    for r in rows:
        if "profile" in r:
            lines += ["", *profile_table(r), "", *gap(r, m["copy_rate"])]
    return "\n".join(lines) + "\n"


def _json_default(x):
    if isinstance(x, Path):
        return str(x)
    raise TypeError(type(x).__name__)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        kind, args = argv[1], argv[2:]
        if kind == "llamacpp":
            res = llamacpp_worker(args[0], args[1], *map(int, args[2:]))
        elif kind == "profile":
            res = profile_worker(args[0], args[1], args[2], kernels=args[3], kv_dtype=args[4] or None)
        elif kind == "warm":
            res = warm_worker(args[0], args[1], args[2], int(args[3]), args[4], REPS, kv_dtype=args[5] or None)
        else:
            res = cost_worker(args[0], args[1], kernels=args[2], kv_dtype=args[3] or None)
        print(json.dumps(res))
        return 0
    p = argparse.ArgumentParser(description="oi2jax against llama.cpp (llama-cpp-python) on the same GGUF files.")
    p.add_argument("--quick", action="store_true", help="a 2-layer D=256 model (seconds)")
    p.add_argument("--ctx", type=int, default=None, help="the context T of both tools (default 1024; quick 64)")
    p.add_argument("--gen", type=int, default=None, help="tokens generated (default 64; quick 8)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"GGUF types, comma-separated (default {','.join(KINDS)})")
    p.add_argument("--profile", default=PROFILE_KIND, help="the types whose oi2jax step is profiled ('' for none)")
    p.add_argument("--no-peer", action="store_true", help="oi2jax only")
    p.add_argument("--kernels", default=None, help="oi2jax's kernel sets, comma-separated (default jax,ggml where "
                                                   "llama-cpp-python is installed, else jax)")
    p.add_argument("--kv-dtypes", default="", help="oi2jax's K/V cache dtypes, comma-separated: 'none' as the "
                                                   "graph declares it (f32), 'f16' as llama.cpp keeps its own "
                                                   "(default none)")
    p.add_argument("--threads", type=int, default=THREADS, help=f"llama.cpp's threads (default {THREADS})")
    p.add_argument("--reps", type=int, default=REPS, help=f"llama.cpp's runs per process (two processes; default {REPS})")
    p.add_argument("--cache", type=Path, default=CACHE, help="where the GGUF files are kept")
    p.add_argument("--out", type=Path, default=HERE / "results", help="the results folder")
    args = p.parse_args(argv)
    shape = QUICK if args.quick else FULL
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        p.error(f"--kinds: {', '.join(bad)} not among {', '.join(KINDS)}")
    from dataclasses import replace
    shape = replace(shape, ctx=args.ctx or shape.ctx, gen=args.gen or shape.gen)
    if shape.prompt + shape.gen > shape.ctx:
        p.error(f"--ctx {shape.ctx} holds fewer than the prompt's {shape.prompt} + {shape.gen} generated tokens")
    kv_dtypes = [None if k == "none" else k for k in (args.kv_dtypes or "none").split(",") if k]
    if set(kv_dtypes) - {None, *TABLE_DTYPES}:
        p.error(f"--kv-dtypes: {args.kv_dtypes} (expected none, {', '.join(TABLE_DTYPES)})")
    name = "llamacpp" + ("-quick" if args.quick else "") + ("-kv" if kv_dtypes != [None] else "")
    args.out.mkdir(parents=True, exist_ok=True)

    def write(res):
        for suffix, data in ((".md", report(res)), (".json", json.dumps(res, indent=1, default=_json_default))):
            tmp = args.out / (name + suffix + ".tmp")
            tmp.write_text(data)
            os.replace(tmp, args.out / (name + suffix))

    kernels = [k for k in (args.kernels or ("jax,ggml" if have_llama_cpp() else "jax")).split(",") if k]
    if set(kernels) - {"jax", "ggml"}:
        p.error(f"--kernels: {args.kernels} (expected jax, ggml or both)")
    res = bench(shape, kinds, cache=args.cache, peer=False if args.no_peer else None,
                profile=[k for k in args.profile.split(",") if k], reps=args.reps, threads=args.threads,
                on_row=write, kernels=kernels, kv_dtypes=kv_dtypes)
    print(report(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
