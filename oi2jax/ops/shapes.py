"""The shape rules shared by typing and the impls: numpy broadcasting, axis normalization."""
from __future__ import annotations

from .errors import OpTypeError


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy broadcast (right-aligned); OpTypeError("incompatible broadcast dims a and b")."""
    out = []
    for i in range(max(len(a), len(b))):
        x = a[len(a) - 1 - i] if i < len(a) else 1
        y = b[len(b) - 1 - i] if i < len(b) else 1
        if x != y and x != 1 and y != 1:
            raise OpTypeError(f"incompatible broadcast dims {x} and {y}")
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def normalize_axes(op: str, axes, rank: int) -> tuple[int, ...]:
    """Negative axes from the end, duplicates removed, sorted; out of range -> OpTypeError."""
    out = set()
    for ax in axes:
        ax = int(ax)
        if not -rank <= ax < rank:
            raise OpTypeError(f"op {op} axis {ax} out of range for rank {rank}", attr="axes")
        out.add(ax % rank)
    return tuple(sorted(out))
