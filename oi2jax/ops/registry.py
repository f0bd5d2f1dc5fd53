"""The op registry: op name -> OpSpec, built from the package's own optable.json.

`optable.json` is generated from OpenInfer's ops.json by tools/gen_optable.py. Each
category module (arithmetic, numerical, ...) exports `IMPLS: dict[op name, impl]`;
an impl is `impl(inputs, attrs, ctx) -> jax.Array` (see `Ctx`).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping

from .. import dtypes as D

_TABLE_PATH = Path(__file__).with_name("optable.json")

# dtype-valued, scalar, int-list and string attributes (SPEC §6 intro)
STATIC_ATTRS = frozenset({"axes", "axis", "keepdims", "to", "acc", "rounding_mode", "select_first", "saturate"})
ROUNDING_MODES = ("trunc", "floor", "ceil", "nearest")
ALIASES = {"relu": {"negative_slope": "alpha"}}  # §0 item 8


@dataclass(frozen=True)
class AttrSpec:
    """One attribute of one op. kind: 'dtype' | 'scalar' | 'int_list' | 'string'."""

    name: str
    kind: str
    scalar_kinds: tuple[str, ...] = ()
    default: object = None  # None: no default (required, or dtype-dependent: see `defaults`)
    required: bool = False


@dataclass(frozen=True)
class OpSpec:
    name: str
    category: str
    arity: int
    attrs: Mapping[str, AttrSpec]
    broadcast: bool
    inplace: bool
    accumulate: bool
    type_rule: Mapping[str, object]  # {"kind": "same_as_input"|"fixed"|"acc_from_attr", ...}
    normal_dtypes: frozenset[str]
    accumulate_pairs: frozenset[tuple[str, str]]
    output_dtypes: frozenset[str] = frozenset()  # cast: allowed targets

    @property
    def impl(self) -> Callable | None:
        """The JAX implementation, imported on first use (typing and checking need no JAX)."""
        return _impls().get(self.name)

    def attr_default(self, name: str, dtype: str | None = None):
        """The value an absent attribute takes (dtype-dependent for a few)."""
        return default_for(self.name, name, dtype)


@dataclass(frozen=True)
class Ctx:
    """What an impl knows besides inputs and attrs."""

    op: str
    in_dtypes: tuple[str, ...]
    out_dtype: str
    mode: str  # normal | inplace | accumulate

    @property
    def dtype(self) -> str:
        return self.in_dtypes[0]


_REQUIRED = {
    ("shl", "bits"), ("shr", "bits"), ("fill", "value"), ("cast", "to"),
    ("sum_axis", "axes"), ("mean_axis", "axes"), ("prod_axis", "axes"),
    ("max_axis", "axes"), ("min_axis", "axes"),
    ("argmax_axis", "axis"), ("argmin_axis", "axis"),
}

_I64_MIN, _I64_MAX, _U64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
_F64_MAX = 1.7976931348623157e308


def default_for(op: str, attr: str, dtype: str | None = None):
    """Default value of `attr` for `op` on first-input dtype `dtype` (None if required)."""
    is_float = dtype is not None and D.get(dtype).is_float
    unsigned = dtype is not None and D.get(dtype).family in (D.UNSIGNED, D.BITSET)
    if attr == "div_by_zero_mask":
        return float("nan") if is_float else 0
    if attr == "alpha":
        return 0.0 if is_float else 0
    if attr == "clamp_max":
        return float("inf") if is_float else _I64_MAX
    if attr == "min":
        return -_F64_MAX if is_float else (0 if unsigned else _I64_MIN)
    if attr == "max":
        return _F64_MAX if is_float else (_U64_MAX if unsigned else _I64_MAX)
    if attr == "keepdims":
        return False
    if attr == "select_first":
        return True
    if attr == "saturate":
        return True
    if attr == "rounding_mode":
        return "trunc"
    return None


def _load() -> dict:
    return json.loads(_TABLE_PATH.read_text())


@functools.lru_cache(maxsize=None)
def _impls() -> dict[str, Callable]:
    from . import (arithmetic, bitwise, casting, comparison, filter, mutation, numerical,
                   reduction, rounding, statistics)
    out: dict[str, Callable] = {}
    for mod in (arithmetic, numerical, statistics, rounding, bitwise, comparison, filter,
                mutation, reduction, casting):
        out.update(mod.IMPLS)
    return out


def _build() -> dict[str, OpSpec]:
    table = _load()
    defs = table["attr_defs"]
    reg: dict[str, OpSpec] = {}
    for name, e in table["ops"].items():
        attrs = {}
        for a in e["attrs"]:
            d = defs[a]
            attrs[a] = AttrSpec(a, d["kind"], tuple(d.get("scalar_kinds", ())),
                                default_for(name, a), (name, a) in _REQUIRED)
        reg[name] = OpSpec(
            name=name, category=e["category"], arity=e["arity"], attrs=MappingProxyType(attrs),
            broadcast=e["broadcast"], inplace=e["inplace"], accumulate=e["accumulate"],
            type_rule=MappingProxyType(dict(e["type_rule"])), normal_dtypes=frozenset(e["normal"]),
            accumulate_pairs=frozenset(tuple(p) for p in e["accumulate_pairs"]),
            output_dtypes=frozenset(e.get("output_dtypes", ())),
        )
    return reg


REGISTRY: dict[str, OpSpec] = _build()
