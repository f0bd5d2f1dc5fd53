"""The fused loop's GPU form on the CPU: several steps per reading of the loop's condition
(runtime/kernels.py `STEPS_PER_CHECK`; on a GPU 8). Each step after the loop's end (the step
budget, a stop id, an error, a growth) inside such a group is masked: it changes nothing. So a
fused run equals a host loop of `Session.step` bit for bit, as the CPU's one-step form does, for
every place the end can fall in a group."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError
from oi2jax.runtime import kernels

from conftest import device_platform
from test_session import D, GROW_AND_FAIL_SOURCE, check_fused_equals_steps_with_growth_and_error, tokens
from test_stops import CYCLE, SOURCE, T, host_loop


@pytest.fixture(params=[2, 3, 8], ids=lambda k: f"{k} per check")
def per_check(request, monkeypatch):
    """The steps per check of the platform the tests run on (a GPU's 8 too, when one runs them)."""
    monkeypatch.setitem(kernels.STEPS_PER_CHECK, device_platform(), request.param)
    return request.param


def test_the_platform_table_gives_the_cpu_one_step_per_check():
    assert kernels.STEPS_PER_CHECK.get("cpu", 1) == 1 and kernels.STEPS_PER_CHECK["gpu"] > 1


@pytest.mark.parametrize("stop,steps", [({"next": [9, 77]}, 5), ({"next": [4]}, 3), ({"next": [1]}, 5),
                                        ({"next": [77]}, 7)])
def test_a_stop_id_ends_the_run_where_a_host_loop_does(per_check, stop, steps):
    prog = oi2jax.compile(SOURCE, model=False, sizes={"T": T + 4})
    sess = prog.session()
    assert prog.executable.kernels.steps_per_check == per_check
    out = sess.run(steps=steps, feedback={"token": "next"}, collect="next", stop=stop)
    want = host_loop(prog, steps, stop)
    assert out["next"].ravel().tolist() == want
    assert sess.steps == len(want) and int(out["t"]) == len(want)  # no masked step counted or written
    assert out["H"].ravel().tolist()[:len(want)] == [1] + want[:-1]
    assert out["H"].ravel().tolist()[len(want):] == [0] * (T + 4 - len(want))
    assert sess.last_run.stopped == (want[-1] in stop["next"])


def test_past_the_capacity_the_steps_before_the_failing_one_are_kept(per_check):
    prog = oi2jax.compile(SOURCE, model=False, sizes={"T": T})
    sess = prog.session()
    with pytest.raises(OiError, match=r"index 6 is past its fixed size 6 \(in step 7\)") as info:
        sess.run(steps=10, feedback={"token": "next"}, collect="next")
    err = info.value
    assert err.step == 7 and err.partial["next"].ravel().tolist() == (CYCLE + CYCLE)[:T]
    assert err.partial["H"].ravel().tolist() == [1] + (CYCLE + CYCLE)[:T - 1]


def test_growth_and_an_error_inside_a_group_equal_steps_bit_for_bit(per_check):
    """Step 5 grows A (that step undone, the run goes on from it after the growth), step 6 fails:
    inside a group, every value equals one `Session.step` at a time (test_session's check)."""
    check_fused_equals_steps_with_growth_and_error(oi2jax.compile(GROW_AND_FAIL_SOURCE, sizes={"D": D}),
                                                   tokens(12, D, seed=2))


def test_runs_of_every_length_collect_what_steps_do(per_check):
    """Per-step inputs and collected rows for runs that end at every place in a group."""
    prog = oi2jax.compile(SOURCE, model=False, sizes={"T": 64})
    sess = prog.session()
    tokens_in = np.arange(1, 40, dtype=np.int32).reshape(-1, 1) % 11
    done = 0
    for n in (1, 2, 3, 5, 8, 9, 11):
        out = sess.run({"token": tokens_in[done:done + n]}, collect="next")
        assert out["next"].ravel().tolist() == [(5 * int(v) + 3) % 11 for v in tokens_in[done:done + n, 0]]
        done += n
        assert sess.steps == done and int(sess.read("t")) == done
    np.testing.assert_array_equal(sess.read("H")[:done], tokens_in[:done])
    assert not sess.read("H")[done:].any()
