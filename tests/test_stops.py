"""Stops, streaming and nothing lost in a fused run (issue #40 items 4, 5, 6): `Session.run(...,
stop={"next": [...]})` ends the compiled loop at the step whose output is a stop id (that step
kept, nothing after it), the same cut as a host loop over `Session.step`; `on_chunk` hands the
collected rows over call by call; a run past a `@fixed` table's capacity raises with what the
steps before the failing one produced (`err.partial`); `oi2jax run --stop`, `--show`, `--stats`,
and `--out` written with the partial result."""
from __future__ import annotations

import re

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError
from oi2jax.run_rules import stop_hits, stopped

from conftest import run_cli

# next = (5 * token + 3) mod 11: from token 1 the cycle 8, 10, 9, 4, 1, 8, ...; every fed token is
# written to H at t (T rows, @fixed: the step that writes row T fails)
SOURCE = """
dynamic { token: i32[1] @init(1); }
constant { a: i32[1] @init(5); c: i32[1] @init(3); m: i32[1] @init(11); }
volatile { next: i32[1]; h: f32[1] @init(0.5); }
persistent { t: i32 @init(0); H(i): i32[1] @table @fixed(i=T); }
block entry {
    op mul(token, a) >> next;
    op add(next, c) >> next;
    op rem(next, m) >> next;
    cache.write token >> H[t];
    cache.increment t;
    return;
}
"""
T = 6
CYCLE = [8, 10, 9, 4, 1]


@pytest.fixture(scope="module")
def prog():
    return oi2jax.compile(SOURCE, model=False, sizes={"T": T})


def host_loop(prog, steps: int, stop: dict) -> list[int]:
    """The reference cut: one `Session.step` per token, the stop rule read on the host."""
    sess = prog.session()
    token, seen = np.array([1], np.int32), []
    done = {k: np.zeros(1, bool) for k in stop}
    for _ in range(steps):
        token = np.asarray(sess.step(token=token)["next"])
        seen.append(int(token[0]))
        for k, ids in stop.items():
            done[k] = done[k] | stop_hits(token, np.asarray(ids))
        if stopped(done):
            break
    return seen


@pytest.mark.parametrize("calls", ["one call", "a call per step"])
@pytest.mark.parametrize("stop,steps", [({"next": [9, 77]}, 5), ({"next": [4]}, 3), ({"next": [1]}, 5)])
def test_a_stop_id_ends_the_fused_loop_where_a_host_loop_does(prog, calls, stop, steps):
    sess = prog.session()
    if calls == "a call per step":
        sess.call_seconds = 1e-9
    out = sess.run(steps=steps, feedback={"token": "next"}, collect="next", stop=stop)
    want = host_loop(prog, steps, stop)
    assert out["next"].ravel().tolist() == want
    assert sess.steps == len(want) and int(out["t"]) == len(want)  # no step after the stop ran
    assert sess.last_run.stopped == (want[-1] in stop["next"])
    if sess.last_run.stopped:
        assert want[-1] in stop["next"] and not set(want[:-1]) & set(stop["next"])  # the stop id is kept, last


@pytest.mark.parametrize("way", ["fused", "a call per step", "host loop", "interpreted"])
def test_a_stop_id_predicted_inside_a_teacher_forced_prompt_ends_nothing(prog, way):
    """A prompt given per step (token = 1, 8, 3) with feedback: the `next` of its first two steps
    is replaced by the next prompt token, so it is not generated and a stop id there ends nothing
    (it ended the run at step 2, the rest of the prompt never ran, exit 0); the stop counts from
    the prompt's last step, whose `next` is fed back (`runargs.stop_from`). From 1: 8; from 8: 10;
    from 3 the cycle 7 (= 5*3+3 mod 11), 5, 6, 0."""
    prompt = np.array([[1], [8], [3]], np.int32)
    for stop, steps_run in (({"next": [8, 10]}, 6), ({"next": [8, 5]}, 4), ({"next": [7]}, 3)):
        sess = prog.session()
        if way == "a call per step":
            sess.call_seconds = 1e-9
        run = sess.run_stepwise if way == "host loop" else sess.run
        if way == "interpreted":  # the oracle follows the same rules (run_rules.py)
            run = oi2jax.compile(SOURCE, model=False, sizes={"T": T}, mode="interpret").run
        out = run({"token": prompt}, steps=6, feedback={"token": "next"}, stop=stop, collect="next")
        assert int(out["t"]) == steps_run, (stop, way)  # 8 and 10 are the prompt's predictions: ignored
        assert out["next"].ravel().tolist() == [8, 10, 7, 5, 6, 0][:steps_run]
        if way not in ("host loop", "interpreted"):
            assert sess.last_run.stopped == (steps_run < 6)


