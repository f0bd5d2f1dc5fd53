"""`table_dtype`: the graph's float cache tables stored in another float dtype (an oi2jax
extension, opt-in; docs/semantics.md, "Table dtype").

A KV cache in f16 or bf16 holds half the bytes of an f32 one, and a decode step reads every
filled row of it: llama.cpp keeps its KV cache in f16 by default. `narrow_tables(graph, "f16")`
is the graph with every float `@table` of its persistent section declared f16 instead, written
out as a user would write it by hand:

- each `cache.write SRC >> T[...]` into such a table writes `SRC` cast to the table's dtype (a
  new `op cast(SRC, to=f16)` node and its temporary, just before the write: the values are
  rounded to nearest, ties to even, once, when they are stored);
- each `cache.read T[...] >> DST` from one reads into a `DST` of the table's dtype (its
  declaration's dtype changes; a read widens nothing, so nothing copies the table).

The graph's own nodes keep their numbers (`Node.index`: diagnostics, HLO scopes `45:attention`
and traces name the nodes as written); the new ones take the numbers after the last.

The rewritten graph is then checked as any graph: an op that cannot take the narrower values
(`op add(x, kread)` with x f32: OpenInfer's ops take inputs of one dtype) is an error at that
node. The nn op `attention` takes k and v of another float dtype than q and computes in q's, so
the family graphs run unchanged. One rule for every stage: the checker, the interpreter and the
compiled program all see the same rewritten graph.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

from . import ir
from .dtypes import FLOATS
from .diagnostics import Diagnostic, OiError

TABLE_DTYPES = ("f16", "bf16", "f32")  # what a table may be stored in (f8 too coarse for a cache)


def check_table_dtype(dtype) -> str | None:
    """`dtype` as given (None: the tables as declared), or OiError naming the choices."""
    if dtype is None:
        return None
    if dtype not in TABLE_DTYPES:
        raise OiError(f"unknown table dtype {dtype!r} (expected one of {', '.join(TABLE_DTYPES)})")
    return str(dtype)


def narrowed(graph: ir.Graph, dtype: str | None) -> tuple[ir.VarDecl, ...]:
    """The tables `narrow_tables(graph, dtype)` changes: every float `@table` of the persistent
    section not already in `dtype` (none for None)."""
    return tuple(v for v in graph.vars if dtype is not None and v.kind == ir.MemKind.PERSISTENT and v.is_table
                 and v.dtype in FLOATS and v.dtype != dtype)


def narrow_tables(graph: ir.Graph, dtype: str | None) -> ir.Graph:
    """The graph with its float cache tables in `dtype` (None: the graph as it is; see the module)."""
    dtype = check_table_dtype(dtype)
    tables = {v.name for v in narrowed(graph, dtype)}
    if not tables:
        return graph
    reads = {node.dst.name for block in graph.blocks for node in block.walk()
             if isinstance(node, ir.CacheRead) and node.src.base in tables}
    taken = {v.name for v in graph.vars} | set(graph.temporaries)
    numbers = itertools.count(max((n.index for b in graph.blocks for n in b.walk()), default=-1) + 1)

    def fresh(base: str) -> str:
        name, k = f"{base}_{dtype}", 2
        while name in taken:
            name, k = f"{base}_{dtype}_{k}", k + 1
        taken.add(name)
        return name

    def source_of(name: str):
        """(dtype, dims) of a write's source: a declared variable or a temporary."""
        decl = graph.var(name) or graph.temporaries.get(name)
        return (decl.dtype, decl.dims) if decl is not None else (None, None)

    def rewrite(nodes: tuple[ir.Node, ...], declare: list) -> tuple[ir.Node, ...]:
        out: list[ir.Node] = []
        for node in nodes:
            if isinstance(node, ir.Loop):
                out.append(replace(node, body=rewrite(node.body, declare)))
                continue
            if isinstance(node, ir.Assign) and node.name in reads and node.dtype in FLOATS:
                out.append(replace(node, dtype=dtype))
                continue
            if isinstance(node, ir.CacheWrite) and node.dst.base in tables and node.src.indices is None:
                src_dtype, dims = source_of(node.src.name)
                if src_dtype in FLOATS and src_dtype != dtype:
                    name = fresh(node.src.name)
                    declare.append(ir.Assign(index=next(numbers), span=node.span, name=name, dtype=dtype, dims=dims))
                    out.append(ir.Op(index=next(numbers), span=node.span, op="cast", inputs=(node.src,),
                                     attrs=(ir.Attr("to", ir.Literal("dtype", dtype), node.span),), output=name,
                                     output_span=node.span))
                    node = replace(node, src=ir.VarRef(name, node.src.span))
            out.append(node)
        return tuple(out)

    blocks = []
    for block in graph.blocks:
        declare: list[ir.Assign] = []
        nodes = rewrite(block.nodes, declare)
        blocks.append(replace(block, nodes=tuple(declare) + nodes))  # the new temporaries first, as a graph declares them
    variables = tuple(replace(v, dtype=dtype) if v.name in tables or (v.name in reads and v.dtype in FLOATS) else v
                      for v in graph.vars)
    return replace(graph, vars=variables, blocks=tuple(blocks))


def explained(diagnostics: list[Diagnostic], graph: ir.Graph, dtype: str | None) -> list[Diagnostic]:
    """The checker's diagnostics of a graph narrowed by `narrow_tables(graph, dtype)`, each error
    with a note at the first table it narrowed: why a value read from a table has that dtype."""
    tables = narrowed(graph, dtype)
    if not tables:
        return diagnostics
    names = ", ".join(t.name for t in tables)
    note = (f"table_dtype {dtype} (--table-dtype / --kv-dtype) stores the cache tables {names} in {dtype}: a "
            f"cache.read from one gives {dtype} values (OpenInfer's ops take inputs of one dtype; "
            f"`op cast(..., to=...)` converts)")
    return [replace(d, related=d.related + ((note, tables[0].span),)) if d.severity == "error" else d
            for d in diagnostics]
