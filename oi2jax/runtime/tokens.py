"""Token ids given to a step graph (docs/decode.md): a prompt's ids and stop ids, checked against
the graph's vocabulary before anything runs. The vocabulary is the length V of the step graph's
`logits: f32[V]` (the contract of examples/llama_prefill.oi and llama_decode.oi). An id outside
0..V-1 would otherwise fail the prompt's first step at its embedding, after the compile and, in
a batch, after the prompts before it had started (an id past int32 failed in NumPy's cast); as a
stop id it can never be drawn, so it would never stop anything; a prompt longer than the cache
fails a prompt step only after those before it ran. `Generator` (generation.py),
`generate_batch` and `Batch` (runtime/batch.py) all use this one rule."""
from __future__ import annotations

import numpy as np

from ..diagnostics import OiError

_I32 = np.iinfo(np.int32)


def vocabulary(program) -> int | None:
    """The step graph's vocabulary size V (its volatile `logits: f32[V]`), None where it has no such
    output (a graph outside the contract: ids are then checked against i32 only)."""
    decl = program.graph.var("logits")
    if decl is None or len(decl.dims) != 1:
        return None
    return int(program.bound.shape("logits")[0])


def capacity(program) -> int | None:
    """The positions the step graph's cache holds (its size variable T, the step-graph contract's),
    None where it has none: a prompt longer than it is refused before it runs."""
    value = program.bound.sizes.get("T")
    return None if value is None else int(value)


def _outside(vocab: int | None) -> str:
    if vocab is None:
        return f"outside 0..{_I32.max} (a token id is an i32)"
    return f"outside the vocabulary 0..{vocab - 1} (the graph's logits: f32[{vocab}])"


def prompt_ids(ids, vocab: int | None, what: str = "the prompt", positions: int | None = None) -> np.ndarray:
    """A prompt's token ids as int32: a non-empty 1-D integer array, every id in 0..vocab-1 (the
    first one outside named with its index), no more of them than the cache's `positions` (its T:
    `capacity`) where given."""
    if isinstance(ids, (str, bytes)):  # (np.asarray makes a 0-d string: "got shape []" said nothing)
        raise OiError(f"{what}: a prompt is a non-empty vector of token ids, got text {ids[:40]!r}: encode it "
                      f"first (the model's tokenizer; oi2jax.Generator and `oi2jax generate` take text)")
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size == 0:
        raise OiError(f"{what}: a prompt is a non-empty vector of token ids, got shape {list(ids.shape)}")
    if ids.dtype.kind not in "iu":
        raise OiError(f"{what}: prompt token ids must be integers, got {ids.dtype}")
    hi = _I32.max if vocab is None else vocab - 1
    bad = np.flatnonzero((ids < 0) | (ids > hi))
    if bad.size:
        i = int(bad[0])
        raise OiError(f"{what}: token id {int(ids[i])} (index {i}) is {_outside(vocab)}")
    fits(ids.size, positions, what)
    return ids.astype(np.int32)


def fits(tokens: int, positions: int | None, what: str = "the prompt") -> None:
    """A prompt of `tokens` ids is no longer than the cache's `positions` (None: no limit known)."""
    if positions is not None and tokens > positions:
        raise OiError(f"{what} has {tokens} tokens, more than the {positions} positions the model's cache holds "
                      f"(its size T): shorten the prompt")


def stop_ids(ids, vocab: int | None, what: str = "stop ids") -> list[int]:
    """Stop ids as distinct ints in their order, every one in 0..vocab-1: one outside can never be
    drawn."""
    values = list(np.ravel(np.asarray(list(ids) if not np.isscalar(ids) else [ids], dtype=object)))
    hi = _I32.max if vocab is None else vocab - 1
    for v in values:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise OiError(f"{what}: {v!r} is not a token id (a whole number)")
        if not 0 <= int(v) <= hi:
            raise OiError(f"{what}: {int(v)} is {_outside(vocab)}: it can never be drawn")
    return list(dict.fromkeys(int(v) for v in values))
