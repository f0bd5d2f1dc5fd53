"""Issue 15 item 4: every `ir` node type is handled by every table that dispatches on node types
(lowering rules, checker, interpreter, trace kinds) and survives every stage (fmt, describe, cfg,
graph JSON both ways, phases, compiled fused and driver, interpreted)."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax
from oi2jax import ir

from conftest import run_both

NODE_TYPES = {cls for cls in vars(ir).values() if isinstance(cls, type) and issubclass(cls, ir.Node) and cls is not ir.Node}

EVERY_NODE = """\
dynamic {
    x: f32[2];
}

volatile {
    y: f32[2];
    z: f32[2];
    c: bool;
}

persistent {
    n: i32 @init(0);
    P: f32[2];
    T(i): f32[2] @table @fixed(i=4);
}

block entry {
    assign t: f32[2];
    op relu(x) >> t;
    transfer t >> y;
    cache.write y >> T[n];
    cache.read T[n] >> z;
    cache.increment n;
    cache.decrement n;
    cache.increment 2 n;
    cache.write z >> P;
    barrier;
    dep after(y) before(z);
    op is_finite(z) >> c;
    branch c more less;
    loop l (i in 0..2) {
        op add(y, x) >> y;
    }
    yield x;
    await x;
    cache.reset P;
    return;
}

block more {
    op add(z, x) >> z;
}

block less {
    op sub(z, x) >> z;
}

