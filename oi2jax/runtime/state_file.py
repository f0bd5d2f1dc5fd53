"""A session's state file (`Session.save`, `Program.session(state=PATH or dict)`, `--state-in`,
`--state-out`): every variable in the `--out` layout plus the step count, as an `.npz`."""
from __future__ import annotations

import numpy as np

from .. import ir
from ..diagnostics import OiError, suggest
from ..npz import save_npz
from ..values import convert_input

STEPS_KEY = "#steps"  # in saved state files: steps the session had run (no identifier has '#')


def save(path, arrays: dict, steps: int) -> None:
    """Write `arrays` (every variable) and the step count, atomically."""
    save_npz(path, {**arrays, STEPS_KEY: np.int64(steps)})


def load(path: str) -> dict:
    """The arrays of a state file (OiError when it is missing or not an `.npz`)."""
    try:
        loaded = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise OiError(f"state file not found: {path}") from None
    except Exception as exc:
        raise OiError(f"{path}: not a state file (.npz): {exc}") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):  # an .npy: one array, not a state's variables
        raise OiError(f"{path}: not a state file (.npz): it holds one array ({loaded.dtype}{list(loaded.shape)}), "
                      f"not the variables a state file holds (write one with --state-out / Session.save)")
    try:
        with loaded as npz:
            return {k: npz[k] for k in npz.files}
    except Exception as exc:
        raise OiError(f"{path}: not a state file (.npz): {exc}") from None


def split_saved(prog, values: dict, source: str) -> tuple[int | None, dict, dict]:
    """`(steps or None, persistent values, last values)` of saved `values`: the persistent ones as
    given (`Program.import_state` converts them), the dynamic and volatile ones converted exactly
    (a runtime-shaped one at the shape it was saved at), for `read`; any other name an OiError."""
    values = dict(values)
    steps = int(np.asarray(values.pop(STEPS_KEY))) if STEPS_KEY in values else None
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
    last = {}
    for name, value in others.items():
        if name in prog.shaped:  # saved at its current shape: kept as such for `read`
            last[name] = convert_input(f"{source}: {name}", np.asarray(value), prog.bound.dtype(name), np.shape(value))
        else:
            last[name] = prog.convert(name, value)
    return steps, persistent, last
