"""The graph IR: frozen dataclasses for variables, blocks and nodes, each with its source span.

The parser builds it (the IR doubles as the AST: the Lark tree is the concrete syntax);
every later stage (checker, model binding, lowering, interpreter) reads it and nothing
mutates it. Node `index` is OpenInfer's node number (single graph-wide counter in source
order; a loop's body is numbered before the loop node itself, §1.4): the node's stable id, unique
in its graph (the grammar's builder and the graph-JSON loader assign it; the checker's results
are keyed by it, `CheckedGraph.op_sigs`), kept by `dataclasses.replace`.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Iterator, Union


# nesting limits (one definition: the parser, the checker and the lowering read them)
MAX_LOOP_DEPTH = 32  # loops inside loops
MAX_RANK = 64  # dimensions of one value (NumPy's limit)


@dataclass(frozen=True)
class Span:
    """Where something starts in the source (1-based line and column). A graph read from graph
    JSON has no lines (line 0) and names the place by its JSON pointer (RFC 6901):
    `g.json#/blocks/entry/nodes/1`."""

    path: str
    line: int
    col: int
    pointer: str = ""


NO_SPAN = Span("<unknown>", 0, 0)


class MemKind(str, Enum):
    DYNAMIC = "dynamic"
    VOLATILE = "volatile"
    CONSTANT = "constant"
    PERSISTENT = "persistent"


IndexValue = Union[int, str]  # integer literal or identifier (loop index, sizevar, persistent scalar)


@dataclass(frozen=True)
class Dim:
    """A declared dimension: one atom, or the product of two (`B*D`, `3*D`). Atoms: int or sizevar."""

    atoms: tuple[IndexValue, ...]

    def __str__(self) -> str:
        return "*".join(str(a) for a in self.atoms)

    def resolve(self, sizes: dict[str, int]) -> int:
        """The dim's value; KeyError(name) for an unknown size variable."""
        value = 1
        for atom in self.atoms:
            value *= atom if isinstance(atom, int) else sizes[atom]
        return value

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a for a in self.atoms if isinstance(a, str))


class _AsWritten:
    """A number that remembers how its literal was written, so that `fmt` writes it back
    unchanged (mixed into IntLit and FloatLit). Used only where the text is not the plain form."""

    def __new__(cls, value, text: str):
        obj = super().__new__(cls, value)
        obj.text = text
        return obj

    def __reduce__(self):
        return type(self), (self._number(self), self.text)

    def __str__(self) -> str:  # fmt and messages show the literal as written
        return self.text


class IntLit(_AsWritten, int):
    """An integer literal's value with its text (`0x10`, `255u8`, `1_000`)."""

    _number = int


class FloatLit(_AsWritten, float):
    """A float literal's value with its text (`2.5f32`, `1_000.0`)."""

    _number = float


def literal_text(value) -> str | None:
    """How a number was written, when that is not its plain form (IntLit / FloatLit), else None."""
    return getattr(value, "text", None)


@dataclass(frozen=True)
class Literal:
    """A literal value with its kind as written: float | int | bool | str | int_list | var | dtype |
    dtype_list (`acc=[A, O]`, SPEC-2026-03 §1.3)."""

    kind: str
    value: object  # float, int, bool, str, tuple[int, ...], variable name, dtype name, tuple of dtype names


@dataclass(frozen=True)
class VarDecl:
    """One declaration in a memory section."""

    name: str
    kind: MemKind
    dtype: str
    dims: tuple[Dim, ...]
    span: Span
    init: Literal | None = None  # kind float | int | bool
    ref: str | None = None
    pattern: str | None = None
    index_params: tuple[str, ...] = ()
    table: bool = False
    auto_dim: tuple[str, ...] = ()
    fixed: tuple[tuple[str, int | str], ...] = ()  # index name -> size: an int or a size variable
    # spans of the attributes, by attribute name ("init", "ref", ...), for diagnostics
    attr_spans: tuple[tuple[str, Span], ...] = ()

    @property
    def is_scalar(self) -> bool:
        return len(self.dims) == 0

    @property
    def is_table(self) -> bool:
        """A cache table: `@table` with index params (§4)."""
        return self.table and bool(self.index_params)

    @property
    def is_prefix_table(self) -> bool:
        """A model tensor family `W(l): ... @pattern(...)` (§2.4)."""
        return self.pattern is not None and bool(self.index_params) and not self.table

    @property
    def is_auto_dim(self) -> bool:
        return bool(self.auto_dim) and not self.table

    @property
    def table_indices(self) -> tuple[str, ...]:
        """Index params minus the auto_dim names (§4)."""
        return tuple(p for p in self.index_params if p not in self.auto_dim)

    def fixed_sizes(self, sizes) -> dict[str, int]:
        """`@fixed` sizes by index name, a size variable (`@fixed(i=T)`) resolved in `sizes`;
        KeyError(name) for an unknown size variable (the checker reports it first)."""
        return {k: v if isinstance(v, int) else int(sizes[v]) for k, v in self.fixed}

    def shape(self, sizes: dict[str, int]) -> tuple[int, ...]:
        """Resolved (base) shape; KeyError(name) for an unknown size variable."""
        return tuple(d.resolve(sizes) for d in self.dims)

    def attr_span(self, name: str) -> Span:
        return dict(self.attr_spans).get(name, self.span)


