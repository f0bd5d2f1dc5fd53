"""relu, matmul (SPEC §6.4 Numerical, §6.5)."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .builtin import Builtin
from .. import dtypes as D
from . import jax_numerics as N
from ._common import is_float


def _static_equals(value, target: float) -> bool:
    """True when an attribute is a Python number equal to `target` (not a traced variable)."""
    return isinstance(value, (bool, int, float)) and float(value) == target


def _relu(inputs, attrs, ctx):
    d = ctx.dtype
    x = inputs[0]
    if is_float(d):
        xc = N.to_compute(x, d)
        alpha = N.float_const(attrs["alpha"], d).astype(xc.dtype)
        neg = xc * alpha  # NaN: x * alpha stays NaN; -inf * 0 is NaN, as in the kernel
        # x * 0 is exact (±0 or NaN), so an FMA formed with a later add cannot change it: the
        # contraction guard (which costs a materialised zero array) is only needed for alpha != 0
        y = jnp.where(xc >= 0, xc, neg if _static_equals(attrs["alpha"], 0.0) else N.no_contract(neg))
        if not _static_equals(attrs["clamp_max"], float("inf")):  # the default +inf never clamps
            cmax = N.float_const(attrs["clamp_max"], d).astype(xc.dtype)
            y = jnp.where(y > cmax, cmax, y)
        return N.store(y, d)
    wide = N.wide_int(True)
    xw = x.astype(wide)
    alpha = N.int_const(attrs["alpha"], wide)
    cmax = N.int_const(attrs["clamp_max"], wide, clip=True)
    y = jnp.where(xw >= 0, xw, xw * alpha)  # 64-bit wrapping multiply
    y = jnp.where(y > cmax, cmax, y)
    return N.wrap(y, d)


# Float matmul precisions (`CompileOptions.precision`, `--precision`; a kernel reads its program's
# as `Ctx.precision`): "highest" (default) keeps OpenInfer's exact f32 numerics; "high" / "default"
# let XLA use faster paths (TF32 / bf16 passes on GPU and TPU).
PRECISIONS = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH, "default": lax.Precision.DEFAULT}


def _matmul(inputs, attrs, ctx):
    a, b = inputs
    d = ctx.dtype
    if is_float(d):
        ct = N.compute_dtype(d)
        y = jnp.matmul(a.astype(ct), b.astype(ct), precision=PRECISIONS[ctx.precision])
        return N.store(y, d)
    if d == "bool":
        y = jnp.matmul(a.astype(jnp.int32), b.astype(jnp.int32), preferred_element_type=jnp.int32)
        return y > 0
    out = ctx.out_dtype if ctx.mode == "accumulate" else d
    dt = D.get(out)
    # products and sums wrap; any container at least as wide as the result gives the same low bits.
    # The operands stay in their narrow containers (i4 -> int8): XLA accumulates them in `acc`
    # (an s8 x s8 -> s32 dot), several times faster than widening both operands first.
    if dt.bits == 64:
        acc = dt.np_dtype
    else:
        acc = jnp.int32 if dt.is_signed else jnp.uint32
    y = jnp.matmul(a, b, preferred_element_type=acc)
    return N.wrap(y, out)


OPS = {
    "relu": Builtin(_relu, runtime_shape=True, value_rules={"alpha": "dtype", "clamp_max": "dtype"},
                    aliases={"negative_slope": "alpha"}),  # §0 item 8
    "matmul": Builtin(_matmul, shape="matmul", acc_rules=(
        ("i32", "i32"), ("i32", "i64"), ("i64", "i64"), ("u32", "u32"), ("u32", "u64"), ("u64", "u64"),
        ("f32", "f32"), ("f32", "f64"), ("f64", "f64"))),
}
