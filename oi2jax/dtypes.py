"""The OpenInfer dtype table: names, `.oinf` codes, widths, families and value representations.

Every stage reads this one table. A value of DSL dtype `d` is held (on host and in JAX) in
`DTYPES[d].np_dtype`: packed signed ints (i1/i2/i4, t1/t2) as sign-extended int8, packed
unsigned (u1/u2/u4) and bitset as uint8, f8 as float8_e5m2 (E5M2 bits), bf16 as bfloat16.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

FLOAT, SIGNED, UNSIGNED, BOOL, BITSET, TERNARY = "float", "signed", "unsigned", "bool", "bitset", "ternary"


@dataclass(frozen=True)
class DType:
    """One OpenInfer dtype. `bits` is the storage width (packed types < 8)."""

    name: str
    code: int  # .oinf dtype code (§7.5)
    bits: int
    family: str  # float | signed | unsigned | bool | bitset | ternary
    np_dtype: np.dtype  # representation of one element after unpacking

    @property
    def packed(self) -> bool:
        """Sub-byte storage (i1 i2 i4 u1 u2 u4 t1 t2)."""
        return self.bits < 8

    @property
    def is_float(self) -> bool:
        return self.family == FLOAT

    @property
    def is_int(self) -> bool:
        return self.family in (SIGNED, UNSIGNED)

    @property
    def is_signed(self) -> bool:
        return self.family in (SIGNED, TERNARY)

    @property
    def min(self) -> int | float:
        """Smallest representable value (ints: of the DSL width, not the container)."""
        if self.family == SIGNED:
            return -(1 << (self.bits - 1))
        if self.family in (UNSIGNED, BITSET, BOOL):
            return 0
        if self.family == TERNARY:
            return -1
        return float(ml_dtypes.finfo(self.np_dtype).min) if self.name in ("bf16", "f8") else float(np.finfo(self.np_dtype).min)

    @property
    def max(self) -> int | float:
        if self.family == SIGNED:
            return (1 << (self.bits - 1)) - 1
        if self.family in (UNSIGNED, BITSET):
            return (1 << self.bits) - 1
        if self.family in (BOOL, TERNARY):
            return 1
        return float(ml_dtypes.finfo(self.np_dtype).max) if self.name in ("bf16", "f8") else float(np.finfo(self.np_dtype).max)

    @property
    def itemsize_bits(self) -> int:
        return self.bits

    def nbytes(self, numel: int) -> int:
        """Storage bytes for `numel` elements (packed: ceil(numel*bits/8))."""
        return (numel * self.bits + 7) // 8

    @property
    def output_np_dtype(self) -> np.dtype:
        """The dtype written to `--out` / returned by Program.run: bf16/f8 widen to float32."""
        if self.name in ("bf16", "f8"):
            return np.dtype(np.float32)
        return self.np_dtype


def _d(name, code, bits, family, np_dtype) -> DType:
    return DType(name, code, bits, family, np.dtype(np_dtype))


DTYPES: dict[str, DType] = {d.name: d for d in [
    _d("i8", 1, 8, SIGNED, np.int8),
    _d("i16", 2, 16, SIGNED, np.int16),
    _d("i32", 3, 32, SIGNED, np.int32),
    _d("i64", 4, 64, SIGNED, np.int64),
    _d("u8", 5, 8, UNSIGNED, np.uint8),
    _d("u16", 6, 16, UNSIGNED, np.uint16),
    _d("u32", 7, 32, UNSIGNED, np.uint32),
    _d("u64", 8, 64, UNSIGNED, np.uint64),
    _d("f16", 9, 16, FLOAT, np.float16),
    _d("f32", 10, 32, FLOAT, np.float32),
    _d("f64", 11, 64, FLOAT, np.float64),
    _d("bool", 12, 8, BOOL, np.bool_),
    _d("bitset", 13, 8, BITSET, np.uint8),
    _d("bf16", 16, 16, FLOAT, ml_dtypes.bfloat16),
    _d("f8", 17, 8, FLOAT, ml_dtypes.float8_e5m2),
    _d("i4", 18, 4, SIGNED, np.int8),
    _d("i2", 19, 2, SIGNED, np.int8),
    _d("i1", 20, 1, SIGNED, np.int8),
    _d("u4", 21, 4, UNSIGNED, np.uint8),
    _d("u2", 22, 2, UNSIGNED, np.uint8),
    _d("u1", 23, 1, UNSIGNED, np.uint8),
    _d("t2", 24, 2, TERNARY, np.int8),
    _d("t1", 25, 1, TERNARY, np.int8),
]}

BY_CODE: dict[int, DType] = {d.code: d for d in DTYPES.values()}

# .oinf metadata-only value type codes (§7.4)
CODE_STRING = 14
CODE_NDARRAY = 15

FLOATS = ("f8", "bf16", "f16", "f32", "f64")
SIGNED_INTS = ("i8", "i16", "i32", "i64")
UNSIGNED_INTS = ("u8", "u16", "u32", "u64")
PACKED_SIGNED = ("i1", "i2", "i4")
PACKED_UNSIGNED = ("u1", "u2", "u4")


def get(name: str) -> DType:
    """The DType named `name`; KeyError if it is not an OpenInfer dtype."""
    return DTYPES[name]


def is_dtype(name: str) -> bool:
    return name in DTYPES


def needs_x64(names) -> bool:
    """True when any of the dtypes needs JAX's 64-bit mode."""
    return any(DTYPES[n].bits == 64 for n in names)


def to_output(array: np.ndarray, dtype: str) -> np.ndarray:
    """Widen a value for `--out` / Program.run: bf16, f8 -> float32; everything else as held."""
    return np.asarray(array).astype(DTYPES[dtype].output_np_dtype, copy=False)

# the dtypes an `acc=[A, O]` list may name (SPEC-2026-03 §1.3 ACC_DTYPE)
ACC_DTYPES = ("i4", "i8", "i16", "i32", "i64", "u4", "u8", "u16", "u32", "u64", "f8", "bf16", "f16", "f32", "f64",
              "bool")
