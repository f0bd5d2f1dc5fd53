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
  non-yielded variables, cache state) is merged into the entry's state; two consumers writing
  the same variable is an error ("multiple blocks mutated X"). A `yield` executed in any other
  block (or inside a consumer) ends the current frame; an `await` there does nothing. A yield
  still pending when the step ends is merged then (an implicit await).
* Caches (§4) are host NumPy state: tables are a dict of materialised entries plus a size per
  table index (fixed sizes, growth by single indices and by slice ends, negative slice ends,
  unwritten entries read as the @init fill, reset of everything or of an index prefix);
  auto_dim tensors grow by zero padding at the end (count = max(count, index)); plain
  persistent values are replaced whole; increment/decrement wrap in the variable's width.
* Every step starts by resetting dynamic variables (to the given input, else their initial
  value, §2.2), volatile variables and `assign` temporaries (to their initial value, §0 item 4);
  persistent values, tables and auto_dim tensors carry over. `run()` starts from a fresh state.
* Ops are evaluated eagerly with the same implementations the compiler uses
  (`oi2jax.ops.infer` for mode and output dtype, `oi2jax.ops.apply` for the value), inside
  `jax.enable_x64(True)`.

Runtime errors (cache overflow, negative index, unknown names, runaway recursion) raise OiError
located at the offending node.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from . import dtypes as dt
from . import ir
from .diagnostics import OiError
from .numerics import f8_encode
from .values import convert_input, convert_output

MAX_DEPTH = 2_000  # frame stack depth (unbounded recursion through `branch`)
MAX_NODES = 5_000_000  # executed nodes per step (runaway loops with huge variable bounds)
MAX_ELEMENTS = 1 << 31  # per variable: refuse absurd shapes (e.g. a corrupt model's sizevar) up front


# ---------------------------------------------------------------------------------------- state


@dataclass
class _Table:
    """A cache table: materialised entries by index tuple, current size per table index."""

    sizes: list[int]
    fixed: list[int | None]
    entries: dict[tuple[int, ...], np.ndarray] = field(default_factory=dict)

    def copy(self) -> "_Table":
        return _Table(list(self.sizes), list(self.fixed), dict(self.entries))

    def reset_sizes(self) -> None:
        for d, fixed in enumerate(self.fixed):
            if fixed is not None:
                self.sizes[d] = fixed
            else:
                self.sizes[d] = max((k[d] + 1 for k in self.entries), default=0)

    def key(self):
        return tuple(self.sizes), frozenset(self.entries)


@dataclass
class _State:
    """All values: `values` (every non-table variable and temporary, including plain persistent
    and auto_dim tensors), `tables`, `counts` (auto_dim counts). Arrays are never mutated in
    place, so copies are shallow."""

    values: dict[str, np.ndarray] = field(default_factory=dict)
    tables: dict[str, _Table] = field(default_factory=dict)
    counts: dict[str, list[int]] = field(default_factory=dict)

    def copy(self) -> "_State":
        return _State(dict(self.values), {k: t.copy() for k, t in self.tables.items()},
                      {k: list(c) for k, c in self.counts.items()})

    def take(self, other: "_State", name: str) -> None:
        """Copy variable `name` (value, table or auto_dim counts) from `other`."""
        if name in other.tables:
            self.tables[name] = other.tables[name].copy()
        if name in other.values:
            self.values[name] = other.values[name]
        if name in other.counts:
            self.counts[name] = list(other.counts[name])


@dataclass
class _Frame:
    block: str
    nodes: tuple
    pos: int = 0
    loop: ir.Loop | None = None
    value: int = 0
    end: int = 0


@dataclass
class _Ctx:
    """Per-run-of-a-frame-stack context: consumer runs track what they write."""

    consumer: bool = False
    written: set[str] | None = None
    pending: tuple | None = None  # (yield node, [(consumer name, state, written)])
    nodes: int = 0

    def wrote(self, name: str) -> None:
        if self.written is not None:
            self.written.add(name)


# ----------------------------------------------------------------------------------- helpers


