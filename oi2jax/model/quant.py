"""Per-tensor quantization metadata of `.oinf` version 2 (SPEC-2026-03 §3.3, §4, decision D9).

`QuantParams` is what a v2 tensor entry with HAS_QUANT carries: a scheme, per-tensor or per-channel
scales, optional zero points. oi2jax reads, validates, shows and writes it. A constant declared
with the stored dtype sees the stored values (no op specification defines dequantization); an
oi2jax extension: an `i8`/`u8` tensor bound to an `f32` constant is read through the conventional
affine reading `real = scale[c] * (q - zp[c])` (`dequantize`; not defined upstream).

One definition of the payload: `parse` (reader, with the Rust loader's rules, order and texts),
`encode` (writer), `describe` (inspect, in the upstream verifier's wording).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from ..diagnostics import OiError

SCHEMES = {1: "symmetric", 2: "asymmetric"}
SCALE_MODES = {1: "per_tensor", 2: "per_channel"}
ZP_MODES = {0: "none", 1: "per_tensor", 2: "per_channel"}
_CODE = {**{v: k for k, v in SCHEMES.items()}, **{"s" + v: k for k, v in SCALE_MODES.items()},
         **{"z" + v: k for k, v in ZP_MODES.items()}}
HEAD = struct.Struct("<IIII QQQQ")  # scheme, scale_mode, zp_mode, reserved, scale_axis/count, zp_axis/count
assert HEAD.size == 48


def payload_nbytes(scale_count: int, zp_count: int) -> int:
    """Exact size of a quant payload (§3.3): align8(48 + 4*scale_count + 4*zp_count)."""
    return (48 + 4 * scale_count + 4 * zp_count + 7) // 8 * 8


@dataclass(frozen=True, eq=False)
class QuantParams:
    """Quantization metadata of one tensor (SPEC-2026-03 §3.3 / D9).

    scheme: "symmetric" | "asymmetric"; scale_mode: "per_tensor" | "per_channel"; scales: float32
    values (1 per tensor, or one per channel of `scale_axis`); zp_mode: "none" | "per_tensor" |
    "per_channel"; zero_points: int32 values (none: empty). Construction checks the rules that do
    not need the tensor's shape (with the upstream encoder's texts); the writer checks the rest.
    """

    scheme: str
    scale_mode: str
    scales: np.ndarray
    zp_mode: str = "none"
    zero_points: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    scale_axis: int = 0
    zp_axis: int = 0

    def __post_init__(self):
        with np.errstate(over="ignore"):  # a scale past f32's range is refused below, not warned and kept as inf
            scales = np.array(self.scales, dtype=np.float32).reshape(-1)
        given = np.asarray(self.scales)
        if given.dtype.kind in "fiu" and np.any(np.isinf(scales) & np.isfinite(given.astype(np.float64).reshape(-1))):
            raise _error(f"scale {float(given.reshape(-1)[np.argmax(np.isinf(scales))])!r} is past float32's range (the "
                         f"format stores float32 scales)")
        zps = np.asarray(self.zero_points)
        if zps.size and (zps.dtype.kind not in "iu" or zps.min() < -(1 << 31) or zps.max() >= 1 << 31):
            raise _error("zero points must be int32 values")
        zps = zps.astype(np.int32).reshape(-1)
        scales.flags.writeable = False
        zps.flags.writeable = False
        object.__setattr__(self, "scales", scales)
        object.__setattr__(self, "zero_points", zps)
        for axis in ("scale_axis", "zp_axis"):
            v = getattr(self, axis)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= int(v) < 1 << 64:
                raise _error(f"{axis} must be a non-negative integer")
            object.__setattr__(self, axis, int(v))
        if self.scheme not in ("symmetric", "asymmetric"):
            raise _error("quant scheme must be symmetric or asymmetric")
        if self.scale_mode == "per_tensor":
            if scales.size != 1 or self.scale_axis != 0:
                raise _error("per-tensor scale requires a value")
        elif self.scale_mode == "per_channel":
            if scales.size == 0:
                raise _error("per-channel scale requires axis and values")
        else:
            raise _error("scale mode must be per-tensor or per-channel")
        if self.zp_mode == "none":
            if zps.size:
                raise _error("zero points given with zp_mode none")
        elif self.scheme == "symmetric":
            raise _error("symmetric quantization does not support zero_point")
        elif self.zp_mode == "per_tensor":
            if self.scale_mode != "per_tensor":
                raise _error("per-tensor zero_point requires per-tensor scale")
            if zps.size != 1 or self.zp_axis != 0:
                raise _error("per-tensor zero_point requires a value")
        elif self.zp_mode == "per_channel":
            if self.scale_mode != "per_channel":
                raise _error("per-channel zero_point requires per-channel scale")
            if zps.size == 0:
                raise _error("per-channel zero_point requires axis and values")
            if self.zp_axis != self.scale_axis:
                raise _error("zero_point axis must match scale axis")
        else:
            raise _error("zero_point mode must be per-tensor or per-channel")

    def __eq__(self, other):
        if not isinstance(other, QuantParams):
            return NotImplemented
        return (self.scheme, self.scale_mode, self.zp_mode, self.scale_axis, self.zp_axis) == \
            (other.scheme, other.scale_mode, other.zp_mode, other.scale_axis, other.zp_axis) and \
            self.scales.tobytes() == other.scales.tobytes() and self.zero_points.tobytes() == other.zero_points.tobytes()

    __hash__ = None

    def __repr__(self) -> str:
        return f"QuantParams({self.describe()})"

    # ---------------------------------------------------------------- shape-dependent rules (writer)
    def check_shape(self, name: str, shape: tuple[int, ...]) -> str | None:
        """The upstream encoder's message (without `Tensor 'name' `) when these parameters do not fit
        a tensor of `shape`; None when they do."""
        if self.scale_mode == "per_channel":
            if self.scale_axis >= len(shape):
                return "per-channel scale axis out of range"
            if self.scales.size != shape[self.scale_axis]:
                return (f"per-channel scale length mismatch: expected {shape[self.scale_axis]}, "
                        f"got {self.scales.size}")
            if self.zp_mode == "per_channel" and self.zero_points.size != shape[self.zp_axis]:
                return (f"per-channel zero_point length mismatch: expected {shape[self.zp_axis]}, "
                        f"got {self.zero_points.size}")
        return None

    # ---------------------------------------------------------------- bytes
    def encode(self) -> bytes:
        """The payload (§3.3), padded to its exact size."""
        raw = HEAD.pack(_CODE[self.scheme], _CODE["s" + self.scale_mode], _CODE["z" + self.zp_mode], 0,
                        self.scale_axis, self.scales.size, self.zp_axis, self.zero_points.size)
        raw += self.scales.astype("<f4").tobytes() + self.zero_points.astype("<i4").tobytes()
        return raw + b"\x00" * (payload_nbytes(self.scales.size, self.zero_points.size) - len(raw))

    def describe(self) -> str:
        """The upstream verifier's line: `scheme=asymmetric, scale=per_tensor(0.125), zero_point=...`."""
        def part(mode, axis, values):
            if mode == "none":
                return "none"
            if mode == "per_tensor":
                return f"per_tensor({values[0].item()!r})"
            return f"per_channel(axis={axis}, count={values.size})"
        return (f"scheme={self.scheme}, scale={part(self.scale_mode, self.scale_axis, self.scales)}, "
                f"zero_point={part(self.zp_mode, self.zp_axis, self.zero_points)}")


