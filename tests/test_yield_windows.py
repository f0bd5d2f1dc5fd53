"""Yield/await windows (SPEC §3.3, §3.5, §3.6), from a helper's probe: what a consumer changes,
what ends a consumer's loop, where a yield and its await may sit, and the window rules through
`branch`. Every program runs three ways (the yield/await driver, the fused step, the
interpreter) and each gives the values written here, worked out from the SPEC."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError

MODES = ({"yield_mode": "driver"}, {"yield_mode": "fused"}, {"mode": "interpret"})


def _runs(src: str, steps: int) -> list[dict]:
    return [{k: np.asarray(v).tolist() for k, v in oi2jax.compile(src, **kw).run({}, steps=steps).items()}
            for kw in MODES]


def _refused(src: str) -> str:
    with pytest.raises(OiError) as info:
        oi2jax.compile(src, mode="interpret")
    return info.value.diagnostics[0].message


# a consumer that only reads a persistent variable does not change it: entry's window write stands
# (rule 5: "keeps the snapshot value if nobody mutated it"; a cache.read mutates its destination only)
READS_PLAIN = """volatile { x: f32 @init(1.0); k: i32; }
persistent { n: i32 @init(0); }
block entry { yield x; cache.increment n; await x; return; }
block reader { await x; cache.read n >> k; yield x; }
"""

# ... nor does a read of an all-@fixed table, even of an entry never written (§4.3: it reads the fill)
READS_FIXED = """volatile { x: f32[2] @init(1.0); r: f32[2]; w: f32[2] @init(7.0); }
persistent { T(i): f32[2] @table @fixed(i=1); }
block entry { yield x; cache.write w >> T[0]; await x; return; }
block cons { await x; cache.read T[0] >> r; yield x; }
"""


def test_a_consumers_read_changes_nothing_it_reads():
    for out in _runs(READS_PLAIN, 3):  # n counts 3 steps; the reader sees it at each yield: 0, 1, 2
        assert (out["n"], out["k"]) == (3, 2), out
    for out in _runs(READS_FIXED, 2):  # step 2's reader sees step 1's write
        assert out["T"] == [[7.0, 7.0]] and out["r"] == [7.0, 7.0], out


# §3.3: "yield inside a loop in a non-entry block likewise pops just the loop frame"
YIELD_ENDS_LOOP = """volatile { one: f32[2] @init(1.0); acc: f32[2]; after: f32[2]; }
block entry { branch c; return; }
block c {
    loop l (i in 0..3) { op add(acc, one) >> acc; yield acc; }
    op add(acc, one) >> after;
}
"""


def test_a_yield_in_a_called_blocks_loop_ends_the_loop_only():
    for out in _runs(YIELD_ENDS_LOOP, 1):  # one iteration (acc 1), then the node after the loop
        assert out["acc"] == [1.0, 1.0] and out["after"] == [2.0, 2.0], out


def test_a_yield_and_its_await_in_one_loop_body_pair_each_iteration():
    src = """volatile { x: f32[2] @init(1.0); y: f32[2]; }
