"""oi2jax: compile OpenInfer DSL graphs (`.oi`) with `.oinf` models into JAX programs.

    import oi2jax
    prog = oi2jax.compile("examples/mlp_regression.oi", model="examples/mlp_regression.oinf")
    outputs = prog.run({"x": x}, steps=1)
"""

__all__ = ["compile", "parse", "check", "generate", "Generator", "Program", "Session", "StepState", "OiError",
           "Diagnostic", "model", "api", "ir", "runtime", "ops"]
__version__ = "0.1.0"

# public submodules, imported on first access (`oi2jax.model.save(...)`): `oi2jax check` must not
# pay for importing JAX, and only `api`, `runtime` and `lowering` import it
_SUBMODULES = ("model", "api", "ir", "runtime", "lowering", "grammar", "graph_json", "export", "interpret", "ops",
               "check", "dtypes", "diagnostics", "cli", "generation")


def __getattr__(name):  # deferred (PEP 562): `import oi2jax` and `oi2jax.model` stay JAX-free; `python -m
    # oi2jax` installs its interrupt handler before anything is imported (oi2jax/_signals.py)
    if name in ("OiError", "Diagnostic"):
        from . import diagnostics
        return getattr(diagnostics, name)
    if name == "Session":
        from .runtime.session import Session
        return Session
    if name == "StepState":
        from .lowering.state import StepState
        return StepState
    if name in ("compile", "Program"):
        from . import api
        return getattr(api, name)
    if name in ("generate", "Generator"):
        from . import generation
        return getattr(generation, name)
    if name == "parse":
        from .grammar.parse import parse
        return parse
    if name == "check":
        from .check import check
        return check
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'oi2jax' has no attribute {name!r}")
