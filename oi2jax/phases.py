"""The structure of a graph on the IR alone (no JAX): what each node reads, writes and defines,
the yield/await phases, read-before-written and the runtime-shaped variables.

THE definitions, each written once. The checker computes them once (`check.CheckedGraph` carries
`yield_phases`, `writes`, `read_before_written`, `runtime_shaped`); the lowering, the driver, the
interpreter, export and cfg read what it carries. Consumers follow SPEC §0 item 3: the non-entry,
non-branch-target blocks that `await` at least one yielded variable, in name order.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from . import ir
from .diagnostics import Diagnostic, OiError


# ------------------------------------------------------------------------ what one node does


class _Writes(ir.NodeVisitor):
    """The variables one node certainly writes (see `node_writes`)."""

    def visit_Op(self, node: ir.Op):
        return (node.output,)

    def visit_Transfer(self, node):
        return (node.dst.name,)

    visit_CacheRead = visit_Transfer

    def visit_CacheWrite(self, node: ir.CacheWrite):
        return (node.dst.base,)

    def visit_CacheReset(self, node: ir.CacheReset):
        return (node.target.base,)

    def visit_CacheIncrement(self, node):
        return (node.target,)

    visit_CacheDecrement = visit_CacheIncrement

    def _none(self, node):
        return ()

    # an assign creates a temporary at step start (§3.9); a loop's body and a branch's blocks are
    # walked by the callers; the rest writes nothing
    visit_Assign = visit_Branch = visit_Barrier = visit_Dep = visit_Loop = visit_Yield = visit_Await = \
        visit_Return = _none


class _Reads(ir.NodeVisitor):
    """Names one node may read (see `node_reads`), added to `out`."""

    @staticmethod
    def _index(v, out: set):
        if isinstance(v, str):
            out.add(v)

    def _access(self, acc: ir.CacheAccess, out: set):
        for pos in acc.indices:
            if isinstance(pos, ir.Single):
                self._index(pos.value, out)
            else:
                self._index(pos.start, out)
                self._index(pos.end, out)

    def _ref(self, r: ir.VarRef, out: set):
        out.add(r.name)
        for v in r.indices or ():
            self._index(v, out)

    def visit_Op(self, node: ir.Op, out: set):
        for r in node.refs:
            self._ref(r, out)
        for attr in node.attrs:
            if attr.value.kind == "var":  # a variable-valued setting reads that variable
                out.add(attr.value.value)

    def visit_Transfer(self, node: ir.Transfer, out: set):
        self._ref(node.src, out)

    def visit_CacheWrite(self, node: ir.CacheWrite, out: set):
        self._ref(node.src, out)
        self._access(node.dst, out)

    def visit_CacheRead(self, node: ir.CacheRead, out: set):
        self._access(node.src, out)

    def visit_CacheReset(self, node: ir.CacheReset, out: set):
        self._access(node.target, out)

    def visit_Branch(self, node: ir.Branch, out: set):
        if node.cond:
            out.add(node.cond)

    def visit_Loop(self, node: ir.Loop, out: set):
        self._index(node.start, out)
        self._index(node.end, out)

    def visit_Yield(self, node, out: set):
        out.update(node.vars)

    visit_Return = visit_Yield

    def _none(self, node, out: set):
        pass

    # an increment reads its own target, which it also writes (node_writes); an await makes
    # yielded values visible; the rest reads nothing
    visit_Assign = visit_CacheIncrement = visit_CacheDecrement = visit_Barrier = visit_Dep = visit_Await = _none


class _Defines(ir.NodeVisitor):
    """Variables one node gives a whole new value (see `node_defines`)."""

    def visit_Op(self, node: ir.Op):
        return {node.output}

    def visit_Transfer(self, node):
        return {node.dst.name}

    visit_CacheRead = visit_Transfer

    def _none(self, node):
        return set()

    # cache updates change a value in part (or a table's entries); the rest defines nothing
    visit_Assign = visit_CacheWrite = visit_CacheIncrement = visit_CacheDecrement = visit_CacheReset = \
        visit_Branch = visit_Barrier = visit_Dep = visit_Loop = visit_Yield = visit_Await = visit_Return = _none


_WRITES, _READS, _DEFINES = _Writes(), _Reads(), _Defines()


def node_writes(node: ir.Node) -> tuple[str, ...]:
    """The variables one node certainly writes (THE definition, used by the window checks and
    `block_writes`): an op's output, a transfer's or cache read's destination, and the persistent
    variable of cache.write / reset / increment / decrement. NotImplementedError for a node type
    this does not know."""
    return _WRITES.visit(node)


def node_reads(node: ir.Node) -> set[str]:
    """Names one node may read (not its loop body or called blocks): op inputs (and identifiers
    given as attribute values), copy and cache-write sources, branch conditions, loop bounds, cache
    and prefix-table indices, yielded and returned variables. A superset (some are sizes).
    NotImplementedError for a node type this does not know."""
    out: set[str] = set()
    _READS.visit(node, out)
    return out


def node_defines(node: ir.Node) -> set[str]:
    """Variables one node gives a whole new value (not cache updates): what `read_before_written`
    counts as defined."""
    return _DEFINES.visit(node)


def read_grows(decl: ir.VarDecl | None) -> bool:
    """Whether a `cache.read` of `decl` may change it (§4.2, §4.5): an `@auto_dim` tensor (its
    counts), or a table with an index not `@fixed` (its size grows to what is read; a fixed size
    never changes, and an entry a read materialises holds the fill it read as before). A plain
    persistent variable or an all-`@fixed` table is never changed by a read."""
    if decl is None:
        return False
    if decl.is_auto_dim:
        return True
    fixed = {name for name, _ in decl.fixed}
    return decl.is_table and any(i not in fixed for i in decl.table_indices)


def node_changes(graph: ir.Graph, node: ir.Node) -> tuple[str, ...]:
    """What one node may change, by name: its `node_writes`, and the source of a `cache.read`
    that may grow it (`read_grows`). Not a loop's body or a branch's blocks (`block_writes`)."""
    out = node_writes(node)
    if isinstance(node, ir.CacheRead) and read_grows(graph.var(node.src.base)):
        out += (node.src.base,)
    return out


def block_writes(graph: ir.Graph) -> Mapping[str, frozenset[str]]:
    """THE variables each block (and the blocks it calls) may write, by name (what
    `CheckedGraph.writes` carries): its nodes' `node_changes` (their writes, and the tables and
    `@auto_dim` tensors a read may grow), with those of the blocks it calls, computed once per block
    after its callees (linear in the blocks: a chain of thousands is not walked once per block)."""
    own: dict[str, frozenset[str]] = {}
    calls: dict[str, list[str]] = {}
    for b in graph.blocks:
        out: set[str] = set()
        calls[b.name] = []
        for node in b.walk():
            out.update(node_changes(graph, node))
            if isinstance(node, ir.Branch):
                calls[b.name] += [t for t in (node.then_block, node.else_block) if t and graph.block(t)]
        own[b.name] = frozenset(out)
    writes: dict[str, frozenset[str]] = {}
    for b in graph.blocks:
        if b.name in writes:
            continue
        # post-order from b; a block met again while in progress (recursion, refused by the
        # checker before this runs) adds its own writes
        state = {b.name: 1}
        stack = [(b.name, iter(calls[b.name]))]
        while stack:
            name, todo = stack[-1]
            nxt = next(todo, None)
            if nxt is None:
                stack.pop()
                writes[name] = own[name].union(*(writes.get(t, own[t]) for t in calls[name]))
                state[name] = 2
            elif nxt not in state and nxt not in writes:
                state[nxt] = 1
                stack.append((nxt, iter(calls[nxt])))
    return MappingProxyType({b.name: writes[b.name] for b in graph.blocks})


# ------------------------------------------------------------------------ yield / await


def awaited(block: ir.Block) -> tuple[str, ...]:
    """The variables a block awaits (anywhere in it), in order of first appearance."""
    return tuple(dict.fromkeys(v for n in block.walk() if isinstance(n, ir.Await) for v in n.vars))


def _consumer_blocks(graph: ir.Graph) -> list[ir.Block]:
    """Non-entry, non-branch-target blocks that await something (§0 item 3), by name."""
    targets = set()
    for block in graph.blocks:
        for node in block.walk():
            if isinstance(node, ir.Branch):
                targets.add(node.then_block)
                if node.else_block:
                    targets.add(node.else_block)
    found = [b for b in graph.blocks if b.name != "entry" and b.name not in targets and awaited(b)]
    return sorted(found, key=lambda b: b.name)


def _consumers(graph: ir.Graph) -> dict[frozenset, tuple[str, ...]]:
    """THE consumers of a `yield` of some variables (checker, fused lowering, driver, interpreter,
    cfg all read them from `YieldPhases.consumers_of`): the consumer blocks that await any of them,
    by name. One entry per distinct set of yielded variables in the graph."""
    candidates = [(b.name, set(awaited(b))) for b in _consumer_blocks(graph)]
    out: dict[frozenset, tuple[str, ...]] = {}
    for block in graph.blocks:
        for node in block.walk():
            if isinstance(node, ir.Yield):
                key = frozenset(node.vars)
                if key not in out:
                    out[key] = tuple(name for name, waits in candidates if waits & key)
    return out


@dataclass(frozen=True)
class Window:
    """One yield..await pair of entry (in walk order, loop bodies included)."""

    index: int
    yield_node: ir.Yield
    await_node: ir.Await | None
    consumers: tuple[str, ...]


@dataclass(frozen=True)
class Phase:
    """A run of entry's top-level nodes between two yield/await nodes (the driver's kernels)."""

    index: int
    nodes: tuple[ir.Node, ...]
    merges: int | None = None  # window whose consumers are merged at this phase's start (its await)
    launches: int | None = None  # window whose consumers are dispatched after this phase (its yield)


@dataclass(frozen=True)
class YieldPhases:
    """The yield/await phases of a graph, computed once (`yield_phases`; `CheckedGraph.yield_phases`):
    entry's windows and phases, the consumers of every yield, and the pairing and deadlock
    errors (the checker reports them; a checked graph has none)."""

    windows: tuple[Window, ...]
    phases: tuple[Phase, ...]
    consumers: Mapping[frozenset, tuple[str, ...]]  # frozenset(yielded vars) -> consumer blocks
    diagnostics: tuple[Diagnostic, ...] = ()
    fused_fallback: bool = False  # yield/await nested in entry loops: one phase, fused rules
    outputs: tuple[str, ...] | None = None  # `return a, b;` in entry
    has_yield: bool = False  # entry yields or awaits (anywhere): the driver runs it by default

    def consumers_of(self, names) -> tuple[str, ...]:
        """The consumer blocks a `yield` of `names` starts (§0 item 3), by name."""
        return self.consumers[frozenset(names)]


def _live(entry: ir.Block) -> tuple[tuple[ir.Node, ...], ir.Return | None]:
    """Entry's top-level nodes up to its first top-level `return` (which ends the step: later
    nodes are dead), and that return."""
    nodes: list[ir.Node] = []
    for node in entry.nodes:
        nodes.append(node)
        if isinstance(node, ir.Return):
            return tuple(nodes), node
    return tuple(nodes), None


def _pair(entry: ir.Block, end: ir.Return | None, consumers) -> tuple[list[Window], list[Diagnostic]]:
    """Pair entry's yields and awaits in walk order, with THE pairing diagnostics. A yield whose
    await lies after entry's top-level `return` has no await that runs."""
    windows: list[Window] = []
    diags: list[Diagnostic] = []
    pending: ir.Yield | None = None
    pending_live = live = True
    loop_of: dict[int, ir.Loop | None] = {}  # id(node) -> the innermost loop whose body holds it

    def inside(nodes, loop):
        for n in nodes:
            loop_of[id(n)] = loop
            if isinstance(n, ir.Loop):
                inside(n.body, n)
    inside(entry.nodes, None)

    def close(await_node: ir.Await | None):
        if await_node is None or (pending_live and not live):
            diags.append(Diagnostic(f"yield {', '.join(pending.vars)} has no matching await", pending.span))
        elif loop_of[id(pending)] is not loop_of[id(await_node)]:
            diags.append(_loop_window(pending, await_node, loop_of[id(pending)], loop_of[id(await_node)]))
        windows.append(Window(len(windows), pending, await_node, consumers[frozenset(pending.vars)]))

    for node in entry.walk():
        if isinstance(node, ir.Yield):
            if pending is not None:
                diags.append(Diagnostic("await required before next yield", node.span, "error",
                                        (("previous yield here", pending.span),)))
            else:
                pending, pending_live = node, live
        elif isinstance(node, ir.Await):
            if pending is None:
                diags.append(Diagnostic(f"await {', '.join(node.vars)} has no matching yield", node.span))
            else:
                close(node)
                pending = None
        if node is end:
            live = False
    if pending is not None:
        close(None)
    return windows, diags