# ---------------------------------------------------------------- references and cache access


@dataclass(frozen=True)
class VarRef:
    """A variable use: `x`, or a prefix-table member `W[l]` / `QKV[0, h]` (indices not None)."""

    name: str
    span: Span
    indices: tuple[IndexValue, ...] | None = None

    def __str__(self) -> str:
        if self.indices is None:
            return self.name
        return f"{self.name}[{', '.join(str(i) for i in self.indices)}]"


@dataclass(frozen=True)
class LiteralInput:
    """A scalar literal as an op input (`op mul(x, 0.125)`, `op add(i, -1)`): an oi2jax extension
    (docs/semantics.md). `value` is a `Literal` of kind float | int | bool (its text kept as written,
    `IntLit` / `FloatLit`); `dtype` is the one its suffix names (`2.0f32`, `3i8`), else None and the
    checker gives it the dtype of the op's first input that has one (`CheckedGraph.literal`)."""

    value: Literal
    span: Span
    dtype: str | None = None


@dataclass(frozen=True)
class Single:
    """One cache index position holding a single index."""

    value: IndexValue  # ints may be negative (validation rejects them, §4.1)


@dataclass(frozen=True)
class Slice:
    """A slice position `a..b` / `a..` / `..b` / `..` (bounds None when omitted)."""

    start: IndexValue | None = None
    end: IndexValue | None = None


@dataclass(frozen=True)
class CacheAccess:
    """`A`, `A[]`, `A[i, j]`, `A[a..b]` (bracketed False only for the bare name)."""

    base: str
    span: Span
    indices: tuple[Single | Slice, ...] = ()
    bracketed: bool = False


# ---------------------------------------------------------------- nodes


@dataclass(frozen=True, kw_only=True)
class Node:
    index: int
    span: Span


@dataclass(frozen=True, kw_only=True)
class Assign(Node):
    name: str
    dtype: str
    dims: tuple[Dim, ...]


@dataclass(frozen=True)
class Attr:
    name: str
    value: Literal
    span: Span


@dataclass(frozen=True, kw_only=True)
class Op(Node):
    op: str
    inputs: tuple[VarRef | LiteralInput, ...]
    attrs: tuple[Attr, ...]
    output: str
    output_span: Span

    @property
    def refs(self) -> tuple[VarRef, ...]:
        """The inputs that read a variable (every input but the literals)."""
        return tuple(r for r in self.inputs if isinstance(r, VarRef))

    @property
    def attr_map(self) -> dict[str, Literal]:
        return {a.name: a.value for a in self.attrs}


@dataclass(frozen=True, kw_only=True)
class CacheRead(Node):
    src: CacheAccess
    dst: VarRef


@dataclass(frozen=True, kw_only=True)
class CacheWrite(Node):
    src: VarRef
    dst: CacheAccess


@dataclass(frozen=True, kw_only=True)
class CacheIncrement(Node):
    target: str
    amount: int = 1
    explicit_amount: bool = False  # `cache.increment 1 x` vs `cache.increment x`


@dataclass(frozen=True, kw_only=True)
class CacheDecrement(Node):
    target: str
    amount: int = 1
    explicit_amount: bool = False


@dataclass(frozen=True, kw_only=True)
class CacheReset(Node):
    target: CacheAccess


@dataclass(frozen=True, kw_only=True)
class Branch(Node):
    """`branch c then else;` (cond set) or `branch target;` (cond and else_block None)."""

    cond: str | None
    then_block: str
    else_block: str | None = None


@dataclass(frozen=True, kw_only=True)
class Barrier(Node):
    pass


