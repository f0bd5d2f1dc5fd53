"""Semantic validation of a parsed graph: every rule of SPEC §3.10, §3.6, §4.7, §2.2/2.3, §0 items 11/12.

`check(graph, model=None, sizes=None)` returns ALL diagnostics (errors and warnings), sorted by
location. Op-specific typing comes from `oi2jax.ops.infer` (no op list here).

Size variables: `sizes` = the model's sizevars overridden by `sizes`. With neither a model nor
sizes, unknown size names are accepted and shape checks that involve them are skipped.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping

import re
import sys
import types

from . import ir
from .checks.caches import CacheRules
from .checks.control import ControlRules
from .checks.decls import DeclRules
from .checks.ops import LiteralValue, OpRules
from .checks.shapes import RuntimeShapeRules
from .checks.yield_await import PhaseRules
from .diagnostics import source_lines, suggest, Diagnostic, OiError
from .ir import MemKind
from .naming import unknown_sizes
from .ops.loading import load as load_ops
from .ops.registry import Registry
from .phases import YieldPhases, read_before_written


def check(graph: ir.Graph, model=None, sizes: dict[str, int] | None = None, ops=None,
          no_model: str | None = None, widen_floats: bool = False) -> list[Diagnostic]:
    """Every diagnostic; `ops`: the op registry (default: the built-in ops), or the op sets
    `oi2jax.compile` takes (`ops=["nn"]`: `oi2jax.ops.load`);
    `no_model`: why there is no model, for the messages that need it (pipeline.ModelChoice);
    `widen_floats`: as `check_graph`."""
    if not isinstance(graph, ir.Graph):  # program text or a path: an AttributeError deep inside otherwise
        raise OiError(f"check: expected a parsed graph (oi2jax.parse(text) or "
                      f"oi2jax.pipeline.load_graph(path)), got {type(graph).__name__}")
    checker = _Checker(graph, model, sizes, ops, no_model, widen_floats)
    checker.run()
    return sorted(checker.diags, key=_sort_key)


@dataclass(frozen=True, eq=False)
class CheckedGraph:
    """What `check` decided, for the backends (bind, lowering, driver, interpreter, export, cfg)
    to consume: the graph, its warnings, every op node's signature (`ops.OpSig`: mode, output
    dtype and shape as typed by `ops.infer`) and the analyses of `phases` every backend needs,
    each computed once. Only `check_graph` makes one, and only for a graph without errors;
    nothing downstream re-infers an op's type, re-runs an analysis or re-raises a checker message."""

    graph: ir.Graph
    warnings: tuple[Diagnostic, ...]
    op_sigs: Mapping[int, object]  # op node's `index` (its graph-wide id, ir.Node) -> ops.OpSig
    ops: object  # the op registry the graph was checked against (oi2jax.ops.Registry)
    runtime_shaped: Mapping[str, str]  # phases.runtime_shaped: variable -> the @auto_dim tensor its shape follows
    yield_phases: YieldPhases  # phases.yield_phases: windows, phases, consumers of each yield (no errors)
    writes: Mapping[str, frozenset]  # phases.block_writes: block -> what it (and the blocks it calls) may write
    read_before_written: frozenset  # phases.read_before_written: what a step may read before writing it
    # literal op inputs (docs/semantics.md): (op node's index, input position) -> its dtype and value
    literals: Mapping[tuple[int, int], LiteralValue]
    widen_floats: bool = False  # f32 declarations were bound to bf16/f16 model tensors (TensorInfo.widens_to)

    def op_sig(self, node: ir.Op):
        sig = self.op_sigs.get(node.index)
        assert sig is not None, f"op {node.op} at {node.span} was not typed by the checker (a node built after check?)"
        return sig

    def literal(self, node: ir.Op, pos: int) -> LiteralValue:
        """The dtype and value of the literal that is `node`'s input `pos`."""
        lit = self.literals.get((node.index, pos))
        assert lit is not None, f"op {node.op} input {pos} at {node.span} is not a literal the checker typed"
        return lit


