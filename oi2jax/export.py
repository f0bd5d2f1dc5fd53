"""`oi2jax export`: the step function as a serialized `jax.export` artifact (StableHLO).

What is written (for `-o step.jaxexport`):

* `step.jaxexport` -- `jax.export.Exported.serialize()` bytes of
  `step(state, dynamic: dict) -> (state, outputs: dict)`, the state plain nested dicts
  `{"vars": {P: value}, "caches": {T: {"data", "size"[, "present"]}}, "guards": {"err",
  "errval", "grow"}}` (no custom pytree node: `jax.export.deserialize` needs nothing else).
  The graph's constants (model weights, prefix-table families, non-uniform `@init` fills)
  are **baked into the artifact** as StableHLO constants: calling it needs nothing but JAX
  (no oi2jax, no `.oinf`). The price is artifact size ~ model size.
* `step.jaxexport.json` -- the manifest (see `MANIFEST_FORMAT`, docs/ecosystem.md): the state by
  its structure (`state.vars`, `state.caches`, `state.guards`), inputs/outputs (names, shapes,
  dtypes), graph sha256, JAX version, serialization version and compatibility window, x64
  requirement, yield mode, runtime-guard messages.
* `step.jaxexport.init.npz` -- the initial state and the default value of every input
  (keys are listed in the manifest: each state buffer's `npz_key`, `inputs[i].default_npz_key`).

Loading it back (oi2jax not needed)::

    import json, numpy as np, jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)          # the artifact is 64-bit (manifest: "x64")
    exp = jax.export.deserialize(open("step.jaxexport", "rb").read())
    man = json.load(open("step.jaxexport.json")); npz = np.load("step.jaxexport.init.npz")
    buf = lambda key, dtype: npz[key].view(jnp.dtype(dtype))  # bf16/f8 are stored as their bits (uint16/8)
    st = man["state"]
    state = {"vars": {v["name"]: buf(v["npz_key"], v["dtype"]) for v in st["vars"]},
             "caches": {c["name"]: {part: buf(c[part]["npz_key"], c[part]["dtype"])
                                    for part in ("data", "size", "present") if part in c} for c in st["caches"]},
             "guards": {g: buf(st["guards"][g]["npz_key"], st["guards"][g]["dtype"]) for g in ("err", "errval", "grow")}}
    dynamic = {d["name"]: buf(d["default_npz_key"], d["dtype"]) for d in man["inputs"]}
    state, outputs = exp.call(state, dynamic)

Graphs with yield/await are exported in their fused form (one function, snapshot semantics).
Runtime guards do not raise inside the artifact: after a step, `state["guards"]["err"] != 0`
means the step failed (the failing write was skipped, never clamped; later nodes of the step
still ran) with message `manifest["errors"][err - 1]` (`{value}` = `state["guards"]["errval"]`);
`any(state["guards"]["grow"] > 0)` means a growable cache ran out of capacity (the step was
undone; the artifact cannot grow: growable dims are exported at the initial capacity, 4 rows
(an `@auto_dim` dim: base + 4) -- a table dim that needs more takes `@fixed(i=N)`). A runtime-shaped output
(an `@auto_dim` tensor's current shape) comes as `{"value": array at capacity, "logical_shape":
int64[rank]}` (manifest: its `logical_shape` entry).

`symbolic=("B",)` exports with the size variable B as a `jax.export.symbolic_shape` dimension.
Limits: only dims of dynamic / volatile variables and temporaries may mention B; constants,
persistent state and non-uniform `@init` fills need concrete shapes; B must not be used as a
value (loop bound, cache index, attribute) -- each of these is a clear error.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np

from . import ir, pipeline
from .diagnostics import Diagnostic, OiError, suggest
from .graph_json import to_json
from .lowering import locations, loops
from .lowering.caches import TABLE
from .lowering.context import ErrorSites
from .lowering.state import Shaped
from .npz import refuse_inputs_as_outputs, save_npz, write_atomic, write_text_atomic
from .protocol import CompileOptions
from .runtime.placement import lowering_platform
from .runtime.program import Program

MANIFEST_FORMAT = "oi2jax-export/2"
COMPATIBILITY = ("jax.export guarantees: an artifact serialized by this JAX runs on JAX versions "
                 "released up to 6 months later (backward compatibility), and the serialization "
                 "version must be supported by the loading JAX (forward compatibility ~ 3 weeks)")


def _dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def _npz_bits(value: np.ndarray) -> np.ndarray:
    """`value` as the init `.npz` holds it: NumPy's `.npy` has no bfloat16 / float8 (a bf16 array
    reads back as raw `|V2` records, an f8 one not at all: its `<f1` header is refused), so those
    are stored as their bits, uint16 / uint8; the loader views them as the manifest's dtype."""
    if value.dtype.name in ("bfloat16", "float8_e5m2"):
        return value.view(np.dtype(f"uint{8 * value.dtype.itemsize}"))
    return value


