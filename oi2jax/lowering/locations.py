"""`.oi` source locations in emitted StableHLO / HLO.

Every node is lowered inside a JAX named scope `<index>:<op>` (blocks.py), so each emitted
operation's name location reads like `jit(step)/entry/3:matmul/dot_general`. JAX gives the
operation the *Python* file and line it was traced from; a compiler engineer reading the dump or
a profile wants the graph's. These functions rewrite the emitted text through the named scopes:
the innermost `<index>:<op>` scope names the node (OpenInfer node numbers are unique in a graph),
and its span replaces the Python location:

    #loc97 = loc("jit(step)/entry/0:matmul/dot_general"("graph.oi":21:5))       (StableHLO)
    metadata={op_name="jit(step)/entry/0:matmul/dot_general" source_file="graph.oi" source_line=21}

Operations outside any node (state plumbing) keep JAX's location. A graph read from graph JSON
has no lines: its nodes name their JSON pointer, `("g.json#/blocks/entry/nodes/1":0:0)`.
"""
from __future__ import annotations

import re

from .. import ir

_SCOPE = re.compile(r"(?:^|/)(\d+):[A-Za-z_][\w.]*")
_NAMELOC = re.compile(r'^(#loc\d+) = loc\("((?:[^"\\]|\\.)*)"\((#loc\d+|"[^"]*":\d+:\d+)\)\)$', re.M)
_HLO_META = re.compile(r'metadata=\{op_name="((?:[^"\\]|\\.)*)"([^}]*)\}')


def node_spans(graph: ir.Graph) -> dict[int, ir.Span]:
    """OpenInfer node number -> the node's span, over every block (loop bodies included)."""
    spans = {}
    for block in graph.blocks:
        for node in block.walk():
            if node.span is not None:
                spans[node.index] = node.span
    return spans


def span_of(scope_name: str, spans: dict[int, ir.Span]) -> ir.Span | None:
    """The span of the innermost node scope in a named-scope path, or None."""
    found = None
    for m in _SCOPE.finditer(scope_name):
        span = spans.get(int(m.group(1)))
        if span is not None:
            found = span
    return found


def _path(span: ir.Span) -> str:
    """The span's file, escaped for the emitted text; a node of a graph-JSON graph (no lines: line
    0) names its JSON pointer there, `g.json#/blocks/entry/nodes/1`, as its errors do."""
    path = f"{span.path}#{span.pointer}" if span.line == 0 and span.pointer else str(span.path)
    return path.replace("\\", "\\\\").replace('"', '\\"')


def stablehlo(text: str, graph: ir.Graph) -> str:
    """StableHLO/MLIR text with `.oi` file:line:col locations for every node's operations."""
    spans = node_spans(graph)

    def repl(m: re.Match) -> str:
        span = span_of(m.group(2), spans)
        if span is None:
            return m.group(0)
        return f'{m.group(1)} = loc("{m.group(2)}"("{_path(span)}":{span.line}:{span.col}))'

    return _NAMELOC.sub(repl, text)


def hlo(text: str, graph: ir.Graph) -> str:
    """HLO text with `source_file` / `source_line` of the `.oi` node in each op's metadata."""
    spans = node_spans(graph)

    def repl(m: re.Match) -> str:
        span = span_of(m.group(1), spans)
        if span is None:
            return m.group(0)
        rest = re.sub(r'\s*(source_file="(?:[^"\\]|\\.)*"|source_line=\d+|source_end_line=\d+|'
                      r'source_column=\d+|source_end_column=\d+|stack_frame_id=\d+)', "", m.group(2))
        return (f'metadata={{op_name="{m.group(1)}" source_file="{_path(span)}" '
                f'source_line={span.line}{rest}}}')

    return _HLO_META.sub(repl, text)
