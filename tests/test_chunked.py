"""Batch-chunk looping (oi2jax/runtime/chunked.py): inputs with more rows than the batch size
variable run in chunks inside one compiled program and equal per-chunk manual runs, persistent
state included."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError

from conftest import EXAMPLES, MODELS, REPO

BATCH = 4
SIZES = {"B": BATCH, "D": 3}

ACC = """
dynamic { x: f32[B, D]; scale: f32[D]; }
volatile { y: f32[B, D]; s: f32[D]; a: f32[D]; }
persistent { acc: f32[D] @init(0.0); }
block entry {
    cache.read acc >> a;
    op mul(x, scale) >> y;
    op add(y, a) >> y;
    op sum_axis(x, axes=[0]) >> s;
    op add(a, s) >> a;
    cache.write a >> acc;
    return;
}
"""

NESTED = """
dynamic { x: f32[B, D]; }
volatile { y: f32[B, D]; a: f32[D]; s: f32[D]; }
persistent { acc: f32[D] @init(1.0); }
block entry {
    cache.read acc >> a;
    op add(x, a) >> y;
    loop l1 (i in 0..2) {
        loop l2 (j in 0..2) {
            loop l3 (k in 0..3) {
                loop l4 (m in 0..2) {
                    op add(y, x) >> y;
                    op sub(y, a) >> y;
                }
            }
            op sum_axis(y, axes=[0]) >> s;
            op add(a, s) >> a;
        }
    }
    cache.write a >> acc;
    return;
}
"""


def manual(src, x: np.ndarray, steps: int = 1, extra=None, **kw) -> dict:
    """Per-chunk runs by hand: step the B program on each full chunk, a program compiled with
    B = rows on the last partial chunk, carrying the persistent state."""
    prog = oi2jax.compile(src, sizes=SIZES, **kw)
    state = prog.init_state()
    outs_all, last = [], None
    for start in range(0, len(x), BATCH):
        chunk = x[start:start + BATCH]
        p = prog if len(chunk) == BATCH else oi2jax.compile(src, sizes={**SIZES, "B": len(chunk)}, **kw)
        for _ in range(steps):
            state, outs = p.step(state, x=chunk, **(extra or {}))
        outs_all.append({k: np.asarray(v) for k, v in outs.items()})
        last = p
    from oi2jax.runtime.chunked import batched_names
    batched = set(batched_names(prog.graph, "B"))
    result = {k: np.concatenate([o[k] for o in outs_all]) if k in batched else outs_all[-1][k]
              for k in outs_all[-1]}
    for name in prog.dynamic_names:  # inputs the graph never writes are reported as given
        if name not in result:
            given = {"x": x, **(extra or {})}
            result[name] = np.asarray(given[name]) if name in given else np.asarray(prog.bound.initial(name))
    exported = last.export_state(state)
    for name in last.lowering.caches:
        result[name] = exported[name]
    return result


def same(a: dict, b: dict):
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k


ROWS = (1, BATCH - 1, BATCH, 3 * BATCH + 1)


@pytest.mark.parametrize("n", ROWS)
def test_chunked_equals_per_chunk_manual_runs_with_state(n):
    x = np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)
    scale = np.array([1.0, -2.0, 0.5], np.float32)
    prog = oi2jax.compile(ACC, sizes=SIZES)
    got = prog.run_batched({"x": x, "scale": scale}, batch_var="B")
    want = manual(ACC, x, extra={"scale": scale})
    same(got, want)
    assert got["y"].shape == (n, 3)
    np.testing.assert_allclose(got["acc"], x.sum(0), rtol=1e-5)  # state carried over every chunk


@pytest.mark.parametrize("n", (BATCH - 1, 3 * BATCH + 1))
def test_chunked_several_steps_per_chunk(n):
    x = np.random.default_rng(7).standard_normal((n, 3)).astype(np.float32)
    scale = np.ones(3, np.float32)
    got = oi2jax.compile(ACC, sizes=SIZES).run_batched({"x": x, "scale": scale}, steps=3)
    same(got, manual(ACC, x, steps=3, extra={"scale": scale}))


@pytest.mark.parametrize("n", (1, 3 * BATCH + 1))
def test_nested_depth4_loops_inside_a_chunked_run(n):
    x = np.random.default_rng(3).standard_normal((n, 3)).astype(np.float32)
    got = oi2jax.compile(NESTED, sizes=SIZES).run_batched({"x": x})
    same(got, manual(NESTED, x))
    assert np.isfinite(got["y"]).all() and got["y"].shape == (n, 3)
    # for both n the last row is a chunk of its own: the B = 1 program run on it alone, from the
    # state the full chunks before it left (none for n = 1), gives its y row and the final acc. (The
    # rows of one chunk are not independent -- sum_axis over B mixes them -- so only a one-row chunk
    # can be run alone.)
    prog = oi2jax.compile(NESTED, sizes=SIZES)
    state = prog.init_state()
    for start in range(0, n - 1, BATCH):
        state, _ = prog.step(state, x=x[start:start + BATCH])
    prog1 = oi2jax.compile(NESTED, sizes={**SIZES, "B": 1})
    state, row = prog1.step(state, x=x[-1:])
    same({"y": got["y"][-1:], "acc": got["acc"]}, {"y": np.asarray(row["y"]), "acc": prog1.export_state(state)["acc"]})


YIELDED = """
dynamic { x: f32[B, D]; }
volatile { y: f32[B, D]; h: f32[B, D]; }
block entry {
    yield x;
    op add(x, x) >> h;
    await x;
    op add(x, h) >> y;
    return;
}
block sq { await x; op mul(x, x) >> x; yield x; }
"""


def test_chunked_yield_graph_equals_driver_per_chunk_runs():
    x = np.random.default_rng(5).standard_normal((2 * BATCH + 2, 3)).astype(np.float32)
    got = oi2jax.compile(YIELDED, sizes=SIZES).run_batched({"x": x})
    same(got, manual(YIELDED, x))
    np.testing.assert_array_equal(got["y"], x * x + 2 * x)


def test_state_depending_on_batch_with_partial_chunk_is_refused():
    src = """
    dynamic { x: f32[B, D]; }
    volatile { v: f32[B, D]; }
    persistent { P: f32[B, D] @init(0.0); }
    block entry { cache.read P >> v; op add(v, x) >> v; cache.write v >> P; return; }
    """
    prog = oi2jax.compile(src, sizes=SIZES)
    with pytest.raises(OiError, match="persistent variable P depends on B"):
        prog.run_batched({"x": np.ones((BATCH + 1, 3), np.float32)})
    got = prog.run_batched({"x": np.ones((2 * BATCH, 3), np.float32)})  # whole chunks are fine
    np.testing.assert_array_equal(got["P"], 2 * np.ones((BATCH, 3), np.float32))


def test_unknown_batch_var_and_mismatched_rows():
    prog = oi2jax.compile(ACC, sizes=SIZES)
    with pytest.raises(OiError, match="not a size variable"):
        prog.run_batched({"x": np.ones((5, 3), np.float32)}, batch_var="Q")
    with pytest.raises(OiError, match="no input is batched"):
        prog.run_batched({"scale": np.ones(3, np.float32)})


def test_cli_run_chunks_a_long_input(tmp_path):
    x = np.random.default_rng(11).standard_normal((3 * BATCH + 1, 3)).astype(np.float32)
    graph = tmp_path / "acc.oi"
    graph.write_text(ACC)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "scale.npy", np.ones(3, np.float32))
    out = tmp_path / "out.npz"
    proc = subprocess.run([sys.executable, "-m", "oi2jax", "run", str(graph), "--size", "B=4", "--size", "D=3",
                           "--input", f"x={tmp_path / 'x.npy'}", "--input", f"scale={tmp_path / 'scale.npy'}",
                           "--out", str(out), "--cache-dir", "none"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # said, not silent (helper probe): the run's rows are not the graph's B
    assert "note: x holds 13 rows where B=4: running them in chunks of 4 rows" in proc.stderr, proc.stderr
    got = dict(np.load(out))
    same(got, manual(ACC, x, extra={"scale": np.ones(3, np.float32)}))


FULL = """dynamic { x: f32[B, 2]; z: f32[2] @init(1.0); }
volatile { y: f32[B, 2]; }
persistent { t: i32 @init(0); K(i): f32[2] @table @fixed(i=2); }
block entry { op add(x, x) >> y; cache.write z >> K[t]; cache.increment t; return; }
"""


@pytest.mark.parametrize("rows, failing", [(12, "rows 8..11"), (10, "rows 8..9")])
def test_a_chunked_run_that_fails_names_its_chunk_and_keeps_the_chunks_before(tmp_path, rows, failing):
    """The third chunk writes past K's 2 entries: the error named no step and nothing of the two
    chunks before it reached the caller or --out (helper probe)."""
    x = np.arange(2 * rows, dtype=np.float32).reshape(rows, 2)
    prog = oi2jax.compile(FULL, sizes={"B": 4})
    with pytest.raises(OiError) as err:
        prog.run_batched({"x": x}, batch_var="B")
    assert err.value.render().splitlines()[0].endswith(
        f"error: dimension 0 of K: index 2 is past its fixed size 2 (in step 1 of chunk 3 of 3: {failing})")
    np.testing.assert_array_equal(err.value.partial["y"], 2 * x[:8])
    graph, out = tmp_path / "full.oi", tmp_path / "out.npz"
    graph.write_text(FULL)
    np.save(tmp_path / "x.npy", x)
    proc = subprocess.run([sys.executable, "-m", "oi2jax", "run", str(graph), "--size", "B=4", "--input",
                           f"x={tmp_path / 'x.npy'}", "--out", str(out), "--cache-dir", "none"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 1 and f"(in step 1 of chunk 3 of 3: {failing})" in proc.stderr, proc.stderr
    assert "note: wrote " in proc.stderr and "the batched outputs' rows of the chunks before the failing chunk 3" \
        in proc.stderr
    np.testing.assert_array_equal(np.load(out)["y"], 2 * x[:8])


def test_a_feature_size_is_never_taken_for_a_batch(tmp_path):
    """(helper probe) `q: f32[D]` given 32 values where D=16 (D also shapes the cache entry) ran as
    two chunks of 16, exit 0, the cache written twice: it is a wrong shape."""
    kv = REPO / "examples" / "kv_cache_decode.oi"
    np.save(tmp_path / "q.npy", np.arange(32, dtype=np.float32))
    proc = subprocess.run([sys.executable, "-m", "oi2jax", "run", str(kv), "--input", f"q={tmp_path / 'q.npy'}",
                           "--cache-dir", "none"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 1 and "chunks" not in proc.stderr, proc.stderr
    assert "error: input q: expected shape [16], got [32] (--input gives the value of every step; one value per " \
        "step goes in --inputs-per-step FILE.npz)" in proc.stderr, proc.stderr


@pytest.mark.parametrize("rows, failing", [(12, "rows 0..3"), (3, "rows 0..2")])
def test_a_chunked_run_names_the_step_of_the_chunk_that_failed(rows, failing):
    """Probe (sharding) 9: a run of 2 steps per chunk that fails at step 2 of chunk 1 named the
    chunk and rows, not the step (an unchunked run says `(in step N)`). With only a partial chunk
    (3 rows, B=4) the error was read through the full-size program's error sites, not the ones of
    the step lowered with B=3 that recorded it: an IndexError (an internal error)."""
    x = np.arange(2 * rows, dtype=np.float32).reshape(rows, 2)
    prog = oi2jax.compile(FULL.replace("@fixed(i=2)", "@fixed(i=1)"), sizes={"B": 4})
    with pytest.raises(OiError) as err:
        prog.run_batched({"x": x}, batch_var="B", steps=2)
    chunks = -(-rows // 4)
    assert err.value.render().splitlines()[0].endswith(
        f"error: dimension 0 of K: index 1 is past its fixed size 1 (in step 2 of chunk 1 of {chunks}: {failing})")
    assert all(len(v) == 0 for v in err.value.partial.values())  # no chunk before it


def test_run_batched_names_an_unknown_input_and_a_wrong_row_shape():
    """Probe (runtime) 5: a misspelled input said "no input is batched over B"; an input of
    [1, 10, 16] where x is [B=4, 16] was told the shape of the B=1 program it was rebound to."""
    prog = oi2jax.compile(str(EXAMPLES / "mlp_regression.oi"), model=str(MODELS / "mlp_regression.oinf"))
    with pytest.raises(OiError, match=r"^error: unknown input xx \(did you mean x\?\)"):
        prog.run_batched({"xx": np.ones((10, 16), np.float32)})
    with pytest.raises(OiError, match=r"run_batched: input x: expected shape \[N, 16\] \(N rows over B=4, each "
                                      r"\[16\]\), got \[1, 10, 16\]"):
        prog.run_batched({"x": np.ones((1, 10, 16), np.float32)})
