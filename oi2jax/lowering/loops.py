"""How a `loop` lowers: unrolled, partly unrolled or a loop -- the one policy (docs/loops.md).

`unrolling(node, trips, tr, policy)` decides for one `loop` node from its static trip count n (None when a
bound is read at run time), its body's cost c (IR nodes one iteration traces, nested loops and
inlined branch targets included), whether its body reads a prefix-table member indexed by the
loop variable (`W[l]`: per-iteration constants, a *layer loop*) and the `LoopPolicy` in force:
the per-graph `unroll` option and the platform the program runs on.

- `unroll="none"`: `lax.fori_loop`. `"full"`: every loop with a static trip count is a Python
  loop with a static index. An int k: `fori_loop(..., unroll=k)` (k >= n: full).
- `"auto"`: a trip count read at run time, or a body without per-iteration constants, is a
  loop; a layer loop is fully unrolled when n x c <= UNROLL_BUDGET (every platform: the per-layer
  dynamic-slice copy of the weights costs a single-token decode 1.3-2x on CPU too, docs/loops.md);
  over the budget, on GPU/TPU `unroll=k` with the largest k <= n such that k x c <= UNROLL_BUDGET
  (k >= 2), else a loop; on CPU a loop (partial unrolling is slower there: docs/loops.md).

An unrolled loop's index is a Python int, so `W[l]` is static; a family every read of which is
static is held member by member (`split_families`: `W[0]`, `W[1]`, ... are separate buffers), so
an unrolled layer reads its own weight buffer -- no dynamic-slice and no slice either (XLA
materialises a slice of a stacked parameter as a copy, as it does a dynamic-slice).

The policy is a field of the `Lowering` (`Lowering.loop_policy`: the `unroll` option and the
platform the program is lowered for), fixed when the program is built, like the families it
splits (`Lowering.split`); lowering code reads `tr.lowering.loop_policy`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import ir
from ..diagnostics import OiError
from ..ops.registry import ACCELERATORS

MODES = ("auto", "none", "full")
UNROLL_BUDGET = 1024  # auto: IR nodes an unrolled loop may trace (n x body cost): bounds compile time


def check_unroll(value) -> "str | int":
    """The normalized `unroll` option: "auto" | "none" | "full" | an int k >= 1 (a string of
    digits is accepted, as given on the command line); anything else is an OiError."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in MODES:
            return text
        if text.isdigit():
            value = int(text)
    if isinstance(value, int) and not isinstance(value, bool):
        if value >= 1:
            return value
        raise OiError(f"unroll={value!r}: a partial unroll factor must be an integer >= 1")
    raise OiError(f"unknown unroll {value!r} (expected auto, none, full or an unroll factor k >= 1)")


# a family read at a traced index is held member by member under `LoopPolicy.members` only up to
# this many members (the read is a `lax.switch` with a branch per member)
MAX_SWITCH_MEMBERS = 256


@dataclass(frozen=True)
class LoopPolicy:
    unroll: "str | int" = "auto"
    platform: str = "cpu"  # jax platform name: cpu | gpu | cuda | rocm | tpu
    # also hold a family read at traced indices (a rolled loop's index) member by member, each
    # such read a `lax.switch` over the members (a CPU prompt program's rolled layer loop: it
    # shares the unrolled decode program's member buffers; docs/loops.md)
    members: bool = False

    @property
    def accelerator(self) -> bool:
        return self.platform in ACCELERATORS


def platform_of(platforms) -> str:
    """One platform for the policy from several (jax.export `platforms`): an accelerator's
    when any is one (the unrolled program is also correct, and compiles, on CPU)."""
    platforms = [str(p).lower() for p in platforms]
    return next((p for p in platforms if p in ACCELERATORS), platforms[0] if platforms else "cpu")


# ------------------------------------------------------------------------------ the decision


@dataclass(frozen=True)
class Unrolling:
    """`unroll`: a Python loop with a static index; else `fori_loop(..., unroll=factor)`."""

    unroll: bool
    factor: int = 1
    reason: str = ""


def static_trips(node: ir.Loop, tr) -> int | None:
    """The loop's trip count when both bounds are static (control._bound's static cases)."""
    bounds = []
    for value in (node.start, node.end):
        b = tr.bound.loop_bound(value)
        if b is None and isinstance(value, str):
            b = tr.static_scalar(value)
        if b is None:
            return None
        bounds.append(int(b))
    return max(bounds[1] - bounds[0], 0)


def _refs(n):
    """The variable references of one node (op inputs and output, transfers, cache sources and
    destinations)."""
    if isinstance(n, ir.Op):
        yield from n.refs
        yield ir.VarRef(n.output, n.output_span)
    elif isinstance(n, ir.Transfer):
        yield n.src
        yield n.dst
    elif isinstance(n, ir.CacheWrite):
        yield n.src
    elif isinstance(n, ir.CacheRead):
        yield n.dst


def _walk_refs(nodes):
    """(reference, the loop variables bound around it inside `nodes`) over nested loops."""
    for n in nodes:
        if isinstance(n, ir.Loop):
            for r, inner in _walk_refs(n.body):
                yield r, inner | {n.var}
        else:
            for r in _refs(n):
                yield r, frozenset()


def reads_per_iteration(node: ir.Loop) -> bool:
    """Whether the body reads a prefix-table member indexed by the loop variable (`W[l]`),
    in nested loops too: the constants differ every iteration (a layer loop)."""
    return any(r.indices is not None and node.var in r.indices and node.var not in inner
               for r, inner in _walk_refs(node.body))


