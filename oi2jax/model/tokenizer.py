"""The tokenizer and chat template inside an `.oinf` file (issue #39 item 4, docs/models.md).

Both converters store, as metadata entries (keys `META`):
- `tokenizer.json`: the tokenizer as Hugging Face `tokenizers` JSON text: the checkpoint's own
  file (convert-hf), or built from a GGUF's `tokenizer.ggml.tokens/merges/token_type` with the
  `tokenizers` package (convert-gguf; GGUF tokenizer models `gpt2`, byte-level BPE with the
  pre-tokenizers of `GGUF_PRE_TOKENIZERS`, and `llama`, SentencePiece; for anything else no
  tokenizer.json is stored, with a note naming the key);
- `tokenizer.chat_template`: chat_template.jinja, else tokenizer_config.json's `chat_template`
  (transformers' priority), or the GGUF's `tokenizer.chat_template`;
- `tokenizer.special_tokens`: JSON text of the special tokens a chat template receives (transformers'
  `special_tokens_map`: tokenizer_config.json's bos/eos/unk/sep/pad/cls/mask_token and
  additional_special_tokens; a GGUF's tokens of its special ids);
- `tokenizer.bos_id`, `tokenizer.eos_id` (i32) and `tokenizer.stop_ids` (i32[]: generation_config.json's
  `eos_token_id` list, else the config's or the tokenizer's EOS);
- `example_graph` (written by `convert.convert_checkpoint`): the family's example decode graph.
Every entry is optional: a model file without them runs with `oi2jax run` all the same.

The chat template is rendered by `chat_template.render_chat`; `encode_prompt` never adds a second
BOS, and adds no special token to a rendered chat (the template decides them).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..diagnostics import OiError, suggest

__all__ = ["META", "config_token_ids", "hf_tokenizer_metadata", "gguf_tokenizer_metadata", "gguf_tokenizer_json",
           "gguf_tokenizer_unsupported", "check_gguf_tokenizer_fields", "encode_prompt", "describe",
           "stored_special_ids"]

META = {"tokenizer": "tokenizer.json", "chat_template": "tokenizer.chat_template", "bos": "tokenizer.bos_id",
        "eos": "tokenizer.eos_id", "stop": "tokenizer.stop_ids", "special": "tokenizer.special_tokens",
        "graph": "example_graph"}
# transformers' SPECIAL_TOKENS_ATTRIBUTES: what `special_tokens_map` holds, and a chat template receives
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
ADDITIONAL = "additional_special_tokens"
# the GGUF id of each (transformers' GGUF loader names them from these)
_GGUF_SPECIAL = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "sep_token": "seperator",
                 "pad_token": "padding", "cls_token": "cls", "mask_token": "mask"}
GGUF_TOKENIZER_MODELS = ("gpt2", "llama")  # byte-level BPE; SentencePiece (BPE by piece scores, byte fallback)
# tokenizer.ggml.pre -> (split regex before the byte-level step or None for GPT-2's own, digits one
# by one first, ignore_merges): llama.cpp's llm_tokenizer_bpe regexes, in tokenizers' terms
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_GGUF_PRE = {
    "gpt-2": (None, False, False),
    "smollm": (None, True, False), "starcoder": (None, True, False), "refact": (None, True, False),
    "codeshell": (None, True, False),
    "llama-bpe": (_LLAMA3_SPLIT, False, True),
    "qwen2": (_LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}"), False, False),
}
GGUF_PRE_TOKENIZERS = tuple(_GGUF_PRE)
# llama.cpp's other names of the same splits (llama-vocab.cpp); `gpt2` is no llama.cpp name (it refuses
# it) but the one oi2jax's own gguf_file.py wrote before, read as `gpt-2`
_GGUF_PRE_ALIASES = {"gpt2": "gpt-2", "phi-2": "gpt-2", "llama3": "llama-bpe", "llama-v3": "llama-bpe",
                     "falcon3": "llama-bpe", "deepseek-r1-qwen": "qwen2"}
_GGUF_PRE.update({alias: _GGUF_PRE[name] for alias, name in _GGUF_PRE_ALIASES.items()})
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types of special tokens


def _ids(value, where: str = "") -> list[int]:
    """The token ids of a config entry: one id or a list (None: none). Anything else -- a string, a
    float, an id no i32 holds -- is an OiError naming `where` (nothing is silently dropped); the
    converter checks the ids against the vocabulary (`check_token_ids`)."""
    if value is None:
        return []
    ids = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31 for v in ids):
        raise OiError(f"{where}: expected a token id (a whole number >= 0) or a list of them, got {value!r}")
    return list(ids)


def check_token_ids(metadata: dict, vocab: int, where: str) -> None:
    """The special ids about to be stored (bos, eos, stop) must name tokens of the vocabulary."""
    for key in (META["bos"], META["eos"], META["stop"]):
        for i in np.ravel(metadata.get(key, [])):
            if not 0 <= int(i) < vocab:
                raise OiError(f"{where}: {key} {int(i)} is not a token of the vocabulary (0..{vocab - 1})")


def _entries(tokenizer_json: str | None, template: str | None, bos: int | None, eos: int | None,
             stop: list[int]) -> dict:
    out: dict[str, object] = {}
    if tokenizer_json is not None:
        out[META["tokenizer"]] = tokenizer_json
    if template is not None:
        out[META["chat_template"]] = template
    if bos is not None:
        out[META["bos"]] = np.int32(bos)
    if eos is not None:
        out[META["eos"]] = np.int32(eos)
    if stop:
        out[META["stop"]] = np.asarray(stop, np.int32)
    return out


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        raise OiError(f"{path}: cannot read: {exc}") from None


def _token_id(tokenizer: dict | None, token) -> int | None:
    """The id of a token given as text (or as tokenizer_config's {"content": ...} form)."""
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str) or not isinstance(tokenizer, dict):
        return None
    for added in tokenizer.get("added_tokens") or ():
        if isinstance(added, dict) and added.get("content") == token and isinstance(added.get("id"), int):
            return added["id"]
    vocab = (tokenizer.get("model") or {}).get("vocab")
    return vocab.get(token) if isinstance(vocab, dict) else None


