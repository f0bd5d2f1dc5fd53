"""A model file's chat template rendered as transformers renders it, within bounds (docs/models.md).

`render_chat` renders as transformers' `apply_chat_template(..., tokenize=False)` does: jinja2's
ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, the loopcontrols extension and
transformers' `{% generation %}` tag (its AssistantTracker: the body rendered as it is),
`raise_exception`, `strftime_now` and transformers' `tojson`. A template comes with a model file,
so one rendering may spend no more than `RENDER_LIMITS`: one that runs away is an error, not a
hang or a process out of memory.
"""
from __future__ import annotations

import functools
import json
import re
import sys
from datetime import datetime

from ..diagnostics import OiError

__all__ = ["RENDER_LIMITS", "render_chat"]


def _raise_exception(message):
    raise OiError(f"chat template: {message}")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' tojson: json.dumps, not jinja2's HTML-escaping filter
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


# What one rendering of a chat template may spend (a template comes with a model file: one that
# runs away is an error, not a hang or a process out of memory). jinja2's sandbox bounds each
# `range` to 100,000 items, not ranges nested in loops, recursive macros, growing strings or
# numbers. Real templates stay far below: a loop over the messages, a few calls per message.
RENDER_LIMITS = {"items": 1_000_000, "calls": 100_000, "characters": 1 << 24, "integer bits": 1 << 16}
_WIDTH = re.compile(r"\d{7,}")  # a field width or precision of 10^6 and more in a format string
_WIDEST = 1 << 20  # the largest integer argument of a call or a filter (a width, a count)


