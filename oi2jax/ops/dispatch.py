"""`apply`: run one op on JAX values (value representation of docs/architecture.md)."""
from __future__ import annotations

from .registry import REGISTRY, Ctx, default_for
from .typing import OpTypeError, canonical_attrs


def apply(op: str, inputs, attrs: dict, *, in_dtypes, out_dtype: str, mode: str):
    """The op's result in `out_dtype`'s representation. Works eagerly and under jit.

    `attrs`: Python scalars / tuples / str (static) or 0-d arrays (variable-valued).
    Absent attributes take their defaults (dtype-dependent where §6.4 says so).
    """
    spec = REGISTRY.get(op)
    if spec is None:
        raise OpTypeError(f"unsupported op {op}")
    if spec.impl is None:
        raise NotImplementedError(f"op {op} has no implementation")
    attrs = canonical_attrs(op, attrs)
    full = {}
    for name in spec.attrs:
        if name in attrs and attrs[name] is not None:
            full[name] = attrs[name]
        else:
            d = default_for(op, name, in_dtypes[0])
            if d is not None:
                full[name] = d
    if mode == "acc_rule":  # acc=[A, O] (SPEC-2026-03 §2)
        from . import accumulate
        return accumulate.apply(op, list(inputs), full, in_dtypes, out_dtype)
    ctx = Ctx(op, tuple(in_dtypes), out_dtype, mode)
    return spec.impl(list(inputs), full, ctx)
