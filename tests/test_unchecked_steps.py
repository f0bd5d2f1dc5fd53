"""Errors without a per-step sync (issue 32, item 1): `Session.step` leaves up to K =
`max_unchecked` dispatched steps unchecked. Here every step looks unfinished at the next call, as
on a GPU (the readiness check the session uses is patched), and every host read of a step's
flags is counted: the hot path is taken, nothing is read back until more than K steps are
unchecked, step k's error raises at the first sync point after it, and the state is exactly
what step k left, untouched by the steps dispatched after it (docs/decode.md)."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError

from oi2jax.runtime.session import DeviceOutcomes

from conftest import EXAMPLES, GROW_SOURCE, PLAIN_FAIL_LARGE_SOURCE, PLAIN_FAIL_SOURCE, assert_same

KV = (EXAMPLES / "kv_cache_decode.oi", EXAMPLES / "kv_cache_decode.oinf")  # K @fixed(i=4): step 5 overflows
OVERFLOW = r"dimension 0 of K: index 4 is past its fixed size 4 \(in step 5\)"


class Device:
    """What a session sees of the device, through its documented hook `Session.outcomes`:
    `finished` says whether a step's flags are ready (default: never, as on a GPU that is always
    behind the host); `reads` counts host reads of flags (each waits for its step); `general`
    counts the attached session's steps that left the hot path (`Session.general_steps`)."""

    def __init__(self, finished=lambda: False):
        self.reads = 0
        self.finished = finished
        self.session = None

    def ready(self, flags) -> bool:
        return self.finished()

    def read(self, flags):
        self.reads += 1
        return DeviceOutcomes.read(flags)

    def attach(self, sess):
        sess.outcomes, self.session = self, sess
        return sess

    @property
    def general(self) -> int:
        return self.session.general_steps


@pytest.fixture(scope="module")
def kv():
    return oi2jax.compile(KV[0], model=KV[1])


def queries(kv, n: int):
    import jax
    d = kv.bound.shape("q")[0]
    qs = np.random.default_rng(4).standard_normal((n, d)).astype(np.float32)
    with kv.scope():
        return qs, [jax.device_put(q) for q in qs]


def reference(kv, qs, steps: int) -> dict:
    """Every variable after `steps` steps checked one at a time (K=1, each step finished)."""
    ref = kv.session(max_unchecked=1)
    for k in range(steps):
        try:
            ref.step(q=qs[k])
            ref.check()
        except OiError:
            assert k + 1 == steps
    return ref.values()


@pytest.mark.parametrize("K", [1, 3, 8])
def test_unfinished_steps_raise_at_the_first_sync_point_after_them(kv, K):
    """Step 5 fails. With every step unfinished, the session reads nothing back for the first K
    calls, then one step's flags per call (the step K calls back: more than K would be
    unchecked); step 5's error raises from call 5 + K (K=1: call 6, today's timing), the state
    exactly what step 5 left (K's rows 0-3 written, the failing 5th write skipped, t = 5), the
    steps dispatched after it (6 .. 5+K-1) undone in effect: they did nothing."""
    device = Device()
    qs, dev = queries(kv, 5 + K)
    sess = device.attach(kv.session(max_unchecked=K))
    assert sess.max_unchecked == K
    for k in range(5 + K - 1):  # calls 1 .. 5+K-1: none raises
        sess.step(q=dev[k])
        assert device.reads == max(0, k + 1 - K), k  # nothing read before more than K are unchecked
        assert sess.unchecked == min(k + 1, K)
        if k == 1:  # the first call sets up the hot path; the second compiles the `single` form
            general = device.general  # (where an earlier session of the program has not)
            assert general <= 2
    assert device.general == general  # every later call took the hot path
    with pytest.raises(OiError, match=OVERFLOW) as info:
        sess.step(q=dev[5 + K - 1])  # more than K unchecked: step 5's flags read, its error raised
    assert info.value.step == 5 and sess.steps == 5 and not sess.unchecked
    assert device.general == general
    assert_same(sess.values(), reference(kv, qs, 5))
    assert int(sess.read("t")) == 5  # steps 6.. did not increment it
    np.testing.assert_array_equal(sess.read("K"), qs[:4] + kv.bound.initial("zero"))