def _shape_json(shape) -> list:
    return [d if isinstance(d, int) else str(d) for d in shape]


def _check_symbolic(graph: ir.Graph, symbolic: tuple[str, ...]) -> None:
    """Symbolic size variables may only shape dynamic / volatile / temporary values."""
    wanted = set(symbolic)
    problems = []
    for decl in graph.vars:
        names = {n for d in decl.dims for n in d.names}
        if names & wanted and decl.kind in (ir.MemKind.CONSTANT, ir.MemKind.PERSISTENT):
            problems.append(f"{decl.kind.value} {decl.name} has a dim in {sorted(names & wanted)[0]}")
    if problems:
        raise OiError(f"cannot export with symbolic {', '.join(symbolic)}: " + "; ".join(problems)
                      + " (only dynamic/volatile shapes may be symbolic)")
    # a symbolic size used as a value: a table's @fixed capacity (the artifact would keep the bound
    # value's capacity while the manifest calls the size symbolic) or a loop bound
    located = []
    head = f"cannot export with symbolic {', '.join(symbolic)}"
    for decl in graph.vars:
        for index, size in decl.fixed:
            if isinstance(size, str) and size in wanted:
                located.append(Diagnostic(f"{head}: @fixed({index}={size}) of {decl.name} uses {size} as a table "
                                          f"capacity, a value; export without --symbolic {size} or use --size",
                                          decl.span))
    for block in graph.blocks:
        for node in block.walk():
            if isinstance(node, ir.Loop):
                for bound in (node.start, node.end):
                    if isinstance(bound, str) and bound in wanted and graph.var(bound) is None:
                        located.append(Diagnostic(f"{head}: loop {node.name} uses {bound} as a loop bound, a "
                                                  f"value; export without --symbolic {bound} or use --size",
                                                  node.span))
    if located:
        raise OiError(located, source=graph.source or None)


def _symbolic_bound(bound, symbolic: tuple[str, ...]):
    """A copy of `bound` whose shapes mention the symbolic dims (sizes[B] is the symbolic dim)."""
    dims = jax.export.symbolic_shape(",".join(symbolic))
    sym = dict(zip(symbolic, dims))
    sizes = dict(bound.sizes)
    sizes.update(sym)
    graph = bound.graph
    shapes = {}
    for name, shape in bound.shapes.items():
        decl = graph.var(name) or graph.temporaries.get(name)
        decl_dims = getattr(decl, "dims", None)
        if decl_dims is not None and any(n in sym for d in decl_dims for n in d.names):
            shapes[name] = tuple(d.resolve(sizes) for d in decl_dims)
        else:
            shapes[name] = shape
    return bound.with_shapes(sizes, shapes)


EXPORT_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def _names(value) -> list[str]:
    """A name list as the CLI takes it: `"cpu,cuda"`, `["cpu", "cuda"]` or `["cpu,cuda"]` (a
    string is one comma-separated list, never iterated character by character)."""
    items = [value] if isinstance(value, str) else list(value)
    return [part.strip() for item in items for part in str(item).split(",") if part.strip()]


def export_platforms(platforms=None) -> tuple[str, ...]:
    """The lowering platforms to export for (`runtime.placement.lowering_platform`: `gpu`,
    JAX's name of any GPU device or backend, becomes `cuda` or `rocm`); default: the platform
    of JAX's default backend. Unknown names are an OiError."""
    if platforms is not None:
        platforms = _names(platforms)
    if not platforms:
        return (lowering_platform(jax.default_backend()),)
    out = []
    for platform in platforms:
        if platform not in EXPORT_PLATFORMS and platform != "gpu":
            raise OiError(f"unknown platform {platform!r}{suggest(platform, EXPORT_PLATFORMS)} "
                          f"(jax.export platforms: {', '.join(EXPORT_PLATFORMS)})")
        out.append(lowering_platform(platform))
    return tuple(dict.fromkeys(out))


