"""Lowering context: what every node lowering rule reads while tracing one step.

The environment `env` is a `state.Env` of the step's mutable values (dynamic, volatile,
temporaries, plain persistent values), cache states, runtime guards and logical shapes; it is
the carry of every `lax.cond` / `lax.fori_loop`, so its structure never changes inside a step.
Constants live outside it (`consts`, traced jit arguments captured by closures).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

import jax
import jax.numpy as jnp
import numpy as np

from .. import dtypes as dt
from .. import ir
from .. import messages, quantized
from ..diagnostics import OiError
from ..model.bind import BoundGraph

from .loops import LoopPolicy, member_key
from .subbyte import unpack
from .state import Env


@dataclass(frozen=True)
class ErrorSite:
    """A runtime guard: message template (`{value}` is filled in) and where it sits."""

    message: str
    span: ir.Span
    render: object = None  # optional value -> message (when one template cannot say it)


class ErrorSites:
    """The runtime guard sites registered while tracing: append-only, the one part of a
    `Lowering` that grows. A program's lowerings share it across cache growth, so an error code
    recorded before a growth still names its site."""

    def __init__(self):
        self._sites: list[ErrorSite] = []

    def add(self, site: ErrorSite) -> int:
        """Register `site`; returns its error code (1-based)."""
        self._sites.append(site)
        return len(self._sites)

    def __getitem__(self, index: int) -> ErrorSite:
        return self._sites[index]

    def __len__(self) -> int:
        return len(self._sites)

    def __iter__(self):
        return iter(self._sites)


def _current_trace():
    """JAX's current trace (the jit trace, or a branch's / loop body's inside it), or None where
    this JAX does not expose it (jax._src.core.trace_ctx)."""
    try:
        from jax._src.core import trace_ctx  # optional: a JAX internal (ImportError: every check is made)
        return trace_ctx.trace
    except (ImportError, AttributeError):
        return None


@dataclass(frozen=True)
class Lowering:
    """Static facts about the program being lowered, shared by all rules. Immutable: a cache
    growth makes a new one (`dataclasses.replace` with the new layouts, runtime/program.py).
    With the `BoundGraph` it is everything a trace depends on: the loop policy and the matmul
    precision are fields here, so a lowering is a function of (checked, bound, options)."""

    bound: BoundGraph
    caches: MappingProxyType  # name -> caches.CacheLayout
    error_sites: ErrorSites = field(default_factory=ErrorSites)
    growable: tuple[tuple[str, int], ...] = ()  # (cache, dim) per `grow` slot
    # runtime-shaped variables (phases.runtime_shaped): name -> the @auto_dim tensor whose
    # current shape they take. Each is held at that tensor's capacity shape, with its logical
    # shape in `env.shapes[name]` (int64[rank]); the host trims it (Program.trim_outputs)
    shaped: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    loop_policy: LoopPolicy = LoopPolicy()  # how `loop` lowers (lowering/loops.py)
    precision: str = "highest"  # float matmul precision (CompileOptions.precision; ops Ctx.precision)
    kernels: str = "jax"  # the kernel set (CompileOptions.kernels; ops Ctx.kernels)
    # prefix tables held member by member (`W[0]`, `W[1]`, ...: loops.split_families under
    # `loop_policy`): every read of one is at static indices; the others are stacked
    split: frozenset = frozenset()
    # op_calls.apply's jitted kernels, one per call signature: shared by the program's traces (a
    # cache, not a fact: the lowering computes the same with it empty)
    op_calls: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def graph(self) -> ir.Graph:
        return self.bound.graph

    @cached_property
    def call_facts(self):
        """machine.CallFacts: each block's inlined cost, call depth, nested conds (computed once)."""
        from .machine import call_facts  # cycle: lowering.machine imports this module (Frame, Tracer)
        return call_facts(self.graph)

    @property
    def inline_costs(self) -> dict[str, int]:
        """Each block's nodes traced when it is inlined with every block it calls (machine.py)."""
        return self.call_facts.cost

    def site(self, message: str, span: ir.Span, render=None) -> int:
        """Register a runtime guard; returns its error code. `render(value) -> str` may replace
        `message.format(value=value)`."""
        return self.error_sites.add(ErrorSite(message, span, render))

    def error_for(self, code: int, value: int, step: int | None = None) -> OiError:
        """The error of guard `code` with its offending `value`; `step`: the 1-based step it fired in."""
        site = self.error_sites[code - 1]
        message = site.render(value) if site.render is not None else site.message.format(value=value)
        error = OiError(message, site.span, source=self.graph.source)
        return error if step is None else error.in_step(step)


@dataclass
class Frame:
    """Per-trace position: the block being lowered and the loop indices in scope."""

    block: str
    loop_vars: dict = field(default_factory=dict)  # loop index name -> (traced int, static (lo, hi) or None)

    def enter_loop(self, var: str, value, static_range) -> "Frame":
        loops = dict(self.loop_vars)
        loops[var] = (value, static_range)
        return Frame(self.block, loops)


