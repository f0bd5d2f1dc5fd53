"""The 47 built-in ops: OpenInfer's half of each declaration from `optable.json` (generated from
ops.json by tools/gen_optable.py), oi2jax's half (`Builtin`: kernel, shape rule, required
attributes, §6.3 value rules, acc=[A, O] rules) from the category modules' `OPS` tables.

One `OpDef` per op comes out (`builtins()`); nothing else knows an op by name.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping

from .. import dtypes as D
from .errors import OpTypeError
from .shapes import broadcast_shapes, normalize_axes
from .registry import DYNAMIC, AttrSpec, InputSpec, OpDef

_TABLE_PATH = Path(__file__).with_name("optable.json")

_I64_MIN, _I64_MAX, _U64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
_F64_MAX = 1.7976931348623157e308


def _is_float(dtype) -> bool:
    return dtype is not None and D.get(dtype).is_float


def _unsigned(dtype) -> bool:
    return dtype is not None and D.get(dtype).family in (D.UNSIGNED, D.BITSET)


# OpenInfer's attribute definitions (ops.json attr_defs) with their defaults (SPEC §6.4), which
# depend on the first input's dtype for a few. One entry per attribute, shared by every op using it.
ATTR_DEFAULTS: Mapping[str, object] = MappingProxyType({
    "div_by_zero_mask": lambda d: float("nan") if _is_float(d) else 0,
    "alpha": lambda d: 0.0 if _is_float(d) else 0,
    "clamp_max": lambda d: float("inf") if _is_float(d) else _I64_MAX,
    "min": lambda d: -_F64_MAX if _is_float(d) else (0 if _unsigned(d) else _I64_MIN),
    "max": lambda d: _F64_MAX if _is_float(d) else (_U64_MAX if _unsigned(d) else _I64_MAX),
    "keepdims": False,
    "select_first": True,
    "saturate": True,
    "rounding_mode": "trunc",
})


@dataclass(frozen=True)
class Builtin:
    """oi2jax's half of a built-in op's declaration (the other half is its ops.json entry).

    shape: 'elementwise' (unary: the input's; n-ary: broadcast when the schema allows it, else
    identical), 'scalar', 'matmul', 'reduce', or a callable. runtime_shape: the op maps a
    runtime-shaped operand to a result of that shape (defaults to the category's rule)."""

    kernel: Callable
    shape: str | Callable = "elementwise"
    runtime_shape: bool | None = None
    required: tuple[str, ...] = ()
    value_rules: Mapping[str, str] = field(default_factory=dict)  # attr -> 'dtype' | 'int' (§6.3)
    acc_rules: tuple[tuple[str, str], ...] = ()
    acc_kernel: Callable | None = None
    check: Callable | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)


# categories whose ops are elementwise with every other operand a scalar or of the same shape
# (SPEC.md §0 item 12, revised: reads of @auto_dim tensors)
_RUNTIME_SHAPE_CATEGORIES = frozenset({"arithmetic", "bitwise", "casting", "rounding", "comparison", "mutation",
                                       "statistics"})


# ------------------------------------------------------------------------------- shape rules

def _lit_value(v):
    return getattr(v, "value", v)


def shape_elementwise(broadcast: bool, op: str):
    def rule(shapes, attrs):
        if any(s is None for s in shapes):
            return None
        shapes = [tuple(s) for s in shapes]
        if len(shapes) == 1:
            return shapes[0]
        if broadcast:
            out = shapes[0]
            for s in shapes[1:]:
                out = broadcast_shapes(out, s)
            return out
        if any(s != shapes[0] for s in shapes[1:]):
            raise OpTypeError(f"op {op} does not allow broadcast inputs",
                              input=next(i for i, s in enumerate(shapes) if s != shapes[0]))
        return shapes[0]
    return rule


def shape_scalar(shapes, attrs):
    return ()


def shape_matmul(shapes, attrs):
    if any(s is None for s in shapes):
        return None
    a, b = (tuple(s) for s in shapes)
    if len(a) < 2 or len(b) < 2:
        raise OpTypeError("matmul expects inputs with rank >= 2", input=0 if len(a) < 2 else 1)
    if a[-1] != b[-2]:
        raise OpTypeError(f"matmul inner dim mismatch: {a[-1]} vs {b[-2]}", input=1)
    return broadcast_shapes(a[:-2], b[:-2]) + (a[-2], b[-1])


