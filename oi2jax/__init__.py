"""oi2jax: compile OpenInfer DSL graphs (`.oi`) with `.oinf` models into JAX programs.

    import oi2jax
    prog = oi2jax.compile("examples/mlp_regression.oi", model="examples/mlp_regression.oinf")
    outputs = prog.run({"x": x}, steps=1)
"""
from .diagnostics import Diagnostic, OiError

__all__ = ["compile", "parse", "check", "Program", "OiError", "Diagnostic"]
__version__ = "0.1.0"


def __getattr__(name):  # lazy: `oi2jax check` should not pay for importing JAX
    if name in ("compile", "Program"):
        from . import api
        return getattr(api, name)
    if name == "parse":
        from .grammar.parse import parse
        return parse
    if name == "check":
        from .check import check
        return check
    raise AttributeError(name)
