"""The tokenizer and chat template inside an `.oinf` file (issue #39 item 4, docs/models.md).

Both converters store, as metadata entries (keys `META`):
- `tokenizer.json`: the tokenizer as Hugging Face `tokenizers` JSON text: the checkpoint's own
  file (convert-hf), or built from a GGUF's `tokenizer.ggml.tokens/merges/token_type` with the
  `tokenizers` package (convert-gguf; GGUF tokenizer model `gpt2`, byte-level BPE, with the GPT-2
  pre-tokenizer: `tokenizer.ggml.pre` `default` or `gpt2`; anything else is refused, naming the key);
- `tokenizer.chat_template`: tokenizer_config.json's `chat_template` (or chat_template.jinja), or
  the GGUF's `tokenizer.chat_template`;
- `tokenizer.bos_id`, `tokenizer.eos_id` (i32) and `tokenizer.stop_ids` (i32[]: generation_config.json's
  `eos_token_id` list, else the config's or the tokenizer's EOS);
- `example_graph`: the family's example decode graph (`examples/<model_type>_decode.oi`).
Every entry is optional: a model file without them runs with `oi2jax run` all the same.

`render_chat` renders a chat template as transformers' `apply_chat_template` does (jinja2's
ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, `raise_exception`, `strftime_now`,
transformers' `tojson`); `encode_prompt` never adds a second BOS.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import numpy as np

from ..diagnostics import OiError

__all__ = ["META", "hf_tokenizer_metadata", "gguf_tokenizer_metadata", "gguf_tokenizer_json", "render_chat",
           "encode_prompt", "example_graph", "describe"]

META = {"tokenizer": "tokenizer.json", "chat_template": "tokenizer.chat_template", "bos": "tokenizer.bos_id",
        "eos": "tokenizer.eos_id", "stop": "tokenizer.stop_ids", "graph": "example_graph"}
# model_type -> example graph, where a family runs another's graph unchanged
_GRAPH_OF = {"mistral": "llama"}
GGUF_TOKENIZER_MODELS = ("gpt2",)
GGUF_PRE_TOKENIZERS = ("default", "gpt2")
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types of special tokens


def example_graph(model_type: str) -> str:
    return f"examples/{_GRAPH_OF.get(model_type, model_type)}_decode.oi"


def _ids(value) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return []


def _entries(model_type: str, tokenizer_json: str | None, template: str | None, bos: int | None,
             eos: int | None, stop: list[int]) -> dict:
    out: dict[str, object] = {META["graph"]: example_graph(model_type)}
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


def hf_tokenizer_metadata(directory: Path, config: dict) -> dict:
    """The tokenizer entries of a Hugging Face checkpoint directory (whichever files it has)."""
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
    jinja_path = directory / "chat_template.jinja"
    if template is None and jinja_path.is_file():
        template = jinja_path.read_text(encoding="utf-8")
    if template is not None and not isinstance(template, str):
        raise OiError(f"{directory / 'tokenizer_config.json'}: chat_template must be a string, got {template!r}")
    bos = next(iter(_ids(gen.get("bos_token_id")) or _ids(config.get("bos_token_id"))
                    or _ids(_token_id(tokenizer, tok_config.get("bos_token")))), None)
    eos_list = _ids(config.get("eos_token_id")) or _ids(_token_id(tokenizer, tok_config.get("eos_token")))
    stop = _ids(gen.get("eos_token_id")) or eos_list
    return _entries(config.get("model_type", "llama"), text, template, bos, eos_list[0] if eos_list else None, stop)


def gguf_tokenizer_json(fields: dict, where: str) -> str:
    """tokenizer.json text from a GGUF's `tokenizer.ggml.*` entries (byte-level BPE)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors  # optional

    model = fields.get("tokenizer.ggml.model")
    if model not in GGUF_TOKENIZER_MODELS:
        raise OiError(f"{where}: metadata tokenizer.ggml.model is {model!r}: supported GGUF tokenizer models are "
                      f"{', '.join(GGUF_TOKENIZER_MODELS)} (byte-level BPE); convert with a tokenizer.json instead")
    pre = fields.get("tokenizer.ggml.pre", "default")
    if pre not in GGUF_PRE_TOKENIZERS:
        raise OiError(f"{where}: metadata tokenizer.ggml.pre is {pre!r}: supported pre-tokenizers are "
                      f"{', '.join(GGUF_PRE_TOKENIZERS)} (the GPT-2 split)")
    tokens = fields.get("tokenizer.ggml.tokens")
    merges = fields.get("tokenizer.ggml.merges", [])
    types = fields.get("tokenizer.ggml.token_type", [1] * len(tokens or ()))
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise OiError(f"{where}: metadata tokenizer.ggml.tokens must be an array of strings")
    if not isinstance(types, list) or len(types) != len(tokens):
        raise OiError(f"{where}: metadata tokenizer.ggml.token_type must have one entry per token ({len(tokens)})")
    if len(set(tokens)) != len(tokens):
        raise OiError(f"{where}: metadata tokenizer.ggml.tokens holds a token twice")
    pairs = []
    for m in merges:
        parts = m.split(" ") if isinstance(m, str) else []
        if len(parts) != 2:
            raise OiError(f"{where}: metadata tokenizer.ggml.merges: {m!r} is not two tokens separated by a space")
        pairs.append((parts[0], parts[1]))
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False) for t, kind in zip(tokens, types)
               if kind in (_CONTROL, _USER_DEFINED)]
    tok.add_special_tokens(special)
    bos = fields.get("tokenizer.ggml.bos_token_id")
    if fields.get("tokenizer.ggml.add_bos_token") and isinstance(bos, int) and 0 <= bos < len(tokens):
        tok.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B",
                                                           special_tokens=[(tokens[bos], bos)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok.to_str()


def gguf_tokenizer_metadata(fields: dict, where: str, model_type: str) -> dict:
    """The tokenizer entries of a GGUF file (none but the example graph when it has no tokenizer)."""
    text = gguf_tokenizer_json(fields, where) if "tokenizer.ggml.model" in fields else None
    bos = fields.get("tokenizer.ggml.bos_token_id")
    eos = fields.get("tokenizer.ggml.eos_token_id")
    eot = fields.get("tokenizer.ggml.eot_token_id")
    stop = [i for i in (eos, eot) if isinstance(i, int)]
    return _entries(model_type, text, fields.get("tokenizer.chat_template"), bos if isinstance(bos, int) else None,
                    eos if isinstance(eos, int) else None, list(dict.fromkeys(stop)))


# ---------------------------------------------------------------------------------- chat template

def _raise_exception(message):
    raise OiError(f"chat template: {message}")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' tojson: json.dumps, not jinja2's HTML-escaping filter
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render_chat(template: str, messages: list[dict], *, add_generation_prompt: bool = False,
                bos_token: str = "", eos_token: str = "", **kwargs) -> str:
    """The text transformers' `apply_chat_template(..., tokenize=False)` renders."""
    from jinja2 import TemplateError  # optional: only chat needs jinja2
    from jinja2.ext import loopcontrols  # optional
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # optional

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                bos_token=bos_token, eos_token=eos_token, **kwargs)
    except TemplateError as exc:
        raise OiError(f"chat template: {exc}") from None


