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

from .. import dtypes, ir
from ..diagnostics import OiError, suggest
from ..limits import limit_note, memory_limit
from ..values import per_step_shape, step_axis, step_count  # THE per-step rules, the interpreter's too

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


def feedback_pairs(prog, feedback) -> tuple:
    """`feedback={IN: OUT, ...}` checked: ((IN, OUT), ...). IN is an input (dynamic variable);
    OUT a variable whose value a step leaves (dynamic, volatile or plain persistent, never a
    table or one whose shape changes from step to step) of IN's shape and dtype."""
    if not feedback:
        return ()
    if not isinstance(feedback, dict):
        raise OiError(f"feedback: expected a dict {{input: output}}, got {type(feedback).__name__}")
    graph, bound = prog.graph, prog.bound
    pairs = []
    for name, source in feedback.items():
        what = f"feedback {name}={source}"
        if name not in prog.defaults:
            decl = graph.var(name)
            inputs = list(prog.defaults)
            kind = f"{decl.kind.value} variable" if decl is not None else "not a variable of the graph"
            raise OiError(f"{what}: {name} is {'a ' + kind if decl is not None else kind}, not an input "
                          f"(dynamic variable){suggest(name, inputs)} (inputs: {', '.join(inputs) or '(none)'})")
        _step_output(prog, source, what, "cache.read what to feed back into a volatile and feed that back",
                     subject=source)
        have = (bound.dtype(source), tuple(bound.shape(source)))
        want = (bound.dtype(name), tuple(bound.shape(name)))
        if have != want:
            def show(t):
                return f"{t[0]}[{', '.join(map(str, t[1]))}]"
            raise OiError(f"{what}: {source} is {show(have)} but input {name} is {show(want)}; a value fed back "
                          f"must have the input's dtype and shape")
        pairs.append((name, source))
    return tuple(pairs)


def stop_set(prog, stop) -> dict:
    """`stop={OUT: [ID, ...], ...}` checked: {OUT: ids as a 1-D array of OUT's dtype}. OUT is a
    variable a step leaves a value in (dynamic, volatile or plain persistent, as a feedback
    source), of an integer dtype; every id fits that dtype exactly (none is narrowed)."""
    if not stop:
        return {}
    if not isinstance(stop, dict):
        raise OiError(f"stop: expected a dict {{output: [id, ...]}}, got {type(stop).__name__}")
    bound = prog.bound
    out = {}
    for name, ids in stop.items():
        _step_output(prog, name, f"stop {name}", "cache.read it into a volatile and stop on that")
        d = dtypes.get(bound.dtype(name))
        if not d.is_int:
            raise OiError(f"stop {name}: {name} is {d.name}; stop ids need an integer output (a token id)")
        values = list(np.ravel(np.asarray(ids, dtype=object)))
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not d.min <= v <= d.max:
                raise OiError(f"stop {name}: {v!r} is not an {d.name} value (stop ids are whole numbers "
                              f"{d.min}..{d.max})")
        if not values:
            raise OiError(f"stop {name}: no stop ids given")
        out[name] = np.asarray(values, d.np_dtype)
    return out


def stop_hits(value, ids, xp=np):
    """THE stop rule, per element of a step's output `value` (per sequence when its leading axis
    is a batch): whether it is one of the stop `ids`. NumPy and traced arrays alike (`xp`: numpy
    or jax.numpy): the fused loop, the host loop and a batch of sequences all follow it."""
    return xp.isin(value, ids)


def stop_from(stop_outputs, feedback: tuple, given_steps) -> dict:
    """THE rule of which steps a stop counts in: {stop output: its first step (0-based in the
    run)}. A step's output fed back to an input (`feedback`: (IN, OUT) pairs) is generated only
    once IN's given values have run out: while a prompt is teacher-forced (IN given per step,
    `given_steps(IN)` values), the OUT it predicts is replaced by the next given value, so a stop
    id there ends nothing; OUT's stop counts from the step whose OUT is fed back (`fed_back`: step
    N - 1 for N given values). An output fed back nowhere counts from the first step. The fused
    loop and the host loop (`Session.run_stepwise`) both follow it."""
    return {out: max([given_steps(inp) - 1 for inp, src in feedback if src == out], default=0)
            for out in stop_outputs}


def stopped(done: dict, xp=np):
    """Whether a run is over: `done` holds, per stop output, which of its elements have given a
    stop id in some step (`stop_hits`, or-ed step by step); the run ends after the step that
    leaves every element of one output stopped (the step that gave the stop id is kept)."""
    over = xp.asarray(False)
    for hit in done.values():
        over = over | xp.all(hit)
    return over


def fed_back(step, given_steps):
    """THE feedback rule (`feedback={IN: OUT}`): step `step` (0-based in the run) takes IN from
    OUT's value after the step before once IN's given values run out: `given_steps` is the number
    of its per-step values, or 1 for an input given once or not at all (its first step takes that
    value, or the default). Python ints and traced scalars alike: the fused loop, the host loop
    (`Session.run_stepwise`) and `ValidatedRun.arguments` all follow it."""
    return step >= given_steps


def check_per_step(name: str, value, shape: tuple, source: str) -> None:
    """OiError unless `value` (from `source`, e.g. `--inputs-per-step`) holds one value per
    step: shape `[N, *shape]` (`step_axis`)."""
    if np.ndim(value) != len(shape) + 1:
        got = list(np.shape(value))
        each = f"; with the first as the step axis each step's value would be {got[1:]}, where {name} is " \
               f"{list(shape)}" if len(got) > len(shape) + 1 else ""
        raise OiError(f"{source} {name}: expected a leading step axis {per_step_shape(shape)}, got shape {got}{each}")
    step_axis(name, value, tuple(shape))