block side {
    await x;
    op mul(x, x) >> x;
    yield x;
}
"""


def test_every_node_type_is_in_every_dispatch_table():
    from oi2jax.check import _NODE_RULES
    from oi2jax.graph_json import _FROM_JSON
    from oi2jax.interpret import _RULES as INTERPRET
    from oi2jax.lowering.rules import load
    LOWERING = load()
    from oi2jax.trace import KINDS
    assert NODE_TYPES == {ir.Assign, ir.Op, ir.CacheRead, ir.CacheWrite, ir.CacheIncrement, ir.CacheDecrement,
                          ir.CacheReset, ir.Branch, ir.Barrier, ir.Dep, ir.Loop, ir.Yield, ir.Await, ir.Transfer,
                          ir.Return}
    assert set(ir.NODE_TYPES) == NODE_TYPES and len(ir.NODE_TYPES) == len(NODE_TYPES)  # the one list
    assert set(LOWERING) | {ir.Return} == NODE_TYPES  # `return` ends the walk itself (lower_nodes)
    assert set(INTERPRET) | {ir.Op} == NODE_TYPES  # ops are dispatched before the table (timed)
    assert set(KINDS) == NODE_TYPES
    assert set(_NODE_RULES) == NODE_TYPES  # the checker (assign, barrier, dep: a rule that checks nothing)
    assert set(_FROM_JSON) == {t.__name__ for t in NODE_TYPES}  # graph JSON back to the IR


def _visitors() -> set[type]:
    """Every `ir.NodeVisitor` subclass of the package (its modules imported first)."""
    import importlib
    import pkgutil
    import oi2jax as package
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not info.name.endswith(("__main__", "_signals")):
            importlib.import_module(info.name)
    found, todo = set(), [ir.NodeVisitor]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("oi2jax.") and sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def test_every_visitor_handles_every_node_type():
    """Every pass that dispatches on node type is an `ir.NodeVisitor` (a method per type; the
    base's raises) and names every node type: adding a node type cannot half-work."""
    visitors = _visitors()
    names = {f"{v.__module__}.{v.__name__}" for v in visitors}
    assert {"oi2jax.phases._Writes", "oi2jax.phases._Reads", "oi2jax.phases._Defines",
            "oi2jax.grammar.fmt._Text", "oi2jax.graph_json._ToJson",
            "oi2jax.cfg._Style", "oi2jax.cfg._Dot", "oi2jax.lowering.machine._Cut"} <= names, names
    missing = {f"{v.__module__}.{v.__name__}": v.unhandled() for v in visitors if v.unhandled()}
    assert missing == {}


def test_an_unknown_node_type_is_refused_not_skipped():
    """phases.node_reads / node_writes (and every visitor) raise for a node type they do not
    know, instead of answering "nothing"."""
    from dataclasses import dataclass
    from oi2jax.grammar.fmt import describe, format_node
    from oi2jax.phases import node_defines, node_reads, node_writes

    @dataclass(frozen=True, kw_only=True)
    class Teleport(ir.Node):
        target: str

    node = Teleport(index=0, span=ir.NO_SPAN, target="x")
    for fn in (node_reads, node_writes, node_defines, describe, format_node):
        with pytest.raises(NotImplementedError, match="Teleport not handled by"):
            fn(node)

    class Partial(ir.NodeVisitor):
        def visit_Op(self, node):
            return "op"

    assert "Yield" in Partial.unhandled() and "Op" not in Partial.unhandled()
    with pytest.raises(NotImplementedError, match="Yield not handled by Partial"):
        Partial().visit(ir.Yield(index=0, span=ir.NO_SPAN, vars=("x",)))


def test_the_checked_graph_carries_the_yield_phases_and_the_backends_read_it(monkeypatch):
    """Issue 33: the yield/await plan (pairs, consumers, phases, deadlocks), the written names and
    read-before-written are computed once, by the checker; compiling (fused and driver) and
    interpreting do not analyse the graph again."""
    from oi2jax import phases, pipeline
    src = ("dynamic { x: f32[2]; y: f32[2]; }\nvolatile { r: f32[2]; s: f32[2]; }\n"
           "block entry {\n    op neg(y) >> s;\n    yield x;\n    await x;\n    return;\n}\n"
           "block c { await x; op add(x, y) >> r; yield x; }\n")
    bound = pipeline.bound(src)
    checked = bound.checked
    plan = checked.yield_phases
    assert [(w.yield_node.vars, w.await_node.vars, w.consumers) for w in plan.windows] == [(("x",), ("x",), ("c",))]
    assert [(p.merges, p.launches, len(p.nodes)) for p in plan.phases] == [(None, 0, 1), (None, None, 0),
                                                                              (0, None, 1)]
    assert plan.consumers_of(("x",)) == ("c",) and plan.has_yield and plan.diagnostics == ()
    assert checked.writes["c"] == {"r"} and checked.writes["entry"] == {"s"}
    assert checked.read_before_written == {"x", "y"}
    calls = []

    def counted(name, real):
        def fn(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return fn

    from oi2jax import check
    from oi2jax.checks import yield_await
    for name in ("_consumers", "_pair", "_deadlocks", "_phases", "block_writes", "read_before_written"):
        monkeypatch.setattr(phases, name, counted(name, getattr(phases, name)))
        for module in (check, yield_await):
            if hasattr(module, name):  # imported by name into the checker
                monkeypatch.setattr(module, name, getattr(phases, name))
    inputs = {"x": np.ones(2, np.float32), "y": np.full(2, 2.0, np.float32)}
    for kw in ({"mode": "interpret"}, {"yield_mode": "driver"}, {"yield_mode": "fused"}):
        calls.clear()
        out = oi2jax.compile(src, **kw).run(inputs, steps=2)
        np.testing.assert_array_equal(out["r"], [3.0, 3.0])
        # the checker's analyses, once each (the written names of every block in one pass, issue 34
        # item 4: linear in the blocks), nothing after it
        assert sorted(calls) == ["_consumers", "_deadlocks", "_pair", "_phases", "block_writes",
                                 "read_before_written"], (kw, calls)


def test_a_program_with_every_node_type_goes_through_every_stage(tmp_path):
    from oi2jax.cfg import to_dot
    from oi2jax.grammar.fmt import describe, format_graph
    from oi2jax.graph_json import from_json, to_json
    from oi2jax.phases import analyze, node_reads, node_writes
    g = oi2jax.parse(EVERY_NODE)
    assert {type(n) for b in g.blocks for n in b.walk()} == NODE_TYPES
    assert format_graph(g) == EVERY_NODE  # fmt: canonical already
    for node in (n for b in g.blocks for n in b.walk()):
        assert describe(node)
        node_reads(node), node_writes(node)
    dot = to_dot(g)
    for name in ("entry", "more", "less", "side"):
        assert name in dot
    back = from_json(to_json(g))
    assert [type(n) for b in back.blocks for n in b.walk()] == [type(n) for b in g.blocks for n in b.walk()]
    assert format_graph(back) == format_graph(g)
    analyze(g)
    from oi2jax.check import check
    assert [d for d in check(g) if d.severity == "error"] == []
    x = np.array([1.0, -2.0], np.float32)
    out = run_both(EVERY_NODE, {"x": x}, steps=2)  # interpreted, driver, fused: bit for bit
    assert int(out["n"]) == 4 and out["T"].shape == (4, 2)


def test_one_front_end_for_compile_export_and_cli(tmp_path, capsys, monkeypatch):
    """Issue 15: api.compile, export and `compile --emit graph-json` all go through pipeline.bound /
    pipeline.checked (load -> check -> bind), and a deadlock is refused by the checker for each."""
    from oi2jax import pipeline
    from oi2jax.diagnostics import OiError
    from oi2jax.export import build_export
    from conftest import run_cli
    calls = []
    real_checked = pipeline.checked

    def spy(*args, **kwargs):
        calls.append(args[0])
        return real_checked(*args, **kwargs)

    monkeypatch.setattr(pipeline, "checked", spy)
    g = tmp_path / "g.oi"
    g.write_text("dynamic { x: f32[2]; y: f32[2]; }\nvolatile { r: f32[2]; }\n"
                 "block entry {\n    yield x;\n    await x;\n    yield y;\n    await y;\n}\n"
                 "block c { await x; await y; op add(x, y) >> r; yield x, y; }\n")
    for run in (lambda: oi2jax.compile(str(g)), lambda: build_export(str(g))):
        with pytest.raises(OiError, match="deadlock: block c awaits y"):
            run()
    code, _, err = run_cli(capsys, "compile", g, "--emit", "graph-json")
    assert code == 1 and "deadlock: block c awaits y" in err
    assert len(calls) == 3


@pytest.mark.parametrize("mode, yield_mode", [("interpret", "driver"), ("compiled", "fused")])
def test_constants_are_not_reassociated(mode, yield_mode):
    """XLA folds `(x - c) + c` to `x` and `(x * c1) * c2` to `x * (c1 * c2)` when c is a constant;
    OpenInfer rounds after every op: values must equal NumPy's op-by-op results bit for bit."""
    from conftest import REPO
    text = (REPO / "tests" / "regressions" / "constant_reassociation.oi").read_text()
    x = np.array([[-0.13210486, 1e-9, 3.3], [-7.77, 0.4, -1e-3]], np.float32)
    out = oi2jax.compile(text, mode=mode, yield_mode=yield_mode, zero_missing_inputs=True).run({"x": x})
    half, tenth = np.float32(0.5), np.float32(0.1)
    np.testing.assert_array_equal(out["a"], (x - half) + half)
    np.testing.assert_array_equal(out["b"], (x + tenth) + half)
    r = np.where(x >= 0, x, x * tenth)
    np.testing.assert_array_equal(out["x"], np.where(r >= 0, r, r * tenth))
    assert not np.array_equal(out["a"], x)  # the case that differs when folded


def test_prefix_member_outside_the_family_is_an_error_every_way(tmp_path):
    """Issue 15 drift found by unifying the messages: the interpreter read a member the model
    lacks as zeros while compiled runs refused it (docs/semantics.md item 1: an error). Now every
    way names the missing tensor; a traced index at run time (in step 1), a static range before."""
    from oi2jax.diagnostics import OiError
    from oi2jax.model import save
    model = tmp_path / "m.oinf"
    save(model, tensors={"w.0": np.ones(2, np.float32), "w.1": np.full(2, 2.0, np.float32)})
    src = ("constant { W(l): f32[2] @pattern(\"w.{l}\"); }\npersistent { k: i32 @init(3); }\n"
           "volatile { y: f32[2]; }\nblock entry { loop ls (l in 0..k) { op add(y, W[l]) >> y; } return; }\n")
    with pytest.raises(OiError) as info:
        run_both(src, {}, model=model)
    assert "4:47: error: prefix table W: model tensor w.2 not found (in step 1)" in info.value.render()
    ok = run_both(src.replace("@init(3)", "@init(2)"), {}, model=model)
    np.testing.assert_array_equal(ok["y"], [3.0, 3.0])
    static = src.replace("0..k", "0..3")
    for mode in ("interpret", "compiled"):
        with pytest.raises(OiError, match="prefix table W: model tensor w.2 not found"):
            oi2jax.compile(static, model=model, mode=mode).run({})


def test_op_signatures_are_keyed_by_the_nodes_stable_id():
    """`CheckedGraph.op_sigs` is keyed by `ir.Node.index` (the graph-wide id the builder and the
    graph-JSON loader assign), so an IR-to-IR rewrite that keeps the node's id keeps its signature;
    graph JSON that gives two nodes one id is refused."""
    from dataclasses import replace
    from oi2jax.check import check_graph
    from oi2jax.diagnostics import OiError
    from oi2jax.grammar import parse
    from oi2jax.graph_json import to_json
    from oi2jax.pipeline import load_graph_json
    checked = check_graph(parse("dynamic { x: f32[2]; }\nvolatile { y: f32[2]; z: f32[2]; }\n"
                                "block entry { op add(x, x) >> y; op mul(y, x) >> z; return; }"))
    first, second = [n for n in checked.graph.entry.nodes if isinstance(n, ir.Op)]
    assert set(checked.op_sigs) == {first.index, second.index} and first.index != second.index
    moved = replace(second, span=ir.Span("<elsewhere>", 9, 9))
    assert checked.op_sig(moved) is checked.op_sig(second)
    assert checked.op_sig(first).op.name == "add" and checked.op_sig(second).op.name == "mul"
    data = to_json(checked.graph)
    data["blocks"]["entry"]["nodes"][1]["index"] = data["blocks"]["entry"]["nodes"][0]["index"]
    with pytest.raises(OiError, match="node index 0 appears twice"):
        load_graph_json(data)