def check_graph(graph: ir.Graph, model=None, sizes: dict[str, int] | None = None, ops=None,
                no_model: str | None = None, widen_floats: bool = False) -> CheckedGraph:
    """The checked graph, or `OiError` with every error (THE check of the pipeline). `widen_floats`:
    an f32 declaration may bind a bf16/f16 model tensor (an opt-in extension: docs/semantics.md)."""
    checker = _Checker(graph, model, sizes, ops, no_model, widen_floats)
    checker.run()
    diags = sorted(checker.diags, key=_sort_key)
    errors = [d for d in diags if d.severity == "error"]
    if errors:
        raise OiError(errors, source=graph.source)
    plan = checker.yield_phases
    return CheckedGraph(graph, tuple(diags), MappingProxyType(dict(checker.op_sigs)), checker.registry,
                        MappingProxyType(dict(checker.shaped)), plan, checker.block_writes,
                        read_before_written(graph, plan), MappingProxyType(dict(checker.literals)),
                        bool(widen_floats))


def resize(checked: CheckedGraph, model=None, sizes: dict[str, int] | None = None) -> CheckedGraph:
    """`checked` at other sizes (`BoundGraph.rebind`), or `OiError` with every error: only the rules
    that read a size run again (`_Checker.run_sized`). They must: a size changes the shapes the
    checker compared -- an op's output shape and broadcasting (`add(a, b)` with `a: f32[T]`,
    `b: f32[S]` types at T = S only) and its int-list settings, a declaration against its model
    tensor, a constant cache index against its table's extent, the two shapes of a transfer or a
    cache access, whether a setting, condition or loop bound is a scalar (`f32[N]` at N = 1) -- so
    the op signatures are recomputed and those equalities checked again. What reads no size is
    kept as checked: names, dtypes and memory kinds, the block structure and branch graph, the
    yield/await plan, what each block writes and reads first, the runtime-shaped variables, the
    literal inputs' values and the warnings (no warning reads a size)."""
    checker = _Checker(checked.graph, model, sizes, checked.ops, widen_floats=checked.widen_floats)
    checker.run_sized()
    errors = sorted((d for d in checker.diags if d.severity == "error"), key=_sort_key)
    if errors:
        raise OiError(errors, source=checked.graph.source)
    return replace(checked, op_sigs=MappingProxyType(dict(checker.op_sigs)))


def check_or_raise(graph: ir.Graph, model=None, sizes: dict[str, int] | None = None, ops=None) -> list[Diagnostic]:
    """Raise `OiError` (all errors) when there are errors; otherwise return the warnings."""
    return list(check_graph(graph, model, sizes, ops).warnings)


def _sort_key(d: Diagnostic):
    if d.span is None:
        return (0, 0, 0)
    return (1, d.span.line, d.span.col)


