"""Generation on the device (issue 31 item 3): `run(..., feedback={"token": "next"})` and
`oi2jax run --feedback token=next` feed a step's output back as the next step's input inside the
one fused loop; bit for bit what a host loop of `Session.step` calls feeding back by hand gives."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError

from conftest import assert_same, run_cli

# A toy decoder: `next` depends on the token and on a hidden vector `h` (fed back as `y`), every
# token is appended to a growable table H (4 rows, then doubled: growth inside a generation).
SOURCE = """
dynamic { token: i64[1] @init(0); h: f32[1, D] @init(0.5); scale: f32 @init(1.0); }
constant { w: f32[D, D]; b: f32[D]; m: i64[1]; inc: i64[1]; }
volatile { y: f32[1, D]; a: f32[1, D]; next: i64[1]; wide: f32[1, V]; }
persistent { t: i32 @init(0); acc: f32[1, D] @init(0.0); H(i): i64[1] @table; }
block entry {
    op matmul(h, w) >> y;
    op add(y, b) >> y;
    op mul(y, scale) >> y;
    op clamp(y, min=-3.0, max=3.0) >> y;
    cache.read acc >> a;
    op add(a, y) >> a;
    cache.write a >> acc;
    op argmax_axis(y, axis=1) >> next;
    op add(next, token) >> next;
    op add(next, inc) >> next;
    op rem(next, m) >> next;
    cache.write token >> H[t];
    cache.increment t;
    return;
}
"""
D, V = 8, 3
STEPS = 21


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    from oi2jax.model import save
    tmp = tmp_path_factory.mktemp("feedback")
    rng = np.random.default_rng(5)
    save(tmp / "g.oinf", sizevars={"D": D, "V": V},
         tensors={"w": (rng.standard_normal((D, D)) * 0.7).astype(np.float32),
                  "b": rng.standard_normal(D).astype(np.float32),
                  "m": np.array([7], np.int64), "inc": np.array([5], np.int64)})
    (tmp / "g.oi").write_text(SOURCE)
    return tmp / "g.oi", tmp / "g.oinf"


@pytest.fixture(scope="module")
def expected(graph):
    """The hand-written loop's result (`host_loop`), computed once for the module's tests."""
    g, m = graph
    return host_loop(oi2jax.compile(g, model=m))


def _prompt():
    rng = np.random.default_rng(9)
    return (np.array([[3], [1], [4]], np.int64), rng.standard_normal((1, D)).astype(np.float32),
            np.linspace(0.5, 1.5, STEPS).astype(np.float32))


def host_loop(prog, steps: int = STEPS) -> dict:
    """Feedback by hand: `session.step` per step, `token` from the prompt then from `next`,
    `h` once then from `y`; every step's `next`, `token` and `y`, and the state after."""
    tokens, h0, scales = _prompt()
    sess = prog.session()
    token, h = None, h0
    seen = {"next": [], "token": [], "y": []}
    for i in range(steps):
        token = tokens[i] if i < len(tokens) else token
        out = sess.step(token=token, h=h, scale=scales[i])
        seen["token"].append(np.asarray(token))
        token, h = out["next"], out["y"]
        seen["next"].append(np.asarray(out["next"]))
        seen["y"].append(np.asarray(out["y"]))
    result = sess.values()
    result.update({k: np.stack(v) for k, v in seen.items()})
    return result


@pytest.mark.parametrize("way", ["fused", "fused-one-step-calls", "stepwise"])
def test_feedback_run_equals_a_host_loop(graph, expected, way):
    """The fused loop feeds `next` back as `token` (after a 3-token prompt) and `y` back as `h`
    (given once) inside the loop, across growth of H (4 -> 8 -> 16 -> 32 rows: an undone step is
    not fed back) and across calls of the loop (`fused-one-step-calls`: the fed-back values are
    carried from call to call); `stepwise` (a traced run) feeds back through the host. All equal
    a hand-written loop of `Session.step` bit for bit."""
    g, m = graph
    tokens, h0, scales = _prompt()
    prog = oi2jax.compile(g, model=m)  # a fresh program: H grows from 4 rows in each way
    sess = prog.session()
    if way == "fused-one-step-calls":
        sess.call_seconds = 1e-12  # `Session.call_seconds`: each fused call runs one step
    got = prog.run({"token": tokens, "h": h0, "scale": scales}, steps=STEPS, feedback={"token": "next", "h": "y"},
                   collect=("next", "token", "y"), trace=way == "stepwise", session=sess)
    assert_same(got, expected, way)
    assert got["H"].shape == (STEPS, 1) and list(got["H"][:4, 0]) == [3, 1, 4, int(got["next"][2, 0])]
    assert len(set(got["token"][:, 0].tolist())) > 3  # generated, not the prompt repeated


