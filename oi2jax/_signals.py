"""Ctrl-C and SIGTERM for the CLI: one clean path (KeyboardInterrupt -> temporary files removed,
`error: interrupted`, exit 130), never raised inside a library callback that would swallow it.
And Ctrl-C in the Python API's long calls (`deferred`, below).

Python raises KeyboardInterrupt in whatever frame is running, and in a gc or import-lock callback
(JAX has some) it is printed as "Exception ignored" and lost. The handler here records the
interrupt and raises it only from oi2jax's own code; elsewhere (JAX, NumPy, an import) it
re-arms a 20 ms timer and raises from wherever execution is then. `main` also reports an interrupt that was
recorded but swallowed anyway. No imports beyond the standard library: `python -m oi2jax`
installs it before importing anything else.
"""
from __future__ import annotations

import _signal
import os
import signal
import threading
import time

INTERRUPTED: list[int] = []
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)


_HOME = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _unsafe(frame) -> bool:
    """Raise only from oi2jax's own code: a library (an import in progress, a gc callback, an
    extension's initialisation) may swallow or garble a KeyboardInterrupt."""
    name = frame.f_code.co_filename if frame is not None else ""
    return not os.path.abspath(name).startswith(_HOME)


_CATCHING = [0]  # how many `catching()` blocks are running: KeyboardInterrupt is raised only inside one


class catching:
    """A block whose caller catches KeyboardInterrupt (the CLI's `main`s, inside their `try`): the
    handler raises only while one runs. Outside -- `oi2jax.__main__`'s own module body right after
    `install()`, between `install()` and a `try` -- an interrupt is recorded and raised once a
    block is entered (the 20 ms timer), else reported from INTERRUPTED."""

    def __enter__(self):
        _CATCHING[0] += 1
        return self

    def __exit__(self, *exc) -> None:
        _CATCHING[0] -= 1


def _handler(signum, frame):
    if signum != signal.SIGALRM:
        INTERRUPTED.append(signum)
    elif not INTERRUPTED:
        return
    if not _CATCHING[0] or _unsafe(frame):
        signal.setitimer(signal.ITIMER_REAL, 0.02)  # try again soon, from wherever execution is then
        return
    with _WATCH_LOCK:  # taken: the watchdog stands down (or has already ended the process)
        _WATCH["taken"] += 1
    raise KeyboardInterrupt


# ------------------------------------------------------------------ the watchdog
# Python runs a signal handler on the main thread between bytecodes, so while the main thread is in
# a long native call -- XLA compiling a step with thousands of conditionals can take many minutes
# -- the handler above does not run, and SIGTERM (`timeout`, a job manager) or Ctrl-C would wait
# for the call to end. Python's C-level handler writes each signal's number to the wakeup fd at
# once, whatever the main thread does; a thread reading it gives the main thread GRACE_S to take
# the interrupt (raise it, above), else prints the same one line, removes the temporary files of
# writes in flight (TEMP_FILES: npz.write_atomic) and ends the process with 130.
GRACE_S = 5.0
TEMP_FILES: set = set()
_WATCH = {"armed": 0, "taken": 0, "fd": None, "previous_fd": -1}
_WATCH_LOCK = threading.RLock()  # re-entrant: a handler may run inside another on the main thread


