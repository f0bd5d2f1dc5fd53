"""Control-flow-graph pictures: `oi2jax graph GRAPH.oi [-o cfg.svg|cfg.png|cfg.dot]`.

`to_dot(graph, sizes=None) -> str` draws the graph in Graphviz DOT:
* every block is a cluster (`cluster_<block>`) starting at an oval node named after it;
  its nodes are boxes in program order, labelled as in OpenInfer's trace (§8.2);
* `branch` is a diamond with an edge to each target block labelled with its condition
  (`c` / `not c`, or `call` when unconditional) and a dashed `return` edge back to the node
  after it (branch = subroutine call, SPEC §3.2);
* `loop` is a hexagon labelled with its bounds (resolved `= N` when `sizes` knows them); its body
  is a nested cluster with an `iterate` edge in and a `next i` back edge;
* `yield` / `await`: bold dashed edges from entry's yield to every consumer block (labelled
  `yield x`) and from the consumer's end back to entry's matching await (`await x`);
* cache nodes are filled: reads blue (`[R]`), writes orange (`[W]`), increment/decrement/reset
  yellow (`[cache]`).
Every node type is drawn by two visitors (`_Style`: its attributes; `_Dot`: the edges it adds).
`render(dot_text, fmt)` runs Graphviz `dot -T<fmt>`; without it an `OiError` names the package.
"""
from __future__ import annotations

import shutil
import subprocess

from . import ir
from .diagnostics import OiError
from .grammar.fmt import describe
from .phases import awaited, yield_phases

FORMATS = ("dot", "svg", "png")


def _filled(color: str, tag: str):
    """The style of a cache node: filled with `color`, its label tagged."""
    def style(self, n, label):
        return {"style": "filled", "fillcolor": color, "label": tag + label}
    return style


class _Style(ir.NodeVisitor):
    """A node's Graphviz attributes by its type, `label` (its trace description) last: cache nodes
    filled (reads blue `[R]`, writes orange `[W]`, increment/decrement/reset yellow `[cache]`),
    branch a diamond, loop a hexagon with its bounds, yield/await green, return rounded."""

    def __init__(self, bound):
        self.bound = bound  # value -> text of a loop bound

    visit_CacheRead = _filled("lightblue", "[R] ")
    visit_CacheWrite = _filled("orange", "[W] ")
    visit_CacheIncrement = visit_CacheDecrement = visit_CacheReset = _filled("lightyellow", "[cache] ")

    def visit_Branch(self, n, label):
        return {"shape": "diamond", "label": label}

    def visit_Loop(self, n: ir.Loop, label):
        return {"shape": "hexagon",
                "label": f"{n.index}: loop {n.name} ({n.var} in {self.bound(n.start)}..{self.bound(n.end)})"}

    def visit_Yield(self, n, label):
        return {"shape": "cds", "style": "filled", "fillcolor": "palegreen", "label": label}

    visit_Await = visit_Yield

    def visit_Return(self, n, label):
        return {"shape": "box", "style": "rounded", "label": label}

    def _plain(self, n, label):
        return {"label": label}

    visit_Assign = visit_Op = visit_Barrier = visit_Dep = visit_Transfer = _plain


