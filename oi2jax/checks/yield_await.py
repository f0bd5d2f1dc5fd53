"""Yield/await rules (§3.6): block await/yield consistency, entry yield..await windows, dead blocks."""
from __future__ import annotations

from .. import ir
from ..phases import consumers_of, deadlock_diagnostics, node_writes


class PhaseRules:
    """Whole-graph rules on yield/await pairing and the writes inside each yield..await window."""

    def check_yield_await(self):
        self.diags.extend(deadlock_diagnostics(self.g))  # consumers waiting on a later yield
        blocks = self.g.block_map
        targets = {t for brs in self.branch_targets().values() for br in brs
                   for t in (br.then_block, br.else_block) if t is not None}
        # non-entry blocks: await/yield consistency (§3.6)
        for b in self.g.blocks:
            if b.name == "entry":
                continue
            awaited: list[str] = []
            yielded: set[str] = set()
            first_await = None
            for node in b.walk():
                if isinstance(node, ir.Await):
                    awaited += [v for v in node.vars if v not in awaited]
                    first_await = first_await or node
                elif isinstance(node, ir.Yield):
                    yielded.update(node.vars)
            if awaited and not yielded:
                self.error(f"block {b.name} awaits [{', '.join(awaited)}] but never yields them", first_await.span)
            elif awaited:
                for v in awaited:
                    if v not in yielded:
                        self.error(f"block {b.name} awaits {v} but does not yield it", first_await.span)
        entry = blocks.get("entry")
        all_yielded: set[str] = set()
        if entry is not None:
            all_yielded = self.check_entry_windows(entry, targets)
        # dead blocks
        for b in self.g.blocks:
            if b.name == "entry" or b.name in targets:
                continue
            awaits = {v for n in b.walk() if isinstance(n, ir.Await) for v in n.vars}
            if not (awaits & all_yielded):
                self.warning(f"block {b.name} is never run: no branch targets it and it awaits no variable "
                             f"that entry yields", b.span)

    def consumers(self, yielded: tuple[str, ...], targets: set[str]) -> list[ir.Block]:
        return consumers_of(self.g, yielded)  # the one definition (phases.py)

    def check_entry_windows(self, entry: ir.Block, targets: set[str]) -> set[str]:
        all_yielded: set[str] = set()
        pending: ir.Yield | None = None
        window: list[ir.Node] = []
        for node in entry.walk():
            if isinstance(node, ir.Yield):
                all_yielded.update(node.vars)
                if pending is not None:
                    self.error("await required before next yield", node.span,
                               [("previous yield here", pending.span)])
                    continue
                pending, window = node, []
            elif isinstance(node, ir.Await):
                if pending is None:
                    self.error(f"await {', '.join(node.vars)} has no matching yield", node.span)
                    continue
                self.check_window(pending, window, targets)
                pending = None
            elif pending is not None:
                window.append(node)
        if pending is not None:
            self.error(f"yield {', '.join(pending.vars)} has no matching await", pending.span)
        return all_yielded

    def check_window(self, y: ir.Yield, window: list[ir.Node], targets: set[str]):
        writers: dict[str, tuple[str, ir.Span]] = {}
        for node, var in ((n, v) for n in window for v in node_writes(n)):
            if var in y.vars:
                self.error(f"entry writes yielded variable {var} between yield and await", node.span,
                           [("yielded here", y.span)])
                continue
            writers.setdefault(var, ("entry", node.span))
        for b in self.consumers(y.vars, targets):
            seen: set[str] = set()
            for node, var in ((n, v) for n in b.walk() for v in node_writes(n)):
                if var in seen:
                    continue
                seen.add(var)
                if var in writers:
                    who, span = writers[var]
                    self.error(f"multiple blocks mutated {var}: block {b.name} and {who} write it in the same "
                               f"yield..await window", node.span, [(f"{var} also written here ({who})", span)])
                else:
                    writers[var] = (f"block {b.name}", node.span)
