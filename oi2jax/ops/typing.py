"""Static op typing: `infer(...)` checks one op node and computes its mode, dtype and shape.

Messages use the SPEC §3.10 wording where the reference has one; the stricter checks of
§0 item 12 (input dtypes, shapes, attribute values §6.3) use plain DSL words.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import dtypes as D
from ..ir import Literal
from .errors import OpTypeError, broadcast_shapes, normalize_axes
from .registry import ALIASES, REGISTRY, ROUNDING_MODES, OpSpec

SI, UI = D.SIGNED_INTS, D.UNSIGNED_INTS
PS, PU = D.PACKED_SIGNED, D.PACKED_UNSIGNED


@dataclass(frozen=True)
class OpSig:
    mode: str  # normal | inplace | accumulate (acc=DTYPE, SPEC §6.2) | acc_rule (acc=[A, O], SPEC-2026-03 §2)
    out_dtype: str
    out_shape: tuple[int, ...] | None


def cast_allowed(src: str, dst: str) -> bool:
    """§6.4 cast pairs."""
    if dst not in D.FLOATS + SI + UI:
        return False
    fam = D.get(src).family
    if src in D.FLOATS:
        return True
    if dst in D.FLOATS:
        return src in SI + UI + PS + PU
    if src in SI:
        return dst in SI and D.get(dst).bits > D.get(src).bits
    if src in UI:
        return dst in UI and D.get(dst).bits > D.get(src).bits
    if src in PS:
        return dst in SI
    if src in PU:
        return dst in UI
    del fam
    return False


def canonical_attrs(op: str, attrs: dict) -> dict:
    """Apply attribute aliases (relu negative_slope -> alpha)."""
    alias = ALIASES.get(op)
    if not alias:
        return dict(attrs)
    out = {}
    for name, value in attrs.items():
        real = alias.get(name, name)
        if real in out:
            raise OpTypeError(f"duplicate setting: {real}", attr=name)
        out[real] = value
    return out


# attribute consumers whose value kind depends on the first input's dtype (§6.3)
_DTYPE_CONSUMERS = {
    ("div", "div_by_zero_mask"), ("floor_div", "div_by_zero_mask"), ("recip", "div_by_zero_mask"),
    ("relu", "alpha"), ("relu", "clamp_max"), ("clamp", "min"), ("clamp", "max"), ("fill", "value"),
}
_INT_CONSUMERS = {("shl", "bits"), ("shr", "bits"), ("argmax_axis", "axis"), ("argmin_axis", "axis")}


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
        return "dtype_list" if v and all(isinstance(x, str) for x in v) else "int_list"
    return "var"


BOOL_ATTRS = ("keepdims", "select_first", "saturate")  # declared "bool" (SPEC-2026-03 §2.5)


def _check_attr_kind(spec: OpSpec, name: str, lit) -> None:
    a = spec.attrs[name]
    kind = _lit_kind(lit)
    ok = {
        "dtype": kind == "dtype" or (kind in ("var", "str") and D.is_dtype(str(_lit_value(lit)))),
        # keepdims/select_first/saturate: validation accepts any scalar kind (§11 item 30)
        "scalar": kind in ("float", "int", "bool", "var"),
        "int_list": kind == "int_list",
        "string": kind in ("str", "var"),
    }[a.kind]
    if not ok:
        raise OpTypeError(f"unsupported {spec.name} setting type: {name}", attr=name)
    if name in BOOL_ATTRS and kind not in ("bool", "var") and not (kind == "int" and _lit_value(lit) in (0, 1)):
        # current OpenInfer takes only true/false (SPEC-2026-03 §2.5); 0/1 stay accepted (D3)
        raise OpTypeError(f"op {spec.name} setting {name} must be true or false, got {_lit_value(lit)!r}",
                          attr=name)
    if a.kind == "dtype" and not D.is_dtype(str(_lit_value(lit))):
        raise OpTypeError(f"unknown dtype {_lit_value(lit)}", attr=name)


def _check_attr_value(spec: OpSpec, name: str, lit, dtype: str) -> None:
    """§6.3 value rules for literal (not variable-valued) scalar attributes."""
    kind, value = _lit_kind(lit), _lit_value(lit)
    if kind == "var":
        return
    op = spec.name
    dt = D.get(dtype)
    if (op, name) in _INT_CONSUMERS:
        if kind == "float":
            raise OpTypeError(f"op {op} setting {name} must be an integer, got float {value!r}", attr=name)
        return
    if (op, name) not in _DTYPE_CONSUMERS:
        return
    if dt.is_float:
        return  # float-ish consumer: float/int/uint/bool all fine
    if kind == "float":
        raise OpTypeError(f"op {op} setting {name} must be an integer for {dtype} inputs, got float {value!r}",
                          attr=name)
    if dt.family in (D.UNSIGNED, D.BITSET) and kind == "int" and value < 0:
        raise OpTypeError(f"op {op} setting {name} must be non-negative for unsigned dtype {dtype}, got {value}",
                          attr=name)


def _out_shape(spec: OpSpec, shapes: list, attrs: dict) -> tuple[int, ...] | None:
    op = spec.name
    if op == "is_finite":
        return ()
    if any(s is None for s in shapes):
        return None
    shapes = [tuple(s) for s in shapes]
    if op == "matmul":
        a, b = shapes
        if len(a) < 2 or len(b) < 2:
            raise OpTypeError("matmul expects inputs with rank >= 2", input=0 if len(a) < 2 else 1)
        if a[-1] != b[-2]:
            raise OpTypeError(f"matmul inner dim mismatch: {a[-1]} vs {b[-2]}", input=1)
        return broadcast_shapes(a[:-2], b[:-2]) + (a[-2], b[-1])
    if spec.category == "reduction":
        shape = shapes[0]
        keep = attrs.get("keepdims")
        if keep is not None and _lit_kind(keep) == "var":
            keepdims = None
        else:
            keepdims = bool(_lit_value(keep)) if keep is not None else False
        if op in ("argmax_axis", "argmin_axis"):
            axis = attrs["axis"]
            if _lit_kind(axis) == "var":
                return None
            axes = normalize_axes(op, [int(_lit_value(axis))], len(shape))
        else:
            axes = normalize_axes(op, _lit_value(attrs["axes"]), len(shape))
        if keepdims is None:
            return None
        if keepdims:
            return tuple(1 if i in axes else d for i, d in enumerate(shape))
        return tuple(d for i, d in enumerate(shape) if i not in axes)
    if len(shapes) == 1:
        return shapes[0]
    if spec.broadcast:
        out = shapes[0]
        for s in shapes[1:]:
            out = broadcast_shapes(out, s)
        return out
    if any(s != shapes[0] for s in shapes[1:]):
        raise OpTypeError(f"op {op} does not allow broadcast inputs",
                          input=next(i for i, s in enumerate(shapes) if s != shapes[0]))
    return shapes[0]


def infer(op: str, in_dtypes: list[str], in_shapes: list, attrs: dict, out_name: str | None = None,
          in_names: list[str] | None = None) -> OpSig:
    """Type one op node. `attrs` maps names to ir.Literal (plain Python values also accepted)."""
    spec = REGISTRY.get(op)
    if spec is None:
        from ..diagnostics import suggest
        raise OpTypeError(f"unsupported op {op}{suggest(op, REGISTRY)}")
    if len(in_dtypes) != spec.arity:
        raise OpTypeError(f"op {op} expects Fixed({spec.arity}) inputs, got {len(in_dtypes)}")
    attrs = canonical_attrs(op, attrs)
    rule = None
    if "acc" in attrs and _lit_kind(attrs["acc"]) == "dtype_list":  # acc=[A, O]
        rule = tuple(_lit_value(attrs["acc"]))
        attrs = {k: v for k, v in attrs.items() if k != "acc"}
        from . import accumulate
        if op not in accumulate.RULES:
            raise OpTypeError(f"op {op}: acc is not supported (no accumulation rules)", attr="acc")
    if "acc" in attrs and not spec.accumulate:
        raise OpTypeError(f"op {op} does not support accumulation", attr="acc")
    for name, lit in attrs.items():
        if name not in spec.attrs:
            from ..diagnostics import suggest
            raise OpTypeError(f"unsupported {op} setting: {name}{suggest(name, spec.attrs)}", attr=name)
        _check_attr_kind(spec, name, lit)

    # mode
    writes_input = out_name is not None and in_names is not None and out_name in in_names
    if writes_input and not spec.inplace:
        raise OpTypeError(f"op {op} does not support inplace writes")
    mode = "accumulate" if "acc" in attrs else ("inplace" if writes_input else "normal")
    if rule is not None:
        mode = "acc_rule"

    # required attributes
    for name, a in spec.attrs.items():
        if a.required and name not in attrs:
            what = {"axes": "axes", "axis": "axis", "bits": "bits", "value": "value", "to": "to"}[name]
            raise OpTypeError(f"{op} requires {what} attribute", attr=name)
    if "axes" in attrs and len(_lit_value(attrs["axes"])) == 0:
        raise OpTypeError(f"{op} requires a non-empty axes list", attr="axes")
    if "rounding_mode" in attrs and _lit_kind(attrs["rounding_mode"]) == "str":
        rm = _lit_value(attrs["rounding_mode"])
        if rm not in ROUNDING_MODES:
            raise OpTypeError(f"unsupported cast rounding_mode {rm!r} (expected trunc, floor, ceil or nearest)",
                              attr="rounding_mode")

    # dtypes
    first = in_dtypes[0]
    acc_rule, rule = rule, spec.type_rule
    if mode == "acc_rule":
        from . import accumulate
        out_dtype = accumulate.check(op, acc_rule, first, spec.normal_dtypes)
    elif mode == "accumulate":
        out_dtype = str(_lit_value(attrs["acc"]))
    elif rule["kind"] == "fixed":
        out_dtype = rule["dtype"]
    elif rule["kind"] == "acc_from_attr":
        out_dtype = str(_lit_value(attrs[rule["attr"]]))
    else:
        out_dtype = in_dtypes[rule.get("index", 0)]
    if mode == "accumulate":
        if (first, out_dtype) not in spec.accumulate_pairs:
            raise OpTypeError(f"op {op} does not support {first} -> {out_dtype} for mode {mode}", attr="acc")
    elif mode != "acc_rule" and first not in spec.normal_dtypes:
        raise OpTypeError(f"op {op} does not support {first} -> {out_dtype} for mode {mode}", input=0)
    for i, d in enumerate(in_dtypes[1:], start=1):
        if d != first:
            raise OpTypeError(f"op {op} input {i} has dtype {d}, expected {first} (all inputs must match the first)",
                              input=i)
    if op == "cast":
        if spec.output_dtypes and out_dtype not in spec.output_dtypes or not cast_allowed(first, out_dtype):
            raise OpTypeError(f"unsupported cast from {first} to {out_dtype}", attr="to")
    for name, lit in attrs.items():
        if spec.attrs[name].kind == "scalar":
            _check_attr_value(spec, name, lit, first)

    out_shape = _out_shape(spec, list(in_shapes) if in_shapes is not None else [None] * spec.arity, attrs)
    return OpSig(mode, out_dtype, out_shape)