def _token_text(value, where: str):
    """A special token of tokenizer_config.json as its text: a string, or the {"content": ...} of an
    AddedToken (transformers' `str(token)`)."""
    text = value.get("content") if isinstance(value, dict) else value
    if not isinstance(text, str):
        raise OiError(f"{where}: expected a token (a string or {{\"content\": STRING}}), got {value!r:.80}")
    return text


def special_tokens_entry(tokens: dict) -> dict:
    """The `tokenizer.special_tokens` entry (JSON text: {name: text, additional_special_tokens: [text]}),
    what a chat template receives as transformers' `special_tokens_map`; none for an empty map."""
    return {META["special"]: json.dumps(tokens, ensure_ascii=False)} if tokens else {}


def read_special_tokens(text, where: str) -> dict:
    """The stored `tokenizer.special_tokens` entry as a dict (None: {}); OiError naming `where` for a
    damaged one."""
    if text is None:
        return {}
    try:
        tokens = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        tokens = None
    if not isinstance(tokens, dict) or not all(
            isinstance(v, str) if k in SPECIAL_TOKENS else k == ADDITIONAL and isinstance(v, list)
            and all(isinstance(t, str) for t in v) for k, v in tokens.items()):
        raise OiError(f"{where}: metadata {META['special']}: expected JSON text of {{name: token}} "
                      f"({', '.join(SPECIAL_TOKENS)}, {ADDITIONAL}: [token, ...]), got {text!r:.80}")
    return tokens


def config_token_ids(config: dict, where="config.json") -> dict:
    """The special-id entries a `config.json` alone gives (its bos_token_id, eos_token_id: one id or
    a list): what `convert.convert_checkpoint` stores for any source; the checkpoint's other files
    (`hf_tokenizer_metadata`) and a GGUF's tokenizer entries take precedence. `where`: the file
    (DIR/config.json) an error names, as every other key's error does."""
    bos, eos = _ids(config.get("bos_token_id"), f"{where}: bos_token_id"), \
        _ids(config.get("eos_token_id"), f"{where}: eos_token_id")
    return _entries(None, None, bos[0] if bos else None, eos[0] if eos else None, eos)


