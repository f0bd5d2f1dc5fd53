"""A dependency-free progress bar for `oi2jax run --steps N` and `oi2jax convert-hf` (stderr, terminals only).

`ProgressBar(total, stream=sys.stderr)` is a callable `bar(done)` (steps finished so far);
it redraws at most every `interval` seconds with a bar, `done/total`, steps per second and an
ETA, and `close()` prints the final line. `progress_for(total, quiet, stream)` returns a bar
only when it is wanted: stream is a terminal, not quiet, and `total >= min_steps`.
"""
from __future__ import annotations

import sys
import time

MIN_STEPS = 100


def _fmt_time(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class ProgressBar:
    def __init__(self, total: int, stream=None, width: int = 30, interval: float = 0.1, label: str = "step",
                 clock=time.monotonic, unit: str = "steps"):
        self.total = max(0, int(total))
        self.stream = sys.stderr if stream is None else stream
        self.width = width
        self.interval = interval
        self.label = label
        self.unit = unit  # the rate's unit: "steps/s", "MiB/s"
        self.clock = clock
        self.start = clock()
        self._last_draw = None
        self.done = 0
        self.closed = False

    def render(self, done: int, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        elapsed = max(now - self.start, 1e-9)
        rate = done / elapsed
        frac = done / self.total if self.total else 1.0
        filled = int(round(self.width * min(frac, 1.0)))
        bar = "#" * filled + "-" * (self.width - filled)
        eta = (self.total - done) / rate if rate > 0 else 0.0
        return (f"{self.label} {done}/{self.total} [{bar}] {100 * frac:5.1f}% "
                f"{rate:,.1f} {self.unit}/s elapsed {_fmt_time(elapsed)} eta {_fmt_time(eta)}")

    def __call__(self, done: int) -> None:
        self.done = done
        now = self.clock()
        if self._last_draw is not None and now - self._last_draw < self.interval and done < self.total:
            return
        self._last_draw = now
        self.stream.write("\r" + self.render(done, now) + "\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.stream.write("\r" + self.render(self.done) + "\x1b[K\n")
        self.stream.flush()


def progress_for(total: int | None, quiet: bool = False, stream=None, min_steps: int = MIN_STEPS,
                 **bar_options) -> ProgressBar | None:
    """A bar for `total` steps on `stream` (stderr) when it is a terminal, not `quiet`, and total is large.
    `bar_options`: ProgressBar's label / unit (e.g. `label="MiB", unit="MiB"` for bytes written)."""
    stream = sys.stderr if stream is None else stream
    if quiet or total is None or total < min_steps:  # None: a count the run decides (no bar)
        return None
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    return ProgressBar(total, stream=stream, **bar_options)
