"""What a fused `Session.run` is asked to do, validated once: which inputs carry a step axis
`[N, ...]` and which are the same every step, how many steps, which variables to collect, the
defaults of the inputs not given. Validating device arrays of their declared dtype depends only
on their names, types, shapes and dtypes, `steps` and `collect`, so such a `ValidatedRun` is remembered per
signature (`Program.validated_runs`) together with the fused loop compiled ahead of time for it: a
decode loop calling `run` again checks nothing twice (a hot path)."""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import dtypes
from ..diagnostics import OiError
from ..limits import limit_note, memory_limit
from ..run_rules import collect_names, feedback_pairs, split_inputs  # THE run rules, the interpreter's too

MAX_VALIDATED = 64  # signatures remembered per program (then forgotten all at once)


class InputSig(NamedTuple):
    """A device input accepted as it is (`device_inputs`' `fast`): its shape, dtype and array type."""

    shape: tuple
    dtype: object
    type: type


def device_inputs(prog, inputs: dict, fast: dict, steps: int | None = None) -> dict:
    """Validated inputs, on the device; conversion is exact or an OiError. `steps`: the values
    carry a leading step axis of that length. `fast`: {name: InputSig} of the device inputs
    accepted as they are (a session's, filled here): a hot path checks nothing twice."""
    defaults = prog.executable.defaults
    out = {}
    if steps is not None:
        for name, value in inputs.items():
            want = defaults[name]
            if isinstance(value, jax.Array) and value.shape == (steps,) + want.shape and value.dtype == want.dtype:
                out[name] = value
            else:
                out[name] = prog.convert(name, value, steps=steps)
        converted = {k: v for k, v in out.items() if isinstance(v, np.ndarray)}
        if converted:
            with prog.scope():
                out.update(prog.executable.host.placer.put("dynamic", converted))
        return out
    all_fast = True
    for name, value in inputs.items():
        sig = fast.get(name)
        if sig is not None and type(value) is sig.type and value.shape == sig.shape and value.dtype == sig.dtype:
            out[name] = value
            continue
        if name not in defaults:
            raise prog.unknown_input(name)
        want = defaults[name]
        if isinstance(value, jax.Array) and value.shape == want.shape and value.dtype == want.dtype:
            fast[name] = InputSig(value.shape, value.dtype, type(value))
            out[name] = value
            continue
        all_fast = False
        out[name] = prog.convert(name, value)
    if all_fast:  # device arrays of the declared shape and dtype: nothing to convert or place
        return inputs
    converted = {k: v for k, v in out.items() if isinstance(v, np.ndarray)}
    if converted:
        with prog.scope():
            out.update(prog.executable.host.placer.put("dynamic", converted))
    return out


def validate_run(prog, inputs: dict, steps, collect, convert, feedback=None, stop=None) -> "ValidatedRun":
    """`run(inputs, steps, collect, feedback)` validated; `convert(inputs, steps=None)`
    is the session's input check and conversion (it passes a valid device array through as it is);
    `stop`: the checked stop set (`stop_set`: its names and id counts are part of the signature)."""
    try:
        key = (tuple((k, type(v), v.shape, v.dtype) for k, v in inputs.items()), steps,
               (collect,) if isinstance(collect, str) else tuple(collect),
               tuple(feedback.items()) if feedback else (), tuple((k, v.shape) for k, v in (stop or {}).items()))
        run = prog.validated_runs.get(key)
    except (AttributeError, TypeError):  # host lists / scalars, unhashable arguments: no run
        key = run = None
    if run is not None:
        return run
    pairs = feedback_pairs(prog, feedback)
    per_step, fixed, steps = split_inputs(prog, inputs, steps, pairs)
    collect = collect_names(prog, collect)
    check_collected(prog, steps, collect)
    per_dev = {}
    for length in dict.fromkeys(np.shape(v)[0] for v in per_step.values()):  # per length (feedback: its own)
        per_dev.update(convert({k: v for k, v in per_step.items() if np.shape(v)[0] == length}, steps=length))
    per_dev = {k: per_dev[k] for k in per_step}
    fixed_dev = convert(fixed)
    prog.check_given(inputs)
    if key is not None and all(v is per_dev.get(k, fixed_dev.get(k)) for k, v in inputs.items()):
        run = ValidatedRun(prog, tuple(per_dev), steps, collect, feedback=pairs)
        if len(prog.validated_runs) >= MAX_VALIDATED:
            prog.validated_runs.clear()
        prog.validated_runs[key] = run  # nothing converted: reusable
        return run
    # converted inputs: a run of this call's own
    return ValidatedRun(prog, tuple(per_dev), steps, collect, values={**per_dev, **fixed_dev}, feedback=pairs)