# the files of a Hugging Face checkpoint directory that `hf_tokenizer_metadata` reads (a conversion's
# output must never replace one)
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")


def hf_tokenizer_metadata(directory: Path, config: dict) -> dict:
    """The tokenizer entries of a Hugging Face checkpoint directory (whichever of HF_TOKENIZER_FILES
    it has; one that exists but is not a file is an error, not a file left out)."""
    for name in HF_TOKENIZER_FILES:
        if (directory / name).exists() and not (directory / name).is_file():
            raise OiError(f"{directory / name}: not a regular file (the checkpoint's {name} is read as one)")
    text = None
    tok_path = directory / "tokenizer.json"
    if tok_path.is_file():
        try:
            text = tok_path.read_text(encoding="utf-8")
            tokenizer = json.loads(text)
        except (OSError, ValueError, RecursionError) as exc:
            raise OiError(f"{tok_path}: cannot read the tokenizer: {exc}") from None
    else:
        tokenizer = None
    tok_config = _read_json(directory / "tokenizer_config.json") or {}
    gen = _read_json(directory / "generation_config.json") or {}
    if not isinstance(tok_config, dict) or not isinstance(gen, dict):
        raise OiError(f"{directory}: tokenizer_config.json and generation_config.json must hold JSON objects")
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}]: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    if template is not None and not isinstance(template, str):
        raise OiError(f"{directory / 'tokenizer_config.json'}: chat_template must be a string, got {template!r}")
    jinja_path = directory / "chat_template.jinja"
    if jinja_path.is_file():  # transformers: a standalone template file takes priority over tokenizer_config's
        try:
            template = jinja_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise OiError(f"{jinja_path}: cannot read the chat template: {exc}") from None
    # special ids, later layers first: generation_config.json, config.json, the tokenizer's tokens
    tok_bos = _ids(_token_id(tokenizer, tok_config.get("bos_token")))
    tok_eos = _ids(_token_id(tokenizer, tok_config.get("eos_token")))
    gen_bos = _ids(gen.get("bos_token_id"), f"{directory / 'generation_config.json'}: bos_token_id")
    layers = ((_entries(None, None, tok_bos[0] if tok_bos else None, tok_eos[0] if tok_eos else None, tok_eos),
               directory / "tokenizer_config.json"),
              (config_token_ids(config, directory / "config.json"), directory / "config.json"),
              (_entries(None, None, gen_bos[0] if gen_bos else None, None,
                        _ids(gen.get("eos_token_id"), f"{directory / 'generation_config.json'}: eos_token_id")),
               directory / "generation_config.json"))
    ids, origin = {}, {}
    for layer, where in layers:
        ids.update(layer)
        origin.update(dict.fromkeys(layer, where))
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0:  # each id blamed on the file it came from
        for key, value in ids.items():
            check_token_ids({key: value}, vocab, str(origin[key]))
    where = directory / "tokenizer_config.json"
    special = {name: _token_text(tok_config[name], f"{where}: {name}") for name in SPECIAL_TOKENS
               if tok_config.get(name) is not None}
    extra = tok_config.get(ADDITIONAL)
    if extra is not None:
        if not isinstance(extra, list):
            raise OiError(f"{where}: {ADDITIONAL}: expected a list of tokens, got {extra!r:.80}")
        special[ADDITIONAL] = [_token_text(t, f"{where}: {ADDITIONAL}[{i}]") for i, t in enumerate(extra)]
    return {**_entries(text, template, None, None, []), **ids, **special_tokens_entry(special)}


def _kind(value) -> str:
    return {str: "a string", bool: "a boolean", float: "a number with a fraction", list: "an array"}.get(
        type(value), type(value).__name__)


