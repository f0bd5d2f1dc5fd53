"""THE front end, one function each stage of which every entry point shares (api.compile, export,
the CLI): load the graph (text, `.oi` path, graph JSON) and the model -> check -> bind.

Data flows one way: text -> IR -> checked graph -> bound graph; nothing downstream re-checks what
`check` decided (deadlocks included).

The model comes from ONE rule (`choose_model`), the same for the Python API, export and every CLI
command: the model given; else, for a graph given as a path, the `.oinf` beside it (`g.oi` ->
`g.oinf`) when that file exists; `model=False` (`--no-model`) asks for no model at all."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

NO_MODEL = False  # `model=NO_MODEL` (the CLI's --no-model): no model, even when one lies beside the graph
GRAPH_SUFFIXES = (".oi", ".json")  # graph files that may have a model beside them


def graph_path(source_or_path) -> str | None:
    """The file a graph argument names (a `.oi` file or a graph-JSON `.json` file), or None when it
    is program text or a graph-JSON dict: THE rule `api.load_graph` reads a graph argument by."""
    if isinstance(source_or_path, dict):
        return None
    if isinstance(source_or_path, os.PathLike):
        return os.fspath(source_or_path)
    if not isinstance(source_or_path, str):
        return None
    text = source_or_path
    if "\n" in text:
        return None
    if text.endswith(".json"):
        return text
    if "{" not in text and (text.endswith(".oi") or Path(text).exists()):
        return text
    return None


@dataclass(frozen=True)
class ModelChoice:
    """What `choose_model` decided: `model` to load (a path, an open `Model`, or None), whether it
    was found beside the graph (`beside`), and, when there is none, where the rule looked
    (`looked`: the `.oinf` path beside the graph; None for graph text or `model=False`)."""

    model: object
    beside: bool = False
    looked: str | None = None
    refused: bool = False  # model=False / --no-model

    @property
    def path(self) -> str | None:
        """The model file used (None without a model)."""
        if isinstance(self.model, (str, os.PathLike)):
            return os.fspath(self.model)
        return getattr(self.model, "path", None)  # an open Model, or None

    def no_model_reason(self) -> str:
        """Why there is no model, for messages that need one (`unknown size: B (...)`)."""
        if self.refused:
            return "no model (--no-model / model=False)"
        if self.looked is not None:
            return f"no model given and none found at {self.looked}"
        return "no model given"


def choose_model(source_or_path, model=None) -> ModelChoice:
    """THE default-model rule. `model` (a path or an open `Model`) when given; `False` (`NO_MODEL`,
    the CLI's `--no-model`): no model; None: `<graph>.oinf` beside a graph given as a `.oi` or
    `.json` path when that file exists, else no model (graph text and dicts have no "beside")."""
    if model is NO_MODEL:
        return ModelChoice(None, refused=True)
    if model is not None:
        return ModelChoice(model)
    path = graph_path(source_or_path)
    if path is None or Path(path).suffix not in GRAPH_SUFFIXES:
        return ModelChoice(None)
    candidate = str(Path(path).with_suffix(".oinf"))
    if Path(candidate).is_file():
        return ModelChoice(candidate, beside=True)
    return ModelChoice(None, looked=candidate)


def registry(ops=None):
    """The op registry for `ops` (None: the built-in ops; a Registry as it is; else
    `oi2jax.ops.load(ops)`: set names, .py/.json paths, modules, decorated functions)."""
    from .ops.registry import Registry, builtin_registry
    if ops is None:
        return builtin_registry()
    if isinstance(ops, Registry):
        return ops
    from .ops.loading import load
    return load(ops)


def checked(source_or_path, model=None, sizes=None, ops=None):
    """(CheckedGraph, model object): the graph loaded and checked (against the model chosen by
    `choose_model`, with the op registry of `ops`); OiError with every error otherwise. `model` may
    also be a `ModelChoice`."""
    from .api import load_graph, load_model
    from .check import check_graph
    choice = model if isinstance(model, ModelChoice) else choose_model(source_or_path, model)
    reg = registry(ops)
    graph = load_graph(source_or_path)
    model_obj = load_model(choice.model)
    return check_graph(graph, model=model_obj, sizes=sizes, ops=reg, no_model=choice.no_model_reason()), model_obj


def bound(source_or_path, model=None, sizes=None, ops=None, zero_missing_inputs: bool = False):
    """load -> check -> bind: the `BoundGraph` every backend (compiled, interpreted, exported) starts
    from. `zero_missing_inputs`: constants with no value (no model tensor, no `@init`) read as zeros
    instead of being an error (model/bind.py)."""
    from .model.bind import bind
    choice = model if isinstance(model, ModelChoice) else choose_model(source_or_path, model)
    checked_graph, model_obj = checked(source_or_path, choice, sizes, ops)
    return bind(checked_graph, model_obj, sizes, zero_missing_inputs=zero_missing_inputs,
                no_model=choice.no_model_reason())


def rebound(bound_graph, sizes):
    """The same graph, model and op registry checked and bound at other sizes (a chunked run's tail)."""
    from .check import check_graph
    from .model.bind import bind
    return bind(check_graph(bound_graph.graph, bound_graph.model, sizes, ops=bound_graph.checked.ops),
                bound_graph.model, sizes, zero_missing_inputs=bound_graph.zero_missing_inputs)
