"""yield/await structure of a graph, on the IR alone (no JAX): consumers, windows, phases.

Shared by the checker (pairing and deadlock diagnostics), the fused lowering (lowering/sync.py)
and the driver (runtime/driver.py). Consumers follow SPEC §0 item 3: the non-entry,
non-branch-target blocks that `await` at least one yielded variable, in name order.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import ir
from .diagnostics import Diagnostic, OiError


def consumer_blocks(graph: ir.Graph) -> list[ir.Block]:
    """Non-entry, non-branch-target blocks that await something (§0 item 3), by name."""
    targets = set()
    for block in graph.blocks:
        for node in block.walk():
            if isinstance(node, ir.Branch):
                targets.add(node.then_block)
                if node.else_block:
                    targets.add(node.else_block)
    found = [b for b in graph.blocks
             if b.name != "entry" and b.name not in targets and any(isinstance(n, ir.Await) for n in b.walk())]
    return sorted(found, key=lambda b: b.name)


def node_writes(node: ir.Node) -> tuple[str, ...]:
    """The variables one node certainly writes (THE definition, used by the window checks and
    `written_names`): an op's output, a transfer's or cache read's destination, and the persistent
    variable of cache.write / reset / increment / decrement."""
    if isinstance(node, ir.Op):
        return (node.output,)
    if isinstance(node, (ir.Transfer, ir.CacheRead)):
        return (node.dst.name,)
    if isinstance(node, ir.CacheWrite):
        return (node.dst.base,)
    if isinstance(node, ir.CacheReset):
        return (node.target.base,)
    if isinstance(node, (ir.CacheIncrement, ir.CacheDecrement)):
        return (node.target,)
    return ()


def written_names(graph: ir.Graph, block: ir.Block, seen=None) -> set[str]:
    """Variables a block (and the blocks it calls) may write. Each block is visited once, with an
    explicit stack (a chain of thousands of blocks is no RecursionError)."""
    seen = set() if seen is None else seen
    out: set[str] = set()
    stack = [block]
    while stack:
        b = stack.pop()
        if b.name in seen:
            continue
        seen.add(b.name)
        for node in b.walk():
            out.update(node_writes(node))
            if isinstance(node, ir.CacheRead):
                out.add(node.src.base)  # a read may grow a table or an auto_dim tensor
            elif isinstance(node, ir.Branch):
                stack.extend(graph.block(t) for t in (node.then_block, node.else_block) if t and graph.block(t))
    return out


def node_reads(node: ir.Node) -> set[str]:
    """Names one node may read (not its loop body or called blocks): op inputs (and identifiers
    given as attribute values), copy and cache-write sources, branch conditions, loop bounds, cache
    and prefix-table indices, yielded and returned variables. A superset (some are sizes)."""
    out: set[str] = set()

    def index(v):
        if isinstance(v, str):
            out.add(v)

    def access(acc: ir.CacheAccess):
        for pos in acc.indices:
            if isinstance(pos, ir.Single):
                index(pos.value)
            else:
                index(pos.start)
                index(pos.end)

    def ref(r: ir.VarRef):
        out.add(r.name)
        for v in r.indices or ():
            index(v)

    if isinstance(node, ir.Op):
        for r in node.inputs:
            ref(r)
        for attr in node.attrs:
            if attr.value.kind == "var":  # a variable-valued setting reads that variable
                out.add(attr.value.value)
    elif isinstance(node, (ir.Transfer, ir.CacheWrite)):
        ref(node.src)
        if isinstance(node, ir.CacheWrite):
            access(node.dst)
    elif isinstance(node, ir.CacheRead):
        access(node.src)
    elif isinstance(node, ir.CacheReset):
        access(node.target)
    elif isinstance(node, ir.Branch):
        if node.cond:
            out.add(node.cond)
    elif isinstance(node, ir.Loop):
        index(node.start)
        index(node.end)
    elif isinstance(node, (ir.Yield, ir.Return)):
        out.update(node.vars)
    return out


def node_defines(node: ir.Node) -> set[str]:
    """Variables one node gives a whole new value (not cache updates): what `read_before_written`
    counts as defined."""
    if isinstance(node, ir.Op):
        return {node.output}
    if isinstance(node, (ir.Transfer, ir.CacheRead)):
        return {node.dst.name}
    return set()


def read_before_written(graph: ir.Graph) -> set[str]:
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
        return set()
    consumers = consumer_blocks(graph)
    awaited = {b.name: {v for n in b.walk() if isinstance(n, ir.Await) for v in n.vars} for b in consumers}

    def started(node: ir.Node) -> list[str]:
        """The blocks a node runs: branch targets, the consumers of a yield."""
        if isinstance(node, ir.Branch):
            return [t for t in (node.then_block, node.else_block) if t and graph.block(t) is not None]
        if isinstance(node, ir.Yield):
            return [c.name for c in consumers if awaited[c.name] & set(node.vars)]
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
    return reads["entry"]


@dataclass
class Window:
    """One yield..await pair of entry (top level)."""

    index: int
    yield_node: ir.Yield
    await_node: ir.Await | None
    consumers: list[str]


@dataclass
class Phase:
    index: int
    nodes: tuple[ir.Node, ...]
    merges: int | None = None  # window whose consumers are merged at this phase's start (its await)
    launches: int | None = None  # window whose consumers are dispatched after this phase (its yield)


@dataclass
class Analysis:
    phases: list[Phase]
    windows: list[Window]
    fused_fallback: bool = False  # yield/await nested in entry loops: one phase, fused rules
    outputs: tuple[str, ...] | None = None  # `return a, b;` in entry


def consumers_of(graph: ir.Graph, names) -> list[ir.Block]:
    """THE consumers of a `yield` of `names` (one definition: checker, fused lowering, driver,
    interpreter): the consumer blocks (`consumer_blocks`) that await any of them, by name."""
    wanted = set(names)
    return [b for b in consumer_blocks(graph)
            if any(isinstance(n, ir.Await) and wanted & set(n.vars) for n in b.walk())]


def _consumers(graph: ir.Graph, names) -> list[str]:
    return [b.name for b in consumers_of(graph, names)]


def _windows(graph: ir.Graph, nodes) -> tuple[list[Window], list[Diagnostic]]:
    """Pair entry's yields and awaits (in walk order); pairing diagnostics as check.py words them."""
    windows: list[Window] = []
    diags: list[Diagnostic] = []
    pending: Window | None = None
    for node in ir.walk(nodes):
        if isinstance(node, ir.Yield):
            if pending is not None:
                diags.append(Diagnostic("await required before next yield", node.span, "error",
                                        (("previous yield here", pending.yield_node.span),)))
                continue
            pending = Window(len(windows), node, None, _consumers(graph, node.vars))
            windows.append(pending)
        elif isinstance(node, ir.Await):
            if pending is None:
                diags.append(Diagnostic(f"await {', '.join(node.vars)} has no matching yield", node.span))
                continue
            pending.await_node = node
            pending = None
    if pending is not None:
        diags.append(Diagnostic(f"yield {', '.join(pending.yield_node.vars)} has no matching await",
                                pending.yield_node.span))
    return windows, diags