def check_gguf_tokenizer_fields(fields: dict, where: str) -> None:
    """The types of a GGUF's tokenizer entries, as llama.cpp writes them: every
    `tokenizer.ggml.*_token_id` a whole number >= 0 (a u32), every `tokenizer.ggml.add_*` a
    boolean, `tokenizer.ggml.model` and `tokenizer.ggml.pre` strings, `tokenizer.chat_template` (and
    its named `tokenizer.chat_template.NAME`) a string.
    Another type -- an id stored as a string or a float, a flag as the string "false" -- is an
    error naming the file and key, never dropped or misread."""
    for key, value in fields.items():
        if value is None:  # (a dict built by hand: absent)
            continue
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            whole = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            if not whole or not 0 <= value < 2**31:
                raise OiError(f"{where}: metadata {key}: expected a token id (a whole number >= 0), got {value!r}"
                              + ("" if whole else f" ({_kind(value)})"))
        elif key.startswith("tokenizer.ggml.add_") and not isinstance(value, (bool, np.bool_)):
            raise OiError(f"{where}: metadata {key}: expected true or false, got {value!r} ({_kind(value)})")
        elif key in ("tokenizer.ggml.model", "tokenizer.ggml.pre") and not isinstance(value, str):
            raise OiError(f"{where}: metadata {key}: expected a name (a string), got {value!r:.60} ({_kind(value)})")
        elif (key == "tokenizer.chat_template" or key.startswith("tokenizer.chat_template.")) and \
                not isinstance(value, str):
            raise OiError(f"{where}: metadata {key}: expected the template's text (a string), got {value!r:.60} "
                          f"({_kind(value)})")


def gguf_tokenizer_unsupported(fields: dict) -> str | None:
    """Why a GGUF's tokenizer cannot be rebuilt (its model or pre-tokenizer), or None."""
    model = fields.get("tokenizer.ggml.model")
    if model not in GGUF_TOKENIZER_MODELS:
        return (f"metadata tokenizer.ggml.model is {model!r}{suggest(str(model), GGUF_TOKENIZER_MODELS)}: supported "
                f"GGUF tokenizer models are {', '.join(GGUF_TOKENIZER_MODELS)}")
    if model == "llama":  # SentencePiece: no pre-tokenizer
        return None
    pre = fields.get("tokenizer.ggml.pre")
    if pre is None:  # llama.cpp then splits with its own 'default' pre-tokenizer (with a warning)
        return (f"metadata tokenizer.ggml.pre is missing (llama.cpp then uses its 'default' pre-tokenizer): "
                f"supported pre-tokenizers are {', '.join(GGUF_PRE_TOKENIZERS)}")
    if not isinstance(pre, str) or pre not in _GGUF_PRE:
        return f"metadata tokenizer.ggml.pre is {pre!r}: supported pre-tokenizers are {', '.join(GGUF_PRE_TOKENIZERS)}"
    return None


