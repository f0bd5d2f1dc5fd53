"""Sampling settings of a step graph (docs/decode.md): the dynamic inputs `temperature`, `top_k`,
`top_p`, `min_p` and `seed` of the step-graph contract (examples/llama_prefill.oi), their dtypes
and "off" values, and THE check of a generation's settings, before anything runs. `Generator`
(generation.py), `generate_batch` and `Batch.insert` (runtime/batch.py) all use this one rule, so
a setting is refused, or handed to the graph, the same way by each."""
from __future__ import annotations

import numpy as np

from ..diagnostics import OiError, check_whole

# the graph inputs of sampling: their dtype (what the sampler sees) and the value that turns each off
SETTINGS = {"temperature": (np.float32, 0.0), "top_k": (np.int32, 0), "top_p": (np.float32, 1.0),
            "min_p": (np.float32, 0.0), "seed": (np.int32, 0)}
OFF = {name: off for name, (_, off) in SETTINGS.items()}


def check_settings(*, max_tokens, temperature, top_k, top_p, min_p, seed, vocab: int | None = None) -> None:
    """Every setting in its range, as the graph's dtype keeps it (`max_tokens` None: run to a stop
    or the cache's end); sampling settings with temperature 0 (greedy) are an error, as they would
    be ignored; a `top_k` above the vocabulary's `vocab` tokens keeps every token (top-k off):
    an error too."""
    def number(name, value, ok, what):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)) \
                or not np.isfinite(value) or not ok(float(value)):
            raise OiError(f"{name} must be {what}, got {value!r}")
        off = OFF[name]
        with np.errstate(over="ignore"):
            kept = float(np.float32(value))  # the graph's input: what the sampler sees
        if not np.isfinite(kept) or not ok(kept) or (kept == off) != (float(value) == off):
            raise OiError(f"{name} {value!r} is {kept} in f32, the sampler's precision, which "
                          f"{'turns it off' if kept == off else 'is out of range'}: give a value that f32 keeps")

    if max_tokens is not None:
        check_whole("max_tokens", max_tokens, 0)
    check_whole("top_k", top_k, 0, 2**31 - 1)
    if vocab is not None and top_k > vocab:
        raise OiError(f"top_k {top_k} is more than the vocabulary's {vocab} tokens: it keeps every token, which "
                      f"turns top-k off (top_k 0); give 1..{vocab}, or 0 for off")
    check_whole("seed", seed, 0, 2**31 - 1)  # the graph's `seed: i32`
    number("temperature", temperature, lambda v: v >= 0, "a number >= 0 (0: greedy)")
    number("top_p", top_p, lambda v: 0 < v <= 1, "in (0, 1] (1: off)")
    number("min_p", min_p, lambda v: 0 <= v <= 1, "in [0, 1] (0: off)")
    if temperature == 0:  # greedy: a sampling setting would be silently ignored
        given = [f"{k}={v}" for k, v in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p), ("seed", seed))
                 if v != OFF[k]]
        if given:
            raise OiError(f"{', '.join(given)}: sampling settings, but temperature 0 is greedy (the most likely "
                          f"token, whatever they say): give a temperature > 0, or leave them out")


def as_input(name: str, value):
    """A checked setting as the graph's input: its dtype's nearest value (a temperature of 0.8 is
    the f32 nearest 0.8, as the sampler computes with it)."""
    return SETTINGS[name][0](value)