# the stored dtypes whose QuantParams a float constant honours (bind: `TensorInfo.binds_as`)
AFFINE_DTYPES = ("i8", "u8")


def dequantize(q: QuantParams, values: np.ndarray) -> np.ndarray:
    """The conventional affine reading of stored integers, `real = scale[c] * (q - zp[c])` (c the
    index along `scale_axis` for per-channel scales; zp 0 without zero points), as float32: the
    difference exact, the product computed in float64 and rounded once."""
    v = np.asarray(values)
    return affine_values(v, *_broadcast(q, v.shape))


def affine_values(values: np.ndarray, scales: np.ndarray, zps: np.ndarray) -> np.ndarray:
    """scale * (q - zp) with the scales and zero points broadcast against the integers: the one
    rule of `dequantize` (also for a packed tensor a program reads as f32: runtime/program)."""
    return np.asarray((np.asarray(scales, np.float64) * (np.asarray(values).astype(np.int64)  # 0-d stays an array
                                                         - np.asarray(zps, np.int64))).astype(np.float32))


# |q - zp| at most this: the difference is exact in f32, so the step's f32 product equals `dequantize`
_EXACT_DIFF = 1 << 24
_SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)


def affine_parts(q: QuantParams, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale f32, zero point i32), each shaped to broadcast against `shape` (1 on every axis but a
    per-channel one), when a program may keep the stored i8/u8 integers packed and dequantize them
    inside the step (`oi2jax.quantized`'s AFFINE tensors) with exactly `dequantize`'s values; None
    where it must read them as f32 at load. Kept: every scale finite and 0 or normal, and every
    |q - zp| (q an i8 or u8 value) at most 2^24. Then (q - zp) is exact in f32 and its f32 product
    with the scale is `dequantize`'s (a product of two f32 values is exact in f64: rounding it once
    to f32 is what an f32 multiply does), with no subnormal value for a CPU to flush."""
    if not shape or 0 in shape:
        return None
    scales = q.scales
    if not np.all(np.isfinite(scales)) or np.any((scales != 0) & (np.abs(scales) < _SMALLEST_NORMAL)):
        return None
    zps = q.zero_points if q.zp_mode != "none" else np.zeros(1, np.int32)
    if np.any(np.abs(zps.astype(np.int64)) > _EXACT_DIFF - 255):
        return None
    return _broadcast(q, shape)


def _broadcast(q: QuantParams, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(scales f32, zero points i32) shaped to broadcast against a tensor of `shape`: 1 on every
    axis but a per-channel one (zero points 0 where there are none)."""
    def along(arr, per_channel: bool, axis: int):
        out = [1] * len(shape)
        if per_channel:
            out[axis] = shape[axis]
        return np.array(arr.reshape(out), order="C")  # not ascontiguousarray: it makes a 0-d array 1-d
    zps = q.zero_points if q.zp_mode != "none" else np.zeros(1, np.int32)
    return (along(q.scales.astype(np.float32), q.scale_mode == "per_channel", q.scale_axis),
            along(zps.astype(np.int32), q.zp_mode == "per_channel", q.zp_axis))