def body_cost(nodes, tr, policy: LoopPolicy) -> int:
    """IR nodes one pass over `nodes` traces: nested loops by their own unrolling (n x cost when
    unrolled), branches with the blocks they inline."""
    costs = tr.lowering.inline_costs
    total = 0
    for n in nodes:
        total += 1
        if isinstance(n, ir.Loop):
            inner = body_cost(n.body, tr, policy)
            p = _decide(n, static_trips(n, tr), inner, policy)
            total += inner * (static_trips(n, tr) if p.unroll else max(p.factor, 1))
        elif isinstance(n, ir.Branch):
            total += sum(costs.get(t, 0) for t in (n.then_block, n.else_block) if t)
    return total


def unrolling(node: ir.Loop, trips: int | None, tr, policy: LoopPolicy) -> Unrolling:
    """How loop `node` with static trip count `trips` (None: read at run time) lowers under
    `policy`."""
    if trips is None:
        return Unrolling(False, 1, "trip count read at run time")
    return _decide(node, trips, body_cost(node.body, tr, policy), policy)


def _decide(node: ir.Loop, trips: int | None, cost: int, policy: LoopPolicy) -> Unrolling:
    mode = policy.unroll
    if trips is None:
        return Unrolling(False, 1, "trip count read at run time")
    if mode == "none":
        return Unrolling(False, 1, "unroll=none")
    if mode == "full":
        return Unrolling(True, trips, "unroll=full")
    if isinstance(mode, int):
        if mode >= trips:
            return Unrolling(True, trips, f"unroll={mode} >= {trips} iterations")
        return Unrolling(False, mode, f"unroll={mode}")
    # auto
    where = f"auto on {policy.platform}"
    if not reads_per_iteration(node):
        return Unrolling(False, 1, f"{where}: no per-iteration constant")
    size = trips * max(cost, 1)
    if size <= UNROLL_BUDGET:
        return Unrolling(True, trips, f"{where}: layer loop, {trips} x {cost} nodes")
    if not policy.accelerator:  # CPU: partial unrolling is slower than a loop (docs/loops.md)
        return Unrolling(False, 1, f"{where}: layer loop over budget ({trips} x {cost} nodes), a loop")
    k = min(trips, UNROLL_BUDGET // max(cost, 1))
    if k >= 2:
        return Unrolling(False, k, f"{where}: layer loop over budget ({trips} x {cost} nodes), unroll={k}")
    return Unrolling(False, 1, f"{where}: layer loop body over budget ({cost} nodes)")


# ------------------------------------------------------------------------------ family layout


class MemberKey(str):
    """The constant key of one member of a family held member by member: the text `W[3]`,
    `QKV[1,0]` (as dumps and messages show it), carrying its `family` and `index`, so that nothing
    parses the text back."""

    family: str
    index: tuple[int, ...]

    def __new__(cls, family: str, index: tuple[int, ...]):
        index = tuple(int(i) for i in index)
        key = super().__new__(cls, f"{family}[{','.join(str(i) for i in index)}]")
        key.family, key.index = family, index
        return key


def member_key(name: str, index: tuple[int, ...]) -> MemberKey:
    """The constant key of member `index` of family `name` (`W[3]`)."""
    return MemberKey(name, index)


def most_unrolled_trips(tr, policy: LoopPolicy) -> int:
    """The largest trip count of a loop the program unrolls under `policy` (0: none unrolled):
    how many copies of a loop body a program holds (runtime/buckets.py rolls a prompt program
    whose layer loop this makes large)."""
    most = 0
    for block in tr.graph.blocks:
        for node in block.walk():
            if isinstance(node, ir.Loop):
                trips = static_trips(node, tr)
                if trips is not None and unrolling(node, trips, tr, policy).unroll:
                    most = max(most, trips)
    return most


def split_families(tr, policy: LoopPolicy) -> set[str]:
    """Prefix tables every read of which has static indices under `policy` (literals, sizes,
    constant scalars, indices of unrolled loops): the program holds them member by member
    (`member_key`), so an unrolled layer reads its own weight buffer -- no slice of the stacked
    family, which XLA materialises as a copy (docs/loops.md). A family with any traced read
    (a fori loop's index, a persistent scalar) stays stacked, for dynamic-slice; under
    `policy.members` it too is held member by member (up to MAX_SWITCH_MEMBERS members), each
    traced read a `lax.switch`. A read of the whole family keeps it stacked."""
    graph = tr.graph
    families = {d.name: d for d in graph.vars if d.is_prefix_table}
    traced: set[str] = set()

    def static(raw, unrolled: dict) -> bool:
        if isinstance(raw, int):
            return True
        if raw in unrolled:  # the innermost loop of that name
            return unrolled[raw]
        if raw in tr.bound.sizes:
            return True
        decl = graph.var(raw)
        return decl is not None and decl.kind == ir.MemKind.CONSTANT and tr.static_scalar(raw) is not None

    def walk(nodes, unrolled: dict, block: str):
        for n in nodes:
            if isinstance(n, ir.Loop):
                trips = static_trips(n, tr)
                body = n.body
                returns = any(ir.ends_frame(b, block) for b in body)  # control._until_return: index lo
                inner = dict(unrolled)
                inner[n.var] = returns and trips is not None or unrolling(n, trips, tr, policy).unroll
                walk(body, inner, block)
                continue
            for r in _refs(n):
                if r.name in families:
                    decl = families[r.name]
                    if r.indices is None or len(r.indices) != len(decl.index_params):
                        whole.add(r.name)  # the stacked family itself
                    elif not all(static(i, unrolled) for i in r.indices):
                        traced.add(r.name)

    whole: set[str] = set()
    for block in graph.blocks:
        walk(block.nodes, {}, block.name)
    if policy.members:  # traced reads select their member with lax.switch (a bounded count of members)
        traced = {name for name in traced if math.prod(tr.bound.family_counts(name)) > MAX_SWITCH_MEMBERS}
    return set(families) - traced - whole
