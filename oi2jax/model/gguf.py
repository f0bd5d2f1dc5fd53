"""`oi2jax convert-gguf`: a GGUF file (llama.cpp's format) -> an `.oinf` model (issue #39).

    convert_gguf("SmolLM2-135M-Instruct-Q4_1.gguf", "smollm.oinf")              # blocks kept
    convert_gguf("SmolLM2-135M-Instruct-Q4_1.gguf", "smollm-f32.oinf", dtype="f32")

As transformers' GGUF loader does: the file's metadata becomes a Hugging Face `config.json`
dict (`gguf_config`, a table per architecture), its tensors are given under Hugging Face names and
layouts (`GGUFSource`, with the named per-family transform `reverse_permute` of llama's Q/K rows;
gemma's norms stay the `1 + w` llama.cpp stores, with metadata `norm_offset` 0), and
`convert.convert_checkpoint` writes the model: the same tensor names, layouts and size variables
as the same model's Hugging Face conversion, so one example graph runs either. A missing
`output.weight` means tied embeddings; Llama 3.1-3.3's `rope_freqs.weight` becomes its llama3
`rope_scaling`.

Tensor types: F32, F16 and BF16 keep their dtype; the block types (model/ggml.py: Q4_0 ... Q6_K)
are kept as their raw GGUF blocks; with `dtype`, everything is dequantized exactly as
`gguf.quants.dequantize` and then cast as `convert.convert_values`. Any other type is an error.

The file is validated by `scan` before gguf's `GGUFReader` sees it: every count, length, type,
shape and offset is bounded by the file's size, so a hostile header never allocates what it claims.
"""
from __future__ import annotations

import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES, MODEL_ARCH_NAMES, GGMLQuantizationType

from ..diagnostics import OiError, suggest
from ..npz import regular_input
from . import ggml
from .convert import ConvertSummary, SourceEntry, TensorSource, convert_checkpoint, DTYPES
from .tokenizer import gguf_tokenizer_metadata

__all__ = ["convert_gguf", "gguf_config", "GGUFSource", "scan", "GGUFHeader", "ARCHITECTURES",
           "reverse_permute", "permute", "llama3_rope_factors", "llama3_rope_scaling"]

MAGIC = b"GGUF"
MAX_DIMS = 4  # GGML_MAX_DIMS
_KEPT_FLOATS = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype(ml_dtypes.bfloat16)}
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


# ------------------------------------------------------------------------------------ validation

@dataclass(frozen=True)
class GGUFTensor:
    name: str
    kind: str  # GGML type name: F32, Q4_K, ...
    shape: tuple[int, ...]  # NumPy order (GGUF's ne reversed): [out, in] for a projection
    offset: int  # from the file's start
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """What `scan` found: the metadata keys (name -> GGUF value type) and the tensors."""

    version: int
    keys: dict[str, int]
    tensors: dict[str, GGUFTensor]
    data_offset: int


