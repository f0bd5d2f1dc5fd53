"""Decode loops (docs/decode.md): `Program.session()` with a new input each step, errors that are
never lost, growth that never loses a write, save/resume, fused multi-step runs, the typed state."""
from __future__ import annotations

import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError
from oi2jax.lowering.state import StepState

from conftest import EXAMPLES, PLAIN_FAIL_LARGE_SOURCE, PLAIN_FAIL_SOURCE, run_both, run_cli

D = 4
KV_SOURCE = EXAMPLES / "kv_cache_decode.oi"

# a growable table (no @fixed) and a fixed one that overflows at step 6
GROW_SOURCE = """\
dynamic { x: f32[D]; }
volatile { last: f32[D]; }
persistent {
    t: i32 @init(0);
    A(i): f32[D] @table;
}
block entry {
    cache.write x >> A[t];
    cache.read A[t] >> last;
    cache.increment t;
    return;
}
"""

GROW_AND_FAIL_SOURCE = """\
dynamic { x: f32[D]; }
volatile { last: f32[D]; }
persistent {
    t: i32 @init(0);
    A(i): f32[D] @table;
    F(j): f32[D] @table @fixed(j=5);
}
block entry {
    cache.write x >> A[t];
    cache.write x >> F[t];
    cache.read A[t] >> last;
    cache.increment t;
    return;
}
"""


@pytest.fixture(scope="module")
def kv():
    return oi2jax.compile(KV_SOURCE, model=EXAMPLES / "kv_cache_decode.oinf")


@pytest.fixture(scope="module")
def grow_prog():
    return oi2jax.compile(GROW_SOURCE, sizes={"D": D})