def collected_rows(steps: int, collect) -> int:
    """The length of collected stacks for `steps` steps: a power of two of rows (>= 64), so that
    runs of many lengths share a loop; 0 when nothing is collected."""
    return max(64, 1 << (steps - 1).bit_length()) if collect else 0


def call_limit(steps: int, progress: bool = False, every: int | None = None) -> int:
    """The most steps one fused call of a run takes: all of them, a fiftieth with a progress
    callback, at most `every` when streaming. A call's collected stacks hold its own rows
    (`collected_rows(call_limit(...))`), not the whole run's: a run of many calls does not
    allocate, zero and fetch the whole run's rows at every call."""
    limit = steps if not progress else max(1, -(-steps // 50))
    return min(limit, every) if every is not None else limit


def check_collected(prog, steps: int, collect: tuple, what: str | None = None,
                    fix: str = "run fewer steps at a time (the session goes on from where a run ended), or collect less") -> None:
    """Refuse, before anything is allocated, a run whose collected rows (`collected_rows` of the
    steps, of each collected variable: one call's device stacks where the run is one call, the
    result on the host in any case) cannot fit: `steps=10**12` with `collect` asked for 4 TiB,
    which XLA:CPU failed to allocate inside the run (a JAX error, or a generation that hung)."""
    rows = collected_rows(steps, collect)
    if not rows:
        return
    nbytes = sum(dtypes.get(prog.bound.dtype(k)).nbytes(rows * math.prod(prog.bound.shape(k))) for k in collect)
    device = prog.first_device()
    limit = memory_limit(device)
    if nbytes > limit:
        what = what or f"run: collecting {', '.join(collect)} over {steps} steps"
        raise OiError(f"{what} needs {nbytes} bytes for the rows it collects ({rows} rows, the steps rounded up "
                      f"to a power of two): too large to allocate (the limit is {limit} bytes"
                      f"{limit_note(limit, device)}); {fix}")


def stop_arrays(prog, stop_ids: dict) -> tuple[dict, dict]:
    """A run's stop ids on the device and each stop output's `done` (all False): the loop's
    arguments (called inside the program's scope)."""
    return ({k: jnp.asarray(v) for k, v in stop_ids.items()},
            {k: jnp.zeros(tuple(prog.bound.shape(k)), bool) for k in stop_ids})


class ValidatedRun:
    """A validated `Session.run` call: the names of the inputs with a step axis, the steps, the
    collect names, the feedback pairs, the default of every dynamic variable not given, and the
    fused loop compiled ahead of time for these arguments (per kernels: a growth rebuilds them).
    Stored per input signature in `Program.validated_runs` when its inputs passed through unconverted."""

    __slots__ = ("per_names", "steps", "collect", "feedback", "defaults", "all_defaults", "values", "_exes",
                 "_generation")

    def __init__(self, prog, per_names: tuple, steps: int, collect: tuple, values: dict | None = None,
                 feedback: tuple = ()):
        self.per_names, self.steps, self.collect, self.feedback = per_names, steps, collect, feedback
        self.defaults = {k: v for k, v in prog.defaults.items() if k not in per_names}
        self.all_defaults = prog.defaults
        self.values = values  # this call's converted inputs (a run that is not stored), else None
        self._exes: dict = {}  # index dtype -> the fused loop compiled for this run (or None: use the jit)
        self._generation = None  # the kernels' generation `_exes` were compiled for

    def arguments(self, inputs: dict) -> tuple[dict, dict, dict]:
        """(per-step inputs, fixed inputs: the given ones over the defaults, the first fed-back
        value of each input with feedback) of this call. An input with feedback given one value
        per step starts from its first (its fed-back value is first read after them); one given
        once, or not at all, is its first step's value."""
        given = self.values if self.values is not None else inputs
        per_names = self.per_names
        fixed = dict(self.defaults)
        for k, v in given.items():
            if k not in per_names:
                fixed[k] = v
        per = {k: given[k] for k in per_names}
        fed = {}
        for name, _ in self.feedback:
            if name not in per:  # step 0 takes it as given (`fed_back`), the later steps what is fed back
                fed[name] = fixed.pop(name)
            else:  # never read before the per-step values run out (none: steps=0, nothing runs)
                fed[name] = per[name][0] if per[name].shape[0] else self.all_defaults[name]
        return per, fixed, fed

    def exes(self, kernels) -> dict | None:
        """The fused loops compiled for this run on `kernels` (`StepKernels.multi` fills it);
        None for a run of converted inputs (one call's own: the jitted loop, no AOT compile)."""
        if self.values is not None:
            return None
        if self._generation != kernels.generation:  # a growth: new kernels, new executables
            self._exes, self._generation = {}, kernels.generation
        return self._exes
