"""What a fused run took: its steps, seconds, compiling apart, its first call and its steady rate
(`Session.last_run`, `oi2jax run --stats`).

Compiling is measured, not estimated: JAX reports the seconds of each trace, lowering and XLA
compilation as monitoring events (`/jax/core/compile/...`); `compile_seconds()` is their running
total in this process, so the compiling inside any stretch of time is a difference of two reads.
Compiling done `apart()` (ahead of time in a second thread, which nobody's timed stretch waits
for) is counted apart; a thread that waits for it counts its wait as compiling itself."""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from dataclasses import dataclass

import jax

COMPILE_EVENTS = frozenset({"/jax/core/compile/jaxpr_trace_duration",
                            "/jax/core/compile/jaxpr_to_mlir_module_duration",
                            "/jax/core/compile/backend_compile_duration"})
_total = [0.0, 0.0]  # seconds of the COMPILE_EVENTS so far (this process): counted, apart
_local = threading.local()  # .apart: this thread compiles apart


def _on_duration(event: str, seconds: float, **kwargs) -> None:  # called in the compiling thread
    if event in COMPILE_EVENTS:
        _total[1 if getattr(_local, "apart", False) else 0] += seconds


jax.monitoring.register_event_duration_secs_listener(_on_duration)


def compile_seconds() -> float:
    """Seconds JAX spent tracing, lowering and compiling in this process so far, but `apart()`."""
    return _total[0]


def apart_seconds() -> float:
    """Seconds of compiling done `apart()` so far (this process)."""
    return _total[1]


@contextlib.contextmanager
def apart():
    """Compiling in this thread inside the block is counted by `apart_seconds`, not by
    `compile_seconds` (a compile ahead of time that no timed stretch of another thread includes)."""
    _local.apart = True
    try:
        yield
    finally:
        _local.apart = False


@dataclass(frozen=True)
class RunStats:
    """One run (`Session.last_run`): `steps` applied in `seconds` (wall), of which `compile_s`
    compiling; the first fused call ran `first_steps` steps in `first_s` (its compiling left
    out: with streaming, the first call is one step, so `first_s` is the time to the first token);
    the later calls `rest_steps` in `rest_s` (compiling left out); `stopped`: a stop id ended it."""

    steps: int
    seconds: float
    compile_s: float
    first_steps: int
    first_s: float
    rest_steps: int
    rest_s: float
    stopped: bool

    @property
    def steady_rate(self) -> float | None:
        """Steps per second after the first call (else of the first call; None: no step ran)."""
        steps, seconds = (self.rest_steps, self.rest_s) if self.rest_steps else (self.first_steps, self.first_s)
        if not steps:
            return None
        return steps / seconds if seconds > 0 else float("inf")

    def line(self, compile_before: float = 0.0) -> str:
        """The one `--stats` line (`compile_before`: seconds of compiling before the run, added)."""
        rate = self.steady_rate
        steady = "n/a" if rate is None else f"{rate:.1f} steps/s"
        return (f"compile {compile_before + self.compile_s:.3f} s, first step {self.first_s:.3f} s, "
                f"steady {steady} ({self.steps} steps in {self.seconds:.3f} s)")


class RunClock:
    """Times a run call by call (`start()` / `stop(steps)` around each fused call)."""

    def __init__(self):
        self._t0 = time.perf_counter()
        self._c0 = compile_seconds()
        self._calls: list[tuple[int, float]] = []  # (steps, seconds without compiling) per call
        self._begin = self._compiled = 0.0

    def start(self) -> None:
        self._begin, self._compiled = time.perf_counter(), compile_seconds()

    def stop(self, steps: int) -> float:
        """End a call that applied `steps` steps: its seconds, compiling left out."""
        seconds = max(0.0, time.perf_counter() - self._begin - (compile_seconds() - self._compiled))
        self._calls.append((steps, seconds))
        return seconds

    def stats(self, stopped: bool) -> RunStats:
        calls = self._calls
        first_steps, first_s = calls[0] if calls else (0, 0.0)
        rest = calls[1:]
        return RunStats(steps=sum(n for n, _ in calls), seconds=time.perf_counter() - self._t0,
                        compile_s=compile_seconds() - self._c0, first_steps=first_steps, first_s=first_s,
                        rest_steps=sum(n for n, _ in rest), rest_s=sum(s for _, s in rest), stopped=stopped)


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory so far (getrusage's ru_maxrss), or None where the
    system has no getrusage."""
    try:
        import resource  # optional: Unix only
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS counts bytes, Linux kB


def memory_line(memory: dict) -> str:
    """The `--stats` memory line: `memory` (`Program.memory`: the weights and state bytes the
    device holds for the program, and where) and the process's peak resident memory, in MB
    (10^6 bytes)."""
    peak = peak_rss_bytes()
    rss = "n/a" if peak is None else f"{peak / 1e6:.0f} MB"
    return (f"memory {memory['weights'] / 1e6:.1f} MB weights + {memory['state'] / 1e6:.1f} MB state on "
            f"{memory['where']}, peak resident {rss} (the process)")