def build_export(source_or_path, model=None, sizes=None, symbolic=(), platforms=None, ops=None, unroll="auto",
                 zero_missing_inputs=False, widen_floats=False, table_dtype=None):
    """(exported, manifest, npz_arrays) for the graph; nothing written. `model`: as `oi2jax.compile`
    (default: the `.oinf` beside a graph path, pipeline.choose_model; False: none). `unroll`: the
    loop policy (docs/loops.md) for the export platforms (an accelerator's when any is one).
    `table_dtype`: as `oi2jax.compile`'s."""
    unroll = loops.check_unroll(unroll)

    symbolic = tuple(dict.fromkeys(_names(symbolic or ())))
    platforms = export_platforms(platforms)
    bound = pipeline.bound(source_or_path, model, sizes, ops,  # the checker already refuses deadlocks
                           zero_missing_inputs=zero_missing_inputs, widen_floats=widen_floats,
                           table_dtype=table_dtype)
    graph = bound.graph
    unknown = [s for s in symbolic if s not in bound.sizes]
    if unknown:
        raise OiError(f"--symbolic {unknown[0]}: not a size variable of the graph/model{suggest(unknown[0], bound.sizes)} "
                      f"(known: {', '.join(sorted(bound.sizes)) or '(none)'})")
    if symbolic:
        _check_symbolic(graph, symbolic)
    fused = bound.checked.yield_phases.has_yield
    program = Program(bound, CompileOptions(yield_mode="fused", unroll=unroll, platform=loops.platform_of(platforms)))
    exe = program.executable
    builder, spec = exe.builder, exe.state_spec
    with program.scope():
        state0 = jax.tree.map(np.asarray, spec.to_tree(spec.to_env(exe.initial_host_state())))
        defaults = {k: np.asarray(v) for k, v in exe.defaults.items()}
        consts = exe.consts
        lowering = exe.lowering
        trace_builder = builder
        if symbolic:
            sbound = _symbolic_bound(bound, symbolic)
            lowering = replace(exe.lowering, bound=sbound, error_sites=ErrorSites())
            trace_builder = builder.for_lowering(lowering)
            for name in builder.init_args:
                if sbound.shape(name) != bound.shape(name):
                    raise OiError(f"cannot export with symbolic {', '.join(symbolic)}: {name} has a non-uniform "
                                  "@init/model value whose shape depends on it")
            dyn_shapes = {n: sbound.shape(n) for n in builder.dynamic}
        else:
            dyn_shapes = {n: defaults[n].shape for n in builder.dynamic}

        def step(state, dynamic):
            new, outputs = trace_builder(consts, spec.from_tree(state), dynamic)
            return spec.to_tree(new), {k: _plain_output(v) for k, v in outputs.items()}

        state_spec = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), state0)
        dyn_spec = {n: jax.ShapeDtypeStruct(dyn_shapes[n], defaults[n].dtype) for n in builder.dynamic}
        try:
            exported = jax.export.export(jax.jit(step), platforms=tuple(platforms))(state_spec, dyn_spec)
        except OiError:
            raise
        except Exception as exc:
            refused = _unserializable(exc, jax.jit(step), (state_spec, dyn_spec), graph)
            if refused is not None:
                raise refused from None
            if not symbolic:
                raise
            # a kernel calling back into Python fails to lower with symbolic shapes at all: say that,
            # found in the step lowered at the bound sizes, rather than blame the symbolic size
            def concrete(state, dynamic):
                new, outputs = builder(consts, spec.from_tree(state), dynamic)
                return spec.to_tree(new), {k: _plain_output(v) for k, v in outputs.items()}
            bound_dyn = {n: jax.ShapeDtypeStruct(defaults[n].shape, defaults[n].dtype) for n in builder.dynamic}
            refused = _unserializable(NotImplementedError("host_callbacks"), jax.jit(concrete),
                                      (state_spec, bound_dyn), graph, located_only=True)
            if refused is not None:
                raise refused from None
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise OiError(f"cannot export with symbolic {', '.join(symbolic)}: the lowering needs a concrete "
                          f"value there ({type(exc).__name__}: {first}); export without --symbolic or use "
                          f"--size") from None
    out_avals = exported.out_avals
    out_tree = exported.out_tree
    _, out_outputs = jax.tree_util.tree_unflatten(out_tree, list(out_avals))
    if graph.source:
        source = graph.source
    else:  # a graph-JSON graph: hash its canonical JSON
        source = json.dumps(to_json(graph), sort_keys=True)
    npz: dict[str, np.ndarray] = {}

    def buffer(value) -> dict:
        key = f"state_{len(npz)}"
        npz[key] = _npz_bits(value)
        return {"shape": list(value.shape), "dtype": _dtype_name(value.dtype), "npz_key": key}

    layouts = exe.lowering.caches
    state_entries = {
        "vars": [{"name": name, "dsl_dtype": layouts[name].dtype, **buffer(value)}
                 for name, value in sorted(state0["vars"].items())],
        "caches": [],
        "guards": {g: buffer(state0["guards"][g]) for g in ("err", "errval", "grow")},
    }
    for name, parts in sorted(state0["caches"].items()):
        layout = layouts[name]
        entry = {"name": name, "kind": layout.kind.value, "dsl_dtype": layout.dtype, "base_shape": list(layout.shape),
                 "view": ("tables: data[:size[0], :size[1], ...]" if layout.kind is TABLE
                          else "auto_dim: data[:base_shape[0]+size[0], ...]")}
        entry.update({part: buffer(value) for part, value in parts.items()})
        state_entries["caches"].append(entry)
    state_entries["guards"]["note"] = (
        "err != 0: a runtime guard fired (the failing write was skipped; the error is sticky); message "
        "errors[err-1] with {value} = errval. any(grow > 0): a growable cache is full; the step was undone "
        "(the artifact cannot grow).")
    inputs = []
    for i, name in enumerate(builder.dynamic):
        key = f"input_{i}"
        npz[key] = _npz_bits(defaults[name])
        inputs.append({"name": name, "dsl_dtype": bound.dtype(name), "shape": _shape_json(dyn_shapes[name]),
                       "dtype": _dtype_name(defaults[name].dtype), "default_npz_key": key})
    outputs = []
    for name, aval in out_outputs.items():
        entry = {"name": name, "dsl_dtype": bound.dtype(name) if graph.var(name) or name in graph.temporaries
                 else None}
        if isinstance(aval, dict):  # runtime-shaped: the value at capacity and its logical shape
            entry["logical_shape"] = {"shape": _shape_json(aval["logical_shape"].shape),
                                      "dtype": _dtype_name(aval["logical_shape"].dtype)}
            entry["view"] = 'outputs[name]["value"][:logical_shape[0], ...]'
            aval = aval["value"]
        entry.update({"shape": _shape_json(aval.shape), "dtype": _dtype_name(aval.dtype)})
        outputs.append(entry)
    manifest = {
        "format": MANIFEST_FORMAT,
        "artifact": "jax.export.Exported.serialize()",
        "function": "step(state: {vars, caches, guards}, dynamic: dict) -> (state, outputs: dict)",
        "graph": {"path": graph.path, "sha256": hashlib.sha256(source.encode()).hexdigest()},
        "jax_version": jax.__version__,
        "serialization_version": exported.calling_convention_version,
        "compatibility": COMPATIBILITY,
        "platforms": list(exported.platforms),
        "x64": True,
        "x64_note": "produced under jax.enable_x64(True): call jax.config.update('jax_enable_x64', True) "
                    "before deserializing/calling",
        "constants": "baked",
        "yield_mode": "fused" if fused else "none",
        "unroll": unroll,
        # the options that rewrite the graph's dtypes before it is compiled: a cache's `dsl_dtype`
        # below is the dtype the artifact stores (an f32 table exported with table_dtype f16: f16)
        "table_dtype": table_dtype,
        "widen_floats": bool(widen_floats),
        "sizes": {k: ("symbolic" if k in symbolic else int(v)) for k, v in sorted(bound.sizes.items())},
        "symbolic": list(symbolic),
        "init_npz": None,  # filled in by write_export
        "state": state_entries,
        "inputs": inputs,
        "outputs": outputs,
        "errors": [site.message for site in lowering.error_sites],
        "dtype_notes": "values are in oi2jax's representation: bf16 as bfloat16, f8 as float8_e5m2, "
                       "i1/i2/i4/t1/t2 as int8, u1/u2/u4/bitset as uint8 (docs/architecture.md); NumPy's .npy has "
                       "no bfloat16/float8, so init_npz holds those buffers as their bits (uint16, uint8): view "
                       "each as its dtype here, npz[key].view(jax.numpy.dtype(dtype))",
    }
    return exported, manifest, npz


