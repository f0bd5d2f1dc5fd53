"""`.oinf` reader (SPEC §7): validate the whole header and every table first, then load lazily.

`open_model(path)` memory-maps the file, checks every field of §7.7 (and then some: section
bounds, overlapping payloads, absurd sizes) BEFORE any tensor data is touched, decodes the
(small) sizevar and metadata tables, and records each tensor's dtype/shape/offset. Tensor data
is read only by `Model.load(name)` / `Model.load_packed(name)` and cached; `Model.bytes_loaded`
counts the tensor bytes actually read from the file. Every problem raises `ModelError`
(`PATH: what is wrong`); never another exception or a huge allocation.
"""
from __future__ import annotations

import dataclasses
import mmap
import os
import re
import stat
import struct

import numpy as np

from .. import dtypes as dt
from ..diagnostics import OiError
from ..ir import MAX_RANK
from . import ggml, packing
from .quant import AFFINE_DTYPES, QuantParams, parse as parse_quant

MAGIC = b"OINF\x00"
VERSIONS = (1, 2)  # 1: SPEC §7 (1fc5207); 2: SPEC-2026-03 §3 (per-tensor quantization metadata)
DEFAULT_VERSION = 2  # what the writer writes (D8: the only version current upstream reads)
# dtype codes current upstream's Rust loader rejects (SPEC-2026-03 §3.4); oi2jax reads them (D6)
NOT_UPSTREAM_LOADABLE = frozenset({13, 19, 20, 22, 23, 24, 25})
HEADER_SIZE = 69
HEADER_PADDED = 72
ALIGN = 8
NAME_RE = re.compile(r"[A-Za-z0-9._-]+\Z")
HEADER = struct.Struct("<5sIIIIII QQQQQ")
assert HEADER.size == HEADER_SIZE

# smallest possible table entries (a 1-char string takes 8 bytes)
_MIN_SIZEVAR = 8 + 8
_MIN_META = 8 + 24
_MIN_TENSOR = {1: 8 + 12 + 16, 2: 8 + 12 + 32}
_U64_MAX = (1 << 64) - 1
_MAX_BYTES = 1 << 62  # no payload is ever larger (a no-data tensor declaring more is corrupt)


class ModelError(OiError):
    """A `.oinf` file problem; the message reads `PATH: what is wrong`."""

    def __init__(self, path, message: str):
        self.path = str(path)
        self.reason = message
        super().__init__(f"{path}: {message}")


@dataclasses.dataclass(frozen=True)
class MetaValue:
    """A metadata value. `type`: a dtype name, 'string', 'bitset' or 'ndarray'.

    value: numeric scalars as NumPy scalars in the dtype's representation (packed: int8/uint8,
    bool: np.bool_), string: str, bitset: 1-D bool array (one entry per bit),
    ndarray: np.ndarray in `elem`'s representation (`elem` = element dtype name).
    """

    type: str
    value: object
    elem: str | None = None

    def __eq__(self, other):
        if not isinstance(other, MetaValue):
            return NotImplemented
        if self.type != other.type or self.elem != other.elem:
            return False
        a, b = self.value, other.value
        if isinstance(a, str) or isinstance(b, str):
            return a == b
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()

    __hash__ = None