def _error(text: str) -> OiError:
    return OiError(f"invalid quantization parameters: {text}")


def parse(raw: bytes, name: str, shape: tuple[int, ...]) -> tuple[QuantParams | None, str | None]:
    """A stored payload -> (QuantParams, None), or (None, the Rust loader's message) when invalid.

    The rules and their order are the upstream Rust loader's (`parse_quant_params`, SPEC-2026-03
    §3.7), applied to every quantized tensor (D7), 1-element ones included."""
    n = len(raw)
    if n < 48:
        return None, f"tensor quant payload too small for {name}"
    scheme, scale_mode, zp_mode, reserved, s_axis, s_count, z_axis, z_count = HEAD.unpack_from(raw, 0)
    if reserved != 0:
        return None, f"tensor quant reserved must be 0 for {name}"
    if n != payload_nbytes(s_count, z_count):
        return None, f"tensor quant payload size mismatch for {name}"
    if scheme not in SCHEMES:
        return None, f"invalid quant scheme for {name}"
    if scale_mode == 1:
        if s_axis != 0 or s_count != 1:
            return None, f"per-tensor scale requires axis=0,count=1 for {name}"
    elif scale_mode == 2:
        if s_axis >= len(shape):
            return None, f"per-channel scale axis out of range for {name}"
        if s_count != shape[s_axis]:
            return None, f"per-channel scale count mismatch for {name}"
    else:
        return None, f"invalid quant scale mode for {name}"
    if zp_mode == 0:
        if z_count != 0:
            return None, f"zero-point none mode requires count=0 for {name}"
    elif zp_mode == 1:
        if scale_mode != 1:
            return None, f"per-tensor zero-point requires per-tensor scale for {name}"
        if z_axis != 0 or z_count != 1:
            return None, f"per-tensor zero-point requires axis=0,count=1 for {name}"
    elif zp_mode == 2:
        if scale_mode != 2:
            return None, f"per-channel zero-point requires per-channel scale for {name}"
        if z_axis >= len(shape):
            return None, f"per-channel zero-point axis out of range for {name}"
        if z_axis != s_axis:
            return None, f"per-channel zero-point axis must match scale axis for {name}"
        if z_count != shape[z_axis]:
            return None, f"per-channel zero-point count mismatch for {name}"
    else:
        return None, f"invalid quant zero-point mode for {name}"
    if scheme == 1 and zp_mode != 0:
        return None, f"symmetric quantization cannot include zero-point for {name}"
    scales = np.frombuffer(raw, "<f4", s_count, 48).astype(np.float32)
    zps = np.frombuffer(raw, "<i4", z_count, 48 + 4 * s_count).astype(np.int32)
    q = QuantParams.__new__(QuantParams)  # validated above with the loader's rules: no second pass
    for k, v in (("scheme", SCHEMES[scheme]), ("scale_mode", SCALE_MODES[scale_mode]), ("scales", scales),
                 ("zp_mode", ZP_MODES[zp_mode]), ("zero_points", zps), ("scale_axis", s_axis),
                 ("zp_axis", z_axis)):
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
        object.__setattr__(q, k, v)
    return q, None
