"""Static op typing: `infer(...)` checks one op node against its `OpDef` and computes its mode,
dtype and shape. Every rule that differs between ops is a field of the op's declaration.

Messages use the SPEC §3.10 wording where the reference has one; the stricter checks of
§0 item 12 (input dtypes, shapes, attribute values §6.3) use plain DSL words.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import numpy as np

from .. import dtypes as D
from .. import messages
from ..diagnostics import suggest
from ..ir import Literal
from . import accumulate
from .casting import cast_allowed
from .errors import OpTypeError
from .shapes import broadcast_shapes, normalize_axes
from .registry import DYNAMIC, ROUNDING_MODES, OpDef, Registry, builtin_registry

__all__ = ["OpSig", "infer", "cast_allowed", "canonical_attrs", "broadcast_shapes", "normalize_axes", "DYNAMIC",
           "bool_only"]


@dataclass(frozen=True)
class OpSig:
    mode: str  # normal | inplace | accumulate (acc=DTYPE, SPEC §6.2) | acc_rule (acc=[A, O], SPEC-2026-03 §2)
    out_dtype: str
    out_shape: tuple[int, ...] | None
    op: OpDef | None = field(default=None, compare=False, repr=False)  # the declaration it was typed against
    # the attributes that may name sizes, resolved: an int list (`reshape(x, shape=[H, HD])`) to its
    # tuple, a static int given as a size name (`top_k(x, k=K)`) to its int
    int_lists: Mapping[str, tuple[int, ...] | int] = field(default_factory=lambda: MappingProxyType({}), compare=False,
                                                     repr=False)


def canonical_attrs(spec: OpDef, attrs: dict) -> dict:
    """Apply the op's attribute aliases (relu negative_slope -> alpha)."""
    if not spec.aliases:
        return dict(attrs)
    out = {}
    for name, value in attrs.items():
        real = spec.aliases.get(name, name)
        if real in out:
            raise OpTypeError(f"duplicate setting: {real}", attr=name)
        out[real] = value
    return out


def _lit_value(lit) -> object:
    return lit.value if isinstance(lit, Literal) else lit


def _lit_kind(lit) -> str:
    if isinstance(lit, Literal):
        return lit.kind
    v = lit
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    if isinstance(v, (tuple, list)):
        return "dtype_list" if v and all(isinstance(x, str) and D.is_dtype(x) for x in v) else "int_list"
    return "var"


def bool_only(spec: OpDef, name: str) -> bool:
    """A setting declared true/false only (`scalar_kinds: ["bool"]`: keepdims, select_first and
    saturate, SPEC-2026-03 §2.5)."""
    a = spec.attrs.get(spec.aliases.get(name, name))
    return a is not None and a.kind == "scalar" and tuple(a.scalar_kinds) == ("bool",)


def _scalar_kind_ok(a, kind: str, value) -> bool:
    """A literal of `kind` is one of the setting's declared `scalar_kinds` (none declared: any)."""
    kinds = a.scalar_kinds
    return not kinds or kind not in ("float", "int", "bool") or kind in kinds or \
        (kind == "int" and value >= 0 and "uint" in kinds)


_KIND_OK = {
    "dtype": lambda kind, v: kind == "dtype" or (kind in ("var", "str") and D.is_dtype(str(v))),
    # keepdims/select_first/saturate: validation accepts any scalar kind (§11 item 30)
    "scalar": lambda kind, v: kind in ("float", "int", "bool", "var"),
    "int_list": lambda kind, v: kind == "int_list",
    "string": lambda kind, v: kind in ("str", "var"),
    "float": lambda kind, v: kind in ("float", "int", "var"),
    "int": lambda kind, v: kind in ("int", "var"),
    "bool": lambda kind, v: kind in ("bool", "var"),
}


