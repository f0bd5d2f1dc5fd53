"""Reading a Hugging Face `config.json` dict: typed, bounded values by key, each error naming the
key (`config.json: num_hidden_layers 10**30 is out of range (1..4096)`), and the JSON files of a
checkpoint read with every failure (a syntax error, 100,000-deep nesting, a non-UTF-8 byte)
naming the file."""
from __future__ import annotations

import difflib
import json
import math
from pathlib import Path

import numpy as np

from ...diagnostics import OiError

# THE bounds of a size read from a config: a hostile number is refused here, by key, before a
# tensor list, a sizevar table or an array is built from it
MAX_LAYERS = 4096
MAX_SIZE = 2**31 - 1  # a dimension or a position count: an i32 index reaches every element
MAX_JSON_BYTES = 64 << 20  # a config or shard index larger than this is not one (real ones: kilobytes)


def fail(where: str, message: str):
    raise OiError(f"{where}: {message}")


def read_json(path: Path, what: str):
    """The JSON value in `path`; OiError naming the file on anything unreadable (or larger than
    MAX_JSON_BYTES: it is not read)."""
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            fail(str(path), f"cannot read {what}: {size} bytes is more than a JSON file of this kind holds "
                            f"(at most {MAX_JSON_BYTES})")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        fail(str(path), f"cannot read {what}: {exc}")
    try:
        return json.loads(text)
    except RecursionError:
        fail(str(path), f"cannot read {what}: JSON nested too deeply")
    except ValueError as exc:
        fail(str(path), f"cannot read {what}: {exc}")


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Seen(dict):
    """A config dict that remembers which keys were looked up (`seen`), however: `get`, `[]`, `in`."""

    def __init__(self, config: dict):
        super().__init__(config)
        self.seen: set = set()

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)


# keys a family's reader never needs, whose values change nothing at inference
BENIGN_KEYS = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "initializer_range", "pad_token_id", "bos_token_id", "eos_token_id", "pretraining_tp", "attention_dropout",
    "hidden_dropout", "embd_pdrop", "resid_pdrop", "attn_pdrop", "summary_first_dropout", "output_attentions",
    "output_hidden_states", "return_dict", "is_encoder_decoder", "tokenizer_class", "auto_map", "id2label",
    "label2id", "task_specific_params", "max_window_layers", "use_return_dict", "rope_theta"})
# settings of other families that change a forward pass: on a family that does not read them, set
# to anything but their neutral value (null, or the value given), they are refused, never ignored
OTHER_FAMILIES_SETTINGS = {"final_logit_softcapping": None, "attn_logit_softcapping": None,
                           "embedding_multiplier": 1.0, "logits_scaling": 1.0, "residual_multiplier": 1.0,
                           "attention_multiplier": None, "query_pre_attn_scalar": None, "logit_scale": 1.0}


class ConfigReader:
    """Typed access to a config dict by key; `where` (the file) starts every message. A key may
    have older spellings: `get(("n_embd", "hidden_size"))` reads the first present. Which keys
    were read is kept (`unread`: what a family's reader never looked at)."""

    def __init__(self, config, where: str):
        if not isinstance(config, dict):
            fail(where, "expected a JSON object")
        self.config = _Seen(config)
        self.where = where
        self.notes: list[str] = []

    def check_unread(self) -> None:
        """After a family has read what it needs: a setting of another family that would change the
        forward pass is refused; a key that is none of these but close to a key read is noted
        (a misspelling such as `rope_scalling` would otherwise vanish)."""
        seen = set(self.config.seen)
        for key in sorted(set(self.config) - seen - BENIGN_KEYS):
            value = dict.get(self.config, key)
            if key in OTHER_FAMILIES_SETTINGS:
                if value is not None and value != OTHER_FAMILIES_SETTINGS[key]:
                    self.fail(f"{key} is {_show(value)}: this family's forward pass has no such setting "
                              f"(it changes the model's outputs); is model_type right?")
                continue
            close = difflib.get_close_matches(key, sorted(seen | set(OTHER_FAMILIES_SETTINGS)), n=1, cutoff=0.85)
            if close:
                self.notes.append(f"{self.where}: key {key} is not read (did you mean {close[0]}?)")

    def fail(self, message: str):
        fail(self.where, message)

    def key(self, keys) -> str | None:
        """The first of `keys` (a name or a tuple of spellings) present with a non-null value."""
        for k in (keys,) if isinstance(keys, str) else keys:
            if self.config.get(k) is not None:
                return k
        return None

    def get(self, keys, default=None):
        k = self.key(keys)
        return default if k is None else self.config[k]

    def _missing(self, keys):
        name = keys if isinstance(keys, str) else keys[0]
        self.fail(f"missing required key {name}")

    def size(self, keys, *, default=None, limit: int = MAX_SIZE) -> int:
        """A positive integer at most `limit`; `default` when absent (None: required)."""
        k = self.key(keys)
        if k is None:
            if default is None:
                self._missing(keys)
            return default
        value = self.config[k]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.fail(f"{k} must be a positive integer, got {_show(value)}")
        if value > limit:
            self.fail(f"{k} {value} is out of range (1..{limit})")
        return value

    def number(self, keys, *, default=None, positive: bool = True, f32: bool = False) -> float:
        """A finite number (positive unless `positive=False`; `f32`: held as f32 metadata, `number`);
        `default` when absent (None: required)."""
        k = self.key(keys)
        if k is None:
            if default is None:
                self._missing(keys)
            return float(default)
        return number(self.where, self.config[k], k, positive, f32)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(f"{key} must be true or false, got {_show(value)}")
        return value


def number(where: str, value, key: str, positive: bool = True, f32: bool = False) -> float:
    """A finite number (positive unless `positive=False`); `f32`: one stored as f32 metadata, which
    must keep it finite and (if not 0) not 0."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or (positive and value <= 0):
        fail(where, f"{key} must be a {'positive ' if positive else ''}number, got {_show(value)}")
    if not f32:
        return float(value)
    with np.errstate(over="ignore", under="ignore"):
        kept = float(np.float32(value))  # model files hold such numbers as f32 metadata
    if not math.isfinite(kept) or (kept == 0) != (value == 0):
        fail(where, f"{key} {_show(value)} is {kept} in f32, in which the model file holds it: give a value f32 keeps")
    return float(value)
