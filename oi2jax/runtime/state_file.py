"""A session's state file (`Session.save`, `Program.session(state=PATH or dict)`, `--state-in`,
`--state-out`): every variable in the `--out` layout plus the step count, as an `.npz`."""
from __future__ import annotations

import os

import numpy as np

from .. import ir
from ..diagnostics import OiError, suggest
from ..npz import load_error, refuse_inputs_as_outputs, regular_input, save_npz
from ..values import convert_input

STEPS_KEY = "#steps"  # in saved state files: steps the session had run (no identifier has '#')
# `T#present` in a saved state file: which entries of the growable table T exist (bool[sizes...]);
# without it every entry within T's sizes does (an `--out` file)
PRESENT = "#present"


def save(path, arrays: dict, steps: int, inputs: dict | None = None, what: str = "Session.save",
         present: dict | None = None) -> None:
    """Write `arrays` (every variable), the step count and `present` (each growable table's
    existing entries, as `T#present`), atomically. `inputs` ({label: path}: the graph and model
    files the session's program was made from) are never overwritten; a path that cannot be
    written is an OiError naming it (npz.refuse_inputs_as_outputs, npz.write_atomic)."""
    try:
        refuse_inputs_as_outputs({what: path}, {k: v for k, v in (inputs or {}).items() if v and os.path.isfile(v)})
        masks = {f"{name}{PRESENT}": np.asarray(mask, dtype=bool) for name, mask in (present or {}).items()}
        save_npz(path, {**arrays, **masks, STEPS_KEY: np.int64(steps)})
    except OSError as exc:  # a directory, a device, no such directory, no permission: the user's path
        raise OiError(f"{what}: cannot write {os.fspath(path)}: {exc.strerror or exc}") from None


def load(path: str) -> dict:
    """The arrays of a state file (OiError when it is missing or not an `.npz`)."""
    regular_input(path, "the state file")
    try:
        loaded = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise OiError(f"state file not found: {path}") from None
    except Exception as exc:
        raise OiError(f"{path}: not a state file (.npz): {load_error(exc)}") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):  # an .npy: one array, not a state's variables
        raise OiError(f"{path}: not a state file (.npz): it holds one array ({loaded.dtype}{list(loaded.shape)}), "
                      f"not the variables a state file holds (write one with --state-out / Session.save)")
    try:
        with loaded as npz:
            return {k: npz[k] for k in npz.files}
    except Exception as exc:  # a damaged member, or one of Python objects
        raise OiError(f"{path}: not a state file (.npz): {load_error(exc)}") from None


def split_saved(prog, values: dict, source: str, whole: bool = False) -> tuple[int | None, dict, dict, dict]:
    """`(steps or None, persistent values, last values, present masks)` of saved `values`: the
    persistent ones as given (`Program.import_state` converts them, with the growable tables'
    `T#present` masks), the dynamic and volatile ones converted exactly (a runtime-shaped one at
    the shape it was saved at), for `read`; any other name an OiError. `whole` (a state file):
    every persistent variable must be there (a file that lacks one is of another graph, or
    damaged: it is not silently started from its @init)."""
    values = dict(values)
    steps = None
    present = {}
    for key in [k for k in values if isinstance(k, str) and k.endswith(PRESENT)]:
        present[key[:-len(PRESENT)]] = values.pop(key)
    if STEPS_KEY in values:
        count = np.asarray(values.pop(STEPS_KEY))
        # at most 2^62: the count goes on in int64 arithmetic (2^63 - 2 overflowed a few steps on)
        if count.shape != () or count.dtype.kind not in "iu" or not 0 <= int(count) <= 2**62:
            raise OiError(f"{source}: {STEPS_KEY} must be the step count, a whole number 0..2^62; got "
                          f"{count.dtype}{list(count.shape)} {np.array2string(count, threshold=4)}")
        steps = int(count)
    persistent, others = {}, {}
    for name, value in values.items():
        decl = prog.graph.var(name)
        if decl is not None and decl.kind == ir.MemKind.PERSISTENT:
            persistent[name] = value
        elif decl is not None and decl.kind in (ir.MemKind.DYNAMIC, ir.MemKind.VOLATILE):
            others[name] = value  # last values, for `read` (a step recomputes them)
        else:
            known = [v.name for v in prog.graph.vars if v.kind != ir.MemKind.CONSTANT]
            raise OiError(f"{source}: {name} is not a variable of the graph{suggest(name, known)} (variables: "
                          f"{', '.join(known) or '(none)'})")
    if whole:
        missing = [v.name for v in prog.graph.vars if v.kind == ir.MemKind.PERSISTENT and not v.is_prefix_table
                   and v.name not in persistent]
        lost = [d.name for d in prog.result_vars if d.kind != ir.MemKind.PERSISTENT and d.name not in others]
        if lost and not missing:  # a step's last values: what a continued run feeds back, what `read` gives
            raise OiError(f"{source}: no value for the variable{'s' if len(lost) > 1 else ''} "
                          f"{', '.join(lost)}: a state file holds every variable's last value (Session.save, "
                          f"--state-out, --out), which a run continued with feedback takes (it would start from "
                          f"zeros); to leave some out, pass a dict: Program.session(state={{...}})")
        if missing:
            raise OiError(f"{source}: no value for the persistent variable{'s' if len(missing) > 1 else ''} "
                          f"{', '.join(missing)}: a state file holds every one (Session.save, --state-out, --out); "
                          f"to start some from their @init, pass a dict: Program.session(state={{...}})")
    last = {}
    for name, value in others.items():
        if name in prog.shaped:  # saved at its current shape: kept as such for `read`
            last[name] = convert_input(f"{source}: {name}", np.asarray(value), prog.bound.dtype(name), np.shape(value))
            continue
        try:
            last[name] = prog.convert(name, value)
        except OiError as exc:  # named as the state file's, not as an input given to the run
            kind = prog.graph.var(name).kind.value
            message = exc.diagnostics[0].message.removeprefix(f"input {name}: ")
            raise OiError(f"{source}: the {kind} variable {name}: {message} (a state of this graph at other "
                          f"sizes, or an --out file that collected it?)") from None
    return steps, persistent, last, present  # a mask without its table: Program.import_state says so