_FIRST_ELEMENT = frozenset({"max_axis", "min_axis", "argmax_axis", "argmin_axis"})  # no value for no element


def shape_reduce(op: str, axis_attr: str):
    def rule(shapes, attrs):
        keep, value = attrs.get("keepdims", False), attrs[axis_attr]
        if shapes[0] is None or keep is DYNAMIC or value is DYNAMIC:
            return None
        shape = tuple(shapes[0])
        keepdims = bool(keep)
        axes = normalize_axes(op, [int(value)] if axis_attr == "axis" else value, len(shape))
        empty = next((a for a in axes if shape[a] == 0), None)
        if empty is not None and op in _FIRST_ELEMENT and all(d for i, d in enumerate(shape) if i not in axes):
            raise OpTypeError(f"op {op} over an empty axis: axis {empty} of the input {list(shape)} has length 0, "
                              f"and an empty group has no first element to start from (SPEC §6.4)", attr=axis_attr)
        if keepdims:
            return tuple(1 if i in axes else d for i, d in enumerate(shape))
        return tuple(d for i, d in enumerate(shape) if i not in axes)
    return rule


def _out_dtype_rule(type_rule: Mapping):
    kind = type_rule["kind"]
    if kind == "fixed":
        fixed = type_rule["dtype"]
        return lambda in_dtypes, attrs: fixed
    if kind == "acc_from_attr":
        attr = type_rule["attr"]
        return lambda in_dtypes, attrs: str(_lit_value(attrs[attr]))
    index = type_rule.get("index", 0)
    return lambda in_dtypes, attrs: in_dtypes[index]


def _category_tables() -> dict[str, Builtin]:
    # cycle: each category module imports this one (Builtin)
    from . import (arithmetic, bitwise, casting, comparison, filter, mutation, numerical, reduction, rounding,
                   statistics)
    out: dict[str, Builtin] = {}
    for mod in (arithmetic, numerical, statistics, rounding, bitwise, comparison, filter, mutation, reduction,
                casting):
        out.update(mod.OPS)
    return out


@functools.lru_cache(maxsize=None)
def builtins() -> tuple[OpDef, ...]:
    """The 47 built-in ops, in ops.json order."""
    table = json.loads(_TABLE_PATH.read_text())
    defs = table["attr_defs"]
    decls = _category_tables()
    out = []
    for name, e in table["ops"].items():
        b = decls[name]
        attrs = {}
        for a in e["attrs"]:
            d = defs[a]
            attrs[a] = AttrSpec(a, d["kind"], ATTR_DEFAULTS.get(a), a in b.required, b.value_rules.get(a),
                                tuple(d.get("scalar_kinds", ())))
        if b.shape == "elementwise":
            shape = shape_elementwise(e["broadcast"], name)
        elif b.shape == "scalar":
            shape = shape_scalar
        elif b.shape == "matmul":
            shape = shape_matmul
        elif b.shape == "reduce":
            shape = shape_reduce(name, "axes" if "axes" in attrs else "axis")
        else:
            shape = b.shape
        runtime = b.runtime_shape if b.runtime_shape is not None else e["category"] in _RUNTIME_SHAPE_CATEGORIES
        first = InputSpec("a" if e["arity"] > 1 else "x", frozenset(e["normal"]))
        rest = tuple(InputSpec("abcd"[i] if e["arity"] > 1 else f"x{i}") for i in range(1, e["arity"]))
        out.append(OpDef(
            name=name, category=e["category"], inputs=(first,) + rest, attrs=MappingProxyType(attrs),
            kernel=b.kernel, out_dtype=_out_dtype_rule(e["type_rule"]), shape=shape,
            type_rule=MappingProxyType(dict(e["type_rule"])), broadcast=e["broadcast"], inplace=e["inplace"],
            accumulate=e["accumulate"], accumulate_pairs=frozenset(tuple(p) for p in e["accumulate_pairs"]),
            acc_rules=b.acc_rules, acc_kernel=b.acc_kernel, output_dtypes=frozenset(e.get("output_dtypes", ())), elementwise=runtime,
            aliases=MappingProxyType(dict(b.aliases)), check=b.check,
        ))
    return tuple(out)