def tokens(n: int, d: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def k_hist_after(qs: np.ndarray, k: int, zero: np.ndarray) -> np.ndarray:
    """kv_cache_decode's `k_hist` after steps 0..k with queries `qs`: rows 0..k hold q + zero."""
    want = np.zeros((4, qs.shape[1]), np.float32)
    want[:k + 1] = qs[:k + 1] + zero
    return want


def kv_device_tokens(kv, n: int, seed: int, *extra):
    """(d, zero, host queries [n, d], the same on the device, each of `extra` on the device)."""
    import jax
    d = kv.bound.shape("q")[0]
    qs = tokens(n, d, seed=seed)
    with kv.scope():
        return (d, kv.bound.initial("zero"), qs, [jax.device_put(q) for q in qs],
                [jax.device_put(e(d)) for e in extra])


def test_kv_decode_steps_equal_numpy_and_overflow_raises(kv):
    d = kv.bound.shape("q")[0]
    zero = kv.bound.initial("zero")
    qs = tokens(6, d)
    sess = kv.session(max_unchecked=1)  # K=1: step k's error raises at the latest from call k+1
    for k in range(4):
        out = sess.step(q=qs[k])
        want = k_hist_after(qs, k, zero)
        np.testing.assert_array_equal(np.asarray(out["k_hist"]), want)
        np.testing.assert_array_equal(sess.read("K"), want)
        assert int(sess.read("t")) == k + 1
    sess.step(q=qs[4])  # overflows K (fixed i=4): reported at the latest at the next call
    with pytest.raises(OiError) as info:
        sess.step(q=qs[5])
    msg = str(info.value)
    assert "dimension 0 of K: index 4 is past its fixed size 4 (in step 5)" in msg
    assert "kv_cache_decode.oi:23:22" in msg and "cache.write q >> K[t];" in msg
    assert info.value.step == 5
    # step 5 applied except its failing write; step 6 did nothing
    assert int(sess.read("t")) == 5
    np.testing.assert_array_equal(sess.read("K"), qs[:4] + zero)
    assert sess.steps == 5


def test_error_reported_by_read_save_and_state(kv, tmp_path):
    d = kv.bound.shape("q")[0]
    for call in ("read", "save", "state", "check", "run"):
        sess = kv.session()
        for k in range(5):
            sess.step(q=np.full(d, k, np.float32))
        with pytest.raises(OiError, match=r"\(in step 5\)"):
            if call == "read":
                sess.read("t")
            elif call == "save":
                sess.save(tmp_path / "s.npz")
            elif call == "state":
                sess.state
            elif call == "check":
                sess.check()
            else:
                sess.run({"q": np.zeros(d, np.float32)}, steps=1)
        sess.check()  # reported once: the session goes on
        assert int(sess.read("t")) == 5


def test_read_of_a_constant_and_a_state_of_another_kind_are_named(kv):
    sess = kv.session()
    constant = next(v.name for v in kv.graph.vars if v.kind.value == "constant")
    with pytest.raises(OiError, match=rf"read: {constant} is a constant \(a model tensor\), not part of the session's "
                                      rf"state: read it from the model file"):  # "unknown variable" before
        sess.read(constant)
    with pytest.raises(OiError, match="read: unknown variable tt"):
        sess.read("tt")
    for bad in (5, [1, 2]):  # an AttributeError before
        with pytest.raises(OiError, match=rf"state: expected a StepState, a \{{name: array\}} dict or a state file's "
                                          rf"path, got {type(bad).__name__}"):
            kv.session(state=bad)


def test_growth_is_transparent_under_session_step(grow_prog):
    xs = tokens(100, D, seed=1)
    sess = grow_prog.session()
    before = grow_prog.compiles
    for k in range(100):
        out = sess.step(x=xs[k])
        np.testing.assert_array_equal(np.asarray(out["last"]), xs[k])
        if k in (0, 3, 4, 16, 63, 64, 99):
            np.testing.assert_array_equal(sess.read("A"), xs[:k + 1])
    np.testing.assert_array_equal(sess.read("A"), xs)
    assert int(sess.read("t")) == 100
    # capacity 4 -> 8 -> ... -> 128: one compile per capacity, O(log n)
    assert grow_prog.compiles - before <= 7


def check_fused_equals_steps_with_growth_and_error(prog, xs) -> None:
    """GROW_AND_FAIL_SOURCE's 12 steps, fused against one `Session.step` at a time: step 5 grows
    A (capacity 4 -> 8: the step is undone, the host grows, the run goes on from it), step 6 writes
    past F's 5 rows; every later step fails too. Each error names its step; every value equal."""
    one = prog.session()
    for k in range(5):
        one.step(x=xs[k])  # step 5 grows A (capacity 4 -> 8)
    with pytest.raises(OiError, match=r"dimension 0 of F: index 5 is past its fixed size 5 \(in step 6\)"):
        one.step(x=xs[5])
    for k in range(6, 12):
        with pytest.raises(OiError):
            one.step(x=xs[k])
    fused = prog.session()
    with pytest.raises(OiError, match=r"\(in step 6\)") as info:
        fused.run({"x": xs})
    assert info.value.step == 6 and fused.steps == 6
    with pytest.raises(OiError, match=r"\(in step 7\)"):
        fused.run({"x": xs[6:]})
    for k in range(7, 12):
        with pytest.raises(OiError, match=rf"\(in step {k + 1}\)"):
            fused.run({"x": xs[k:k + 1]})
    assert one.steps == fused.steps == 12
    for name in ("t", "A", "F", "x", "last"):
        np.testing.assert_array_equal(one.read(name), fused.read(name), err_msg=name)
    np.testing.assert_array_equal(fused.read("A"), xs)
    np.testing.assert_array_equal(fused.read("F"), xs[:5])


@pytest.mark.parametrize("placed", [False, True], ids=["host", "device"])
def test_fused_run_equals_steps_bit_for_bit_with_growth_and_error(placed):
    """Host inputs take the jitted loop; device inputs a validated plan and the loop compiled
    ahead of time for it (recompiled after the growth): the same values either way."""
    prog = oi2jax.compile(GROW_AND_FAIL_SOURCE, sizes={"D": D})
    xs = tokens(12, D, seed=2)
    if placed:
        import jax
        with prog.scope():
            xs = jax.device_put(xs)
    check_fused_equals_steps_with_growth_and_error(prog, xs)
    compiled = [p for p in prog.validated_runs.values() if p.exes(prog.executable.kernels)]
    assert bool(compiled) == placed


def test_fused_run_plan_calls_its_loop_only_with_arguments_it_takes(kv):
    """A plan's loop compiled ahead of time is called only after an explicit check that it takes
    the arguments as they are (`AheadOfTime.accepts`: avals and placement): one that does not
    (here: a loop compiled for 2 steps, given 3) is dropped for the jitted loop -- the same
    values, the run not lost -- and an error the loop raises while running is reported, not taken
    for a refusal."""
    import jax
    d = kv.bound.shape("q")[0]
    qs = tokens(3, d, seed=9)
    with kv.scope():
        dev, dev2 = jax.device_put(qs), jax.device_put(qs[:2])
    first = kv.session().run({"q": dev}, collect="k_hist")
    kv.session().run({"q": dev2}, collect="k_hist")
    plan3, plan2 = (next(p for p in kv.validated_runs.values() if p.exes(kv.executable.kernels) and
                         p.steps == n) for n in (3, 2))
    exes = plan3.exes(kv.executable.kernels)
    real = dict(exes)
    calls = []

    class Fails:  # takes the arguments, then fails as it runs
        def __init__(self, loop):
            self.loop = loop

        def accepts(self, *args):
            return self.loop.accepts(*args)

        def exe(self, *args):
            calls.append(args)
            raise TypeError("a genuine error")

    for index in exes:
        exes[index] = Fails(real[index])
    with pytest.raises(TypeError, match="a genuine error"):
        kv.session().run({"q": dev}, collect="k_hist")
    assert len(calls) == 1
    for index in exes:  # the 2-step plan's loop: it does not take 3 steps' inputs
        exes[index] = Fails(plan2.exes(kv.executable.kernels)[index])
    second = kv.session().run({"q": dev}, collect="k_hist")
    assert len(calls) == 1 and all(e is None for e in exes.values())
    third = kv.session().run({"q": dev}, collect="k_hist")
    assert len(calls) == 1
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
        np.testing.assert_array_equal(first[name], third[name], err_msg=name)


def test_fused_run_equals_steps_and_collects(kv):
    d = kv.bound.shape("q")[0]
    qs = tokens(4, d, seed=3)
    stepped = kv.session()
    hist = [np.asarray(stepped.step(q=q)["k_hist"]) for q in qs]
    result = kv.session().run({"q": qs}, collect=("k_hist", "t"))
    np.testing.assert_array_equal(result["k_hist"], np.stack(hist))
    np.testing.assert_array_equal(result["t"], np.arange(1, 5, dtype=np.int32))
    np.testing.assert_array_equal(result["K"], stepped.read("K"))
    np.testing.assert_array_equal(result["q"], qs[-1] + kv.bound.initial("zero"))
    # Program.run takes the same per-step inputs
    np.testing.assert_array_equal(kv.run({"q": qs}, steps=None)["K"], stepped.read("K"))


def test_fused_loop_indexes_in_int64_past_two_to_the_31(kv):
    """The fused loop counts in int32 while every index fits and in int64 beyond (a run of more
    than 2**31 steps with the same inputs): both give the same steps."""
    d = kv.bound.shape("q")[0]
    q = np.arange(d, dtype=np.float32)
    kernels = kv.executable.kernels
    results = []
    for base in (0, 2**31 - 2):
        sess = kv.session()
        with kv.scope():
            fixed = kv.dynamic_args(kv.executable.host.placer.put("dynamic", kv.validate_inputs({"q": q})))
            res = kernels.multi(kv.consts, sess.state, {}, fixed, base, 3)
            state, last, status = res.state, res.last, res.status
        assert list(np.asarray(status)[:3]) == [0, 0, 3]
        results.append((kv.export_state(state), {k: np.asarray(v) for k, v in last.items()}))
    (state32, last32), (state64, last64) = results
    for name in state32:
        np.testing.assert_array_equal(state32[name], state64[name], err_msg=name)
    for name in last32:
        np.testing.assert_array_equal(last32[name], last64[name], err_msg=name)
    np.testing.assert_array_equal(state32["K"][:3], np.stack([q + kv.bound.initial("zero")] * 3))
    assert int(state32["t"]) == 3


def test_growth_under_fused_run_is_logarithmic(grow_prog):
    xs = tokens(200, D, seed=4)
    before = grow_prog.compiles
    result = grow_prog.session().run({"x": xs}, collect=("last",))
    np.testing.assert_array_equal(result["A"], xs)
    np.testing.assert_array_equal(result["last"], xs)
    assert grow_prog.compiles - before <= 8


def test_save_resume_equals_uninterrupted(grow_prog, tmp_path):
    xs = tokens(20, D, seed=5)
    whole = grow_prog.session()
    for x in xs:
        whole.step(x=x)
    first = grow_prog.session()
    for x in xs[:7]:
        first.step(x=x)
    first.save(tmp_path / "state.npz")
    resumed = grow_prog.session(state=tmp_path / "state.npz")
    assert resumed.steps == 7
    resumed.run({"x": xs[7:]})
    for name in ("A", "t", "x", "last"):
        np.testing.assert_array_equal(resumed.read(name), whole.read(name), err_msg=name)


def test_session_inputs_are_validated(kv):
    d = kv.bound.shape("q")[0]
    sess = kv.session()
    with pytest.raises(OiError, match=rf"input q: expected shape \[{d}\], got \[2\]"):
        sess.step(q=np.zeros(2, np.float32))
    with pytest.raises(OiError, match="not exactly representable in f32"):
        sess.step(q=np.full(d, 0.1, np.float64))
    with pytest.raises(OiError, match="unknown input qq"):
        sess.step(qq=np.zeros(d, np.float32))
    sess.step(q=np.full(d, 0.5, np.float64))  # exact: converted
    sess.step(q=np.arange(d, dtype=np.int32))  # exact: converted
    np.testing.assert_array_equal(sess.read("K")[1], np.arange(d, dtype=np.float32) + kv.bound.initial("zero"))
    with pytest.raises(OiError, match=r"\[N, "):
        sess.run({"q": np.zeros((2, 3, d), np.float32)})
    q = np.zeros(d, np.float32)
    for steps in (2.5, True, "3", -1):  # 2.5 ran 2 steps and True 1, silently, before
        with pytest.raises(OiError, match=rf"steps must be a whole number >= 0, got {re.escape(repr(steps))}"):
            sess.run({"q": q}, steps=steps)
        with pytest.raises(OiError, match=rf"steps must be a whole number >= 0, got {re.escape(repr(steps))}"):
            kv.run({"q": q}, steps=steps)
    assert sess.steps == 2 and sess.run({"q": q}, steps=np.int64(2)) is not None and sess.steps == 4


def test_device_inputs_take_the_hot_path_with_the_same_checks(kv):
    """Session.step's hot path (the same complete set of device inputs as the last step) keeps
    every check of the general path: values, a late error with its step, and the messages for a
    device array of another shape or dtype."""
    d, zero, qs, dev, (wrong_shape, inexact, exact) = kv_device_tokens(
        kv, 6, 3, lambda d: np.zeros(d + 1, np.float32), lambda d: np.full(d, 0.1, np.float64),
        lambda d: np.full(d, 0.5, np.float64))
    for fresh in range(2):  # the second session compiles nothing: the forms are the program's
        sess = kv.session(max_unchecked=1)  # K=1: step k's error raises at the latest from call k+1
        for k in range(4):
            out = sess.step(q=dev[k])
            np.testing.assert_array_equal(np.asarray(out["k_hist"]), k_hist_after(qs, k, zero))
            assert sess.general_steps == 1  # every step after the first took the hot path
        sess.step(q=dev[4])  # overflows K
        with pytest.raises(OiError, match=r"index 4 is past its fixed size 4 \(in step 5\)"):
            sess.step(q=dev[5])
        assert sess.steps == 5 and int(sess.read("t")) == 5
        np.testing.assert_array_equal(sess.read("K"), qs[:4] + zero)
    sess = kv.session()
    sess.step(q=dev[0])
    with pytest.raises(OiError, match=rf"input q: expected shape \[{d}\], got \[{d + 1}\]"):
        sess.step(q=wrong_shape)
    with pytest.raises(OiError, match="not exactly representable in f32"):
        sess.step(q=inexact)
    with pytest.raises(OiError, match="unknown input qq"):
        sess.step(qq=dev[1])
    sess.step(q=exact)  # exact: converted
    sess.step(q=qs[2])  # a host array: converted and placed
    sess.step(q=dev[3])
    np.testing.assert_array_equal(sess.read("K"), np.stack([qs[0], np.full(d, 0.5, np.float32), qs[2], qs[3]]) + zero)


def test_hot_step_kernel_with_flat_state_equals_the_jitted_step(kv):
    """`Session.step`'s hot path calls a kernel whose state is the tuple of its leaves (no
    pytree of dataclasses to flatten per call). Its results equal the structured jitted
    `clean` step bit for bit, and the session's state goes between leaves and tree unchanged
    (a `state` read between hot steps, a session resumed from that StepState)."""
    import jax
    from oi2jax.runtime.kernels import FlatStep
    _, zero, qs, dev, _ = kv_device_tokens(kv, 4, 11)
    sess = kv.session()
    sess.step(q=dev[0])
    sess.step(q=dev[1])  # the second step with the same device inputs: the hot path
    assert sess.general_steps == 1 and sess.held_as == "leaves"  # the second step: the hot path, its state flat
    assert isinstance(kv.executable.kernels.session_forms({"q": dev[1]}).from_clean, FlatStep)
    mid = sess.state  # the tree, made from the leaves
    np.testing.assert_array_equal(np.asarray(mid.caches["K"].data)[:2], qs[:2] + zero)
    with kv.scope():
        user = jax.tree.map(lambda a: a.copy(), (mid.vars, mid.caches))
        want = kv.executable.kernels.from_clean(kv.consts, user, {"q": dev[2]})
    sess.step(q=dev[2])
    got = sess.state
    for a, b in zip(jax.tree.leaves((want[0], want[1], want[2])), jax.tree.leaves((got.vars, got.caches, got.guards.flags))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    resumed = kv.session(state=got)
    resumed.step(q=dev[3])
    np.testing.assert_array_equal(resumed.read("K"), qs + zero)
    assert int(resumed.read("t")) == 4


def test_fused_runs_with_device_inputs_reuse_their_checks(kv):
    """`Session.run` remembers the validation of device inputs per signature (names, types,
    shapes, dtypes, steps, collect): a later run with the same signature checks nothing again
    and gives the same values; any other call still gets every check and message."""
    import jax
    d = kv.bound.shape("q")[0]
    qs = tokens(3, d, seed=8)
    zero = kv.bound.initial("zero")
    with kv.scope():
        dev = jax.device_put(qs)
        inexact = jax.device_put(np.full((3, d), 0.1, np.float64))
    first = kv.session().run({"q": dev}, collect="k_hist")
    assert kv.validated_runs
    second = kv.session().run({"q": dev}, collect="k_hist")
    assert first.keys() == second.keys()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    np.testing.assert_array_equal(second["K"][:3], qs + zero)
    np.testing.assert_array_equal(second["k_hist"][2], k_hist_after(qs, 2, zero))
    sess = kv.session()
    with pytest.raises(OiError, match="4 steps asked for, but the per-step inputs hold 3"):
        sess.run({"q": dev}, steps=4, collect="k_hist")
    with pytest.raises(OiError, match="collect: unknown variable k_hst"):
        sess.run({"q": dev}, collect="k_hst")
    for bad in (5, [5], ["k_hist", None]):  # a TypeError from iterating it before
        with pytest.raises(OiError, match=rf"collect: expected a variable name or a list of names, got {re.escape(repr(bad))}"):
            sess.run({"q": dev}, collect=bad)
    with pytest.raises(OiError, match="unknown input qq"):
        sess.run({"qq": dev}, collect="k_hist")
    with pytest.raises(OiError, match=r"\[N, "):
        sess.run({"q": dev[:, :2]}, collect="k_hist")
    with pytest.raises(OiError, match="not exactly representable in f32"):
        sess.run({"q": inexact}, collect="k_hist")
    assert sess.steps == 0
    third = sess.run({"q": dev}, steps=2, collect="k_hist")  # fewer steps than values: its own plan
    np.testing.assert_array_equal(third["k_hist"], first["k_hist"][:2])


def test_program_scope_restores_everything_after_an_error(kv):
    """The scope is x64 and the device; the matmul precision is the lowering's own field (no
    context variable to set or restore)."""
    import jax
    with pytest.raises(RuntimeError, match="inside"):
        with kv.scope():
            assert jax.dtypes.canonicalize_dtype(np.int64) == np.int64
            assert kv.lowering.precision == kv.precision
            raise RuntimeError("inside")
    assert jax.dtypes.canonicalize_dtype(np.int64) == np.int32
    assert kv.lowering.precision == kv.precision


def test_pure_step_and_check(kv):
    d = kv.bound.shape("q")[0]
    state = kv.init_state()
    assert isinstance(state, StepState) and set(state.vars) == {"t"} and set(state.caches) == {"K"}
    for k in range(5):
        state, _ = kv.step(state, q=np.full(d, k, np.float32))
    with pytest.raises(OiError, match="is past its fixed size 4"):
        kv.check(state)
    with pytest.raises(OiError, match=rf"input q: expected shape \[{d}\]"):
        kv.step(kv.init_state(), q=np.zeros(d + 1, np.float32))
    for bad in ({"t": 0}, None):  # an AttributeError deep in the step before
        with pytest.raises(OiError, match=rf"step: state must be a StepState .*got {type(bad).__name__}"):
            kv.step(bad, q=np.zeros(d, np.float32))


def test_sizes_are_whole_numbers_in_a_dict():
    """`sizes=` of `oi2jax.compile` and `Program.rebound`: a float, bool or string size was taken as
    it converted, a negative one failed in NumPy, a list of pairs was an AttributeError."""
    graph, model = EXAMPLES / "mlp_regression.oi", EXAMPLES / "mlp_regression.oinf"
    for sizes, message in (({"B": "4"}, "size B must be a whole number >= 0, got '4'"),
                           ({"B": 4.0}, "size B must be a whole number >= 0, got 4.0"),
                           ({"B": True}, "size B must be a whole number >= 0, got True"),
                           ({"B": -1}, "size B must be a whole number >= 0, got -1"),
                           ([("B", 4)], r"sizes: expected a dict \{name: int\}, got list"),
                           ({4: 4}, "sizes: a size name is a string, got 4")):
        with pytest.raises(OiError, match=message):
            oi2jax.compile(graph, model=model, sizes=sizes)
    prog = oi2jax.compile(graph, model=model, sizes={"B": np.int64(2)})
    assert prog.bound.sizes["B"] == 2
    with pytest.raises(OiError, match="size B must be a whole number >= 0, got 2.5"):
        prog.rebound({"B": 2.5})


def test_pure_step_called_eagerly_again_takes_the_hot_path_with_the_same_checks(kv):
    """`Program.step` called eagerly with device arrays runs, from its second call, an executable
    compiled ahead of time: the same values, the same messages, and still a pure function
    that composes with `jax.jit`."""
    import jax
    import jax.numpy as jnp
    d, zero, qs, dev, (wrong,) = kv_device_tokens(kv, 5, 7, lambda d: np.zeros(d + 1, np.float32))
    state = kv.init_state()
    general = kv.general_steps
    for k in range(4):
        state, out = kv.step(state, q=dev[k])
        np.testing.assert_array_equal(np.asarray(out["k_hist"]), k_hist_after(qs, k, zero))
    assert kv.general_steps - general <= 1  # from the second call on: the hot path
    kv.check(state)
    with pytest.raises(OiError, match=rf"input q: expected shape \[{d}\], got \[{d + 1}\]"):
        kv.step(state, q=wrong)
    new, _ = kv.step(state, q=dev[4])  # overflows K: recorded, not raised
    with pytest.raises(OiError, match="this state was already used by a step"):
        kv.step(state, q=dev[4])
    with pytest.raises(OiError, match="is past its fixed size 4"):
        kv.check(new)
    np.testing.assert_array_equal(kv.export_state(new)["K"], qs[:4] + zero)
    # under jax.jit the inputs are traced: the general path, the same step
    state = kv.init_state()
    _, out = jax.jit(lambda s, q: kv.step(s, q=q))(state, jnp.asarray(qs[0]))
    np.testing.assert_array_equal(np.asarray(out["k_hist"])[0], qs[0] + zero)


def test_pure_step_of_growable_graph_says_to_use_a_session():
    grow_prog = oi2jax.compile(GROW_SOURCE, sizes={"D": D})  # fresh: capacity 4
    state = grow_prog.init_state()
    for k in range(5):
        state, _ = grow_prog.step(state, x=np.full(D, k, np.float32))
    with pytest.raises(OiError, match="needs more capacity"):
        grow_prog.check(state)


def test_bookkeeping_never_collides_with_user_names():
    src = """\
dynamic { x: f32[2]; }
persistent { __err: i32 @init(5); __grow: i32 @init(7); __steps: i32 @init(100); }
block entry {
    cache.increment __err;
    return;
}
"""
    prog = oi2jax.compile(src)
    out = prog.run({"x": np.zeros(2, np.float32)}, steps=3)
    assert int(out["__err"]) == 8 and int(out["__grow"]) == 7 and int(out["__steps"]) == 100


def test_session_of_yield_await_graph_equals_the_driver():
    """A session steps a yield/await graph with the fused kernels (the driver runs `prog.run`, and
    a session's steps only where it places consumers on other devices): same values."""
    prog = oi2jax.compile(EXAMPLES / "streaming_pipeline.oi", model=EXAMPLES / "streaming_pipeline.oinf")
    shape = prog.bound.shape("x")
    xs = np.random.default_rng(6).standard_normal((3,) + shape).astype(np.float32)
    sess = prog.session()
    h2 = [np.asarray(sess.step(x=x)["h2"]) for x in xs]
    np.testing.assert_array_equal(np.stack(h2), np.clip(xs, 0, 6))
    fused = prog.session().run({"x": xs}, collect=("h2", "h"))
    np.testing.assert_array_equal(fused["h2"], np.stack(h2))
    np.testing.assert_array_equal(fused["x"], sess.read("x"))
    np.testing.assert_array_equal(fused["h"][-1], sess.read("h"))
    driven = prog.run({"x": xs})  # the host driver, one step per input
    assert prog.driver.last_order  # the driver ran kernels
    for name in ("x", "h", "h2"):
        np.testing.assert_array_equal(driven[name], sess.read(name), err_msg=name)


def test_cli_inputs_per_step_collect_and_state_files(capsys, tmp_path):
    graph = tmp_path / "g.oi"
    graph.write_text(GROW_SOURCE)
    xs = tokens(10, D, seed=7)
    np.savez(tmp_path / "first.npz", x=xs[:6])
    np.savez(tmp_path / "second.npz", x=xs[6:])
    code, _, err = run_cli(capsys, "run", graph, "--size", f"D={D}", "--inputs-per-step", tmp_path / "first.npz",
                           "--collect", "last", "--out", tmp_path / "o1.npz", "--state-out", tmp_path / "s.npz",
                           "--quiet")
    assert code == 0, err
    with np.load(tmp_path / "o1.npz") as o1:
        np.testing.assert_array_equal(o1["last"], xs[:6])  # stacked [6, D]
        np.testing.assert_array_equal(o1["A"], xs[:6])
        assert int(o1["t"]) == 6
    code, _, err = run_cli(capsys, "run", graph, "--size", f"D={D}", "--inputs-per-step", tmp_path / "second.npz",
                           "--state-in", tmp_path / "s.npz", "--out", tmp_path / "o2.npz", "--quiet")
    assert code == 0, err
    whole = oi2jax.compile(GROW_SOURCE, sizes={"D": D}).run({"x": xs}, steps=None)
    with np.load(tmp_path / "o2.npz") as o2:
        assert sorted(o2.files) == sorted(whole)
        for name in whole:
            np.testing.assert_array_equal(o2[name], whole[name], err_msg=name)
    # a per-step file without the step axis, too many steps, an unknown collect name
    np.savez(tmp_path / "flat.npz", x=xs[0])
    code, _, err = run_cli(capsys, "run", graph, "--size", f"D={D}", "--inputs-per-step", tmp_path / "flat.npz")
    assert code == 1 and f"--inputs-per-step x: expected a leading step axis [N, {D}], got shape [{D}]" in err
    code, _, err = run_cli(capsys, "run", graph, "--size", f"D={D}", "--inputs-per-step", tmp_path / "second.npz",
                           "--steps", "9")
    assert code == 1 and "9 steps asked for, but the per-step inputs hold 4 values" in err
    code, _, err = run_cli(capsys, "run", graph, "--size", f"D={D}", "--inputs-per-step", tmp_path / "second.npz",
                           "--collect", "lst")
    assert code == 1 and "collect: unknown variable lst" in err
    np.save(tmp_path / "one.npy", xs[0])  # an .npy as --state-in: named, not NumPy's context-manager error
    code, _, err = run_cli(capsys, "run", graph, "--size", f"D={D}", "--inputs-per-step", tmp_path / "second.npz",
                           "--state-in", tmp_path / "one.npy")
    assert code == 1 and err == (f"error: {tmp_path / 'one.npy'}: not a state file (.npz): it holds one array "
                                 f"(float32[{D}]), not the variables a state file holds (write one with --state-out "
                                 f"/ Session.save)\n"), err


def test_cli_run_overflow_names_the_step(capsys, tmp_path):
    np.savez(tmp_path / "qs.npz", q=tokens(6, 16, seed=8))
    code, _, err = run_cli(capsys, "run", KV_SOURCE, "--inputs-per-step", tmp_path / "qs.npz",
                           "--out", tmp_path / "o.npz")
    assert code == 1
    assert "kv_cache_decode.oi:23:22: error: dimension 0 of K: index 4 is past its fixed size 4 (in step 5)" in err
    # nothing lost (issue 40 item 5): --out holds what the steps before the failing one produced
    assert "note: wrote" in err and "every variable as the failing step 5 left it" in err, err
    code, _, err = run_cli(capsys, "run", KV_SOURCE, "--inputs-per-step", tmp_path / "qs.npz", "--steps", "4",
                           "--out", tmp_path / "o4.npz", "--quiet")
    assert code == 0, err
    with np.load(tmp_path / "o.npz") as partial, np.load(tmp_path / "o4.npz") as four:
        assert partial["K"].tobytes() == four["K"].tobytes()  # the failing write skipped, never clamped


def test_collected_stacks_too_large_to_hold_are_refused_before_the_run(capsys, tmp_path):
    """`steps=10**12` collecting an f32[2]: its rows (a power of two >= the steps) would be 8 TiB.
    Refused with the bytes and the limit before anything runs or is allocated (it reached XLA's
    allocator inside the run: RESOURCE_EXHAUSTED), in the API and in the CLI; the session is
    untouched and a run of its size works."""
    src = PLAIN_FAIL_SOURCE
    sess = oi2jax.compile(src).session()
    x = np.ones(2, np.float32)
    with pytest.raises(OiError, match=r"run: collecting acc over 1000000000000 steps needs 8796093022208 bytes for "
                                      r"the rows it collects \(1099511627776 rows.*too large to allocate.*run fewer "
                                      r"steps at a time"):
        sess.run({"n": np.float32(1), "x": x}, steps=10**12, collect="acc")
    assert sess.steps == 0
    assert len(sess.run({"n": np.float32(1), "x": x}, steps=3, collect="acc")["acc"]) == 3
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "n.npy", np.float32(1))
    (tmp_path / "g.oi").write_text(src)
    code, _, err = run_cli(capsys, "run", tmp_path / "g.oi", "--input", f"x={tmp_path / 'x.npy'}", "--input", f"n={tmp_path / 'n.npy'}",
                           "--steps", "1000000000000", "--collect", "acc", "--quiet", "--out", tmp_path / "o.npz")
    assert code == 1 and "error: run: collecting acc over 1000000000000 steps needs" in err, err
    assert not (tmp_path / "o.npz").exists()


def test_a_calls_collected_stack_holds_its_own_rows_not_the_runs(monkeypatch):
    """A run of many fused calls (streaming, a progress callback) gives each call a stack of its
    own rows (runargs.call_limit), not the whole run's: 2000 steps in calls of at most 8 use
    64-row stacks, where each call allocated, zeroed and fetched 2048 rows before (a run of 8192
    steps collecting 4096 floats, in calls of 64: 20.4 s before, 0.48 s after). The rows are
    the same as one call's, bit for bit."""
    from oi2jax.runtime.kernels import StepKernels
    sess = oi2jax.compile(PLAIN_FAIL_SOURCE).session()
    x = np.array([0.5, 1.0], np.float32)
    whole = sess.run({"n": np.float32(1), "x": x}, steps=2000, collect="y")["y"]
    lengths, multi = [], StepKernels.multi

    def recording(self, *args, **kwargs):
        res = multi(self, *args, **kwargs)
        lengths.extend(len(v) for v in res.stacked.values())
        return res
    monkeypatch.setattr(StepKernels, "multi", recording)
    again = oi2jax.compile(PLAIN_FAIL_SOURCE).session()
    streamed = again.run({"n": np.float32(1), "x": x}, steps=2000, collect="y", every=8)["y"]
    assert set(lengths) == {64} and len(lengths) >= 2000 // 8
    assert streamed.tobytes() == whole.tobytes()


def test_out_members_named_like_numpy_keywords(capsys, tmp_path):
    graph = tmp_path / "g.oi"
    graph.write_text("dynamic { file: f32[2]; allow_pickle: f32[2]; }\nblock entry { return; }\n")
    np.save(tmp_path / "a.npy", np.array([1.0, 2.0], np.float32))
    code, _, err = run_cli(capsys, "run", graph, "--input", f"file={tmp_path / 'a.npy'}",
                           "--input", f"allow_pickle={tmp_path / 'a.npy'}", "--out", tmp_path / "res", "--quiet")
    assert code == 0, err
    assert (tmp_path / "res").exists() and not (tmp_path / "res.npz").exists()  # exactly the path given
    with np.load(tmp_path / "res") as out:
        assert sorted(out.files) == ["allow_pickle", "file"]
        np.testing.assert_array_equal(out["file"], [1.0, 2.0])


def test_out_to_a_directory_is_refused_and_nothing_is_written(capsys, tmp_path):
    graph = tmp_path / "g.oi"
    graph.write_text("dynamic { x: f32[2]; }\nblock entry { return; }\n")
    (tmp_path / "d").mkdir()
    code, _, err = run_cli(capsys, "run", graph, "--out", tmp_path / "d", "--quiet")
    assert code == 1 and err.strip() == f"error: {tmp_path / 'd'}: is a directory"
    assert not (tmp_path / "d.npz").exists() and list((tmp_path / "d").iterdir()) == []
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_fifo_as_model_or_graph_is_refused_not_a_hang(capsys, tmp_path):
    """Issue 19 item 9: open() on a FIFO blocks forever; non-regular files are refused first."""
    import os
    fifo = tmp_path / "pipe.oinf"
    os.mkfifo(fifo)
    graph = tmp_path / "g.oi"
    graph.write_text("dynamic { x: f32[2]; }\nblock entry { return; }\n")
    code, _, err = run_cli(capsys, "check", graph, "--model", fifo)
    assert code == 1 and err.strip() == f"error: {fifo}: not a regular file (a pipe or device cannot be a model file)"
    code, _, err = run_cli(capsys, "check", fifo)
    assert code == 1 and "not a regular file (a pipe or device cannot be a graph)" in err


MISSING = ("missing input x: the graph reads it and it has no model tensor or @init; give it "
           "(--input NAME=FILE.npy, or the inputs dict), or ask for OpenInfer's zero-filled default with "
           "--zero-missing-inputs (zero_missing_inputs=True)")


def test_missing_inputs_are_errors_unless_zeros_are_asked_for(capsys, tmp_path):
    """Issue 17: `oi2jax run examples/mlp_regression.oi` with no --input computed from x = 0."""
    graph = EXAMPLES / "mlp_regression.oi"
    code, _, err = run_cli(capsys, "run", graph, "--quiet")
    assert code == 1 and err.strip() == f"error: {MISSING}"
    code, _, err = run_cli(capsys, "run", graph, "--quiet", "--interpret")
    assert code == 1 and err.strip() == f"error: {MISSING}"
    code, _, err = run_cli(capsys, "run", graph, "--quiet", "--zero-missing-inputs", "--out", tmp_path / "o.npz")
    assert code == 0, err
    with np.load(tmp_path / "o.npz") as out:
        np.testing.assert_array_equal(out["x"], np.zeros((4, 16), np.float32))
    with pytest.raises(OiError) as info:  # the same error every way (conftest.run_both)
        run_both(graph, {}, model=EXAMPLES / "mlp_regression.oinf")
    assert str(info.value) == f"error: {MISSING}"
    prog = oi2jax.compile(graph, model=EXAMPLES / "mlp_regression.oinf")
    with pytest.raises(OiError, match="missing input x"):
        prog.session().step()
    with pytest.raises(OiError, match="missing input x"):
        prog.step(prog.init_state())
    zeros = run_both(graph, {}, model=EXAMPLES / "mlp_regression.oinf", zero_missing_inputs=True)
    np.testing.assert_array_equal(zeros["x"], np.zeros((4, 16), np.float32))  # x = 0, as asked
    # an input with a default of its own (@init) or one the graph never reads is not missing
    src = "dynamic { a: f32[2] @init(1.5); b: f32[2]; }\nvolatile { y: f32[2]; }\nblock entry { op relu(a) >> y; return; }\n"
    np.testing.assert_array_equal(oi2jax.compile(src).run({})["y"], [1.5, 1.5])


@pytest.mark.parametrize("cond", [False, True])
@pytest.mark.parametrize("ready", [False, True])
def test_step_after_an_unreported_error_changes_nothing(cond, ready):
    """When step k is done by the next call, the session reads its outcome first and raises
    before dispatching anything (`ready`). Otherwise step k+1 is dispatched before step k's error
    is read; it must leave the state exactly as step k left it, whether the kernel skips it with
    a select (small plain state) or a cond."""
    from oi2jax.runtime.session import DeviceOutcomes
    prog = oi2jax.compile(PLAIN_FAIL_LARGE_SOURCE if cond else PLAIN_FAIL_SOURCE)
    assert prog.executable.kernels.select_skip is not cond
    ns = np.array([1, 2, np.inf, 1, 3], np.float32)
    xs = np.arange(10, dtype=np.float32).reshape(5, 2) + 1
    one = prog.session(max_unchecked=1)  # K=1: step k's error raises at the latest from call k+1

    class Steered(DeviceOutcomes):  # the documented hook: every step found finished, or none
        @staticmethod
        def ready(flags) -> bool:
            return ready

    one.outcomes = Steered
    one.step(n=ns[0], x=xs[0])
    one.step(n=ns[1], x=xs[1])
    one.step(n=ns[2], x=xs[2])  # fails; reported by the next call, which must do nothing
    with pytest.raises(OiError, match=r"loop bound n is not finite \(in step 3\)"):
        one.step(n=ns[3], x=xs[3])
    assert one.steps == 3
    fused = prog.session()
    with pytest.raises(OiError, match=r"\(in step 3\)"):
        fused.run({"n": ns, "x": xs})
    for name in ("acc", "count"):
        np.testing.assert_array_equal(one.read(name), fused.read(name), err_msg=name)
    np.testing.assert_array_equal(one.read("acc"), xs[0] + 2 * xs[1])  # step 3's loop was skipped
    assert one.read("count") == 3
    for k in (3, 4):
        one.step(n=ns[k], x=xs[k])
    fused.run({"n": ns[3:], "x": xs[3:]})
    for name in ("acc", "count", "y"):
        np.testing.assert_array_equal(one.read(name), fused.read(name), err_msg=name)
    np.testing.assert_array_equal(one.read("acc"), xs[0] + 2 * xs[1] + xs[3] + 3 * xs[4])


def test_steps_without_runtime_guards_read_nothing_back():
    """A graph whose step has no runtime guard cannot fail: its session steps return no flags and
    never look at a step's outcome; values equal the fused run bit for bit."""
    import jax

    class Never:  # the documented hook `Session.outcomes`: nothing may be asked of it
        @staticmethod
        def ready(flags):
            raise AssertionError("a step without guards has no outcome to read")

        read = ready

    prog = oi2jax.compile(EXAMPLES / "online_weight_update.oi", model=EXAMPLES / "online_weight_update.oinf")
    rng = np.random.default_rng(5)
    n = 12
    xs = rng.standard_normal((n,) + np.shape(prog.defaults["x"])).astype(np.float32)
    deltas = rng.standard_normal((n,) + np.shape(prog.defaults["delta"])).astype(np.float32)
    with prog.scope():
        dev = [(jax.device_put(xs[k]), jax.device_put(deltas[k])) for k in range(n)]
    sess = prog.session()
    sess.outcomes = Never
    for k in range(n):
        sess.step(x=dev[k][0], delta=dev[k][1])
    sess.check()
    assert sess.steps == n
    ref = prog.session()
    ref.run({"x": xs, "delta": deltas})
    for name in ("W", "w", "y", "x", "delta"):
        np.testing.assert_array_equal(sess.read(name), ref.read(name), err_msg=name)
    np.testing.assert_allclose(sess.read("W"), deltas.sum(0), rtol=1e-5, atol=1e-5)
    # the fused loop of a guard-free graph runs exactly n steps and passes the guards through
    before = ref.state.guards.flags
    ref.run({"x": xs[:5], "delta": deltas[:5]})
    assert ref.steps == n + 5
    np.testing.assert_array_equal(np.asarray(ref.state.guards.flags), np.zeros(2, np.int64))
    assert before.is_deleted()  # donated to the loop, which returned the same guards
    np.testing.assert_allclose(ref.read("W"), deltas.sum(0) + deltas[:5].sum(0), rtol=1e-5, atol=1e-5)


def test_a_session_let_go_with_an_unreported_error_reports_it():
    """`Session.step` returns before its step's outcome is read (docs/decode.md, "When errors
    surface"); a session let go, or still open when the interpreter exits, before anything read
    it reports the error as a RuntimeWarning instead of losing it (a script that ends right after
    a failing `step` exited 0 in silence)."""
    import gc
    x = np.ones(2, np.float32)
    sess = oi2jax.compile(PLAIN_FAIL_SOURCE).session()
    sess.step(n=np.float32(np.inf), x=x)
    with pytest.warns(RuntimeWarning, match=r"(?s)of this process was never reported \(the session was let go.*in step 1\)"):
        del sess
        gc.collect()
    fine = oi2jax.compile(PLAIN_FAIL_SOURCE).session()
    fine.step(n=np.float32(2), x=x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del fine  # no error: nothing said
        gc.collect()
    # at exit: every session's error, each its own warning (two alike are two, numbered), also where
    # warnings are errors (the first raised out of the exit handler and hid the others)
    script = (f"import numpy as np, oi2jax\nprog = oi2jax.compile({PLAIN_FAIL_SOURCE!r})\n"
              "a, b = prog.session(), prog.session()\n"
              "for s in (a, b):\n    s.step(n=np.float32(np.inf), x=np.ones(2, np.float32))\nprint('stepped')\n")
    for flags in ([], ["-W", "error::RuntimeWarning"]):
        proc = subprocess.run([sys.executable, *flags, "-c", script], capture_output=True, text=True, timeout=120)
        assert proc.stdout == "stepped\n", proc.stderr
        found = re.findall(r"RuntimeWarning: the runtime error of session #(\d+) of this process was never reported "
                           r"\(the interpreter exits", proc.stderr)
        assert sorted(found) == ["1", "2"], (flags, proc.stderr)
        assert proc.stderr.count("(in step 1)") == 2 and "Traceback" not in proc.stderr, proc.stderr


def test_a_failed_cli_run_shows_the_collected_rows_not_the_failing_steps_values(capsys, tmp_path):
    """A run whose step fails printed every volatile value of the failing step as if it were the
    result (an embedding row of a clamped id in the probe), and its note said `--out` held "the
    steps before the failing step". Now stdout shows only the collected rows (the steps before
    it), a note names what is not shown and why, and the note on --out says which is which."""
    graph = tmp_path / "g.oi"
    graph.write_text(PLAIN_FAIL_SOURCE)
    np.save(tmp_path / "x.npy", np.ones(2, np.float32))
    np.savez(tmp_path / "n.npz", n=np.array([1, 2, np.inf, 1], np.float32))
    base = ["run", graph, "--input", f"x={tmp_path / 'x.npy'}", "--inputs-per-step", tmp_path / "n.npz"]
    code, out, err = run_cli(capsys, *base, "--out", tmp_path / "o.npz")
    assert code == 1 and "(in step 3)" in err, err
    assert out == "", out  # nothing collected: no value of the failing step shown as a result
    assert "note: wrote" in err and "every variable as the failing step 3 left it" in err, err
    assert "note: not shown: n, x, y, acc, count, as the failing step 3 left them" in err, err
    code, out, err = run_cli(capsys, *base, "--collect", "acc")
    assert code == 1 and out == "acc: float32[2, 2]\n[[1. 1.]\n [3. 3.]]\n", out
    assert "note: not shown: n, x, y, count, as the failing step 3 left them" in err, err
    code, out, err = run_cli(capsys, *base, "--show", "y", "--out", tmp_path / "o.npz")
    assert code == 1 and out.startswith("y: float32[2]"), out
    assert "note: shown as the failing step 3 left them" in err and ": y\n" in err, err
    np.save(tmp_path / "inf.npy", np.float32(np.inf))  # the interpreter: its variables are the step before's
    code, out, err = run_cli(capsys, "run", graph, "--input", f"x={tmp_path / 'x.npy'}", "--input",
                             f"n={tmp_path / 'inf.npy'}", "--interpret", "--out", tmp_path / "i.npz")
    assert code == 1 and "every variable as it was before the failing step 1, the inputs given to it excepted (the interpreter " \
        "stops" in err, err
    # probe (ops) 8: it printed y's never-computed zeros as the result; now what a compiled run prints
    assert out == "" and "note: not shown: n, x, y, acc, count, as they were before the failing step 1 (the " \
        "interpreter stops at the failing node); --show NAME,... to see them" in err, (out, err)


def test_a_session_whose_state_is_handed_to_another_is_closed_saying_so(kv):
    """`prog.session(state=sess.state)` (docs/decode.md's hand-over): the new session's step
    donates the buffers; the old one's next use raised JAX's "Array has been deleted"."""
    d = kv.bound.shape("q")[0]
    q = np.ones(d, np.float32)
    a = kv.session()
    a.step(q=q)
    b = kv.session(state=a.state)
    b.step(q=q)
    for use in (lambda: a.step(q=q), lambda: a.read("t"), lambda: a.values(), lambda: a.state):
        with pytest.raises(OiError, match=r"this session is closed: its state was handed to another session "
                                          r"\(Program.session\(state=sess.state\)\), which steps it now"):
            use()
    assert int(b.read("t")) == 2
    c = kv.session(state=b.values())  # a copy: both go on
    c.step(q=q)
    b.step(q=q)
    assert int(b.read("t")) == int(c.read("t")) == 3


def test_a_state_of_another_graph_or_other_sizes_is_named(kv):
    """(helper probe) a StepState of the same graph at other sizes failed inside the step in JAX's
    words ("slice_sizes must be less than or equal to operand shape"), one of another graph with
    "'NoneType' object is not subscriptable"."""
    src = GROW_SOURCE.replace("t: i32 @init(0);", "t: i32 @init(0);\n    acc: f32[D];")
    p4, p8 = oi2jax.compile(src, sizes={"D": 4}), oi2jax.compile(src, sizes={"D": 8})
    other_sizes = "state: not this program's: its acc is float32[4], where this program's is f32[8]"
    with pytest.raises(OiError, match=re.escape(other_sizes)):
        p8.step(p4.init_state(), x=np.ones(8, np.float32))
    with pytest.raises(OiError, match=re.escape(other_sizes)):
        p8.session(state=p4.init_state())
    with pytest.raises(OiError, match=re.escape("state: not this program's: it has no acc, which this program's "
                                                "state has (a state of another graph?)")):
        p4.session(state=kv.init_state())
    sess = p8.session(state=p8.init_state())  # its own: fine, growth too
    for k in range(6):
        sess.step(x=np.full(8, k, np.float32))
    assert int(sess.read("t")) == 6
    p8.session(state=sess.state).step(x=np.ones(8, np.float32))  # a grown state handed over


def test_the_pure_step_check_and_export_state_name_a_foreign_or_used_state(kv):
    """(runtime probe) `prog.step` of another graph's StepState raised a bare KeyError from the
    state's flattening (only JAX's RuntimeError/ValueError/TypeError were explained), as did
    `export_state`; `check` and `export_state` of a state a step took over raised JAX's "Array has
    been deleted" (checking the old state instead of the one the step returned)."""
    other = oi2jax.compile(EXAMPLES / "cache_window_slice.oi", model=EXAMPLES / "cache_window_slice.oinf")
    q = np.ones(kv.bound.shape("q"), np.float32)
    foreign = "state: not this program's: it has no "
    with pytest.raises(OiError, match=re.escape(foreign)):
        kv.step(other.init_state(), q=q)
    with pytest.raises(OiError, match=re.escape(foreign)):
        kv.export_state(other.init_state())
    state = kv.init_state()
    new, _ = kv.step(state, q=q)
    used = r"this state was already used by a step, which took over \(donated\) its buffers: check \(or read\) the " \
           r"state that step returned"
    with pytest.raises(OiError, match=used):
        kv.check(state)
    with pytest.raises(OiError, match=used):
        kv.export_state(state)
    kv.check(new)
    assert int(kv.export_state(new)["t"]) == 1


def test_a_run_of_zero_steps_reports_its_inputs_as_given():
    """(helper probe) compiled, `run(steps=0)` showed a given input as zeros; the interpreter, as
    docs/semantics.md item 4 says, shows it as given (a per-step input: its first value)."""
    src = ("dynamic { x: f32[2]; }\nvolatile { y: f32[2]; }\nblock entry { op add(x, x) >> y; return; }\n")
    yielding = ("dynamic { x: f32[2]; }\nvolatile { y: f32[2]; h: f32[2]; }\n"
                "block entry { op add(x, x) >> y; yield y; await y; return; }\n"
                "block c { await y; op add(y, y) >> h; yield y; }\n")
    x = np.array([1.0, 2.0], np.float32)
    for text in (src, yielding):
        for kw in ({}, {"mode": "interpret"}, {"yield_mode": "fused"} if text is yielding else {}):
            prog = oi2jax.compile(text, **kw)
            for given in (x, np.stack([x, 3 * x])):
                out = prog.run({"x": given}, steps=0)
                np.testing.assert_array_equal(out["x"], x)
                np.testing.assert_array_equal(out["y"], [0.0, 0.0])


def test_a_state_with_fewer_entries_of_an_all_fixed_table_is_refused():
    """Runtime probe 7: `{"H": 2 rows}` for a table `@fixed(i=6)` was taken, the 4 rows not given
    silently the fill; an all-@fixed table holds its fixed sizes (a saved state gives them all)."""
    prog = oi2jax.compile("dynamic { x: i32[1]; }\npersistent { t: i32 @init(0); H(i): i32[1] @table @fixed(i=6); }\n"
                          "block entry { cache.write x >> H[t]; cache.increment t; return; }\n", model=False)
    sess = prog.session()
    sess.step(x=np.array([3], np.int32))
    whole = sess.values()
    assert whole["H"].shape == (6, 1)
    np.testing.assert_array_equal(prog.session(state=whole).values()["H"], whole["H"])  # round trip
    with pytest.raises(OiError, match=r"state: H: every index of this table is @fixed, so it holds \[6\] entries "
                                      r"\(as a state exported or saved gives it\), got \[2\]; give every entry"):
        prog.session(state={**whole, "H": whole["H"][:2]})


# a table written sparsely in step 1 (T[0, 3], T[2, 0]: sizes (3, 4), two entries) and reset by
# prefix in step 2 (T[2]: SPEC §4.5 recomputes the sizes from the entries left, (1, 4))
SPARSE_RESET_SOURCE = """\
dynamic { x: f32; ph: i32; }
volatile { w: f32[1, 4]; }
persistent { T(i, j): f32 @table @init(3.0); }
block entry {
    branch ph second first;
    return;
}
block first { cache.write x >> T[0, 3]; cache.write x >> T[2, 0]; return; }
block second { cache.reset T[2]; cache.read T[] >> w; return; }
"""


def test_state_file_keeps_which_table_entries_exist(tmp_path):
    """A saved state keeps which entries of a growable table exist (`T#present`): resumed, a
    prefix `cache.reset` shrinks the table as the unbroken run does. Before, every entry within
    the sizes came back as written: the table stayed (2, 4) and the read of [1, 4] failed."""
    path = tmp_path / "sparse.oi"
    path.write_text(SPARSE_RESET_SOURCE)
    expected = np.array([[3.0, 3.0, 3.0, 1.0]], np.float32)
    prog = oi2jax.compile(path)
    straight = prog.session()
    straight.step(x=np.float32(1), ph=np.int32(0))
    straight.step(x=np.float32(1), ph=np.int32(1))
    np.testing.assert_array_equal(straight.read("T"), expected)
    first = prog.session()
    first.step(x=np.float32(1), ph=np.int32(0))
    first.save(tmp_path / "s.npz")
    saved = np.load(tmp_path / "s.npz")
    np.testing.assert_array_equal(saved["T#present"], [[False, False, False, True], [False] * 4,
                                                       [True, False, False, False]])
    resumed = prog.session(state=tmp_path / "s.npz")
    out = resumed.step(x=np.float32(1), ph=np.int32(1))
    np.testing.assert_array_equal(resumed.read("T"), expected)
    np.testing.assert_array_equal(out["w"], expected)
    # the interpreter, run straight through, agrees
    interp = oi2jax.compile(path, mode="interpret").run({"x": np.float32(1), "ph": np.int32(0)})
    np.testing.assert_array_equal(interp["T"], [[3.0, 3.0, 3.0, 1.0], [3.0] * 4, [1.0, 3.0, 3.0, 3.0]])
    # the CLI's --state-out / --state-in: the same
    x = tmp_path / "x.npy"
    np.save(x, np.float32(1))
    for ph, extra in ((0, ["--state-out", tmp_path / "c.npz"]), (1, ["--state-in", tmp_path / "c.npz",
                                                                     "--out", tmp_path / "o.npz"])):
        np.save(tmp_path / "ph.npy", np.int32(ph))
        code = subprocess.run([sys.executable, "-m", "oi2jax", "run", path, "--no-model", "--input", f"x={x}",
                               "--input", f"ph={tmp_path / 'ph.npy'}", "--quiet", *extra],
                              capture_output=True, text=True)
        assert code.returncode == 0, code.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["T"], expected)
    # a mask that does not fit its table is refused, naming it
    bad = dict(np.load(tmp_path / "s.npz"))
    bad["T#present"] = bad["T#present"][:2]
    with pytest.raises(OiError, match=r"T#present: expected bool\[3, 4\]"):
        prog.session(state=bad)
    del bad["T"]
    with pytest.raises(OiError, match="T#present is given without the table T"):
        prog.session(state=bad)