def _check_attr_kind(spec: OpDef, name: str, lit) -> None:
    a = spec.attrs[name]
    kind, value = _lit_kind(lit), _lit_value(lit)
    if not _KIND_OK[a.kind](kind, value):
        if a.kind in ("float", "int", "bool"):
            raise OpTypeError(f"op {spec.name} setting {name} must be {_KIND_WORDS[a.kind]}, got {_shown(lit)}",
                              attr=name)
        raise OpTypeError(f"unsupported {spec.name} setting type: {name}", attr=name)
    if bool_only(spec, name):
        if kind not in ("bool", "var") and not (spec.builtin and kind == "int" and value in (0, 1)):
            # current OpenInfer takes only true/false (SPEC-2026-03 §2.5); 0/1 stay accepted (D3)
            raise OpTypeError(f"op {spec.name} setting {name} must be true or false, got {value!r}", attr=name)
    elif a.kind == "scalar" and not _scalar_kind_ok(a, kind, value):
        raise OpTypeError(f"op {spec.name} setting {name} must be {' or '.join(a.scalar_kinds)}, got {_shown(lit)}",
                          attr=name)
    if a.kind == "dtype" and not D.is_dtype(str(value)):
        raise OpTypeError(f"unknown dtype {value}", attr=name)


_KIND_WORDS = {"float": "a number", "int": "an integer", "bool": "true or false"}


def _shown(lit) -> str:
    kind, value = _lit_kind(lit), _lit_value(lit)
    return f"{kind} {value!r}" if kind in ("float", "int", "bool", "str") else repr(value)


def _check_attr_value(spec: OpDef, name: str, lit, dtype: str) -> None:
    """§6.3 value rules for literal (not variable-valued) scalar attributes."""
    kind, value = _lit_kind(lit), _lit_value(lit)
    if kind == "var":
        return
    op = spec.name
    if kind == "int" and value > (1 << 63) - 1:  # upstream reads a setting as an i64 (SPEC-2026-03 D1(c))
        raise OpTypeError(f"op {op} setting {name}: {value} is past i64's largest value, 9223372036854775807 "
                          f"(a setting is an i64, as upstream reads it: SPEC-2026-03 D1(c))", attr=name)
    rule = spec.attrs[name].value_rule
    if rule == "int":
        if kind == "float":
            raise OpTypeError(f"op {op} setting {name} must be an integer, got float {value!r}", attr=name)
        return
    if rule != "dtype":
        return
    dt = D.get(dtype)
    if dt.is_float:
        return  # float-ish consumer: float/int/uint/bool all fine
    if kind == "float":
        raise OpTypeError(f"op {op} setting {name} must be an integer for {dtype} inputs, got float {value!r}",
                          attr=name)
    if dt.family in (D.UNSIGNED, D.BITSET) and kind == "int" and value < 0:
        raise OpTypeError(f"op {op} setting {name} must be non-negative for unsigned dtype {dtype}, got {value}",
                          attr=name)


def check_rounding_mode(rm, source: str = "") -> None:
    """cast's rounding_mode (SPEC §6.4): a literal, or a model's metadata string (`source` names it)."""
    if rm not in ROUNDING_MODES:
        near = suggest(rm, ROUNDING_MODES) if isinstance(rm, str) else ""
        raise OpTypeError(f"unsupported cast rounding_mode {rm!r}{source} (expected trunc, floor, ceil or nearest)"
                          f"{near.replace(' (', '; ', 1).rstrip(')') if near else ''}", attr="rounding_mode")


def resolve_int_list(op: str, name: str, values, sizes) -> tuple[int, ...] | None:
    """An int-list attribute's values with size names replaced by their values; None when a size is
    not known yet (checking without sizes)."""
    out = []
    for v in values:
        if isinstance(v, str):
            neg = v.startswith("-")
            key = v[1:] if neg else v
            if sizes is None or key not in sizes:
                if sizes is not None and getattr(sizes, "strict", True):
                    raise OpTypeError(messages.op_unknown_size(op, name, key, sizes), attr=name)
                return None
            out.append(-int(sizes[key]) if neg else int(sizes[key]))
        else:
            out.append(int(v))
    return tuple(out)


def _size_named(a, lit) -> bool:
    """A static int setting given as a name: a size (`top_k(x, k=K)`; the checker refused a
    variable there: naming.setting_size_name)."""
    return a.static and a.kind == "int" and _lit_kind(lit) == "var"


