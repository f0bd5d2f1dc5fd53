"""Python API: `oi2jax.compile(source_or_path, model=None, sizes=None, device=None) -> Program`."""
from __future__ import annotations

import os
from pathlib import Path

from .diagnostics import OiError

MODES = ("compiled", "interpret")
YIELD_MODES = ("driver", "fused")


def load_graph_json(data, path: str = "<json>"):
    """A graph in OpenInfer graph-JSON form (SPEC §8.1): a dict, or the path of a `.json` file."""
    import json
    from .graph_json import from_json
    if not isinstance(data, dict):
        path = os.fspath(data)
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise OiError(f"graph file not found: {path}") from None
        except (OSError, ValueError) as exc:
            raise OiError(f"{path}: cannot read graph JSON: {exc}") from None
        except RecursionError:
            raise OiError(f"{path}: cannot read graph JSON: nested too deeply for the JSON reader") from None
    try:
        graph = from_json(data, path)
    except (KeyError, ValueError, TypeError, AttributeError, IndexError, RecursionError) as exc:
        raise OiError(f"{path}: not an OpenInfer graph JSON (SPEC §8.1): "
                      f"{type(exc).__name__}: {exc}") from None
    try:
        _validate_json_graph(graph, path)
    except RecursionError:
        raise OiError(f"{path}: not a valid graph: nested too deeply (loops nest at most "
                      f"32 deep)") from None
    return graph


def _validate_json_graph(graph, path: str) -> None:
    """Names and dims from JSON pass exactly the grammar's rules: the graph is written as DSL text
    and parsed again (a name like `x/../../OUT` or an empty one, a dim "-5", a Rust keyword are
    errors here, before anything uses them as file or archive member names)."""
    from .grammar.fmt import format_graph
    from .grammar.parse import parse
    text = format_graph(graph)
    try:
        parse(text, path)
    except OiError as exc:
        first = exc.diagnostics[0]
        line = text.splitlines()[first.span.line - 1].strip() if first.span and first.span.line else ""
        raise OiError(f"{path}: not a valid graph: {first.message} (in `{line}`)") from None


def load_graph(source_or_path):
    """A path to a `.oi` file or a `.json` graph (SPEC §8.1), a graph-JSON dict, or the program text."""
    from .grammar.parse import parse, parse_file
    from .pipeline import graph_path
    if isinstance(source_or_path, dict):
        return load_graph_json(source_or_path)
    path = graph_path(source_or_path)  # the one rule for "a path, not program text" (also the model's)
    if path is None:
        return parse(str(source_or_path))
    return load_graph_json(path) if path.endswith(".json") else parse_file(path)


def default_cache_dir() -> Path:
    """Where compiled XLA executables persist: $OI2JAX_CACHE_DIR, else $XDG_CACHE_HOME/oi2jax/xla,
    else ~/.cache/oi2jax/xla."""
    if os.environ.get("OI2JAX_CACHE_DIR"):
        return Path(os.environ["OI2JAX_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "oi2jax" / "xla"


def enable_compilation_cache(cache_dir="default") -> str | None:
    """Turn on JAX's persistent compilation cache in `cache_dir` ("default": `default_cache_dir()`;
    None or "none": leave it off). Every executable is cached (no minimum compile time or size), so a
    second run of an unchanged graph skips XLA compilation. Process-wide; returns the directory."""
    if cache_dir == "default" and os.environ.get("OI2JAX_CACHE_DIR", "").lower() == "none":
        cache_dir = None  # OI2JAX_CACHE_DIR=none: off unless a directory is given explicitly
    if cache_dir is None or str(cache_dir).lower() == "none":
        return None
    import jax
    explicit = cache_dir != "default" or bool(os.environ.get("OI2JAX_CACHE_DIR"))
    try:
        path = default_cache_dir() if cache_dir == "default" else Path(os.fspath(cache_dir)).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable", str(path))
    except (OSError, RuntimeError) as exc:
        if explicit:  # a directory the user named: an error
            raise OiError(f"cannot use cache directory {cache_dir}: {exc}") from None
        # the default cache is only an optimisation: run without it, and say so
        import sys
        print(f"warning: compilation cache disabled (cannot use the default cache directory: {exc}); "
              f"set OI2JAX_CACHE_DIR or --cache-dir to choose one", file=sys.stderr)
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    from .xla_cache import watch
    watch(str(path))  # a damaged entry: one `warning:` line, compiled again and replaced (xla_cache.py)
    return str(path)


def load_model(model):
    """An open `Model` from a path (a `Model` as it is); None for None or False (no model)."""
    from .model import Model, open_model
    if model is None or model is False:
        return None
    if isinstance(model, Model):
        return model
    return open_model(os.fspath(model))


def compile(source_or_path, model=None, sizes=None, device=None, mode: str = "compiled",
            yield_mode: str = "driver", trace=None, mesh=None, shard=None, placement=None, cache_dir=None,
            build: str = "concurrent", schedule: str = "dataflow", precision: str = "highest",
            zero_missing_inputs: bool = False, ops=None, unroll="auto"):
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
    asks for OpenInfer's zero-filled default."""
    from .lowering.loops import check_unroll
    unroll = check_unroll(unroll)
    if mode == "interpret" and unroll != "auto":
        raise OiError(f"unroll={unroll!r} applies to compiled programs; the interpreter runs loops as written")
    return _compile(source_or_path, model, sizes, device, mode, yield_mode, trace, mesh, shard, placement,
                    cache_dir, build, schedule, precision, ops, unroll, bool(zero_missing_inputs))


def _compile(source_or_path, model, sizes, device, mode, yield_mode, trace, mesh, shard, placement, cache_dir,
             build, schedule, precision, ops=None, unroll="auto", zero_missing_inputs=False):
    from .runtime.executor import check_build, check_schedule
    from .ops.numerical import PRECISIONS
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
    from . import pipeline
    # load -> check -> bind, shared with export and the CLI
    bound = pipeline.bound(source_or_path, model, sizes, ops, zero_missing_inputs=zero_missing_inputs)
    graph = bound.graph
    if mode == "interpret":
        if precision != "highest":
            raise OiError(f"precision={precision!r} applies to compiled programs; the interpreter always "
                          f"computes at the highest precision")
        from .interpret import InterpretedProgram
        return InterpretedProgram(bound, trace=trace)
    if mesh is not None or shard:
        if mesh is None:
            raise OiError("shard= needs a mesh= (a jax.sharding.Mesh)")
        if device is not None:
            raise OiError("give either device= or mesh=, not both")
        if placement:
            raise OiError("placement= cannot be combined with mesh= (a sharded program is one jit)")
        from .runtime.sharding import compile_sharded
        program = compile_sharded(bound, mesh, shard, yield_mode=yield_mode, unroll=unroll)
        program.precision = precision
        return program
    from .runtime.program import Program
    from .phases import has_yield
    if has_yield(graph) and yield_mode == "driver":
        program = Program(bound, device=device, yield_mode="driver",
                          driver={"placement": placement, "build": build, "schedule": schedule}, unroll=unroll)
    elif placement:
        raise OiError("placement needs a graph with yield/await run with yield_mode=\"driver\"")
    else:
        program = Program(bound, device=device, yield_mode=yield_mode, unroll=unroll)
    program.precision = precision
    return program


def __getattr__(name):
    if name == "Program":
        from .runtime.program import Program
        return Program
    raise AttributeError(name)