@pytest.mark.parametrize("sync", ["read", "state", "save", "values", "check", "run", "close"])
def test_a_sync_point_raises_an_unchecked_error(kv, tmp_path, sync):
    """Every point where the session hands data to the host raises step 5's error, though no
    call ever found a step finished and K (8) was never exceeded."""
    device = Device()
    qs, dev = queries(kv, 7)
    sess = device.attach(kv.session())
    assert sess.max_unchecked == 8
    for k in range(7):
        sess.step(q=dev[k])
    assert device.reads == 0 and sess.steps == 7
    with pytest.raises(OiError, match=OVERFLOW):
        if sync == "read":
            sess.read("K")
        elif sync == "state":
            sess.state
        elif sync == "save":
            sess.save(tmp_path / "s.npz")
        elif sync == "values":
            sess.values()
        elif sync == "check":
            sess.check()
        elif sync == "run":
            sess.run({"q": qs[:1]})
        else:
            sess.close()
    assert not (tmp_path / "s.npz").exists()
    if sync == "close":
        with pytest.raises(OiError, match="this session is closed"):
            sess.step(q=dev[0])
        return
    assert sess.steps == 5
    assert_same(sess.values(), reference(kv, qs, 5))


def test_a_finished_step_raises_before_anything_is_dispatched(kv):
    """As soon as a call finds the steps finished (without waiting), it takes their outcome
    first: step 5's error raises from call 7 before call 7 dispatches anything."""
    done = {"now": False}
    device = Device(finished=lambda: done["now"])
    qs, dev = queries(kv, 7)
    sess = device.attach(kv.session())
    for k in range(6):
        sess.step(q=dev[k])
    assert device.reads == 0
    done["now"] = True
    with pytest.raises(OiError, match=OVERFLOW):
        sess.step(q=dev[6])
    assert device.reads == 3  # the newest finished step (6: it carries step 5's error), 5, and 4 (clean)
    assert sess.steps == 5
    assert_same(sess.values(), reference(kv, qs, 5))


def _five_steps_failing_at_3(prog):
    """Inputs n, x of five steps (n = inf at step 3: its loop bound fails), and them on the device."""
    import jax
    ns = np.array([1, 2, np.inf, 1, 3], np.float32)
    xs = np.arange(10, dtype=np.float32).reshape(5, 2) + 1
    with prog.scope():
        return ns, xs, [(jax.device_put(n), jax.device_put(x)) for n, x in zip(ns, xs)]


@pytest.mark.parametrize("cond", [False, True], ids=["select", "entrywise"])
def test_steps_after_a_failing_one_change_nothing_and_lose_nothing(cond):
    """Step 3 fails (a loop bound inf); steps 4 and 5, dispatched before its error is read, would
    succeed, yet leave the state as step 3 left it (skipped in the kernel, by a select after the
    step for a small plain state, else state entry by entry after a step whose table writes skip
    their rows). Given again after the error, they give what a fused run of all
    five steps gives: no write lost, none applied twice."""
    device = Device()
    prog = oi2jax.compile(PLAIN_FAIL_LARGE_SOURCE if cond else PLAIN_FAIL_SOURCE)
    assert prog.executable.kernels.select_skip is not cond
    ns, xs, dev = _five_steps_failing_at_3(prog)
    sess = device.attach(prog.session(max_unchecked=4))
    for k in range(5):
        sess.step(n=dev[k][0], x=dev[k][1])
    assert device.reads == 1 and device.general == 2  # 5 > K: step 1 read (clean); calls 3-5 hot
    with pytest.raises(OiError, match=r"loop bound n is not finite \(in step 3\)"):
        sess.check()
    assert sess.steps == 3 and int(sess.read("count")) == 3
    np.testing.assert_array_equal(sess.read("acc"), xs[0] + 2 * xs[1])  # step 3's loop skipped, 4 and 5 nothing
    np.testing.assert_array_equal(sess.read("y"), xs[0] + 2 * xs[1])  # step 3's volatile, not step 5's
    for k in (3, 4):
        sess.step(n=dev[k][0], x=dev[k][1])
    fused = prog.session()
    with pytest.raises(OiError, match=r"\(in step 3\)"):
        fused.run({"n": ns, "x": xs})
    fused.run({"n": ns[3:], "x": xs[3:]})
    assert_same(sess.values(), fused.values())
    np.testing.assert_array_equal(sess.read("acc"), xs[0] + 2 * xs[1] + xs[3] + 3 * xs[4])


TABLE_FAIL_SOURCE = """
dynamic { n: f32; x: f32[2]; }
volatile { y: f32[2]; }
persistent { t: i32 @init(0); H(i): f32[2] @table @fixed(i=8); }
block entry {
    cache.write x >> H[t];
    cache.reset H[7];
    op add(x, x) >> y;
    loop l (i in 0..n) { op add(y, x) >> y; }
    cache.increment t;
    return;
}
"""


