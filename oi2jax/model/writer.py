"""`.oinf` writer (SPEC §7, SPEC-2026-03 §3): `save(path, sizevars={}, metadata={}, tensors={}, version=2)`.

Version 2 by default (D8: the only version current upstream reads); `version=1` writes the 1fc5207
format (an error when a tensor carries quantization metadata). A v2 tensor's quant payload follows
its own data payload (D5: the layout the upstream encoder's offsets describe, byte-identical to
upstream's output whenever that output is valid).

Layout exactly as the reference encoder: header at 0 (padded to 72), sizevar table at 72,
metadata table, tensor table (each section starting at the next multiple of 8, entries sorted
by name), then the data section: metadata payloads in key order, then tensor payloads in name
order, each padded to 8. Reading a file and saving its contents back reproduces it byte for byte.

Tensors: NumPy / ml_dtypes arrays (dtype inferred: float32 -> f32, bfloat16 -> bf16,
float8_e5m2 -> f8, int4 -> i4, uint4 -> u4, int2 -> i2, uint2 -> u2, bool, ...) or
`Tensor(dtype, data)` with an explicit OpenInfer dtype (packed values given as ints, e.g. int8;
`data=None` with `shape=` writes a tensor without data), or `LazyTensor(dtype, shape, load)`:
values produced by `load()` only when the writer reaches that tensor, written and dropped before
the next one, so a model larger than memory (a converted checkpoint) is written with about one
tensor in memory at a time. The file is streamed into a temporary file renamed over the target.
Metadata: int -> smallest fitting u8..u64 / i8..i64, float -> f32 (rounded, as a model's f32 graph reads it;
one that f32 turns into 0 or an infinity is an error: `Meta("f64", value)` keeps it), str -> string, bool -> bool,
NumPy scalar -> its dtype, np.ndarray -> ndarray, or `Meta(type, value, elem=None)` explicitly.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .. import dtypes as dt
from ..host_numerics import bf16_encode, f8_encode
from ..npz import NotRegularFileError, write_atomic
from . import packing
from .quant import QuantParams
from .reader import (ALIGN, DEFAULT_VERSION, HEADER_PADDED, MAGIC, NAME_RE, VERSIONS, HEADER, Meta, MetaValue,
                     ModelError)

__all__ = ["save", "Tensor", "LazyTensor", "Meta", "QuantParams", "encode", "dtype_of_array", "overflow"]


@dataclass(frozen=True)
class Tensor:
    """An explicitly typed tensor for `save`: `Tensor("i4", np.array([...], np.int8))`.

    `data=None` writes a tensor without data; give its `shape` then. `quant`: quantization
    metadata (version 2 only; stored as given: a float constant bound to it reads its affine
    reading, docs/semantics.md)."""

    dtype: str
    data: object = None
    shape: tuple[int, ...] | None = None
    quant: QuantParams | None = None


@dataclass(frozen=True)
class LazyTensor:
    """A tensor whose values `save` asks for only when it writes them: `load()` returns an array of
    exactly `shape` that `encode` can store as `dtype` (e.g. already in `dtype`'s representation).
    `save` calls each `load` once, in name order, after the tables are laid out from `dtype` and
    `shape`, and drops the values before the next tensor: peak memory is about one tensor."""

    dtype: str
    shape: tuple[int, ...]
    load: object  # () -> array


_NP_TO_OI = {
    "float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "float8_e5m2": "f8",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "bool",
    "int4": "i4", "uint4": "u4", "int2": "i2", "uint2": "u2",
}


def dtype_of_array(array: np.ndarray) -> str | None:
    """The OpenInfer dtype a NumPy / ml_dtypes dtype maps to (None when there is none)."""
    return _NP_TO_OI.get(np.dtype(array.dtype).name)


def _pad8(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _padded(b: bytes) -> bytes:
    return b + b"\x00" * (_pad8(len(b)) - len(b))


def _string(path: str, s: str, what: str, check_name: bool = True) -> bytes:
    if not isinstance(s, str):
        raise ModelError(path, f"{what}: name must be a str, got {type(s).__name__}")
    if check_name and not NAME_RE.match(s):
        raise ModelError(path, f"{what}: invalid name {s!r} (names match [A-Za-z0-9._-]+)")
    raw = s.encode("ascii" if check_name else "utf-8")
    if len(raw) >= 1 << 32:
        raise ModelError(path, f"{what}: string too long")
    return _padded(struct.pack("<I", len(raw)) + raw)


def overflow(given: np.ndarray, stored: np.ndarray, dtype: str) -> str | None:
    """THE float-range rule of model values (the writer's and the converters'): a finite value given
    for float dtype `dtype` must stay finite when stored as it; what is said when one does not (the
    largest such value: 70000 as f16, 1e300 as f32), else None. Rounding, down to zero for a value
    below the dtype's smallest, is what storing as `dtype` means."""
    with np.errstate(over="ignore", invalid="ignore"):
        bad = np.isfinite(given) & ~np.isfinite(stored.astype(np.float32, copy=False))
    if not bad.any():
        return None
    worst = float(np.max(np.abs(np.asarray(given)[bad].astype(np.float64))))
    return f"value {worst:g} overflows {dtype} (largest finite {float(ml_dtypes.finfo(dt.get(dtype).np_dtype).max):g})"


def encode(dtype: str, data, path: str = "<model>", what: str = "tensor") -> bytes:
    """Values -> stored bytes for dtype `dtype` (§5, §7.5). Raises ModelError on values that do not fit.

    Floats of another float dtype are converted (f8 with the §5.4 encoder, bf16 by §5.3); integer
    and packed values must be in range; arrays already in the representation are stored bit-exact.
    """
    d = dt.get(dtype)
    a = np.asarray(data)
    name = np.dtype(a.dtype).name
    if d.packed:
        if name not in _NP_TO_OI or a.dtype.kind == "f" or name in ("bfloat16", "float8_e5m2", "float16"):
            raise ModelError(path, f"{what}: {dtype} values must be integers, got {a.dtype}")
        ints = a.astype(np.int64)
        ok = packing.valid_values(dtype, ints)
        if not np.all(ok):
            bad = ints.reshape(-1)[~ok.reshape(-1)][0]
            lo, hi = packing.value_range(dtype)
            allowed = "-1 or 1" if dtype == "t1" else f"{lo}..{hi}"
            raise ModelError(path, f"{what}: value {bad} is out of range for {dtype} ({allowed})")
        return packing.pack(dtype, ints).tobytes()
    if d.name == "bool":
        if a.dtype != np.bool_:
            if a.dtype.kind not in "iu" or not np.all((a == 0) | (a == 1)):
                raise ModelError(path, f"{what}: bool values must be booleans (or 0/1), got {a.dtype}")
        return a.astype(np.uint8).tobytes()
    if a.dtype == d.np_dtype:
        return a.astype(d.np_dtype.newbyteorder("<"), copy=False).tobytes()
    if d.is_float:
        if a.dtype.kind not in "fiub" and name not in ("bfloat16", "float8_e5m2"):
            raise ModelError(path, f"{what}: cannot store {a.dtype} values as {dtype}")
        with np.errstate(over="ignore", invalid="ignore"):
            if d.name == "f8":
                out = f8_encode(a.astype(np.float32))
            elif d.name == "bf16":
                out = bf16_encode(a.astype(np.float32))
            else:
                out = a.astype(d.np_dtype.newbyteorder("<"))
        lost = overflow(a, out, dtype)
        if lost:
            raise ModelError(path, f"{what}: {lost}")
        return out.tobytes()
    # integer / bitset targets
    if a.dtype.kind == "b":
        a = a.astype(np.uint8)
    if a.dtype.kind not in "iu" and name not in ("int4", "uint4", "int2", "uint2"):
        raise ModelError(path, f"{what}: cannot store {a.dtype} values as {dtype} (integers required)")
    lo, hi = int(d.min), int(d.max)
    if a.size:
        amin, amax = int(a.min()), int(a.max())
        if amin < lo or amax > hi:
            bad = amin if amin < lo else amax
            raise ModelError(path, f"{what}: value {bad} is out of range for {dtype} ({lo}..{hi})")
    return a.astype(d.np_dtype.newbyteorder("<")).tobytes()


def _tensor_spec(path: str, name: str, value) -> tuple[str, tuple[int, ...], bytes | None, bytes | None]:
    """(dtype, shape, data payload or None, quant payload or None) of one tensor."""
    what = f"tensor {name}"
    if isinstance(value, LazyTensor):
        if not dt.is_dtype(value.dtype):
            raise ModelError(path, f"{what}: unknown dtype {value.dtype!r}")
        shape = tuple(int(s) for s in value.shape)
        if any(s < 0 for s in shape):
            raise ModelError(path, f"{what}: negative dimension in {list(shape)}")
        if not callable(value.load):
            raise ModelError(path, f"{what}: LazyTensor.load must be callable")
        return value.dtype, shape, _Deferred(name, value), None
    if isinstance(value, Tensor):
        if not dt.is_dtype(value.dtype):
            raise ModelError(path, f"{what}: unknown dtype {value.dtype!r}")
        quant = value.quant
        if quant is not None and not isinstance(quant, QuantParams):
            raise ModelError(path, f"Tensor '{name}' quant must be QuantParams")
        if value.data is None:
            if value.shape is None:
                raise ModelError(path, f"{what}: a tensor without data needs a shape")
            shape = tuple(int(s) for s in value.shape)
            if any(s < 0 for s in shape):
                raise ModelError(path, f"{what}: negative dimension in {list(shape)}")
            data = None
        else:
            arr = np.asarray(value.data)
            if value.shape is not None and tuple(value.shape) != arr.shape:
                arr = arr.reshape(tuple(value.shape))
            shape, data = arr.shape, encode(value.dtype, arr, path, what)
        if quant is None:
            return value.dtype, shape, data, None
        why = quant.check_shape(name, shape)
        if why:
            raise ModelError(path, f"Tensor '{name}' {why}")
        return value.dtype, shape, data, quant.encode()
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        raise ModelError(path, f"{what}: expected a NumPy array or Tensor, got {type(value).__name__}")
    dtype = dtype_of_array(value)
    if dtype is None:
        raise ModelError(path, f"{what}: NumPy dtype {value.dtype} has no OpenInfer dtype "
                               f"(use Tensor(dtype, data))")
    return dtype, value.shape, encode(dtype, value, path, what), None


def _stored_nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    numel = 1
    for n in shape:
        numel *= n
    d = dt.get(dtype)
    return packing.packed_nbytes(numel, d.bits) if d.packed else numel * (d.bits // 8)


class _Deferred:
    """A LazyTensor's payload: its size is known from dtype and shape; its bytes come at write time."""

    def __init__(self, name: str, lazy: LazyTensor):
        self.name, self.lazy = name, lazy
        self.nbytes = _stored_nbytes(lazy.dtype, tuple(int(s) for s in lazy.shape))

    def __len__(self) -> int:
        return self.nbytes

    def write(self, f, path: str) -> None:
        what = f"tensor {self.name}"
        lazy = self.lazy
        arr = np.asarray(lazy.load())
        shape = tuple(int(s) for s in lazy.shape)
        if arr.shape != shape:
            raise ModelError(path, f"{what}: load() gave shape {list(arr.shape)}, declared {list(shape)}")
        d = dt.get(lazy.dtype)
        if not d.packed and d.name != "bool" and arr.dtype == d.np_dtype:
            # already stored as is: write the array's own bytes (no second copy of the tensor)
            buf = np.ascontiguousarray(arr.astype(d.np_dtype.newbyteorder("<"), copy=False)).reshape(-1)
            buf = buf.view(np.uint8)
        else:
            buf = encode(lazy.dtype, arr, path, what)
        if len(buf) != self.nbytes:  # cannot happen for a well-formed shape; never write a corrupt file
            raise ModelError(path, f"{what}: {len(buf)} bytes of data, expected {self.nbytes}")
        del arr
        f.write(buf)
        f.write(b"\x00" * (_pad8(self.nbytes) - self.nbytes))


def _smallest_int(v: int) -> str:
    if v >= 0:
        for name in dt.UNSIGNED_INTS:
            if v <= dt.get(name).max:
                return name
    else:
        for name in dt.SIGNED_INTS:
            if v >= dt.get(name).min:
                return name
    raise OverflowError


def _meta_spec(path: str, key: str, value) -> tuple[int, bytes]:
    """(value type code, payload bytes before padding) of one metadata value."""
    what = f"metadata {key}"
    if isinstance(value, MetaValue):
        mtype, v, elem = value.type, value.value, value.elem
    elif isinstance(value, bool) or isinstance(value, np.bool_):
        mtype, v, elem = "bool", value, None
    elif isinstance(value, np.generic):
        mtype = dtype_of_array(np.asarray(value))
        if mtype is None:
            raise ModelError(path, f"{what}: NumPy dtype {value.dtype} has no OpenInfer dtype")
        v, elem = value, None
    elif isinstance(value, int):
        try:
            mtype = _smallest_int(value)
        except OverflowError:
            raise ModelError(path, f"{what}: integer {value} does not fit in 64 bits") from None
        v, elem = value, None
    elif isinstance(value, float):
        mtype, v, elem = "f32", value, None
    elif isinstance(value, str):
        mtype, v, elem = "string", value, None
    elif isinstance(value, np.ndarray):
        mtype, v, elem = "ndarray", value, None
    else:
        raise ModelError(path, f"{what}: unsupported metadata value of type {type(value).__name__}")

    if mtype == "string":
        if not isinstance(v, str):
            raise ModelError(path, f"{what}: string metadata needs a str")
        return dt.CODE_STRING, _string(path, v, what, check_name=False)
    if mtype == "bitset":
        bits = np.asarray(v)
        if bits.ndim != 1 or not np.all((bits == 0) | (bits == 1)):
            raise ModelError(path, f"{what}: bitset metadata needs a 1-D array of bools / 0-1 values")
        packed = packing.pack_bits(bits.astype(np.uint8), 1).tobytes()
        return dt.get("bitset").code, struct.pack("<II", bits.size, len(packed)) + packed
    if mtype == "ndarray":
        arr = np.asarray(v)
        if elem is None:
            elem = dtype_of_array(arr)
            if elem is None:
                raise ModelError(path, f"{what}: NumPy dtype {arr.dtype} has no OpenInfer dtype "
                                       f"(use Meta('ndarray', array, elem=DTYPE))")
        if not dt.is_dtype(elem) or elem == "bitset":
            raise ModelError(path, f"{what}: ndarray element type {elem!r} is not a scalar type")
        head = struct.pack(f"<II{arr.ndim}Q", dt.get(elem).code, arr.ndim, *arr.shape)
        return dt.CODE_NDARRAY, head + encode(elem, arr, path, what)
    if not dt.is_dtype(mtype):
        raise ModelError(path, f"{what}: unknown metadata type {mtype!r}")
    arr = np.asarray(v)
    if arr.shape != ():
        raise ModelError(path, f"{what}: {mtype} metadata must be a scalar")
    if isinstance(v, (int, bool)) and not isinstance(v, bool) and dt.get(mtype).is_float:
        arr = np.asarray(float(v))
    raw = encode(mtype, arr, path, what)
    d = dt.get(mtype)
    if d.is_float and arr != 0 and np.frombuffer(raw, d.np_dtype.newbyteorder("<"))[0] == 0:  # +0.0 or -0.0
        raise ModelError(path, f"{what}: value {v!r} is 0 in {mtype}, in which the file would hold it "
                               f"(give Meta('f64', value) to keep it)")
    return d.code, raw


def save(path, sizevars: dict | None = None, metadata: dict | None = None, tensors: dict | None = None,
         version: int = DEFAULT_VERSION) -> None:
    """Write a `.oinf` file (§7; version 2 by default). ModelError on invalid names, values out of
    range, unknown dtypes, invalid quantization metadata, or quantization in a version 1 file."""
    path_s = os.fspath(path)
    if version not in VERSIONS:
        raise ModelError(path_s, f"cannot write OINF version {version!r} (versions 1 and 2 exist)")
    sizevars = dict(sizevars or {})
    metadata = dict(metadata or {})
    tensors = dict(tensors or {})

    sv_table = bytearray()
    for name in sorted(sizevars):
        value = sizevars[name]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise ModelError(path_s, f"sizevar {name}: value must be an integer, got {value!r}")
        if not 0 <= int(value) < 1 << 64:
            raise ModelError(path_s, f"sizevar {name}: value {value} out of range (0..2^64-1)")
        sv_table += _string(path_s, name, f"sizevar {name!r}") + struct.pack("<Q", int(value))

    metas = []
    for key in sorted(metadata):
        keyb = _string(path_s, key, f"metadata {key!r}")
        code, payload = _meta_spec(path_s, key, metadata[key])
        metas.append((keyb, code, payload))

    specs = []
    for name in sorted(tensors):
        nameb = _string(path_s, name, f"tensor {name!r}")
        dtype, shape, data, quant = _tensor_spec(path_s, name, tensors[name])
        if quant is not None and version == 1:
            raise ModelError(path_s, f"tensor {name}: quantization metadata needs OINF version 2 "
                                     f"(version 1 has no place for it)")
        specs.append((nameb, dtype, shape, data, quant))

    off_sv = HEADER_PADDED
    off_meta = _pad8(off_sv + len(sv_table))
    meta_table_len = sum(len(k) + 24 for k, _, _ in metas)
    off_t = _pad8(off_meta + meta_table_len)
    entry_tail = 16 if version == 1 else 32  # data_nbytes/offset (+ quant_nbytes/offset in v2)
    tensor_table_len = sum(len(n) + 12 + 8 * len(shape) + entry_tail for n, _, shape, _, _ in specs)
    off_data = _pad8(off_t + tensor_table_len)

    # the data section as pieces: bytes (as stored) or a _Deferred (written padded when reached)
    pieces: list = []
    data_len = 0

    def add(piece) -> int:
        nonlocal data_len
        offset = off_data + data_len
        pieces.append(piece)
        data_len += _pad8(len(piece)) if isinstance(piece, _Deferred) else len(piece)
        return offset

    meta_table = bytearray()
    for keyb, code, payload in metas:
        padded = _padded(payload)
        offset = add(padded)
        # scalars record their exact size; string / bitset / ndarray their padded size (§7.4)
        nbytes = len(padded) if code in (dt.CODE_STRING, dt.CODE_NDARRAY, dt.get("bitset").code) else len(payload)
        meta_table += keyb + struct.pack("<IIQQ", code, 0, nbytes, offset)
    tensor_table = bytearray()
    for nameb, dtype, shape, payload, quant in specs:
        nbytes = offset = flags = q_nbytes = q_offset = 0
        if payload is not None:
            nbytes, flags = len(payload), 1
            offset = add(payload if isinstance(payload, _Deferred) else _padded(payload))
        if quant is not None:  # right after the tensor's own data (D5)
            q_nbytes = len(quant)
            q_offset = add(quant)
            flags |= 2
        tail = struct.pack("<QQ", nbytes, offset) + (struct.pack("<QQ", q_nbytes, q_offset) if version == 2 else b"")
        tensor_table += nameb + struct.pack(f"<III{len(shape)}Q", dt.get(dtype).code, len(shape), flags,
                                            *shape) + tail
    file_size = off_data + data_len

    header = HEADER.pack(MAGIC, version, 0, len(sizevars), len(metas), len(specs), 0,
                          off_sv, off_meta, off_t, off_data, file_size)
    head = bytearray(header)
    for off, section in ((off_sv, sv_table), (off_meta, meta_table), (off_t, tensor_table)):
        head += b"\x00" * (off - len(head))
        head += section
    head += b"\x00" * (off_data - len(head))

    def write(f):
        f.write(head)
        for piece in pieces:
            if isinstance(piece, _Deferred):
                piece.write(f, path_s)
            else:
                f.write(piece)
        if f.tell() != file_size:  # a LazyTensor's load misbehaved; never keep a corrupt file
            raise ModelError(path_s, f"internal error: wrote {f.tell()} bytes, expected {file_size}")

    try:  # a temporary file renamed over the target: a reader that has the old file open keeps
        # reading the old bytes, and an interrupted (or failing lazy) write never leaves a
        # half-written model nor damages the file already there
        write_atomic(path_s, write)
    except (IsADirectoryError, NotRegularFileError) as exc:
        raise ModelError(path_s, exc.strerror) from None
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and exc.filename == path_s:  # its directory (npz.writable_target)
            raise ModelError(path_s, exc.strerror) from None
        raise ModelError(path_s, f"cannot write model file: {exc}") from None