class _Checker(DeclRules, OpRules, CacheRules, ControlRules, PhaseRules, RuntimeShapeRules):
    """Checker state, lookups and the node walk; the rule groups are the mixins in `oi2jax.checks`."""

    def __init__(self, graph: ir.Graph, model, sizes, registry=None, no_model: str | None = None,
                 widen_floats: bool = False):
        self.g = graph
        self.widen_floats = widen_floats  # checks/decls.check_bound
        # a Registry as it is; else what `oi2jax.compile`'s ops= takes (["nn"], paths, modules)
        self.registry = registry if isinstance(registry, Registry) else load_ops(registry)
        self.shaped: dict[str, str] = {}
        self.model = model
        self.no_model = no_model  # why there is no model (messages.unknown_size)
        self.strict = model is not None or bool(sizes)
        self.sizes: dict[str, int] = dict(getattr(model, "sizevars", {}) or {}) if model is not None else {}
        self.sizes.update(sizes or {})
        self.given_sizes = dict(sizes or {})
        self.diags: list[Diagnostic] = []
        self.decls: dict[str, ir.VarDecl] = {}
        self.temps: dict[str, ir.Assign] = {}
        self.op_sigs: dict = {}  # op node's index -> ops.OpSig (CheckedGraph)
        self.literals: dict = {}  # (op node's index, input position) -> LiteralValue (CheckedGraph)
        self.node_rules = _NODE_RULES  # node type -> rule (`run_sized`: the rules that read a size)

    # ---------------------------------------------------------------- helpers
    def error(self, message: str, span: ir.Span | None, related=()):
        self.diags.append(Diagnostic(message, span, "error", tuple(related)))

    def warning(self, message: str, span: ir.Span | None):
        self.diags.append(Diagnostic(message, span, "warning"))

    def top_span(self) -> ir.Span:
        """The graph as a whole: its first line, or no line where it was read from JSON."""
        read_from_json = any(b.span.line == 0 for b in self.g.blocks)
        return ir.Span(self.g.path, 0 if read_from_json else 1, 0 if read_from_json else 1)

    def resolve_dims(self, dims) -> tuple[int, ...] | None:
        try:
            return tuple(d.resolve(self.sizes) for d in dims)
        except KeyError:
            return None

    def dtype(self, name: str) -> str | None:
        if name in self.decls:
            return self.decls[name].dtype
        if name in self.temps:
            return self.temps[name].dtype
        return None

    def shape(self, name: str) -> tuple[int, ...] | None:
        if name in self.decls:
            return self.resolve_dims(self.decls[name].dims)
        if name in self.temps:
            return self.resolve_dims(self.temps[name].dims)
        return None

    def known(self, name: str) -> bool:
        return name in self.decls or name in self.temps

    def near(self, name: str) -> str:
        """' (did you mean X?)' for an unknown name close to a declared variable or temporary."""
        return suggest(str(name), list(self.decls) + list(self.temps))

    def kind(self, name: str) -> MemKind | None:
        d = self.decls.get(name)
        return d.kind if d is not None else None

    def is_scalar(self, name: str) -> bool:
        shape = self.shape(name)
        if shape is None:
            dims = self.decls[name].dims if name in self.decls else self.temps[name].dims
            return len(dims) == 0 or not self.strict
        n = 1
        for s in shape:
            n *= s
        return n == 1

    def _line(self, span: ir.Span) -> str | None:
        """The source line `span` is on (None without one)."""
        lines = self.__dict__.get("_lines")
        if lines is None:  # split once per check, not per op (per op is quadratic in the graph's size)
            lines = self._lines = source_lines(self.g.source or "")
        return lines[span.line - 1] if 1 <= span.line <= len(lines) else None

    def name_span(self, span: ir.Span, keyword: str) -> ir.Span:
        """The span of the word after `keyword` at `span` (an op's name)."""
        line = self._line(span)
        m = re.compile(re.escape(keyword) + r"\s+").match(line, span.col - 1) if line is not None else None
        return ir.Span(span.path, span.line, m.end() + 1) if m else span

    def word_span(self, span: ir.Span, word: str, after: str = "") -> ir.Span:
        """The span of the name `word`, as a whole word, on the line of `span` past its column (and
        past the first `after` there, e.g. a loop's `..`): where a bound or a branch's condition or
        target is written; `span` itself when it is not on that line."""
        line = self._line(span)
        if line is None:
            return span
        start = span.col - 1
        at = line.find(after, start) if after else -1
        start = at + len(after) if at >= 0 else start
        m = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(word) + r"(?![A-Za-z0-9_])").search(line, start)
        return ir.Span(span.path, span.line, m.start() + 1) if m else span

    # ---------------------------------------------------------------- driver
    def run(self):
        for message in unknown_sizes(self.g, self.model, self.given_sizes):
            self.error(message, None)
        self.check_vars()
        self.check_blocks_structure()
        self.collect_temps()
        for block in self.g.blocks:
            self.check_nodes(block, block.nodes, (), top=True)
        self.check_branch_graph()
        self.check_yield_await()
        self.check_runtime_shapes()

    def run_sized(self):
        """The rules that read a size (`resize` says which and why): the size names, the
        declarations (their model tensors' shapes), the temporaries they look up, and the node
        rules of `_SIZED_RULES`."""
        for message in unknown_sizes(self.g, self.model, self.given_sizes):
            self.error(message, None)
        self.check_vars()
        self.collect_temps()
        self.node_rules = _SIZED_RULES
        for block in self.g.blocks:
            self.check_nodes(block, block.nodes, (), top=True)

    # ---------------------------------------------------------------- node walk
    def check_nodes(self, block: ir.Block, nodes, loops: tuple[str, ...], top: bool):
        """Check each node with its rule (`self.node_rules`: node type -> method, every node type)."""
        for pos, node in enumerate(nodes):
            self.node_rules[type(node)](self, node, _At(block, nodes, pos, loops, top))

    def _no_rule(self, node, at: "_At"):
        pass  # assign (collect_temps), barrier and dep: nothing to check per node

    def _op_rule(self, node: ir.Op, at: "_At"):
        self.check_op(node, at.loops)

    def _cache_read_rule(self, node: ir.CacheRead, at: "_At"):
        self.check_cache_read(node, at.loops)

    def _cache_write_rule(self, node: ir.CacheWrite, at: "_At"):
        self.check_cache_write(node, at.loops)

    def _cache_reset_rule(self, node: ir.CacheReset, at: "_At"):
        self.check_cache_reset(node, at.loops)

    def _incdec_rule(self, node, at: "_At"):
        self.check_incdec(node)

    def _branch_rule(self, node: ir.Branch, at: "_At"):
        self.check_branch(node)

    def _transfer_rule(self, node: ir.Transfer, at: "_At"):
        self.check_transfer(node, at.loops)

    def _loop_rule(self, node: ir.Loop, at: "_At"):
        if node.var in at.loops:
            self.error(f"loop index {node.var} shadows an enclosing loop index", node.span)
        for which, bound in (("start", node.start), ("end", node.end)):
            self.check_loop_bound(node, which, bound, at.loops)
        self.check_nodes(at.block, node.body, at.loops + (node.var,), top=False)

    def _return_rule(self, node: ir.Return, at: "_At"):
        block = at.block
        if node.vars and (block.name != "entry" or not at.top):
            where = "inside a loop" if block.name == "entry" else f"in block {block.name}"
            self.error(f"return with values is only allowed at the top level of entry, not {where}",
                       node.span)
        for v in node.vars:
            if not self.known(v):
                self.error(f"unknown variable: {v}{self.near(v)}", node.span)

    def _yield_await_rule(self, node, at: "_At"):
        word = "yield" if isinstance(node, ir.Yield) else "await"
        for v in node.vars:
            span = self.word_span(node.span, v, word)  # the caret under the name
            if not self.known(v):
                if v in at.loops:
                    self.loop_index_error(v, span, f"{word} {v}: ",
                                          use="it (`cache.read c >> v;` gives its value to a volatile v)")
                else:
                    self.error(f"unknown variable: {v}{self.near(v)}", span)
            elif word == "await" and self.kind(v) == MemKind.CONSTANT:
                self.error(f"await may not name constant {v}", span)
        block = at.block
        if word == "yield" and at.top and block.name != "entry" and at.pos != len(at.nodes) - 1:
            self.error(f"yield in block {block.name} must be the final node", node.span)


