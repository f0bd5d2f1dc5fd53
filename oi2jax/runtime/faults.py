"""Fault injection, for tests: `with faults.injected(faults.ALLOCATE, MemoryError()):` makes the
named site raise that exception where the real failure would come from, so that a test sees what
the user sees (the message, the CLI's exit code) without reaching into the runtime.

Sites:
- `ALLOCATE`: allocating a persistent variable's host value at program start
  (`Executable.initial_values`, for each variable);
- `RUN`: a run on the device, before its first step (`Program.run`; e.g. the device's
  `RESOURCE_EXHAUSTED`);
- `KERNEL`: a call of one of the yield/await driver's kernels (`Driver.invoke`), where `where`
  is the kernel's name (its block; `None`: every kernel).

`injected` yields an `Injection` whose `reached` counts the times the fault was raised. Zero cost
when unused: a site is one test of an empty dict."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

ALLOCATE = "allocate"
RUN = "run"
KERNEL = "kernel"
SITES = (ALLOCATE, RUN, KERNEL)


@dataclass
class Injection:
    """An injected fault: `exc` raised at its site (only where `where` matches, when given);
    `reached`: how many times it was raised."""

    exc: BaseException
    where: str | None = None
    reached: int = 0


_ACTIVE: dict = {}  # site -> its `Injection` while injected


@contextmanager
def injected(site: str, exc: BaseException, where: str | None = None):
    """Within the block, `site` (one of `SITES`) raises `exc` each time it is reached (at `where`
    only, when given); yields the `Injection`."""
    if site not in SITES:
        raise ValueError(f"unknown fault site {site!r}: one of {', '.join(SITES)}")
    injection = _ACTIVE[site] = Injection(exc, where)
    try:
        yield injection
    finally:
        del _ACTIVE[site]


def reach(site: str, where: str | None = None) -> None:
    """The site `site` is reached (at `where`): raise its injected exception, if any."""
    if _ACTIVE:
        injection = _ACTIVE.get(site)
        if injection is not None and injection.where in (None, where):
            injection.reached += 1
            raise injection.exc
