"""OpenInfer-style execution traces (SPEC §8.2) recorded by the interpreter.

One event per executed node, in execution order:

    INDEX [BLOCK] -- DESCRIPTION -- (Xms Yus Zns)

Decisions (documented here, tested in tests/test_trace.py):

* The `<uuid>` column of the reference is OMITTED from the text line (the reference draws a
  random uuid4 per node, so it can never be compared). The JSON form carries a deterministic
  `node_uuid`: the fixed string `"00000000-0000-0000-0000-XXXXXXXXXXXX"` with the node index in
  the last group (decimal digits, zero-padded to 12).
* `BLOCK` is the block whose frame executed the node (loop bodies report the enclosing block).
* Timing is measured only for `op` nodes (wall time around the op's eager evaluation, including
  `block_until_ready`); every other node shows `(0ms 0us 0ns)`.
* Yield consumer blocks (SPEC §3.6) are run by the interpreter at the entry's `yield`, one after
  the other in ascending name order; their events are recorded in that run order, right after
  the `yield` event (the reference records them in nondeterministic order and does not print
  them; here they are both recorded and printed).
* Node descriptions come from `oi2jax.grammar.fmt.describe` (§8.2, attributes never shown).
* `OI2JAX_TRACE=full` in the environment makes every interpreted run record a trace and echo
  each line to stderr as the node executes.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from . import ir
from .grammar.fmt import describe, format_access, format_ref  # one node text for formatter, traces, pictures

KINDS = {
    ir.Assign: "Assign", ir.Op: "OpExecute", ir.CacheRead: "CacheRead", ir.CacheWrite: "CacheWrite",
    ir.CacheIncrement: "CacheIncrement", ir.CacheDecrement: "CacheDecrement", ir.CacheReset: "CacheReset",
    ir.Barrier: "Barrier", ir.Dep: "Dep", ir.Transfer: "Transfer", ir.Yield: "Yield", ir.Await: "Await",
    ir.Branch: "Branch", ir.Loop: "Loop", ir.Return: "Return",
}


def split_ns(ns: int) -> tuple[int, int, int]:
    """Nanoseconds -> (ms, us, ns) as OpenInfer prints them."""
    ns = max(int(ns), 0)
    return ns // 1_000_000, (ns // 1_000) % 1_000, ns % 1_000


def node_uuid(index: int) -> str:
    return f"00000000-0000-0000-0000-{index:012d}"


@dataclass
class TraceEvent:
    block_name: str
    node_index: int
    kind: str
    text: str
    ns: int = 0
    params: list = field(default_factory=list)
    output: list = field(default_factory=list)

    def line(self) -> str:
        ms, us, ns = split_ns(self.ns)
        return f"{self.node_index} [{self.block_name}] -- {self.text} -- ({ms}ms {us}us {ns}ns)"

    def to_json(self) -> dict:
        return {"block_name": self.block_name, "node_index": self.node_index,
                "node_uuid": node_uuid(self.node_index), "kind": self.kind,
                "params": list(self.params), "output": list(self.output), "micros": list(split_ns(self.ns))}


def _params_output(node: ir.Node) -> tuple[list, list]:
    if isinstance(node, ir.Op):
        return [format_ref(r, ",") for r in node.inputs], [node.output]
    if isinstance(node, ir.CacheRead):
        return [format_access(node.src, ",", "")], [format_ref(node.dst, ",")]
    if isinstance(node, ir.CacheWrite):
        return [format_ref(node.src, ",")], [format_access(node.dst, ",", "")]
    if isinstance(node, ir.Transfer):
        return [format_ref(node.src, ",")], [format_ref(node.dst, ",")]
    if isinstance(node, ir.Assign):
        return [], [node.name]
    return [], []


class Trace:
    """Collects one TraceEvent per executed node; `echo` also prints each line to `stream`."""

    def __init__(self, echo: bool = False, stream=None):
        self.events: list[TraceEvent] = []
        self.echo = echo
        self.stream = stream

    @classmethod
    def from_env(cls) -> "Trace | None":
        """A Trace when OI2JAX_TRACE=full (echoing to stderr), else None."""
        if os.environ.get("OI2JAX_TRACE", "").strip().lower() == "full":
            return cls(echo=True)
        return None

    def record(self, block: str, node: ir.Node, ns: int = 0) -> TraceEvent:
        text = describe(node)
        params, output = _params_output(node)
        event = TraceEvent(block, node.index, KINDS.get(type(node), type(node).__name__), text,
                           ns if isinstance(node, ir.Op) else 0, params, output)
        self.events.append(event)
        if self.echo:
            print(event.line(), file=self.stream or sys.stderr)
        return event

    def clear(self) -> None:
        self.events.clear()

    def lines(self) -> list[str]:
        return [e.line() for e in self.events]

    def to_json(self) -> list[dict]:
        return [e.to_json() for e in self.events]

    def __len__(self) -> int:
        return len(self.events)