def _byte_level_bpe(fields: dict, where: str, tokens: list[str]):
    """llama.cpp's `gpt2` tokenizer: byte-level BPE over its merges, split as `tokenizer.ggml.pre` says."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors  # optional

    split, digits, ignore_merges = _GGUF_PRE[fields["tokenizer.ggml.pre"]]
    pairs = []
    for m in fields.get("tokenizer.ggml.merges", []):
        parts = m.split(" ") if isinstance(m, str) else []
        if len(parts) != 2:
            raise OiError(f"{where}: metadata tokenizer.ggml.merges: {m!r} is not two tokens separated by a space")
        pairs.append((parts[0], parts[1]))
    try:
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs,
                                   ignore_merges=ignore_merges))
    except Exception as exc:  # tokenizers raises its own Exception type: a merge of tokens not in the vocabulary
        raise OiError(f"{where}: metadata tokenizer.ggml.merges: the tokenizer cannot be built: {exc}") from None
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    if split is not None:
        steps.append(pre_tokenizers.Split(Regex(split), behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None))
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _sentencepiece_bpe(fields: dict, where: str, tokens: list[str]):
    """llama.cpp's `llama` (SentencePiece) tokenizer as transformers' GGUF loader rebuilds it: BPE whose
    merges are every split of a piece into two pieces, ranked by the piece's score (llama.cpp merges
    the adjacent pair whose concatenation scores highest), unknown characters as their UTF-8 bytes
    (`<0xXX>` pieces), spaces as `▁` with one in front (`tokenizer.ggml.add_space_prefix`, default true)."""
    from tokenizers import Tokenizer, decoders, models, normalizers  # optional

    scores = fields.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in scores):
        raise OiError(f"{where}: metadata tokenizer.ggml.scores must hold one finite number per token ({len(tokens)})")
    score = dict(zip(tokens, scores))
    merges = []
    for piece, piece_score in score.items():
        local = [(piece[:k], piece[k:], piece_score) for k in range(1, len(piece))
                 if piece[:k] in score and piece[k:] in score]
        merges += sorted(local, key=lambda m: (score[m[0]], score[m[1]]), reverse=True)
    merges.sort(key=lambda m: m[2], reverse=True)
    unk = fields.get("tokenizer.ggml.unknown_token_id")
    if unk is not None and not 0 <= unk < len(tokens):
        raise OiError(f"{where}: metadata tokenizer.ggml.unknown_token_id {unk} is not a token of the vocabulary "
                      f"(0..{len(tokens) - 1})")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[(a, b) for a, b, _ in merges],
                               unk_token=None if unk is None else tokens[unk],
                               fuse_unk=True, byte_fallback=True))
    prefix = fields.get("tokenizer.ggml.add_space_prefix", True)
    replace = normalizers.Replace(" ", "\u2581")
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), replace]) if prefix else replace
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


_GGUF_MODELS = {"gpt2": _byte_level_bpe, "llama": _sentencepiece_bpe}


def gguf_tokenizer_json(fields: dict, where: str) -> str:
    """tokenizer.json text from a GGUF's `tokenizer.ggml.*` entries (`GGUF_TOKENIZER_MODELS`)."""
    from tokenizers import AddedToken, processors  # optional

    check_gguf_tokenizer_fields(fields, where)
    why = gguf_tokenizer_unsupported(fields)
    if why is not None:
        raise OiError(f"{where}: {why}")
    tokens = fields.get("tokenizer.ggml.tokens")
    types = fields.get("tokenizer.ggml.token_type", [1] * len(tokens or ()))
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise OiError(f"{where}: metadata tokenizer.ggml.tokens must be an array of strings")
    if not isinstance(types, list) or len(types) != len(tokens):
        raise OiError(f"{where}: metadata tokenizer.ggml.token_type must have one entry per token ({len(tokens)})")
    if len(set(tokens)) != len(tokens):
        raise OiError(f"{where}: metadata tokenizer.ggml.tokens holds a token twice")
    tok = _GGUF_MODELS[fields["tokenizer.ggml.model"]](fields, where, tokens)
    special = [AddedToken(t, special=True, normalized=False) for t, kind in zip(tokens, types)
               if kind in (_CONTROL, _USER_DEFINED)]
    tok.add_special_tokens(special)
    added = {}  # llama.cpp's add_bos_token / add_eos_token: the tokenizer adds them (a post-processor)
    # absent: llama.cpp's default, a BOS for a SentencePiece vocabulary (as transformers'
    # LlamaTokenizerFast) or Llama 3's split that names one, none for another byte-level BPE, never an EOS
    bos_first = fields.get("tokenizer.ggml.bos_token_id") is not None and (
        fields["tokenizer.ggml.model"] == "llama" or _GGUF_PRE[fields["tokenizer.ggml.pre"]] == _GGUF_PRE["llama-bpe"])
    for which, key, default in (("bos", "tokenizer.ggml.add_bos_token", bos_first),
                                ("eos", "tokenizer.ggml.add_eos_token", False)):
        if fields.get(key, default):
            token_id = fields.get(f"tokenizer.ggml.{which}_token_id")
            if not isinstance(token_id, int) or not 0 <= token_id < len(tokens):
                raise OiError(f"{where}: metadata {key} is set but tokenizer.ggml.{which}_token_id is {token_id!r}")
            added[which] = (tokens[token_id], token_id)
    if added:
        bos = f"{added['bos'][0]} " if "bos" in added else ""
        eos = f" {added['eos'][0]}" if "eos" in added else ""
        tok.post_processor = processors.TemplateProcessing(single=f"{bos}$A{eos}", pair=f"{bos}$A $B{eos}",
                                                           special_tokens=list(dict.fromkeys(added.values())))
    return tok.to_str()


