"""Lark tree -> IR: the transformer that builds `ir.*` nodes (with spans) and enforces the prose
restrictions of SPEC §1.4 that the grammar cannot (keywords as names, literal ranges, escapes)."""
from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import NamedTuple

import numpy as np
from lark import Token, Transformer, v_args

from .. import dtypes, ir
from ..naming import RUST_KEYWORDS
from ..diagnostics import OiError, suggest
from .fmt import plain_float

# Rust integer suffixes and the range of each type (SPEC-2026-03 §1.3; f32/f64 after decimal
# digits keep the token an integer, D1 (b)); the range matters for `@init` only (D1 (d))
INT_SUFFIX_RANGES = {
    **{f"i{b}": (-(1 << (b - 1)), (1 << (b - 1)) - 1) for b in (8, 16, 32, 64, 128)},
    **{f"u{b}": (0, (1 << b) - 1) for b in (8, 16, 32, 64, 128)},
    "isize": (-(1 << 63), (1 << 63) - 1), "usize": (0, (1 << 64) - 1), "f32": None, "f64": None, "": None,
}
# the suffixes that name an OpenInfer dtype: a literal op input's dtype (docs/semantics.md)
SUFFIX_DTYPES = tuple(s for s in INT_SUFFIX_RANGES if dtypes.is_dtype(s))
_FLOAT_RE = re.compile(r"([0-9][0-9_]*(?:\.(?:[0-9][0-9_]*)?)?(?:[eE][+-]?_*[0-9][0-9_]*)?)")



def _is(x, *types) -> bool:
    return isinstance(x, Token) and x.type in types


def shown(text: str, limit: int = 40) -> str:
    """A literal as a message quotes it: whole when short, else its ends and its length (a literal
    of thousands of digits is not echoed whole)."""
    return text if len(text) <= limit else f"{text[:20]}...{text[-8:]} ({len(text)} characters)"


class _NameList(NamedTuple):
    """A list value of size names only (`[H, D]`), with its tokens: `setting` says `acc=[I32]`'s
    error at the name, and keeps the literal."""

    literal: ir.Literal
    items: tuple


