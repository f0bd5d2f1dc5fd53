"""The runtime's Executable (issue 38): one generation of a compiled program, immutable; a
growth builds the next one, and the program, its sessions and its driver move to it. Its step
outcome record reads the one status layout."""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax
from oi2jax.runtime.kernels import StepOutcome

from conftest import GROW_SOURCE


@pytest.fixture(scope="module")
def grown():
    """A program, its first executable, and the values of 10 steps that grew table A."""
    prog = oi2jax.compile(GROW_SOURCE)
    first = prog.executable
    xs = np.arange(20, dtype=np.float32).reshape(10, 2)
    sess = prog.session()
    for x in xs:
        sess.step(x=x)
    return prog, first, xs, sess


def test_growth_builds_the_next_executable_and_leaves_the_old_one_as_it_was(grown):
    prog, first, xs, sess = grown
    now = prog.executable
    assert now is not first and now.generation > first.generation == 1
    assert first.lowering.caches["A"].capacity == (4,)  # the first generation's layout, unchanged
    assert now.lowering.caches["A"].capacity[0] >= 10
    assert now.consts is first.consts and now.defaults is first.defaults  # placed once
    assert prog.generation == now.generation and prog.lowering is now.lowering
    np.testing.assert_array_equal(sess.read("A"), xs)
    with pytest.raises(AttributeError, match="Executable.grown builds the next one"):
        first.lowering = now.lowering


def test_step_outcome_reads_both_forms_of_the_one_layout():
    fine = StepOutcome.of_flags(np.zeros(3, np.int64))
    assert fine == StepOutcome(0, 0, 1, (0,)) and not fine.undone
    assert StepOutcome.of_flags(np.array([2, 7, 0], np.int64)) == StepOutcome(2, 7, 1, (0,))
    undone = StepOutcome.of_flags(np.array([0, 0, 5], np.int64))
    assert undone.undone and undone.applied == 0 and undone.grow == (5,)
    assert StepOutcome.of_status(np.array([1, 4, 3, 0, 8], np.int64)) == StepOutcome(1, 4, 3, (0, 8))


def test_pages_are_given_back_after_a_big_placement_or_compile_only(monkeypatch):
    """`return_freed_memory` (malloc_trim: milliseconds in a large heap) runs after placing a
    model's worth of constants or a long XLA compilation (placement.TRIM_AFTER_*), not after a
    small program's; with the thresholds at zero, after both."""
    from oi2jax.runtime import kernels, program
    calls = []
    monkeypatch.setattr(program, "return_freed_memory", lambda: calls.append("placed"))
    monkeypatch.setattr(kernels, "return_freed_memory", lambda: calls.append("compiled"))
    source = "dynamic { x: f32[4]; } volatile { y: f32[4]; } block entry { op add(x, x) >> y; return; }"
    # "long" is a time: a loaded machine may take the default 0.25 s over this program's compile
    monkeypatch.setattr(kernels, "TRIM_AFTER_SECONDS", 600.0)
    oi2jax.compile(source).run({"x": np.ones(4, np.float32)})
    assert calls == []
    monkeypatch.setattr(program, "TRIM_AFTER_BYTES", 0)
    monkeypatch.setattr(kernels, "TRIM_AFTER_SECONDS", 0.0)
    out = oi2jax.compile(source + " ").run({"x": np.ones(4, np.float32)})
    np.testing.assert_array_equal(out["y"], np.full(4, 2, np.float32))
    assert calls[0] == "placed" and "compiled" in calls
