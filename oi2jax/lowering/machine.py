"""Branch targets shared by many paths, lowered once (linear compile time).

`branch c A B` lowers to `lax.cond`, whose two arms inline their blocks; a block reachable along
many paths of nested conditionals is then traced, and compiled, once per path: 2^k times for a
chain of k conditionals whose arms share the next block. When inlining a branch would cost
much more than lowering every block it can reach once (`needs_machine`), the branch runs as a
small state machine instead: each reachable block is cut at its top-level `branch` nodes into
segments, every segment is lowered ONCE as a case of `lax.switch`, and a `lax.while_loop` runs
the segments in call order with a return-address stack (as deep as the longest call chain below
the branch: `CallFacts.depth`). Same semantics as the inlined form (calls return to the node after the
branch; a top-level `return` ends the called block); branches inside loop bodies are lowered
inline as usual. The while loop has a data-dependent trip count, so `jax.grad` cannot
differentiate through such a machine (jit and vmap can).
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax

from .. import ir
from .rules import lower_nodes
from .context import Frame, Tracer
from .state import Env

# inline unless inlining costs more than this many times (plus a constant) the unique lowering
INLINE_FACTOR = 4
INLINE_SLACK = 64
# ... or would nest more conditionals than this (each a `lax.cond` traced inside the one above:
# Python recursion, and XLA compile time that grows faster than the nesting)
INLINE_COND_DEPTH = 64


def _own_size(nodes) -> int:
    return sum(1 for _ in ir.walk(nodes))


def _branches(nodes):
    return (node for node in ir.walk(nodes) if isinstance(node, ir.Branch))


def _targets(graph: ir.Graph, node: ir.Branch):
    return [t for t in (node.then_block, node.else_block) if t and graph.block(t) is not None]


def _calls(graph: ir.Graph, name: str) -> list[str]:
    """The blocks a block's branches call (both arms; loop bodies included), one entry per call."""
    return [t for br in _branches(graph.block(name).nodes) for t in _targets(graph, br)]


def _post_order(graph: ir.Graph) -> list[str]:
    """Every block after the blocks it calls (the checker refuses recursion), with an explicit
    stack: a chain of thousands of blocks is no RecursionError."""
    order, seen = [], set()
    for root in graph.blocks:
        if root.name in seen:
            continue
        seen.add(root.name)
        stack = [(root.name, iter(_calls(graph, root.name)))]
        while stack:
            name, todo = stack[-1]
            nxt = next(todo, None)
            if nxt is None:
                stack.pop()
                order.append(name)
            elif nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, iter(_calls(graph, nxt))))
    return order


@dataclass(frozen=True)
class CallFacts:
    """Per block, over the blocks it calls (computed once per lowering, in linear time):
    `cost`: nodes traced when it is inlined with every block it calls (both arms of each cond);
    `depth`: blocks on its longest call chain (itself included), the return stack a machine needs;
    `conds`: conditional branches nested on its deepest chain (the `lax.cond`s inlining nests)."""

    cost: dict
    depth: dict
    conds: dict


def call_facts(graph: ir.Graph) -> CallFacts:
    """`Lowering.call_facts`: computed once per lowering."""
    cost: dict[str, int] = {}
    depth: dict[str, int] = {}
    conds: dict[str, int] = {}
    for name in _post_order(graph):
        branches = list(_branches(graph.block(name).nodes))
        cost[name] = _own_size(graph.block(name).nodes) + sum(cost.get(t, 0) for t in _calls(graph, name))
        depth[name] = 1 + max((depth.get(t, 0) for br in branches for t in _targets(graph, br)), default=0)
        conds[name] = max((int(br.cond is not None) + conds.get(t, 0) for br in branches
                           for t in _targets(graph, br)), default=0)
    return CallFacts(cost, depth, conds)


def reachable(graph: ir.Graph, roots) -> list[str]:
    seen, order, stack = set(), [], list(roots)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        order.append(name)
        for br in _branches(graph.block(name).nodes):
            stack.extend(_targets(graph, br))
    return sorted(order)