def test_feedback_sources_and_first_values(graph):
    """A fed-back input given once (or not at all: its default) is its first step's value; a
    persistent plain variable can be the source (`acc` has `h`'s shape and dtype); `steps`
    defaults to the per-step values' length."""
    g, m = graph
    prog = oi2jax.compile(g, model=m)
    tokens, h0, _ = _prompt()
    got = prog.run({"token": tokens[0], "h": h0}, steps=5, feedback={"token": "next", "h": "acc"},
                   collect=("token", "h", "acc"))
    np.testing.assert_array_equal(got["token"][0], tokens[0])
    np.testing.assert_array_equal(got["h"][0], h0)
    np.testing.assert_array_equal(got["h"][1:], got["acc"][:-1])  # step i's h: step i-1's acc
    sess = prog.session()
    token, h = tokens[0], h0
    for _ in range(5):
        sess.step(token=token, h=h)
        token, h = sess.read("next").astype(np.int64), sess.read("acc")
    assert_same(prog.session().run({"token": tokens[0], "h": h0}, steps=5, feedback={"token": "next", "h": "acc"}),
                sess.values())
    got = prog.run({"token": tokens}, feedback={"token": "next"}, collect="token")  # steps: the prompt's
    np.testing.assert_array_equal(got["token"], tokens)
    got = prog.run({}, steps=3, feedback={"token": "next"}, collect="token")  # first: the default (0)
    assert got["token"][0, 0] == 0


def test_feedback_errors(graph):
    g, m = graph
    prog = oi2jax.compile(g, model=m)
    tokens, h0, scales = _prompt()
    cases = [
        ({"y": "next"}, "feedback y=next: y is a volatile variable, not an input (dynamic variable)"),
        ({"tokn": "next"}, "feedback tokn=next: tokn is not a variable of the graph, not an input (dynamic "
                           "variable) (did you mean token?)"),
        ({"token": "nxt"}, "feedback token=nxt: nxt is not a variable a step leaves a value in (did you mean next?)"),
        ({"token": "w"}, "feedback token=w: w is not a variable a step leaves a value in"),
        ({"token": "H"}, "feedback token=H: H is a cache table, whose shape changes from step to step (i grows); "
                         "cache.read what to feed back into a volatile and feed that back"),
        ({"token": "y"}, "feedback token=y: y is f32[1, 8] but input token is i64[1]; a value fed back must "
                         "have the input's dtype and shape"),
        ({"h": "wide"}, "feedback h=wide: wide is f32[1, 3] but input h is f32[1, 8]"),
        ({"scale": "t"}, "feedback scale=t: t is i32[] but input scale is f32[]"),
    ]
    for feedback, message in cases:
        for run in (lambda: prog.run({"token": tokens}, feedback=feedback),
                    lambda: prog.run({"token": tokens}, feedback=feedback, trace=True)):
            with pytest.raises(OiError) as info:
                run()
            assert message in str(info.value), (feedback, str(info.value))
    with pytest.raises(OiError, match="only inputs with feedback may hold fewer"):
        prog.run({"token": tokens, "scale": scales[:3]}, steps=5, feedback={"token": "next"})
    with pytest.raises(OiError, match="3 steps asked for, but the per-step inputs hold 2 values"):
        prog.run({"token": tokens[:2]}, steps=3)  # without feedback: as before
    with pytest.raises(OiError) as info:  # ... with the way on: the one output of token's dtype and shape
        prog.run({"token": tokens[:2]}, steps=3)
    assert ("3 steps asked for, but the per-step inputs hold 2 values (token); to run on past them, feed a step's "
            "output back into token: --feedback token=next (Session.run: feedback={'token': 'next'}) (next has its "
            "dtype and shape)") in str(info.value)
    with pytest.raises(OiError, match="feedback input token: its per-step values hold no step"):
        prog.run({"token": tokens[:0]}, steps=2, feedback={"token": "next"})


