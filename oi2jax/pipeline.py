"""THE front end, one function each stage of which every entry point shares (api.compile, export,
the CLI): load the graph (text, `.oi` path, graph JSON) and the model -> check -> bind.

Data flows one way: text -> IR -> checked graph -> bound graph; nothing downstream re-checks what
`check` decided (deadlocks included)."""
from __future__ import annotations


def checked(source_or_path, model=None, sizes=None):
    """(graph, model object): the graph loaded and checked (against the model when given);
    OiError with every error otherwise."""
    from .api import load_graph, load_model
    from .check import check_or_raise
    graph = load_graph(source_or_path)
    model_obj = load_model(model)
    check_or_raise(graph, model=model_obj, sizes=sizes)
    return graph, model_obj


def bound(source_or_path, model=None, sizes=None):
    """load -> check -> bind: the `BoundGraph` every backend (compiled, interpreted, exported) starts from."""
    from .model.bind import bind
    graph, model_obj = checked(source_or_path, model, sizes)
    return bind(graph, model_obj, sizes)