class Tracer:
    """Binds the Lowering facts to the traced constants of one jit trace."""

    def __init__(self, lowering: Lowering, consts: dict):
        self.lowering = lowering
        self.bound = lowering.bound
        self.graph = lowering.graph
        self.consts = consts
        self.outputs: tuple[str, ...] | None = None  # names from `return a, b;` in entry
        # None, or a traced bool: whether this step may change table data at all (False: a
        # session step after an unreported error, skipped row by row so that the donated
        # tables stay in place -- runtime/kernels.py `single`)
        self.writes_on = None
        self._checked: dict = {}  # `first_check`'s record of the checks made, per JAX trace

    # -------------------------------------------------------------- guards

    def fail_if(self, env: Env, cond, code: int, value) -> Env:
        """Record error `code` (first one wins: `TraceGuards.record`) where `cond` holds. A
        condition known while tracing (a NumPy or Python bool) that holds nowhere costs nothing."""
        if isinstance(cond, (bool, np.bool_, np.ndarray)):
            if not np.any(cond):
                return env
            cond = True
        return env.with_guards(env.guards.record(cond, code, value))

    def first_check(self, key, *sources) -> bool:
        """False when this very check -- `key` (what is checked, static) over the same `sources`
        (`index_source`: an int by value, a traced value by identity) -- was already recorded in
        the current JAX trace. Code at one trace level runs in order and every guard it records is
        evaluated, so the earlier record of the same condition already decides: if it holds, that
        site or one before it is the first error, never this one (an unrolled loop's layers writing
        the same rows, K and V written at the same positions: 240 of a 30-layer decode step's 304
        guards). A check inside a branch or a loop body is of that body's trace and matches
        nothing outside it. Where JAX's current trace cannot be read, every check is made."""
        trace = _current_trace()
        if trace is None:
            return True
        ident = (id(trace), key) + tuple(s if isinstance(s, (int, np.integer)) else ("id", id(s)) for s in sources)
        if ident in self._checked:
            return False
        self._checked[ident] = (trace, sources)  # held: no id is reused while it is remembered
        return True

    def need_capacity(self, env: Env, slot: int, needed) -> Env:
        """Ask the host for capacity `needed` on growable slot `slot` (0 = fine)."""
        return env.with_guards(env.guards.need(slot, needed))

    # -------------------------------------------------------------- values

    def static_scalar(self, name: str):
        """A Python value for a constant scalar known at compile time, else None."""
        return self.bound.static_scalar(name)

    def index_value(self, value: ir.IndexValue, frame: Frame, env: Env, span: ir.Span, what: str = "cache index"):
        """(env, a cache / prefix-table index): literal, loop index, sizevar or persistent scalar
        (a variable's value as an int64 scalar). An index is an i64: a u64 variable at 2^63 or
        more is a runtime error (`what` names the index in it), never a wrap to a negative index
        (which a slice end would read as counted from the end)."""
        source = self.index_source(value, frame, env)
        if not isinstance(value, int) and value in env.values and value not in frame.loop_vars \
                and value not in self.bound.sizes:
            v = source.reshape(())
            if v.dtype == jnp.uint64:
                outside = v >= jnp.uint64(messages.I64_RANGE[1])
                code = self.lowering.site(messages.index_out_of_range(what, value, "{value}"), span,
                                          render=lambda bits: messages.index_out_of_range(what, value, int(bits) % 2**64))
                env = self.fail_if(env, outside, code, v.astype(jnp.int64))
                v = jnp.where(outside, jnp.uint64(0), v)  # the step is undone: no growth asked for it
            return env, v.astype(jnp.int64)
        return env, source

    def index_source(self, value: ir.IndexValue, frame: Frame, env: Env):
        """What `index_value` gives before a variable's value is made an int64 scalar (also the
        key of a `first_check`): the int (literal, sizevar, constant, unrolled loop index), the
        loop index, or the variable's value as the env holds it."""
        if isinstance(value, int):
            return value
        if value in frame.loop_vars:
            return frame.loop_vars[value][0]
        if value in self.bound.sizes:
            return int(self.bound.sizes[value])
        if value in env.values:
            return env.values[value]
        static = self.static_scalar(value)
        if static is not None:
            return int(static)
        raise OiError(f"unknown cache index {value}")

    def capacity_shape(self, name: str) -> tuple[int, ...]:
        """The array shape that holds runtime-shaped variable `name`: its tensor's capacity, or its
        declared shape where that is larger (the value it has before its first read)."""
        cap = self.lowering.caches[self.lowering.shaped[name]].data_shape()
        return tuple(max(c, d) for c, d in zip(cap, self.bound.shape(name)))

    def embed(self, env: Env, name: str, value, logical=None) -> Env:
        """Store `value` into runtime-shaped `name`: padded with zeros to the capacity shape, the
        logical shape `logical` (default: the value's own shape) kept beside it."""
        cap = self.capacity_shape(name)
        if logical is None:
            logical = jnp.asarray(value.shape, jnp.int64)
        if tuple(value.shape) != tuple(cap):
            value = value[tuple(slice(0, c) for c in cap)]
            value = jnp.pad(value, [(0, c - s) for s, c in zip(value.shape, cap)])
        return env.set_shaped(name, value, jnp.asarray(logical, jnp.int64))

    def read(self, ref: ir.VarRef, env: Env, frame: Frame, kept: bool = False):
        """(env, value) of an op input / transfer source; env may gain a runtime guard. A constant
        kept in GGML blocks (a `quantized.QuantTensor`) comes packed where `kept` (an op input
        whose kernel takes it: `OpDef.quantized_inputs`), else dequantized here, at this use."""
        env, value = self._read(ref, env, frame)
        if isinstance(value, quantized.QuantTensor) and not kept:
            value = quantized.dequantize_prepared(value)
        return env, value

    def _read(self, ref: ir.VarRef, env: Env, frame: Frame):
        name = ref.name
        if ref.indices is not None:
            return self.read_member(ref, env, frame)
        if name in env.values:
            return env, env.values[name]
        if name in self.consts:
            decl = self.graph.var(name)
            value = self.consts[name]
            if decl is not None and dt.get(decl.dtype).packed:
                return env, unpack(value, decl.dtype, self.bound.shape(name))
            return env, value
        raise OiError(f"unknown variable {name}", ref.span, source=self.graph.source)

    def read_member(self, ref: ir.VarRef, env: Env, frame: Frame):
        """`W[l]`: one member of a prefix-table family, selected with a (maybe traced) index.
        An index outside the family is an error naming the missing tensor: at compile time when
        the index (or its loop's range) is static, else a runtime guard. A family held member by
        member (`Lowering.split`) is read as its member's own buffer; a stacked family kept in
        GGML blocks gives its member's blocks (`quantized.member`)."""
        decl = self.graph.var(ref.name)
        value = self.consts.get(ref.name)  # None: held member by member
        counts = value.shape if value is not None else self.bound.family_counts(ref.name)
        indices = []
        for pos, raw in enumerate(ref.indices):
            env, idx = self.index_value(raw, frame, env, ref.span, "prefix index")
            extent = counts[pos]
            if isinstance(idx, int):  # a literal, a size, or the index of an unrolled loop (the
                static_bad = None if 0 <= idx < extent else idx  # first missing member, as interpreted)
            else:
                static_range = frame.loop_vars.get(raw, (None, None))[1] if isinstance(raw, str) else None
                static_bad = None
                if static_range is not None:
                    lo, hi = static_range
                    if lo < hi and (lo < 0 or hi > extent):
                        static_bad = hi - 1 if hi > extent else lo
                else:
                    # one index: the missing tensor by name, as the interpreter says it
                    name_it = (lambda v, ref=ref, decl=decl: messages.prefix_member_missing(
                        ref.name, self.bound.member_name(decl, (v,)))) if len(ref.indices) == 1 else None
                    code = self.lowering.site(
                        f"prefix table {ref.name}: index {{value}} is outside the model's family "
                        f"(0..{extent - 1})", ref.span, render=name_it)
                    env = self.fail_if(env, (idx < 0) | (idx >= extent), code, idx)
            if static_bad is not None:
                missing = self.bound.member_name(decl, self._placeholder(ref, pos, static_bad))
                raise OiError(messages.prefix_member_missing(ref.name, missing), ref.span, source=self.graph.source)
            indices.append((idx, extent))
        if value is None:  # held member by member (split_families): the member's own buffer
            if all(isinstance(i, int) for i, _ in indices):
                return env, self.consts[member_key(ref.name, tuple(i for i, _ in indices))]
            # a traced index (LoopPolicy.members: a rolled loop's): lax.switch over the members,
            # the flat index clipped into range as dynamic-slice clips (a guard above reports it)
            assert self.lowering.loop_policy.members, (ref.name, "a traced read of a split family")
            flat, keys = jnp.int32(0), [()]
            for idx, extent in indices:
                flat = flat * extent + jnp.clip(jnp.asarray(idx, jnp.int32), 0, extent - 1)
                keys = [k + (i,) for k in keys for i in range(extent)]
            members = [self.consts[member_key(ref.name, k)] for k in keys]
            return env, jax.lax.switch(flat, [lambda m=m: m for m in members])
        for idx, extent in indices:
            if isinstance(idx, int):  # a static slice (a literal, a size, an unrolled loop's index)
                def pick(a, idx=idx):
                    return jax.lax.index_in_dim(a, idx, axis=0, keepdims=False)
            else:
                def pick(a, idx=jnp.clip(idx, 0, extent - 1).astype(jnp.int32)):
                    return jax.lax.dynamic_index_in_dim(a, idx, axis=0, keepdims=False)
            value = quantized.member(value, pick) if isinstance(value, quantized.QuantTensor) else pick(value)
        return env, value

    def _placeholder(self, ref: ir.VarRef, pos: int, value: int) -> tuple[int, ...]:
        values = [0] * len(ref.indices)
        for j, raw in enumerate(ref.indices):
            values[j] = raw if isinstance(raw, int) else 0
        values[pos] = value
        return tuple(values)