def _loop_window(y: ir.Yield, a: ir.Await, y_loop: ir.Loop | None, a_loop: ir.Loop | None) -> Diagnostic:
    """A yield and its await in different loop bodies (or one in a loop, one not): refused. A yield
    in a loop awaited after it would yield again before the await in the next iteration (§3.6 rule
    7), and an await in a loop merges in its first iteration only (§3.5: later it does nothing) or
    never where the loop runs none: what happens would depend on the trip count."""
    if y_loop is not None and (a_loop is None or a_loop is not y_loop):
        return Diagnostic(f"yield {', '.join(y.vars)} is inside loop {y_loop.name} and its await is not: the loop's "
                          f"next iteration would yield again before the await (SPEC §3.6 rule 7); await in the "
                          f"same loop body", y.span, "error", (("its await", a.span),))
    return Diagnostic(f"await {', '.join(a.vars)} is inside loop {a_loop.name} and its yield is not: only the loop's "
                      f"first iteration would merge the consumers (SPEC §3.5), and none where it runs no "
                      f"iteration; await after the loop, or yield in the same loop body", a.span, "error",
                      (("its yield", y.span),))


def _deadlocks(graph: ir.Graph, windows: list[Window]) -> list[Diagnostic]:
    """A consumer started at window i that awaits a variable v which entry yields only in a later
    window j > i (and not at or before i) would wait for v while entry's await of window i waits
    for it: a cycle. One error per (consumer, variable), at the consumer's await, with the later
    yield (and entry's await) as related locations."""
    diags: list[Diagnostic] = []
    reported: set[tuple[str, str]] = set()
    for w in windows:
        if w.await_node is None:
            continue
        earlier = {v for prev in windows[:w.index + 1] for v in prev.yield_node.vars}
        for name in w.consumers:
            block = graph.block(name)
            for node in block.walk():
                if not isinstance(node, ir.Await):
                    continue
                for v in node.vars:
                    if v in earlier or (name, v) in reported:
                        continue
                    later = next((lw for lw in windows[w.index + 1:] if v in lw.yield_node.vars), None)
                    if later is None:
                        continue
                    reported.add((name, v))
                    diags.append(Diagnostic(
                        f"deadlock: block {name} awaits {v}, which entry yields only after the await that "
                        f"waits for block {name}", node.span, "error",
                        ((f"{v} is yielded here, after entry's await", later.yield_node.span),
                         (f"entry waits for block {name} here", w.await_node.span))))
    return diags


