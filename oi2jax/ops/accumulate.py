"""`acc=[A, O]`: current OpenInfer's accumulation rules (SPEC-2026-03 §2.2) and oi2jax's numerics
for them (decision D2, §2.3). The 1fc5207 form `acc=DTYPE` keeps SPEC §6.2 (ops/typing.py).

One definition: `check` (typing, used by the checker, the lowering and the interpreter alike) and
`apply` (the value, under jit or eagerly).

Numerics (D2): each input element is converted I -> A (integers modulo 2^bits(A), two's
complement; integer -> float and float -> float round to nearest even); the op runs entirely in A
(integer adds and multiplies wrap in A; float math is IEEE in A, f32 matmuls at full precision);
the result is converted A -> O. mean_axis accumulates the sum in A, converts it to O, then divides
by the element count in O. Because arithmetic modulo 2^bits commutes with truncation, an integer A
gives the same values whatever wider container XLA accumulates in.
"""
from __future__ import annotations

import jax.numpy as jnp

from .. import dtypes as D
from . import jax_numerics as N
from .errors import OpTypeError
from .registry import Ctx, builtin_registry

# Rust `Debug` names, for the upstream message texts (SPEC-2026-03 §5.2)
_DEBUG = {"bf16": "BF16", "bool": "Bool"}


def debug_name(dtype: str) -> str:
    return _DEBUG.get(dtype, dtype.upper())


def _list(rule) -> str:
    return "[" + ", ".join(debug_name(d) for d in rule) + "]"


def check(spec, rule: tuple[str, ...], in_dtype: str) -> str:
    """The output dtype O of `op(..., acc=rule)` with inputs of `in_dtype`; OpTypeError (the
    upstream texts, §5.2) when the rule is not one of the op's (`OpDef.acc_rules`), or D2.1's
    float-into-integer case."""
    op, rules, normal_dtypes = spec.name, spec.acc_rules, spec.normal_dtypes
    if not rules:
        raise OpTypeError(f"op {op}: acc is not supported (no accumulation rules)", attr="acc")
    if tuple(rule) not in rules:
        valid = "[" + ", ".join(_list(r) for r in rules) + "]"
        raise OpTypeError(f"op {op}: acc={_list(rule)} does not match any accumulation rule; valid: {valid}",
                          attr="acc")
    a, o = rule
    if in_dtype not in normal_dtypes or in_dtype == "bitset":
        raise OpTypeError(f"unsupported op typing tuple for {op}: inputs=[{debug_name(in_dtype)}], "
                          f"out={debug_name(o)}", input=0)
    if D.get(in_dtype).is_float and not D.get(a).is_float:
        raise OpTypeError(f"op {op}: acc=[{a}, {o}] cannot accumulate float input {in_dtype} in integer type {a}",
                          attr="acc")
    return o


def to_dtype(x, src: str, dst: str):
    """One value from dtype `src`'s representation to `dst` (D2.2 / D2.4 conversions)."""
    if D.get(src).is_float:
        x = N.to_compute(x, src)  # f8/bf16/f16 -> f32 exactly; f32/f64 as they are
    elif src == "bool":
        x = x.astype(jnp.int32)
    return x.astype(D.get(dst).np_dtype)  # ints wrap modulo 2^bits; to float: nearest even


def apply(spec, inputs, attrs: dict, in_dtypes, out_dtype: str, precision: str = "highest"):
    """The value of `op(inputs, acc=[A, O])` (O = out_dtype), through the op's normal-mode kernel
    in A (or its own `acc_kernel`, mean_axis's: sum in A, to O, divide by the count in O)."""
    a, o = attrs["acc"]
    assert o == out_dtype, (o, out_dtype)
    xs = [to_dtype(jnp.asarray(x), d, a) for x, d in zip(inputs, in_dtypes)]
    rest = {k: v for k, v in attrs.items() if k != "acc"}
    if spec.acc_kernel is not None:
        return spec.acc_kernel(xs, rest, a, o)
    y = spec.kernel(xs, rest, Ctx(spec.name, (a,) * len(xs), a, "normal", precision=precision))
    return to_dtype(y, a, o)


def __getattr__(name):  # RULES: op -> its acc=[A, O] rules, a view of the built-in declarations
    if name == "RULES":
        return {d.name: d.acc_rules for d in builtin_registry().values() if d.acc_rules}
    raise AttributeError(name)
