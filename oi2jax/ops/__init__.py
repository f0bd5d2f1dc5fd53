"""THE op registry and its entry points (docs/ops.md).

- `Registry` (name -> `OpDef`), `builtin_registry()` / `REGISTRY` (the 47 OpenInfer ops),
  `load(specs, base=None) -> Registry` (bundled sets such as `nn`, `.py` / `.json` files, modules,
  entry points of the `oi2jax.ops` group)
- `op(...)`: the decorator declaring an added op (ops/define.py)
- `infer(op, in_dtypes, in_shapes, attrs, ..., registry=, sizes=) -> OpSig` (static typing)
- `apply(op_def, inputs, attrs, *, in_dtypes, out_dtype, mode) -> jax.Array` (the computation)
"""
from __future__ import annotations

import importlib

from .errors import OpTypeError
from .shapes import broadcast_shapes, normalize_axes
from .registry import (DTYPE_GROUPS, DYNAMIC, ROUNDING_MODES, AttrSpec, Ctx, InputSpec, OpDef, Registry,
                       attr_variable_value, builtin_registry)
from .typing import OpSig, canonical_attrs, cast_allowed, infer

_LAZY = {"apply": ("dispatch", "apply"), "reference": ("dispatch", "reference"), "Attr": ("define", "Attr"), "op": ("define", "op"), "load": ("loading", "load"),
         "load_schema": ("define", "load_schema"), "REGISTRY": None}


def __getattr__(name):  # deferred (PEP 562): the kernels' dispatch and the op loaders, imported on first use
    if name == "REGISTRY":
        return builtin_registry()
    if name in _LAZY:
        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(f".{mod}", __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(name)


def default_for(op: str, attr: str, dtype: str | None = None):
    """The default of built-in `op`'s attribute `attr` for first-input dtype `dtype`."""
    spec = builtin_registry()[op]
    return spec.attrs[attr].default_for(dtype) if attr in spec.attrs else None


__all__ = ["REGISTRY", "Registry", "OpDef", "AttrSpec", "InputSpec", "OpSig", "OpTypeError", "infer",
           "apply", "op", "load", "load_schema", "cast_allowed", "broadcast_shapes", "normalize_axes", "default_for",
           "canonical_attrs", "ROUNDING_MODES", "Ctx", "DYNAMIC", "DTYPE_GROUPS", "builtin_registry",
           "attr_variable_value"]
