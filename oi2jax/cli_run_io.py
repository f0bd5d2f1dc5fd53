"""The `run` command's files and printing (cli.py runs it): `--input NAME=FILE.npy`,
`--inputs-per-step FILE.npz`, `--stop OUT=ID,...`; what a run writes (`--out`, `--trace-json`)
and prints (`--show`, `--trace`)."""
from __future__ import annotations

import json
import os
import sys

import numpy as np

from .cli_models import UsageError
from .diagnostics import OiError, suggest
from .ir import MemKind
from .npz import load_error, regular_input, save_npz, write_text_atomic
from .run_rules import check_per_step


def load_inputs(pairs: list[str] | None) -> dict:
    inputs = {}
    for pair in pairs or []:
        name, sep, file = pair.partition("=")
        if not sep or not name or not file:
            raise UsageError(f"--input expects NAME=FILE.npy, got '{pair}'")
        if name in inputs:
            raise UsageError(f"--input {name} is given twice")
        regular_input(file, f"--input {name}")  # a FIFO would be read twice (its magic, then the array)
        try:
            with open(file, "rb") as f:
                magic = f.read(6)
            if magic != b"\x93NUMPY":
                raise OiError(f"cannot read input {name} from {file}: not a .npy file (save arrays with "
                              f"numpy.save; for one value per step use --inputs-per-step FILE.npz)")
            inputs[name] = np.load(file, allow_pickle=False)
        except FileNotFoundError:
            raise OiError(f"input file not found: {file}") from None
        except OiError:
            raise
        except Exception as exc:  # corrupt .npy
            raise OiError(f"cannot read input {name} from {file}: {load_error(exc)}") from None
    return inputs


def load_npz(path: str, what: str) -> dict:
    regular_input(path, what)
    try:
        loaded = np.load(path, allow_pickle=False)
        if not hasattr(loaded, "files"):  # one .npy array: no name to give it to
            raise OiError(f"{what} {path}: expected an .npz file of named arrays, got one .npy array (write "
                          f"np.savez(FILE, NAME=array), or give it with --input NAME={path})")
        with loaded as npz:
            return {k: npz[k] for k in npz.files}
    except FileNotFoundError:
        raise OiError(f"{what} file not found: {path}") from None
    except OiError:
        raise
    except Exception as exc:
        raise OiError(f"cannot read {what} {path}: {load_error(exc)}") from None


def per_step_inputs(args, program, inputs: dict) -> dict:
    """--inputs-per-step FILE.npz: arrays with a leading step axis, one value per step."""
    per_step = load_npz(args.inputs_per_step, "--inputs-per-step")
    for name, value in per_step.items():
        if name in inputs:
            raise OiError(f"input {name} is given twice (--input and --inputs-per-step)")
        if program.graph.var(name) is not None:  # an unknown name: the run says so
            check_per_step(name, value, tuple(program.bound.shape(name)), "--inputs-per-step")
    return per_step


def main_outputs(program, collect) -> set:
    """What `run` shows by default besides small values: the collected variables, else the volatile ones."""
    return set(collect) or {v.name for v in program.graph.vars if v.kind == MemKind.VOLATILE}


def stop_ids(items: list[str] | None) -> dict:
    """--stop OUT=ID[,ID...] (repeatable): {OUT: [ID, ...]}."""
    stop: dict = {}
    for item in items or []:
        name, eq, ids = (x.strip() for x in item.partition("="))
        try:
            values = [int(i) for i in ids.split(",") if i.strip()]
        except ValueError:
            values = []
        if not (eq and name and values):
            raise UsageError(f"--stop expects OUTPUT=ID[,ID...] (e.g. next=2,32000), got {item!r}")
        if name in stop:
            raise UsageError(f"--stop {name}: given twice")
        stop[name] = values
    return stop


RAN_ON = "the step ran on past its error, as OpenInfer's runtime does, a failing cache write skipped: docs/cli.md"