def test_cli_feedback_generates(graph, expected, capsys, tmp_path):
    """`oi2jax run G --inputs-per-step prompt.npz --feedback token=next --steps N --collect next`:
    the prompt teacher-forced, then greedy generation, as the host loop (and so `Program.run(feedback=...)`,
    test_feedback_run_equals_a_host_loop): its collected `next` and `token`, its last `y`, its state."""
    g, m = graph
    tokens, h0, scales = _prompt()
    np.savez(tmp_path / "prompt.npz", token=tokens, scale=scales)
    np.save(tmp_path / "h.npy", h0)
    code, _, err = run_cli(capsys, "run", g, "--model", m, "--inputs-per-step", tmp_path / "prompt.npz",
                           "--input", f"h={tmp_path / 'h.npy'}", "--feedback", "token=next", "--feedback", "h=y",
                           "--steps", STEPS, "--collect", "next,token", "--out", tmp_path / "gen.npz", "--quiet")
    assert code == 0, err
    with np.load(tmp_path / "gen.npz") as got:
        assert_same(dict(got), {**expected, "y": expected["y"][-1]})  # y not collected: its last value
    # without --steps: the run's own count (the non-fed per-step inputs' length)
    code, _, err = run_cli(capsys, "run", g, "--model", m, "--inputs-per-step", tmp_path / "prompt.npz",
                           "--feedback", "token=next", "--collect", "token", "--out", tmp_path / "g2.npz", "--quiet")
    assert code == 0, err
    with np.load(tmp_path / "g2.npz") as got:
        assert got["token"].shape == (STEPS, 1)
    code, _, err = run_cli(capsys, "run", g, "--model", m, "--feedback", "token", "--quiet")
    assert code == 2 and "--feedback expects INPUT=OUTPUT (e.g. token=next), got 'token'" in err
    # the interpreter runs the same feedback loop (run_rules.py): the same rows, bit for bit
    code, _, err = run_cli(capsys, "run", g, "--model", m, "--inputs-per-step", tmp_path / "prompt.npz",
                           "--feedback", "token=next", "--collect", "token", "--out", tmp_path / "g3.npz", "--quiet",
                           "--interpret")
    assert code == 0, err
    with np.load(tmp_path / "g2.npz") as want, np.load(tmp_path / "g3.npz") as got:
        assert sorted(want) == sorted(got)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    code, _, err = run_cli(capsys, "run", g, "--model", m, "--feedback", "token=y", "--quiet")
    assert code == 1 and err.strip().startswith("error: feedback token=y: y is f32[1, 8] but input token is i64[1]")


def test_a_run_that_continues_a_session_feeds_back_its_last_output(graph, expected, tmp_path, capsys):
    """A second `run` of a session (or a run from a saved state) with `feedback` and the fed-back
    input not given takes the session's last OUT as its first IN: the two runs equal one run of
    their steps together. It was a missing-input error (or the input's default), so a saved
    generation could not be resumed without giving its last token again (helper probe)."""
    g, m = graph
    tokens, h0, scales = _prompt()
    prog = oi2jax.compile(g, model=m)
    sess = prog.session()
    feedback = {"token": "next", "h": "y"}
    first = sess.run({"token": tokens, "h": h0, "scale": scales[:10]}, steps=10, feedback=feedback, collect="next")
    rest = sess.run({"scale": scales[10:]}, steps=STEPS - 10, feedback=feedback, collect="next")
    np.testing.assert_array_equal(np.concatenate([first["next"], rest["next"]]), expected["next"])
    for name in ("acc", "H", "t"):
        np.testing.assert_array_equal(rest[name], expected[name], err_msg=name)
    stepwise = prog.session()  # the host loop (`run_stepwise`: traced runs, the driver) continues alike
    stepwise.run_stepwise({"token": tokens, "h": h0, "scale": scales[:10]}, steps=10, feedback=feedback)
    again = stepwise.run_stepwise({"scale": scales[10:]}, steps=STEPS - 10, feedback=feedback, collect="next")
    np.testing.assert_array_equal(again["next"], rest["next"])
    # the CLI: --state-out, then --state-in with the feedback and no token
    np.savez(tmp_path / "p.npz", token=tokens)
    common = ["run", g, "--model", m, "--feedback", "token=next", "--collect", "next", "--quiet"]
    assert run_cli(capsys, *common, "--inputs-per-step", tmp_path / "p.npz", "--steps", "6", "--state-out",
                   tmp_path / "s.npz", "--out", tmp_path / "a.npz")[0] == 0
    code, _, err = run_cli(capsys, *common, "--state-in", tmp_path / "s.npz", "--steps", "4", "--out", tmp_path / "b.npz")
    assert code == 0, err
    assert run_cli(capsys, *common, "--inputs-per-step", tmp_path / "p.npz", "--steps", "10", "--out",
                   tmp_path / "w.npz")[0] == 0
    with np.load(tmp_path / "a.npz") as a, np.load(tmp_path / "b.npz") as b, np.load(tmp_path / "w.npz") as w:
        np.testing.assert_array_equal(np.concatenate([a["next"], b["next"]]), w["next"])