@dataclass(frozen=True)
class _At:
    """Where a node sits while checking: its block, its sibling nodes and index, enclosing loops."""

    block: ir.Block
    nodes: tuple
    pos: int
    loops: tuple[str, ...]
    top: bool


_NODE_RULES = {
    ir.Assign: _Checker._no_rule,
    ir.Barrier: _Checker._no_rule,
    ir.Dep: _Checker._no_rule,
    ir.Op: _Checker._op_rule,
    ir.CacheRead: _Checker._cache_read_rule,
    ir.CacheWrite: _Checker._cache_write_rule,
    ir.CacheReset: _Checker._cache_reset_rule,
    ir.CacheIncrement: _Checker._incdec_rule,
    ir.CacheDecrement: _Checker._incdec_rule,
    ir.Branch: _Checker._branch_rule,
    ir.Transfer: _Checker._transfer_rule,
    ir.Loop: _Checker._loop_rule,
    ir.Return: _Checker._return_rule,
    ir.Yield: _Checker._yield_await_rule,
    ir.Await: _Checker._yield_await_rule,
}

_SIZED_RULES = {**_NODE_RULES, **{t: _Checker._no_rule for t in (ir.Return, ir.Yield, ir.Await)}}
"""The node rules that read a size (`resize`): ops, cache reads, writes, resets, increments and
decrements (a scalar is `[]` or of one element), transfers, branch conditions and loop bounds;
return, yield and await name variables only."""


class _CallableModule(types.ModuleType):
    """`oi2jax.check` is the function `check` (oi2jax.__all__), but Python binds this submodule over
    the package's attribute once anything imports it (the CLI, `compile`, the first `oi2jax.check`):
    so the module calls `check` too, and `oi2jax.check(graph)` works whichever of the two it is."""

    def __call__(self, *args, **kwargs):
        return check(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