def _q(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _id(*parts) -> str:
    """A node's DOT id: its parts joined by ':', which no block name holds (joined by '_', a block
    `block_x` and a block `x_5` both gave `block_x_5`, one node in the picture)."""
    return _q(":".join(str(p) for p in parts))


class _Dot(ir.NodeVisitor):
    """The DOT text of one graph: `sequence` draws a run of nodes, visiting each for the edges
    and clusters its type adds (a branch's calls and returns, a loop's body, entry's yields and
    awaits); `build` adds the yield/await edges of the plan's consumers."""

    def __init__(self, graph: ir.Graph, sizes: dict | None, plan):
        self.graph = graph
        self.plan = plan
        self.sizes = dict(sizes or {})
        self.style = _Style(self.bound)
        self.lines: list[str] = []
        self.edges: list[str] = []
        self.block_names = {b.name for b in graph.blocks}
        self.last_of: dict[str, str] = {}  # block -> id of its last node
        self.yields: list[tuple[str, tuple[str, ...]]] = []  # (node id, vars) in entry
        self.awaits: list[tuple[str, tuple[str, ...]]] = []
        self.returns: list[tuple[str, str, str]] = []  # (target block, id to return to, label)

    def bound(self, value) -> str:
        if isinstance(value, int) or value not in self.sizes:
            return str(value)
        return f"{value}={self.sizes[value]}"

    def node(self, block: str, n: ir.Node, indent: str) -> str:
        nid = _id(block, n.index)
        attrs = self.style.visit(n, f"{n.index}: {describe(n)}")
        text = ", ".join(f"{k}={_q(v)}" for k, v in attrs.items())
        self.lines.append(f"{indent}{nid} [{text}];")
        return nid

    def sequence(self, block: str, nodes, indent: str, prev: str | None) -> str | None:
        pending_return: list[tuple[str, str]] = []  # (target block, label) waiting for the next node
        for n in nodes:
            nid = self.node(block, n, indent)
            if prev is not None:
                self.edges.append(f"  {prev} -> {nid};")
            for target, label in pending_return:
                self.returns.append((target, nid, label))
            pending_return = self.visit(n, block, nid, indent)
            prev = nid
        for target, label in pending_return:  # a branch at the very end returns to the block's end
            self.returns.append((target, None, label))
        return prev

    # each visit_<Type>: the edges and clusters after the node; returns its pending returns

    def visit_Branch(self, n: ir.Branch, block: str, nid: str, indent: str):
        if n.cond is None:
            self.branch_edge(nid, n.then_block, "call")
            return [(n.then_block, "return")]
        self.branch_edge(nid, n.then_block, n.cond)
        pending = [(n.then_block, "return")]
        if n.else_block:
            self.branch_edge(nid, n.else_block, f"not {n.cond}")
            pending.append((n.else_block, "return"))
        return pending

    def visit_Loop(self, n: ir.Loop, block: str, nid: str, indent: str):
        cluster = _id("cluster", block, "loop", n.index)
        self.lines.append(f"{indent}subgraph {cluster} {{")
        self.lines.append(f"{indent}  label={_q(f'loop {n.name}: {n.var} in {self.bound(n.start)}..{self.bound(n.end)}')};")
        self.lines.append(f"{indent}  style=dashed;")
        last = self.sequence(block, n.body, indent + "  ", None)
        self.lines.append(f"{indent}}}")
        if n.body:
            first_id = _id(block, n.body[0].index)
            self.edges.append(f"  {nid} -> {first_id} [label=\"iterate\"];")
            self.edges.append(f"  {last} -> {nid} [label={_q('next ' + n.var)}, style=dashed];")
        return []

    def visit_Yield(self, n: ir.Yield, block: str, nid: str, indent: str):
        if block == "entry":
            self.yields.append((nid, n.vars))
        return []

    def visit_Await(self, n: ir.Await, block: str, nid: str, indent: str):
        if block == "entry":
            self.awaits.append((nid, n.vars))
        return []

    def _no_edges(self, n, block: str, nid: str, indent: str):
        return []

    visit_Assign = visit_Op = visit_CacheRead = visit_CacheWrite = visit_CacheIncrement = visit_CacheDecrement = \
        visit_CacheReset = visit_Barrier = visit_Dep = visit_Transfer = visit_Return = _no_edges

    def branch_edge(self, src: str, target: str, label: str) -> None:
        if target in self.block_names:
            self.edges.append(f"  {src} -> {_id('block', target)} [label={_q(label)}, color=blue, "
                              f"fontcolor=blue];")
        else:
            missing = _id("missing", target)
            self.lines.append(f"  {missing} [label={_q('unknown block ' + target)}, color=red];")
            self.edges.append(f"  {src} -> {missing} [label={_q(label)}, color=red];")

    def build(self) -> str:
        for block in self.graph.blocks:
            self.lines.append(f"  subgraph {_id('cluster', block.name)} {{")
            self.lines.append(f"    label={_q('block ' + block.name)};")
            shape = "Mdiamond" if block.name == "entry" else "oval"
            self.lines.append(f"    {_id('block', block.name)} [label={_q(block.name)}, shape={shape}];")
            last = self.sequence(block.name, block.nodes, "    ", _id("block", block.name))
            self.last_of[block.name] = last
            self.lines.append("  }")
        for target, nid, label in self.returns:
            src = self.last_of.get(target)
            if src is not None and nid is not None:
                self.edges.append(f"  {src} -> {nid} [label={_q(label)}, style=dashed, color=blue, "
                                  f"fontcolor=blue];")
        started = {name for _, vars_ in self.yields for name in self.plan.consumers_of(vars_)}
        for name in sorted(started):  # the consumers of entry's yields (the plan's), by name
            waits = set(awaited(self.graph.block(name)))
            for nid, vars_ in self.yields:
                if name in self.plan.consumers_of(vars_):
                    shared = [v for v in vars_ if v in waits]
                    self.edges.append(f"  {nid} -> {_id('block', name)} [label={_q('yield ' + ', '.join(shared))}, "
                                      "style=\"bold,dashed\", color=darkgreen, fontcolor=darkgreen];")
            for nid, vars_ in self.awaits:
                shared = [v for v in vars_ if v in waits]
                if shared:
                    self.edges.append(f"  {self.last_of[name]} -> {nid} "
                                      f"[label={_q('await ' + ', '.join(shared))}, style=\"bold,dashed\", "
                                      "color=darkgreen, fontcolor=darkgreen];")
        name = (self.graph.path or "graph").rsplit("/", 1)[-1]
        head = ["digraph cfg {", f"  label={_q(name)};", "  labelloc=t;", "  compound=true;",
                "  node [shape=box, fontname=\"monospace\", fontsize=10];",
                "  edge [fontname=\"monospace\", fontsize=9];"]
        return "\n".join(head + self.lines + self.edges + ["}"]) + "\n"


def to_dot(graph, sizes: dict | None = None) -> str:
    """The control-flow graph in Graphviz DOT (see the module docstring) of a `CheckedGraph`
    (its yield phases drawn), or of a bare `ir.Graph`, errors and all (its plan computed here)."""
    if isinstance(graph, ir.Graph):
        return _Dot(graph, sizes, yield_phases(graph)).build()
    return _Dot(graph.graph, sizes, graph.yield_phases).build()


def render(dot_text: str, fmt: str) -> bytes:
    """DOT text -> `fmt` bytes ('svg' | 'png') with Graphviz `dot`; OiError when it is missing."""
    if fmt not in ("svg", "png"):
        raise OiError(f"unknown picture format {fmt} (expected one of {', '.join(FORMATS)})")
    exe = shutil.which("dot")
    if exe is None:
        raise OiError(f"rendering {fmt.upper()} needs Graphviz's `dot`, which is not installed; install the "
                      "`graphviz` package (e.g. `apt-get install graphviz`, `brew install graphviz`) or write "
                      "DOT with `-o FILE.dot` / stdout")
    proc = subprocess.run([exe, f"-T{fmt}"], input=dot_text.encode(), capture_output=True)
    if proc.returncode != 0:
        raise OiError(f"Graphviz dot failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def format_for(path: str | None) -> str:
    """'dot' for stdout / *.dot / *.gv, else the file suffix (svg | png)."""
    if path is None:
        return "dot"
    suffix = path.rsplit(".", 1)[-1].lower() if "." in path else ""
    if suffix in ("dot", "gv"):
        return "dot"
    if suffix in ("svg", "png"):
        return suffix
    raise OiError(f"cannot tell the picture format of {path}: use a .dot, .gv, .svg or .png file name")
