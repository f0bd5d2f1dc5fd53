"""THE rules of a run that both backends follow (`Session.run` and `run_stepwise`, the fused loop,
batches, and the reference interpreter's `run`): what `collect`, `feedback={IN: OUT}` and
`stop={OUT: ids}` may name and what they mean step by step, and how a run's inputs split into
per-step values and values given once. `prog` is a compiled program or an interpreted one: only
its `graph` and `bound` are read. Host-side and NumPy only (the traced loop passes `xp`)."""
from __future__ import annotations

import numpy as np

from . import dtypes, ir
from .diagnostics import OiError, suggest
from .values import per_step_shape, step_axis, step_count, unknown_input


def input_names(prog) -> list[str]:
    """The program's inputs: its dynamic variables, in declaration order."""
    return [v.name for v in prog.graph.vars_of(ir.MemKind.DYNAMIC)]


def shaped(prog) -> dict:
    """Variables taking the current shape of an @auto_dim tensor (phases.runtime_shaped)."""
    return prog.bound.checked.runtime_shaped


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
        if name not in input_names(prog):
            decl = graph.var(name)
            inputs = input_names(prog)
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
        if name not in input_names(prog):
            raise unknown_input(name, prog.graph)
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
               and not (v.is_table or v.auto_dim or v.is_prefix_table or v.name in shaped(prog))
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
    if name in shaped(prog):
        raise OiError(f"{what}: {subject or 'it'} takes the current shape of @auto_dim tensor {shaped(prog)[name]}, "
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
        if name in shaped(prog):
            raise OiError(f"collect: {name} takes the current shape of @auto_dim tensor {shaped(prog)[name]}, "
                          f"which changes from step to step; read it after each step (session.step)")
        if decl.kind == ir.MemKind.PERSISTENT and (decl.is_table or decl.auto_dim):
            raise OiError(f"collect: {_cache_state(decl)}; cache.read it into a volatile and collect that")
        names.append(name)
    return tuple(dict.fromkeys(names))


def with_collected(values: dict, stacks: dict) -> dict:
    """A run's result: `values` (every variable after its last step) with each collected variable
    (`stacks`: name -> its rows, one per step) as its rows stacked `[steps, ...]` (`[0, ...]` where
    no step ran). The host loop and the interpreter both return it."""
    for k, rows in stacks.items():
        values[k] = np.stack(rows) if rows else np.zeros((0,) + values[k].shape, values[k].dtype)
    return values
