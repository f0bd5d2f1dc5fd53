"""Host-side value conversion at the program boundary, shared by compiled and interpreted modes.

`convert_input` turns a user array into the representation of a declared dtype (dtypes.py)
and refuses anything that would silently change a value; `convert_output` widens a value
for `--out` / `Program.run` (bf16, f8 -> float32; packed ints are already int8/uint8).
"""
from __future__ import annotations

import numpy as np

from . import dtypes as dt
from . import ir
from .diagnostics import OiError, check_whole, suggest
from .host_numerics import f8_encode


def convert_input(name: str, array, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """User array -> representation of `dtype` with exactly `shape`; OiError on any loss (a value
    the cast overflows is refused by the comparison after it, without NumPy's RuntimeWarning)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _convert_input(name, array, dtype, shape)


def _convert_input(name: str, array, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    a = np.asarray(array)
    d = dt.get(dtype)
    if a.dtype.kind not in "biufV" and a.dtype.name not in ("bfloat16", "float8_e5m2"):  # "abc", None, an object
        what = "text" if a.dtype.kind in "US" else "Python objects" if a.dtype.kind == "O" else a.dtype.name
        raise OiError(f"input {name}: expected {dtype}{list(shape)} values (numbers), got {what} "
                      f"({np.array2string(a, threshold=4)[:100]})")
    if tuple(a.shape) != tuple(shape):
        raise OiError(f"input {name}: expected shape {list(shape)}, got {list(a.shape)}")
    kind = a.dtype.kind
    if d.family == dt.FLOAT:
        if kind not in "fiub" and a.dtype.name not in ("bfloat16", "float8_e5m2"):
            raw = " (raw 2-byte records: NumPy's .npy stores an ml_dtypes bfloat16 array as |V2 and reads it back "\
                  "as bytes; save it as float32, which converts exactly)" if a.dtype.kind == "V" and a.dtype.itemsize == 2 \
                else ""
            raise OiError(f"input {name}: expected {dtype} values, got a {a.dtype} array{raw}")
        if a.dtype == d.np_dtype:
            return a
        if d.name in ("bf16", "f8"):
            f32 = a.astype(np.float32)
            finite = np.isfinite(f32)
            if np.any(np.abs(f32[finite]) > d.max):
                bad = f32[finite][np.abs(f32[finite]) > d.max][0]
                raise OiError(f"input {name}: value {bad} is out of range for {dtype} (max {d.max})")
            converted = f8_encode(f32) if d.name == "f8" else f32.astype(d.np_dtype)
            # exact or refused, like every other dtype: compare the value held with the one given,
            # not two roundings of it (float64 0.1 -> bf16 0.10009765625 is a change)
            back = converted.astype(np.float64)
            orig = a.astype(np.float64) if kind == "f" else None
            same = (back == orig) | (np.isnan(back) & np.isnan(orig)) if orig is not None \
                else ints_exact(a, converted.astype(np.float64)) & (back == a.astype(np.float64))
            if not np.all(same):
                idx = tuple(np.argwhere(~same)[0])
                raise OiError(f"input {name}: value {a[idx]} ({a.dtype}) is not exactly representable in {dtype} "
                              f"(nearest {back[idx]}); round it first, e.g. pass "
                              f"{'an ml_dtypes.bfloat16 array' if d.name == 'bf16' else 'values that f8 holds'}")
            return converted
        converted = a.astype(d.np_dtype)
        if kind == "f":
            back, orig = converted.astype(a.dtype), a
            same = (back == orig) | (np.isnan(back) & np.isnan(orig))
        else:  # integers: compare exactly, never after rounding both sides through float64
            same = ints_exact(a, converted)
        if not np.all(same):
            idx = tuple(np.argwhere(~same)[0])
            raise OiError(f"input {name}: value {a[idx]} ({a.dtype}) is not exactly representable in {dtype}; "
                          f"pass a {d.np_dtype} array")
        return converted
    if d.family == dt.BOOL:
        if kind == "b":
            return a
        if kind in "iu" and np.all((a == 0) | (a == 1)):
            return a.astype(np.bool_)
        raise OiError(f"input {name}: expected bool values, got a {a.dtype} array")
    # integer families (signed, unsigned, packed, bitset, ternary)
    if kind == "b":
        a = a.astype(np.int64)
        kind = "i"
    if kind not in "iu":
        raise OiError(f"input {name}: expected integer values for {dtype}, got a {a.dtype} array")
    lo, hi = d.min, d.max
    if a.size:
        amin, amax = int(a.min()), int(a.max())
        if amin < lo or amax > hi:
            bad = amin if amin < lo else amax
            raise OiError(f"input {name}: value {bad} is out of range for {dtype} [{lo}, {hi}]")
        if d.name == "t1" and np.any(a == 0):
            raise OiError(f"input {name}: t1 values must be -1 or 1")
    return a.astype(d.np_dtype)


def convert_inputs(inputs: dict, graph, shape_of) -> dict[str, np.ndarray]:
    """User arrays for dynamic variables, each converted exactly to its declared dtype and shape
    (`shape_of(name)`); a name that is not a dynamic variable is an error (with a suggestion)."""
    out = {}
    for name, value in inputs.items():
        decl = graph.var(name)
        if decl is None or decl.kind != ir.MemKind.DYNAMIC:
            raise unknown_input(name, graph)
        out[name] = convert_input(name, np.asarray(value), decl.dtype, tuple(shape_of(name)))
    return out


def ints_exact(a: np.ndarray, converted: np.ndarray) -> np.ndarray:
    """Elementwise: does the float `converted` hold exactly the integer `a`? (int64 2**53 + 1 does
    not survive float64, though both sides rounded through float64 would compare equal.)"""
    mant = np.finfo(converted.dtype).nmant + 1
    small = (a >= -(1 << mant)) & (a <= (1 << mant)) if a.dtype.kind == "i" else (a <= (1 << mant))
    same = np.array(small, dtype=bool)  # (an array even for a 0-d `a`, whose comparisons give scalars)
    for idx in map(tuple, np.argwhere(~small)):  # (np.nonzero refuses a 0-d array: a scalar input)
        f = float(converted[idx])
        same[idx] = np.isfinite(f) and int(f) == int(a[idx])
    return same


def check_every_step_input(name: str, value, shape, dims: bool = False) -> None:
    """An input given once for every step (`--input NAME=FILE.npy`) has its declared rank: never
    read as one value per step (an extra leading axis: that is `--inputs-per-step`) nor broadcast
    (a missing axis). Its dims are checked with its values (`convert_input`; a batch-chunked run
    takes more rows than the batch size), or here with `dims=True` (a run that is not chunked),
    so that the message is --input's, not the per-step rule's `[N, ...]`."""
    got = tuple(np.shape(value))
    if len(got) != len(shape) or (dims and got != tuple(shape)):
        raise OiError(f"input {name}: expected shape {list(shape)}, got {list(got)} (--input gives the value of "
                      f"every step; one value per step goes in --inputs-per-step FILE.npz)")


def convert_output(value, dtype: str) -> np.ndarray:
    """A held value -> the array written to `--out` (bf16/f8 widened to float32)."""
    return dt.to_output(np.asarray(value), dtype)


def unknown_input(name: str, graph) -> OiError:
    """THE error for an input that is not a dynamic variable (compiled, chunked and interpreted
    runs, sessions): names what it is, suggests a close name, lists the dynamic variables."""
    dynamic = [v.name for v in graph.vars_of(ir.MemKind.DYNAMIC)]
    decl = graph.var(name)
    if decl is not None:
        return OiError(f"unknown input {name}: {name} is a {decl.kind.value} variable, not dynamic; the graph's "
                       f"dynamic variables are {', '.join(dynamic) or '(none)'}")
    return OiError(f"unknown input {name}{suggest(name, dynamic)}: the graph's dynamic variables are "
                   f"{', '.join(dynamic) or '(none)'}")


def check_given_inputs(bound, given, allow_zeros: bool) -> None:
    """Refuse to run without an input the graph reads and that has no default of its own (a model
    tensor or `@init`): it would silently compute from zeros. `allow_zeros` (`--zero-missing-inputs`,
    `zero_missing_inputs=True`) asks for OpenInfer's zero-filled default explicitly."""
    dynamic = [v.name for v in bound.graph.vars_of(ir.MemKind.DYNAMIC)]
    for name in given:  # an unknown name first: a typo is the likely cause of a missing input
        if name not in dynamic:
            raise unknown_input(name, bound.graph)
        if name in bound.fixed:
            raise OiError(f"input {name} is fixed at {bound.fixed[name]!r} in this program (Program.specialized): "
                          f"a run cannot give it; run the program it was specialized from to vary it")
    if allow_zeros:
        return
    missing = bound.missing_inputs(set(given))
    if missing:
        names = ", ".join(missing)
        one = len(missing) == 1
        raise OiError(f"missing input{'' if one else 's'} {names}: the graph reads {'it' if one else 'them'} and "
                      f"{'it has' if one else 'they have'} no model tensor or @init; give "
                      f"{'it' if one else 'them'} (--input NAME=FILE.npy, or the inputs dict), or ask for "
                      f"OpenInfer's zero-filled default with --zero-missing-inputs (zero_missing_inputs=True)")


def per_step_shape(shape) -> str:
    """`[N, *shape]` as messages write it (`[N]` for a scalar)."""
    return "[" + ", ".join(["N", *map(str, shape)]) + "]"


def step_axis(name: str, value, shape: tuple) -> int | None:
    """THE per-step input rule: a value of shape `[N, *shape]` gives one value per step (returns
    N); one of `shape` is the same every step (None); any other shape is an OiError."""
    vshape = tuple(np.shape(value))
    if len(vshape) == len(shape) + 1 and vshape[1:] == shape:
        return vshape[0]
    if vshape == shape:
        return None
    raise OiError(f"input {name}: expected shape {list(shape)} (the same every step) or "
                  f"{per_step_shape(shape)} (one value per step), got {list(vshape)}")


def step_count(lengths: dict, steps, default: int, hint=lambda: "") -> int:
    """THE run-length rule, compiled and interpreted: the per-step inputs (`lengths`: name -> N)
    agree on N; `steps=None` runs N (`default` without per-step inputs); more than N is an error
    (`hint()`: what more the message may say)."""
    if len(set(lengths.values())) > 1:
        raise OiError("per-step inputs disagree on the number of steps: " +
                      ", ".join(f"{k} has {v}" for k, v in lengths.items()))
    n = next(iter(lengths.values()), None)
    steps = check_whole("steps", (default if n is None else n) if steps is None else steps, 0)
    if n is not None and steps > n:
        raise OiError(f"{steps} steps asked for, but the per-step inputs hold {n} values ({', '.join(lengths)})"
                      + hint())
    return steps