block entry { loop l (i in 0..3) { yield x; await x; op add(y, x) >> y; } return; }
block c { await x; op add(x, x) >> x; yield x; }
"""
    for out in _runs(src, 1):  # x doubles in each iteration: y = 2 + 4 + 8
        assert out["x"] == [8.0, 8.0] and out["y"] == [14.0, 14.0], out


CONSUMER = "block c { await x; op add(x, x) >> h; yield x; }\n"


def test_a_yield_and_its_await_in_different_loop_bodies_are_refused():
    """An await in a loop would merge in the first iteration only (none for zero trips); a yield in
    a loop awaited after it would yield again before the await: both depend on the trip count."""
    head = "volatile { x: f32[2] @init(1.0); h: f32[2]; }\npersistent { n: i32 @init(0); }\n"
    message = _refused(head + "block entry { yield x; loop l (i in 0..n) { await x; op add(h, h) >> h; } return; }\n"
                       + CONSUMER)
    assert message.startswith("await x is inside loop l and its yield is not: only the loop's first iteration "
                              "would merge the consumers (SPEC §3.5), and none where it runs no iteration")
    message = _refused(head + "block entry { loop l (i in 0..1) { yield x; } await x; return; }\n" + CONSUMER)
    assert message.startswith("yield x is inside loop l and its await is not: the loop's next iteration would "
                              "yield again before the await (SPEC §3.6 rule 7)")
    message = _refused(head + "block entry { loop l (i in 0..2) { yield x; loop m (j in 0..1) { await x; } } "
                       "return; }\n" + CONSUMER)
    assert message.startswith("yield x is inside loop l and its await is not")


def test_the_window_rules_follow_branch():
    """Rules 3 and 4 count what a called block writes (they walked the window's own nodes only:
    the snapshot's z overwrote entry's write, compiled)."""
    message = _refused("""volatile { x: f32[2] @init(1.0); z: f32[2] @init(5.0); c: bool @init(false); }
block entry { yield x; op add(x, x) >> z; await x; return; }
block cons { await x; branch c w1 w2; yield x; }
block w1 { op mul(x, x) >> z; return; }
block w2 { return; }
""")
    assert message == ("multiple blocks mutated z: block cons and entry write it in the same yield..await window "
                       "(through branch: a block it calls writes z)")
    message = _refused("""volatile { x: f32[2] @init(1.0); h: f32[2]; }
block entry { yield x; branch w; await x; return; }
block w { op add(x, x) >> x; return; }
block cons { await x; op mul(x, x) >> h; yield x; }
""")
    assert message == "entry writes yielded variable x between yield and await (through branch: a block it calls writes x)"


def test_a_growable_tables_read_in_a_consumer_counts_as_a_change():
    """A read grows a table whose index is not @fixed (§4.2): with entry writing it in the window,
    the merge would take one of the two; refused, as two writers are."""
    message = _refused("""volatile { x: f32[2] @init(1.0); r: f32[2]; }
persistent { K(t): f32[2] @table; p: i32 @init(0); }
block entry { yield x; cache.write x >> K[p]; await x; return; }
block cons { await x; cache.read K[3] >> r; yield x; }
""")
    assert message == ("multiple blocks mutated K: block cons and entry write it in the same yield..await window "
                       "(a cache.read of K grows it: §4.2)")


def test_a_yield_await_graph_stops_as_a_fused_one_does():
    """--stop was refused for a graph run by the yield/await driver (its default); the driver reads
    the stop on the host after each step, as `run_stepwise` does for traced runs."""
    src = """dynamic { token: i32; }
volatile { next: i32; h: i32; one: i32 @init(1); }
block entry { op add(token, one) >> next; yield next; await next; return; }
block c { await next; op add(next, next) >> h; yield next; }
"""
    for kw in MODES[:2]:
        out = oi2jax.compile(src, **kw).run({"token": np.int32(0)}, steps=10, feedback={"token": "next"},
                                            stop={"next": [4]}, collect=("next", "h"))
        assert out["next"].tolist() == [1, 2, 3, 4] and out["h"].tolist() == [2, 4, 6, 8], (kw, out)


def test_yield_and_await_name_their_variable_with_the_caret_under_it():
    src = ("constant { k: f32; }\nvolatile { x: f32; }\nblock entry {\n    loop l (i in 0..2) { yield i; await i; }\n"
           "    yield x;\n    await x, k;\n    return;\n}\nblock c { await x; yield x; }\n")
    with pytest.raises(OiError) as info:
        oi2jax.compile(src, mode="interpret", model=None)
    got = [(d.span.line, d.span.col, d.message.split(":")[0]) for d in info.value.errors]
    assert got == [(4, 32, "yield i"), (4, 41, "await i"), (6, 14, "await may not name constant k")], got
    assert "loop index i is not a variable" in info.value.errors[0].message