Meta = MetaValue  # the writer's explicit form: Meta("u8", 3), Meta("ndarray", arr, elem="i4")


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    has_data: bool
    nbytes: int
    offset: int
    quant: QuantParams | None = None  # v2 only (SPEC-2026-03 §3.3); applied only for a float constant (binds_as)
    quant_nbytes: int = 0
    quant_offset: int = 0
    ggml: str | None = None  # kept GGML blocks (model/ggml.py): the type; dtype u8, shape [..., row_bytes]

    @property
    def value_dtype(self) -> str:
        """The dtype of the tensor's value: f32 for kept GGML blocks (their values), else `dtype`."""
        return "f32" if self.ggml is not None else self.dtype

    def binds_as(self, dtype: str, widen: bool = False) -> bool:
        """Whether a declaration of `dtype` may bind this tensor: its value's dtype, or `f32` for
        stored i8/u8 integers with v2 QuantParams (their affine reading: model/quant.dequantize),
        or, `widen` asked for, `f32` for a plain bf16/f16 tensor (`widens_to`)."""
        return dtype == self.value_dtype or (dtype == "f32" and self.quant is not None
                                             and self.dtype in AFFINE_DTYPES) or (widen and self.widens_to(dtype))

    def widens_to(self, dtype: str) -> bool:
        """Whether `widen_floats` (an opt-in oi2jax extension: docs/semantics.md) lets a declaration
        of `dtype` read this tensor as its exact values: `f32` from a plain bf16/f16 tensor (not
        GGML blocks, no QuantParams)."""
        return dtype == "f32" and self.ggml is None and self.quant is None and self.value_dtype in ("bf16", "f16")

    @property
    def value_shape(self) -> tuple[int, ...]:
        """The shape of the tensor's value: the logical shape of kept GGML blocks, else `shape`."""
        if self.ggml is None:
            return self.shape
        return ggml.ggml_logical_shape(self.ggml, self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


class _Cursor:
    """Bounds-checked little-endian reads from the mapped file."""

    def __init__(self, buf, path: str, pos: int, limit: int, what: str):
        self.buf, self.path, self.pos, self.limit, self.what = buf, path, pos, limit, what

    def need(self, n: int, what: str):
        if self.pos + n > self.limit:
            raise ModelError(self.path, f"{self.what}: {what} at offset {self.pos} runs past the end of the "
                                        f"section (offset {self.limit})")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = struct.unpack_from("<I", self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = struct.unpack_from("<Q", self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str) -> str:
        start = self.pos
        length = self.u32(f"{what} length")
        padded = _pad8(4 + length)
        if start + padded > self.limit:
            raise ModelError(self.path, f"{self.what}: {what} at offset {start} (length {length}) runs past the "
                                        f"end of the section (offset {self.limit})")
        raw = bytes(self.buf[start + 4:start + 4 + length])
        self.pos = start + padded
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            raise ModelError(self.path, f"{self.what}: {what} at offset {start} is not ASCII") from None
        if not NAME_RE.match(text):
            raise ModelError(self.path, f"{self.what}: invalid name {text!r} at offset {start} "
                                        f"(names match [A-Za-z0-9._-]+)")
        return text


def _pad8(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _elem_bytes(d: dt.DType) -> int:
    """Bytes of one element (packed: 1, the scalar metadata size)."""
    return max(d.bits // 8, 1)


def _data_nbytes(d: dt.DType, numel: int) -> int:
    return packing.packed_nbytes(numel, d.bits) if d.packed else numel * (d.bits // 8)


def _plain(d: dt.DType) -> bool:
    """Whether `d`'s stored bytes are its NumPy representation as they are (unpacked, not bool,
    one byte or little-endian on a little-endian host)."""
    return not d.packed and d.name != "bool" and d.np_dtype.newbyteorder("<") == d.np_dtype


def _decode(d: dt.DType, raw, shape: tuple[int, ...]) -> np.ndarray:
    """Stored bytes -> array of `shape` in `d`'s representation (a fresh, writable array)."""
    if d.packed:
        return packing.unpack(d.name, np.frombuffer(raw, dtype=np.uint8), shape)
    if d.name == "bool":
        return (np.frombuffer(raw, dtype=np.uint8) != 0).reshape(shape)
    return np.frombuffer(raw, dtype=d.np_dtype.newbyteorder("<")).astype(d.np_dtype).reshape(shape)


class Model:
    """An open `.oinf` file. Tables are decoded; tensor data is read on demand and cached.

    Arrays returned by `load` / `load_packed` are cached and read-only (copy before mutating).
    """

    def __init__(self, path: str, buf, size: int, sizevars, metadata, tensors, version: int = 1):
        self.path = path
        self.version = version  # 1 or 2: `save(..., version=model.version)` writes the same bytes back
        self._buf = buf
        self.file_size = size
        self.sizevars: dict[str, int] = sizevars
        self.metadata: dict[str, MetaValue] = metadata
        self.tensors: dict[str, TensorInfo] = tensors
        self.bytes_loaded = 0
        self._cache: dict[str, np.ndarray] = {}
        self._packed_cache: dict[str, np.ndarray] = {}
        self._whole: set[str] = set()  # tensors read whole (`loaded_whole`), cached or not

    def __repr__(self) -> str:
        return (f"Model({self.path!r}: v{self.version}, {len(self.sizevars)} sizevars, {len(self.metadata)} metadata, "
                f"{len(self.tensors)} tensors)")

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    @property
    def loaded_whole(self) -> list[str]:
        """The tensors read whole so far (sharded reads load only their slices)."""
        return sorted(self._whole)

    @property
    def held(self) -> list[str]:
        """The tensors whose values are held in memory now (read and not dropped)."""
        return sorted(set(self._cache) | set(self._packed_cache))

    def drop_cache(self) -> None:
        """Forget the values read so far (a later `load` reads the file again): a program whose
        constants are on the device keeps no host copy of the model."""
        self._cache.clear()
        self._packed_cache.clear()

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelError(self.path, f"model tensor {name} not found") from None

    def ggml_type(self, name: str) -> str | None:
        """The GGML type of a tensor kept as raw GGUF blocks (`Q4_K`, ...), or None (model/ggml.py)."""
        return self.info(name).ggml

    def quant(self, name: str) -> QuantParams | None:
        """The tensor's quantization metadata (v2 files), or None. Informational only: `load` gives
        the stored values (SPEC-2026-03 §4, D9)."""
        return self.info(name).quant

    def _raw(self, info: TensorInfo) -> bytes:
        if not info.has_data:
            raise ModelError(self.path, f"tensor {info.name} has no data")
        if self._buf is None:
            raise ModelError(self.path, "model is closed")
        raw = bytes(self._buf[info.offset:info.offset + info.nbytes]) if info.nbytes else b""
        if len(raw) != info.nbytes:  # the file shrank under us
            raise ModelError(self.path, f"tensor {info.name}: data truncated (the file changed while it "
                                        f"was in use: {len(raw)} of {info.nbytes} bytes left)")
        self.bytes_loaded += info.nbytes
        return raw

    def read_block(self, info: TensorInfo, index, np_dtype) -> np.ndarray:
        """One block `value[index]` of a plain (unpacked, little-endian) tensor, reading only the
        bytes it needs (a shard of a sharded constant); ModelError if the file shrank."""
        if self._buf is None:
            raise ModelError(self.path, "model is closed")
        shape = tuple(info.shape)
        dtype = np.dtype(np_dtype).newbyteorder("<")
        item = dtype.itemsize
        index = tuple(index) + (slice(None),) * (len(shape) - len(tuple(index)))
        if not shape:
            raw = self._buf[info.offset:info.offset + item]
            self._count(info, raw, item)
            return np.frombuffer(raw, dtype).reshape(()).astype(np_dtype)
        r0, r1, step = index[0].indices(shape[0]) if isinstance(index[0], slice) else (index[0], index[0] + 1, 1)
        row = item * int(np.prod(shape[1:], dtype=np.int64))
        if len(shape) == 2 and isinstance(index[1], slice) and step == 1 and index[1] != slice(None):
            c0, c1, cstep = index[1].indices(shape[1])
            if cstep == 1:  # a column block: one read per row, just its columns
                parts = []
                for r in range(r0, r1):
                    start = info.offset + r * row + c0 * item
                    raw = self._buf[start:start + (c1 - c0) * item]
                    self._count(info, raw, (c1 - c0) * item)
                    parts.append(raw)
                return np.frombuffer(b"".join(parts), dtype).reshape(r1 - r0, c1 - c0).astype(np_dtype)
        lo, hi = (r0, r1) if step > 0 else (r1 + 1, r0 + 1)
        raw = self._buf[info.offset + lo * row:info.offset + hi * row]
        self._count(info, raw, (hi - lo) * row)
        rows = np.frombuffer(raw, dtype).reshape((hi - lo,) + shape[1:])
        first = slice(r0 - lo, r1 - lo if r1 - lo >= 0 else None, step) if isinstance(index[0], slice) else 0
        return np.array(rows[(first,) + index[1:]], dtype=np_dtype)

    def _count(self, info: TensorInfo, raw: bytes, want: int) -> None:
        if len(raw) != want:
            raise ModelError(self.path, f"tensor {info.name}: data truncated (the file changed while it was in "
                                        f"use)")
        self.bytes_loaded += want

    def load(self, name: str) -> np.ndarray:
        """The tensor's value in its dtype's representation (dtypes.py); ModelError if it has no data.
        A tensor kept as GGML blocks is dequantized (float32, its logical shape: `value_shape`)
        exactly as gguf.quants.dequantize; `load_packed` gives its raw blocks."""
        cached = self._cache.get(name)
        if cached is not None:
            return cached
        info = self.info(name)
        if info.ggml is not None:
            arr = ggml.dequantize(info.ggml, self.load_packed(name), info.value_shape)
        elif name in self._packed_cache:
            arr = _decode(dt.get(info.dtype), self._packed_cache[name].tobytes(), info.shape)
        elif _plain(dt.get(info.dtype)):  # the bytes read are fresh and immutable: viewed, not copied
            arr = np.frombuffer(self._raw(info), dtype=dt.get(info.dtype).np_dtype).reshape(info.shape)
        else:
            arr = _decode(dt.get(info.dtype), self._raw(info), info.shape)
        if info.dtype == "t2" and np.any(arr == -2):  # validated like an --input: no silent -2
            at = tuple(int(i) for i in np.argwhere(arr == -2)[0])
            raise ModelError(self.path, f"tensor {name}: t2 value at index {list(at)} uses the reserved pattern "
                                        f"0b10 (t2 holds -1, 0, 1)")
        arr.flags.writeable = False
        self._cache[name] = arr
        self._whole.add(name)
        return arr

    def load_packed(self, name: str) -> np.ndarray:
        """The raw stored bytes (uint8, 1-D): for packed dtypes ceil(numel*w/8) bytes, §5.1."""
        cached = self._packed_cache.get(name)
        if cached is not None:
            return cached
        info = self.info(name)
        arr = np.frombuffer(self._raw(info), dtype=np.uint8)  # read-only: a view of the fresh bytes read
        arr.flags.writeable = False
        self._packed_cache[name] = arr
        return arr

    def close(self) -> None:
        buf, self._buf = self._buf, None
        if buf is not None and hasattr(buf, "close"):
            try:
                buf.close()
            except BufferError:  # exported views still alive; leave it to the GC
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_model(path) -> Model:
    """Open and validate a `.oinf` file; ModelError (`PATH: ...`) on any problem."""
    path_s = os.fspath(path)
    try:
        mode = os.stat(path_s).st_mode
        if stat.S_ISDIR(mode):
            raise ModelError(path_s, "is a directory, not a model file")
        if not stat.S_ISREG(mode):  # a FIFO or device: open() could block
            raise ModelError(path_s, "not a regular file (a pipe or device cannot be a model file)")
        fd = os.open(path_s, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise ModelError(path_s, f"file too small for OINF header: {size} bytes, need {HEADER_SIZE}")
            buf = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
    except FileNotFoundError:
        raise ModelError(path_s, "model file not found") from None
    except IsADirectoryError:
        raise ModelError(path_s, "is a directory, not a model file") from None
    except (PermissionError, OSError, ValueError) as exc:
        if isinstance(exc, ModelError):
            raise
        raise ModelError(path_s, f"cannot read model file: {exc}") from None
    try:
        model = _parse(path_s, buf, size)
    except BaseException:
        buf.close()
        os.close(fd)
        raise
    # Tables and metadata are parsed; tensor data is read later, lazily, with pread on the open
    # file rather than through the mapping: if the file shrinks meanwhile (an in-place rewrite), a
    # mapped read would kill the process with SIGBUS; a short read is a clean error instead, and a
    # file replaced by rename (oi2jax's own writers) keeps its old bytes under this descriptor.
    buf.close()
    model._buf = _PreadFile(fd, path_s)
    return model


class _PreadFile:
    """Slices of an open file read with os.pread (`buf[a:b]` -> bytes, short at EOF)."""

    def __init__(self, fd: int, path: str):
        self.fd, self.path = fd, path

    def __getitem__(self, sl: slice) -> bytes:
        start, stop = sl.start or 0, sl.stop
        chunks, pos = [], start
        while pos < stop:
            chunk = os.pread(self.fd, min(stop - pos, 1 << 30), pos)
            if not chunk:
                break  # EOF: the file shrank; the caller reports truncated data
            chunks.append(chunk)
            pos += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        try:
            self.close()
        except OSError:
            pass


def _parse(path: str, buf, size: int) -> Model:
    (magic, version, _flags, n_sv, n_meta, n_t, _reserved,
     off_sv, off_meta, off_t, off_data, file_size) = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        hint = "; a GGUF file: convert it first (oi2jax convert-gguf FILE.gguf -o MODEL.oinf)" \
            if magic[:4] == b"GGUF" else ""
        raise ModelError(path, f"invalid OINF magic: not an .oinf file (bad magic {magic.hex(' ')}){hint}")
    if version not in VERSIONS:
        raise ModelError(path, f"unsupported OINF version {version} (oi2jax reads versions 1 and 2)")
    if file_size != size:
        raise ModelError(path, f"file size mismatch: header file_size {file_size} does not match the file length {size}")
    offsets = [("offset_sizevars", off_sv), ("offset_metadata", off_meta), ("offset_tensors", off_t),
               ("offset_data", off_data), ("file_size", file_size)]
    if off_sv < HEADER_SIZE:
        raise ModelError(path, f"offset_sizevars {off_sv} points into the header")
    for (na, a), (nb, b) in zip(offsets, offsets[1:]):
        if a > b:
            raise ModelError(path, f"OINF offsets are not ascending: {na} {a} is after {nb} {b}")
    for name, off in offsets[:4]:
        if off % ALIGN:
            raise ModelError(path, f"OINF section offset not aligned: {name} {off} is not a multiple of 8")
    for what, n, off, end, least in (("sizevar table", n_sv, off_sv, off_meta, _MIN_SIZEVAR),
                                     ("metadata table", n_meta, off_meta, off_t, _MIN_META),
                                     ("tensor table", n_t, off_t, off_data, _MIN_TENSOR[version])):
        if n * least > end - off:
            raise ModelError(path, f"{what}: {n} entries cannot fit in {end - off} bytes "
                                   f"(offsets {off}..{end})")

    # ---- sizevars
    sizevars: dict[str, int] = {}
    cur = _Cursor(buf, path, off_sv, off_meta, "sizevar table")
    for i in range(n_sv):
        name = cur.string(f"sizevar {i} name")
        value = cur.u64(f"sizevar {name} value")
        if name in sizevars:
            raise ModelError(path, f"duplicate sizevar {name}")
        sizevars[name] = value

    # ---- metadata
    spans: list[tuple[int, int, str]] = []  # (offset, nbytes, what) of every payload, for overlap checks
    metadata: dict[str, MetaValue] = {}
    cur = _Cursor(buf, path, off_meta, off_t, "metadata table")
    for i in range(n_meta):
        key = cur.string(f"metadata {i} key")
        vtype = cur.u32(f"metadata {key} type")
        flags = cur.u32(f"metadata {key} flags")
        nbytes = cur.u64(f"metadata {key} value_nbytes")
        offset = cur.u64(f"metadata {key} value_offset")
        if key in metadata:
            raise ModelError(path, f"duplicate metadata key {key}")
        if flags != 0:
            raise ModelError(path, f"metadata {key}: flags must be 0, got {flags}")
        _check_payload(path, f"metadata {key}", "value_offset", "value", offset, nbytes, off_data, file_size)
        metadata[key] = _meta_value(path, buf, key, vtype, offset, nbytes)
        spans.append((offset, nbytes, f"metadata {key}"))

    # ---- tensors
    tensors: dict[str, TensorInfo] = {}
    cur = _Cursor(buf, path, off_t, off_data, "tensor table")
    for i in range(n_t):
        name = cur.string(f"tensor {i} name")
        code = cur.u32(f"tensor {name} dtype")
        ndim = cur.u32(f"tensor {name} ndim")
        flags = cur.u32(f"tensor {name} flags")
        entry_tail = 16 if version == 1 else 32
        if ndim * 8 + entry_tail > cur.limit - cur.pos:
            raise ModelError(path, f"tensor {name}: {ndim} dims run past the end of the tensor table")
        if ndim > MAX_RANK:  # NumPy (and every backend) holds at most 64 dimensions
            raise ModelError(path, f"tensor {name} has {ndim} dimensions; the limit is {MAX_RANK}")
        dims = tuple(cur.u64(f"tensor {name} dim {k}") for k in range(ndim))
        nbytes = cur.u64(f"tensor {name} data_nbytes")
        offset = cur.u64(f"tensor {name} data_offset")
        q_nbytes = cur.u64(f"tensor {name} quant_nbytes") if version == 2 else 0
        q_offset = cur.u64(f"tensor {name} quant_offset") if version == 2 else 0
        if name in tensors:
            raise ModelError(path, f"duplicate tensor {name}")
        d = dt.BY_CODE.get(code)
        if d is None:
            raise ModelError(path, f"tensor {name}: unknown tensor dtype {code}")
        # flags: bit 0 HAS_DATA, bit 1 HAS_QUANT (v2); any other bit is an error (D7, both versions)
        if flags & ~(1 if version == 1 else 3):
            raise ModelError(path, f"tensor flags contain unsupported bits for {name} (flags {flags:#x})")
        numel = 1
        for s in dims:
            numel *= s
            if numel > _MAX_BYTES * 8:
                raise ModelError(path, f"tensor {name}: shape {list(dims)} is absurdly large")
        expected = _data_nbytes(d, numel)
        has_data = bool(flags & 1)
        if has_data:
            _check_payload(path, f"tensor {name}", "data_offset", "data", offset, nbytes, off_data, file_size)
            if nbytes != expected:
                raise ModelError(path, f"tensor {name}: byte length mismatch: data_nbytes {nbytes}, expected "
                                       f"{expected} for {d.name}{list(dims)}")
            spans.append((offset, nbytes, f"tensor {name}"))
        elif nbytes != 0 or offset != 0:
            raise ModelError(path, f"tensor {name}: tensor without data must have zero offset/size")
        quant = None
        if flags & 2:  # the Rust loader's entry rules, then its payload rules (SPEC-2026-03 §3.7, D7)
            if q_offset % ALIGN:
                raise ModelError(path, f"tensor quant offset not aligned for {name} (quant_offset {q_offset})")
            if q_offset < off_data:
                raise ModelError(path, f"tensor quant offset precedes data section for {name} "
                                       f"(quant_offset {q_offset}, data section at {off_data})")
            if q_nbytes < 48:
                raise ModelError(path, f"tensor quant payload too small for {name} ({q_nbytes} bytes)")
            if q_offset + q_nbytes > file_size:
                raise ModelError(path, f"tensor quant payload out of bounds for {name} (offset {q_offset}, "
                                       f"{q_nbytes} bytes, file size {file_size})")
            quant, why = parse_quant(bytes(buf[q_offset:q_offset + q_nbytes]), name, dims)
            if quant is None:
                raise ModelError(path, why)
            spans.append((q_offset, q_nbytes, f"tensor {name} quant"))
        elif q_nbytes != 0 or q_offset != 0:
            raise ModelError(path, f"tensor without quant must have zero quant offset/size for {name}")
        tensors[name] = TensorInfo(name, d.name, dims, has_data, nbytes, offset, quant, q_nbytes, q_offset)

    spans = sorted(s for s in spans if s[1] > 0)
    for (oa, na, wa), (ob, nb, wb) in zip(spans, spans[1:]):
        if oa + na > ob:
            raise ModelError(path, f"{wa} (offset {oa}, {na} bytes) overlaps {wb} (offset {ob})")
    _apply_ggml_records(path, metadata, tensors)
    return Model(path, buf, size, sizevars, metadata, tensors, version)


def _apply_ggml_records(path: str, metadata: dict, tensors: dict) -> None:
    """Mark the tensors that `ggml_type.<name>` metadata entries say hold raw GGML blocks."""
    for key, meta in metadata.items():
        if not key.startswith(ggml.META_PREFIX):
            continue
        name = key[len(ggml.META_PREFIX):]
        info = tensors.get(name)
        if info is None:
            raise ModelError(path, f"metadata {key}: no tensor {name}")
        if meta.type != "string" or meta.value not in ggml.BLOCK_TYPES:
            raise ModelError(path, f"metadata {key}: {meta.value!r} is not a GGML block type (one of "
                                   f"{', '.join(ggml.BLOCK_TYPES)})")
        if info.dtype != "u8" or not info.has_data or info.quant is not None \
                or ggml.ggml_logical_shape(meta.value, info.shape) is None:
            _, size = ggml.block_layout(meta.value)
            raise ModelError(path, f"tensor {name}: {meta.value} blocks are stored as u8 with data, the last dim a "
                                   f"multiple of {size} bytes; found {info.dtype}{list(info.shape)}")
        tensors[name] = dataclasses.replace(info, ggml=meta.value)


def _check_payload(path, what: str, offset_field: str, noun: str, offset: int, nbytes: int, off_data: int,
                   file_size: int) -> None:
    """A metadata value's or tensor's payload: 8-aligned, inside the data section."""
    if offset % ALIGN:
        raise ModelError(path, f"{what}: {offset_field} {offset} is not a multiple of 8")
    if offset < off_data or offset + nbytes > file_size:
        raise ModelError(path, f"{what}: {noun} at offset {offset} ({nbytes} bytes) lies outside the "
                               f"data section ({off_data}..{file_size})")


def _meta_value(path: str, buf, key: str, vtype: int, offset: int, nbytes: int) -> MetaValue:
    """Decode one metadata payload, requiring its exact size (§7.4)."""
    raw = bytes(buf[offset:offset + nbytes])

    def bad(msg: str) -> ModelError:
        return ModelError(path, f"metadata {key}: {msg}")

    if vtype == dt.CODE_STRING:
        if nbytes < 4:
            raise bad(f"string payload of {nbytes} bytes is too short")
        (length,) = struct.unpack_from("<I", raw, 0)
        if _pad8(4 + length) != nbytes:
            raise bad(f"string of length {length} needs {_pad8(4 + length)} bytes, value_nbytes is {nbytes}")
        try:
            return MetaValue("string", raw[4:4 + length].decode("utf-8"))
        except UnicodeDecodeError:
            raise bad("string is not valid UTF-8") from None
    if vtype == dt.CODE_NDARRAY:
        if nbytes < 8:
            raise bad(f"ndarray payload of {nbytes} bytes is too short")
        elem_code, ndim = struct.unpack_from("<II", raw, 0)
        d = dt.BY_CODE.get(elem_code)
        if d is None or d.name == "bitset":
            raise bad(f"ndarray element type {elem_code} is not a scalar type")
        if 8 + 8 * ndim > nbytes:
            raise bad(f"ndarray with {ndim} dims does not fit in {nbytes} bytes")
        if ndim > MAX_RANK:
            raise bad(f"ndarray has {ndim} dimensions; the limit is {MAX_RANK}")
        dims = struct.unpack_from(f"<{ndim}Q", raw, 8)
        numel = 1
        for s in dims:
            numel *= s
            if numel > nbytes * 8:
                raise bad(f"ndarray shape {list(dims)} does not fit in {nbytes} bytes")
        data_len = _data_nbytes(d, numel)
        head = 8 + 8 * ndim
        if _pad8(head + data_len) != nbytes:
            raise bad(f"ndarray {d.name}{list(dims)} needs {_pad8(head + data_len)} bytes, value_nbytes is {nbytes}")
        return MetaValue("ndarray", _decode(d, raw[head:head + data_len], tuple(dims)), elem=d.name)
    d = dt.BY_CODE.get(vtype)
    if d is None:
        raise bad(f"unknown value type {vtype}")
    if d.name == "bitset":
        if nbytes < 8:
            raise bad(f"bitset payload of {nbytes} bytes is too short")
        bit_count, byte_count = struct.unpack_from("<II", raw, 0)
        if byte_count != (bit_count + 7) // 8:
            raise bad(f"bitset byte_count {byte_count} does not match bit_count {bit_count}")
        if _pad8(8 + byte_count) != nbytes:
            raise bad(f"bitset of {bit_count} bits needs {_pad8(8 + byte_count)} bytes, value_nbytes is {nbytes}")
        bits = packing.unpack_bits(np.frombuffer(raw[8:8 + byte_count], np.uint8), bit_count, 1).astype(bool)
        return MetaValue("bitset", bits)
    size = _elem_bytes(d)
    if nbytes != size:
        raise bad(f"{d.name} value needs {size} bytes, value_nbytes is {nbytes}")
    if d.packed:
        return MetaValue(d.name, packing.from_patterns(d.name, np.uint8(raw[0]))[()])
    return MetaValue(d.name, _decode(d, raw, ())[()])
