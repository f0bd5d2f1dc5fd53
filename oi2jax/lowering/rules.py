"""The IR -> JAX rule registry and the node walk.

`RULES` maps each `ir` node type to its lowering rule `(node, env, frame, tr) -> env`; the construct
modules (blocks, control, caches, sync) register theirs with `@rule(NodeType)` when imported, and
`load()` imports them all (the step builder calls it first). `lower_nodes(nodes, env, frame, tr)`
walks nodes in order, dispatching on the node's type through `RULES` (no if-chains); it returns
(env, stopped) where `stopped` means a `return` (or a consumer's `yield`) ended the enclosing frame.
"""
from __future__ import annotations

import importlib
from contextlib import ExitStack

import jax

from .. import ir
from ..diagnostics import OiError
from .context import Frame, Tracer
from .state import Env

RULES: dict[type, object] = {}


def rule(node_type):
    def register(fn):
        RULES[node_type] = fn
        return fn
    return register


# a symbolic dimension (jax.export) used where a value is needed; jax.errors' name where JAX has it
_INCONCLUSIVE = getattr(jax.errors, "InconclusiveDimensionOperation", None) or \
    jax.core.InconclusiveDimensionOperation


def lower_nodes(nodes, env: Env, frame: Frame, tr: Tracer) -> tuple[Env, bool]:
    """Lower `nodes` in order in `frame`. An unconditional `branch B` (a call, §3.2) is lowered inline
    here, with an explicit call stack rather than Python recursion, so a chain of thousands of
    blocks calling one another is traced once each and never a RecursionError; a called block's
    `return` (or, outside entry, its `yield`) ends that block only. The caller's named scope is left
    while a callee is lowered (op names stay `.../<index>:branch/B/<index>:<op>` however deep the
    chain: no name grows with the call depth)."""
    calls: list = []  # suspended callers: (their remaining nodes, their frame, the branch that called)
    todo = iter(nodes)
    with ExitStack() as scopes:
        callee_scope = None  # the named scopes of the call being lowered (None: the caller's own nodes)
        while True:
            node = next(todo, None)
            if node is None or ir.ends_frame(node, frame.block):
                stopped = node is not None
                if isinstance(node, ir.Return) and node.vars and frame.block == "entry" and not frame.loop_vars:
                    tr.outputs = node.vars
                if not calls:
                    return env, stopped
                callee_scope.close()  # back in the caller
                todo, frame, branch = calls.pop()
                callee_scope = _enter_call(scopes, calls[-1][2], frame.block) if calls else None
                continue
            if isinstance(node, ir.Branch) and node.cond is None:
                calls.append((todo, frame, node))
                if callee_scope is not None:
                    callee_scope.close()
                callee_scope = _enter_call(scopes, node, node.then_block)
                todo, frame = iter(tr.graph.block(node.then_block).nodes), Frame(node.then_block)
                continue
            fn = RULES[type(node)]
            with jax.named_scope(f"{node.index}:{_label(node)}"):
                try:
                    env = fn(node, env, frame, tr)
                except _INCONCLUSIVE as exc:  # only `export --symbolic` lowers with a symbolic size
                    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    raise OiError(f"cannot lower this node with a symbolic size: it needs a concrete value there "
                                  f"({first}); export without --symbolic or use --size", node.span,
                                  source=tr.graph.source or None) from None


def _enter_call(scopes, branch: ir.Branch, block: str):
    """The named scopes of a call: `<index>:branch/<block>` (closed on return, or by `scopes` when
    lowering fails)."""
    call = scopes.enter_context(ExitStack())
    call.enter_context(jax.named_scope(f"{branch.index}:{_label(branch)}"))
    call.enter_context(jax.named_scope(block))
    return call


def lower_block(name: str, env: Env, tr: Tracer) -> Env:
    """Run block `name` as a call (§3.2): its return ends only the block."""
    block = tr.graph.block(name)
    with jax.named_scope(name):
        env, _ = lower_nodes(block.nodes, env, Frame(name), tr)
    return env


def _label(node: ir.Node) -> str:
    if isinstance(node, ir.Op):
        return node.op
    return type(node).__name__.lower()


def load() -> dict:
    """Import every construct module (each registers its rules); returns the complete `RULES`."""
    for module in ("blocks", "caches", "control", "sync"):
        importlib.import_module(f"{__package__}.{module}")
    return RULES
