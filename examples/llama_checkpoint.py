"""Write a small random Hugging Face Llama checkpoint directory, offline and without PyTorch.

    python examples/llama_checkpoint.py                  # examples/tiny-llama-hf/ (default sizes)
    python examples/llama_checkpoint.py DIR --layers 4 --dtype bf16 --tied --sharded
    python examples/llama_checkpoint.py DIR --tokenizer       # + a tokenizer and chat template (V=320)
    oi2jax convert-hf examples/tiny-llama-hf -o tiny-llama.oinf

The directory holds what `save_pretrained` writes for a `LlamaForCausalLM`: `config.json` and
`model.safetensors` (or, sharded, `model-0000k-of-0000n.safetensors` + `model.safetensors.index.json`),
with the Hugging Face tensor names and `[out, in]` projection layouts. The weights are random
but deterministic (`seed`): normal values with standard deviation `std` (0.02, Hugging Face's
`initializer_range`) for the embedding and projections, RMSNorm weights near 1, so the logits
stay well-conditioned. `rope_form="new"` writes current transformers' `rope_parameters:
{rope_theta, rope_type}`; `"old"` the top-level `rope_theta` (and `rope_scaling: null`) of older
files. `oi2jax convert-hf` turns the directory into an `.oinf` model; tests/test_convert.py and
tests/llama_ref.py (a NumPy reference of the Hugging Face model) use it.

`tokenizer=True` (`--tokenizer`) also writes what a chat model ships beside its weights, as
SmolLM2-Instruct does: `tokenizer.json` (a byte-level BPE trained with the `tokenizers` package on
a fixed English text: the 256 byte symbols, the special tokens `<|endoftext|>` 0, `<|im_start|>`
1, `<|im_end|>` 2, then merges up to exactly `vocab` tokens, so every id the model can draw
decodes), `tokenizer_config.json` (a ChatML `chat_template`, `eos_token` `<|im_end|>`) and
`generation_config.json` (`eos_token_id` 2). Its vocabulary must be 259 + at least one merge;
the default is then 320. `oi2jax generate --chat` runs on the converted directory offline.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_DIR = HERE / "tiny-llama-hf"
DTYPES = ("f32", "bf16", "f16")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2: config.json's bos 1, eos 2
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOKENIZER_VOCAB = 320  # the default vocab_size with a tokenizer
_CORPUS = ("The quick brown fox jumps over the lazy dog. What is the capital of France? Paris is the capital "
           "of France, and Berlin is the capital of Germany. Hello, world! How are you today? I am fine, "
           "thank you. Tokens are pieces of text; a model reads them one at a time and writes the next one. "
           "Numbers like 12345 and 2026 are split into digits and merges.")


def _np_dtype(dtype: str):
    if dtype == "f32":
        return np.dtype(np.float32)
    if dtype == "f16":
        return np.dtype(np.float16)
    if dtype == "bf16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def llama_config(*, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                 max_positions: int, dtype: str = "f32", tied: bool = False, rope_form: str = "new",
                 rope_theta: float = 10000.0, rms_norm_eps: float = 1e-5) -> dict:
    """The `config.json` contents of a LlamaForCausalLM with these sizes (as transformers writes it)."""
    if rope_form not in ("new", "old"):
        raise ValueError(f"rope_form must be 'new' or 'old', got {rope_form!r}")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "initializer_range": 0.02,
        "rms_norm_eps": rms_norm_eps,
        "use_cache": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pretraining_tp": 1,
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "torch_dtype": {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[dtype],
        "transformers_version": "4.57.0" if rope_form == "old" else "5.0.0",
    }
    if rope_form == "new":
        config["rope_parameters"] = {"rope_theta": rope_theta, "rope_type": "default"}
    else:
        config["rope_theta"] = rope_theta
        config["rope_scaling"] = None
    return config


def random_llama_weights(config: dict, *, seed: int = 0, std: float = 0.02) -> dict[str, np.ndarray]:
    """{Hugging Face tensor name: float32 array} for `config` (no lm_head.weight when tied)."""
    rng = np.random.default_rng(seed)
    V, D, F = config["vocab_size"], config["hidden_size"], config["intermediate_size"]
    H, KVH = config["num_attention_heads"], config["num_key_value_heads"]
    HD = config.get("head_dim") or D // H

    def normal(*shape):
        return (std * rng.standard_normal(shape)).astype(np.float32)

    def norm_weight():
        return (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32)

    weights = {"model.embed_tokens.weight": normal(V, D)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights[p + "input_layernorm.weight"] = norm_weight()
        weights[p + "self_attn.q_proj.weight"] = normal(H * HD, D)
        weights[p + "self_attn.k_proj.weight"] = normal(KVH * HD, D)
        weights[p + "self_attn.v_proj.weight"] = normal(KVH * HD, D)
        weights[p + "self_attn.o_proj.weight"] = normal(D, H * HD)
        weights[p + "post_attention_layernorm.weight"] = norm_weight()
        weights[p + "mlp.gate_proj.weight"] = normal(F, D)
        weights[p + "mlp.up_proj.weight"] = normal(F, D)
        weights[p + "mlp.down_proj.weight"] = normal(D, F)
    weights["model.norm.weight"] = norm_weight()
    if not config.get("tie_word_embeddings", False):
        weights["lm_head.weight"] = normal(V, D)
    return weights


def write_checkpoint(directory, config: dict, weights: dict, *, shards: int = 1) -> Path:
    """Write `config.json` and the weights (arrays as given) as one file or `shards` files + index.
    Weight files of an earlier checkpoint in `directory` (model*.safetensors, the index) are
    removed first, so a single-file and a sharded checkpoint never mix."""
    from safetensors.numpy import save_file
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for old in [*directory.glob("model*.safetensors"), directory / "model.safetensors.index.json"]:
        if old.is_file():
            old.unlink()
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    names = list(weights)
    if shards <= 1:
        save_file({n: np.ascontiguousarray(weights[n]) for n in names}, directory / "model.safetensors",
                  metadata={"format": "pt"})
        return directory
    groups = [names[k::shards] for k in range(shards)]  # interleaved: every shard holds some of each kind
    weight_map = {}
    for k, group in enumerate(groups, 1):
        file = f"model-{k:05d}-of-{shards:05d}.safetensors"
        save_file({n: np.ascontiguousarray(weights[n]) for n in group}, directory / file, metadata={"format": "pt"})
        weight_map.update({n: file for n in group})
    total = sum(int(np.asarray(w).nbytes) for w in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return directory


def write_tokenizer(directory, vocab: int) -> Path:
    """Write tokenizer.json (a byte-level BPE of exactly `vocab` tokens), tokenizer_config.json (the
    ChatML template, eos_token) and generation_config.json (eos_token_id) into `directory`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # optional: only here
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    least = len(alphabet) + len(SPECIAL_TOKENS) + 1
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=alphabet)
    tok.train_from_iterator([_CORPUS] * 8, trainer)
    if tok.get_vocab_size(with_added_tokens=True) != vocab:
        raise ValueError(f"a tokenizer of exactly vocab={vocab} tokens cannot be trained on the built-in text: "
                         f"choose a vocab from {least} to {tok.get_vocab_size(with_added_tokens=True)}"
                         if vocab >= least else
                         f"vocab={vocab} is too small for a byte-level tokenizer: it needs at least {least} "
                         f"(256 bytes, {len(SPECIAL_TOKENS)} special tokens, one merge)")
    ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
    assert ids == [0, 1, 2], ids  # the ids config.json names (bos_token_id 1, eos_token_id 2)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(tok.to_str())
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHAT_TEMPLATE, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
         "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>", "model_max_length": 1 << 20}, indent=2) + "\n")
    (directory / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "transformers_version": "4.57.0"}, indent=2) + "\n")
    return directory