def _watchdog(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        if not any(b in (signal.SIGINT, signal.SIGTERM) for b in data) or not _WATCH["armed"]:
            continue  # SIGALRM (the handler's retry timer), or a signal while no CLI runs
        seen, deadline = _WATCH["taken"], time.monotonic() + GRACE_S
        while time.monotonic() < deadline and _WATCH["taken"] == seen and _WATCH["armed"]:
            time.sleep(0.05)
        with _WATCH_LOCK:
            if _WATCH["taken"] == seen and _WATCH["armed"]:
                for tmp in list(TEMP_FILES):
                    try:
                        os.unlink(tmp)
                    except OSError:
                        pass
                os.write(2, b"error: interrupted\n")
                os._exit(130)


def _arm() -> None:
    if _WATCH["fd"] is None:
        read, write = os.pipe()
        os.set_blocking(write, False)
        _WATCH["fd"] = write
        threading.Thread(target=_watchdog, args=(read,), name="oi2jax-interrupt-watchdog", daemon=True).start()
    if _WATCH["armed"] == 0:
        _WATCH["previous_fd"] = signal.set_wakeup_fd(_WATCH["fd"], warn_on_full_buffer=False)
    _WATCH["armed"] += 1


def _disarm() -> None:
    _WATCH["armed"] -= 1
    if _WATCH["armed"] == 0:
        signal.set_wakeup_fd(_WATCH["previous_fd"])


def install() -> dict:
    """Install the handlers and arm the watchdog (main thread only); returns what to give
    `restore`."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {sig: signal.signal(sig, _handler) for sig in _SIGNALS}
    _arm()
    return previous


def restore(previous: dict) -> None:
    if previous:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _disarm()
    for sig, handler in previous.items():
        signal.signal(sig, handler)


# ------------------------------------------------------------------ the Python API's long calls
# `Session.run` and `Generator.generate` run fused calls of about half a second, each of which
# donates the session's state and hands back the next one. A KeyboardInterrupt raised by Python's
# default handler lands wherever the main thread is: between a call and the bookkeeping of what
# it produced (the session's step count then behind its state, the call's rows lost), or inside
# one of JAX's gc callbacks, where it is printed as "Exception ignored" and lost (an interrupt
# during an XLA compile, often). Within `deferred()`, the first Ctrl-C is recorded and raised by
# `raise_pending()` at the next point oi2jax chooses: right after an XLA compile returns
# (runtime/kernels.compiled, before anything runs), after the fused call in flight (about half a
# second), after a prompt step; with what was produced so far in its `partial`. A second Ctrl-C
# before then raises at once, wherever.
_DEFERRED = {"depth": 0, "pending": 0, "held": 0, "ours": False}


def _defer(signum, frame):
    if not _DEFERRED["depth"]:  # outside every deferred block: what Python's default handler does
        raise KeyboardInterrupt
    _DEFERRED["pending"] += 1
    if _DEFERRED["pending"] > 1 and not _DEFERRED["held"]:  # a second Ctrl-C: at once
        _DEFERRED["pending"] = 0
        raise KeyboardInterrupt


class deferred:
    """A long call of the Python API: SIGINT deferred as above. Only on the main thread and only
    where SIGINT has Python's default handler (the CLI's handler, a user's own, or none stays as
    it is); nested blocks share the outermost's. The handler is installed at the first block and
    stays: outside a block it raises KeyboardInterrupt at once, as Python's own does (installing
    and restoring one around each call cost a `run` of a few steps about 30 µs)."""

    def __enter__(self):
        self.main = threading.current_thread() is threading.main_thread()  # signals reach it alone
        if not self.main:
            return self
        if _DEFERRED["depth"] == 0:
            # the C module's getsignal: `signal.getsignal` wraps it in an enum conversion (5 µs)
            handler = _signal.getsignal(signal.SIGINT)
            if handler is signal.default_int_handler:
                signal.signal(signal.SIGINT, _defer)
                handler = _defer
            _DEFERRED["ours"], _DEFERRED["pending"] = handler is _defer, 0
        _DEFERRED["depth"] += 1
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if not self.main:
            return
        _DEFERRED["depth"] -= 1
        if _DEFERRED["depth"] == 0 and _DEFERRED["ours"]:
            if exc_type is None:
                raise_pending()  # one that came after the last point that could raise it
            _DEFERRED["pending"] = 0


class held:
    """A few statements no Ctrl-C may cut (a fused call's dispatch and the bookkeeping that makes
    the session's step count match its state): a second Ctrl-C that came meanwhile raises at the
    end of the block."""

    def __enter__(self):
        self.main = threading.current_thread() is threading.main_thread()
        if self.main:
            _DEFERRED["held"] += 1
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if not self.main:
            return
        _DEFERRED["held"] -= 1
        if not _DEFERRED["held"] and exc_type is None and _DEFERRED["pending"] > 1:
            raise_pending()


def raise_pending() -> None:
    """Raise the Ctrl-C that `deferred` recorded, if any (and forget it): on the main thread only
    (a helper thread's work, such as `Generator`'s compile ahead, goes on)."""
    if _DEFERRED["pending"] and threading.current_thread() is threading.main_thread():
        _DEFERRED["pending"] = 0
        raise KeyboardInterrupt
