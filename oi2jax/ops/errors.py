"""OpTypeError: an op node that does not type-check (the SPEC wording, and the part it points at)."""
from __future__ import annotations


class OpTypeError(Exception):
    """An op node that does not type-check. `attr`/`input` point at the offending part."""

    def __init__(self, message: str, attr: str | None = None, input: int | None = None):
        super().__init__(message)
        self.message = message
        self.attr = attr
        self.input = input

    def __str__(self) -> str:
        return self.message