def _phases(nodes: tuple[ir.Node, ...]) -> tuple[Phase, ...]:
    """Entry's live top-level nodes cut at each yield (its window's consumers launch after the
    phase) and each await (the next phase merges them first)."""
    phases: list[Phase] = []
    current: list[ir.Node] = []
    merges = None
    w = 0
    for node in nodes:
        if isinstance(node, ir.Yield):
            phases.append(Phase(len(phases), tuple(current), merges, launches=w))
            current, merges = [], None
        elif isinstance(node, ir.Await):
            phases.append(Phase(len(phases), tuple(current), merges))
            current, merges = [], w
            w += 1
        else:
            current.append(node)
    phases.append(Phase(len(phases), tuple(current), merges))
    return tuple(phases)


def yield_phases(graph: ir.Graph) -> YieldPhases:
    """THE yield/await analysis (never raises: errors are the plan's `diagnostics`)."""
    consumers = _consumers(graph)
    entry = graph.entry
    if entry is None:
        return YieldPhases((), (), MappingProxyType(consumers))
    nodes, end = _live(entry)
    windows, diags = _pair(entry, end, consumers)
    diags += _deadlocks(graph, windows)
    outputs = (end.vars or None) if end is not None else None
    nested = any(isinstance(n, (ir.Yield, ir.Await)) for top in nodes if isinstance(top, ir.Loop)
                 for n in ir.walk(top.body))
    phases = (Phase(0, nodes),) if nested else _phases(nodes)
    return YieldPhases(tuple(windows), phases, MappingProxyType(consumers), tuple(diags), nested, outputs,
                     has_yield(graph))