@dataclass(frozen=True, kw_only=True)
class Dep(Node):
    after: str  # dotted names joined with "."
    before: str


@dataclass(frozen=True, kw_only=True)
class Loop(Node):
    name: str
    var: str
    start: IndexValue
    end: IndexValue
    body: tuple[Node, ...]


@dataclass(frozen=True, kw_only=True)
class Yield(Node):
    vars: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Await(Node):
    vars: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Transfer(Node):
    src: VarRef
    dst: VarRef


@dataclass(frozen=True, kw_only=True)
class Return(Node):
    vars: tuple[str, ...] = ()  # empty: bare `return;`


def ends_frame(node: Node, block: str) -> bool:
    """THE rule of what ends a frame (§3.3-§3.5): `return`, and `yield` outside entry (a consumer's
    or a called block's terminator). In a loop body either ends just the loop (a `break`:
    execution goes on after the loop node); elsewhere, the block. The lowering of blocks and loops
    and the interpreter read it."""
    return isinstance(node, Return) or (isinstance(node, Yield) and block != "entry")


NODE_TYPES: tuple[type, ...] = (Assign, Op, CacheRead, CacheWrite, CacheIncrement, CacheDecrement, CacheReset,
                                Branch, Barrier, Dep, Loop, Yield, Await, Transfer, Return)
"""Every node type (THE list: the visitors below and tests/test_node_tables.py read it)."""


class NodeVisitor:
    """Dispatch on a node's type: `visit(node, *args)` calls `self.visit_<Type>(node, *args)`.

    Every `visit_<Type>` of this base raises `NotImplementedError`, so a pass that subclasses it
    and forgets a node type fails loudly on that type instead of passing it silently;
    tests/test_node_tables.py checks that every subclass overrides every one. A pass that treats
    several types alike says so by naming each (`visit_Barrier = visit_Dep = _nothing`)."""

    __slots__ = ()

    def visit(self, node: Node, *args, **kwargs):
        name = _VISIT.get(type(node))
        if name is None:
            raise NotImplementedError(f"{type(node).__name__} not handled by {type(self).__name__} "
                                      f"(not in ir.NODE_TYPES)")
        return getattr(self, name)(node, *args, **kwargs)

    @classmethod
    def unhandled(cls) -> list[str]:
        """The node types this visitor class leaves to the base (each raises): [] when complete."""
        return [t.__name__ for t in NODE_TYPES if getattr(cls, _VISIT[t]) is getattr(NodeVisitor, _VISIT[t])]


def _unhandled(self, node: Node, *args, **kwargs):
    raise NotImplementedError(f"{type(node).__name__} not handled by {type(self).__name__}")


_VISIT = {t: f"visit_{t.__name__}" for t in NODE_TYPES}
for _name in _VISIT.values():
    setattr(NodeVisitor, _name, _unhandled)
del _name


# ---------------------------------------------------------------- graph


@dataclass(frozen=True)
class Block:
    name: str
    nodes: tuple[Node, ...]
    span: Span

    def walk(self) -> Iterator[Node]:
        """Every node, loop bodies included (pre-order: loop node before its body)."""
        yield from walk(self.nodes)


def walk(nodes: tuple[Node, ...]) -> Iterator[Node]:
    for node in nodes:
        yield node
        if isinstance(node, Loop):
            yield from walk(node.body)


@dataclass(frozen=True)
class Graph:
    """A parsed program: declarations and blocks in source order."""

    vars: tuple[VarDecl, ...]
    blocks: tuple[Block, ...]
    path: str = "<string>"
    source: str = ""

    @cached_property
    def var_map(self) -> dict[str, VarDecl]:
        return {v.name: v for v in self.vars}

    @cached_property
    def block_map(self) -> dict[str, Block]:
        return {b.name: b for b in self.blocks}

    @cached_property
    def temporaries(self) -> dict[str, Assign]:
        """`assign` temporaries by name (first assign wins; duplicates are a checker error)."""
        temps: dict[str, Assign] = {}
        for block in self.blocks:
            for node in block.walk():
                if isinstance(node, Assign):
                    temps.setdefault(node.name, node)
        return temps

    def var(self, name: str) -> VarDecl | None:
        return self.var_map.get(name)

    def block(self, name: str) -> Block | None:
        return self.block_map.get(name)

    @property
    def entry(self) -> Block | None:
        return self.block_map.get("entry")

    def vars_of(self, kind: MemKind) -> list[VarDecl]:
        return [v for v in self.vars if v.kind == kind]
