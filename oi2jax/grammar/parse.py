"""Text -> IR: runs the Lark LALR parser for the OpenInfer DSL, then the tree -> IR builder.

`parse(text, path)` returns an `ir.Graph`; every syntax error (Lark's, translated by errors.py, or
one of the prose restrictions of SPEC §1.4 enforced by build.py) is raised as a located `OiError`
with `source=text`, worded in DSL terms ("expected one of ';', a name").
"""
from __future__ import annotations

import os
import stat
from functools import lru_cache
from pathlib import Path

from lark import Lark
from lark.exceptions import UnexpectedInput, VisitError

from .. import ir
from ..diagnostics import OiError
from .build import Builder
from .errors import translate

GRAMMAR_PATH = Path(__file__).with_name("openinfer.lark")


@lru_cache(maxsize=1)
def lark_parser() -> Lark:
    return Lark(GRAMMAR_PATH.read_text(), parser="lalr", lexer="contextual", propagate_positions=True,
                maybe_placeholders=True)


CACHED_TEXT_CHARS = 1 << 20  # texts up to this long keep their graph (`parse`'s cache)


def parse(text: str, path: str = "<string>") -> ir.Graph:
    """Parse DSL text into an `ir.Graph` (raises a located `OiError` on any syntax error).

    The graph of a recent (text, path) is kept and returned again: the IR is immutable, and a
    program compiled again from the same file (a prompt bucket, a test, an interpreter beside the
    compiled run) parses once (about 40 us per token in Lark's LALR parser and the builder)."""
    if not isinstance(text, str):  # a Path, bytes or None: a TypeError from len() or startswith() otherwise
        raise OiError(f"parse: expected program text (a str), got {type(text).__name__}"
                      + ("; for a file, use oi2jax.grammar.parse.parse_file(path)" if isinstance(text, os.PathLike)
                         else ""))
    if len(text) > CACHED_TEXT_CHARS:
        return _parse(text, path)
    return _parse_cached(text, path)


@lru_cache(maxsize=32)
def _parse_cached(text: str, path: str) -> ir.Graph:
    return _parse(text, path)


def _parse(text: str, path: str) -> ir.Graph:
    if text.startswith("\ufeff"):  # a UTF-8 byte-order mark: not part of the program
        text = text[1:]
    try:
        tree = lark_parser().parse(text)
    except UnexpectedInput as exc:
        raise translate(exc, text, path) from None
    _check_nesting(tree, text, path)
    try:
        vars_, blocks = Builder(path).transform(tree)
    except VisitError as exc:
        orig = exc.orig_exc
        if isinstance(orig, OiError):
            raise OiError(orig.diagnostics, source=text) from None
        raise
    except OiError as exc:
        raise OiError(exc.diagnostics, source=text) from None
    return ir.Graph(vars=tuple(vars_), blocks=tuple(blocks), path=path, source=text)


MAX_LOOP_DEPTH = ir.MAX_LOOP_DEPTH  # loops inside loops: a located error beyond (not a recursion failure)


def _check_nesting(tree, text: str, path: str) -> None:
    """Loops nested deeper than MAX_LOOP_DEPTH: a located error naming the limit (walked with an
    explicit stack: 1000 nested loops are no RecursionError)."""
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if getattr(node, "data", None) == "loop":
            depth += 1
            if depth > MAX_LOOP_DEPTH:
                meta = node.meta
                raise OiError(f"loops nest {depth} deep here; the limit is {MAX_LOOP_DEPTH}",
                              ir.Span(path, meta.line, meta.column), source=text)
        stack.extend((c, depth) for c in getattr(node, "children", ()) if hasattr(c, "data"))


def parse_file(path) -> ir.Graph:
    """Read and parse a `.oi` file ("error: cannot read PATH: ..." when it cannot be read)."""
    path = str(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode) and not stat.S_ISDIR(os.stat(path).st_mode):
            raise OiError(f"cannot read {path}: not a regular file (a pipe or device cannot be a graph)")
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        hint = " (an .oinf model? pass it with --model)" if path.endswith(".oinf") or \
            Path(path).read_bytes()[:4] == b"OINF" else ""
        raise OiError(f"cannot read {path}: not UTF-8 text, so not a .oi graph{hint} "
                      f"(byte {exc.start} is 0x{exc.object[exc.start]:02x})") from None
    except OSError as exc:
        raise OiError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse(text, path)