def write_random_llama(directory, *, vocab: int | None = None, hidden: int = 32, layers: int = 2, heads: int = 4,
                       kv_heads: int = 2, intermediate: int = 64, max_positions: int = 128, dtype: str = "f32",
                       tied: bool = False, sharded: bool | int = False, rope_form: str = "new", seed: int = 0,
                       std: float = 0.02, rope_theta: float = 10000.0, rms_norm_eps: float = 1e-5,
                       tokenizer: bool = False) -> Path:
    """Write a random LlamaForCausalLM checkpoint directory (config.json + safetensors) and return it.

    `vocab`: vocab_size (default 64, or 320 with `tokenizer`). `tokenizer`: also write tokenizer.json,
    tokenizer_config.json and generation_config.json (`write_tokenizer`).
    `dtype`: the stored dtype of every tensor (the values are float32 draws rounded to it).
    `sharded`: False for one `model.safetensors`; True (2 shards) or a shard count for
    `model-0000k-of-0000n.safetensors` + `model.safetensors.index.json`. `tied`: tie_word_embeddings
    (no lm_head.weight). `rope_form`: "new" (`rope_parameters`) or "old" (top-level `rope_theta`)."""
    np_dtype = _np_dtype(dtype)
    if vocab is None:
        vocab = TOKENIZER_VOCAB if tokenizer else 64
    if tokenizer:  # first: a vocab it cannot train is an error before anything else is written
        write_tokenizer(directory, vocab)
    config = llama_config(vocab=vocab, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
                          intermediate=intermediate, max_positions=max_positions, dtype=dtype, tied=tied,
                          rope_form=rope_form, rope_theta=rope_theta, rms_norm_eps=rms_norm_eps)
    weights = {n: w.astype(np_dtype) for n, w in random_llama_weights(config, seed=seed, std=std).items()}
    shards = (2 if sharded is True else int(sharded)) if sharded else 1
    return write_checkpoint(directory, config, weights, shards=shards)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write a small random Hugging Face Llama checkpoint directory.")
    p.add_argument("directory", nargs="?", default=str(DEFAULT_DIR),
                   help=f"where to write it (default: {DEFAULT_DIR.relative_to(HERE.parent)})")
    p.add_argument("--vocab", type=int, default=None,
                   help=f"vocab_size (default: 64, or {TOKENIZER_VOCAB} with --tokenizer)")
    p.add_argument("--hidden", type=int, default=32, help="hidden_size")
    p.add_argument("--layers", type=int, default=2, help="num_hidden_layers")
    p.add_argument("--heads", type=int, default=4, help="num_attention_heads")
    p.add_argument("--kv-heads", type=int, default=2, help="num_key_value_heads")
    p.add_argument("--intermediate", type=int, default=64, help="intermediate_size")
    p.add_argument("--max-positions", type=int, default=128, help="max_position_embeddings")
    p.add_argument("--dtype", choices=DTYPES, default="f32", help="stored dtype of the weights")
    p.add_argument("--tied", action="store_true", help="tie_word_embeddings (no lm_head.weight)")
    p.add_argument("--sharded", type=int, nargs="?", const=2, default=0, metavar="N",
                   help="write N shards + model.safetensors.index.json (default N: 2)")
    p.add_argument("--rope-form", choices=("new", "old"), default="new",
                   help="rope_parameters (new) or top-level rope_theta (old)")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--tokenizer", action="store_true",
                   help="also write tokenizer.json (a byte-level BPE), tokenizer_config.json (ChatML chat "
                        "template) and generation_config.json")
    args = p.parse_args(argv)
    try:
        out = write_random_llama(args.directory, vocab=args.vocab, hidden=args.hidden, layers=args.layers,
                                 heads=args.heads, kv_heads=args.kv_heads, intermediate=args.intermediate,
                                 max_positions=args.max_positions, dtype=args.dtype, tied=args.tied,
                                 sharded=args.sharded, rope_form=args.rope_form, seed=args.seed,
                                 tokenizer=args.tokenizer)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
