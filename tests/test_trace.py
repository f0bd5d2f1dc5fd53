"""Interpreter traces list executed nodes in OpenInfer's order and line format (SPEC §8.2)."""
from __future__ import annotations

import re

import numpy as np

from oi2jax.grammar.fmt import describe
from oi2jax.trace import Trace, node_uuid, split_ns

from test_interpret import make

GUARD = """
dynamic { x: f32[2]; cond: bool; }
volatile { y: f32[2]; }
block entry {
    op is_finite(x) >> cond;
    branch cond ok bad;
    loop L (i in 0..2) {
        op add(y, x) >> y;
    }
    branch tail;
    return;
}
block ok { op add(x, x) >> y; return; }
block bad { op fill(y, value=0.0) >> y; return; }
block tail { barrier; }
"""

LINE = re.compile(r"^(\d+) \[(\w+)\] -- (.*) -- \((\d+)ms (\d+)us (\d+)ns\)$")


def _prefixes(trace: Trace) -> list[str]:
    return [line.rsplit(" -- ", 1)[0] for line in trace.lines()]


def test_branching_trace_lists_nodes_in_openinfer_order():
    tr = Trace()
    make(GUARD, trace=tr).run({"x": np.array([1.0, np.inf], np.float32)})
    # node numbering: entry op=0 branch=1 body add=2 loop=3 branch=4 return=5, ok 6 7, bad 8 9, tail 10
    assert _prefixes(tr) == [
        "0 [entry] -- op is_finite(x) >> cond",
        "1 [entry] -- branch cond ok bad",
        "8 [bad] -- op fill(y) >> y",
        "9 [bad] -- return",
        "3 [entry] -- loop L (i in 0..2)",
        "2 [entry] -- op add(y,x) >> y",
        "2 [entry] -- op add(y,x) >> y",
        "4 [entry] -- branch tail",
        "10 [tail] -- barrier",
        "5 [entry] -- return",
    ]
    for line in tr.lines():
        m = LINE.match(line)
        assert m, line
        if " op " not in f" {m.group(3)}":
            assert m.group(4, 5, 6) == ("0", "0", "0")


def test_trace_taken_branch_changes_with_the_condition():
    tr = Trace()
    make(GUARD, trace=tr).run({"x": np.array([1.0, 2.0], np.float32)})
    assert _prefixes(tr)[2:4] == ["6 [ok] -- op add(x,x) >> y", "7 [ok] -- return"]


def test_trace_json_events():
    tr = Trace()
    make(GUARD, trace=tr).run({"x": np.array([1.0, 2.0], np.float32)})
    events = tr.to_json()
    assert len(events) == len(tr.lines())
    first = events[0]
    assert set(first) == {"block_name", "node_index", "node_uuid", "kind", "params", "output", "micros"}
    assert first["kind"] == "OpExecute" and first["params"] == ["x"] and first["output"] == ["cond"]
    assert first["node_uuid"] == node_uuid(0)
    assert [e["kind"] for e in events[1:4]] == ["Branch", "OpExecute", "Return"]
    assert all(len(e["micros"]) == 3 for e in events)


def test_nested_loop_lines_once_per_outer_iteration_and_steps_accumulate():
    text = """
    volatile { a: i32 @init(0); one: i32 @init(1); }
    block entry {
        loop outer (i in 0..2) {
            loop inner (j in 0..2) { op add(a, one) >> a; }
        }
    }
    """
    tr = Trace()
    make(text, trace=tr).run({}, steps=2)
    per_step = ["2 [entry] -- loop outer (i in 0..2)",
                "1 [entry] -- loop inner (j in 0..2)", "0 [entry] -- op add(a,one) >> a",
                "0 [entry] -- op add(a,one) >> a",
                "1 [entry] -- loop inner (j in 0..2)", "0 [entry] -- op add(a,one) >> a",
                "0 [entry] -- op add(a,one) >> a"]
    assert _prefixes(tr) == per_step * 2


def test_describe_forms():
    from oi2jax.grammar.parse import parse
    g = parse("""
    persistent { n: i32 @init(0); T(a, b): f32[2] @table; }
    volatile { v: f32[2]; w: f32[3, 2]; }
    constant { W(l): f32[2] @pattern("w.{l}"); }
    block entry {
        cache.read T[1, 0..2] >> w;
        cache.read T[n, ..-1] >> w;
        cache.read T[, 2] >> v;
        cache.write v >> T[n, 1];
        cache.increment n;
        cache.decrement 3 n;
        cache.reset T[];
        loop L (l in 0..2) { op add(v, W[l]) >> v; }
        transfer v >> v;
        dep after(v) before(cache.write);
        yield v, w;
        await v, w;
        return;
    }
    """)
    texts = [describe(n) for n in g.entry.walk()]
    assert texts == [
        "cache.read T[1,0..2] >> w",
        "cache.read T[n,..-1] >> w",
        "cache.read T[,2] >> v",
        "cache.write v >> T[n,1]",
        "cache.increment n",
        "cache.decrement 3 n",
        "cache.reset T[]",
        "loop L (l in 0..2)",
        "op add(v,W[l]) >> v",
        "transfer v >> v",
        "dep after(v) before(cache.write)",
        "yield v, w",
        "await v, w",
        "return",
    ]


def test_split_ns():
    assert split_ns(384_733) == (0, 384, 733)
    assert split_ns(12_345_678) == (12, 345, 678)


def test_env_switch_echoes_lines(monkeypatch, capsys):
    monkeypatch.setenv("OI2JAX_TRACE", "full")
    make("volatile { a: i32; } block entry { barrier; return; }").run({})
    err = capsys.readouterr().err
    assert "0 [entry] -- barrier -- (0ms 0us 0ns)" in err
    assert "1 [entry] -- return -- (0ms 0us 0ns)" in err
