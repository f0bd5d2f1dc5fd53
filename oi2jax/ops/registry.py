"""THE op registry: every op, built-in or added, is one `OpDef`, and a `Registry` is a value.

An `OpDef` carries everything the checker, the lowering, the interpreter, fmt, graph JSON, the
docs and the tests need: the OpenInfer schema fields (arity, attributes, broadcast / inplace /
accumulate, type rule, dtype support), per-input dtype rules, attribute kinds with defaults and
which are required, an output dtype rule, an output shape rule *or* "from the kernel"
(`jax.eval_shape`), the JAX kernel and an optional NumPy reference. No op name appears in an `if`
anywhere else: the rules that differ between ops are fields here.

The 47 built-in ops are generated from OpenInfer's ops.json (`optable.json`, tools/gen_optable.py)
joined with each category module's `OPS` table (kernel and oi2jax's part of the declaration:
ops/builtin.py). Added ops (the bundled `nn` set, user files, installed packages) are declared
with `@oi2jax.ops.op(...)` (ops/define.py) and loaded into a registry by `ops.load(...)`
(ops/loading.py). A registry is passed through compilation (`oi2jax.compile(..., ops=...)`);
nothing mutates a global one.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Iterable, Iterator, Mapping

from .. import dtypes as D
from ..diagnostics import suggest
from .errors import OpTypeError

ROUNDING_MODES = ("trunc", "floor", "ceil", "nearest")

# attribute kinds: OpenInfer's four (SPEC §6 intro) and the typed kinds of added ops
ATTR_KINDS = ("dtype", "scalar", "int_list", "string", "float", "int", "bool")

# named dtype groups an added op may use for an input's dtypes
DTYPE_GROUPS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "float": ("f16", "bf16", "f32", "f64"),
    "float8": ("f8", "f16", "bf16", "f32", "f64"),
    "signed": D.SIGNED_INTS,
    "unsigned": D.UNSIGNED_INTS,
    "int": D.SIGNED_INTS + D.UNSIGNED_INTS,
    "index": D.SIGNED_INTS + D.UNSIGNED_INTS,
    "bool": ("bool",),
    "numeric": ("f16", "bf16", "f32", "f64") + D.SIGNED_INTS + D.UNSIGNED_INTS,
    "any": tuple(D.DTYPES),
})


@dataclass(frozen=True)
class AttrSpec:
    """One attribute of one op.

    kind: 'dtype' | 'scalar' (OpenInfer's: float/int/uint/bool, literal or a variable) | 'int_list'
    (literal ints or size variables) | 'string' | 'float' | 'int' | 'bool' (added ops: a literal or a
    scalar variable of that kind). `default`: a value, or `callable(first input dtype) -> value`;
    None with `required=False` means "absent" (the kernel sees no entry). `value_rule`: SPEC §6.3's
    consumers: 'dtype' (the value's kind follows the first input's dtype) or 'int' (integers only)."""

    name: str
    kind: str
    default: object = None
    required: bool = False
    value_rule: str | None = None
    scalar_kinds: tuple[str, ...] = ()
    doc: str = ""
    static: bool = False  # a literal only: the value fixes a shape (an axis), a variable is an error
    # a variable may hold one value per row: True (any shape; the kernel checks it against its inputs), or a
    # rule `(input shapes, static settings) -> (the rows' shape, what they are)` the checker applies too
    rows: object = False

    def default_for(self, dtype: str | None):
        return self.default(dtype) if callable(self.default) else self.default


@dataclass(frozen=True)
class InputSpec:
    """One input. `dtypes`: the dtypes it accepts; None: exactly the first input's dtype
    (OpenInfer's rule for every built-in op's inputs after the first)."""

    name: str
    dtypes: frozenset[str] | None = None
    optional: bool = False  # a trailing input a node may leave out (`op linear(x, W)` or `op linear(x, W, b)`)


# JAX platform names of accelerators: a program lowered for one gets the accelerator forms (the
# loop policy's unrolling, lowering/loops.py; attention's one pass over a table, ops/nn/attention.py)
ACCELERATORS = ("gpu", "cuda", "rocm", "tpu")


@dataclass(frozen=True)
class Ctx:
    """What a kernel knows besides inputs and attrs.

    `fail_if(cond, message, value=0)`: a runtime error of this op node where `cond` (a traced bool)
    holds, e.g. an embedding id out of range: the compiled step records it as a guard (reported
    with the node's location and step, no write after it lost, docs/decode.md) and the interpreter
    raises it at once. `message` may contain `{value}`, replaced by `value` (an integer)."""

    op: str
    in_dtypes: tuple[str, ...]
    out_dtype: str
    mode: str  # normal | inplace | accumulate
    guards: list | None = field(default=None, compare=False, repr=False)
    precision: str = "highest"  # the program's float matmul precision (CompileOptions.precision)
    platform: str = "cpu"  # the JAX platform the program is lowered for (LoopPolicy.platform)
    kernels: str = "jax"  # the program's kernel set (CompileOptions.kernels): "ggml" opts into ggml's

    @property
    def dtype(self) -> str:
        return self.in_dtypes[0]

    @property
    def accelerator(self) -> bool:
        return self.platform in ACCELERATORS

    def fail_if(self, cond, message: str, value=0) -> None:
        if self.guards is not None:  # None: traced for its shape only (jax.eval_shape)
            self.guards.append((cond, message, value))


def attr_variable_value(op: "OpDef", name: str, value):
    """A setting given as a variable, as the kernel takes it: a 0-d value, or as held where the
    setting takes one value per row (`AttrSpec.rows`, checked by checks/ops)."""
    spec = op.attrs.get(name)
    return value if spec is not None and spec.rows else value.reshape(())


@dataclass(frozen=True)
class OpDef:
    """One op: its whole contract (see the module docstring).

    kernel(inputs: list[jax.Array], attrs: dict, ctx: Ctx) -> jax.Array, in the value
    representation of docs/architecture.md; attrs hold every attribute with a value (defaults
    applied). out_dtype(in_dtypes, attrs) -> str (attrs: name -> ir.Literal or Python value).
    shape(in_shapes, attrs) -> tuple (attrs: static Python values) raising OpTypeError, or None:
    the output shape comes from the kernel (`jax.eval_shape`). `check(in_dtypes, out_dtype, attrs)`:
    an extra rule (cast's pairs). `reference(inputs, attrs, ctx)`: a NumPy formulation for the tests
    (and the interpreter of an added op); `samples(rng, dtype) -> [(inputs, attrs)]`: test cases."""

    name: str
    category: str
    inputs: tuple[InputSpec, ...]
    attrs: Mapping[str, AttrSpec]
    kernel: Callable
    out_dtype: Callable
    shape: Callable | None
    type_rule: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({"kind": "same_as_input",
                                                                                      "index": 0}))
    broadcast: bool = False
    inplace: bool = False
    accumulate: bool = False
    accumulate_pairs: frozenset[tuple[str, str]] = frozenset()
    acc_rules: tuple[tuple[str, str], ...] = ()  # acc=[A, O] (SPEC-2026-03 §2.2)
    acc_kernel: Callable | None = None  # acc=[A, O] computed otherwise than "kernel in A, then to O"
    output_dtypes: frozenset[str] = frozenset()
    elementwise: bool = False  # the output takes its operand's (runtime) shape (phases.runtime_shaped)
    # inputs whose kernel also takes a weight kept in GGML blocks (a `quantized.QuantTensor`); any
    # other input is given such a constant dequantized (the lowering decides: docs/models.md)
    quantized_inputs: frozenset[str] = frozenset()
    aliases: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    check: Callable | None = None
    reference: Callable | None = None
    samples: Callable | None = None
    doc: str = ""
    source: str = "the built-in ops (OpenInfer's ops.json)"  # where it is defined: "FILE:LINE" for added ops
    op_set: str = "builtin"

    @property
    def arity(self) -> int:
        """The most inputs a node may give (`min_arity` the fewest: the trailing inputs are optional)."""
        return len(self.inputs)

    @property
    def min_arity(self) -> int:
        return sum(1 for i in self.inputs if not i.optional)

    @property
    def normal_dtypes(self) -> frozenset[str]:
        return self.inputs[0].dtypes

    @property
    def builtin(self) -> bool:
        return self.op_set == "builtin"

    def attr_default(self, name: str, dtype: str | None = None):
        return self.attrs[name].default_for(dtype)

    def where(self) -> str:
        """`op NAME (defined in FILE:LINE)` for an added op's messages; `op NAME` for a built-in."""
        return f"op {self.name}" if self.builtin else f"op {self.name} (defined in {self.source})"



class _Dynamic:
    """An attribute whose value is only known at run time (a variable), as a shape rule sees it."""

    def __repr__(self) -> str:
        return "DYNAMIC"


DYNAMIC = _Dynamic()


class Registry(Mapping[str, OpDef]):
    """An immutable name -> OpDef mapping. `extend(defs)` returns a new registry; a name defined
    twice is an error naming both definitions."""

    def __init__(self, defs: Iterable[OpDef] = (), sets: tuple[str, ...] = ()):
        table: dict[str, OpDef] = {}
        for d in defs:
            _add(table, d)
        self._table = MappingProxyType(table)
        self.sets = tuple(sets)  # the op sets loaded besides the built-ins, in order

    def __getitem__(self, name: str) -> OpDef:
        return self._table[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def __hash__(self) -> int:
        return hash(tuple(self._table))  # equal registries hold the same names

    def __eq__(self, other) -> bool:
        return isinstance(other, Registry) and dict(self._table) == dict(other._table)

    def extend(self, defs: Iterable[OpDef], set_name: str | None = None) -> "Registry":
        table = dict(self._table)
        for d in defs:
            _add(table, d)
        sets = self.sets + ((set_name,) if set_name and set_name not in self.sets else ())
        out = Registry.__new__(Registry)
        out._table = MappingProxyType(table)
        out.sets = sets
        return out

    def added(self) -> list[OpDef]:
        """The ops that are not built in, in load order."""
        return [d for d in self._table.values() if not d.builtin]

    def __repr__(self) -> str:
        return f"Registry({len(self)} ops; sets: {', '.join(('builtin',) + self.sets)})"


def _add(table: dict, d: OpDef) -> None:
    old = table.get(d.name)
    if old is not None and old is not d:
        raise OpTypeError(f"op {d.name} is defined twice: in {old.source} and in {d.source}")
    table[d.name] = d


def dtype_set(spec, what: str) -> frozenset[str] | None:
    """An input's dtypes from a declaration: a group name ('float', 'int', ...), a dtype name, an
    iterable of either, 'same' / None (the first input's dtype)."""
    if spec is None or spec == "same":
        return None
    items = (spec,) if isinstance(spec, str) else tuple(spec)
    out: list[str] = []
    for item in items:
        if item in DTYPE_GROUPS:
            out.extend(DTYPE_GROUPS[item])
        elif D.is_dtype(item):
            out.append(item)
        else:
            raise OpTypeError(f"{what}: unknown dtype or dtype group {item!r}"
                              f"{suggest(item, list(DTYPE_GROUPS) + list(D.DTYPES))}")
    return frozenset(out)


@functools.lru_cache(maxsize=None)
def builtin_registry() -> Registry:
    """The 47 built-in ops (OpenInfer's), the base of every registry."""
    from .builtin import builtins  # cycle: builtin.py imports this module (OpDef, AttrSpec)
    return Registry(builtins())


def __getattr__(name):  # REGISTRY: the built-in registry, built on first use
    if name == "REGISTRY":
        return builtin_registry()
    raise AttributeError(name)
