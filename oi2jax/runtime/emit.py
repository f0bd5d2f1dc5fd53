"""What a program shows of itself: `--emit` texts of the step (jaxpr, StableHLO and HLO with
`.oi` locations, optimized HLO, graph JSON) and `--dump-dir`, every kernel a run executes."""
from __future__ import annotations

import json
import os
from pathlib import Path

import jax

from ..diagnostics import OiError
from ..graph_json import to_json
from ..lowering import locations
from ..npz import write_text_atomic


def emit(program, kind: str = "stablehlo") -> str:
    """jaxpr | stablehlo | hlo | optimized-hlo | graph-json text of the step."""
    if kind == "graph-json":
        return json.dumps(to_json(program.graph), indent=2)
    exe = program.executable
    with program.scope():
        state = exe.init_state()
        dynamic = exe.dynamic_args({})
        if kind == "jaxpr":
            return str(jax.make_jaxpr(exe.builder)(exe.consts, exe.state_spec.to_env(state), dynamic))
        lowered = exe.jit_step.lower(exe.consts, state, dynamic)
        if kind == "stablehlo":  # named scopes (entry/3:matmul) with the node's .oi file:line:col
            return _located(program, lowered)
        if kind == "hlo":
            return locations.hlo(lowered.as_text(dialect="hlo", debug_info=True), program.graph)
        if kind == "optimized-hlo":
            return lowered.compile(exe.compile_options).as_text()  # as oi2jax compiles its kernels
    raise OiError(f"unknown --emit kind {kind}")


def dump(program, directory, *, not_over=()) -> list[str]:
    """Write into `directory` the step program in every --emit form, each block's kernel and
    every kernel a run executes (the session step, the fused multi-step loop; the driver adds
    its per-phase and per-consumer kernels), StableHLO with `.oi` locations; returns their paths.
    Every text is computed before a file is written, and a path of `not_over` (the CLI's `-o`)
    among the files is refused then. Each file is written atomically; a write that fails removes
    the files this dump had created, so no partial dump is left of files that were not there."""
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(20, "not a directory (--dump-dir writes files into a directory)", str(directory))
    texts = dict(_dump_texts(program))
    for name in texts:
        for path in not_over:
            if os.path.realpath(out / name) == os.path.realpath(path):
                raise OiError(f"-o {path} is the file {name} of the --dump-dir {directory}: one would overwrite "
                              f"the other; choose another path")
    made = [d for d in reversed([out, *out.parents]) if not d.exists()]  # the directories it makes, outermost first
    written: list[str] = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            path = out / name
            existed = path.exists() or path.is_symlink()
            write_text_atomic(path, text)
            written.append(str(path))
            if not existed:
                made.append(path)
    except BaseException:
        for path in reversed(made):  # what this dump created (the directory last, when it made it)
            try:
                path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
            except OSError:
                pass
        raise
    return written


def _dump_texts(program):
    """(file name, text) of everything `dump` writes."""
    for kind, suffix in (("jaxpr", "jaxpr.txt"), ("stablehlo", "stablehlo.mlir"), ("hlo", "hlo.txt"),
                         ("optimized-hlo", "optimized-hlo.txt")):
        yield f"step.{suffix}", emit(program, kind)
    exe = program.executable
    with program.scope():
        state = exe.init_state()
        dynamic = exe.dynamic_args({})
        env = exe.builder.start_env(exe.consts, exe.state_spec.to_env(state), dynamic)
        for block in program.graph.blocks:
            kernel = jax.jit(exe.builder.block_kernel(block.name), **program.placer.jit_options())
            yield f"block.{block.name}.stablehlo.mlir", _located(program, kernel.lower(exe.consts, env))
        for name, lowered in run_kernels(program, state, dynamic):
            yield f"{name}.stablehlo.mlir", _located(program, lowered)


def run_kernels(program, state, dynamic):
    """(file stem, Lowered) of every kernel a run of this program executes."""
    exe = program.executable
    k = exe.kernels
    yield "kernel.session_step", k.after_unchecked.lower(exe.consts, (state.vars, state.caches), state.guards.flags,
                                                         dynamic)
    yield "kernel.fused_steps", k.multi_jit.lower(*k.multi_args(exe.consts, state, {}, dynamic, 0, 1))
    if program.driver is not None:
        yield from program.driver.lowered_kernels(program.executable, state, dynamic)


def _located(program, lowered) -> str:
    return locations.stablehlo(lowered.as_text(debug_info=True), program.graph)