def test_the_stop_rule_is_per_element():
    hits = stop_hits(np.array([[2], [5]]), np.array([2, 7]))
    assert hits.ravel().tolist() == [True, False]
    assert not stopped({"next": hits}) and stopped({"next": hits | stop_hits(np.array([[3], [7]]), [2, 7])})
    assert stopped({"a": np.array([True]), "b": np.array([False])})  # one output all stopped ends the run


def test_streaming_chunks_are_the_collected_rows(prog):
    sess = prog.session()
    chunks = []
    out = sess.run(steps=5, feedback={"token": "next"}, collect="next", every=2,
                   on_chunk=lambda rows, done: chunks.append((rows["next"].ravel().tolist(), done)))
    assert [len(rows) for rows, _ in chunks][0] == 1 and all(len(rows) <= 2 for rows, _ in chunks)
    assert sum((rows for rows, _ in chunks), []) == out["next"].ravel().tolist() == CYCLE
    assert [done for _, done in chunks] == list(np.cumsum([len(rows) for rows, _ in chunks]))
    assert sess.last_run.steps == 5 and sess.last_run.first_steps == 1


def test_a_failing_runs_stream_gets_every_row_before_the_failing_step(prog):
    """(helper probe) the rows of the call holding the failing step never reached `on_chunk`: a
    streaming consumer lost them though `partial` had them."""
    sess = prog.session()
    chunks = []
    with pytest.raises(OiError, match=r"\(in step 7\)") as info:
        sess.run(steps=10, feedback={"token": "next"}, collect="next", every=4,
                 on_chunk=lambda rows, done: chunks.append((rows["next"].ravel().tolist(), done)))
    streamed = sum((rows for rows, _ in chunks), [])
    assert streamed == info.value.partial["next"].ravel().tolist() == (CYCLE + CYCLE)[:T]
    assert chunks[-1][1] == T


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_past_the_capacity_the_steps_before_the_failing_one_are_kept(prog, mode):
    run = prog.session().run if mode == "compiled" else \
        oi2jax.compile(SOURCE, model=False, sizes={"T": T}, mode="interpret").run
    with pytest.raises(OiError, match=r"index 6 is past its fixed size 6 \(in step 7\)") as info:
        run(steps=10, feedback={"token": "next"}, collect="next")
    err = info.value
    assert err.step == 7 and err.partial["next"].ravel().tolist() == (CYCLE + CYCLE)[:T]
    assert err.partial["H"].ravel().tolist() == [1] + (CYCLE + CYCLE)[:T - 1]  # every token fed before


@pytest.mark.parametrize("stop,message", [({"nxt": [1]}, "stop nxt: not a variable a step leaves a value in "
                                                         r"\(did you mean next\?\)"),
                                          ({"h": [1]}, "stop h: h is f32; stop ids need an integer output"),
                                          ({"next": [2**31]}, "stop next: 2147483648 is not an i32 value"),
                                          ({"next": []}, "stop next: no stop ids given"),
                                          ({"H": [1]}, "stop H: H is a cache table")])
def test_bad_stops_are_named(prog, stop, message):
    with pytest.raises(OiError, match=message):
        prog.session().run(steps=2, stop=stop)


def test_cli_stop_show_stats_and_partial_out(tmp_path, capsys):
    g = tmp_path / "g.oi"
    g.write_text(SOURCE)
    common = ["run", g, "--no-model", "--size", f"T={T}", "--feedback", "token=next", "--collect", "next"]
    code, out, err = run_cli(capsys, *common, "--steps", "5", "--stop", "next=9,77", "--stats", "--out",
                             tmp_path / "o.npz")
    assert code == 0, err
    with np.load(tmp_path / "o.npz") as npz:
        assert npz["next"].ravel().tolist() == [8, 10, 9]
    assert out.startswith("next: int32[3, 1]") and "H: " not in out  # the collected values, not the cache
    assert re.search(r"\nt: int32\[\]\n3\n\(not shown: token, h, H; --show all", out), out
    assert re.fullmatch(r"compile [0-9.]+ s, first step [0-9.]+ s, steady [0-9.]+ steps/s \(3 steps in [0-9.]+ s\)\n",
                        err), err
    code, out, _ = run_cli(capsys, *common, "--steps", "2", "--show", "all")
    assert code == 0 and "H: int32[6, 1]" in out and "not shown" not in out
    code, out, err = run_cli(capsys, *common, "--steps", "9", "--out", tmp_path / "p.npz", "--quiet")
    assert code == 1 and "(in step 7)" in err, err
    assert "note: wrote" in err and "the collected rows of the steps before the failing step 7 (next); every other " \
        "variable as the failing step 7 left it" in err, err
    with np.load(tmp_path / "p.npz") as npz:
        assert npz["next"].ravel().tolist() == (CYCLE + CYCLE)[:T]
    code, _, err = run_cli(capsys, *common, "--stop", "next=x")
    assert code == 2 and "--stop expects OUTPUT=ID[,ID...]" in err