@v_args(meta=True)
class Builder(Transformer):
    def __init__(self, path: str):
        super().__init__(visit_tokens=False)
        self.path = path
        self.counter = 0

    def __default__(self, data, children, meta):
        """A grammar rule without a method here: a bug of this module, never a lark tree in the IR."""
        raise TypeError(f"grammar rule {data!r} has no Builder method (grammar/build.py)")

    # helpers
    def span(self, meta) -> ir.Span:
        return ir.Span(self.path, getattr(meta, "line", 0), getattr(meta, "column", 0))

    def tspan(self, tok: Token) -> ir.Span:
        return ir.Span(self.path, tok.line, tok.column)

    def err(self, message: str, where) -> OiError:
        span = self.tspan(where) if isinstance(where, Token) else where if isinstance(where, ir.Span) else self.span(where)
        return OiError(message, span)

    def name(self, tok: Token) -> str:
        text = str(tok)
        if text in RUST_KEYWORDS:
            raise self.err(f"'{text}' is a reserved word and cannot be used as a name", tok)
        return text

    def idx(self, tok: Token) -> ir.IndexValue:
        return self.int_of(tok) if tok.type == "INT" else self.name(tok)

    def plain(self, tok: Token, what: str, upstream: str) -> ir.IndexValue:
        """A dim, loop bound or prefix index: a name or plain decimal digits only (D1 (e)); OpenInfer
        keeps any other integer text as it is and fails on it."""
        if tok.type != "INT":
            return self.name(tok)
        if not str(tok).isdigit():
            raise self.err(f"{what} {tok} must be plain decimal digits ({upstream})", tok)
        return self.int_of(tok)

    def next_index(self) -> int:
        i = self.counter
        self.counter += 1
        return i

    # ---- graph
    def start(self, meta, children):
        vars_, blocks = [], []
        for item in children:
            if isinstance(item, ir.Block):
                blocks.append(item)
            else:
                vars_.extend(item)
        return vars_, blocks

    def memory_section(self, meta, children):
        kind = ir.MemKind(str(children[0]))
        return [replace(d, kind=kind) for d in children[1:]]

    # ---- declarations
    def var_decl(self, meta, children):
        name_tok, params, dtype_tok, dims, *attrs = children
        fields: dict = {}
        spans: list = []
        for attr_name, value, span in attrs:
            if attr_name in fields:
                raise self.err(f"duplicate @{attr_name} attribute", span)
            fields[attr_name] = value
            spans.append((attr_name, span))
        return ir.VarDecl(
            name=self.name(name_tok), kind=ir.MemKind.DYNAMIC, dtype=str(dtype_tok),
            dims=tuple(dims) if dims is not None else (), span=self.tspan(name_tok),
            init=fields.get("init"), ref=fields.get("ref"), pattern=fields.get("pattern"),
            index_params=tuple(params) if params is not None else (), table="table" in fields,
            auto_dim=fields.get("auto_dim", ()), fixed=fields.get("fixed", ()), attr_spans=tuple(spans))

    def index_params(self, meta, children):
        names = [self.name(t) for t in children if t is not None]
        if not names:
            raise self.err("index parameters must list at least one name", meta)
        dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if dup is not None:
            raise self.err(f"index parameter {dup} is listed twice", meta)
        return names

    def dims(self, meta, children):
        return [d for d in children if d is not None]

    def dim(self, meta, children):
        return ir.Dim(tuple(self.plain(t, "dimension", f'OpenInfer keeps the text "{t}" as a size name and fails: '
                                                      f'unknown size: {t}') for t in children if t is not None))

    def init_attr(self, meta, children):
        return ("init", children[0], self.span(meta))

    def init_value(self, meta, children):
        minus, tok = children
        return self.literal(minus, tok, init=True)

    def ref_attr(self, meta, children):
        tok = children[0]
        value = _unescape(tok, self) if tok.type == "STRING" else str(tok)
        return ("ref", value, self.span(meta))

    def pattern_attr(self, meta, children):
        return ("pattern", _unescape(children[0], self), self.span(meta))

    def table_attr(self, meta, children):
        return ("table", True, self.span(meta))

    def auto_dim_attr(self, meta, children):
        names = tuple(self.name(t) for t in children if t is not None)
        if not names:
            raise self.err("@auto_dim requires at least one name", meta)
        dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if dup is not None:
            raise self.err(f"@auto_dim lists {dup} twice", meta)
        return ("auto_dim", names, self.span(meta))

    def fixed_attr(self, meta, children):
        items = tuple(c for c in children if c is not None)
        if not items:
            raise self.err("@fixed requires at least one entry", meta)
        names = [k for k, _ in items]
        dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if dup is not None:  # `@fixed(i=2, i=5)`: neither value may silently win
            raise self.err(f"@fixed gives {dup} twice", meta)
        return ("fixed", items, self.span(meta))

    def fixed_item(self, meta, children):
        """`i=4` or `i=T`: a size given by a size variable (the model's or --size), resolved by bind."""
        value = children[1]
        return (self.name(children[0]), self.name(value) if value.type == "NAME" else self.int_of(value))

    # ---- literals
    def int_of(self, tok, negative: bool = False) -> int:
        """An integer literal's value (SPEC-2026-03 §1.3: `_`, 0x/0o/0b, a Rust type suffix, which
        never changes the value, D1 (b)); beyond 64 bits it is a located error, never a silent wrap.
        A literal not written in plain decimal keeps its text (ir.IntLit) for `fmt`."""
        text = str(tok)
        value, _suffix = self.int_parts(tok)
        v = -value if negative else value
        if not -(1 << 63) <= v <= (1 << 64) - 1:
            raise self.err(f"integer literal {'-' if negative else ''}{shown(text)} is out of the 64-bit range", tok)
        written = ("-" if negative else "") + text
        return v if written == str(v) else ir.IntLit(v, written)

    def int_parts(self, tok) -> tuple[int, str]:
        """(value, suffix) of an INT token; a located error for a bad digit or suffix."""
        text = str(tok)
        base, body = {"0x": 16, "0o": 8, "0b": 2}.get(text[:2], 10), text
        if base != 10:
            body = text[2:]
        allowed = "0123456789abcdefABCDEF_" if base == 16 else "0123456789_"
        i = 0
        while i < len(body) and body[i] in allowed:
            i += 1
        digits, suffix = body[:i].replace("_", ""), body[i:]
        if not digits:
            raise self.err(f"integer literal {text} has no digits", tok)
        bad = next((c for c in digits if int(c, 16) >= base), None)
        if bad is not None:
            raise self.err(f"invalid digit {bad} in base-{base} literal {text}", tok)
        if suffix and (suffix not in INT_SUFFIX_RANGES or (suffix in ("f32", "f64") and base != 10)):
            raise self.err(f"invalid literal suffix `{shown(suffix)}` in {shown(text)} (integers take i8..i128, isize, "
                           f"u8..u128, usize, or f32/f64 after decimal digits)", tok)
        significant = digits.lstrip("0") or "0"
        if len(significant) > 64:  # beyond 64 bits in any base; never int() thousands of digits
            return 1 << 65, suffix
        return int(significant, base), suffix

    def float_parts(self, tok) -> tuple[float, str]:
        text = str(tok)
        m = _FLOAT_RE.match(text)
        number, suffix = m.group(1), text[m.end(1):]
        if suffix not in ("", "f32", "f64"):
            raise self.err(f"invalid literal suffix `{shown(suffix)}` in {shown(text)} (floats take f32 or f64)", tok)
        return float(number.replace("_", "")), suffix

    def literal(self, minus, tok, init: bool = False) -> ir.Literal:
        if minus is not None and tok.type not in ("FLOAT", "INT"):
            what = {"TRUE": "bool", "FALSE": "bool", "STRING": "string", "NAME": "identifier"}.get(tok.type, "value")
            raise self.err(f"unexpected '-' before {what}", minus)
        sign = -1 if minus is not None else 1
        if tok.type == "FLOAT":
            value, suffix = self.float_parts(tok)
            if math.isinf(value):  # 1e999: would print back as `inf`
                raise self.err(f"float literal {'-' if minus is not None else ''}{shown(str(tok))} overflows to "
                               f"infinity", tok)
            value = sign * value
            if init and suffix == "f32":  # `@init(0.1f32)` is upstream's `0.1f32 as T`: rounded to f32 first
                with np.errstate(over="ignore"):
                    rounded = float(np.float32(value))
                if math.isinf(rounded):
                    raise self.err(f"float literal {tok} does not fit its suffix type f32", tok)
                value = rounded
            text = ("-" if minus is not None else "") + str(tok)
            plain = text == plain_float(value)  # else fmt keeps it as written: `1E3`, `2.`, `0.000001`, `1_0.5`
            return ir.Literal("float", value if plain else ir.FloatLit(value, text))
        if tok.type == "INT":
            value = self.int_of(tok, negative=minus is not None)
            if init:  # D1 (d): the value must also fit its suffix type; no `-` before an unsigned suffix
                _, suffix = self.int_parts(tok)
                lo_hi = INT_SUFFIX_RANGES.get(suffix)
                if suffix.startswith("u") and minus is not None:
                    raise self.err(f"cannot apply '-' to the unsigned literal {tok}", minus)
                if lo_hi is not None and not lo_hi[0] <= int(value) <= lo_hi[1]:
                    raise self.err(f"literal {'-' if minus is not None else ''}{tok} is out of range for its suffix "
                                   f"type {suffix} ({lo_hi[0]}..{lo_hi[1]})", tok)
            return ir.Literal("int", value)
        if tok.type in ("TRUE", "FALSE"):
            return ir.Literal("bool", tok.type == "TRUE")
        if tok.type == "STRING":
            return ir.Literal("str", _unescape(tok, self))
        if str(tok) == "inf":
            return ir.Literal("float", math.inf)
        return ir.Literal("var", self.name(tok))

    def scalar_value(self, meta, children):
        return self.literal(children[0], children[1])

    def list_value(self, meta, children):
        """`[i32, i64]` (a dtype list: `acc=[A, O]`) or an int list of integers and size names
        (`[H, -1, 4]`). A list that starts with a dtype is a dtype list, as before."""
        items = [c for c in children if c is not None]
        if items and items[0][1].type == "DTYPE":
            names = []
            for minus, tok in items:
                if minus is not None or tok.type not in ("DTYPE", "NAME"):  # SPEC-2026-03 §1.4: a non-name
                    raise self.err("expected dtype identifier (e.g. i32, f32)", minus if minus is not None else tok)
                if str(tok) not in dtypes.ACC_DTYPES:
                    raise self.err(f"expected dtype (e.g. i32, f32), got {'-' if minus else ''}{tok}", tok)
                names.append(str(tok))
            return ir.Literal("dtype_list", tuple(names))
        values = []
        for minus, tok in items:
            if tok.type == "INT":
                values.append(self.int_of(tok, negative=minus is not None))
            elif tok.type == "NAME":
                values.append(("-" if minus is not None else "") + self.name(tok))
            else:
                raise self.err(f"expected an integer or a size name, got dtype {tok}", tok)
        out = ir.Literal("int_list", tuple(values))
        if items and all(tok.type == "NAME" for _, tok in items):  # `acc=[I32]`: located in `setting`
            return _NameList(out, tuple(items))
        return out

    def list_item(self, meta, children):
        minus, tok = children
        return (minus, tok)

    def setting(self, meta, children):
        name_tok, value = children
        name = str(name_tok)
        names = None
        if isinstance(value, _NameList):
            value, names = value.literal, value.items
        if name == "acc" and names:  # a list of names that are not dtypes: `acc=[I32]`
            bad = next(tok for _, tok in names if str(tok) not in dtypes.ACC_DTYPES)
            raise self.err(f"expected dtype (e.g. i32, f32), got {bad}", bad)
        if value.kind == "dtype_list" and name != "acc":  # SPEC-2026-03 §1.4 texts
            raise self.err("to must be a dtype identifier" if name == "to" else
                           f"DTypeList only supported for acc attribute (setting {name})", meta)
        if name in ("acc", "to") and value.kind != "dtype_list":
            if value.kind == "var" and dtypes.is_dtype(value.value):
                value = ir.Literal("dtype", value.value)  # acc=i32: the 1fc5207 dialect (D12)
            elif value.kind == "var":
                raise self.err(f"unsupported dtype {value.value} for setting {name}"
                               f"{suggest(str(value.value), dtypes.ACC_DTYPES if name == 'acc' else dtypes.DTYPES)}",
                               meta)
            elif name == "acc":
                raise self.err("acc must be a dtype list (e.g. acc=[i32, i64]) or, in the 1fc5207 dialect, a "
                               "dtype name (acc=i32)", meta)
            else:  # `to="f32"`, `to=3`: SPEC-2026-03 §1.4's text, as for `to=[f32]`
                raise self.err("to must be a dtype identifier", meta)
        return ir.Attr(name, value, self.tspan(name_tok))

    # ---- references
    def var_ref(self, meta, children):
        name_tok = children[0]
        if len(children) == 1:
            return ir.VarRef(self.name(name_tok), self.tspan(name_tok))
        indices = tuple(self.plain(t, "prefix-table index", f'OpenInfer looks up the text "{name_tok}[{t}]" '
                                                            f'literally') for t in children[2:] if t is not None)
        if not indices:
            raise self.err("prefix access must include at least one index", children[1])
        return ir.VarRef(self.name(name_tok), self.tspan(name_tok), indices)

    def literal_input(self, meta, children):
        """A scalar literal as an op input (oi2jax extension, docs/semantics.md). A suffix names
        its dtype (`2.0f32`, `3i8`; `1f32` is the float 1.0, as in Rust); without one the checker
        types it from the op's other inputs."""
        minus, tok = children
        lit = self.literal(minus, tok)
        span = self.tspan(minus if minus is not None else tok)
        suffix = self.int_parts(tok)[1] if tok.type == "INT" else self.float_parts(tok)[1] if tok.type == "FLOAT" \
            else ""
        if not suffix:
            return ir.LiteralInput(lit, span)
        if suffix not in SUFFIX_DTYPES:
            raise self.err(f"literal {shown(str(tok))}: {suffix} is not an OpenInfer dtype (a literal input's suffix "
                           f"is its dtype: {', '.join(SUFFIX_DTYPES)})", tok)
        if lit.kind == "int" and dtypes.get(suffix).is_float:
            lit = ir.Literal("float", ir.FloatLit(float(lit.value), ("-" if minus is not None else "") + str(tok)))
        return ir.LiteralInput(lit, span, suffix)

    def cval(self, meta, children):
        minus, tok = children
        if minus is not None:
            if tok.type == "NAME":
                raise self.err("unexpected '-' before identifier", minus)
            return self.int_of(tok, negative=True)
        return self.idx(tok)

    def single(self, meta, children):
        return ir.Single(children[0])

    def slice(self, meta, children):
        pos = next(i for i, c in enumerate(children) if _is(c, "DOTDOT"))
        start = children[pos - 1] if pos > 0 else None
        end = children[pos + 1] if pos + 1 < len(children) else None
        return ir.Slice(start, end)

    def cache_access(self, meta, children):
        name_tok = children[0]
        if len(children) == 1:
            return ir.CacheAccess(self.name(name_tok), self.tspan(name_tok))
        items = children[2:]
        entries: list = []
        i = 0
        while i < len(items):  # SPEC §1.4 comma rules
            if _is(items[i], "COMMA"):
                entries.append(ir.Slice())
                i += 1
                continue
            entries.append(items[i])
            i += 1
            if i < len(items) and _is(items[i], "COMMA"):
                i += 1
                if i == len(items):
                    entries.append(ir.Slice())
        return ir.CacheAccess(self.name(name_tok), self.tspan(name_tok), tuple(entries), True)

    # ---- blocks and nodes
    def block(self, meta, children):
        name_tok, *nodes = children
        return ir.Block(self.name(name_tok), tuple(nodes), self.span(meta))

    def assign(self, meta, children):
        name_tok, dtype_tok, dims = children
        return ir.Assign(index=self.next_index(), span=self.span(meta), name=self.name(name_tok),
                         dtype=str(dtype_tok), dims=tuple(dims) if dims is not None else ())

    def op(self, meta, children):
        op_tok, *args, out_tok = children
        inputs, attrs, seen = [], [], {}
        for arg in args:
            if arg is None:
                continue
            if isinstance(arg, (ir.VarRef, ir.LiteralInput)):
                if attrs:
                    raise self.err("positional args must come before settings", arg.span)
                inputs.append(arg)
            else:
                if arg.name in seen:
                    raise self.err(f"duplicate setting: {arg.name}", arg.span)
                seen[arg.name] = arg
                attrs.append(arg)
        return ir.Op(index=self.next_index(), span=self.span(meta), op=self.name(op_tok), inputs=tuple(inputs),
                     attrs=tuple(attrs), output=self.name(out_tok), output_span=self.tspan(out_tok))

    def cache_read(self, meta, children):
        return ir.CacheRead(index=self.next_index(), span=self.span(meta), src=children[0], dst=children[1])

    def cache_write(self, meta, children):
        return ir.CacheWrite(index=self.next_index(), span=self.span(meta), src=children[0], dst=children[1])

    def _incdec(self, cls, meta, children):
        if len(children) == 2:
            return cls(index=self.next_index(), span=self.span(meta), target=self.name(children[1]),
                       amount=self.int_of(children[0]), explicit_amount=True)
        return cls(index=self.next_index(), span=self.span(meta), target=self.name(children[0]))

    def cache_inc(self, meta, children):
        return self._incdec(ir.CacheIncrement, meta, children)

    def cache_dec(self, meta, children):
        return self._incdec(ir.CacheDecrement, meta, children)

    def cache_reset(self, meta, children):
        return ir.CacheReset(index=self.next_index(), span=self.span(meta), target=children[0])

    def branch(self, meta, children):
        names = [self.name(t) for t in children]
        if len(names) == 1:
            return ir.Branch(index=self.next_index(), span=self.span(meta), cond=None, then_block=names[0])
        if len(names) != 3:
            raise self.err("branch expects condition and two target blocks", meta)
        return ir.Branch(index=self.next_index(), span=self.span(meta), cond=names[0], then_block=names[1],
                         else_block=names[2])

    def barrier(self, meta, children):
        return ir.Barrier(index=self.next_index(), span=self.span(meta))

    def dep_target(self, meta, children):
        return ".".join(str(t) for t in children)

    def dep(self, meta, children):
        return ir.Dep(index=self.next_index(), span=self.span(meta), after=children[0], before=children[1])

    def loop(self, meta, children):
        name_tok, var_tok, start, _dotdot, end, *body = children
        # body nodes were numbered (transformed) before this callback: loop index comes after its body
        return ir.Loop(index=self.next_index(), span=self.span(meta), name=self.name(name_tok),
                       var=self.name(var_tok), start=self._bound(start), end=self._bound(end), body=tuple(body))

    def _bound(self, tok):
        return self.plain(tok, "loop bound", f"OpenInfer keeps the text and fails: loop bound {tok} is invalid: "
                                             f"unknown variable {tok}")

    def yield_(self, meta, children):
        return ir.Yield(index=self.next_index(), span=self.span(meta), vars=tuple(self.name(t) for t in children))

    def await_(self, meta, children):
        return ir.Await(index=self.next_index(), span=self.span(meta), vars=tuple(self.name(t) for t in children))

    def transfer(self, meta, children):
        return ir.Transfer(index=self.next_index(), span=self.span(meta), src=children[0], dst=children[1])

    def return_(self, meta, children):
        return ir.Return(index=self.next_index(), span=self.span(meta),
                         vars=tuple(self.name(t) for t in children if t is not None))


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}


def _unescape(tok: Token, builder: Builder) -> str:
    body = str(tok)[1:-1]
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1] if i + 1 < len(body) else ""
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt == "u" and i + 2 < len(body) and body[i + 2] == "{":
            close = body.find("}", i + 3)
            if close < 0:  # never reset the scan position: an unterminated escape is an error
                raise builder.err("unterminated unicode escape '\\u{' in string (expected '}')", tok)
            digits = body[i + 3:close]
            if not re.fullmatch(r"[0-9a-fA-F]{1,6}", digits) or int(digits, 16) > 0x10FFFF \
                    or 0xD800 <= int(digits, 16) <= 0xDFFF:
                raise builder.err(f"invalid unicode escape '\\u{{{digits}}}' in string", tok)
            out.append(chr(int(digits, 16)))
            i = close + 1
        elif nxt == "x":
            digits = body[i + 2:i + 4]
            if not re.fullmatch(r"[0-9a-fA-F]{2}", digits):
                raise builder.err(f"invalid escape '\\x{digits}' in string (expected two hex digits)", tok)
            out.append(chr(int(digits, 16)))
            i += 4
        else:
            raise builder.err(f"unknown character escape '\\{nxt}'", tok)
    return "".join(out)
