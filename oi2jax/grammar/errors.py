"""Lark's syntax errors -> located `OiError`s worded in DSL terms ("expected one of ';', a name")."""
from __future__ import annotations

import re

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput

from .. import dtypes, ir, messages
from ..diagnostics import OiError, suggest

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # openinfer.lark's STRING

_WORDS = {
    "NAME": "a name", "INT": "an integer", "FLOAT": "a float", "STRING": "a string", "DTYPE": "a dtype",
    "MEMKIND": "a memory section", "$END": "end of input",
}

# the words a misspelt keyword is compared with, for "did you mean ...?" (SPEC §1.3)
_SECTIONS = (*(kind.value for kind in ir.MemKind), "block")
_ATTRIBUTES = ("init", "ref", "pattern", "table", "auto_dim", "fixed")
_NODES = ("assign", "op", "cache", "branch", "barrier", "dep", "loop", "yield", "await", "transfer", "return")
_CACHE_OPS = ("read", "write", "increment", "decrement", "reset")


def _word(term: str) -> str:
    if term in _WORDS:
        return _WORDS[term]
    from .parse import lark_parser  # cycle: parse.py imports this module (its terminals name the tokens)
    for t in lark_parser().terminals:
        if t.name == term:
            if t.pattern.type == "str":
                return f"'{t.pattern.value}'"
            break
    return term.lower()


def _expected(terms) -> str:
    words = sorted({_word(t) for t in terms}, key=lambda w: (not w.startswith("'"), w))
    return "expected one of " + ", ".join(words)


def _end_pos(text: str) -> tuple[int, int]:
    """Just after the last non-blank character (so the caret lands on a real source line)."""
    lines = text.rstrip().split("\n")
    return len(lines), len(lines[-1]) + 1


def _describe_token(tok: Token) -> str:
    if tok.type == "$END":
        return "end of input"
    if tok.type == "NAME":
        return f"name '{tok}'"
    return f"'{tok}'"


def translate(exc: UnexpectedInput, text: str, path: str) -> OiError:
    line, col = getattr(exc, "line", None), getattr(exc, "column", None)
    if isinstance(exc, UnexpectedCharacters):
        char = exc.char
        shown = f"'{char}'" if char.isprintable() else f"U+{ord(char):04X}"  # a NUL or control byte, named
        msg = f"unexpected character {shown}"
        rest = text[exc.pos_in_stream:exc.pos_in_stream + 2] if exc.pos_in_stream is not None else ""
        if rest == "/*":  # the comment's `*/` never came: the lexer saw a lone '/'
            return OiError("unterminated block comment (no closing */)", ir.Span(path, line, col), source=text)
        if char == '"' and not _STRING.match(text, exc.pos_in_stream):  # its closing quote never came
            return OiError("unterminated string (no closing \")", ir.Span(path, line, col), source=text)
        if exc.allowed:
            msg += "; " + _expected(exc.allowed)
        return OiError(msg, ir.Span(path, line, col), source=text)
    tok = getattr(exc, "token", None)
    expected = set(exc.expected) if getattr(exc, "expected", None) else set()
    if tok is None or tok.type == "$END" or isinstance(exc, UnexpectedEOF) or line is None or line < 1:
        line, col = _end_pos(text)
        if tok is None:
            tok = Token("$END", "")
    prev = None
    ip = getattr(exc, "interactive_parser", None)
    if ip is not None:
        stack = ip.parser_state.value_stack
        if stack and isinstance(stack[-1], Token):
            prev = stack[-1].type
    if "SEMICOLON" in expected and ip is not None and tok.type != "$END":
        # a missing ';': point just after the token that needed it, not at the next line's start
        end = _end_of(ip.parser_state.value_stack[-1]) if ip.parser_state.value_stack else None
        if end is not None and end[0] < line:  # on the same line the caret is already right there
            return OiError(f"expected ';' before {_describe_token(tok)}", ir.Span(path, end[0], end[1]),
                           source=text)
    msg = _in_op_arguments(ip, tok) if ip is not None else None
    if msg is not None:
        pass
    elif expected == {"DTYPE"} and tok.type == "NAME":
        msg = f"unsupported dtype {tok}{suggest(str(tok), dtypes.DTYPES)}"
    elif prev == "AT" and tok.type == "NAME":
        msg = f"unsupported attribute @{tok}{suggest(str(tok), _ATTRIBUTES).replace('mean ', 'mean @')}"
    elif "OP" in expected and "ASSIGN" in expected and tok.type == "NAME":
        msg = f"unsupported node {tok}{suggest(str(tok), _NODES)}"
    elif "READ" in expected and "WRITE" in expected and tok.type == "NAME":
        msg = f"unsupported cache operation cache.{tok}{suggest(str(tok), _CACHE_OPS).replace('mean ', 'mean cache.')}"
    elif expected and expected <= {"MEMKIND", "BLOCK", "$END"} and tok.type != "$END":
        msg = f"expected memory section or block, got {_describe_token(tok)}"
        if tok.type == "NAME":
            msg += suggest(str(tok), _SECTIONS)
    elif expected == {"INT", "NAME"} and prev in ("IN", "DOTDOT"):
        msg = f"expected identifier or integer for loop range, got {_describe_token(tok)}"
    elif expected == {"INT", "NAME"} and prev == "STAR":
        msg = f"expected identifier or integer for dimension expression, got {_describe_token(tok)}"
    if msg is None:
        msg = f"unexpected {_describe_token(tok)}"
        if expected:
            msg += "; " + _expected(expected)
    return OiError(msg, ir.Span(path, line, col), source=text)


def _in_op_arguments(ip, tok) -> str | None:
    """The message for a tensor where a setting's value goes (`bias=bq[l]`); None elsewhere."""
    stack = ip.parser_state.value_stack
    starts = [i for i, item in enumerate(stack) if isinstance(item, Token) and item.type == "OP"]
    if not starts or len(stack) < starts[-1] + 3 or not isinstance(stack[starts[-1] + 1], Token):
        return None
    op = str(stack[starts[-1] + 1])
    if tok.type == "LSQB" and len(stack) >= 3 and [getattr(t, "type", None) for t in stack[-3:]] == ["NAME", "EQUAL",
                                                                                                     "NAME"]:
        return messages.setting_not_an_input(op, str(stack[-3]))
    return None


def _end_of(item):
    """(line, column) just after a parsed token or subtree, or None."""
    if isinstance(item, Token) and item.end_line is not None:
        return item.end_line, item.end_column
    meta = getattr(item, "meta", None)
    if meta is not None and not getattr(meta, "empty", True):
        return meta.end_line, meta.end_column
    return None

