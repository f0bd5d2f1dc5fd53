"""Write a GGUF file (llama.cpp's format) from a Hugging Face Llama checkpoint directory, offline.

    python examples/llama_checkpoint.py ck --tokenizer          # a random checkpoint with a tokenizer
    python examples/gguf_file.py ck tiny.gguf --type Q8_0       # Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q4_K | F16 | BF16 | F32
    oi2jax convert-gguf tiny.gguf -o tiny.oinf

What llama.cpp's convert_hf_to_gguf.py writes for a `LlamaForCausalLM` (`LlamaModel`), done with
gguf-py (`gguf.GGUFWriter`, `gguf.quants.quantize`, gguf-py's own Hugging Face -> GGUF tensor
name map):
* the `llama.*` hyperparameters of config.json (context length, sizes, heads, rope theta, RMS eps);
  config keys GGUF's llama has no place for (rope scaling, attention or MLP biases) are an error;
* every tensor: the norms F32, the 2-D weights as `--type`; the `q_proj` / `k_proj` rows
  permuted from Hugging Face's rotate-half order to GGML's interleaved one (`permute`, as
  `LlamaModel.permute`); no `output.weight` when the embeddings are tied;
* the tokenizer, when the directory has one: a byte-level BPE tokenizer.json (as
  llama_checkpoint.py's `--tokenizer` writes, or GPT-2's) as `tokenizer.ggml.model` `gpt2`,
  pre-tokenizer `gpt-2`, its tokens, merges and token types (special added tokens: 3, control),
  the BOS id of config.json, the EOS id of generation_config.json (a second stop id as the EOT id),
  and tokenizer_config.json's `chat_template`. Another kind of tokenizer is an error.

Block types quantize along each row (the input dimension): Q8_0/Q4_*/Q5_* need rows that are a
multiple of 32, Q4_K a multiple of 256 (e.g. `--hidden 256 --intermediate 256 --heads 2`).
gguf-py has no K-quant quantizer, so `quantize_q4_k` is oi2jax's plain one (per 32-value
sub-block: scale (max - min) / 15 and offset -min, both as 6-bit multiples of two f16 block
scales: `oi2jax.model.ggml.quantize`); llama.cpp's own searches for better scales, so its values differ. The file is written
to a temporary name and renamed, so a failed run leaves no partial file. It holds every weight in
memory as float32: it is meant for small checkpoints (llama.cpp's converter is the tool for real ones).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

from oi2jax.model import ggml

TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K")
FILE_TYPES = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
              "BF16": gguf.LlamaFileType.MOSTLY_BF16,
              "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
              "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1, "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
              "Q5_1": gguf.LlamaFileType.MOSTLY_Q5_1, "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_S}
# llama-quantize's fallback for a weight whose rows its K-quant blocks of 256 cannot hold
# (llama-quant.cpp: Q4_K -> Q5_0); `write_llama_gguf(..., fallback=True)`
FALLBACK = {"Q4_K": "Q5_0"}
_UNSUPPORTED_CONFIG = {"rope_scaling": None, "attention_bias": False, "mlp_bias": False}
_CONTROL, _NORMAL = 3, 1  # llama.cpp's token types


def permute(weights: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """convert_hf_to_gguf.py's `LlamaModel.permute`."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] (cols a multiple of 256) -> Q4_K blocks, u8 [rows, cols // 256 * 144]:
    oi2jax's plain Q4_K quantizer (`oi2jax.model.ggml.quantize`, as `convert-hf --quantize q4_k`)."""
    return ggml.quantize("Q4_K", x)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """{name: float32 array} of one safetensors file (its header read here: NumPy has no bfloat16)."""
    import ml_dtypes  # installed with JAX
    dtypes = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in dtypes:
            raise ValueError(f"{path}: tensor {name} is {info['dtype']}; this example reads {', '.join(dtypes)}")
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(data[start:end], dtypes[info["dtype"]]).reshape(info["shape"]).astype(np.float32)
    return out


