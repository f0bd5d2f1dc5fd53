"""The op registry and its two entry points.

- `REGISTRY[name] -> OpSpec` (attrs, flags, type rule, dtype support, JAX impl)
- `infer(op, in_dtypes, in_shapes, attrs, out_name=None, in_names=None) -> OpSig` (static typing)
- `apply(op, inputs, attrs, *, in_dtypes, out_dtype, mode) -> jax.Array` (the computation)
"""
from __future__ import annotations

from .registry import REGISTRY, ROUNDING_MODES, AttrSpec, Ctx, OpSpec, default_for
from .typing import OpSig, OpTypeError, broadcast_shapes, canonical_attrs, cast_allowed, infer, normalize_axes


def __getattr__(name):  # `apply` imports JAX: only when something computes, not when checking
    if name == "apply":
        from .dispatch import apply
        globals()["apply"] = apply
        return apply
    raise AttributeError(name)

__all__ = ["REGISTRY", "AttrSpec", "OpSpec", "OpSig", "OpTypeError", "infer", "apply", "cast_allowed",
           "broadcast_shapes", "normalize_axes", "default_for", "canonical_attrs", "ROUNDING_MODES", "Ctx"]