def encode_prompt(tokenizer, text: str, bos_id: int | None) -> list[int]:
    """Token ids of a rendered prompt (`tokenizer`: a `tokenizers.Tokenizer`): the tokenizer's own
    special tokens as its post-processor adds them, but never a second BOS when the text (a chat
    template's output) already begins with one."""
    ids = tokenizer.encode(text).ids
    if bos_id is not None and len(ids) >= 2 and ids[0] == bos_id and ids[1] == bos_id:
        ids = ids[1:]
    return ids


def describe(metadata: dict) -> list[str]:
    """`oi2jax inspect`'s summary of the tokenizer entries (values: reader MetaValues' `.value`)."""
    lines = []
    text = metadata.get(META["tokenizer"])
    if isinstance(text, str):
        try:
            data = json.loads(text)
            model = data.get("model") or {}
            kind = model.get("type", "?")
            vocab = len(model.get("vocab") or ()) + len(data.get("added_tokens") or ())
            lines.append(f"tokenizer: {kind}, {vocab} tokens ({len(text)} bytes of tokenizer.json)")
        except (ValueError, AttributeError, TypeError, RecursionError):
            lines.append(f"tokenizer: unreadable tokenizer.json ({len(text)} bytes)")
    template = metadata.get(META["chat_template"])
    if isinstance(template, str):
        lines.append(f"chat template: {len(template)} characters")
    ids = [f"{k} {int(metadata[META[k]])}" for k in ("bos", "eos") if META[k] in metadata]
    if META["stop"] in metadata:
        ids.append("stop " + ", ".join(str(int(i)) for i in np.ravel(metadata[META["stop"]])))
    if ids:
        lines.append("special ids: " + "; ".join(ids))
    if isinstance(metadata.get(META["graph"]), str):
        lines.append(f"example graph: {metadata[META['graph']]}")
    return lines