def _bounded_environment():
    """jinja2's ImmutableSandboxedEnvironment within RENDER_LIMITS: the items of every `range` and
    of every string or list `*` an integer, and the calls (macros, methods, globals) are counted; every value a call, an attribute or an item
    lookup, `*`, `+`, `%` or `**` gives, every call's arguments and every joined block are sized
    (strings and lists by their length, integers by their bits), the operators before they compute
    where the size is known first; a format string's field widths are read before it is used."""
    from jinja2 import nodes  # optional: only chat needs jinja2
    from jinja2.ext import Extension, loopcontrols  # optional
    from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment, safe_range  # optional

    class Generation(Extension):
        """transformers' AssistantTracker: `{% generation %}...{% endgeneration %}` renders its body
        as it is (transformers also records where it lies, for `return_assistant_tokens_mask`, which
        a prompt does not ask for)."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def short(v) -> str:  # a number as a message can show it
        return str(v) if not isinstance(v, int) or abs(v) < 10 ** 20 else f"(an integer of {v.bit_length()} bits)"

    def runaway(what: str):
        raise OiError(f"chat template: it runs away: {what}")

    def sized(value):
        if isinstance(value, (str, list, tuple)) and len(value) > RENDER_LIMITS["characters"]:
            runaway(f"a {type(value).__name__} of more than {RENDER_LIMITS['characters']:,} items")
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > RENDER_LIMITS["integer bits"]:
            runaway(f"an integer of more than {RENDER_LIMITS['integer bits']:,} bits")
        return value

    def arguments(args, kwargs, widths: bool = True):
        """Each argument sized; an integer past _WIDEST refused where it may be a width or a count
        (`widths`; not `range`'s bounds: its items are counted as made, `Bounded._range`)."""
        for value in (*args, *kwargs.values()):
            sized(value)
            if widths and isinstance(value, int) and not isinstance(value, bool) and value > _WIDEST:
                runaway(f"an argument of {short(value)} (a width or a count past {_WIDEST:,})")

    def no_wide_fields(value):
        if isinstance(value, str) and _WIDTH.search(value):
            runaway(f"a format field of 10^6 characters or more in {value[:40]!r}")

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def __init__(self):
            super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
            self.left = dict(RENDER_LIMITS)
            self.globals["range"] = self._range
            self.globals.pop("lipsum", None)  # text of any length on demand; transformers' templates never use it
            self.filters = {name: self._bounded(f, name) for name, f in self.filters.items()}

        def _bounded(self, f, name: str):
            """A filter whose arguments and result are sized as a call's (`|center(2000000000)`)."""
            @functools.wraps(f)  # keeps jinja2's pass_context / pass_environment marks
            def bounded(*args, **kwargs):
                self.spend("calls", 1)
                if name == "format" and args:  # `"%2000000000d"|format(1)`
                    no_wide_fields(args[0])
                arguments(args[1:], kwargs)
                return sized(f(*args, **kwargs))
            return bounded

        def concat(self, pieces):  # a `{% set %}` block's or a macro's output
            out, size = [], 0
            for piece in pieces:
                size += len(piece)
                if size > RENDER_LIMITS["characters"]:
                    runaway(f"a block of more than {RENDER_LIMITS['characters']:,} characters")
                out.append(piece)
            return "".join(out)

        def spend(self, what: str, n: int) -> None:
            self.left[what] -= n
            if self.left[what] < 0:
                runaway(f"more than {RENDER_LIMITS[what]:,} {what} in one rendering"
                        + (" (of ranges and repeated strings or lists)" if what == "items" else ""))

        def _range(self, *args):
            try:
                n = len(range(*args))  # lazy: its length without making it
            except OverflowError:
                runaway(f"a range of more than {sys.maxsize:,} items")
            except (TypeError, ValueError):
                return safe_range(*args)  # its own error
            if n > MAX_RANGE:  # jinja2's sandbox bound on one range
                runaway(f"a range of {n:,} items (one range holds at most {MAX_RANGE:,})")
            self.spend("items", n)
            return safe_range(*args)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's own signature)
            __self.spend("calls", 1)
            arguments(args, kwargs, widths=getattr(__obj, "__func__", None) is not Bounded._range)
            return sized(super().call(__context, __obj, *args, **kwargs))

        def getattr(self, obj, attribute):
            if attribute in ("format", "format_map") and isinstance(obj, str):  # the sandbox's own wrapper
                no_wide_fields(obj)  # follows: its format string is known here, not at the call
            return sized(super().getattr(obj, attribute))

        def getitem(self, obj, argument):
            return sized(super().getitem(obj, argument))

        def call_binop(self, context, operator, left, right):
            ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (left, right))
            if operator == "**" and ints and abs(left) > 1 and right > 0 and \
                    abs(left).bit_length() * right > RENDER_LIMITS["integer bits"]:
                runaway(f"{short(left)} ** {short(right)}")
            if operator == "*":
                if ints and left.bit_length() + right.bit_length() > RENDER_LIMITS["integer bits"]:
                    runaway(f"a product of more than {RENDER_LIMITS['integer bits']:,} bits")
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                        if len(seq) * n > RENDER_LIMITS["characters"]:
                            runaway(f"a {type(seq).__name__} of {len(seq)} times {short(n)}")
                        self.spend("items", max(0, len(seq) * n))  # what a loop over it would run
            if operator == "+" and all(isinstance(x, (str, list, tuple)) for x in (left, right)) and \
                    len(left) + len(right) > RENDER_LIMITS["characters"]:
                runaway(f"a {type(left).__name__} of more than {RENDER_LIMITS['characters']:,} items")
            if operator == "%":
                no_wide_fields(left)
            return sized(super().call_binop(context, operator, left, right))

    return Bounded()


def render_chat(template: str, messages: list[dict], *, add_generation_prompt: bool = False,
                bos_token: str = "", eos_token: str = "", **kwargs) -> str:
    """The text transformers' `apply_chat_template(..., tokenize=False)` renders (within
    RENDER_LIMITS)."""
    from jinja2 import TemplateError  # optional: only chat needs jinja2

    env = _bounded_environment()
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        pieces, size = [], 0
        for piece in env.from_string(template).generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                                        bos_token=bos_token, eos_token=eos_token, **kwargs):
            size += len(piece)
            if size > RENDER_LIMITS["characters"]:
                env.spend("characters", size)
            pieces.append(piece)
        return "".join(pieces)
    except TemplateError as exc:
        raise OiError(f"chat template: {exc}") from None
    except (ArithmeticError, RecursionError, MemoryError, TypeError, ValueError) as exc:  # the sandbox's range
        raise OiError(f"chat template: {type(exc).__name__}: {exc}") from None  # limit, a bad operand