def failed_run_contents(step: int, collected, interpreted: bool) -> str:
    """What a failed run's result holds (`--out`, what stdout shows): a compiled run's collected
    rows are the steps before the failing one, every other variable the failing step's own (its
    failing write skipped, its other writes applied: docs/cli.md); the interpreter stops at the
    failing node, so its variables are those after the step before."""
    if interpreted:
        return f"every variable as it was before the failing step {step}, the inputs given to it excepted (the " \
               f"interpreter stops at the failing node)"
    rows = f"the collected rows of the steps before the failing step {step} ({', '.join(collected)}); every other " \
           f"variable" if collected else "every variable"
    return f"{rows} as the failing step {step} left it ({RAN_ON})"


def write_outputs(args, outputs, main, partial: int | None = None, collected=(), interpreted: bool = False) -> None:
    """--out gets every variable; stdout (unless --quiet) what `--show` asks for: by default the
    `main` ones (the collected variables, else the volatile ones: `main_outputs`) and every
    scalar, not whole caches. `partial`: the step that failed (`failed_run_contents`); a
    compiled run then shows by default only the `collected` rows (the steps before it), not the
    failing step's own values as if they were results."""
    if args.out:
        save_npz(args.out, outputs)
        if partial is not None:
            print(f"note: wrote {args.out}: {failed_run_contents(partial, collected, interpreted)}", file=sys.stderr)
    if args.quiet:
        return
    failed = partial is not None  # compiled or interpreted: the failing step's values are not results
    show = [n.strip() for item in args.show or [] for n in item.split(",") if n.strip()]
    if show and show != ["all"]:
        unknown = [n for n in show if n not in outputs]
        if unknown:
            raise UsageError(f"--show {unknown[0]}: not a variable of the graph{suggest(unknown[0], list(outputs))} "
                             f"(variables: {', '.join(outputs)})")
        names = show
    elif show:
        names = list(outputs)
    elif failed:  # the failing step's own values are not results: the collected rows only
        names = [n for n in outputs if n in collected]
    else:
        names = [n for n, v in outputs.items() if n in main or np.ndim(v) == 0]
    for name in names:
        value = outputs[name]
        print(f"{name}: {value.dtype}{list(value.shape)}")
        print(np.array2string(value, threshold=64, edgeitems=3, precision=5))
    hidden = [n for n in outputs if n not in names]
    own = [n for n in outputs if n not in collected]  # the failing step's values
    # compiled: as the failing step left them (it ran on); interpreted: as before it (stopped at the node)
    held = f"as they were before the failing step {partial} (the interpreter stops at the failing node)" \
        if interpreted else f"as the failing step {partial} left them ({RAN_ON})"
    if failed and show and any(n in own for n in names):
        print(f"note: shown {held}: {', '.join(n for n in names if n in own)}", file=sys.stderr)
    elif failed and hidden:
        print(f"note: not shown: {', '.join(hidden)}, {held}; --show NAME,... to see them", file=sys.stderr)
    elif hidden:
        print(f"(not shown: {', '.join(hidden)}; --show all or --show NAME,...)")


def report_trace(args, program, node_trace) -> None:
    """Interpreted: one line per executed node (SPEC §8.2). Compiled: one line per kernel call,
    the honest granularity once nodes are fused into kernels."""
    if node_trace is not None:
        lines, events = node_trace.lines(), {"granularity": "node", "events": node_trace.to_json()}
    else:
        lines = ["# compiled mode: nodes run fused inside kernels, so this trace is per kernel call",
                 *program.trace_text().splitlines()]
        events = {"granularity": "kernel", "events": list(program.last_trace)}
    if args.trace or os.environ.get("OI2JAX_TRACE") == "full":
        for line in lines:
            print(line)
    if args.trace_json:
        write_text_atomic(args.trace_json, json.dumps(events, indent=1))
