"""Python API: `oi2jax.compile(source_or_path, model=None, sizes=None, device=None) -> Program`."""
from __future__ import annotations

import os
from pathlib import Path

from .diagnostics import OiError

MODES = ("compiled", "interpret")
YIELD_MODES = ("driver", "fused")


def load_graph(source_or_path):
    """A path to a `.oi` file, or the program text itself."""
    from .grammar.parse import parse, parse_file
    if isinstance(source_or_path, os.PathLike):
        return parse_file(os.fspath(source_or_path))
    text = str(source_or_path)
    if "\n" not in text and "{" not in text and (text.endswith(".oi") or Path(text).exists()):
        return parse_file(text)
    return parse(text)


def load_model(model):
    from .model import Model, open_model
    if model is None or isinstance(model, Model):
        return model
    return open_model(os.fspath(model))


def compile(source_or_path, model=None, sizes=None, device=None, mode: str = "compiled",
            yield_mode: str = "fused", trace=None):
    """Parse, check, bind the model and lower: returns a `Program` (or the interpreter's)."""
    if mode not in MODES:
        raise OiError(f"unknown mode {mode!r} (expected one of {', '.join(MODES)})")
    if yield_mode not in YIELD_MODES:
        raise OiError(f"unknown yield_mode {yield_mode!r} (expected one of {', '.join(YIELD_MODES)})")
    from .check import check_or_raise
    from .model.bind import bind
    graph = load_graph(source_or_path)
    model_obj = load_model(model)
    check_or_raise(graph, model=model_obj, sizes=sizes)
    bound = bind(graph, model_obj, sizes)
    if mode == "interpret":
        from .interpret import InterpretedProgram
        return InterpretedProgram(bound, trace=trace)
    from .lowering import Program
    return Program(bound, device=device, yield_mode=yield_mode)


def __getattr__(name):
    if name == "Program":
        from .lowering import Program
        return Program
    raise AttributeError(name)
