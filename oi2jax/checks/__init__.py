"""Rule groups of the semantic checker: mixins of `oi2jax.check._Checker`, sharing its state and helpers."""
from __future__ import annotations


def shape_text(shape) -> str:
    return "[" + ", ".join("?" if s is None else str(s) for s in shape) + "]"  # ?: a length known at run time