def _static_attrs(spec: OpDef, attrs: dict, int_lists: dict, first: str) -> dict:
    """What a shape rule sees: literal values, resolved int lists, DYNAMIC for variables, defaults."""
    out = {}
    for name, a in spec.attrs.items():
        if name in attrs:
            lit = attrs[name]
            if a.kind == "int_list" or _size_named(a, lit):
                out[name] = int_lists.get(name, DYNAMIC)
            elif _lit_kind(lit) == "var" and a.kind not in ("dtype", "string"):
                out[name] = DYNAMIC
            else:
                out[name] = _lit_value(lit)
        else:
            d = a.default_for(first)
            if d is not None:
                out[name] = d
    return out


def arity_error(spec, n: int, op: str | None = None) -> str | None:
    """`op N expects Fixed(k) inputs, got m (x, y)` when `n` inputs do not fit `spec`, else None
    (the checker asks before typing literal inputs, so a surplus literal is reported as such)."""
    if spec.min_arity <= n <= spec.arity:
        return None
    names = ", ".join(i.name for i in spec.inputs)  # the SPEC's wording, then the inputs by name
    count = f"Fixed({spec.arity}) inputs, got {n} ({names})" if spec.min_arity == spec.arity else \
        f"{spec.min_arity} to {spec.arity} ({names}) inputs, got {n}"
    return f"op {op or spec.name} expects {count}"


def infer(op: str, in_dtypes: list[str], in_shapes: list, attrs: dict, out_name: str | None = None,
          in_names: list[str] | None = None, registry: Registry | None = None, sizes=None,
          attr_shapes: dict | None = None) -> OpSig:
    """Type one op node against `registry` (default: the built-in ops). `attrs` maps names to
    ir.Literal (plain Python values also accepted); `sizes` resolves size names in int lists;
    `attr_shapes`: the shape of each setting given as a variable (a setting of one value per
    row is checked against its rows: `AttrSpec.rows`)."""
    reg = registry if registry is not None else builtin_registry()
    spec = reg.get(op)
    if spec is None:
        raise OpTypeError(f"unsupported op {op}{suggest(op, reg)}")
    problem = arity_error(spec, len(in_dtypes), op)
    if problem is not None:
        raise OpTypeError(problem)
    attrs = canonical_attrs(spec, attrs)
    rule = None
    if "acc" in attrs and _lit_kind(attrs["acc"]) == "dtype_list":  # acc=[A, O]
        rule = tuple(_lit_value(attrs["acc"]))
        attrs = {k: v for k, v in attrs.items() if k != "acc"}
        if not spec.acc_rules:
            raise OpTypeError(f"op {op}: acc is not supported (no accumulation rules)", attr="acc")
    if "acc" in attrs and not spec.accumulate:
        raise OpTypeError(f"op {op} does not support accumulation", attr="acc")
    for name, lit in attrs.items():
        if name not in spec.attrs:
            near = suggest(name, spec.attrs)
            if not near and _lit_kind(lit) == "var":
                raise OpTypeError(messages.setting_not_an_input(op, name), attr=name)
            raise OpTypeError(f"unsupported {op} setting: {name}{near}", attr=name)
        _check_attr_kind(spec, name, lit)

    # mode
    writes_input = out_name is not None and in_names is not None and out_name in in_names
    if writes_input and not spec.inplace:
        raise OpTypeError(f"op {op} does not support inplace writes")
    mode = "accumulate" if "acc" in attrs else ("inplace" if writes_input else "normal")
    if rule is not None:
        mode = "acc_rule"

    # required attributes and attribute values
    for name, a in spec.attrs.items():
        if a.required and name not in attrs:
            raise OpTypeError(f"{op} requires {name} attribute", attr=name)
    int_lists = {}
    for name, lit in attrs.items():
        a = spec.attrs[name]
        if _size_named(a, lit):
            resolved = resolve_int_list(op, name, (_lit_value(lit),), sizes)
            if resolved is not None:
                int_lists[name] = resolved[0]
            continue
        if a.kind != "int_list":
            continue
        if name == "axes" and len(_lit_value(lit)) == 0:
            raise OpTypeError(f"{op} requires a non-empty axes list", attr="axes")
        resolved = resolve_int_list(op, name, _lit_value(lit), sizes)
        if resolved is not None:
            int_lists[name] = resolved
    if "rounding_mode" in attrs and _lit_kind(attrs["rounding_mode"]) == "str":
        check_rounding_mode(_lit_value(attrs["rounding_mode"]))

    # dtypes
    first = in_dtypes[0]
    if mode == "acc_rule":
        out_dtype = accumulate.check(spec, rule, first)
    elif mode == "accumulate":
        out_dtype = str(_lit_value(attrs["acc"]))
    else:
        out_dtype = spec.out_dtype(list(in_dtypes), attrs)
    if mode == "accumulate":
        if (first, out_dtype) not in spec.accumulate_pairs:
            raise OpTypeError(f"op {op} does not support {first} -> {out_dtype} for mode {mode}", attr="acc")
    elif mode != "acc_rule" and first not in spec.normal_dtypes:
        if spec.builtin:
            raise OpTypeError(f"op {op} does not support {first} -> {out_dtype} for mode {mode}", input=0)
        raise OpTypeError(f"{spec.where()} input 0 ({spec.inputs[0].name}) has dtype {first}, expected one of "
                          f"{_dtype_list(spec.normal_dtypes)}", input=0)
    for i, d in enumerate(in_dtypes[1:], start=1):
        allowed = spec.inputs[i].dtypes
        if allowed is None and d != first:
            raise OpTypeError(f"op {op} input {i} has dtype {d}, expected {first} (all inputs must match the first)",
                              input=i)
        if allowed is not None and d not in allowed:
            raise OpTypeError(f"{spec.where()} input {i} ({spec.inputs[i].name}) has dtype {d}, expected one of "
                              f"{_dtype_list(allowed)}", input=i)
    if not D.is_dtype(out_dtype):
        raise OpTypeError(f"{spec.where()}: its output dtype rule gave {out_dtype!r}, not a dtype")
    if spec.check is not None:
        spec.check(list(in_dtypes), out_dtype, attrs, spec)
    for name, lit in attrs.items():
        if spec.attrs[name].kind == "scalar":
            _check_attr_value(spec, name, lit, first)

    shapes = list(in_shapes) if in_shapes is not None else [None] * len(in_dtypes)
    static = _static_attrs(spec, attrs, int_lists, first)
    for name, shape in (attr_shapes or {}).items():
        _check_rows(op, spec.attrs.get(name), name, shape, shapes, static)
    if spec.shape is not None:
        out_shape = spec.shape(shapes, static)
    else:
        out_shape = _kernel_shape(spec, list(in_dtypes), shapes, static, out_dtype, mode)
    return OpSig(mode, out_dtype, None if out_shape is None else tuple(out_shape), spec, MappingProxyType(int_lists))


