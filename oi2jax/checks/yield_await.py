"""Yield/await rules (§3.6): block await/yield consistency, entry yield..await windows, dead blocks.

The pairing of entry's yields and awaits, its errors and the deadlock errors are the yield phases's
(`phases.yield_phases`, computed here once and carried by the `CheckedGraph`)."""
from __future__ import annotations

from .. import ir
from ..phases import awaited, block_writes, node_changes, yield_phases


class PhaseRules:
    """Whole-graph rules on yield/await pairing and the writes inside each yield..await window."""

    def check_yield_await(self):
        plan = self.yield_phases = yield_phases(self.g)  # computed once: the CheckedGraph carries it
        self.block_writes = block_writes(self.g)  # so are the blocks' writes
        self.diags.extend(plan.diagnostics)  # pairing, and consumers waiting on a later yield
        targets = {t for brs in self.branch_targets().values() for br in brs
                   for t in (br.then_block, br.else_block) if t is not None}
        # non-entry blocks: await/yield consistency (§3.6)
        for b in self.g.blocks:
            if b.name == "entry":
                continue
            waits = awaited(b)
            if not waits:
                continue
            yielded = {v for n in b.walk() if isinstance(n, ir.Yield) for v in n.vars}
            first_await = next(n for n in b.walk() if isinstance(n, ir.Await))
            if not yielded:
                self.error(f"block {b.name} awaits [{', '.join(waits)}] but never yields them", first_await.span)
                continue
            for v in waits:
                if v not in yielded:
                    self.error(f"block {b.name} awaits {v} but does not yield it", first_await.span)
        for w in plan.windows:
            if w.await_node is not None:
                self.check_window(w.yield_node, self.window_nodes(w), w.consumers)
                self.check_await_list(w.yield_node, w.await_node)
        for b in self.g.blocks:  # a name listed twice: the same as once (§3.5), most likely a slip
            for n in b.walk():
                if isinstance(n, (ir.Yield, ir.Await)):
                    word = "yield" if isinstance(n, ir.Yield) else "await"
                    for v in sorted({v for v in n.vars if n.vars.count(v) > 1}):
                        self.warning(f"{word} lists {v} {n.vars.count(v)} times: the same as once", n.span)
        # dead blocks: neither a branch target nor started by a yield of entry
        entry = self.g.entry
        started = {name for n in (entry.walk() if entry is not None else ()) if isinstance(n, ir.Yield)
                   for name in plan.consumers_of(n.vars)}
        for b in self.g.blocks:
            if b.name != "entry" and b.name not in targets and b.name not in started:
                self.warning(f"block {b.name} is never run: no branch targets it and it awaits no variable "
                             f"that entry yields", b.span)

    def check_await_list(self, y: ir.Yield, a: ir.Await):
        """Entry's `await` waits for every consumer its yield started and merges what they wrote,
        whatever it names (§3.5, §0 item 3): a name its yield did not list selects nothing, and a
        yielded name it leaves out is merged all the same. Both are warnings."""
        at = f"its yield at line {y.span.line}" if y.span is not None else "its yield"
        for v in dict.fromkeys(a.vars):
            if v not in y.vars:
                self.warning(f"entry awaits {v}, which {at} does not yield: naming it selects nothing (await "
                             f"waits for every consumer and takes what they wrote, whatever it names)", a.span)
        left = [v for v in y.vars if v not in a.vars]
        if left:
            self.warning(f"entry's await does not name {', '.join(dict.fromkeys(left))}, which {at} yields: "
                         f"merged from the consumers all the same", a.span)

    def window_nodes(self, w) -> list[ir.Node]:
        """Entry's nodes strictly between a window's yield and its await (walk order)."""
        out: list[ir.Node] = []
        inside = False
        for node in self.g.entry.walk():
            if node is w.await_node:
                return out
            if inside:
                out.append(node)
            inside = inside or node is w.yield_node
        return out

    def changes(self, nodes):
        """(node, variable) for what each of `nodes` may change (`phases.node_changes`), a branch
        what the blocks it calls may (`phases.block_writes`), each variable once, in order."""
        seen: set[str] = set()
        for n in nodes:
            names = node_changes(self.g, n)
            if isinstance(n, ir.Branch):
                names += tuple(v for t in (n.then_block, n.else_block) if t in self.block_writes
                               for v in sorted(self.block_writes[t]))
            for v in names:
                if v not in seen:
                    seen.add(v)
                    yield n, v

    def check_window(self, y: ir.Yield, window: list[ir.Node], consumers: tuple[str, ...]):
        def how(node, var) -> str:  # a change that is no write is told as what it is
            if isinstance(node, ir.CacheRead) and node.src.base == var:
                return f" (a cache.read of {var} grows it: §4.2)"
            return f" (through branch: a block it calls writes {var})" if isinstance(node, ir.Branch) else ""

        writers: dict[str, tuple[str, ir.Span, str]] = {}
        for node, var in self.changes(window):
            if var in y.vars:
                self.error(f"entry writes yielded variable {var} between yield and await{how(node, var)}", node.span,
                           [("yielded here", y.span)])
                continue
            writers.setdefault(var, ("entry", node.span, how(node, var)))
        for name in consumers:
            b = self.g.block(name)
            for node, var in self.changes(b.walk()):
                if var in writers:
                    who, span, way = writers[var]
                    self.error(f"multiple blocks mutated {var}: block {b.name} and {who} write it in the same "
                               f"yield..await window{how(node, var)}", node.span,
                               [(f"{var} also written here ({who}){way}", span)])
                else:
                    writers[var] = (f"block {b.name}", node.span, how(node, var))
