"""Python API: `oi2jax.compile(source_or_path, model=None, sizes=None, device=None) -> Program`."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import jax

from . import pipeline
from .diagnostics import OiError
from .interpret import InterpretedProgram
from .lowering.loops import check_unroll
from .ops.numerical import PRECISIONS
from .protocol import CompileOptions
from .runtime.executor import check_build, check_schedule
from .runtime.program import Program
from .runtime.sharding import compile_sharded
from .xla_cache import reopen_cache, user_cache_base, watch
from .quantized.ggml import check_kernels
from .pipeline import load_graph, load_graph_json, load_model  # re-exported: the loaders live in the pipeline

__all__ = ["compile", "Program", "CompileOptions", "load_graph", "load_graph_json", "load_model",
           "enable_compilation_cache", "default_cache_dir", "MODES", "YIELD_MODES"]

MODES = ("compiled", "interpret")
YIELD_MODES = ("driver", "fused")


def default_cache_dir() -> Path:
    """Where compiled XLA executables persist: $OI2JAX_CACHE_DIR, else $XDG_CACHE_HOME/oi2jax/xla,
    else ~/.cache/oi2jax/xla."""
    if os.environ.get("OI2JAX_CACHE_DIR"):
        return Path(os.environ["OI2JAX_CACHE_DIR"]).expanduser()
    return user_cache_base() / "xla"


def enable_compilation_cache(cache_dir="default") -> str | None:
    """Turn on JAX's persistent compilation cache in `cache_dir` ("default": `default_cache_dir()`;
    None or "none": leave it off). Every executable is cached (no minimum compile time or size), so a
    second run of an unchanged graph skips XLA compilation. Process-wide; returns the directory."""
    if cache_dir == "default" and os.environ.get("OI2JAX_CACHE_DIR", "").lower() == "none":
        cache_dir = None  # OI2JAX_CACHE_DIR=none: off unless a directory is given explicitly
    if cache_dir is None or str(cache_dir).lower() == "none":
        return None
    explicit = cache_dir != "default" or bool(os.environ.get("OI2JAX_CACHE_DIR"))
    try:
        path = default_cache_dir() if cache_dir == "default" else Path(os.fspath(cache_dir)).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable", str(path))
    except (OSError, RuntimeError) as exc:
        if isinstance(exc, FileExistsError):  # mkdir's `[Errno 17] File exists` of a file in the way
            exc = f"{exc.filename} is a file, not a directory"
        if explicit:  # a directory the user named: an error
            raise OiError(f"cannot use cache directory {cache_dir}: {exc}") from None
        # the default cache is only an optimisation: run without it, and say so
        print(f"warning: compilation cache disabled (cannot use the default cache directory: {exc}); "
              f"set OI2JAX_CACHE_DIR or --cache-dir to choose one", file=sys.stderr)
        return None
    if jax.config.jax_compilation_cache_dir not in (None, str(path)):
        reopen_cache()  # JAX opens its cache once per process: a new directory needs it reopened
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    watch(str(path))  # a damaged entry: one `warning:` line, compiled again and replaced (xla_cache.py)
    return str(path)


def compile(source_or_path, model=None, sizes=None, device=None, mode: str = "compiled",
            yield_mode: str = "driver", trace=None, mesh=None, shard=None, placement=None, cache_dir=None,
            build: str = "concurrent", schedule: str = "dataflow", precision: str = "highest",
            zero_missing_inputs: bool = False, ops=None, unroll="auto", widen_floats: bool = False,
            kernels: str = "jax", table_dtype=None):
    """Parse, check, bind the model and lower: returns a `Program` (or the interpreter's).

    `ops`: op sets besides OpenInfer's 47 ops (docs/ops.md): bundled set names (`"nn"`), `.py` or
    `.json` op files, module names, entry points of the `oi2jax.ops` group, modules, decorated
    functions, or an `oi2jax.ops.Registry`.

    `mesh` (a `jax.sharding.Mesh`, or 'data=4,model=2') with `shard` ({size variable: mesh axis})
    shards the program over the mesh (runtime/sharding.py, docs/scaling.md).
    Graphs with yield/await run under `yield_mode="driver"` (default: entry phases and consumer
    blocks as separate kernels, `placement={"block": device | "cpu:1"}`; runtime/driver.py,
    docs/yield_await.md) or `"fused"` (one jit); graphs without yield are one jit either way.
    `build="concurrent"` (default) compiles the driver's kernels on a thread pool and starts running
    as soon as the first is built; `"sequential"` compiles them all first. `schedule="dataflow"`
    (default) starts each consumer as soon as what it awaits is yielded (a ready queue);
    `"linear"` runs the kernels in a fixed topological order, one at a time (debugging; identical
    results). Both only matter for the yield/await driver (runtime/executor.py, docs/executor.md).
    `precision` ("highest" | "high" | "default"): float matmul precision. "highest" (default) keeps
    OpenInfer's exact f32 numerics; "high"/"default" allow XLA's faster TF32/bf16 paths on GPU and
    TPU (results then differ from OpenInfer in the low bits; docs/semantics.md). The reference
    interpreter always computes exactly.
    `unroll` ("auto" | "none" | "full" | an int k): how `loop` lowers (docs/loops.md). "auto"
    (default) unrolls layer loops (a body reading `W[l]`) on GPU/TPU within a size budget and
    keeps every loop on CPU; "none" always a `lax.fori_loop`; "full" every loop with a static trip
    count unrolled (static slices of the stacked weights); k: `fori_loop(..., unroll=k)`. The
    values are the same bit for bit whichever is chosen; a trip count read at run time is a loop.
    `model`: a `.oinf` path or an open `Model`; None (default): the graph's `.oinf` beside it when
    the graph is given as a path and that file exists (`pipeline.choose_model`; `program.model_path`
    says which file was used); False: no model.
    A run without an input that the graph reads and that has no model tensor or `@init`, and a
    constant with no model tensor and no `@init`, are errors naming them; `zero_missing_inputs=True`
    asks for OpenInfer's zero-filled default.
    `widen_floats=True` (an oi2jax extension, off by default): a constant declared f32 reads a bf16
    or f16 model tensor as its exact f32 values (an f32 graph on a bf16 checkpoint's conversion,
    as if converted with --dtype f32); without it that is a dtype mismatch, as in OpenInfer.
    `kernels` ("jax" | "ggml", an opt-in on CPU): "jax" (default) multiplies weights kept in GGML
    blocks with oi2jax's pure-JAX kernels (gguf's dequantized values, then the f32 op); "ggml" keeps
    them as GGUF's raw blocks and runs a `linear` of up to 8 rows through ggml's own CPU kernels,
    with llama.cpp's numerics (activations rounded to 8 bits per block): needs llama-cpp-python
    installed (quantized/ggml.py, docs/performance.md).
    `table_dtype` ("f16" | "bf16" | "f32", an oi2jax extension, off by default): every float cache
    table of the persistent section is stored in that dtype, values rounded once when written
    (a KV cache in f16 holds and reads half the bytes of an f32 one; oi2jax/tables.py,
    docs/semantics.md "Table dtype")."""
    unroll = check_unroll(unroll)
    if mode == "interpret" and unroll != "auto":
        raise OiError(f"unroll={unroll!r} applies to compiled programs; the interpreter runs loops as written")
    if precision not in PRECISIONS:
        raise OiError(f"unknown precision {precision!r} (expected one of {', '.join(PRECISIONS)})")
    check_build(build)
    check_schedule(schedule)
    if mode not in MODES:
        raise OiError(f"unknown mode {mode!r} (expected one of {', '.join(MODES)})")
    if cache_dir is not None:  # `cache_dir=`: persistent XLA cache (enable_compilation_cache)
        enable_compilation_cache(cache_dir)
    if yield_mode not in YIELD_MODES:
        raise OiError(f"unknown yield_mode {yield_mode!r} (expected one of {', '.join(YIELD_MODES)})")
    check_kernels(kernels)
    options = CompileOptions(precision=precision, unroll=unroll, yield_mode=yield_mode, placement=placement,
                             build=build, schedule=schedule, kernels=kernels)
    # load -> check -> bind, shared with export and the CLI
    bound = pipeline.bound(source_or_path, model, sizes, ops, zero_missing_inputs=bool(zero_missing_inputs),
                           widen_floats=bool(widen_floats), table_dtype=table_dtype)
    if mode == "interpret":
        if precision != "highest":
            raise OiError(f"precision={precision!r} applies to compiled programs; the interpreter always "
                          f"computes at the highest precision")
        if kernels != "jax":
            raise OiError(f"kernels={kernels!r} applies to compiled programs; the interpreter computes "
                          f"quantized weights exactly (gguf's dequantized values)")
        if mesh is not None or shard:  # as the CLI refuses --mesh/--shard with --interpret
            raise OiError("mesh=/shard= apply to compiled programs; the interpreter runs on one device")
        return InterpretedProgram(bound, options, trace=trace)
    if kernels == "ggml" and (mesh is not None or shard):
        raise OiError("kernels='ggml' runs on one CPU device; it cannot be combined with mesh=/shard=")
    if mesh is not None or shard:
        if mesh is None:
            raise OiError("shard= needs a mesh= (a jax.sharding.Mesh)")
        if device is not None:
            raise OiError("give either device= or mesh=, not both")
        if placement:
            raise OiError("placement= cannot be combined with mesh= (a sharded program is one jit)")
        return compile_sharded(bound, mesh, shard, options)  # one jit: the fused step
    if placement and not (bound.checked.yield_phases.has_yield and yield_mode == "driver"):
        raise OiError("placement needs a graph with yield/await run with yield_mode=\"driver\"")
    return Program(bound, options, device=device)


