"""`apply`: run one op on JAX values (value representation of docs/architecture.md), and
`trace_shape`: an added op's output shape and dtype from its kernel (`jax.eval_shape`).

An added op's kernel is user code: an exception it raises, or a result of another shape or dtype
than the checker typed, is an `OpTypeError` naming the op and where it is defined (the caller
locates it at the node), never a traceback."""
from __future__ import annotations

import os
import sysconfig

import jax
import jaxlib
import numpy as np

from .. import dtypes as D
from .. import host_numerics as HN
from . import accumulate
from .errors import OpTypeError
from .registry import Ctx, OpDef, builtin_registry
from .typing import DYNAMIC, canonical_attrs


# where a traceback frame is not the user's: JAX, jaxlib, NumPy, oi2jax itself, the standard library
_LIBRARIES = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (jax, jaxlib, np)) + (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep, sysconfig.get_paths()["stdlib"] + os.sep)


def _raised(spec: OpDef, exc: Exception, what: str, during: str = "") -> OpTypeError:
    return raised(spec.where(), exc, what, during)


def raised(who: str, exc: Exception, what: str, during: str = "") -> OpTypeError:
    """An added op's code raised: its exception's type, the first line of its message (JAX adds a
    page of where each traced value came from) and the line of the op's own code it came from.
    `who`: `op NAME (defined in FILE:LINE)`; `what`: kernel, reference, output dtype rule."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    at = ""
    tb = exc.__traceback__
    while tb is not None:  # the innermost frame outside JAX, NumPy and oi2jax: the user's line
        code = tb.tb_frame.f_code
        if not os.path.abspath(code.co_filename).startswith(_LIBRARIES):
            at = f" (at {code.co_filename}:{tb.tb_lineno}, in {code.co_name})"
        tb = tb.tb_next
    return OpTypeError(f"{who}: its {what} raised {type(exc).__name__}{during}: {first}{at}")


def _full_attrs(spec: OpDef, attrs: dict, first: str) -> dict:
    attrs = canonical_attrs(spec, attrs)
    full = {}
    for name, a in spec.attrs.items():
        if name in attrs and attrs[name] is not None:
            full[name] = attrs[name]
        else:
            d = a.default_for(first)
            if d is not None:
                full[name] = d
    if "acc" in attrs and "acc" not in full:
        full["acc"] = attrs["acc"]
    return full


def _unsigned_settings(spec: OpDef, full: dict, first: str, ctx: Ctx) -> None:
    """SPEC §6.3: for unsigned inputs, a setting whose kind follows the input's dtype (div's mask,
    clamp's bounds, fill's value) rejects a negative value. The checker refuses a literal one; a
    signed variable's value is checked each time the op runs, as OpenInfer does, never wrapped
    (-1 filling a u8 with 255) or ignored."""
    if D.get(first).family not in (D.UNSIGNED, D.BITSET):
        return
    for name, value in full.items():
        a = spec.attrs.get(name)
        if a is not None and a.value_rule == "dtype" and np.issubdtype(getattr(value, "dtype", np.float64),
                                                                        np.signedinteger):
            ctx.fail_if(value < 0, f"op {spec.name} setting {name} must be non-negative for unsigned dtype {first}, "
                        f"got {{value}}", value)


def apply(op, inputs, attrs: dict, *, in_dtypes, out_dtype: str, mode: str, guards: list | None = None,
          out_shape=None, precision: str = "highest", platform: str = "cpu", kernels: str = "jax"):
    """The op's result in `out_dtype`'s representation. Works eagerly and under jit.

    `op`: an `OpDef` (what the checker typed the node against: `OpSig.op`), or a built-in's name.
    `attrs`: Python scalars / tuples / str (static) or 0-d arrays (variable-valued).
    Absent attributes take their defaults (dtype-dependent where §6.4 says so). `guards`: a list
    receiving the kernel's runtime checks `(cond, message, value)` (`Ctx.fail_if`). `out_shape`:
    the shape the checker typed, which an added op's kernel must return. `precision`: the float
    matmul precision (`Ctx.precision`; the lowering passes its program's). `platform`: the JAX
    platform the program is lowered for (`Ctx.platform`). `kernels`: the program's kernel set
    (`Ctx.kernels`: "ggml" lets an op call ggml's kernels, `kernels="ggml"`)."""
    if not isinstance(op, OpDef):
        spec = builtin_registry().get(op)
        if spec is None:
            raise OpTypeError(f"unsupported op {op}")
    else:
        spec = op
    full = _full_attrs(spec, attrs, in_dtypes[0])
    if mode == "acc_rule":  # acc=[A, O] (SPEC-2026-03 §2)
        return accumulate.apply(spec, list(inputs), full, in_dtypes, out_dtype, precision)
    ctx = Ctx(spec.name, tuple(in_dtypes), out_dtype, mode, guards, precision, platform, kernels)
    if spec.builtin:
        _unsigned_settings(spec, full, in_dtypes[0], ctx)
        return spec.kernel(list(inputs), full, ctx)
    try:
        out = spec.kernel(list(inputs), full, ctx)
    except OpTypeError:
        raise
    except Exception as exc:  # user code: reported at the node, never a traceback
        raise _raised(spec, exc, "kernel") from None
    _check_result(spec, out, out_dtype, out_shape)
    return out


def reference(spec: OpDef, inputs, attrs: dict, *, in_dtypes, out_dtype: str, mode: str,
              guards: list | None = None, out_shape=None):
    """An added op's value from its NumPy reference (the interpreter's oracle), rounded once to
    `out_dtype`'s representation and checked like a kernel's result."""
    full = _full_attrs(spec, attrs, in_dtypes[0])
    full = {k: (np.asarray(v) if hasattr(v, "shape") else v) for k, v in full.items()}
    ctx = Ctx(spec.name, tuple(in_dtypes), out_dtype, mode, guards)
    try:
        out = np.asarray(spec.reference(list(inputs), full, ctx))
    except Exception as exc:  # user code
        raise _raised(spec, exc, "reference") from None
    if out_shape is not None and tuple(out.shape) != tuple(out_shape):
        raise OpTypeError(f"{spec.where()}: its reference returned shape {list(out.shape)}, expected "
                          f"{list(out_shape)}")
    want = D.get(out_dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # rounding to f16/bf16 may overflow to inf: IEEE
        if want.is_float:
            out = out.astype(np.float64)
            out = HN.f8_encode(out.astype(np.float32)) if out_dtype == "f8" else out.astype(want.np_dtype)
        elif out.dtype != want.np_dtype:
            out = out.astype(want.np_dtype)
    return out


def _check_result(spec: OpDef, out, out_dtype: str, want_shape) -> None:
    want = D.get(out_dtype).np_dtype
    shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
    if shape is None or dtype is None:
        raise OpTypeError(f"{spec.where()}: its kernel returned {type(out).__name__}, not an array")
    if np.dtype(dtype) != want:
        raise OpTypeError(f"{spec.where()}: its kernel returned dtype {np.dtype(dtype)}, but the op's dtype rule "
                          f"gives {out_dtype} (held as {want})")
    if want_shape is not None and (len(shape) != len(want_shape) or any(
            isinstance(d, int) and d != w for d, w in zip(shape, want_shape))):
        # a symbolic dimension (`export --symbolic`: the step re-traced after the checked one, whose
        # shapes this same comparison checked at the bound sizes) is not compared again
        raise OpTypeError(f"{spec.where()}: its kernel returned shape {list(shape)}, expected {list(want_shape)}")


_VAR_DTYPES = {"float": np.float32, "int": np.int32, "bool": np.bool_, "scalar": np.float32}


def trace_shape(spec: OpDef, in_dtypes, shapes, attrs: dict, out_dtype: str, mode: str) -> tuple[int, ...]:
    """The output shape of an added op whose declaration leaves it to the kernel: the kernel traced
    abstractly (`jax.eval_shape`, no computation) on inputs of these shapes and dtypes."""
    static = {k: v for k, v in attrs.items() if v is not DYNAMIC}
    dynamic = {k: jax.ShapeDtypeStruct((), _VAR_DTYPES.get(spec.attrs[k].kind, np.float32))
               for k, v in attrs.items() if v is DYNAMIC}
    args = [jax.ShapeDtypeStruct(tuple(s), D.get(d).np_dtype) for s, d in zip(shapes, in_dtypes)]

    def run(xs, dyn):
        return spec.kernel(list(xs), {**static, **dyn}, Ctx(spec.name, tuple(in_dtypes), out_dtype, mode))

    try:
        with jax.enable_x64(True):
            out = jax.eval_shape(run, args, dynamic)
    except OpTypeError:
        raise
    except Exception as exc:  # user code
        raise _raised(spec, exc, "kernel", " while tracing") from None
    _check_result(spec, out, out_dtype, None)
    return tuple(int(d) for d in out.shape)