_LOC_DEF = re.compile(r'^(#loc\d+) = loc\("((?:[^"\\]|\\.)*)"(?:\((#loc\d+)|\()?', re.M)


def _unserializable(exc: Exception, jitted, args, graph: ir.Graph, located_only: bool = False) -> OiError | None:
    """jax.export's refusal of a step it cannot serialize -- a kernel that calls back into Python
    (`jax.pure_callback`, `io_callback`, `jax.debug.print`) or a custom call without jax.export's
    compatibility guarantee -- as an OiError at each node that holds one; None for other errors
    (and, with `located_only`, when no node holds one)."""
    text = str(exc)
    if isinstance(exc, NotImplementedError) and "host_callbacks" in text:
        what = ("calls back into Python (jax.pure_callback, io_callback, jax.debug.print/callback), which "
                "jax.export cannot serialize")
        wanted = lambda target: "callback" in target  # noqa: E731
    elif isinstance(exc, ValueError) and "custom calls whose targets have no compatibility guarantees" in text:
        targets = set(re.findall(r"'([^']+)'", text.split("guarantees", 1)[1]))
        what = ("uses a custom call without jax.export's compatibility guarantee ("
                + ", ".join(sorted(targets) or ["see jax.export's error"]) + ")")
        wanted = lambda target: not targets or target in targets  # noqa: E731
    else:
        return None
    head = f"cannot export: this node's kernel {what}; run the graph with `oi2jax run` instead"
    diags = []
    try:
        mlir = jitted.lower(*args).as_text(debug_info=True)
        defs = {m.group(1): (m.group(2), m.group(3)) for m in _LOC_DEF.finditer(mlir)}
        spans = locations.node_spans(graph)
        found = {}
        for m in re.finditer(r"custom_call @([\w.$-]+)\(.*loc\((#loc\d+)\)\s*$", mlir, re.M):
            if not wanted(m.group(1)):
                continue
            loc, span = m.group(2), None
            for _ in range(64):  # follow the name-location chain to a node's scope
                name, parent = defs.get(loc, ("", None))
                span = locations.span_of(name, spans)
                if span is not None or parent is None:
                    break
                loc = parent
            if span is not None:
                found[(span.line, span.col)] = span
        diags = [Diagnostic(head, span) for _, span in sorted(found.items())]
    except Exception:  # locating the nodes is a courtesy: the refusal itself is the error
        diags = []
    if not diags:
        if located_only:
            return None
        return OiError(f"cannot export: the step {what} ({text.splitlines()[0]}); "
                       "run the graph with `oi2jax run` instead")
    return OiError(diags, source=graph.source or None)