def fill_value(dtype: str, init: ir.Literal | None, shape: tuple[int, ...]) -> np.ndarray:
    """`@init` broadcast over `shape` in dtype's representation (zeros without @init)."""
    d = dt.get(dtype)
    if init is None:
        return np.zeros(shape, dtype=d.np_dtype)
    v = init.value
    if d.name == "f8":
        return f8_encode(np.full(shape, float(v), dtype=np.float32))
    if d.name == "bf16":
        return np.full(shape, float(v), dtype=np.float32).astype(d.np_dtype)
    if d.family == dt.BOOL:
        return np.full(shape, bool(v), dtype=np.bool_)
    if d.is_float:
        return np.full(shape, float(v), dtype=d.np_dtype)
    return np.full(shape, int(v), dtype=np.int64).astype(d.np_dtype)


def _shape(a) -> list[int]:
    return [int(s) for s in np.shape(a)]


class InterpretedProgram:
    """Runs a BoundGraph node by node (see module docstring). `run(inputs, steps)` has the same
    output contract as the compiled Program.run."""

    mode = "interpret"

    def __init__(self, bound, trace=None):
        from .trace import Trace

        self.bound = bound
        self.graph: ir.Graph = bound.graph
        self.trace = trace if trace is not None else Trace.from_env()
        g = self.graph
        if g.entry is None:
            raise OiError("graph has no entry block")
        self._sizes: dict[str, int] = dict(getattr(bound, "sizes", None) or {})
        self._temps = g.temporaries
        self._branch_targets = {n.then_block for b in g.blocks for n in b.walk() if isinstance(n, ir.Branch)} | {
            n.else_block for b in g.blocks for n in b.walk() if isinstance(n, ir.Branch) and n.else_block}
        self._awaits: dict[str, set[str]] = {}
        for b in g.blocks:
            names = {v for n in b.walk() if isinstance(n, ir.Await) for v in n.vars}
            if names:
                self._awaits[b.name] = names
        for name in [d.name for d in g.vars] + list(self._temps):
            try:
                shape = self._decl_shape(name)
            except Exception:
                continue
            numel = int(np.prod([int(x) for x in shape], dtype=object)) if shape else 1
            if numel > MAX_ELEMENTS:
                decl = g.var(name)
                raise OiError(f"{name}: shape {list(shape)} has {numel} elements, too large to allocate",
                              decl.span if decl is not None else None, source=g.source or None)
        self._families: dict[str, np.ndarray] = {}
        self._constants: dict[str, np.ndarray] = {}
        self._sig_cache: dict = {}
        self.state = self._initial_state()

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
            return fill_value(decl.dtype, decl.init, decl.shape(self._sizes))
        if decl is None:  # temporary: zeros
            temp = self._temps[name]
            return np.zeros(self._decl_shape(name), dtype=dt.get(temp.dtype).np_dtype)
        return np.asarray(self.bound.initial(name))

    def _initial_state(self) -> _State:
        st = _State()
        for decl in self.graph.vars:
            if decl.is_prefix_table:
                continue
            if decl.kind == ir.MemKind.PERSISTENT:
                if decl.is_table:
                    fixed_map = decl.fixed_map
                    fixed = [fixed_map.get(p) for p in decl.table_indices]
                    st.tables[decl.name] = _Table([f if f is not None else 0 for f in fixed], fixed)
                elif decl.is_auto_dim:
                    # the cache paths create auto_dim tensors as zeros; @init only after a reset (§4.6)
                    st.values[decl.name] = np.zeros(decl.shape(self._sizes), dtype=dt.get(decl.dtype).np_dtype)
                    st.counts[decl.name] = [0] * len(decl.auto_dim)
                else:
                    st.values[decl.name] = self._initial(decl.name)
            elif decl.kind == ir.MemKind.CONSTANT:
                st.values[decl.name] = self._initial(decl.name)
        return st

    def _reset_step(self, st: _State, inputs: dict[str, np.ndarray]) -> None:
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

    # ---------------------------------------------------------------------- index resolution

    def _loop_index(self, name: str, frames: list[_Frame]) -> int | None:
        for f in reversed(frames):
            if f.loop is not None and f.loop.var == name:
                return f.value
        return None

    def _index(self, value: ir.IndexValue, frames, st: _State, node, what="cache index") -> int:
        if isinstance(value, int):
            return value
        if value in self._sizes:
            return int(self._sizes[value])
        li = self._loop_index(value, frames)
        if li is not None:
            return li
        decl = self.graph.var(value)
        if decl is not None and decl.kind == ir.MemKind.PERSISTENT and decl.is_scalar and value in st.values:
            d = dt.get(decl.dtype)
            if d.packed:
                raise self._err(f"{what} {value}: packed scalars are not supported", node)
            if d.family not in (dt.SIGNED, dt.UNSIGNED, dt.BOOL):
                raise self._err(f"{what} must be integer: {value} is {decl.dtype}", node)
            return int(np.asarray(st.values[value]).reshape(()))
        raise self._err(f"unknown {what} {value}", node)

    def _scalar(self, name: str, st: _State, node, what: str):
        if name not in st.values:
            raise self._err(f"unknown variable {name}", node)
        v = np.asarray(st.values[name])
        if v.size != 1:
            raise self._err(f"{what} {name} must be scalar, got shape {list(v.shape)}", node)
        d = dt.get(self._dtype(name))
        if d.packed:
            raise self._err(f"{what} {name}: packed scalars are not supported", node)
        return v.reshape(()), d

    def _bound(self, value: ir.IndexValue, frames, st: _State, node) -> int:
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
                raise self._err(f"loop bound {value} is not finite ({f})", node)
            return int(f)  # truncates toward zero
        return int(v)

    # ------------------------------------------------------------------------------- reading

    def _read_ref(self, ref: ir.VarRef, frames, st: _State, node) -> np.ndarray:
        if ref.indices is None:
            if ref.name not in st.values:
                decl = self.graph.var(ref.name)
                if decl is not None and decl.kind == ir.MemKind.PERSISTENT:
                    raise self._err(f"persistent cache {ref.name} must be read via cache.read", node)
                raise self._err(f"unknown variable {ref.name}", node)
            return st.values[ref.name]
        decl = self.graph.var(ref.name)
        if decl is None or not decl.is_prefix_table:
            raise self._err(f"{ref.name} is not a prefix table and cannot be indexed", node)
        idx = tuple(self._index(i, frames, st, node, "prefix index") for i in ref.indices)
        fam = self._family(ref.name)
        lead = fam.shape[: len(idx)]
        if len(idx) != len(decl.index_params):
            raise self._err(f"{ref.name} expects {len(decl.index_params)} indices, got {len(idx)}", node)
        if any(i < 0 for i in idx):
            raise self._err(f"prefix table index for {ref} cannot be negative: {list(idx)}", node)
        if all(i < n for i, n in zip(idx, lead)):
            return fam[idx]
        # a member the family does not hold: the declared fill (missing model tensors read as @init/zeros)
        return fill_value(decl.dtype, decl.init, decl.shape(self._sizes))

    def _ref_dtype(self, ref: ir.VarRef) -> str:
        return self._dtype(ref.name)

    # ------------------------------------------------------------------------------- running

    def run(self, inputs: dict | None = None, steps: int = 1, progress=None) -> dict[str, np.ndarray]:
        """Run `steps` steps from a fresh state with the same dynamic `inputs` each step.
        `progress(n)` is called after each step (e.g. oi2jax.progress.ProgressBar)."""
        try:
            return self._run(inputs, steps, progress)
        except MemoryError as exc:
            raise OiError(f"out of memory while interpreting: {exc}") from None

    def _run(self, inputs, steps, progress=None):
        import jax

        with jax.enable_x64(True):
            converted = self._convert_inputs(inputs or {})
            if steps < 0:
                raise OiError("steps must be >= 0")
            self.state = self._initial_state()
            self._reset_step(self.state, converted)  # so that steps=0 returns the initial values
            if self.trace is not None and not self.trace.echo:
                self.trace.clear()
            for i in range(steps):
                self.step(converted)
                if progress is not None:
                    progress(i + 1)
            return self.outputs()

    def _convert_inputs(self, inputs: dict) -> dict[str, np.ndarray]:
        out = {}
        for name, array in inputs.items():
            decl = self.graph.var(name)
            if decl is None:
                raise OiError(f"unknown input {name}: the graph declares no variable {name}")
            if decl.kind != ir.MemKind.DYNAMIC:
                raise OiError(f"unknown input {name}: {name} is a {decl.kind.value} variable, not dynamic")
            out[name] = convert_input(name, array, decl.dtype, self._decl_shape(name))
        return out

    def step(self, inputs: dict[str, np.ndarray]) -> None:
        """One step on self.state (inputs already converted)."""
        import jax

        with jax.enable_x64(True):
            st = self.state
            self._reset_step(st, inputs)
            ctx = _Ctx()
            self._execute(st, [_Frame("entry", self.graph.entry.nodes)], ctx)
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

    def _table_array(self, decl: ir.VarDecl, t: _Table) -> np.ndarray:
        entry = decl.shape(self._sizes)
        arr = np.broadcast_to(fill_value(decl.dtype, decl.init, entry), tuple(t.sizes) + entry).copy()
        for k, v in t.entries.items():
            if all(i < s for i, s in zip(k, t.sizes)):
                arr[k] = v
        return arr

    # ------------------------------------------------------------------------- the executor

    def _execute(self, st: _State, frames: list[_Frame], ctx: _Ctx) -> None:
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

    def _node(self, node: ir.Node, f: _Frame, frames: list[_Frame], st: _State, ctx: _Ctx) -> None:
        block = f.block
        if isinstance(node, ir.Op):
            ns = self._op(node, frames, st, ctx)
            self._record(block, node, ns)
            return
        self._record(block, node)
        if isinstance(node, ir.Assign):
            if node.name not in st.values:  # created zero-filled; an existing value is kept (§3.9)
                st.values[node.name] = self._initial(node.name)
        elif isinstance(node, ir.Branch):
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
            if blk is None:
                raise self._err(f"branch target block not found: {target}", node)
            if len(frames) >= MAX_DEPTH:
                raise self._err(f"branch to {target}: call depth exceeds {MAX_DEPTH} (unbounded recursion?)", node)
            frames.append(_Frame(target, blk.nodes))
        elif isinstance(node, ir.Loop):
            start = self._bound(node.start, frames, st, node)
            end = self._bound(node.end, frames, st, node)
            if start < end:
                if len(frames) >= MAX_DEPTH:
                    raise self._err(f"loop {node.name}: frame depth exceeds {MAX_DEPTH}", node)
                frames.append(_Frame(block, node.body, 0, node, start, end))
        elif isinstance(node, ir.Return):
            frames.pop()
        elif isinstance(node, (ir.Barrier, ir.Dep)):
            pass
        elif isinstance(node, ir.Transfer):
            value = self._read_ref(node.src, frames, st, node)
            st.values[node.dst.name] = np.array(value, copy=True)
            ctx.wrote(node.dst.name)
        elif isinstance(node, ir.Yield):
            if ctx.consumer or block != "entry":
                frames.pop()  # a terminator outside the entry (pops just a loop frame inside a loop)
            else:
                self._yield(node, st, ctx)
        elif isinstance(node, ir.Await):
            if not ctx.consumer and block == "entry" and ctx.pending is not None:
                self._merge(st, ctx, node)
        elif isinstance(node, ir.CacheRead):
            self._cache_read(node, frames, st, ctx)
        elif isinstance(node, ir.CacheWrite):
            self._cache_write(node, frames, st, ctx)
        elif isinstance(node, (ir.CacheIncrement, ir.CacheDecrement)):
            self._cache_step(node, st, ctx)
        elif isinstance(node, ir.CacheReset):
            self._cache_reset(node, frames, st, ctx)
        else:
            raise self._err(f"unsupported node {type(node).__name__}", node)

    # ----------------------------------------------------------------------------------- ops

    def _op(self, node: ir.Op, frames, st: _State, ctx: _Ctx) -> int:
        import jax
        import jax.numpy as jnp

        from . import ops

        inputs = [self._read_ref(r, frames, st, node) for r in node.inputs]
        in_dtypes = [self._ref_dtype(r) for r in node.inputs]
        lits = node.attr_map
        key = (node.index, tuple(tuple(np.shape(a)) for a in inputs))
        sig = self._sig_cache.get(key)
        if sig is None:
            try:
                sig = ops.infer(node.op, in_dtypes, [tuple(np.shape(a)) for a in inputs], lits,
                                out_name=node.output, in_names=[str(r) for r in node.inputs])
            except OiError:
                raise
            except Exception as exc:  # OpTypeError and friends
                raise self._err(f"op {node.op}: {getattr(exc, 'message', None) or exc}", node) from None
            self._sig_cache[key] = sig
        attrs: dict[str, object] = {}
        for name, lit in lits.items():
            if lit.kind == "var":
                text = self._metadata_string(lit.value)
                if text is not None:
                    attrs[name] = text
                else:
                    v, _ = self._scalar(lit.value, st, node, f"attribute {name}")
                    attrs[name] = jnp.asarray(v)
            elif lit.kind == "int_list":
                attrs[name] = tuple(lit.value)
            else:
                attrs[name] = lit.value
        try:
            out_dtype = self._dtype(node.output)
        except OiError:
            raise self._err(f"unknown output variable {node.output}", node) from None
        t0 = time.perf_counter_ns()
        try:
            result = ops.apply(node.op, [jnp.asarray(a) for a in inputs], attrs, in_dtypes=in_dtypes,
                               out_dtype=sig.out_dtype, mode=sig.mode)
            result = jax.block_until_ready(result)
        except OiError as exc:
            if exc.diagnostics and exc.diagnostics[0].span is None:
                raise self._err(exc.diagnostics[0].message, node) from None
            raise
        ns = time.perf_counter_ns() - t0
        result = np.asarray(result)
        if sig.out_dtype != out_dtype:
            raise self._err(f"op {node.op} output dtype mismatch for {node.output}: expected {out_dtype}, "
                            f"got {sig.out_dtype}", node)
        current = st.values.get(node.output)
        if current is not None and tuple(np.shape(current)) != tuple(result.shape):
            raise self._err(f"op {node.op}: output shape {_shape(result)} does not match {node.output} "
                            f"shape {_shape(current)}", node)
        st.values[node.output] = result
        ctx.wrote(node.output)
        return ns

    def _metadata_string(self, name: str) -> str | None:
        try:
            return self.bound.metadata_string(name)
        except Exception:
            return None

    # ------------------------------------------------------------------------------ yield/await

    def _consumers(self, names: tuple[str, ...]) -> list[str]:
        wanted = set(names)
        return sorted(b for b, aw in self._awaits.items()
                      if b != "entry" and b not in self._branch_targets and aw & wanted)

    def _yield(self, node: ir.Yield, st: _State, ctx: _Ctx) -> None:
        if ctx.pending is not None:
            raise self._err("await required before next yield", node)
        snapshot = st.copy()
        results = []
        for name in self._consumers(node.vars):
            cst = snapshot.copy()
            cctx = _Ctx(consumer=True, written=set())
            self._execute(cst, [_Frame(name, self.graph.block(name).nodes)], cctx)
            results.append((name, cst, cctx.written))
        ctx.pending = (node, results)

    def _merge(self, st: _State, ctx: _Ctx, node) -> None:
        _, results = ctx.pending
        ctx.pending = None
        owner: dict[str, str] = {}
        for cname, cst, written in results:
            for var in sorted(written):
                if var in owner:
                    raise self._err(f"multiple blocks mutated {var} ({owner[var]} and {cname})", node)
                owner[var] = cname
                st.take(cst, var)
                ctx.wrote(var)

    # ------------------------------------------------------------------------------------ caches

    def _persistent(self, name: str, node, op: str) -> ir.VarDecl:
        decl = self.graph.var(name)
        if decl is None:
            raise self._err(f"unknown cache variable {name}", node)
        if decl.kind != ir.MemKind.PERSISTENT:
            raise self._err(f"{op} expects persistent variable, got {decl.kind.value.capitalize()} {name}", node)
        return decl

    def _grow(self, decl: ir.VarDecl, t: _Table, d: int, size: int, node) -> None:
        fixed = t.fixed[d]
        if fixed is not None and size > fixed:
            raise self._err(f"cache table {decl.name} index {d} exceeds fixed size {fixed}", node)
        t.sizes[d] = max(t.sizes[d], size)

    def _single(self, decl, sel: ir.Single, frames, st, node) -> int:
        k = self._index(sel.value, frames, st, node)
        if k < 0:
            raise self._err(f"cache index cannot be negative: {decl.name} index {sel.value} is {k}", node)
        return k

    def _table_read(self, decl: ir.VarDecl, access: ir.CacheAccess, frames, st: _State, ctx, node) -> np.ndarray:
        t = st.tables[decl.name]
        before = t.key()
        n = len(t.sizes)
        if len(access.indices) > n:
            raise self._err(f"cache access {decl.name} expects at most {n} indices, got {len(access.indices)}", node)
        sels = list(access.indices) + [ir.Slice()] * (n - len(access.indices))
        ranges, out_dims = [], []
        for d, sel in enumerate(sels):
            if isinstance(sel, ir.Single):
                k = self._single(decl, sel, frames, st, node)
                self._grow(decl, t, d, k + 1, node)
                ranges.append([k])
                continue
            size = t.sizes[d]
            start = 0 if sel.start is None else self._index(sel.start, frames, st, node)
            if start < 0:
                raise self._err(f"cache index cannot be negative: {decl.name} slice start {start}", node)
            end = size if sel.end is None else self._index(sel.end, frames, st, node)
            if end < 0:
                if -end > size:
                    raise self._err(f"slice end underflow for size {size}", node)
                end = size + end
            if end < start:
                raise self._err(f"slice end {end} before start {start}", node)
            self._grow(decl, t, d, end, node)
            ranges.append(range(start, end))
            out_dims.append(end - start)
        entry = decl.shape(self._sizes)
        fill = fill_value(decl.dtype, decl.init, entry)
        values = []
        for combo in itertools.product(*ranges):
            if combo not in t.entries:
                t.entries[combo] = fill  # reading materialises the entry
            values.append(t.entries[combo])
        if t.key() != before:
            ctx.wrote(decl.name)
        if not values:
            return np.zeros(tuple(out_dims) + entry, dtype=dt.get(decl.dtype).np_dtype)
        return np.stack(values).reshape(tuple(out_dims) + entry)

    def _auto_dim(self, decl: ir.VarDecl, access: ir.CacheAccess, frames, st: _State, ctx, node) -> None:
        names = decl.auto_dim
        if len(names) != len(decl.dims):
            raise self._err(f"auto_dim requires {len(names)} dims, got {len(decl.dims)}", node)
        if len(access.indices) > len(names):
            raise self._err(f"cache access {decl.name} expects at most {len(names)} indices, "
                            f"got {len(access.indices)}", node)
        counts = st.counts[decl.name]
        fixed = decl.fixed_map
        new = list(counts)
        for j, sel in enumerate(access.indices):
            if not isinstance(sel, ir.Single):
                raise self._err(f"cache access {decl.name} does not support slice indices", node)
            v = self._single(decl, sel, frames, st, node)
            mx = fixed.get(names[j])
            if mx is not None and v > mx:
                raise self._err(f"auto_dim {decl.name} exceeds fixed max {mx} for {names[j]}", node)
            new[j] = max(new[j], v)
        if new != counts:
            base = decl.shape(self._sizes)
            value = st.values[decl.name]
            target = tuple(b + c for b, c in zip(base, new))
            pad = [(0, t - s) for t, s in zip(target, value.shape)]
            st.values[decl.name] = np.pad(value, pad)
            st.counts[decl.name] = new
            ctx.wrote(decl.name)

    def _cache_read(self, node: ir.CacheRead, frames, st: _State, ctx: _Ctx) -> None:
        access = node.src
        decl = self._persistent(access.base, node, "cache.read")
        if decl.is_table:
            if not access.bracketed:
                raise self._err(f"cache table {decl.name} requires indices", node)
            value = self._table_read(decl, access, frames, st, ctx, node)
        elif decl.is_auto_dim:
            self._auto_dim(decl, access, frames, st, ctx, node)
            value = st.values[decl.name]
        else:
            if access.bracketed:
                raise self._err(f"cache {decl.name} does not support indexed access", node)
            value = st.values[decl.name]
        dst = node.dst
        if dst.indices is not None:
            raise self._err(f"cache.read destination {dst} cannot be indexed", node)
        ddecl = self.graph.var(dst.name)
        if ddecl is None and dst.name not in self._temps:
            raise self._err(f"unknown variable {dst.name}", node)
        if ddecl is not None and ddecl.kind in (ir.MemKind.CONSTANT, ir.MemKind.PERSISTENT):
            raise self._err(f"cannot write to {ddecl.kind.value} memory: {dst.name}", node)
        want = tuple(self.bound.shape(dst.name))
        if tuple(np.shape(value)) != want:  # §0 item 12: the destination keeps its declared shape
            raise self._err(f"cache.read {access.base} -> {dst.name}: the selection has shape "
                            f"{list(np.shape(value))}, the destination is declared {list(want)}", node)
        st.values[dst.name] = np.array(value, copy=True)
        ctx.wrote(dst.name)

    def _cache_write(self, node: ir.CacheWrite, frames, st: _State, ctx: _Ctx) -> None:
        access = node.dst
        decl = self._persistent(access.base, node, "cache.write")
        src = np.asarray(self._read_ref(node.src, frames, st, node))
        want = dt.get(decl.dtype).np_dtype
        if src.dtype != want:
            raise self._err(f"cache.write {decl.name} dtype mismatch: expected {decl.dtype}, "
                            f"got {self._ref_dtype(node.src)}", node)
        if decl.is_table:
            t = st.tables[decl.name]
            if not access.bracketed:
                raise self._err(f"cache table {decl.name} requires indices", node)
            if len(access.indices) != len(t.sizes) or not all(isinstance(s, ir.Single) for s in access.indices):
                raise self._err(f"cache.write {decl.name} does not support slice indices", node)
            entry = decl.shape(self._sizes)
            if tuple(src.shape) != entry:
                raise self._err(f"cache.write {decl.name} expects shape {list(entry)}, got {_shape(src)}", node)
            combo = []
            for d, sel in enumerate(access.indices):
                k = self._single(decl, sel, frames, st, node)
                self._grow(decl, t, d, k + 1, node)
                combo.append(k)
            t.entries[tuple(combo)] = src
        elif decl.is_auto_dim:
            self._auto_dim(decl, access, frames, st, ctx, node)
            cur = st.values[decl.name]
            if tuple(src.shape) != tuple(cur.shape):
                raise self._err(f"cache.write {decl.name} expects shape {_shape(cur)}, got {_shape(src)}", node)
            st.values[decl.name] = src
        else:
            if access.indices:
                raise self._err(f"cache.write {decl.name} does not support indexed writes", node)
            cur = st.values[decl.name]
            if tuple(src.shape) != tuple(cur.shape):
                raise self._err(f"cache.write {decl.name} expects shape {_shape(cur)}, got {_shape(src)}", node)
            st.values[decl.name] = src
        ctx.wrote(decl.name)

    def _cache_step(self, node, st: _State, ctx: _Ctx) -> None:
        up = isinstance(node, ir.CacheIncrement)
        word = "cache.increment" if up else "cache.decrement"
        decl = self._persistent(node.target, node, word)
        d = dt.get(decl.dtype)
        if decl.is_table or decl.is_auto_dim or not decl.is_scalar:
            raise self._err(f"{word} {decl.name} expects a persistent scalar", node)
        if d.packed or d.family in (dt.BOOL, dt.BITSET, dt.TERNARY):
            raise self._err(f"{word} {decl.name}: unsupported dtype {decl.dtype}", node)
        cur = np.asarray(st.values[decl.name])
        amount = node.amount if up else -node.amount
        if d.is_float:
            if d.name in ("f16", "bf16", "f8"):
                v = np.float32(cur.astype(np.float32)) + np.float32(amount)
                new = f8_encode(np.asarray(v, dtype=np.float32)) if d.name == "f8" else np.asarray(v).astype(d.np_dtype)
            else:
                new = np.asarray(cur.astype(d.np_dtype) + d.np_dtype.type(amount))
        else:
            v = (int(cur.reshape(())) + amount) % (1 << d.bits)
            if d.is_signed and v >= 1 << (d.bits - 1):
                v -= 1 << d.bits
            new = np.asarray(v).astype(d.np_dtype)
        st.values[decl.name] = np.asarray(new).reshape(cur.shape)
        ctx.wrote(decl.name)

    def _cache_reset(self, node: ir.CacheReset, frames, st: _State, ctx: _Ctx) -> None:
        access = node.target
        decl = self._persistent(access.base, node, "cache.reset")
        if decl.is_table:
            t = st.tables[decl.name]
            if not access.bracketed:
                raise self._err(f"cache table {decl.name} requires indices", node)
            if not access.indices:
                t.entries.clear()
            else:
                if len(access.indices) > len(t.sizes) or not all(isinstance(s, ir.Single) for s in access.indices):
                    raise self._err(f"cache.reset {decl.name} requires scalar indices", node)
                prefix = tuple(self._single(decl, s, frames, st, node) for s in access.indices)
                t.entries = {k: v for k, v in t.entries.items() if k[: len(prefix)] != prefix}
            t.reset_sizes()
        elif decl.is_auto_dim:
            st.counts[decl.name] = [0] * len(decl.auto_dim)
            st.values[decl.name] = fill_value(decl.dtype, decl.init, decl.shape(self._sizes))
        else:
            st.values[decl.name] = fill_value(decl.dtype, decl.init, decl.shape(self._sizes))
        ctx.wrote(decl.name)
