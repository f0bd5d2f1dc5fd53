"""Batch-chunk looping: run a graph over inputs with more rows than its batch size variable
(`Program.run_batched`, `oi2jax run` with a long input; docs/executor.md).

The *batched* variables are the dynamic and volatile variables whose first declared dim is
exactly the batch size variable `B`. An input of N rows is split into `N // B` full chunks and a
last partial chunk of `R = N % B` rows. Everything runs inside ONE jitted program:

    state -> lax.scan(step x steps, over the full chunks, state carried) -> tail step(s) -> state

Each chunk runs the graph's step `steps` times with that chunk's rows (like `run`), persistent
state carried from chunk to chunk in order; each chunk's batched outputs land at its offset in
the full output. The partial chunk is NOT padded: it runs the same graph bound with `B = R`
(a second step function traced into the same program), so no padded row exists that could leak
into persistent state, and the result equals running the graph on each chunk by hand (the
full-chunk program, then a program compiled with `B = R`, carrying the state). This needs the
persistent state's shapes not to depend on `B` when `R > 0` (OiError otherwise). Non-batched
outputs are the last chunk's. Graphs with growable caches are refused (growth needs the host
between steps). Yield/await graphs run their fused step (bit-identical to the driver).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import ir
from ..diagnostics import OiError, check_whole
from ..values import convert_input, unknown_input


def _first_dim_is(decl, batch_var: str) -> bool:
    return bool(decl.dims) and tuple(decl.dims[0].atoms) == (batch_var,)


def batched_names(graph: ir.Graph, batch_var: str) -> list[str]:
    """Dynamic and volatile variables whose first declared dim is the batch size variable."""
    return [v.name for v in graph.vars
            if v.kind in (ir.MemKind.DYNAMIC, ir.MemKind.VOLATILE) and not v.is_prefix_table
            and _first_dim_is(v, batch_var)]


def over_long_input(program, inputs: dict) -> tuple[str, str, int] | None:
    """(size variable, input, its rows) of the first dynamic input whose leading dim is a single
    size variable and whose rows differ from it, the other dims matching; None if none is, or if
    that size is 0 (no chunk of 0 rows: the run says what shape the input must have). A size a
    persistent variable or a constant (a model tensor) is shaped by is a feature size, not a
    batch: `q: f32[D]` of 32 values where D=16 is a wrong shape (an error), never two chunks."""
    features = {atom for v in program.graph.vars if v.kind in (ir.MemKind.PERSISTENT, ir.MemKind.CONSTANT)
                for d in v.dims for atom in d.atoms if isinstance(atom, str)}
    for name, value in inputs.items():
        decl = program.graph.var(name)
        if decl is None or decl.kind != ir.MemKind.DYNAMIC or not decl.dims:
            continue
        atoms = tuple(decl.dims[0].atoms)
        shape = program.bound.shape(name)
        a = np.asarray(value)
        if len(atoms) == 1 and isinstance(atoms[0], str) and atoms[0] not in features and a.ndim == len(shape) \
                and a.ndim and a.shape[0] != shape[0] and shape[0] > 0 and tuple(a.shape[1:]) == tuple(shape[1:]):
            return atoms[0], name, int(a.shape[0])
    return None


def _tail_program(program, rows: int, batch_var: str):
    """The same graph bound with `batch_var = rows` (its step traced into the chunked program)."""
    sizes = dict(program.bound.sizes)
    sizes[batch_var] = rows
    return program.rebound(sizes)


def _failed_chunk(error: OiError, errs, ats, n_full: int, rem: int, B: int, outs_full, out_batched) -> OiError:
    """A chunked run's runtime error, naming its step, chunk and rows (the first chunk after which
    an error is recorded: `errs`, one per full chunk; else the last, partial one; the step of that
    chunk whose guard failed: `ats`, one per chunk, the partial one last), with the batched
    outputs of the chunks before it as its `partial` (their rows in order: nothing they made is
    lost). The chunks after it ran on in the one program; their values are not a result."""
    failed = int(np.argmax(errs != 0)) if np.any(errs != 0) else n_full
    chunks = n_full + (1 if rem else 0)
    lo, hi = failed * B, failed * B + (B if failed < n_full else rem)
    step = int(ats[failed]) if failed < len(ats) else 0
    chunked = error.where(f"in step {step} of chunk {failed + 1} of {chunks}: rows {lo}..{hi - 1}" if step else
                          f"in chunk {failed + 1} of {chunks}: rows {lo}..{hi - 1}")
    chunked.partial = {name: np.asarray(outs_full[name]).reshape((-1,) + np.shape(outs_full[name])[2:])[:lo]
                       for name in out_batched if name in outs_full} if outs_full is not None else {}
    chunked.chunk = failed + 1
    return chunked


def run_batched(program, inputs: dict | None = None, batch_var: str = "B", steps: int = 1) -> dict:
    graph, bound = program.graph, program.bound
    if batch_var not in bound.sizes:
        raise OiError(f"run_batched: {batch_var} is not a size variable of this graph "
                      f"(sizes: {', '.join(sorted(bound.sizes)) or 'none'})")
    steps = check_whole("run_batched: steps", steps, 1)
    if program.growable:
        raise OiError("run_batched: graphs with growable caches are not supported (capacity growth "
                      "needs the host between steps); give the caches @fixed sizes or use run")
    B = int(bound.sizes[batch_var])
    batched = batched_names(graph, batch_var)
    inputs = dict(inputs or {})
    for name, value in inputs.items():  # named before the rows are counted (a typo is not "no input batched")
        decl = graph.var(name)
        if decl is None or decl.kind != ir.MemKind.DYNAMIC:
            raise unknown_input(name, graph)
        per_row = tuple(bound.shape(name))[1:]
        if name in batched and (np.ndim(value) != len(per_row) + 1 or tuple(np.shape(value)[1:]) != per_row):
            raise OiError(f"run_batched: input {name}: expected shape [{', '.join(['N', *map(str, per_row)])}] (N rows "
                          f"over {batch_var}={B}, each {list(per_row)}), got {list(np.shape(value))}")
    rows = {name: np.asarray(v).shape[0] for name, v in inputs.items()
            if name in batched and np.asarray(v).ndim > 0}
    if not rows:
        raise OiError(f"run_batched: no input is batched over {batch_var} (batched variables: "
                      f"{', '.join(batched) or 'none'})")
    if len(set(rows.values())) > 1:
        raise OiError("run_batched: batched inputs disagree on their number of rows: " +
                      ", ".join(f"{k}={v}" for k, v in rows.items()))
    N = next(iter(rows.values()))
    if N < 1:
        raise OiError("run_batched: inputs have no rows")
    if B < 1:
        raise OiError(f"run_batched: {batch_var}={B}: inputs of {N} rows cannot run in chunks of {B} rows "
                      f"(give {batch_var} >= 1, or inputs of {B} rows)")
    n_full, rem = divmod(N, B)
    if rem:
        dependent = [v.name for v in graph.vars if v.kind == ir.MemKind.PERSISTENT
                     and any(batch_var in d.atoms for d in v.dims)]
        if dependent:
            raise OiError(f"run_batched: {N} rows is not a multiple of {batch_var}={B} and persistent "
                          f"variable {dependent[0]} depends on {batch_var}: the last chunk cannot "
                          f"carry that state; pass a multiple of {B} rows")

    program.check_given(inputs)
    # convert: batched inputs with N rows, others as declared
    host: dict[str, np.ndarray] = {}
    for name, value in inputs.items():
        decl = graph.var(name)
        if decl is None or decl.kind != ir.MemKind.DYNAMIC:
            raise unknown_input(name, graph)
        shape = bound.shape(name)
        if name in batched:
            shape = (N,) + tuple(shape[1:])
        host[name] = convert_input(name, value, decl.dtype, shape)

    tail = _tail_program(program, rem, batch_var) if rem else None
    exe = program.executable  # a graph without growable caches: one generation
    builder = exe.builder
    out_batched = [n for n in builder.dynamic + builder.volatile if n in batched]

    with program.scope():
        put = program.placer.put
        full_in = {k: v[:n_full * B].reshape((n_full, B) + v.shape[1:]) for k, v in host.items() if k in batched}
        tail_in = {k: v[n_full * B:] for k, v in host.items() if k in batched}
        other = {k: v for k, v in host.items() if k not in batched}
        full_in = put("dynamic", full_in) if n_full else {}
        tail_in = put("dynamic", tail_in) if rem else {}
        other = put("dynamic", other)
        tail_exe = tail.executable if rem else None
        defaults = {k: v for k, v in exe.defaults.items() if k not in host}
        tail_defaults = {k: v for k, v in tail_exe.defaults.items() if k not in host} if rem else {}
        tail_consts = tail_exe.consts if rem else {}
        state = exe.state_spec.to_env(exe.init_state())  # the flat state the builder steps

        def run_steps(step_fn, consts, state, dyn):
            """The chunk's steps, and the 1-based step whose guard failed first (0: none)."""
            def one(k, state, at):
                before = state.guards.err
                state, outs = step_fn(consts, state, dyn)
                return state, outs, jnp.where((at == 0) & (before == 0) & (state.guards.err != 0), k, at)
            state, outs, at = one(1, state, jnp.int32(0))
            if steps > 1:
                state, outs, at = lax.fori_loop(1, steps, lambda i, c: one(i + 1, c[0], c[2]), (state, outs, at))
            return state, outs, at

        def chunked(consts, tconsts, state, full_in, tail_in, other, defaults, tdefaults):
            outs_full = outs_tail = None
            if n_full:
                def body(state, xs):
                    dyn = {**defaults, **other, **xs}
                    state, outs, at = run_steps(builder, consts, state, dyn)
                    return state, (outs, state.guards.err, at)  # the error recorded so far, per chunk
                state, (outs_full, errs, ats) = lax.scan(body, state, full_in)
                outs_full = (outs_full, errs, ats)
            tail_at = jnp.int32(0)
            if rem:
                dyn = {**tdefaults, **other, **tail_in}
                state, outs_tail, tail_at = run_steps(tail_exe.builder, tconsts, state, dyn)
            return state, outs_full, outs_tail, tail_at

        program.note(f"run_batched: {N} rows over {batch_var}={B}: {n_full} full chunk(s)"
                                   + (f" + a last chunk of {rem} row(s)" if rem else "") + ", one program")
        fn = jax.jit(chunked, donate_argnums=(2,), **program.placer.jit_options())
        state, outs_full, outs_tail, tail_at = fn(exe.consts, tail_consts, state, full_in, tail_in, other,
                                                  defaults, tail_defaults)
        errs, ats = None, None
        if outs_full is not None:
            outs_full, errs, ats = outs_full
        state = exe.state_spec.from_env(state)
        # the tail's step was lowered on its own (B = R): an error it recorded is told by its error
        # sites, not by the full chunks' (which may have fewer: an IndexError)
        in_tail = bool(rem) and (errs is None or not np.any(np.asarray(errs) != 0))
        try:
            (tail if in_tail else program).check(state)
        except OiError as error:  # the chunks before the failing one are the run's result
            ats = np.append(np.asarray(ats) if ats is not None else np.zeros(0, np.int32), np.asarray(tail_at))
            raise _failed_chunk(error, np.asarray(errs) if errs is not None else np.zeros(0), ats, n_full, rem, B,
                                outs_full, out_batched) from None
        outputs: dict = {}
        names = (outs_tail or outs_full).keys()
        for name in names:
            if name in out_batched:
                parts = []
                if outs_full is not None:
                    v = outs_full[name]
                    parts.append(v.reshape((n_full * B,) + v.shape[2:]))
                if outs_tail is not None:
                    parts.append(outs_tail[name])
                outputs[name] = jnp.concatenate(parts) if len(parts) > 1 else parts[0]
            else:
                outputs[name] = outs_tail[name] if outs_tail is not None else outs_full[name][-1]
        for name in builder.dynamic:  # inputs the graph never writes are reported as given
            outputs.setdefault(name, host[name] if name in host else exe.defaults[name])
        return exe.collect_result(state, outputs)
