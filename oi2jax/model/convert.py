"""`oi2jax convert-hf`: a Hugging Face Llama checkpoint directory -> an `.oinf` model (issue #31).

    convert_hf("~/models/TinyLlama-1.1B-Chat-v1.0", "tinyllama.oinf", dtype="bf16")

Reads `config.json` and `model.safetensors` (or the shards a `model.safetensors.index.json`
names) with the `safetensors` package, without PyTorch, and lazily: the output is laid out from
the safetensors headers, then each tensor is read, converted and written in turn (the writer's
`LazyTensor`), so peak memory is about one tensor, never the checkpoint.

The `.oinf` keeps the checkpoint's tensor names (`model.embed_tokens.weight`,
`model.layers.{i}.self_attn.q_proj.weight`, ..., `model.norm.weight`, `lm_head.weight`), their
layouts (projections `[out, in]`, applied as `x @ W.T`) and their dtypes, unless `dtype` asks for
another: widening (bf16/f16 -> f32) is exact, narrowing rounds to nearest even, and a finite
value that would overflow the narrower dtype is an error. Size variables V, D, L, H, KVH, HD, F,
T; metadata `rms_norm_eps` and `rope_theta` (f32) and `architecture` (string). A tied embedding
(`tie_word_embeddings`) is written as `lm_head.weight` too.

Only what computes exactly the Hugging Face LlamaForCausalLM is accepted; anything else (another
architecture, scaled RoPE, biases, another activation, quantized weights, an unexpected tensor)
is an OiError naming the config key or tensor, never a silently different model.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

from ..diagnostics import OiError
from .ggml import ggml_stored_shape, meta_key
from .reader import NAME_RE
from .tokenizer import hf_tokenizer_metadata
from .writer import LazyTensor, save

__all__ = ["convert_hf", "convert_checkpoint", "TensorSource", "SafetensorsSource", "SourceEntry", "read_llama_config", "ConvertSummary", "LlamaConfig", "expected_tensors", "DTYPES"]

DTYPES = ("f32", "bf16", "f16")  # what --dtype can ask for
ARCHITECTURE = "LlamaForCausalLM"
DEFAULT_ROPE_THETA = 10000.0  # transformers' default when a config names none
_MIB = 1 << 20

# safetensors dtype -> OpenInfer dtype (floating-point checkpoints only)
_SOURCE_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "F64": "f64"}
# tensors a checkpoint may hold that are derived, not learned: transformers recomputes them
_DERIVED = re.compile(r"(model\.)?(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq\Z")


def _np_dtype(oi_dtype: str) -> np.dtype:
    if oi_dtype == "bf16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype({"f32": np.float32, "f16": np.float16, "f64": np.float64}[oi_dtype])


# ---------------------------------------------------------------------------------------- config

@dataclass(frozen=True)
class LlamaConfig:
    """The parts of a Hugging Face Llama `config.json` the model depends on, validated."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_positions: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    architecture: str
    notes: tuple[str, ...] = ()

    @property
    def sizevars(self) -> dict[str, int]:
        # QD, KVD, G: the projection widths and the query heads per kv head, which a DSL graph
        # needs as dims (a dim is a number or a size name, never an expression)
        return {"V": self.vocab_size, "D": self.hidden_size, "L": self.num_hidden_layers,
                "H": self.num_attention_heads, "KVH": self.num_key_value_heads, "HD": self.head_dim,
                "F": self.intermediate_size, "T": self.max_positions,
                "QD": self.num_attention_heads * self.head_dim, "KVD": self.num_key_value_heads * self.head_dim,
                "G": self.num_attention_heads // self.num_key_value_heads}

    @property
    def metadata(self) -> dict[str, object]:
        # attn_scale: transformers' `scaling = head_dim ** -0.5`, the factor of the attention scores
        return {"rms_norm_eps": float(self.rms_norm_eps), "rope_theta": float(self.rope_theta),
                "attn_scale": float(self.head_dim) ** -0.5, "architecture": self.architecture}


def _fail(where: str, message: str):
    raise OiError(f"{where}: {message}")


def _positive_int(where: str, config: dict, key: str, required: bool = True, default=None) -> int | None:
    if key not in config or config[key] is None:
        if required:
            _fail(where, f"missing required key {key}")
        return default
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        _fail(where, f"{key} must be a positive integer, got {value!r}")
    return value


def _positive_float(where: str, value, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        _fail(where, f"{key} must be a positive number, got {value!r}")
    return float(value)


def _flag(where: str, config: dict, key: str) -> bool:
    value = config.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        _fail(where, f"{key} must be true or false, got {value!r}")
    return value


def _rope_type(rope: dict) -> str | None:
    return rope.get("rope_type", rope.get("type"))  # older files name it `type`


def read_llama_config(config: dict, where: str = "config.json", max_positions: int | None = None) -> LlamaConfig:
    """Validate a Hugging Face Llama config dict; OiError naming the key for anything unsupported.

    Defaults are transformers' own: num_key_value_heads = num_attention_heads, head_dim =
    hidden_size / num_attention_heads, hidden_act silu, rope_theta 10000, tie_word_embeddings
    false. `max_positions` (when given) replaces max_position_embeddings as T."""
    if not isinstance(config, dict):
        _fail(where, "expected a JSON object")
    notes = []
    # -- the architecture
    model_type = config.get("model_type")
    archs = config.get("architectures")
    if model_type is None and archs is None:
        _fail(where, "missing required key model_type (or architectures): cannot tell the architecture")
    if model_type is not None and model_type != "llama":
        _fail(where, f"model_type is {model_type!r}: only Llama checkpoints (model_type 'llama', "
                     f"{ARCHITECTURE}) are supported")
    if archs is not None:
        if not isinstance(archs, list) or archs != [ARCHITECTURE]:
            _fail(where, f"architectures is {archs!r}: only [{ARCHITECTURE!r}] is supported")
    if "quantization_config" in config and config["quantization_config"] is not None:
        _fail(where, "quantization_config is set: quantized checkpoints are not supported (convert a "
                     "floating-point checkpoint)")
    # -- the maths the converted model will compute
    act = config.get("hidden_act", "silu")
    if act != "silu":
        _fail(where, f"hidden_act is {act!r}: only 'silu' (the Llama SwiGLU MLP) is supported")
    for key in ("attention_bias", "mlp_bias"):
        if _flag(where, config, key):
            _fail(where, f"{key} is true: Llama projections without biases only are supported")
    # RoPE: current transformers writes rope_parameters {rope_theta, rope_type}; older files a
    # top-level rope_theta and rope_scaling (null for the default rotary embedding)
    theta = None
    rope_params = config.get("rope_parameters")
    if rope_params is not None:
        if not isinstance(rope_params, dict):
            _fail(where, f"rope_parameters must be an object, got {rope_params!r}")
        kind = _rope_type(rope_params)
        if kind not in (None, "default"):
            _fail(where, f"rope_parameters.rope_type is {kind!r}: only the default rotary embedding is "
                         f"supported (rope_type 'default')")
        if rope_params.get("partial_rotary_factor", 1.0) != 1.0:
            _fail(where, f"rope_parameters.partial_rotary_factor is {rope_params['partial_rotary_factor']!r}: "
                         f"only a rotary embedding over the whole head (1.0) is supported")
        if rope_params.get("rope_theta") is not None:
            theta = _positive_float(where, rope_params["rope_theta"], "rope_parameters.rope_theta")
    scaling = config.get("rope_scaling")
    if scaling is not None:
        kind = _rope_type(scaling) if isinstance(scaling, dict) else scaling
        if kind != "default":
            _fail(where, f"rope_scaling is {scaling!r}: only the default rotary embedding is supported "
                         f"(rope_scaling null)")
    if config.get("partial_rotary_factor", 1.0) not in (None, 1.0):
        _fail(where, f"partial_rotary_factor is {config['partial_rotary_factor']!r}: only a rotary embedding "
                     f"over the whole head (1.0) is supported")
    if config.get("rope_theta") is not None:
        top = _positive_float(where, config["rope_theta"], "rope_theta")
        if theta is not None and top != theta:
            _fail(where, f"rope_theta is {top!r} but rope_parameters.rope_theta is {theta!r}: which one?")
        theta = top
    if theta is None:
        theta = DEFAULT_ROPE_THETA
        notes.append(f"{where} names no rope_theta: using transformers' default {DEFAULT_ROPE_THETA}")
    # -- sizes
    vocab = _positive_int(where, config, "vocab_size")
    hidden = _positive_int(where, config, "hidden_size")
    inter = _positive_int(where, config, "intermediate_size")
    layers = _positive_int(where, config, "num_hidden_layers")
    heads = _positive_int(where, config, "num_attention_heads")
    kv_heads = _positive_int(where, config, "num_key_value_heads", required=False, default=heads)
    if heads % kv_heads:
        _fail(where, f"num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}")
    head_dim = _positive_int(where, config, "head_dim", required=False)
    if head_dim is None:
        if hidden % heads:
            _fail(where, f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                         f"(and no head_dim is given)")
        head_dim = hidden // heads
    if head_dim % 2:
        _fail(where, f"head_dim {head_dim} is odd: the rotary embedding rotates pairs of dimensions")
    if "rms_norm_eps" not in config or config["rms_norm_eps"] is None:
        _fail(where, "missing required key rms_norm_eps")
    eps = _positive_float(where, config["rms_norm_eps"], "rms_norm_eps")
    trained = _positive_int(where, config, "max_position_embeddings", required=max_positions is None)
    if max_positions is not None:
        if isinstance(max_positions, bool) or not isinstance(max_positions, int) or max_positions <= 0:
            raise OiError(f"max_positions must be a positive integer, got {max_positions!r}")
        if trained is not None and max_positions > trained:
            notes.append(f"T = {max_positions} is beyond max_position_embeddings {trained}: the model was not "
                         f"trained on positions past {trained}")
    tied = _flag(where, config, "tie_word_embeddings")
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                       max_positions=max_positions if max_positions is not None else trained,
                       rms_norm_eps=eps, rope_theta=theta, tie_word_embeddings=tied,
                       architecture=archs[0] if archs else ARCHITECTURE, notes=tuple(notes))


def expected_tensors(cfg: LlamaConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """{tensor name: (shape, what the shape is made of)} of a LlamaForCausalLM with this config
    (`lm_head.weight` included even when tied: the converter writes the embedding there)."""
    V, D, F = cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    out = {"model.embed_tokens.weight": ((V, D), "vocab_size, hidden_size")}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = ((D,), "hidden_size")
        out[p + "self_attn.q_proj.weight"] = ((q, D), "num_attention_heads*head_dim, hidden_size")
        out[p + "self_attn.k_proj.weight"] = ((kv, D), "num_key_value_heads*head_dim, hidden_size")
        out[p + "self_attn.v_proj.weight"] = ((kv, D), "num_key_value_heads*head_dim, hidden_size")
        out[p + "self_attn.o_proj.weight"] = ((D, q), "hidden_size, num_attention_heads*head_dim")
        out[p + "post_attention_layernorm.weight"] = ((D,), "hidden_size")
        out[p + "mlp.gate_proj.weight"] = ((F, D), "intermediate_size, hidden_size")
        out[p + "mlp.up_proj.weight"] = ((F, D), "intermediate_size, hidden_size")
        out[p + "mlp.down_proj.weight"] = ((D, F), "hidden_size, intermediate_size")
    out["model.norm.weight"] = ((D,), "hidden_size")
    out["lm_head.weight"] = ((V, D), "vocab_size, hidden_size")
    return out


# ---------------------------------------------------------------------------------- safetensors

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

    def read(self, name: str) -> np.ndarray:
        raise NotImplementedError


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
                _fail(path, f"cannot read safetensors file: {exc}")
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
        try:
            index = json.loads(index_path.read_text())
        except (OSError, ValueError) as exc:
            _fail(str(index_path), f"cannot read the shard index: {exc}")
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
        want = _np_dtype(_SOURCE_DTYPES[entry.dtype])
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


# ------------------------------------------------------------------------------------ conversion

def convert_values(name: str, values: np.ndarray, target: str) -> np.ndarray:
    """`values` (f32/f16/bf16/f64) as `target`: exact when it widens, rounded to nearest even when
    it narrows (one rounding: bf16 <-> f16 goes through f32, which holds both exactly). OiError
    when a finite value overflows the target."""
    want = _np_dtype(target)
    if values.dtype == want:
        return values
    src = values.astype(np.float32) if values.dtype.itemsize < 4 else values  # exact
    with np.errstate(over="ignore"):  # an overflow is reported below, by tensor name
        out = src.astype(want)
    if ml_dtypes.finfo(want).max < ml_dtypes.finfo(values.dtype).max:  # a narrower range: may overflow
        bad = np.isfinite(src)
        bad &= ~np.isfinite(out)
        if bad.any():
            worst = float(np.max(np.abs(src[bad])))
            raise OiError(f"tensor {name}: value {worst:g} overflows {target} (largest finite "
                          f"{float(ml_dtypes.finfo(want).max):g}); convert to a wider dtype instead")
    return out


@dataclass(frozen=True)
class ConvertSummary:
    """What `convert_hf` wrote."""

    path: str
    sizevars: dict[str, int]
    metadata: dict[str, object]
    tensors: dict[str, str]  # name -> stored dtype
    nbytes: int  # tensor data bytes written
    source_files: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())


class _Progress:
    """Counts the MiB written; `bar(done)` is called before each tensor is read and at the end."""

    def __init__(self, factory, total_bytes: int):
        self.total = max(1, -(-total_bytes // _MIB))
        self.bar = factory(self.total) if factory is not None else None
        self.done_bytes = 0

    def tick(self, nbytes: int = 0) -> None:
        if self.bar is not None:
            self.bar(min(self.total, self.done_bytes // _MIB))
        self.done_bytes += nbytes

    def finish(self) -> None:
        if self.bar is not None:
            self.bar(self.total)

    def close(self) -> None:
        close = getattr(self.bar, "close", None)
        if close is not None:
            close()


def _same_file(a, b) -> bool:
    try:
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    except OSError:
        return False


def convert_hf(src_dir, out_path, dtype: str | None = None, max_positions: int | None = None,
               progress=None) -> ConvertSummary:
    """Convert the Hugging Face Llama checkpoint directory `src_dir` to the `.oinf` file `out_path`.

    `dtype`: None keeps every tensor's dtype; "f32", "bf16" or "f16" converts all of them (exact
    when widening, round to nearest even when narrowing). `max_positions`: T (default: the
    config's max_position_embeddings). `progress`: None, or `factory(total_mib)` returning a
    callable `bar(done_mib)` (with an optional `close()`), e.g. `oi2jax.progress.progress_for`.
    The output is written atomically (a temporary file renamed over `out_path`): a failing
    conversion leaves no partial file and an existing one untouched. OiError on anything
    unsupported, naming the config key or tensor."""
    if dtype is not None and dtype not in DTYPES:
        raise OiError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    directory = Path(os.path.expanduser(os.fspath(src_dir)))
    if not directory.is_dir():
        _fail(str(directory), "not a directory (give the checkpoint directory holding config.json)")
    config_path = directory / "config.json"
    try:
        raw_config = json.loads(config_path.read_text())
    except FileNotFoundError:
        _fail(str(directory), "no config.json: not a Hugging Face checkpoint directory")
    except (OSError, ValueError) as exc:
        _fail(str(config_path), f"cannot read the config: {exc}")
    with contextlib.ExitStack() as stack:
        source = SafetensorsSource(directory, stack)
        return convert_checkpoint(raw_config, source, out_path, dtype=dtype, max_positions=max_positions,
                                  progress=progress, config_where=str(config_path),
                                  inputs=("config.json", "model.safetensors.index.json"),
                                  extra_metadata=hf_tokenizer_metadata(directory, raw_config))


def convert_checkpoint(raw_config: dict, source: TensorSource, out_path, *, dtype: str | None = None,
                       max_positions: int | None = None, progress=None, config_where: str = "config.json",
                       inputs: tuple[str, ...] = (), extra_metadata: dict | None = None) -> ConvertSummary:
    """The converter proper: a Hugging Face `config.json` dict and the tensors of `source` (Hugging
    Face names and layouts) -> the `.oinf` at `out_path`. `inputs`: more files of
    `source.directory` that the output must not overwrite; `extra_metadata`: more metadata entries
    to store (tokenizer, chat template, ...). See `convert_hf` for the rest."""
    if dtype is not None and dtype not in DTYPES:
        raise OiError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    cfg = read_llama_config(raw_config, config_where, max_positions)
    notes = list(cfg.notes)
    out_s = os.fspath(out_path)
    directory = source.directory
    notes += source.notes
    for file in [*inputs, *source.files]:
        if _same_file(out_s, directory / file):
            raise OiError(f"{out_s} is the checkpoint's {file}: writing it would destroy the input; "
                          f"choose another path")
    expected = expected_tensors(cfg)
    plan: dict[str, str] = {}  # output name -> source name
    derived = []
    for name in sorted(source.entries):
        if name in expected:
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                notes.append("lm_head.weight in the checkpoint is ignored: tie_word_embeddings is true, so "
                             "lm_head is the embedding (as transformers does)")
                continue
            plan[name] = name
        elif _DERIVED.match(name):
            derived.append(name)
        else:
            _fail(str(directory), f"unexpected tensor {name}: not part of a {ARCHITECTURE} with this "
                                  f"config (a bias? another architecture?)")
    if derived:
        notes.append(f"skipped {len(derived)} derived tensor(s) ({derived[0]}...): the rotary "
                     f"frequencies are recomputed from rope_theta")
    if cfg.tie_word_embeddings:
        plan["lm_head.weight"] = "model.embed_tokens.weight"
    missing = [n for n in expected if n not in plan and not (n == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing:
        why = " (tie_word_embeddings is false)" if missing[0] == "lm_head.weight" else ""
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        _fail(str(directory), f"missing tensor {missing[0]}{why}{more}")
    tensors, stored, total = {}, {}, 0
    for out_name, src_name in plan.items():
        entry = source.entries[src_name]
        shape, made_of = expected[out_name]
        if entry.shape != shape:
            _fail(str(directory / entry.file), f"tensor {src_name} has shape {list(entry.shape)}, expected "
                                               f"{list(shape)} ({made_of}) from config.json")
        if not NAME_RE.match(out_name):  # every Llama name does; never rename silently
            _fail(str(directory), f"tensor name {out_name!r} is not a valid .oinf name ([A-Za-z0-9._-]+)")
        if entry.ggml is not None:
            if dtype is not None:
                raise OiError(f"tensor {src_name}: {entry.ggml} blocks cannot be kept when dtype {dtype} is asked for")
            stored[out_name] = "u8"
            total += math.prod(ggml_stored_shape(entry.ggml, shape))
            continue
        if entry.dtype not in _SOURCE_DTYPES:
            _fail(str(directory / entry.file), f"tensor {src_name} has dtype {entry.dtype}: only "
                                               f"floating-point checkpoints (F32, BF16, F16, F64) are supported")
        target = dtype or _SOURCE_DTYPES[entry.dtype]
        stored[out_name] = target
        total += math.prod(shape) * _np_dtype(target).itemsize
    bar = _Progress(progress, total)

    def lazy(out_name: str, src_name: str) -> LazyTensor:
        target = stored[out_name]
        shape = expected[out_name][0]
        kept = source.entries[src_name].ggml
        if kept is not None:
            shape = ggml_stored_shape(kept, shape)
            return LazyTensor("u8", shape, lambda: (bar.tick(math.prod(shape)), source.read(src_name))[1])

        def load():
            bar.tick(math.prod(shape) * _np_dtype(target).itemsize)
            return convert_values(src_name, source.read(src_name), target)
        return LazyTensor(target, shape, load)

    for out_name, src_name in plan.items():
        tensors[out_name] = lazy(out_name, src_name)
    metadata = {**cfg.metadata, **(extra_metadata or {}),
                **{meta_key(out): source.entries[src].ggml for out, src in plan.items() if source.entries[src].ggml}}
    try:
        save(out_s, sizevars=cfg.sizevars, metadata=metadata, tensors=tensors)
        bar.finish()
    finally:
        bar.close()
    return ConvertSummary(path=out_s, sizevars=cfg.sizevars, metadata=metadata,
                          tensors=dict(sorted(stored.items())), nbytes=total, source_files=tuple(source.files), notes=tuple(notes))
