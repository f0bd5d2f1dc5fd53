"""Ctrl-C and SIGTERM for the CLI: one clean path (KeyboardInterrupt -> temporary files removed,
`error: interrupted`, exit 130), never raised inside a library callback that would swallow it.

Python raises KeyboardInterrupt in whatever frame is running, and in a gc or import-lock callback
(JAX has some) it is printed as "Exception ignored" and lost. The handler here records the
interrupt and raises it only from oi2jax's own code; elsewhere (JAX, NumPy, an import) it
re-arms a 20 ms timer and raises from wherever execution is then. `main` also reports an interrupt that was
recorded but swallowed anyway. No imports beyond the standard library: `python -m oi2jax`
installs it before importing anything else.
"""
from __future__ import annotations

import os
import signal
import threading

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
    raise KeyboardInterrupt


def install() -> dict:
    """Install the handlers (main thread only); returns what to give `restore`."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _handler) for sig in _SIGNALS}


def restore(previous: dict) -> None:
    if previous:
        signal.setitimer(signal.ITIMER_REAL, 0)
    for sig, handler in previous.items():
        signal.signal(sig, handler)
