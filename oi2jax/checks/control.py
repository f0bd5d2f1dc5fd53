"""Control-flow rules: branch conditions and targets, loop bounds, and recursion in the branch graph."""
from __future__ import annotations

from .. import dtypes, ir, messages
from ..diagnostics import suggest


class ControlRules:
    """Per-node rules for `branch`/`loop` and the whole-graph branch-recursion rule."""

    # ---- control
    def loop_index_error(self, name: str, span: ir.Span, prefix: str = "", use: str = "v") -> None:
        """A loop index where a variable is wanted (SPEC §3: it is not one), with the way forward."""
        self.error(prefix + f"loop index {name} is not a variable: it is an integer for cache and prefix-table "
                   f"indices only (K[{name}], W[{name}]); to use its value, count the iterations in a volatile scalar "
                   f"(declare `c: i32;` among the volatiles, 0 at the start of every step; write `op add(c, 1) >> c;` "
                   f"as the loop body's last node) and use {use}",
                   span)

    def check_scalar_var(self, name: str, span: ir.Span, prefix: str = "") -> bool:
        if not self.known(name):
            self.error(f"{prefix}unknown variable {name}{self.near(name)}", span)
            return False
        if not self.is_scalar(name):
            self.error(f"{prefix}{name} must be scalar", span)
            return False
        return True

    def check_branch(self, node: ir.Branch):
        cond_span = self.word_span(node.span, node.cond, "branch") if node.cond is not None else node.span
        if node.cond is not None and self.check_scalar_var(node.cond, cond_span):
            if dtypes.get(self.dtype(node.cond)).packed:
                self.error(f"branch condition {node.cond}: packed scalars are not supported", cond_span)
        for target in (node.then_block, node.else_block):
            if target is not None and target not in self.g.block_map:
                after = "branch" if node.cond is None else node.cond  # the target follows the condition
                self.error(f"branch target block not found: {target}"
                           f"{suggest(target, [b.name for b in self.g.blocks])}",
                           self.word_span(node.span, target, after))

    def check_loop_bound(self, node: ir.Loop, which: str, bound, loops):
        lo, hi = messages.I64_RANGE
        if isinstance(bound, int) and lo <= bound < hi or bound in self.sizes:
            return
        prefix = f"loop {which} bound {bound} is invalid: "
        span = self.word_span(node.span, str(bound), " in " if which == "start" else "..")  # where it is written
        if isinstance(bound, int):  # OpenInfer reads a literal bound as an i64
            self.error(prefix + messages.OUTSIDE_I64, span)
            return
        if bound in loops:
            self.loop_index_error(bound, span, prefix, use="c as the bound")
            return
        if not self.known(bound) and not self.strict:
            return  # may be a size variable of a model bound later
        if self.check_scalar_var(bound, span, prefix) and dtypes.get(self.dtype(bound)).packed:
            self.error(prefix + "packed scalars are not supported", span)

    # ---------------------------------------------------------------- whole-graph rules
    def branch_targets(self) -> dict[str, list[ir.Branch]]:
        edges: dict[str, list[ir.Branch]] = {}
        for b in self.g.blocks:
            for node in b.walk():
                if isinstance(node, ir.Branch):
                    edges.setdefault(b.name, []).append(node)
        return edges

    def check_branch_graph(self):
        edges = self.branch_targets()
        blocks = self.g.block_map
        reported: set[int] = set()
        state: dict[str, int] = {}  # 1 visiting, 2 done
        path: list[str] = []

        def visit(root: str):  # an explicit stack: a chain of 1000 blocks is no RecursionError
            state[root] = 1
            path.append(root)
            stack = [(root, self._targets(edges, root, blocks))]
            while stack:
                name, targets = stack[-1]
                step = next(targets, None)
                if step is None:
                    stack.pop()
                    path.pop()
                    state[name] = 2
                    continue
                br, t = step
                if state.get(t) == 1:
                    if br.index not in reported:
                        reported.add(br.index)
                        cycle = path[path.index(t):] + [t]
                        self.error(f"recursion through branches: {' -> '.join(cycle)}", br.span)
                elif t not in state:
                    state[t] = 1
                    path.append(t)
                    stack.append((t, self._targets(edges, t, blocks)))

        order = (["entry"] if "entry" in blocks else []) + [b.name for b in self.g.blocks]
        for name in order:
            if name not in state:
                visit(name)
        # no limit on how deep blocks call blocks: every backend walks call chains without Python
        # recursion (interpreter frames, lowering/rules.lower_nodes, lowering/machine.py)

    @staticmethod
    def _targets(edges, name, blocks):
        for br in edges.get(name, []):
            for t in (br.then_block, br.else_block):
                if t is not None and t in blocks:
                    yield br, t
