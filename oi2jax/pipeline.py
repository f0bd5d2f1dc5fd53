"""THE front end, one function each stage of which every entry point shares (api.compile, export,
the CLI): load the graph (text, `.oi` path, graph JSON) and the model -> check -> bind.

Data flows one way: text -> IR -> checked graph -> bound graph; nothing downstream re-checks what
`check` decided (deadlocks included)."""
from __future__ import annotations


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
    """(CheckedGraph, model object): the graph loaded and checked (against the model when given,
    with the op registry of `ops`); OiError with every error otherwise."""
    from .api import load_graph, load_model
    from .check import check_graph
    reg = registry(ops)
    graph = load_graph(source_or_path)
    model_obj = load_model(model)
    return check_graph(graph, model=model_obj, sizes=sizes, ops=reg), model_obj


def bound(source_or_path, model=None, sizes=None, ops=None):
    """load -> check -> bind: the `BoundGraph` every backend (compiled, interpreted, exported) starts from."""
    from .model.bind import bind
    checked_graph, model_obj = checked(source_or_path, model, sizes, ops)
    return bind(checked_graph, model_obj, sizes)


def rebound(bound_graph, sizes):
    """The same graph, model and op registry checked and bound at other sizes (a chunked run's tail)."""
    from .check import check_graph
    from .model.bind import bind
    return bind(check_graph(bound_graph.graph, bound_graph.model, sizes, ops=bound_graph.checked.ops),
                bound_graph.model, sizes)
