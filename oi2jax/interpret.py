"""The reference interpreter: executes a bound graph node by node, exactly as OpenInfer does.

It is the oracle the compiled programs are tested against, so it follows SPEC §3/§4 literally
and shares no control-flow code with `oi2jax.lowering`:

* A frame stack of block frames and loop frames (§3.1). `branch` pushes a block frame (a call);
  when that frame ends, execution continues after the branch in the caller (§3.2). A block
  frame that runs out of nodes is popped, like `return`.
* `loop` evaluates its bounds ONCE when the loop node is reached (int literal, sizevar, or the
  current value of a scalar variable truncated toward zero, §3.3) and pushes a loop frame that
  re-runs the body; `return` pops only the innermost frame (in a loop body it ends the loop).
* yield/await follow the snapshot semantics of §3.6 / §0 item 3: at the entry's `yield`, the
  whole state is snapshotted and every consumer block (non-entry, non-branch-target blocks that
  `await` at least one yielded variable; ascending name order) runs to completion from its own
  copy of the snapshot. At the entry's `await`, everything a consumer wrote (yielded variables,
  non-yielded variables, cache state) is merged into the entry's state (two consumers writing
  the same variable: the checker refuses the graph, checks/yield_await.py). A `yield` executed in any other
  block (or inside a consumer) ends the current frame; an `await` there does nothing. A yield
  still pending when the step ends is merged then (an implicit await).
* Caches (§4) are host NumPy state (`oi2jax.interpret_caches`): tables are a dict of
  materialised entries plus a size per table index (fixed sizes, growth by single indices and
  by slice ends, negative slice ends, unwritten entries read as the @init fill, reset of
  everything or of an index prefix); auto_dim tensors grow by zero padding at the end
  (count = max(count, index)); plain persistent values are replaced whole;
  increment/decrement wrap in the variable's width.
* Every step starts by resetting dynamic variables (to the given input, else their initial
  value, §2.2), volatile variables and `assign` temporaries (to their initial value, §0 item 4);
  persistent values, tables and auto_dim tensors carry over. `run()` starts from a fresh state.
* Ops are evaluated eagerly with the same implementations the compiler uses (`oi2jax.ops.apply`;
  an added op's NumPy reference, `ops.reference`), with the mode and output dtype the checker
  typed (`BoundGraph.op_sig`), inside `jax.enable_x64(True)`.

Runtime errors (cache overflow, negative index, unknown names, runaway recursion) raise OiError
located at the offending node.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from . import dtypes as dt
from . import ir, messages, ops
from .diagnostics import OiError
from .interpret_caches import CacheOps, State, Table
from .limits import check_sizes
from .messages import CHECKED
from .ops import calls as op_calls
from .model.bind import AttrVar
from .host_numerics import state_fill
from .protocol import CompileOptions
from .run_rules import collect_names, fed_back, feedback_pairs, split_inputs, stop_from, stop_hits, stop_set, stopped, \
    with_collected
from .trace import Trace
# one rule and message each, compiled or interpreted:
from .values import check_given_inputs, convert_inputs, convert_output, unknown_input

MAX_DEPTH = 2_000  # frame stack depth beyond what the graph can need (a backstop: the checker refuses recursion)
MAX_NODES = 5_000_000  # executed nodes per step (runaway loops with huge variable bounds)


# ---------------------------------------------------------------------------------------- state


@dataclass
class Frame:
    block: str
    nodes: tuple
    pos: int = 0
    loop: ir.Loop | None = None
    value: int = 0
    end: int = 0


@dataclass
class Ctx:
    """Per-run-of-a-frame-stack context: consumer runs track what they write."""

    consumer: bool = False
    written: set[str] | None = None
    pending: tuple | None = None  # (yield node, [(consumer name, state, written)])
    nodes: int = 0

    def wrote(self, name: str) -> None:
        if self.written is not None:
            self.written.add(name)


class InterpretedProgram(CacheOps):
    """Runs a BoundGraph node by node (see module docstring). `run(inputs, steps)` has the same
    output contract as the compiled Program.run."""

    mode = "interpret"  # the Program protocol (protocol.py): the compiled program's is "compiled"
    supports_batched = False  # `run_batched` needs a compiled program
    zero_missing_inputs = False  # as Program: run without an input that has no default -> error

    def __init__(self, bound, options: CompileOptions | None = None, trace=None):
        """`options`: what `oi2jax.compile` was asked (protocol.CompileOptions; the interpreter
        computes exactly and runs loops as written, whatever they say). `trace`: a `trace.Trace`
        recording every executed node (default: from $OI2JAX_TRACE)."""
        self.options = options if options is not None else CompileOptions()
        self.compile_log: list[str] = []  # nothing is compiled (the protocol's `--explain-recompiles` record)
        self.bound = bound
        self.graph: ir.Graph = bound.graph
        self.zero_missing_inputs = bound.zero_missing_inputs  # asked for at binding (api.compile)
        # a call chain visits each block at most once (no recursion), each with its loops' frames
        self._max_depth = MAX_DEPTH + len(bound.graph.blocks) * (ir.MAX_LOOP_DEPTH + 1)
        self.trace = trace if trace is not None else Trace.from_env()
        g = self.graph
        assert g.entry is not None, CHECKED
        self._sizes: dict[str, int] = dict(getattr(bound, "sizes", None) or {})
        self._temps = g.temporaries
        # take the current shape of an @auto_dim tensor (§0 item 12): what the checker computed
        self._shaped = dict(bound.checked.runtime_shaped)
        self._plan = bound.checked.yield_phases  # the consumers of each yield (phases.yield_phases)
        check_sizes(bound)  # the one size guard (oi2jax/limits.py), as the compiled program
        self._families: dict[str, np.ndarray] = {}
        self._constants: dict[str, np.ndarray] = {}
        self._op_calls: dict = {}  # added ops' jitted kernels, one per call signature (ops/calls.py)
        self.state = self._initial_state()

    @property
    def model_path(self) -> str | None:
        """The model file this program was bound to (as `Program.model_path`)."""
        return self.bound.model_path

    def run_batched(self, inputs: dict | None = None, batch_var: str = "B", steps: int = 1) -> dict:
        """Not for the interpreter (the Program protocol's member): an OiError."""
        raise OiError("run_batched needs a compiled program (mode=\"compiled\"); the interpreter runs "
                      "inputs of their declared shape")

    # ------------------------------------------------------------------ declarations / values

    def _err(self, message: str, node: ir.Node | None = None) -> OiError:
        return OiError(message, node.span if node is not None else None, source=self.graph.source or None)

    def _decl_shape(self, name: str) -> tuple[int, ...]:
        try:
            return tuple(int(s) for s in self.bound.shape(name))
        except Exception:
            decl = self.graph.var(name)
            if decl is not None:
                return decl.shape(self._sizes)
            temp = self._temps.get(name)
            if temp is not None:
                return tuple(d.resolve(self._sizes) for d in temp.dims)
            raise

    def _dtype(self, name: str) -> str:
        decl = self.graph.var(name)
        if decl is not None:
            return decl.dtype
        temp = self._temps.get(name)
        if temp is not None:
            return temp.dtype
        raise OiError(f"unknown variable {name}")

    def _initial(self, name: str) -> np.ndarray:
        decl = self.graph.var(name)
        if decl is not None and decl.kind == ir.MemKind.PERSISTENT:
            return state_fill(decl, decl.shape(self._sizes))
        if decl is None:  # temporary: zeros
            temp = self._temps[name]
            return np.zeros(self._decl_shape(name), dtype=dt.get(temp.dtype).np_dtype)
        return np.asarray(self.bound.initial(name))

    def _initial_state(self) -> State:
        st = State()
        for decl in self.graph.vars:
            if decl.is_prefix_table:
                continue
            if decl.kind == ir.MemKind.PERSISTENT:
                if decl.is_table:
                    fixed_map = decl.fixed_sizes(self._sizes)
                    fixed = [fixed_map.get(p) for p in decl.table_indices]
                    st.tables[decl.name] = Table([f if f is not None else 0 for f in fixed], fixed)
                else:  # plain values and auto_dim tensors (host_numerics.state_fill: the one rule)
                    st.values[decl.name] = self._initial(decl.name)
                    if decl.is_auto_dim:
                        st.counts[decl.name] = [0] * len(decl.auto_dim)
            elif decl.kind == ir.MemKind.CONSTANT:
                st.values[decl.name] = self._initial(decl.name)
        return st

    def _reset_step(self, st: State, inputs: dict[str, np.ndarray]) -> None:
        for decl in self.graph.vars:
            if decl.is_prefix_table:
                continue
            if decl.kind == ir.MemKind.DYNAMIC:
                st.values[decl.name] = inputs[decl.name] if decl.name in inputs else self._initial(decl.name)
            elif decl.kind == ir.MemKind.VOLATILE:
                st.values[decl.name] = self._initial(decl.name)
        for name in self._temps:
            if self.graph.var(name) is None:
                st.values[name] = self._initial(name)

    def _family(self, name: str) -> np.ndarray:
        if name not in self._families:
            self._families[name] = np.asarray(self.bound.family(name))
        return self._families[name]

    def _scalar(self, name: str, st: State, node, what: str):
        v = np.asarray(st.values[name])
        d = dt.get(self._dtype(name))
        assert v.size == 1 and not d.packed, f"{what} {name}: {CHECKED}"
        return v.reshape(()), d

    def _bound(self, value: ir.IndexValue, frames, st: State, node) -> int:
        if isinstance(value, int):
            return value
        try:
            b = self.bound.loop_bound(value)
        except Exception:
            b = None
        if b is None and value in self._sizes:
            b = self._sizes[value]
        if b is not None:
            return int(b)
        v, d = self._scalar(value, st, node, "loop bound")
        if d.is_float:
            f = float(v.astype(np.float64))
            if not np.isfinite(f):
                raise self._err(messages.loop_bound_not_finite(value), node)
            b, shown = int(f), f  # truncates toward zero
        else:
            b = shown = int(v)
        lo, hi = messages.I64_RANGE
        if not lo <= b < hi:
            raise self._err(messages.loop_bound_out_of_range(value, shown), node)
        return b

    # ------------------------------------------------------------------------------- reading

    def _read_ref(self, ref: ir.VarRef, frames, st: State, node) -> np.ndarray:
        if ref.indices is None:
            assert ref.name in st.values, f"{ref.name}: {CHECKED}"
            return st.values[ref.name]
        decl = self.graph.var(ref.name)
        assert decl is not None and decl.is_prefix_table and len(ref.indices) == len(decl.index_params), CHECKED
        idx = tuple(self._index(i, frames, st, node, "prefix index") for i in ref.indices)
        fam = self._family(ref.name)
        lead = fam.shape[: len(idx)]
        if all(0 <= i < n for i, n in zip(idx, lead)):
            return fam[idx]
        # a member the family does not hold: an error (docs/semantics.md item 1), not zeros
        raise OiError(messages.prefix_member_missing(ref.name, self.bound.member_name(decl, idx)), ref.span,
                      source=self.graph.source or None)

    def _ref_dtype(self, ref: ir.VarRef) -> str:
        return self._dtype(ref.name)

    # ------------------------------------------------------------------------------- running

    def run(self, inputs: dict | None = None, steps: int | None = None, progress=None, *, collect=(),
            feedback=None, stop=None) -> dict[str, np.ndarray]:
        """Run `steps` steps from a fresh state. An input of its declared shape is the same every
        step; one with a leading step axis `[N, ...]` gives step i the value `[i]` (`steps=None`:
        N, else at most N; 1 without such an input), as the compiled `Program.run`.
        `collect`, `feedback={IN: OUT}` and `stop={OUT: ids}` mean what they mean in a compiled
        session's `run` (run_rules.py, the one definition): each collected variable holds every
        step's value stacked `[steps, ...]`; past IN's given values, step i takes IN from OUT after
        step i-1; the run ends after the step that leaves every element of OUT at a stop id.
        `progress(n)` is called after each step (e.g. oi2jax.progress.ProgressBar). A runtime
        error names its step and carries every variable after the step before it (`.partial`,
        with the collected rows of the steps before it)."""
        pairs = feedback_pairs(self, feedback)
        stop_ids = stop_set(self, stop)
        collect = collect_names(self, collect)
        try:
            return self._run(inputs, steps, progress, collect, pairs, stop_ids)
        except MemoryError as exc:
            raise OiError(f"out of memory while interpreting: {exc}") from None

    def _run(self, inputs, steps, progress, collect, pairs, stop_ids):
        with jax.enable_x64(True):
            inputs = dict(inputs or {})
            per_step_given, fixed, steps = split_inputs(self, inputs, steps, pairs)
            per_step = {name: [convert_inputs({name: row}, self.graph, self._decl_shape)[name]
                               for row in np.asarray(value)] for name, value in per_step_given.items()}
            converted = convert_inputs(fixed, self.graph, self._decl_shape)
            check_given_inputs(self.bound, inputs.keys(), self.zero_missing_inputs)
            self.state = self._initial_state()
            first = {**converted, **{k: v[0] for k, v in per_step.items() if v}}
            self._reset_step(self.state, first)  # so that steps=0 returns the initial values
            if self.trace is not None and not self.trace.echo:
                self.trace.clear()
            stacks: dict = {k: [] for k in collect}

            def result() -> dict:  # every variable, each collected one as its rows stacked
                return with_collected(self.outputs(), stacks)

            counts_from = stop_from(stop_ids, pairs, lambda k: len(per_step[k]) if k in per_step else 1)
            done = {k: np.zeros(tuple(self._decl_shape(k)), bool) for k in stop_ids}
            for i in range(steps):
                given = {**converted, **{k: v[i] for k, v in per_step.items() if i < len(v)}}
                for name, source in pairs:  # past its given values: what its source held after the last step
                    if fed_back(i, len(per_step[name]) if name in per_step else 1):
                        given[name] = self.state.values[source]
                before = self.state.copy()  # shallow: arrays are never mutated in place
                try:
                    self._step(given)
                except OiError as exc:  # a runtime error names its step, as a compiled guard does;
                    # what the steps before it produced goes with it (`partial`), as a compiled run's
                    error = exc.in_step(i + 1)
                    self.state = before
                    error.partial = result()
                    raise error from None
                now = self.outputs() if collect else {}
                for k in collect:
                    stacks[k].append(now[k])
                if progress is not None:
                    progress(i + 1)
                for k, ids in stop_ids.items():
                    if i >= counts_from[k]:
                        done[k] = done[k] | stop_hits(self.state.values[k], ids)
                if done and stopped(done):
                    break
            return result()

    def step(self, inputs: dict) -> None:
        """One step on `self.state` (after a `run`, or from the initial state), with `inputs` as
        `run` takes them for one step (checked and converted: an unknown name or a wrong shape is
        an OiError, never dropped). A runtime error leaves the state as the failing node found it.
        Not `Program.step` (the pure step of a compiled program)."""
        with jax.enable_x64(True):
            inputs = dict(inputs or {})
            for name in inputs:
                decl = self.graph.var(name)
                if decl is None or decl.kind != ir.MemKind.DYNAMIC:
                    raise unknown_input(name, self.graph)
            self._step(convert_inputs(inputs, self.graph, self._decl_shape))

    def __getattr__(self, name: str):
        """A compiled program's attribute asked of the interpreter: an OiError that says so (also an
        AttributeError, so that `getattr(program, name, default)` still gives the default)."""
        if name in _COMPILED_ONLY:
            raise _CompiledOnly(f"{name} needs a compiled program (mode=\"compiled\"); the interpreter runs whole runs: "
                                f"run(inputs, steps, collect=, feedback=, stop=), then step(inputs) to go on")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _step(self, inputs: dict[str, np.ndarray]) -> None:
        """One step on self.state (inputs already converted)."""
        with jax.enable_x64(True):
            st = self.state
            self._reset_step(st, inputs)
            ctx = Ctx()
            self._execute(st, [Frame("entry", self.graph.entry.nodes)], ctx)
            if ctx.pending is not None:  # a yield never awaited: merge at the end of the step
                self._merge(st, ctx, None)

    def outputs(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        st = self.state
        for decl in self.graph.vars:
            if decl.kind == ir.MemKind.CONSTANT or decl.is_prefix_table:
                continue
            if decl.name in st.tables:
                value = self._table_array(decl, st.tables[decl.name])
            else:
                value = st.values[decl.name]
            out[decl.name] = convert_output(value, decl.dtype)
        return out

    # ------------------------------------------------------------------------- the executor

    def _execute(self, st: State, frames: list[Frame], ctx: Ctx) -> None:
        while frames:
            f = frames[-1]
            if f.pos >= len(f.nodes):
                if f.loop is not None:
                    f.value += 1
                    if f.value < f.end:
                        f.pos = 0
                        continue
                frames.pop()
                continue
            node = f.nodes[f.pos]
            f.pos += 1
            ctx.nodes += 1
            if ctx.nodes > MAX_NODES:
                raise self._err(f"step exceeded {MAX_NODES} executed nodes (runaway loop?)", node)
            self._node(node, f, frames, st, ctx)

    def _record(self, block: str, node: ir.Node, ns: int = 0) -> None:
        if self.trace is not None:
            self.trace.record(block, node, ns)

    def _node(self, node: ir.Node, f: Frame, frames: list[Frame], st: State, ctx: Ctx) -> None:
        """Record the node in the trace and run its rule (`_RULES`: node type -> method)."""
        if isinstance(node, ir.Op):
            self._record(f.block, node, self._op(node, frames, st, ctx))
            return
        self._record(f.block, node)
        rule = _RULES.get(type(node))
        if rule is None:
            raise self._err(f"unsupported node {type(node).__name__}", node)
        rule(self, node, f, frames, st, ctx)

    def _assign(self, node: ir.Assign, f, frames, st: State, ctx) -> None:
        if node.name not in st.values:  # created zero-filled; an existing value is kept (§3.9)
            st.values[node.name] = self._initial(node.name)

    def _branch(self, node: ir.Branch, f, frames, st: State, ctx) -> None:
        target = node.then_block
        if node.cond is not None:
            v, d = self._scalar(node.cond, st, node, "branch condition")
            if d.family == dt.BOOL:
                taken = bool(v)
            elif d.is_float:
                x = float(v.astype(np.float64))
                taken = x != 0.0 or x != x  # NaN is true
            else:
                taken = int(v) != 0
            target = node.then_block if taken else node.else_block
        blk = self.graph.block(target)
        assert blk is not None, CHECKED
        if len(frames) >= self._max_depth:
            raise self._err(f"branch to {target}: call depth exceeds {self._max_depth} (unbounded recursion?)", node)
        frames.append(Frame(target, blk.nodes))

    def _loop(self, node: ir.Loop, f, frames, st: State, ctx) -> None:
        start = self._bound(node.start, frames, st, node)
        end = self._bound(node.end, frames, st, node)
        if start < end:
            if len(frames) >= self._max_depth:
                raise self._err(f"loop {node.name}: frame depth exceeds {self._max_depth}", node)
            frames.append(Frame(f.block, node.body, 0, node, start, end))

    def _return(self, node, f, frames, st, ctx) -> None:
        frames.pop()

    def _no_effect(self, node, f, frames, st, ctx) -> None:
        pass  # barrier, dep: ordering only; execution is already in program order

    def _transfer(self, node: ir.Transfer, f, frames, st: State, ctx) -> None:
        value = self._read_ref(node.src, frames, st, node)
        st.values[node.dst.name] = np.array(value, copy=True)
        ctx.wrote(node.dst.name)

    def _yield_node(self, node: ir.Yield, f, frames, st: State, ctx) -> None:
        if ctx.consumer or f.block != "entry":
            frames.pop()  # a terminator outside the entry (pops just a loop frame inside a loop)
        else:
            self._yield(node, st, ctx)

    def _await_node(self, node: ir.Await, f, frames, st: State, ctx) -> None:
        if not ctx.consumer and f.block == "entry" and ctx.pending is not None:
            self._merge(st, ctx, node)

    def _cache_read_node(self, node, f, frames, st, ctx) -> None:
        self._cache_read(node, frames, st, ctx)

    def _cache_write_node(self, node, f, frames, st, ctx) -> None:
        self._cache_write(node, frames, st, ctx)

    def _cache_step_node(self, node, f, frames, st, ctx) -> None:
        self._cache_step(node, st, ctx)

    def _cache_reset_node(self, node, f, frames, st, ctx) -> None:
        self._cache_reset(node, frames, st, ctx)

    # ----------------------------------------------------------------------------------- ops

    def _op(self, node: ir.Op, frames, st: State, ctx: Ctx) -> int:
        inputs, in_dtypes = [], []
        for pos, ref in enumerate(node.inputs):
            if isinstance(ref, ir.LiteralInput):  # typed by the checker: its dtype and value
                lit = self.bound.checked.literal(node, pos)
                inputs.append(lit.value)
                in_dtypes.append(lit.dtype)
            else:
                inputs.append(self._read_ref(ref, frames, st, node))
                in_dtypes.append(self._ref_dtype(ref))
        sig = self.bound.op_sig(node)  # typed by the checker (check.CheckedGraph), not re-inferred
        attrs = self.bound.op_attrs(node)  # the one preparation; a variable is read from the state
        for name, value in attrs.items():
            if isinstance(value, AttrVar):
                attrs[name] = jnp.asarray(ops.attr_variable_value(sig.op, name, np.asarray(st.values[value.name])))
        t0 = time.perf_counter_ns()
        try:
            guards: list = []
            if sig.op.reference is not None and not sig.op.builtin:  # an added op: its NumPy reference
                result = ops.reference(sig.op, [np.asarray(a) for a in inputs], attrs, in_dtypes=in_dtypes,
                                       out_dtype=sig.out_dtype, mode=sig.mode, guards=guards,
                                       out_shape=None if node.output in self._shaped else sig.out_shape)
            elif not sig.op.builtin:  # an added op without one: its JAX kernel, jitted as the compiled step runs it
                _note_no_reference(sig.op)
                result = op_calls.apply(
                    self._op_calls, sig.op, [jnp.asarray(a) for a in inputs], attrs, guards=guards,
                    traced_inputs={pos for pos, ref in enumerate(node.inputs) if not isinstance(ref, ir.LiteralInput)},
                    traced_attrs={k for k, v in attrs.items() if isinstance(v, jax.Array)},
                    in_dtypes=tuple(in_dtypes), out_dtype=sig.out_dtype, mode=sig.mode,
                    out_shape=None if node.output in self._shaped else sig.out_shape)
            else:
                result = ops.apply(sig.op, [jnp.asarray(a) for a in inputs], attrs, in_dtypes=in_dtypes,
                                   out_dtype=sig.out_dtype, mode=sig.mode, guards=guards, out_shape=None if node.output in self._shaped else sig.out_shape)
            result = jax.block_until_ready(result)
            for cond, message, value in guards:  # the kernel's runtime checks (Ctx.fail_if)
                if bool(np.any(np.asarray(cond))):
                    raise self._err(message.format(value=int(np.asarray(value))), node)
        except ops.OpTypeError as exc:  # an added op's kernel failed or broke its declaration
            raise self._err(exc.message, node) from None
        except OiError as exc:
            if exc.diagnostics and exc.diagnostics[0].span is None:
                raise self._err(exc.diagnostics[0].message, node) from None
            raise
        ns = time.perf_counter_ns() - t0
        result = np.asarray(result)
        current = st.values.get(node.output)
        if current is not None and tuple(np.shape(current)) != tuple(result.shape) \
                and node.output not in self._shaped:  # a shape the checker could not type (keepdims=var)
            raise self._err(messages.op_output_shape(node.op, node.output, np.shape(current), result.shape), node)
        st.values[node.output] = result
        ctx.wrote(node.output)
        return ns

    # ------------------------------------------------------------------------------ yield/await

    def _yield(self, node: ir.Yield, st: State, ctx: Ctx) -> None:
        assert ctx.pending is None, CHECKED  # an await between two yields (phases.yield_phases)
        snapshot = st.copy()
        results = []
        for name in self._plan.consumers_of(node.vars):
            cst = snapshot.copy()
            cctx = Ctx(consumer=True, written=set())
            self._execute(cst, [Frame(name, self.graph.block(name).nodes)], cctx)
            results.append((name, cst, cctx.written))
        ctx.pending = (node, results)

    def _merge(self, st: State, ctx: Ctx, node) -> None:
        _, results = ctx.pending
        ctx.pending = None
        owner: dict[str, str] = {}
        for cname, cst, written in results:
            for var in sorted(written):
                # two consumers writing one variable or cache in a window: phases.node_writes
                assert var not in owner, f"{var}: {CHECKED}"
                owner[var] = cname
                st.take(cst, var)
                ctx.wrote(var)


# node type -> the InterpretedProgram method running it (ops are dispatched first, with timing)
_RULES = {
    ir.Assign: InterpretedProgram._assign,
    ir.Branch: InterpretedProgram._branch,
    ir.Loop: InterpretedProgram._loop,
    ir.Return: InterpretedProgram._return,
    ir.Barrier: InterpretedProgram._no_effect,
    ir.Dep: InterpretedProgram._no_effect,
    ir.Transfer: InterpretedProgram._transfer,
    ir.Yield: InterpretedProgram._yield_node,
    ir.Await: InterpretedProgram._await_node,
    ir.CacheRead: InterpretedProgram._cache_read_node,
    ir.CacheWrite: InterpretedProgram._cache_write_node,
    ir.CacheIncrement: InterpretedProgram._cache_step_node,
    ir.CacheDecrement: InterpretedProgram._cache_step_node,
    ir.CacheReset: InterpretedProgram._cache_reset_node,
}


_NOTED: set = set()

# what a compiled `runtime.Program` has and the interpreter has not (a session, the pure step's
# state, batches, the compiled forms): asked of the interpreter, an OiError naming it
_COMPILED_ONLY = frozenset({"apply", "batch", "check", "consts", "defaults", "dump", "emit", "export_state",
                            "import_state", "init_state", "lower", "memory", "mesh", "session", "specialized"})


class _CompiledOnly(OiError, AttributeError):
    """`InterpretedProgram.__getattr__`'s error."""


def _note_no_reference(op_def) -> None:
    """Said once per op and process: an added op without a NumPy reference is interpreted by
    running its JAX kernel (the interpreter is then not independent of it)."""
    if op_def.source in _NOTED:
        return
    _NOTED.add(op_def.source)
    print(f"note: {op_def.where()} has no NumPy reference; the interpreter runs its JAX kernel",
          file=sys.stderr)