def split_inputs(prog, inputs: dict, steps, feedback: tuple = ()):
    """(per_step {name: [N, ...]}, fixed {name: value}, N). An input with `feedback` may hold
    fewer per-step values than the run has steps (the later steps take the fed-back value)."""
    fed = {name for name, _ in feedback}
    per_step, fixed, lengths, fed_lengths = {}, {}, {}, {}
    for name, value in inputs.items():
        if name not in prog.defaults:
            raise prog.unknown_input(name)
        n = step_axis(name, value, tuple(prog.bound.shape(name)))
        if n is not None:
            per_step[name] = value
            (fed_lengths if name in fed else lengths)[name] = n
        else:
            fixed[name] = value
    steps = step_count(lengths, steps, max(fed_lengths.values(), default=1),
                       lambda: "; only inputs with feedback may hold fewer" if fed else
                       _feedback_hint(prog, next(iter(lengths))))
    empty = [k for k, v in fed_lengths.items() if v == 0]
    if empty and steps > 0:
        raise OiError(f"feedback input {empty[0]}: its per-step values hold no step; give at least the first "
                      f"step's value (or one value of its declared shape)")
    return per_step, fixed, steps


def _feedback_hint(prog, name: str) -> str:
    """How to run past the per-step values of input `name`: feed a step's output back into it."""
    want = (prog.bound.dtype(name), tuple(prog.bound.shape(name)))
    sources = [v.name for v in prog.graph.vars if v.name != name and v.kind != ir.MemKind.CONSTANT
               and not (v.is_table or v.auto_dim or v.is_prefix_table or v.name in prog.shaped)
               and (prog.bound.dtype(v.name), tuple(prog.bound.shape(v.name))) == want]
    example = sources[0] if len(sources) == 1 else "OUTPUT"
    also = f" ({', '.join(sources)} {'has' if len(sources) == 1 else 'have'} its dtype and shape)" if sources else ""
    return (f"; to run on past them, feed a step's output back into {name}: --feedback {name}={example} "
            f"(Session.run: feedback={{'{name}': '{example}'}}){also}")


def _step_output(prog, name: str, what: str, fix: str, subject: str | None = None) -> None:
    """THE rule for a variable whose value after a step a run uses (a feedback source, a stop
    output): dynamic, volatile or plain persistent, of a fixed shape. `what`: the message's head
    (the use); `subject`: how the message names the variable (None: the head names it); `fix`:
    how to get there from a cache table."""
    graph = prog.graph
    decl = graph.var(name)
    if decl is None or decl.kind == ir.MemKind.CONSTANT or decl.is_prefix_table:
        known = [v.name for v in graph.vars if v.kind != ir.MemKind.CONSTANT and not v.is_prefix_table]
        raise OiError(f"{what}: {subject + ' is ' if subject else ''}not a variable a step leaves a value in"
                      f"{suggest(name, known)} (variables: {', '.join(known) or '(none)'})")
    if decl.kind == ir.MemKind.PERSISTENT and (decl.is_table or decl.auto_dim):
        raise OiError(f"{what}: {_cache_state(decl)}; {fix}")
    if name in prog.shaped:
        raise OiError(f"{what}: {subject or 'it'} takes the current shape of @auto_dim tensor {prog.shaped[name]}, "
                      f"which changes from step to step")


def _cache_state(decl) -> str:
    """Why a cache table or @auto_dim tensor is not a step's value (collect, feedback)."""
    fixed = dict(decl.fixed)
    growing = [i for i in (*(decl.table_indices if decl.is_table else ()), *decl.auto_dim) if i not in fixed]
    if growing:
        what = "a cache table" if decl.is_table else "an @auto_dim tensor"
        return f"{decl.name} is {what}, whose shape changes from step to step ({', '.join(growing)} grows)"
    return (f"{decl.name} is a cache table: its entries are cache state (every index @fixed, so its shape does not "
            f"change), not a value a step leaves")


def collect_names(prog, collect) -> tuple:
    """The variables `collect` names (one name or several), checked: each must keep its shape
    from step to step."""
    given = collect
    if isinstance(collect, str):
        collect = (collect,)
    try:
        collect = tuple(collect)
    except TypeError:
        collect = None
    if collect is None or not all(isinstance(n, str) for n in collect):
        raise OiError(f"collect: expected a variable name or a list of names, got {given!r}")
    names = []
    for name in collect:
        decl = prog.graph.var(name)
        if decl is not None and decl.kind == ir.MemKind.CONSTANT:
            raise OiError(f"collect: {name} is a constant, the same at every step: read it once (session.read)")
        if decl is None:
            known = [v.name for v in prog.graph.vars if v.kind != ir.MemKind.CONSTANT]
            raise OiError(f"collect: unknown variable {name}{suggest(name, known)} "
                          f"(variables: {', '.join(known) or '(none)'})")
        if name in prog.shaped:
            raise OiError(f"collect: {name} takes the current shape of @auto_dim tensor {prog.shaped[name]}, "
                          f"which changes from step to step; read it after each step (session.step)")
        if decl.kind == ir.MemKind.PERSISTENT and (decl.is_table or decl.auto_dim):
            raise OiError(f"collect: {_cache_state(decl)}; cache.read it into a volatile and collect that")
        names.append(name)
    return tuple(dict.fromkeys(names))


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