def _plain_output(value):
    """A step output as the artifact returns it: an array, or for a runtime-shaped value (a
    `Shaped`) `{"value": array at capacity, "logical_shape": int64[rank]}` (plain dicts only)."""
    return {"value": value.value, "logical_shape": value.shape} if isinstance(value, Shaped) else value


def write_export(source_or_path, output, model=None, sizes=None, symbolic=(), platforms=None, ops=None,
                 unroll="auto", zero_missing_inputs=False, widen_floats=False, table_dtype=None) -> list[str]:
    """Write the artifact, its manifest and the initial-state npz; returns the paths written. An
    output that names the graph or the model file (STEP, STEP.json or STEP.init.npz) is an
    OiError before anything is done (writing it would destroy the input)."""
    if not isinstance(model, pipeline.ModelChoice):
        model = pipeline.choose_model(source_or_path, model)
    for suffix in ("", ".json", ".init.npz"):
        refuse_inputs_as_outputs({"output": os.fspath(output) + suffix},
                                 {"graph": pipeline.graph_path(source_or_path), "model": model.path}, makes_dirs=True)
    with jax.enable_x64(True):
        exported, manifest, npz = build_export(source_or_path, model=model, sizes=sizes, symbolic=symbolic,
                                               platforms=platforms, ops=ops, unroll=unroll,
                                               zero_missing_inputs=zero_missing_inputs, widen_floats=widen_floats,
                                               table_dtype=table_dtype)
        try:
            blob = exported.serialize()
        except ImportError as exc:  # jax.export serialization needs the optional `flatbuffers`
            raise OiError(f"cannot serialize the export: {exc} (pip install flatbuffers)") from None
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    npz_path = out.with_name(out.name + ".init.npz")
    manifest["init_npz"] = npz_path.name
    man_path = out.with_name(out.name + ".json")
    # each file written to a temporary beside it and renamed: an interrupted export never leaves a
    # half-written artifact and never truncates one another process has open
    write_atomic(out, lambda f: f.write(bytes(blob)))
    save_npz(npz_path, npz)
    write_text_atomic(man_path, json.dumps(manifest, indent=2) + "\n")
    return [str(out), str(man_path), str(npz_path)]
