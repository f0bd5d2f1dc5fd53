"""Tensor sources of `convert_checkpoint`: the `TensorSource` protocol (Hugging Face names and
layouts, whatever the file format) and `SafetensorsSource`, a checkpoint directory's
`model.safetensors` or the shards its `model.safetensors.index.json` names. Every error names the
file and, where there is one, the tensor."""
from __future__ import annotations

import contextlib
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from ...diagnostics import OiError
from .config import fail as _fail, read_json

# safetensors dtype -> OpenInfer dtype (floating-point checkpoints only)
SOURCE_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "F64": "f64"}


def np_dtype(oi_dtype: str) -> np.dtype:
    if oi_dtype == "bf16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype({"f32": np.float32, "f16": np.float16, "f64": np.float64}[oi_dtype])


@dataclass(frozen=True)
class SourceEntry:
    """One tensor a source holds, from its header: the file it is in (relative to the source's
    `directory`), its dtype (safetensors' names: F32, F16, BF16, F64) and shape."""

    file: str
    dtype: str  # safetensors name: F32, BF16, ...
    shape: tuple[int, ...]
    ggml: str | None = None  # kept GGML blocks (model/ggml.py): `read` gives the raw u8 rows, stored as-is


class TensorSource:
    """What `convert_checkpoint` reads a checkpoint's tensors from: `directory` (messages name
    `directory / entry.file`), `files` (the files read, relative to `directory`), `entries`
    {Hugging Face tensor name: SourceEntry}, `notes`, and `read(name)` (a fresh array of the entry's
    dtype and shape). `SafetensorsSource` is a checkpoint directory; other formats (GGUF) give the
    same names and layouts, so one converter and one example graph serve both."""

    directory: Path
    files: list[str]
    entries: dict[str, SourceEntry]
    notes: list[str]
    where: str | None = None  # what a message about the whole checkpoint names (None: `directory`)
    config_name: str = "config.json"  # where the settings come from, in messages

    def read(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def origin(self, name: str) -> str:
        """How a message names entry `name` in the file it came from, after its Hugging Face name
        (' (GGUF output_norm.weight)'; '' where the two are one)."""
        return ""


class SafetensorsSource(TensorSource):
    """The checkpoint's safetensors files, open for the conversion: names, dtypes, shapes from the
    headers; `read(name)` reads one tensor (a fresh array)."""

    def __init__(self, directory: Path, stack: contextlib.ExitStack):
        self.directory = directory
        self._index: dict | None = None  # a sharded checkpoint's weight_map
        self.notes: list[str] = []
        self.files = self._files()
        self.entries: dict[str, SourceEntry] = {}
        self._handles = {}
        self._headers: dict[str, dict] = {}
        try:
            from safetensors import safe_open  # optional at run time: only convert-hf needs it
        except ImportError:  # a declared dependency; still no traceback when it is missing
            raise OiError("the safetensors package is needed to read Hugging Face checkpoints "
                          "(pip install safetensors)") from None
        for file in self.files:
            path = str(directory / file)
            try:
                handle = stack.enter_context(safe_open(path, framework="numpy"))
                keys = list(handle.keys())
                for name in keys:
                    piece = handle.get_slice(name)
                    entry = SourceEntry(file, str(piece.get_dtype()), tuple(int(s) for s in piece.get_shape()))
                    if name in self.entries:
                        _fail(path, f"tensor {name} is also in {self.entries[name].file}")
                    self.entries[name] = entry
            except OiError:
                raise
            except Exception as exc:  # SafetensorError and friends: a corrupt or truncated file
                _fail(path, f"cannot read safetensors file: {header_problem(directory / file) or exc}")
            self._handles[file] = handle
        if self._index is not None:
            for name, file in self._index.items():
                entry = self.entries.get(name)
                if entry is None or entry.file != file:
                    _fail(str(directory / "model.safetensors.index.json"),
                          f"weight_map puts tensor {name} in {file}, but {file} does not hold it")

    def _files(self) -> list[str]:
        single = self.directory / "model.safetensors"
        index_path = self.directory / "model.safetensors.index.json"
        if single.is_file():  # what transformers loads first
            if index_path.is_file():
                self.notes.append("both model.safetensors and model.safetensors.index.json exist: reading "
                                  "model.safetensors (as transformers does)")
            return ["model.safetensors"]
        if not index_path.is_file():
            hint = (" (a PyTorch .bin checkpoint: save it with safe_serialization=True first)"
                    if any(self.directory.glob("pytorch_model*.bin")) else "")
            _fail(str(self.directory), f"no model.safetensors or model.safetensors.index.json{hint}")
        index = read_json(index_path, "the shard index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            _fail(str(index_path), "missing required key weight_map (tensor name -> shard file)")
        files = []
        for name, file in weight_map.items():
            if not isinstance(file, str) or "/" in file or "\\" in file or file in ("", ".", ".."):
                _fail(str(index_path), f"weight_map: tensor {name}: {file!r} is not a file name in the directory")
            if file not in files:
                if not (self.directory / file).is_file():
                    _fail(str(index_path), f"weight_map: shard {file} (of tensor {name}) does not exist")
                files.append(file)
        self._index = weight_map
        return sorted(files)

    def _raw_header(self, file: str) -> dict:
        if file not in self._headers:
            with open(self.directory / file, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                self._headers[file] = {"__base__": 8 + n, **json.loads(f.read(n))}
        return self._headers[file]

    def _read_raw(self, name: str, np_dtype: np.dtype) -> np.ndarray:
        """One tensor straight from the file by its header offsets (bf16 with a safetensors that
        has no NumPy bfloat16)."""
        entry = self.entries[name]
        header = self._raw_header(entry.file)
        begin, end = header[name]["data_offsets"]
        count = math.prod(entry.shape)
        if end - begin != count * np_dtype.itemsize:
            _fail(str(self.directory / entry.file), f"tensor {name}: {end - begin} bytes for shape "
                                                    f"{list(entry.shape)}")
        with open(self.directory / entry.file, "rb") as f:
            f.seek(header["__base__"] + begin)
            raw = bytearray(end - begin)
            if f.readinto(raw) != len(raw):
                _fail(str(self.directory / entry.file), f"tensor {name}: data truncated")
        return np.frombuffer(raw, dtype=np_dtype.newbyteorder("<")).reshape(entry.shape)

    def read(self, name: str) -> np.ndarray:
        entry = self.entries[name]
        path = str(self.directory / entry.file)
        want = np_dtype(SOURCE_DTYPES[entry.dtype])
        try:
            arr = self._handles[entry.file].get_tensor(name)
        except Exception as exc:
            if entry.dtype != "BF16":
                _fail(path, f"cannot read tensor {name}: {exc}")
            arr = None  # a safetensors without NumPy bfloat16 support: read the bytes ourselves
        if entry.dtype == "BF16" and (arr is None or arr.dtype != want):
            arr = self._read_raw(name, want)
        if arr.dtype != want or arr.shape != entry.shape:
            _fail(path, f"tensor {name}: read {arr.dtype}{list(arr.shape)}, the header says "
                        f"{entry.dtype}{list(entry.shape)}")
        return arr


# every dtype name the safetensors format defines
_ST_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
              "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_MAX_HEADER = 100 << 20  # safetensors' own header limit


def header_problem(path: Path) -> str | None:
    """What is wrong in a safetensors file's header, naming the tensor where one is at fault (the
    safetensors package names none); None when no problem is found here."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{size} bytes: too short for a safetensors header"
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, _MAX_HEADER):
                return f"header length {n} is past the end of the file ({size} bytes)"
            header = json.loads(f.read(n))
    except RecursionError:
        return "header JSON nested too deeply"
    except (OSError, ValueError) as exc:
        return f"header is not valid JSON: {exc}"
    if not isinstance(header, dict):
        return "header is not a JSON object"
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            return f"tensor {name}: header entry is not an object"
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in _ST_DTYPES:
            return f"tensor {name}: unknown dtype {dtype!r}"
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            return f"tensor {name}: shape {shape!r} is not a list of sizes"
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            return f"tensor {name}: data_offsets {offsets!r} is not [begin, end]"
        if offsets[1] - offsets[0] != math.prod(shape) * _ST_DTYPES[dtype]:
            return f"tensor {name}: {offsets[1] - offsets[0]} bytes for {dtype}{shape}"
        if 8 + n + offsets[1] > size:
            return f"tensor {name}: data [{offsets[0]}, {offsets[1]}) is past the end of the file"
    return None