class _Scan:
    def __init__(self, path: str, f, size: int):
        self.path, self.f, self.size = path, f, size

    def fail(self, message: str):
        raise OiError(f"{self.path}: {message}")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.f.tell() + n > self.size:
            self.fail(f"truncated: {what} needs {n} bytes at offset {self.f.tell()}, the file has {self.size}")
        return self.f.read(n)

    def num(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.num("<Q", f"the length of {what}")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not UTF-8")

    def skip_value(self, vtype: int, key: str, nested: bool = False) -> None:
        if vtype in _SCALAR:
            self.take(struct.calcsize(_SCALAR[vtype]), f"metadata {key}")
        elif vtype == _STRING:  # decoded too: a string that is not UTF-8 is named here, by key (and item)
            self.string(f"metadata {key}")
        elif vtype == _ARRAY and not nested:
            etype = self.num("<I", f"metadata {key}: array type")
            count = self.num("<Q", f"metadata {key}: array length")
            least = struct.calcsize(_SCALAR[etype]) if etype in _SCALAR else 8 if etype == _STRING else None
            if least is None:
                self.fail(f"metadata {key}: array of value type {etype} is not supported")
            if count * least > self.size - self.f.tell():  # bounded before anything is built
                self.fail(f"metadata {key}: an array of {count} items does not fit in the file")
            if etype == _STRING:
                for i in range(count):
                    self.skip_value(_STRING, f"{key}[{i}]", nested=True)
            else:
                self.take(count * least, f"metadata {key}")
        else:
            self.fail(f"metadata {key}: unknown value type {vtype}")


def scan(path) -> GGUFHeader:
    """Validate a GGUF file's header, metadata and tensor table against its size; OiError naming
    the file and the key or tensor on anything wrong (the data itself is not read)."""
    path_s = os.fspath(path)
    regular_input(path_s, "the GGUF file")  # a FIFO would block open() forever, a device read without end
    try:
        f = open(path_s, "rb")
    except FileNotFoundError:
        raise OiError(f"{path_s}: file not found") from None
    except OSError as exc:
        raise OiError(f"{path_s}: cannot read: {exc}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        s = _Scan(path_s, f, size)
        if size < 4 or s.take(4, "the magic") != MAGIC:
            s.fail("not a GGUF file (wrong magic; expected 'GGUF')")
        version = s.num("<I", "the version")
        if version not in (2, 3):
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            s.fail(f"a big-endian GGUF file (version {swapped}, its bytes swapped): only little-endian GGUF files "
                   f"are supported" if swapped in (2, 3) else f"GGUF version {version} is not supported (2 or 3)")
        n_tensors = s.num("<Q", "the tensor count")
        n_keys = s.num("<Q", "the metadata count")
        if n_keys * 13 > size or n_tensors * 28 > size:
            s.fail(f"{n_keys} metadata entries and {n_tensors} tensors cannot fit in {size} bytes")
        keys: dict[str, int] = {}
        alignment = 32
        for _ in range(n_keys):
            key = s.string("a metadata key")
            if key in keys:
                s.fail(f"metadata {key} appears twice")
            vtype = s.num("<I", f"metadata {key}: value type")
            if key == "general.alignment":
                if vtype != 4:
                    s.fail("metadata general.alignment must be a uint32")
                alignment = s.num("<I", "metadata general.alignment")
                if alignment == 0 or alignment & (alignment - 1):
                    s.fail(f"metadata general.alignment is {alignment}: not a power of two")
            else:
                s.skip_value(vtype, key)
            keys[key] = vtype
        raw = []
        for _ in range(n_tensors):
            name = s.string("a tensor name")
            n_dims = s.num("<I", f"tensor {name}: dimension count")
            if not 1 <= n_dims <= MAX_DIMS:
                s.fail(f"tensor {name}: {n_dims} dimensions (1 to {MAX_DIMS})")
            ne = [s.num("<Q", f"tensor {name}: dims") for _ in range(n_dims)]
            code = s.num("<I", f"tensor {name}: type")
            offset = s.num("<Q", f"tensor {name}: offset")
            raw.append((name, ne, code, offset))
        data_offset = -(-f.tell() // alignment) * alignment
        tensors: dict[str, GGUFTensor] = {}
        for name, ne, code, offset in raw:
            if name in tensors:
                s.fail(f"tensor {name} appears twice")
            try:
                kind = GGMLQuantizationType(code).name
            except ValueError:
                s.fail(f"tensor {name}: unknown tensor type {code}")
            if any(d == 0 for d in ne) or math.prod(ne) > size * 8:
                s.fail(f"tensor {name}: dims {ne} are not a tensor this file can hold")
            block, bsize = GGML_QUANT_SIZES[GGMLQuantizationType(code)]
            if ne[0] % block:
                s.fail(f"tensor {name}: row of {ne[0]} values is not a whole number of {kind} blocks ({block})")
            nbytes = math.prod(ne) // block * bsize
            if offset % alignment:
                s.fail(f"tensor {name}: offset {offset} is not a multiple of the alignment {alignment}")
            if data_offset + offset + nbytes > size:
                s.fail(f"tensor {name}: data (offset {data_offset + offset}, {nbytes} bytes) runs past the end "
                       f"of the file ({size} bytes)")
            tensors[name] = GGUFTensor(name, kind, tuple(reversed(ne)), data_offset + offset, nbytes)
        # two tensors' data never share bytes (ggml's own reader wants them laid out one after another)
        laid = sorted(tensors.values(), key=lambda t: t.offset)
        for a, b in zip(laid, laid[1:]):
            if a.offset + a.nbytes > b.offset:
                s.fail(f"tensor {b.name}: data (offset {b.offset}) overlaps tensor {a.name}'s (offset {a.offset}, "
                       f"{a.nbytes} bytes)")
    return GGUFHeader(version, keys, tensors, data_offset)


def _open_reader(path: str) -> GGUFReader:
    try:
        return GGUFReader(path)
    except (ValueError, KeyError, IndexError, OSError) as exc:  # after `scan`, only a damaged file gets here
        raise OiError(f"{path}: cannot read GGUF file: {exc}") from None


def _fields(reader: GGUFReader) -> dict[str, object]:
    """Metadata as Python values (strings, numbers, lists)."""
    out = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = fld.contents()
        out[key] = value
    return out


# ---------------------------------------------------------------------------- per-family tables

def permute(weights: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py): Q/K rows from Hugging Face's
    rotate-half order to GGML's interleaved rotary order."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def reverse_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """transformers' `reverse_permute_weights`: undoes `permute` exactly. It moves whole rows, so it
    applies to raw GGML block rows (u8 [rows, row_bytes]) as well as to values."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    dim = weights.shape[0] // n_head // 2
    w = weights.reshape(n_head, dim, 2, *weights.shape[1:])
    return np.ascontiguousarray(w.swapaxes(2, 1).reshape(weights.shape))


def _q_unpermute(w, cfg):
    return reverse_permute(w, cfg["num_attention_heads"])


def _k_unpermute(w, cfg):
    return reverse_permute(w, cfg["num_attention_heads"], cfg["num_key_value_heads"])


_COMMON_KEYS = {  # GGUF `{arch}.` key -> Hugging Face config key
    "context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps", "rope.freq_base": "rope_theta",
    "attention.key_length": "head_dim", "vocab_size": "vocab_size",
}
# keys only the families that read them map (phi3's and gemma's sliding window, gemma's soft-capping):
# in a llama, qwen2 or qwen3 file they are an error, as any other key whose setting would be lost
_WINDOW_KEYS = {"attention.sliding_window": "sliding_window"}
_SOFTCAP_KEYS = {"attn_logit_softcapping": "attn_logit_softcapping",
                 "final_logit_softcapping": "final_logit_softcapping"}
# the GGUF value type each mapped key must have (the others: an integer)
_FLOAT_KEYS = {"attention.layer_norm_rms_epsilon", "rope.freq_base", "attn_logit_softcapping",
               "final_logit_softcapping", "rope.scaling.factor"}
_ROPE_SCALING = {"rope.scaling.type": "rope_type", "rope.scaling.factor": "factor",
                 "rope.scaling.original_context_length": "original_max_position_embeddings"}
# keys checked rather than mapped: `rope.dimension_count` must cover the whole head, value_length = key_length
_CHECKED_KEYS = ("rope.dimension_count", "attention.value_length")

_COMMON_TENSORS = {  # GGUF name -> Hugging Face name ({i}: the layer)
    "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
_BIASES = {f"blk.{{i}}.attn_{x}.bias": f"model.layers.{{i}}.self_attn.{x}_proj.bias" for x in "qkv"}
_QK_NORMS = {"blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
             "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight"}
_GEMMA_NORMS = {"blk.{i}.post_attention_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
                "blk.{i}.ffn_norm.weight": "model.layers.{i}.pre_feedforward_layernorm.weight",
                "blk.{i}.post_ffw_norm.weight": "model.layers.{i}.post_feedforward_layernorm.weight"}


@dataclass(frozen=True)
class GGUFArch:
    """One GGUF architecture: its Hugging Face model_type and class, the config keys and tensor
    names it maps, fixed config entries, and the named transforms per Hugging Face tensor name."""

    model_type: str
    architecture: str
    tensors: dict[str, str]
    config: dict[str, object] = field(default_factory=dict)  # fixed entries (the family's defaults)
    transforms: tuple[tuple[str, object], ...] = ()  # (regex over HF names, fn(array, config) -> array)
    derive: object = None  # fn(config): config entries GGUF does not carry, as llama.cpp computes them
    keys: dict[str, str] = field(default_factory=dict)  # the family's own `{arch}.` key -> config key
    metadata: dict[str, object] = field(default_factory=dict)  # .oinf metadata replacing the family row's


def _gemma_attn_scalar(config: dict) -> None:
    """query_pre_attn_scalar, which GGUF does not carry: llama.cpp scales gemma2/gemma3 scores by
    1/sqrt(head_dim), except the 27B models (46 / 62 layers): 1/sqrt(hidden_size/num_heads)."""
    layers, heads, hidden = (config.get(k) for k in ("num_hidden_layers", "num_attention_heads", "hidden_size"))
    big = layers == (46 if config["model_type"] == "gemma2" else 62)
    if big and isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
        config["query_pre_attn_scalar"] = hidden // heads
    else:
        config["query_pre_attn_scalar"] = config.get("head_dim")


# llama.cpp stores gemma's RMSNorm weights as `1 + w` (its norm multiplies by the weight); they are
# kept as stored, and the graphs' rms_norm(offset=norm_offset) adds 0 instead of 1: the same f32
# factor as Hugging Face's `1 + w`, without a lossy `(1 + w) - 1`
_GEMMA_METADATA = {"norm_offset": 0.0}
ARCHITECTURES: dict[str, GGUFArch] = {
    "llama": GGUFArch("llama", "LlamaForCausalLM", _COMMON_TENSORS, {"hidden_act": "silu"},
                      ((r".*\.q_proj\.weight\Z", _q_unpermute), (r".*\.k_proj\.weight\Z", _k_unpermute))),
    "qwen2": GGUFArch("qwen2", "Qwen2ForCausalLM", {**_COMMON_TENSORS, **_BIASES}, {"hidden_act": "silu"}),
    "qwen3": GGUFArch("qwen3", "Qwen3ForCausalLM", {**_COMMON_TENSORS, **_QK_NORMS}, {"hidden_act": "silu"}),
    "phi3": GGUFArch("phi3", "Phi3ForCausalLM",
                     {**{k: v for k, v in _COMMON_TENSORS.items() if "attn_q" not in k and "attn_k" not in k
                         and "attn_v" not in k and "ffn_gate" not in k and "ffn_up" not in k},
                      "blk.{i}.attn_qkv.weight": "model.layers.{i}.self_attn.qkv_proj.weight",
                      "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.gate_up_proj.weight"},
                     {"hidden_act": "silu"},
                     keys={"rope.scaling.original_context_length": "original_max_position_embeddings",
                           **_WINDOW_KEYS}),
    "gemma2": GGUFArch("gemma2", "Gemma2ForCausalLM", {**_COMMON_TENSORS, **_GEMMA_NORMS},
                       {"hidden_activation": "gelu_pytorch_tanh"}, derive=_gemma_attn_scalar,
                       keys={**_WINDOW_KEYS, **_SOFTCAP_KEYS}, metadata=_GEMMA_METADATA),
    "gemma3": GGUFArch("gemma3_text", "Gemma3ForCausalLM", {**_COMMON_TENSORS, **_GEMMA_NORMS, **_QK_NORMS},
                       {"hidden_activation": "gelu_pytorch_tanh"}, derive=_gemma_attn_scalar,
                       keys={**_WINDOW_KEYS, **_SOFTCAP_KEYS}, metadata=_GEMMA_METADATA),
}


def _tensor_regexes(arch: GGUFArch) -> list[tuple[re.Pattern, str]]:
    return [(re.compile(re.escape(g).replace(r"\{i\}", r"(?P<i>0|[1-9][0-9]*)") + r"\Z"), h)
            for g, h in arch.tensors.items()]


def hf_name(arch: GGUFArch, name: str) -> str | None:
    """The Hugging Face name of GGUF tensor `name`, or None when the family has no such tensor."""
    for rx, target in _tensor_regexes(arch):
        m = rx.match(name)
        if m:
            return target.replace("{i}", m.group("i")) if "{i}" in target else target
    return None


def _int(where: str, key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise OiError(f"{where}: metadata {key} must be an integer, got {value!r}")
    return int(value)


def _number(where: str, key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise OiError(f"{where}: metadata {key} must be a number, got {value!r}")
    return float(value)


def gguf_config(fields: dict, tensors: dict[str, GGUFTensor], where: str) -> dict:
    """A Hugging Face `config.json` dict from a GGUF file's metadata (transformers'
    GGUF_CONFIG_MAPPING); OiError naming the key for an architecture or setting not supported."""
    name = fields.get("general.architecture")
    if name is None:
        raise OiError(f"{where}: missing required metadata general.architecture")
    if not isinstance(name, str):  # (an array or a number: a damaged file, not another model)
        raise OiError(f"{where}: metadata general.architecture must be a string, got {name!r:.60}")
    arch = ARCHITECTURES.get(name)
    if arch is None:
        # a near miss of a supported name (`Llama`) gets a suggestion; another of llama.cpp's own
        # architectures (`llama4`, `gemma`: another model) does not
        hint = "" if name in MODEL_ARCH_NAMES.values() else suggest(str(name), ARCHITECTURES)
        raise OiError(f"{where}: metadata general.architecture is {name!r}{hint}: supported GGUF architectures are "
                      f"{', '.join(ARCHITECTURES)}")
    config: dict = {"model_type": arch.model_type, "architectures": [arch.architecture], **arch.config}
    checked = {}
    prefix = name + "."
    for key, value in fields.items():
        if not key.startswith(prefix):
            continue
        sub = key[len(prefix):]
        if sub in _FLOAT_KEYS:
            value = _number(where, key, value)
        elif sub != "rope.scaling.type" and (sub in arch.keys or sub in _COMMON_KEYS or sub in _ROPE_SCALING):
            value = _int(where, key, value)
        elif sub == "rope.scaling.type" and not isinstance(value, str):
            raise OiError(f"{where}: metadata {key} must be a string, got {value!r}")
        if sub in arch.keys:
            config[arch.keys[sub]] = value
        elif sub in _COMMON_KEYS:
            config[_COMMON_KEYS[sub]] = value
        elif sub in _CHECKED_KEYS:
            checked[sub] = _int(where, key, value)
        elif sub in _ROPE_SCALING:  # transformers' older rope_scaling form; the converter validates it
            if not (sub == "rope.scaling.type" and value == "none"):
                config.setdefault("rope_scaling", {})[_ROPE_SCALING[sub]] = value
        else:
            raise OiError(f"{where}: metadata {key} is not supported: its setting would be lost")
    if "vocab_size" not in config:  # transformers: the tokenizer's size, else the embedding's rows
        emb = tensors.get("token_embd.weight")
        if emb is None:
            raise OiError(f"{where}: no tensor token_embd.weight (and no {prefix}vocab_size)")
        config["vocab_size"] = emb.shape[0]
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    if "head_dim" not in config and isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
        config["head_dim"] = hidden // heads if hidden % heads == 0 else None
    head_dim = config.get("head_dim")
    for sub in _CHECKED_KEYS:  # (a head dim not known yet: the missing key it comes from is named below)
        if sub in checked and head_dim is not None and checked[sub] != head_dim:
            raise OiError(f"{where}: metadata {prefix}{sub} is {checked[sub]}, head dim is {head_dim}: "
                          + ("a partial rotary embedding is not supported" if sub.startswith("rope")
                             else "value heads wider or narrower than key heads are not supported"))
    if "rope_scaling" in config and config["rope_scaling"].get("rope_type") is None:
        raise OiError(f"{where}: metadata {prefix}rope.scaling.factor is given without {prefix}rope.scaling.type")
    if arch.derive is not None:
        arch.derive(config)
    config["tie_word_embeddings"] = "output.weight" not in tensors
    return config


# -------------------------------------------------------------------------------------- source

class GGUFSource(TensorSource):
    """A GGUF file's tensors under Hugging Face names and layouts. `keep`: block-quantized tensors
    are given as their raw blocks (`SourceEntry.ggml`); otherwise as float32 dequantized by
    gguf.quants. The family's transforms apply to either (a transform of values on a block type
    dequantizes that tensor, with a note)."""

    def __init__(self, path: Path, reader: GGUFReader, header: GGUFHeader, arch: GGUFArch, config: dict,
                 keep: bool):
        self.directory = path.parent
        self.files = [path.name]
        self.where, self.config_name = str(path), "its metadata"
        self.notes: list[str] = []
        self.entries: dict[str, SourceEntry] = {}
        self._path, self._config = str(path), config
        self._data = {t.name: t for t in reader.tensors}
        self._source: dict[str, str] = {}
        self._transform: dict[str, object] = {}
        for name, t in header.tensors.items():
            if name == ROPE_FREQS and "rope_scaling" in config:  # read into the config (llama3_rope_scaling)
                self.notes.append(f"{ROPE_FREQS} read as rope_scaling {config['rope_scaling']}")
                continue
            target = hf_name(arch, name)
            if target is None:
                raise OiError(f"{path}: tensor {name}: not part of a GGUF {config['model_type']} model (an "
                              f"unsupported variant?)")
            transform = next((fn for rx, fn in arch.transforms if re.match(rx, target)), None)
            if t.kind in _KEPT_FLOATS:
                dtype, kept = t.kind, None
            elif t.kind in ggml.BLOCK_TYPES:
                rowwise = transform in (None, _q_unpermute, _k_unpermute)  # moves whole rows of blocks
                dtype, kept = ("F32", None) if not keep or not rowwise else (t.kind, t.kind)
                if keep and not rowwise:
                    self.notes.append(f"tensor {name} ({t.kind}) is dequantized: {transform.__name__} changes "
                                      f"its values")
            else:
                raise OiError(f"{path}: tensor {name} has type {t.kind}: supported types are F32, F16, BF16, "
                              f"{', '.join(ggml.BLOCK_TYPES)}")
            self.entries[target] = SourceEntry(path.name, dtype, t.shape, kept)
            self._source[target] = name
            if transform is not None:
                self._transform[target] = transform

    def origin(self, name: str) -> str:
        return f" (GGUF {self._source[name]})" if name in self._source else ""

    def read(self, name: str) -> np.ndarray:
        entry = self.entries[name]
        t = self._data[self._source[name]]
        kind = t.tensor_type.name
        try:
            if entry.ggml is not None:
                arr = np.array(t.data, dtype=np.uint8).reshape(ggml.ggml_stored_shape(kind, entry.shape))
            elif kind in ("F32", "F16"):
                arr = np.array(t.data, dtype=_KEPT_FLOATS[kind]).reshape(entry.shape)
            elif kind == "BF16":
                arr = np.array(t.data, dtype=np.uint8).view(_KEPT_FLOATS["BF16"]).reshape(entry.shape)
            else:
                arr = ggml.dequantize(kind, np.asarray(t.data), entry.shape)
        except ValueError as exc:
            raise OiError(f"{self._path}: tensor {self._source[name]}: cannot read its data: {exc}") from None
        transform = self._transform.get(name)
        if transform is not None:
            arr = transform(arr, self._config)
        want = np.dtype(np.uint8) if entry.ggml is not None else _KEPT_FLOATS.get(entry.dtype)
        return np.asarray(arr, dtype=want)


# ------------------------------------------------------------------------------- llama3 rope

ROPE_FREQS = "rope_freqs.weight"
# (low_freq_factor, high_freq_factor, original_max_position_embeddings) of the llama3 rope of
# Llama 3.1, 3.2 and 3.3; a GGUF keeps only the factors these give
LLAMA3_PARAMS = ((1.0, 4.0, 8192),)


def llama3_rope_factors(theta: float, head_dim: int, factor: float, low: float, high: float, original: int):
    """The `rope_freqs.weight` llama.cpp's converter writes for a llama3 rope (LlamaModel's
    generate_extra_tensors: frequencies in float32, each factor 1, `factor`, or the smooth blend)."""
    freqs = np.float32(1) / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for freq in freqs:
        wavelen = np.float32(2 * math.pi) / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (np.float32(original) / wavelen - np.float32(low)) / np.float32(high - low)
            out.append(np.float32(1) / ((np.float32(1) - smooth) / np.float32(factor) + smooth))
    return np.asarray(out, np.float32)


def llama3_rope_scaling(factors: np.ndarray, config: dict, where: str) -> dict:
    """The Hugging Face `rope_scaling` whose llama3 rope gives `factors` (a GGUF's rope_freqs.weight):
    factor = the largest; the other parameters those of LLAMA3_PARAMS that reproduce every factor
    (to a float32 rounding); OiError naming the tensor when none does."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    theta = config.get("rope_theta", 10000.0)
    factors = np.asarray(factors, np.float32)
    if factors.shape != (head_dim // 2,) or not np.all(np.isfinite(factors)) or factors.min() < 1:
        raise OiError(f"{where}: tensor {ROPE_FREQS}: expected {head_dim // 2} finite factors >= 1, got "
                      f"{factors.dtype}{list(factors.shape)}")
    factor = float(factors.max())
    for low, high, original in LLAMA3_PARAMS:
        want = llama3_rope_factors(theta, head_dim, factor, low, high, original)
        if np.allclose(want, factors, rtol=1e-6, atol=0):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": original}
    raise OiError(f"{where}: tensor {ROPE_FREQS}: these rope factors are not a llama3 rope with the parameters of "
                  f"Llama 3.1-3.3 (low_freq_factor, high_freq_factor, original_max_position_embeddings in "
                  f"{list(LLAMA3_PARAMS)}): convert the Hugging Face checkpoint with convert-hf")


# ------------------------------------------------------------------------------------ converter

def convert_gguf(src, out_path, dtype: str | None = None, max_positions: int | None = None,
                 progress=None, nonfinite: str = "note") -> ConvertSummary:
    """Convert the GGUF file `src` to the `.oinf` file `out_path` (atomically; nothing is written on
    an error). `dtype`: None keeps F32/F16/BF16 and the block types' raw blocks; f32/bf16/f16
    dequantizes and converts every tensor. `max_positions`: T (default: the file's context length).
    `nonfinite`: as convert_hf's (kept blocks are stored as they are; their f16 scales say
    which blocks hold NaN/Inf: ggml.nonfinite_counts). The tokenizer, chat template and
    special ids are stored in the metadata (model/tokenizer.py)."""
    if dtype is not None and dtype not in DTYPES:
        raise OiError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    path = Path(os.path.expanduser(os.fspath(src)))
    if path.is_dir():
        raise OiError(f"{path}: is a directory, not a GGUF file")
    header = scan(path)
    reader = _open_reader(str(path))
    fields = _fields(reader)
    _whole_file(fields, str(path))
    config = gguf_config(fields, header.tensors, str(path))
    arch = ARCHITECTURES[fields["general.architecture"]]
    freqs = next((t for t in reader.tensors if t.name == ROPE_FREQS), None)
    if freqs is not None and arch.model_type == "llama" and "rope_scaling" not in config:
        if freqs.tensor_type.name != "F32":
            raise OiError(f"{path}: tensor {ROPE_FREQS} has type {freqs.tensor_type.name}: expected F32")
        config["rope_scaling"] = llama3_rope_scaling(np.array(freqs.data), config, str(path))
    extra, notes = gguf_tokenizer_metadata(fields, str(path))
    extra.update(arch.metadata)
    source = GGUFSource(path, reader, header, arch, config, keep=dtype is None)
    source.notes += notes + foreign_keys(fields, str(path))
    where = f"{path} (metadata)"
    try:
        return convert_checkpoint(config, source, out_path, dtype=dtype, max_positions=max_positions,
                                  progress=progress, config_where=where, extra_metadata=extra, nonfinite=nonfinite)
    except OiError as exc:  # the config read from the GGUF's keys: its messages name those keys
        raise _in_gguf_keys(exc, where, fields["general.architecture"], arch) from None


def _whole_file(fields: dict, where: str) -> None:
    """A part of a split GGUF (llama-gguf-split: `split.count` parts, each with some of the tensors)
    is an error saying so, not a list of missing tensors; `split.count` 1 is a whole model."""
    count, no = fields.get("split.count"), fields.get("split.no")
    if count is None:
        return
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise OiError(f"{where}: metadata split.count must be a positive integer, got {count!r:.60}")
    if count > 1:
        part = f"part {no + 1} of {count}" if isinstance(no, (int, np.integer)) and not isinstance(no, bool) \
            else f"one of {count} parts"
        raise OiError(f"{where}: metadata split.count is {count}: this file is {part} of a split GGUF model; "
                      f"merge the parts into one file first (llama-gguf-split --merge FIRST_PART.gguf OUT.gguf)")


def foreign_keys(fields: dict, where: str) -> list[str]:
    """Notes for the metadata of another supported architecture than the file's (`gemma2.` keys in
    a `llama` file): llama.cpp reads only its own architecture's keys, and so does the converter;
    they are named, not dropped unseen."""
    name = fields.get("general.architecture")
    foreign = sorted(k for k in fields if k.split(".", 1)[0] in ARCHITECTURES and k.split(".", 1)[0] != name)
    if not foreign:
        return []
    return [f"{where}: {len(foreign)} metadata key(s) of another architecture than this file's {name} are not read: "
            + ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")]


def _in_gguf_keys(exc: OiError, where: str, name: str, arch) -> OiError:
    """`exc` with the Hugging Face config keys of a message about the metadata (`where: ...`)
    named as the GGUF keys they were read from (`max_position_embeddings` -> `llama.context_length`)."""
    message = exc.diagnostics[0].message if exc.diagnostics else ""
    if len(exc.diagnostics) != 1 or not message.startswith(f"{where}: "):
        return exc
    names = {hf: f"{name}.{sub}" for sub, hf in {**_COMMON_KEYS, **arch.keys}.items()}
    names.setdefault("original_max_position_embeddings", f"{name}.rope.scaling.original_context_length")
    names["rope_scaling"] = f"{name}.rope.scaling.*"  # (its fields `rope_type`, `factor`: common words, kept)
    names.update({"tokenizer.bos_id": "tokenizer.ggml.bos_token_id", "tokenizer.eos_id": "tokenizer.ggml.eos_token_id"})
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")(?![\w.])")
    return OiError(pattern.sub(lambda m: names[m.group(1)], message))