def test_skipped_steps_leave_tables_in_place_and_untouched():
    """The `single` form skips a step after an unreported error row by row (no conditional around
    the step: XLA copies every table through one): steps 4 and 5, dispatched before step 3's
    error is read, would write rows 3 and 4 of H in range, yet write nothing; the compiled kernel
    copies no table."""
    import re
    prog = oi2jax.compile(TABLE_FAIL_SOURCE)
    assert not prog.executable.kernels.select_skip
    ns, xs, dev = _five_steps_failing_at_3(prog)
    sess = Device().attach(prog.session(max_unchecked=8))  # every step unfinished at the next call, as on a GPU
    for k in range(5):
        sess.step(n=dev[k][0], x=dev[k][1])
    with pytest.raises(OiError, match=r"loop bound n is not finite \(in step 3\)"):
        sess.check()
    assert sess.steps == 3 and int(sess.read("t")) == 3
    want = np.zeros((8, 2), np.float32)
    want[:3] = xs[:3]  # step 3 wrote its row before its loop failed; steps 4 and 5 wrote nothing
    np.testing.assert_array_equal(sess.read("H"), want)
    form = prog.executable.kernels.session_forms({"n": dev[0][0], "x": dev[0][1]}).after_unchecked
    assert form is not None, "the after_unchecked form was not compiled"
    hlo = form.exe.as_text()
    assert not re.search(r"f32\[8,2\]\{[^}]*\} copy\(", hlo), "a table is copied"
    for k in (3, 4):
        sess.step(n=dev[k][0], x=dev[k][1])
    sess.check()
    want[3:5] = xs[3:5]
    np.testing.assert_array_equal(sess.read("H"), want)


def test_growth_still_reruns_the_step_that_needed_it():
    """A growable table: each step is checked before it returns (its outputs must never be an
    undone step's), so growth re-runs the step that needed more capacity whatever the device's
    pace; 20 steps equal the fused run, in O(log n) compiles."""
    device = Device()
    prog = oi2jax.compile(GROW_SOURCE)
    xs = np.arange(40, dtype=np.float32).reshape(20, 2)
    sess = device.attach(prog.session())
    for k in range(20):
        out = sess.step(x=xs[k])
        np.testing.assert_array_equal(np.asarray(out["last"]), xs[k])  # never an undone step's
    assert sess.steps == 20 and not sess.unchecked and device.general == 20  # each step checked
    np.testing.assert_array_equal(sess.read("A"), xs)
    ref = oi2jax.compile(GROW_SOURCE).session()
    ref.run({"x": xs})
    assert_same(sess.values(), ref.values())
    assert prog.compiles <= 10


def test_max_unchecked_is_checked(kv):
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(OiError, match="max_unchecked must be an integer >= 1"):
            kv.session(max_unchecked=bad)
    with kv.session() as sess:
        sess.step(q=np.zeros(kv.bound.shape("q"), np.float32))
    with pytest.raises(OiError, match="this session is closed"):
        sess.read("t")


def test_a_handed_in_state_is_read_once_and_a_clean_one_needs_no_skipping_form():
    """A session started from a `StepState` (a prompt session's state handed to the decode
    program) reads the state's flags once at its first step: no error -> the clean compiled form,
    not a second one that can skip; a state whose flags hold an error (from the pure `prog.step`,
    which reports nothing) still takes the form that skips: its error is raised at the next sync
    point and the state is left as it was."""
    prog = oi2jax.compile(PLAIN_FAIL_SOURCE)
    x = np.array([1.0, 2.0], np.float32)
    first = prog.session()
    first.step(n=np.float32(2), x=x)
    compiled = prog.compiles  # the clean form
    device = Device(finished=lambda: True)
    resumed = device.attach(prog.session(state=first.state))
    out = resumed.step(n=np.float32(1), x=x)
    np.testing.assert_array_equal(np.asarray(out["y"]), 3 * x)
    assert prog.compiles == compiled, prog.compile_log  # the clean form again: nothing compiled
    assert device.reads == 1  # the handed-in flags, read once
    failed, _ = prog.step(prog.init_state(), n=np.float32(np.nan), x=x)  # the error stays in the flags
    assert int(failed.guards.err) != 0
    broken = prog.session(state=failed)
    broken.step(n=np.float32(1), x=x)  # the form that can skip: the step does nothing ...
    with pytest.raises(OiError, match=r"loop bound n is not finite \(in step 1\)"):
        broken.check()  # ... and the handed-in error is raised at the next sync point
    np.testing.assert_array_equal(np.asarray(broken.read("acc")), np.zeros(2, np.float32))
