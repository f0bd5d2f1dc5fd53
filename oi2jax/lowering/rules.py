"""The IR -> JAX rule registry and the node walk.

`RULES` maps each `ir` node type to its lowering rule `(node, env, frame, tr) -> env`; the construct
modules (blocks, control, caches, sync) register theirs with `@rule(NodeType)` when imported, and
`load()` imports them all (the step builder calls it first). `lower_nodes(nodes, env, frame, tr)`
walks nodes in order, dispatching on the node's type through `RULES` (no if-chains); it returns
(env, stopped) where `stopped` means a `return` (or a consumer's `yield`) ended the enclosing frame.
"""
from __future__ import annotations

import jax

from .. import ir
from .context import Frame, Tracer

RULES: dict[type, object] = {}


def rule(node_type):
    def register(fn):
        RULES[node_type] = fn
        return fn
    return register


def lower_nodes(nodes, env: dict, frame: Frame, tr: Tracer) -> tuple[dict, bool]:
    for node in nodes:
        if isinstance(node, ir.Return):
            if node.vars and frame.block == "entry" and not frame.loop_vars:
                tr.outputs = node.vars
            return env, True
        if isinstance(node, ir.Yield) and frame.block != "entry":
            return env, True  # a consumer's yield ends it (§3.5)
        fn = RULES[type(node)]
        with jax.named_scope(f"{node.index}:{_label(node)}"):
            env = fn(node, env, frame, tr)
    return env, False


def lower_block(name: str, env: dict, tr: Tracer) -> dict:
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
    import importlib
    for module in ("blocks", "caches", "control", "sync"):
        importlib.import_module(f"{__package__}.{module}")
    return RULES
