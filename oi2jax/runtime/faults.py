"""Fault injection, for tests: `with faults.injected(faults.ALLOCATE, MemoryError()):` makes the
named site raise that exception where the real failure would come from, so that a test sees what
the user sees (the message, the CLI's exit code) without reaching into the runtime.

Sites:
- `ALLOCATE`: allocating a persistent variable's host value at program start
  (`Executable.initial_values`, for each variable);
- `RUN`: a run on the device, before its first step (`Program.run`; e.g. the device's
  `RESOURCE_EXHAUSTED`).

Zero cost when unused: a site is one test of an empty dict."""
from __future__ import annotations

from contextlib import contextmanager

ALLOCATE = "allocate"
RUN = "run"
SITES = (ALLOCATE, RUN)

_ACTIVE: dict = {}  # site -> the exception it raises while injected


@contextmanager
def injected(site: str, exc: BaseException):
    """Within the block, `site` (one of `SITES`) raises `exc` each time it is reached."""
    if site not in SITES:
        raise ValueError(f"unknown fault site {site!r}: one of {', '.join(SITES)}")
    _ACTIVE[site] = exc
    try:
        yield
    finally:
        del _ACTIVE[site]


def reach(site: str) -> None:
    """The site `site` is reached: raise its injected exception, if any."""
    if _ACTIVE:
        exc = _ACTIVE.get(site)
        if exc is not None:
            raise exc