def analyze(graph: ir.Graph) -> YieldPhases:
    """The yield phases of a graph that was not checked: OiError with its pairing and deadlock
    errors (a checked graph carries its yield phases: `CheckedGraph.yield_phases`)."""
    if graph.entry is None:
        raise OiError("graph has no entry block")
    plan = yield_phases(graph)
    if plan.diagnostics:
        raise OiError(list(plan.diagnostics), source=graph.source)
    return plan


def has_yield(graph: ir.Graph) -> bool:
    """Whether entry yields or awaits (`YieldPhases.has_yield`; this for a graph that was not checked)."""
    entry = graph.entry
    return entry is not None and any(isinstance(n, (ir.Yield, ir.Await)) for n in entry.walk())


# ------------------------------------------------------------------------ whole-step facts


def read_before_written(graph: ir.Graph, plan: YieldPhases) -> frozenset[str]:
    """Variables a step may read before it writes them (what the host must provide, or what keeps
    its initial value): entry walked in order; a loop body or a branch target may not run, so its
    writes do not count; a consumer block starts from entry's state at its yield.

    Linear in the graph: what each block (with the blocks it calls and the consumers its yields
    start) reads before writing it is computed once, from nothing written, and a caller takes it
    minus what it has written by then (the same set as walking every path, which is 2^k paths
    for k conditionals whose arms share a block). Blocks are visited in post-order with an
    explicit stack; one met again while in progress (recursion, refused by the checker) adds
    nothing, as a path that already passed it."""
    entry = graph.entry
    if entry is None:
        return frozenset()

    def started(node: ir.Node) -> list[str]:
        """The blocks a node runs: branch targets, the consumers of a yield."""
        if isinstance(node, ir.Branch):
            return [t for t in (node.then_block, node.else_block) if t and graph.block(t) is not None]
        if isinstance(node, ir.Yield):
            return list(plan.consumers_of(node.vars))
        return []

    reads: dict[str, set[str]] = {}  # block -> what it reads before writing it, from nothing written

    def walk(nodes, written: set) -> set:
        needed: set[str] = set()
        written = set(written)
        for node in nodes:
            needed |= node_reads(node) - written
            if isinstance(node, ir.Loop):
                needed |= walk(node.body, written)
            for name in started(node):
                needed |= reads.get(name, set()) - written
            written |= node_defines(node)
        return needed

    state = {"entry": 1}  # 1: in progress, 2: done
    stack = [("entry", iter([t for n in entry.walk() for t in started(n)]))]
    while stack:
        name, todo = stack[-1]
        nxt = next(todo, None)
        if nxt is None:
            stack.pop()
            reads[name] = walk(graph.block(name).nodes, set())
            state[name] = 2
        elif nxt not in state:
            state[nxt] = 1
            stack.append((nxt, iter([t for n in graph.block(nxt).walk() for t in started(n)])))
    return frozenset(reads["entry"])


def runtime_shaped(graph: ir.Graph) -> dict[str, str]:
    """THE definition of the runtime-shaped variables (SPEC.md §0 item 12, revised): the
    destination of a `cache.read` of an `@auto_dim` tensor takes the tensor's current shape, and so
    does the output of an op with a runtime-shaped operand. Maps each such variable to the
    `@auto_dim` tensor its shape comes from (the first one found, in source order); the checker
    rejects the uses that cannot take such a value, the lowering carries its shape, and the
    interpreter lets the value keep its shape."""
    out: dict[str, str] = {}
    nodes = [n for b in graph.blocks for n in b.walk()]
    for node in nodes:
        if isinstance(node, ir.CacheRead):
            decl = graph.var(node.src.base)
            if decl is not None and decl.is_auto_dim:
                out.setdefault(node.dst.name, decl.name)
    changed = True
    while changed:  # through ops, to a fixed point (an op may come before the read in the text)
        changed = False
        for node in nodes:
            if isinstance(node, ir.Op) and node.output not in out:
                src = next((out[r.name] for r in node.refs if r.indices is None and r.name in out), None)
                if src is not None:
                    out[node.output] = src
                    changed = True
    return out