# llama.cpp's end-of-generation tokens (llama-vocab.cpp, `special_eog_ids`; the lists of the
# llama.cpp in llama-cpp-python 0.3.36, checked token by token with `llama_vocab_is_eog`): the ids
# of EOS, EOT, EOM and the FIM pad/repo/separator keys; where a key of these is absent, a token with
# one of its texts; and every token with one of the end-of-generation texts (Gemma's
# <end_of_turn>, ChatML's <|im_end|>, Phi-3's <|end|>, Llama 3's <|eot_id|>, ...), key or no key
_GGUF_STOP_KEYS = ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep")
_GGUF_KEY_TEXTS = {  # a FIM key's texts, read when the key is absent (llama.cpp's auto-detection)
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",)}
_GGUF_STOP_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>"))


def gguf_stop_ids(fields: dict, tokens: list) -> list[int]:
    """The ids a GGUF model's generation ends at, as llama.cpp's (above): the keys' ids, then the
    tokens found by text, in id order. As there, `<|end|>` is not one beside `<|return|>` and
    `<|call|>` (gpt-oss's harmony format) or `<|calls|>` and `<|flush|>`, and `</s>` is not one beside
    `<|tool_response>`."""
    texts = set(_GGUF_STOP_TEXTS)
    for which, alternatives in _GGUF_KEY_TEXTS.items():
        if fields.get(f"tokenizer.ggml.{which}_token_id") is None:
            texts.update(alternatives)
    ids = [int(fields[k]) for k in (f"tokenizer.ggml.{w}_token_id" for w in _GGUF_STOP_KEYS)
           if fields.get(k) is not None]  # (their types: check_gguf_tokenizer_fields)
    ids = list(dict.fromkeys(ids + [i for i, t in enumerate(tokens) if isinstance(t, str) and t in texts]))
    named = {tokens[i] for i in ids if i < len(tokens) and isinstance(tokens[i], str)}
    calls = bool(named & {"<|call|>", "<|calls|>"})
    drop = ({"<|end|>"} if calls and ("<|return|>" in named or "<|flush|>" in named) else set()) | \
        ({"</s>"} if "<|tool_response>" in named else set())
    return [i for i in ids if not (i < len(tokens) and tokens[i] in drop)]


def gguf_tokenizer_metadata(fields: dict, where: str) -> tuple[dict, list[str]]:
    """(the tokenizer entries of a GGUF file, notes). A tokenizer of a model or pre-tokenizer that
    cannot be rebuilt is left out with a note (the model's weights do not depend on it); a
    damaged one is an error."""
    check_gguf_tokenizer_fields(fields, where)
    text, notes = None, []
    if "tokenizer.ggml.model" in fields:
        why = gguf_tokenizer_unsupported(fields)
        if why is None:
            text = gguf_tokenizer_json(fields, where)
        else:
            notes.append(f"{where}: no tokenizer.json stored: {why} (tokenize prompts with the model's own tokenizer)")
    bos, eos = fields.get("tokenizer.ggml.bos_token_id"), fields.get("tokenizer.ggml.eos_token_id")
    tokens = fields.get("tokenizer.ggml.tokens")
    stop = gguf_stop_ids(fields, tokens if isinstance(tokens, list) else [])
    special = {}  # the texts of the special ids, as transformers' GGUF loader names them
    if isinstance(tokens, list) and all(isinstance(t, str) for t in tokens):
        for name, which in _GGUF_SPECIAL.items():
            key = f"tokenizer.ggml.{which}_token_id"
            if fields.get(key) is not None:
                if not fields[key] < len(tokens):
                    raise OiError(f"{where}: metadata {key} {fields[key]} is not a token of the vocabulary "
                                  f"(0..{len(tokens) - 1})")
                special[name] = tokens[fields[key]]
    return {**_entries(text, fields.get("tokenizer.chat_template"), None if bos is None else int(bos),
                       None if eos is None else int(eos), list(dict.fromkeys(stop))),
            **special_tokens_entry(special)}, notes


def encode_prompt(tokenizer, text: str, bos_id: int | None, *, chat: bool = False) -> list[int]:
    """Token ids of a prompt (`tokenizer`: a `tokenizers.Tokenizer`). A plain text: the tokenizer's
    own special tokens as its post-processor adds them, but never a second BOS when the text already
    begins with one. A rendered chat (`chat`): the text alone, no special tokens added (the template
    decides BOS and EOS), as transformers' `apply_chat_template(tokenize=True)` encodes it."""
    if chat:
        return tokenizer.encode(text, add_special_tokens=False).ids
    ids = tokenizer.encode(text).ids
    if bos_id is not None and len(ids) >= 2 and ids[0] == bos_id and ids[1] == bos_id:
        ids = ids[1:]
    return ids


def _stored_ids(value, many: bool) -> list[int] | None:
    """The token ids of a stored special-id entry (a reader MetaValue's `.value`): an integer scalar
    (or, `many`, a 0-D or 1-D integer array), each in 0..2^31-1; None for anything else."""
    arr = np.asarray(value) if isinstance(value, (np.ndarray, np.generic, int)) else None
    if arr is None or arr.dtype.kind not in "iu" or arr.ndim > (1 if many else 0):
        return None  # a string, a float, a bool or bitset, an array where one id is stored
    ids = [int(v) for v in arr.reshape(-1)]
    return ids if all(0 <= v < 2**31 for v in ids) else None


def stored_special_ids(metadata: dict, where: str) -> tuple[int | None, int | None, list[int] | None]:
    """(bos, eos, stop ids) a model file stores (`tokenizer.bos_id`, `eos_id`: one id each;
    `tokenizer.stop_ids`: ids), None where absent. An entry of another type (a string, a float, an
    array for one id) or an id outside 0..2^31-1 is an OiError naming the file and key, never
    truncated (1.5 -> 1) or dropped. `metadata`: key -> a reader MetaValue's `.value`."""
    out = []
    for key, many in (("bos", False), ("eos", False), ("stop", True)):
        if META[key] not in metadata:
            out.append(None)
            continue
        value = metadata[META[key]]
        ids = _stored_ids(value, many)
        if ids is None:
            want = "token ids (whole numbers >= 0)" if many else "a token id (a whole number >= 0)"
            shown = value.item() if isinstance(value, np.generic) else value
            raise OiError(f"{where}: metadata {META[key]}: expected {want}, got {shown!r:.60}")
        out.append(ids if many else ids[0])
    return out[0], out[1], out[2]


def describe(metadata: dict) -> list[str]:
    """`oi2jax inspect`'s summary of the tokenizer entries (values: reader MetaValues' `.value`)."""
    lines = []
    text = metadata.get(META["tokenizer"])
    if isinstance(text, str):
        try:
            data = json.loads(text)
            model = data.get("model") or {}
            kind = model.get("type", "?")
            ids = set((model.get("vocab") or {}).values()) | {t.get("id") for t in data.get("added_tokens") or ()}
            lines.append(f"tokenizer: {kind}, {len(ids)} tokens ({len(text)} bytes of tokenizer.json)")
        except (ValueError, AttributeError, TypeError, RecursionError):
            lines.append(f"tokenizer: unreadable tokenizer.json ({len(text)} bytes)")
    template = metadata.get(META["chat_template"])
    if isinstance(template, str):
        lines.append(f"chat template: {len(template)} characters")
    ids = []  # an entry that holds no token id (a damaged file) is shown as it is, never truncated
    for key in ("bos", "eos", "stop"):
        if META[key] in metadata:
            value = metadata[META[key]]
            read = _stored_ids(value, key == "stop")
            ids.append(f"{key} " + (", ".join(map(str, read)) if read is not None
                                    else f"{(value.item() if isinstance(value, np.generic) else value)!r:.40} "
                                         f"(not a token id)"))
    if ids:
        lines.append("special ids: " + "; ".join(ids))
    if isinstance(metadata.get(META["graph"]), str):
        lines.append(f"example graph: {metadata[META['graph']]}")
    return lines

