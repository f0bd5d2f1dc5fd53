"""One error type for every stage: a located diagnostic rendered as `PATH:LINE:COL: error: MESSAGE`.

Every user-facing failure (syntax, checking, model files, runtime guards) raises `OiError`
carrying one or more `Diagnostic`s; the CLI renders them with the source line and a caret.
"""
from __future__ import annotations

import dataclasses
import difflib
import numbers
import unicodedata
from dataclasses import dataclass

from .ir import Span


@dataclass(frozen=True)
class Diagnostic:
    """A message, optionally located. `related` holds (note, span) pairs for other places."""

    message: str
    span: Span | None = None
    severity: str = "error"  # "error" | "warning"
    related: tuple[tuple[str, Span], ...] = ()

    def render(self, source: str | None = None) -> str:
        """`PATH:LINE:COL: error: MESSAGE` + source line + caret, or `error: MESSAGE`."""
        out = [_render_one(self.severity, self.message, self.span, source)]
        for note, span in self.related:
            out.append(_render_one("note", note, span, source))
        return "\n".join(out)


_LINES_CACHE: dict = {}
SHOWN_WIDTH = 160  # the most characters of a source line a diagnostic shows


def source_lines(source: str) -> list[str]:
    """The source's lines as the lexer counts them: split at '\\n' only (a form feed or U+2028
    inside a comment does not start a line), '\\r' dropped. Cached: rendering N diagnostics of one
    source splits it once, not N times."""
    cached = _LINES_CACHE.get(source)
    if cached is not None:
        return cached
    lines = [line[:-1] if line.endswith("\r") else line for line in source.split("\n")]
    if len(_LINES_CACHE) > 8:
        _LINES_CACHE.clear()
    _LINES_CACHE[source] = lines
    return lines


def _render_one(severity: str, message: str, span: Span | None, source: str | None) -> str:
    if span is None:
        return f"{severity}: {message}"
    if span.line == 0:  # no source line: a graph read from JSON (its pointer), or no place at all
        return f"{span.path}{'#' + span.pointer if span.pointer else ''}: {severity}: {message}"
    head = f"{span.path}:{span.line}:{span.col}: {severity}: {message}"
    if source is None:
        return head
    lines = source_lines(source)
    if not 1 <= span.line <= len(lines):
        return head
    text = lines[span.line - 1].expandtabs(1)
    col = max(span.col, 1) - 1
    if len(text) > SHOWN_WIDTH:  # a window around the caret, not a line of megabytes
        start = max(0, min(col - SHOWN_WIDTH // 2, len(text) - SHOWN_WIDTH))
        end = start + SHOWN_WIDTH
        text = ("..." if start else "") + text[start:end] + ("..." if end < len(text) else "")
        col += (3 if start else 0) - start
    # control characters (a NUL, an escape) shown as one visible character each: the caret stays put
    text = "".join("\ufffd" if ord(c) < 32 or 127 <= ord(c) < 160 else c for c in text)
    caret = "".join(_blank(c) for c in text[:col]) + "^"
    return f"{head}\n    {text}\n    {caret}"


def _blank(char: str) -> str:
    """What goes under `char` in the caret line: a terminal shows a wide (CJK) character in two
    columns and a combining mark or zero-width character in none, so the caret stays under the column."""
    if char.isascii():
        return " "
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
        return ""
    return "  " if unicodedata.east_asian_width(char) in ("W", "F") else " "


class OiNote(UserWarning):
    """Something the user asked for that changes nothing (a shard spec that shards no dim): a
    Python warning of this category, which the CLI prints as `note: MESSAGE`."""


class OiError(Exception):
    """A user error: one or more diagnostics. Never a crash: the CLI prints it and exits 1."""

    step: int | None = None  # the 1-based step a runtime error happened in (in_step)

    def __init__(self, diagnostics: Diagnostic | str | list[Diagnostic], span: Span | None = None,
                 source: str | None = None):
        if isinstance(diagnostics, str):
            diagnostics = [Diagnostic(diagnostics, span)]
        elif isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics: list[Diagnostic] = list(diagnostics)
        self.source = source
        super().__init__(self.render())

    def in_step(self, step: int) -> "OiError":
        """The same error naming the 1-based step it happened in (`... (in step k)`, `.step`):
        the one form for a runtime error, compiled (a guard) or interpreted."""
        error = self.where(f"in step {step}")
        error.step = step
        return error

    def where(self, place: str) -> "OiError":
        """The same error saying where it happened: `... (PLACE)` (a step, a chunk of a chunked
        run, an element of a vmapped state)."""
        first, *rest = self.diagnostics
        return OiError([dataclasses.replace(first, message=f"{first.message} ({place})"), *rest], source=self.source)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    def render(self, source: str | None = None) -> str:
        src = source if source is not None else self.source
        return "\n".join(d.render(src) for d in self.diagnostics)


def suggest(name: str, candidates) -> str:
    """' (did you mean X?)' when a known name is close to `name`, else ''."""
    pool = sorted({str(c) for c in candidates})
    close = [c for c in pool if c.lower() == name.lower()][:1]  # case slips first: `b` for `B`, `F32`
    # for `f32` (difflib rates `u32` as close as `f32`, and took the last of the ties)
    if not close:  # difflib's score; of the ties, one that `name` begins (`ad`: add, not and), then
        # the first in order (get_close_matches took the last)
        scored = [(difflib.SequenceMatcher(None, c, name).ratio(), c) for c in pool]  # as difflib scores
        best = max((r for r, _ in scored if r >= 0.6), default=None)
        ties = [c for r, c in scored if r == best]
        close = sorted(ties, key=lambda c: not c.startswith(name))[:1]
    return f" (did you mean {close[0]}?)" if close else ""


def error(message: str, span: Span | None = None) -> OiError:
    """Shorthand: `raise error("unknown variable x", node.span)`."""
    return OiError(message, span)


def check_whole(name: str, value, low: int, high: int | None = None) -> int:
    """THE check of a whole-number argument (`steps`, `max_tokens`, `top_k`, ...): an int (not a
    bool, not a float: 2.5 steps are not truncated to 2) in low..high; its value as an int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low or (
            high is not None and value > high):
        span = f"{low}..{high}" if high is not None else f">= {low}"
        raise OiError(f"{name} must be a whole number {span}, got {value!r}")
    return int(value)


def check_sizes(sizes) -> dict:
    """THE check of a `sizes=` argument (`oi2jax.compile`, `Program.rebound`): None or a dict of
    size names to whole numbers >= 0 (a float, bool or string size was taken as it converted; a
    negative one failed in NumPy)."""
    if sizes is None:
        return {}
    if not isinstance(sizes, dict):
        raise OiError(f"sizes: expected a dict {{name: int}}, got {type(sizes).__name__}")
    for name in sizes:
        if not isinstance(name, str):
            raise OiError(f"sizes: a size name is a string, got {name!r}")
    return {name: check_whole(f"size {name}", value, 0) for name, value in sizes.items()}