def _check_rows(op: str, a, name: str, shape, shapes: list, static: dict) -> None:
    """A setting of one value per row (`AttrSpec.rows`: a rule giving the rows' shape and what they
    are) given as a variable of `shape`: it must broadcast to the rows (right-aligned, as NumPy),
    which the kernel checks again when traced (a symbolic rows dimension included)."""
    if a is None or not callable(a.rows) or shape is None or any(s is None for s in shapes):
        return
    rows, what = a.rows(shapes, static)
    try:
        ok = tuple(np.broadcast_shapes(tuple(shape), tuple(rows))) == tuple(rows)
    except ValueError:
        ok = False
    except TypeError:  # a symbolic dimension: the kernel checks it
        ok = True
    if not ok:
        raise OpTypeError(f"op {op}: {name} has shape {list(shape)}, which does not broadcast to the rows "
                          f"{list(rows)} ({what})", attr=name)


def _dtype_list(dtypes) -> str:
    return ", ".join(d for d in D.DTYPES if d in dtypes)


def _kernel_shape(spec: OpDef, in_dtypes, shapes, attrs: dict, out_dtype: str, mode: str):
    """An added op's output shape from its kernel (`jax.eval_shape`), checking the kernel's dtype."""
    if any(s is None for s in shapes):
        return None
    from .dispatch import trace_shape  # cycle: dispatch.py imports this module
    return trace_shape(spec, in_dtypes, shapes, attrs, out_dtype, mode)