def deadlock_diagnostics(graph: ir.Graph, windows: list[Window] | None = None) -> list[Diagnostic]:
    """A consumer started at window i that awaits a variable v which entry yields only in a later
    window j > i (and not at or before i) would wait for v while entry's await of window i waits
    for it: a cycle. One error per (consumer, variable), at the consumer's await, with the later
    yield (and entry's await) as related locations."""
    entry = graph.entry
    if entry is None:
        return []
    if windows is None:
        windows, _ = _windows(graph, entry.nodes)
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


def analyze(graph: ir.Graph) -> Analysis:
    """Phases and windows of `entry`; raises OiError (all diagnostics) on pairing errors / deadlocks."""
    entry = graph.entry
    if entry is None:
        raise OiError("graph has no entry block")
    nodes: list[ir.Node] = []
    outputs = None
    for node in entry.nodes:  # a top-level return ends the step: later nodes are dead
        nodes.append(node)
        if isinstance(node, ir.Return):
            outputs = node.vars or None
            break
    windows, diags = _windows(graph, tuple(nodes))
    diags += deadlock_diagnostics(graph, windows)
    if diags:
        raise OiError(diags, source=graph.source)
    nested = any(isinstance(n, (ir.Yield, ir.Await)) for top in nodes if isinstance(top, ir.Loop)
                 for n in ir.walk(top.body))
    if nested:
        return Analysis([Phase(0, tuple(nodes))], [], fused_fallback=True, outputs=outputs)
    phases = [Phase(0, ())]
    current: list[ir.Node] = []
    w = 0
    for node in nodes:
        if isinstance(node, (ir.Yield, ir.Await)):
            phases[-1].nodes = tuple(current)
            current = []
            nxt = Phase(len(phases), ())
            if isinstance(node, ir.Yield):
                phases[-1].launches = w
            else:
                nxt.merges = w
                w += 1
            phases.append(nxt)
        else:
            current.append(node)
    phases[-1].nodes = tuple(current)
    return Analysis(phases, windows, outputs=outputs)


def has_yield(graph: ir.Graph) -> bool:
    entry = graph.entry
    return entry is not None and any(isinstance(n, (ir.Yield, ir.Await)) for n in entry.walk())


# ops whose result has the shape of their (runtime-shaped) operand: elementwise, every other
# operand a scalar or of the same shape (SPEC.md §0 item 12, revised: reads of @auto_dim tensors)
SHAPE_PRESERVING_CATEGORIES = frozenset({"arithmetic", "bitwise", "casting", "rounding", "comparison", "mutation",
                                         "statistics"})
SHAPE_PRESERVING_OPS = frozenset({"relu", "filter", "is_inf", "is_nan", "is_neg"})


def takes_runtime_shape(op: str) -> bool:
    """Whether `op` can take an operand whose shape is only known at run time."""
    from .ops import REGISTRY
    spec = REGISTRY.get(op)
    return spec is not None and (spec.category in SHAPE_PRESERVING_CATEGORIES or op in SHAPE_PRESERVING_OPS)


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
                src = next((out[r.name] for r in node.inputs if r.indices is None and r.name in out), None)
                if src is not None:
                    out[node.output] = src
                    changed = True
    return out
