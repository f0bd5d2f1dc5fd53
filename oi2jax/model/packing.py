"""Sub-byte packing (SPEC §5.1), NumPy only, shared by the `.oinf` reader/writer and the lowering.

Layout: row-major, LSB-first. Element n of width w lives in byte `n*w // 8` at bit offset
`(n*w) % 8`. Signed types (i1 i2 i4 t2) store w-bit two's complement and read back by sign
extension; unsigned (u1 u2 u4) zero-extend; `t1` stores -1 as bit 0 and +1 as bit 1.

    pack_bits(values, bits) -> uint8[ceil(n*bits/8)]       (values already as w-bit patterns)
    unpack_bits(raw, n, bits) -> uint8[n]                   (raw w-bit patterns)
    pack(dtype, values) -> uint8 bytes                       (DSL values, e.g. int8 -8..7 for i4)
    unpack(dtype, raw, shape) -> int8/uint8 array of `shape` (the dtype's representation)
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt

__all__ = ["pack_bits", "unpack_bits", "pack", "unpack", "packed_nbytes", "value_range", "to_patterns",
           "from_patterns"]


def packed_nbytes(numel: int, bits: int) -> int:
    """Storage bytes of `numel` elements of width `bits`: ceil(numel*bits/8)."""
    return (numel * bits + 7) // 8


def pack_bits(patterns, bits: int) -> np.ndarray:
    """Pack flat w-bit patterns (ints in 0..2^bits-1; higher bits are dropped) LSB-first into uint8."""
    if bits not in (1, 2, 4, 8):
        raise ValueError(f"unsupported packed width {bits}")
    p = (np.asarray(patterns).reshape(-1).astype(np.uint8)) & np.uint8((1 << bits) - 1)
    if bits == 8:
        return p.copy()
    per = 8 // bits
    n = p.size
    pad = (-n) % per
    if pad:
        p = np.concatenate([p, np.zeros(pad, np.uint8)])
    p = p.reshape(-1, per).astype(np.uint16)
    shifts = (np.arange(per, dtype=np.uint16) * bits)
    return (p << shifts).sum(axis=1, dtype=np.uint16).astype(np.uint8)


def unpack_bits(raw, numel: int, bits: int) -> np.ndarray:
    """The first `numel` w-bit patterns of the packed bytes `raw` (uint8 result)."""
    if bits not in (1, 2, 4, 8):
        raise ValueError(f"unsupported packed width {bits}")
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if bits == 8:
        return raw[:numel].copy()
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits)
    out = (raw[:, None] >> shifts[None, :]) & np.uint8((1 << bits) - 1)
    return out.reshape(-1)[:numel].astype(np.uint8)


def value_range(dtype: str) -> tuple[int, int]:
    """The DSL value range of a packed dtype (t1: -1..1, only -1 and 1 valid)."""
    d = dt.get(dtype)
    return int(d.min), int(d.max)


def valid_values(dtype: str, values) -> np.ndarray:
    """Boolean mask: which (integer) values are representable in packed dtype `dtype`."""
    v = np.asarray(values).astype(np.int64)
    if dtype == "t1":
        return (v == -1) | (v == 1)
    lo, hi = value_range(dtype)
    return (v >= lo) & (v <= hi)


def to_patterns(dtype: str, values) -> np.ndarray:
    """DSL values -> w-bit storage patterns (uint8). No range check (see `valid_values`)."""
    d = dt.get(dtype)
    v = np.asarray(values).astype(np.int64)
    if dtype == "t1":
        return (v > 0).astype(np.uint8)
    return (v & ((1 << d.bits) - 1)).astype(np.uint8)


def from_patterns(dtype: str, patterns) -> np.ndarray:
    """w-bit storage patterns -> DSL values in the dtype's representation (int8 / uint8)."""
    d = dt.get(dtype)
    p = np.asarray(patterns).astype(np.int16)
    if dtype == "t1":
        return np.where(p & 1, 1, -1).astype(np.int8)
    if d.is_signed:
        p = p & ((1 << d.bits) - 1)
        p = np.where(p >= (1 << (d.bits - 1)), p - (1 << d.bits), p)
        return p.astype(np.int8)
    return (p & ((1 << d.bits) - 1)).astype(np.uint8)


def pack(dtype: str, values) -> np.ndarray:
    """Pack DSL values of packed dtype `dtype` (any shape, row-major) into uint8 storage bytes."""
    d = dt.get(dtype)
    return pack_bits(to_patterns(dtype, values), d.bits)


def unpack(dtype: str, raw, shape) -> np.ndarray:
    """Unpack storage bytes into an array of `shape` in `dtype`'s representation (int8 / uint8)."""
    d = dt.get(dtype)
    shape = tuple(int(s) for s in shape)
    numel = int(np.prod(shape, dtype=object)) if shape else 1
    return from_patterns(dtype, unpack_bits(raw, numel, d.bits)).reshape(shape)
