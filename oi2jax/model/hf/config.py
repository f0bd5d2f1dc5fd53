"""Reading a Hugging Face `config.json` dict: typed, bounded values by key, each error naming the
key (`config.json: num_hidden_layers 10**30 is out of range (1..4096)`), and the JSON files of a
checkpoint read with every failure (a syntax error, 100,000-deep nesting, a non-UTF-8 byte)
naming the file."""
from __future__ import annotations

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


class ConfigReader:
    """Typed access to a config dict by key; `where` (the file) starts every message. A key may
    have older spellings: `get(("n_embd", "hidden_size"))` reads the first present."""

    def __init__(self, config, where: str):
        if not isinstance(config, dict):
            fail(where, "expected a JSON object")
        self.config = config
        self.where = where
        self.notes: list[str] = []

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

    def number(self, keys, *, default=None, positive: bool = True) -> float:
        """A finite number (positive unless `positive=False`); `default` when absent (None: required)."""
        k = self.key(keys)
        if k is None:
            if default is None:
                self._missing(keys)
            return float(default)
        return number(self.where, self.config[k], k, positive)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(f"{key} must be true or false, got {_show(value)}")
        return value


def number(where: str, value, key: str, positive: bool = True) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or (positive and value <= 0):
        fail(where, f"{key} must be a {'positive ' if positive else ''}number, got {_show(value)}")
    with np.errstate(over="ignore", under="ignore"):
        kept = float(np.float32(value))  # model files hold such numbers as f32 metadata
    if not math.isfinite(kept) or (kept == 0) != (value == 0):
        fail(where, f"{key} {_show(value)} is {kept} in f32, in which the model file holds it: give a value f32 keeps")
    return float(value)