def read_weights(directory: Path) -> dict[str, np.ndarray]:
    """{Hugging Face name: float32 array} of model.safetensors or a sharded checkpoint's files."""
    index = directory / "model.safetensors.index.json"
    files = sorted(set(_read_json(index)["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    weights = {}
    for file in files:
        weights.update(_read_safetensors(directory / file))
    return weights


def _tokenizer(w: gguf.GGUFWriter, directory: Path, config: dict) -> None:
    """The tokenizer.ggml.* entries and the chat template (nothing when there is no tokenizer.json)."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        return
    data = json.loads(path.read_text())
    model, pre = data.get("model") or {}, data.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) \
            or pre.get("add_prefix_space") or data.get("normalizer") or data.get("post_processor"):
        raise ValueError(f"{path}: only a byte-level BPE tokenizer (GPT-2's split, no prefix space, normalizer "
                         f"or post-processor) can be written as GGUF's `gpt2` tokenizer here")
    ids = dict(model["vocab"])
    special = set()
    for added in data.get("added_tokens") or ():
        ids[added["content"]] = added["id"]
        if added.get("special"):
            special.add(added["content"])
    tokens = sorted(ids, key=ids.get)
    if [ids[t] for t in tokens] != list(range(len(tokens))) or len(tokens) != config["vocab_size"]:
        raise ValueError(f"{path}: the token ids must be exactly 0..{config['vocab_size'] - 1} (vocab_size)")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # llama.cpp's name of GPT-2's split
    w.add_token_list(tokens)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or ()])
    w.add_token_types([_CONTROL if t in special else _NORMAL for t in tokens])
    w.add_add_bos_token(False)
    if isinstance(config.get("bos_token_id"), int):
        w.add_bos_token_id(config["bos_token_id"])
    stop = _read_json(directory / "generation_config.json").get("eos_token_id", config.get("eos_token_id"))
    stop = [stop] if isinstance(stop, int) else list(stop or ())
    if len(stop) > 2:
        raise ValueError(f"{directory}: GGUF holds two stop ids (EOS, EOT), the checkpoint has {stop}")
    for add, token_id in zip((w.add_eos_token_id, w.add_eot_token_id), stop):
        add(token_id)
    template = _read_json(directory / "tokenizer_config.json").get("chat_template")
    jinja = directory / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text()
    if template is not None:
        w.add_chat_template(template)


def _tensor(name: str, x: np.ndarray, kind: str) -> tuple[np.ndarray, T]:
    if x.ndim == 1 or kind == "F32":
        return x.astype(np.float32), T.F32
    if kind == "F16":
        return x.astype(np.float16), T.F16
    if kind == "BF16":
        return quants.quantize(x, T.BF16), T.BF16
    block = gguf.GGML_QUANT_SIZES[T[kind]][0]
    if x.shape[-1] % block:
        raise ValueError(f"{name}: rows of {x.shape[-1]} values; {kind} needs a multiple of {block} "
                         f"(choose other sizes or --type)")
    return (quantize_q4_k(x) if kind == "Q4_K" else quants.quantize(x, T[kind])), T[kind]


def write_gguf(directory, out, kind: str = "Q8_0") -> Path:
    """Write `directory`'s Llama checkpoint as the GGUF file `out` with 2-D weights of type `kind`."""
    directory, out = Path(directory), Path(out)
    if kind not in TYPES:
        raise ValueError(f"type must be one of {', '.join(TYPES)}, got {kind!r}")
    if not (directory / "config.json").is_file():
        raise ValueError(f"{directory}: no config.json (not a Hugging Face checkpoint directory)")
    config = _read_json(directory / "config.json")
    return write_llama_gguf(out, config, read_weights(directory), kind, name=directory.name,
                            tokenizer=lambda w: _tokenizer(w, directory, config), where=str(directory / "config.json"))


def write_llama_gguf(out, config: dict, weights: dict[str, np.ndarray], kind: str, *, name: str,
                     tokenizer=None, where: str = "config", fallback: bool = False) -> Path:
    """Write a Llama `config` (config.json's contents) and its {Hugging Face name: float32} `weights`
    as the GGUF file `out`, 2-D weights of type `kind`; `tokenizer(writer)` adds the tokenizer entries.
    `fallback`: a weight whose rows `kind`'s blocks cannot hold takes FALLBACK[kind], as llama-quantize does."""
    out = Path(out)
    if kind not in TYPES:
        raise ValueError(f"type must be one of {', '.join(TYPES)}, got {kind!r}")
    if config.get("model_type") != "llama":
        raise ValueError(f"{where}: model_type {config.get('model_type')!r}; this example writes llama only")
    for key, plain in _UNSUPPORTED_CONFIG.items():
        if config.get(key, plain) != plain:
            raise ValueError(f"{where}: {key} {config[key]!r} is not written by this example")
    rope = config.get("rope_parameters") or {"rope_theta": config.get("rope_theta", 10000.0), "rope_type": "default"}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"{where}: rope_type {rope['rope_type']!r} is not written by this example")
    H, KVH, L = config["num_attention_heads"], config["num_key_value_heads"], config["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, L)
    tmp = out.with_name(out.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    try:
        w.add_name(name)
        w.add_file_type(FILE_TYPES[kind])
        w.add_vocab_size(config["vocab_size"])
        w.add_context_length(config["max_position_embeddings"])
        w.add_embedding_length(config["hidden_size"])
        w.add_block_count(L)
        w.add_feed_forward_length(config["intermediate_size"])
        w.add_head_count(H)
        w.add_head_count_kv(KVH)
        w.add_rope_dimension_count(config.get("head_dim") or config["hidden_size"] // H)
        w.add_layer_norm_rms_eps(config["rms_norm_eps"])
        w.add_rope_freq_base(rope["rope_theta"])
        if tokenizer is not None:
            tokenizer(w)
        for hf, x in weights.items():
            if hf.endswith("q_proj.weight"):
                x = permute(x, H, H)
            elif hf.endswith("k_proj.weight"):
                x = permute(x, H, KVH)
            gguf_name = names.get_name(hf, try_suffixes=(".weight",))
            if gguf_name is None:
                raise ValueError(f"{where}: tensor {hf!r} has no llama GGUF name")
            rows_fit = x.ndim == 1 or kind not in FALLBACK or x.shape[-1] % gguf.GGML_QUANT_SIZES[T[kind]][0] == 0
            data, qtype = _tensor(hf, x, kind if rows_fit or not fallback else FALLBACK[kind])
            w.add_tensor(gguf_name, data, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, out)
    finally:
        w.close()
        tmp.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write a GGUF file from a Hugging Face Llama checkpoint directory.")
    p.add_argument("directory", help="the checkpoint (config.json, safetensors, tokenizer files)")
    p.add_argument("out", help="the GGUF file to write")
    p.add_argument("--type", choices=TYPES, default="Q8_0", help="GGUF type of the 2-D weights (norms stay F32)")
    args = p.parse_args(argv)
    try:
        out = write_gguf(args.directory, args.out, args.type)
    except (ValueError, KeyError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({args.type})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
