"""Ctrl-C and SIGTERM (issues 17, 19 item 10, 41): an interrupt is one line `error: interrupted`
and exit 130, never a traceback and never death by the signal, for `python -m oi2jax` and for the
installed `oi2jax` script (which calls `oi2jax.__main__:main`).

The exact claim, tested without timing windows:
1. importing `oi2jax.__main__` installs the handlers before anything but Python's own start-up and
   `oi2jax/__init__.py` has run (`test_only_python_start_up_runs_before_the_handler`): that is the
   whole window in which Python's default (a KeyboardInterrupt traceback) applies;
2. from the moment the handlers are installed -- which a test sees from outside, in the process's
   caught-signal mask (/proc/PID/status SigCgt gains SIGTERM, which Python alone never catches) --
   any SIGINT or SIGTERM, at whatever delay, gives the one line and 130. The tests send the signal
   only once the mask says so; the delays after that only sample different phases (importing
   JAX, compiling, running), the claim does not depend on them."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from conftest import EXAMPLES, REPO

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc/PID/status")

ENTRIES = {
    "python -m oi2jax": [sys.executable, "-m", "oi2jax"],
    # what the installed `oi2jax` script does ([project.scripts] oi2jax = "oi2jax.__main__:main")
    "oi2jax script": [sys.executable, "-c", "import sys; from oi2jax.__main__ import main; sys.exit(main())"],
}
ENV = dict(os.environ, OI2JAX_CACHE_DIR="none", PYTHONUNBUFFERED="1")


def _handlers_installed(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def _start_and_wait_for_handlers(argv) -> subprocess.Popen:
    """Start `oi2jax ARGV` and return once its interrupt handlers are installed (however loaded
    the machine: no deadline but a generous one for a process that never gets there)."""
    proc = subprocess.Popen(argv, cwd=REPO, env=ENV, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not _handlers_installed(proc.pid):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the handlers were never installed"
        time.sleep(0.002)
    return proc


def _wait_for_cpu_seconds(proc: subprocess.Popen, seconds: float) -> None:
    """Until `proc` (all its threads) has run `seconds` of CPU time: a point in its work that a
    loaded machine delays but does not move (a sleep of wall time would)."""
    tick = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + 600
    while True:
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if (int(fields[11]) + int(fields[12])) / tick >= seconds:  # utime + stime
            return
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, f"{seconds} s of CPU never reached"
        time.sleep(0.02)


def _long_run(tmp_path, out) -> list[str]:
    np.save(tmp_path / "x.npy", np.ones((4, 16), np.float32))
    return ["run", str(EXAMPLES / "mlp_regression.oi"), "--input", f"x={tmp_path / 'x.npy'}",
            "--steps", "1000000000", "--quiet", "--out", str(out)]


@pytest.mark.parametrize("entry,delay", [("python -m oi2jax", 0.0), ("oi2jax script", 0.0),
                                         ("python -m oi2jax", 0.4), ("oi2jax script", 1.2)])
def test_ctrl_c_at_any_moment_after_the_handler_is_one_line_and_130(tmp_path, entry, delay):
    """Delay 0: the signal lands while the CLI and JAX are still being imported; later ones while
    parsing, compiling or running (which, under load, is not known and does not matter)."""
    proc = _start_and_wait_for_handlers(ENTRIES[entry] + _long_run(tmp_path, tmp_path / "o.npz"))
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130 and err == "error: interrupted\n", (proc.returncode, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]


def test_an_interrupt_outside_a_catching_block_is_raised_once_one_runs(monkeypatch):
    """The window a loaded machine hit: SIGINT right after `install()`, still in `oi2jax.__main__`'s
    module body (oi2jax's own code, but no `try` around it: a traceback and exit -2). Outside a
    `catching()` block the handler records the interrupt and re-arms its timer; the timer's
    signal inside one raises KeyboardInterrupt, which that block's caller catches."""
    from oi2jax import _signals
    namespace: dict = {}
    exec(compile("import sys\nframe = sys._getframe()", os.path.join(os.path.dirname(_signals.__file__), "any.py"),
                 "exec"), namespace)  # a frame of oi2jax's own code
    armed: list = []
    monkeypatch.setattr(_signals, "INTERRUPTED", [])
    monkeypatch.setattr(_signals.signal, "setitimer", lambda which, seconds: armed.append(seconds))
    _signals._handler(signal.SIGINT, namespace["frame"])
    assert _signals.INTERRUPTED == [signal.SIGINT] and armed == [0.02]
    with pytest.raises(KeyboardInterrupt):
        with _signals.catching():
            _signals._handler(signal.SIGALRM, namespace["frame"])
    assert _signals._CATCHING == [0]


def test_only_python_start_up_runs_before_the_handler():
    """`-X importtime` lists modules as they finish importing: before `oi2jax._signals` (whose
    `install` `oi2jax.__main__` calls next) come only modules a bare `python -c pass` imports,
    the standard library (runpy for -m) and the package `oi2jax` itself -- no NumPy, no JAX, no
    other oi2jax module."""
    def imported(argv) -> list[str]:
        proc = subprocess.run([sys.executable, "-X", "importtime", *argv], cwd=REPO, env=ENV, capture_output=True,
                              text=True, timeout=300)
        return [line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")
                and "|" in line][1:]  # the first line is the header

    bare = set(imported(["-c", "pass"]))
    for entry in ENTRIES.values():
        names = imported(entry[1:] + ["--version"])
        assert "oi2jax._signals" in names, names
        before = names[:names.index("oi2jax._signals")]
        extra = [n for n in before if n not in bare and n.split(".")[0] not in sys.stdlib_module_names
                 and n != "oi2jax"]
        assert extra == [], (entry, extra)
        assert "oi2jax" in before and not any(n.startswith("oi2jax.") for n in before), before


def test_interrupted_run_leaves_no_partial_output(tmp_path):
    """Issue 17: a run stopped mid-way (SIGINT, SIGTERM; both runs at once, one wait for both)
    exits 130 with one line, writes no --out (not even a temporary file) and leaves an existing
    output file intact."""
    runs = {}
    for sig in ("SIGINT", "SIGTERM"):
        d = tmp_path / sig
        d.mkdir()
        (d / "out.npz").write_bytes(b"previous result")
        runs[sig] = d, _start_and_wait_for_handlers(ENTRIES["python -m oi2jax"] + _long_run(d, d / "out.npz"))
    for d, proc in runs.values():  # well into the run: imports + compile take about 1.5 s of CPU
        _wait_for_cpu_seconds(proc, 3.0)
    for sig, (d, proc) in runs.items():
        assert proc.poll() is None, proc.stderr.read()  # a billion steps: it cannot have finished
        proc.send_signal(getattr(signal, sig))
    for sig, (d, proc) in runs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 130 and err.strip() == "error: interrupted", (sig, err)
        assert (d / "out.npz").read_bytes() == b"previous result", sig
        assert sorted(p.name for p in d.iterdir()) == ["out.npz", "x.npy"], sig


# a CLI whose main thread never takes the interrupt: it sits outside oi2jax's code (as in a long
# native call, XLA compiling thousands of conditionals, where no Python handler runs) with a write
# in flight; `ready` is printed once the watchdog is armed
STUCK = """
import os, sys, time
from oi2jax import _signals
_signals.install()
tmp = sys.argv[1]
open(tmp, "w").close()
_signals.TEMP_FILES.add(tmp)
with _signals.catching():
    print("ready", flush=True)
    while True:
        time.sleep(0.01)
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_an_interrupt_the_main_thread_cannot_take_ends_the_process_from_the_watchdog(tmp_path, sig):
    """The watchdog (oi2jax/_signals.py) gives the main thread GRACE_S to take an interrupt, then
    prints the same one line, removes the temporary files of writes in flight and exits 130."""
    tmp = tmp_path / ".oi2jax-x.tmp"
    proc = subprocess.Popen([sys.executable, "-c", STUCK, str(tmp)], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n", proc.stderr.read()
    assert tmp.exists()
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and err == "error: interrupted\n", (proc.returncode, err)
    assert not tmp.exists()


# ------------------------------------------------------------------ the Python API's long calls
# Ctrl-C during `Session.run` (and `Generator.generate`, tests/test_generate.py): the first is
# raised after the fused call in flight, with the run's result so far in its `partial` and the
# session's step count equal to its state; a second one at once. The signals are sent from the
# run's own progress callback, between two calls: no timing window.
COUNTER_SOURCE = """
dynamic { x: f32; }
volatile { y: f32; }
persistent { acc: f32 @init(0.0); t: i32 @init(0); }
block entry {
    cache.read acc >> y;
    op add(y, x) >> y;
    cache.write y >> acc;
    cache.increment t;
    return;
}
"""


@pytest.fixture
def python_sigint(monkeypatch):
    """SIGINT with Python's default handler (what a script or a notebook has; a pytest-xdist
    worker may have another), restored after the test."""
    import signal as sig
    previous = sig.signal(sig.SIGINT, sig.default_int_handler)
    yield
    sig.signal(sig.SIGINT, previous)


def _counter_session():
    import oi2jax
    sess = oi2jax.compile(COUNTER_SOURCE).session()
    sess.run({"x": np.float32(1.0)}, steps=2)  # compiled: the interrupted runs below do not compile
    return sess


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_in_session_run_returns_what_it_made_and_the_session_goes_on(python_sigint, presses):
    sess = _counter_session()
    calls = []

    def progress(done):
        calls.append(done)
        if len(calls) == 2:
            for _ in range(presses):  # 2: the second raises at once, here in the callback
                os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as caught:
        sess.run({"x": np.float32(1.0)}, steps=100, collect="y", progress=progress, every=3)
    partial = caught.value.partial
    assert len(calls) == 2  # no call after the one that was in flight (one press), none at all (two)
    made = calls[1]
    np.testing.assert_array_equal(partial["y"], np.arange(3, 3 + made, dtype=np.float32))
    assert sess.steps == 2 + made and int(sess.read("t")) == 2 + made and float(sess.read("acc")) == 2 + made
    # the session goes on from there, as if the run had been asked for `made` steps
    res = sess.run({"x": np.float32(1.0)}, steps=4, collect="y")
    np.testing.assert_array_equal(res["y"], np.arange(3 + made, 7 + made, dtype=np.float32))
    assert sess.steps == 6 + made


def test_the_first_ctrl_c_is_recorded_and_raised_where_oi2jax_chooses(python_sigint):
    """Inside `deferred()` a Ctrl-C raises nothing where it lands (a library callback would
    swallow it: JAX's gc callbacks do, during a compile); `raise_pending` raises it. Outside, a
    Ctrl-C raises at once, as Python's own handler does; where another handler is installed,
    nothing is changed."""
    from oi2jax._signals import deferred, held, raise_pending
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # bytecodes run: the handler has run, and raised nothing
                pass
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            with deferred():  # nested: the same handler
                pass
            raise_pending()
    with pytest.raises(KeyboardInterrupt):  # outside a block the handler (it stays) is Python's default
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
        raise AssertionError("not raised at once")
    with deferred():
        raise_pending()  # nothing pending: nothing raised
    with deferred():  # a second press raises at once, but not inside `held`: at its end
        inside = []
        with pytest.raises(KeyboardInterrupt):
            with held():
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):
                    pass
                inside.append("not cut")
        assert inside == ["not cut"]
        raise_pending()  # both presses answered by that one KeyboardInterrupt
    own = lambda signum, frame: None  # noqa: E731
    signal.signal(signal.SIGINT, own)
    with deferred():
        assert signal.getsignal(signal.SIGINT) is own
    assert signal.getsignal(signal.SIGINT) is own


def test_a_second_ctrl_c_while_a_call_is_read_keeps_that_calls_steps(python_sigint, monkeypatch):
    """Two presses landing while the third call's outcome is read (the wait for the device): the
    interrupt goes out at once, and that call -- its state already the session's -- is counted."""
    from oi2jax.runtime import session as session_module
    sess = _counter_session()
    reads = []
    of_status = session_module.StepOutcome.of_status

    def read(status):
        reads.append(1)
        if len(reads) == 3:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # raises here, before the outcome is read
        return of_status(status)
    monkeypatch.setattr(session_module.StepOutcome, "of_status", staticmethod(read))
    with pytest.raises(KeyboardInterrupt) as caught:
        sess.run({"x": np.float32(1.0)}, steps=100, collect="y", every=3)
    made = len(caught.value.partial["y"])
    assert made == 9  # three calls of 3 steps, the third counted after the interrupt
    np.testing.assert_array_equal(caught.value.partial["y"], np.arange(3, 3 + made, dtype=np.float32))
    assert sess.steps == 2 + made and int(sess.read("t")) == 2 + made


def test_a_call_cut_off_with_the_state_it_took_closes_the_session_saying_so(python_sigint, monkeypatch):
    """The one case a session cannot go on: a second Ctrl-C inside a fused call after JAX took
    (donated) the state and before the call returned the next one. Simulated: the third call
    deletes the state it was given, then raises. The rows of the calls before it are the partial
    result, and every later use of the session says why it is closed."""
    from oi2jax.diagnostics import OiError
    from oi2jax.runtime.kernels import StepKernels
    sess = _counter_session()
    calls = []
    multi = StepKernels.multi

    def cut_off(self, consts, state, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            for leaf in jax.tree.leaves(state):
                leaf.delete()
            raise KeyboardInterrupt
        return multi(self, consts, state, *args, **kwargs)
    monkeypatch.setattr(StepKernels, "multi", cut_off)
    with pytest.raises(KeyboardInterrupt) as caught:
        sess.run({"x": np.float32(1.0)}, steps=100, collect="y", every=3)
    np.testing.assert_array_equal(caught.value.partial["y"], np.arange(3, 9, dtype=np.float32))
    with pytest.raises(OiError, match="this session is closed: its state was given to a fused call that a second "
                                      "Ctrl-C cut off"):
        sess.read("t")


def test_ctrl_c_during_a_steps_compile_is_raised_before_it_runs(python_sigint, monkeypatch):
    """A Ctrl-C while `Session.step` compiles: raised once the compile returns, before the step
    runs (runtime/kernels.compiled); the session has run nothing and steps on as if untouched."""
    import oi2jax
    from jax import stages
    compile_ = stages.Lowered.compile

    def interrupted_compile(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # lands in the compile (recorded, not raised there)
        return compile_(self, *args, **kwargs)
    sess = oi2jax.compile(COUNTER_SOURCE).session()
    monkeypatch.setattr(stages.Lowered, "compile", interrupted_compile)
    with pytest.raises(KeyboardInterrupt) as caught:
        sess.step(x=np.float32(1.0))
    assert [e.name for e in caught.traceback[-2:]] == ["compiled", "raise_pending"]  # not where it landed
    monkeypatch.setattr(stages.Lowered, "compile", compile_)
    assert sess.steps == 0
    sess.step(x=np.float32(1.0))
    assert sess.steps == 1 and int(sess.read("t")) == 1 and float(sess.read("acc")) == 1.0
