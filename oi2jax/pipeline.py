"""THE front end, one function each stage of which every entry point shares (api.compile, export,
the CLI): load the graph (text, `.oi` path, graph JSON) and the model -> check -> bind.

Data flows one way: text -> IR -> checked graph -> bound graph; nothing downstream re-checks what
`check` decided (deadlocks included).

The model comes from ONE rule (`choose_model`), the same for the Python API, export and every CLI
command: the model given; else, for a graph given as a path, the `.oinf` beside it (`g.oi` ->
`g.oinf`) when that file exists; `model=False` (`--no-model`) asks for no model at all."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .check import check_graph
from .diagnostics import OiError, check_sizes
from .grammar.fmt import format_graph
from .grammar.parse import parse, parse_file
from .graph_json import from_json
from .model import Model, open_model
from .model.bind import bind
from .ops.loading import load as load_ops
from .ops.registry import Registry, builtin_registry
from .tables import explained, narrow_tables

NO_MODEL = False  # `model=NO_MODEL` (the CLI's --no-model): no model, even when one lies beside the graph
GRAPH_SUFFIXES = (".oi", ".json")  # graph files that may have a model beside them


def graph_path(source_or_path) -> str | None:
    """The file a graph argument names (a `.oi` file or a graph-JSON `.json` file), or None when it
    is program text or a graph-JSON dict: THE rule `load_graph` reads a graph argument by."""
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


# ------------------------------------------------------------------ loaders (the graph, the model)


def load_graph_json(data, path: str = "<json>"):
    """A graph in OpenInfer graph-JSON form (SPEC §8.1): a dict, or the path of a `.json` file."""
    if not isinstance(data, dict):
        path = os.fspath(data)
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise OiError(f"graph file not found: {path}") from None
        except (OSError, ValueError) as exc:
            raise OiError(f"{path}: cannot read graph JSON: {exc}") from None
        except RecursionError:
            raise OiError(f"{path}: cannot read graph JSON: nested too deeply for the JSON reader") from None
    try:
        graph = from_json(data, path)
    except (KeyError, ValueError, TypeError, AttributeError, IndexError, OverflowError, RecursionError) as exc:
        raise OiError(f"{path}: not an OpenInfer graph JSON (SPEC §8.1): "
                      f"{type(exc).__name__}: {exc}") from None
    try:
        _validate_json_graph(graph, path)
    except RecursionError:
        raise OiError(f"{path}: not a valid graph: nested too deeply (loops nest at most "
                      f"32 deep)") from None
    except (ValueError, OverflowError, TypeError, AttributeError) as exc:  # a value the DSL cannot write:
        # NaN or an infinity, an integer from 1e400, f16 bits outside 0..65535, a name that is not text
        raise OiError(f"{path}: not a valid graph: {type(exc).__name__}: {exc}") from None
    return graph


def _validate_json_graph(graph, path: str) -> None:
    """Names and dims from JSON pass exactly the grammar's rules: the graph is written as DSL text
    and parsed again (a name like `x/../../OUT` or an empty one, a dim "-5", a Rust keyword are
    errors here, before anything uses them as file or archive member names)."""
    text = format_graph(graph)
    try:
        parse(text, path)
    except OiError as exc:
        first = exc.diagnostics[0]
        line = text.splitlines()[first.span.line - 1].strip() if first.span and first.span.line else ""
        raise OiError(f"{path}: not a valid graph: {first.message} (in `{line}`)") from None


def load_graph(source_or_path):
    """A path to a `.oi` file or a `.json` graph (SPEC §8.1), a graph-JSON dict, or the program text."""
    if isinstance(source_or_path, dict):
        return load_graph_json(source_or_path)
    if not isinstance(source_or_path, (str, os.PathLike)):  # bytes were parsed as "b'...'"
        raise OiError(f"graph: expected program text, a path or a graph-JSON dict, got "
                      f"{type(source_or_path).__name__}")
    path = graph_path(source_or_path)  # the one rule for "a path, not program text" (also the model's)
    if path is None:
        text = str(source_or_path)
        if text.strip() and not any(c.isspace() or c in "{};" for c in text.strip()):  # one word: a path
            near = f" (did you mean {text}.oi?)" if Path(text + ".oi").exists() else ""
            raise OiError(f"graph file not found: {text}{near}; program text holds memory sections and blocks")
        return parse(text)
    return load_graph_json(path) if path.endswith(".json") else parse_file(path)


def load_model(model):
    """An open `Model` from a path (a `Model` as it is); None for None or False (no model)."""
    if model is None or model is False:
        return None
    if isinstance(model, Model):
        return model
    if not isinstance(model, (str, os.PathLike)):
        raise OiError(f"model: expected a path, a Model, None or False, got {model!r}")
    return open_model(os.fspath(model))


# ------------------------------------------------------------------ the model rule


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
    if ops is None:
        return builtin_registry()
    if isinstance(ops, Registry):
        return ops
    return load_ops(ops)


def checked(source_or_path, model=None, sizes=None, ops=None, widen_floats: bool = False, table_dtype=None):
    """(CheckedGraph, model object): the graph loaded and checked (against the model chosen by
    `choose_model`, with the op registry of `ops`); OiError with every error otherwise. `model` may
    also be a `ModelChoice`. `table_dtype`: the float cache tables stored in that dtype
    (tables.narrow_tables; None: as declared)."""
    sizes = check_sizes(sizes)
    choice = model if isinstance(model, ModelChoice) else choose_model(source_or_path, model)
    reg = registry(ops)
    declared = load_graph(source_or_path)
    graph = narrow_tables(declared, table_dtype)
    model_obj = load_model(choice.model)
    try:
        return check_graph(graph, model=model_obj, sizes=sizes, ops=reg, no_model=choice.no_model_reason(),
                           widen_floats=widen_floats), model_obj
    except OiError as exc:
        if graph is declared:
            raise
        raise OiError(explained(exc.diagnostics, declared, table_dtype), source=exc.source) from None


def bound(source_or_path, model=None, sizes=None, ops=None, zero_missing_inputs: bool = False,
          widen_floats: bool = False, table_dtype=None):
    """load -> check -> bind: the `BoundGraph` every backend (compiled, interpreted, exported) starts
    from. `zero_missing_inputs`: constants with no value (no model tensor, no `@init`) read as zeros
    instead of being an error; `widen_floats`: an f32 constant reads a bf16/f16 model tensor as its
    exact f32 values (model/bind.py); `table_dtype`: as `checked`'s."""
    sizes = check_sizes(sizes)
    choice = model if isinstance(model, ModelChoice) else choose_model(source_or_path, model)
    checked_graph, model_obj = checked(source_or_path, choice, sizes, ops, widen_floats, table_dtype)
    return bind(checked_graph, model_obj, sizes, zero_missing_inputs=zero_missing_inputs,
                no_model=choice.no_model_reason(), widen_floats=widen_floats)