def needs_machine(tr: Tracer, node: ir.Branch) -> bool:
    """Whether a conditional branch runs as the state machine rather than as nested `lax.cond`s:
    when inlining would trace shared blocks many times over, or nest conditionals too deep."""
    graph = tr.graph
    known = tr.lowering.call_facts
    roots = _targets(graph, node)
    if max(known.conds[t] for t in roots) >= INLINE_COND_DEPTH:
        return True
    inlined = sum(known.cost[t] for t in roots)
    unique = sum(_own_size(graph.block(b).nodes) for b in reachable(graph, roots))
    return inlined > INLINE_FACTOR * unique + INLINE_SLACK


_INSIDE, _CALL, _END = "inside", "call", "end"


class _Cut(ir.NodeVisitor):
    """Where a block's top-level node puts it in the machine's segments: a `branch` ends a
    segment (a call), a top-level `return` ends the block, every other node runs inside one."""

    def visit_Branch(self, node):
        return _CALL

    def visit_Return(self, node):
        return _END

    def _inside(self, node):
        return _INSIDE

    visit_Assign = visit_Op = visit_CacheRead = visit_CacheWrite = visit_CacheIncrement = visit_CacheDecrement = \
        visit_CacheReset = visit_Barrier = visit_Dep = visit_Loop = visit_Yield = visit_Await = visit_Transfer = \
        _inside


_CUT = _Cut()


def _segments(block: ir.Block):
    """[(nodes, terminator)]: cut at top-level branches; terminator is a Branch or None (the block
    ends, or a top-level `return` ends it)."""
    out, cur = [], []
    for node in block.nodes:
        cut = _CUT.visit(node)
        if cut == _CALL:
            out.append((tuple(cur), node))
            cur = []
        elif cut == _END:
            out.append((tuple(cur), None))
            return out
        else:
            cur.append(node)
    out.append((tuple(cur), None))
    return out


def run_branch(node: ir.Branch, env: Env, frame: Frame, tr: Tracer, pred) -> Env:
    """`branch` through the state machine (see module doc); `pred` is the condition's truth."""
    from .control import truthy  # cycle: lowering.control imports this module (needs_machine, run_branch)
    graph = tr.graph
    names = reachable(graph, _targets(graph, node))
    segs, first = [], {}
    for name in names:
        first[name] = len(segs)
        segs += [(name, nodes, term) for nodes, term in _segments(graph.block(name))]
    done = len(segs)
    depth = max(tr.lowering.call_facts.depth[name] for name in names) + 1  # the longest call chain: return addresses

    def case(k):
        name, nodes, term = segs[k]

        def fn(carry):
            env, sp, stack = carry
            with jax.named_scope(name):
                env, _ = lower_nodes(nodes, env, Frame(name), tr)
            if term is None:  # the block ends: return to the caller, or finish
                pc = jnp.where(sp > 0, stack[jnp.maximum(sp - 1, 0)], done).astype(jnp.int32)
                return env, pc, jnp.maximum(sp - 1, 0), stack
            after = jnp.int32(k + 1)
            if term.cond is None:
                target = jnp.int32(first[term.then_block])
            else:
                env, c = tr.read(ir.VarRef(term.cond, term.span), env, Frame(name))
                p = truthy(c, tr.bound.dtype(term.cond))
                other = first[term.else_block] if term.else_block else -1
                target = jnp.where(p, first[term.then_block], other).astype(jnp.int32)
            call = target >= 0
            stack = jnp.where(call, stack.at[sp].set(after), stack)
            return env, jnp.where(call, target, after), sp + call.astype(jnp.int32), stack

        return fn

    cases = [case(k) for k in range(len(segs))]
    other = first[node.else_block] if node.else_block else done
    pc0 = jnp.where(pred, first[node.then_block], other).astype(jnp.int32)

    def body(carry):
        env, pc, sp, stack = carry
        return lax.switch(pc, cases, (env, sp, stack))

    init = (env, pc0, jnp.int32(0), jnp.zeros((depth,), jnp.int32))
    env, _, _, _ = lax.while_loop(lambda c: c[1] != done, body, init)
    return env
