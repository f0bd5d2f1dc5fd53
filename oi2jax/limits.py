"""THE size limits (one definition for the compiled program and the interpreter): the most
bytes one value may take, the guard that refuses absurd shapes before anything is allocated, and
the error for an allocation that fails anyway."""
from __future__ import annotations

import math
import os

import jax

from . import dtypes as dt
from . import ir
from .diagnostics import OiError

INITIAL_CAPACITY = 4  # rows a growable table / auto_dim dim starts with (then doubled)
MAX_VALUE_BYTES = 1 << 40  # 1 TiB: anything larger is a size-variable mistake, not a model


def device_memory(device) -> int | None:
    """The bytes the allocator of `device` (a GPU's, a TPU's) may hand out, where it says; None for
    the CPU (its values live in this machine's memory) or a device that does not say."""
    if device is None or getattr(device, "platform", "cpu") == "cpu":
        return None
    try:
        stats = device.memory_stats() or {}
    except Exception:  # a backend without memory statistics
        return None
    value = stats.get("bytes_limit")
    return int(value) if value else None


def memory_limit(device=None) -> int:
    """The most bytes one value may take: 1 TiB, no more than this machine's memory in a
    single-process run, and no more than the memory of `device` where it has its own (a value that
    cannot fit is refused before anything is allocated)."""
    limit = MAX_VALUE_BYTES
    try:
        if jax.process_count() == 1:
            limit = min(limit, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        pass
    own = device_memory(device)
    return min(limit, own) if own is not None else limit


# the variables a step holds all at once, counted together against the limit (constants are the
# model's tensors, placed as stored, maybe packed: not counted here; temporaries may never exist)
HELD = (ir.MemKind.PERSISTENT, ir.MemKind.DYNAMIC, ir.MemKind.VOLATILE)


def check_sizes(bound, device=None) -> None:
    """Refuse absurd shapes (e.g. a size variable of 2**56) with a located error, before allocating
    (on `device`: its memory is a limit too): each value, and the values a step holds at once
    (`HELD`) together."""
    graph = bound.graph
    limit = memory_limit(device)
    names = [v.name for v in graph.vars] + [t for t in graph.temporaries if graph.var(t) is None]
    held = []  # (bytes, name): the values a step holds at once (its state, inputs and outputs)
    for name in names:
        shape = bound.shape(name)
        decl = graph.var(name)
        big = next((i for i, n in enumerate(shape) if n > limit), None)
        if big is not None:  # even beside a 0 dim: no allocator takes such a shape
            where = decl or graph.temporaries[name]
            raise OiError(f"{name}: dimension {big} is {shape[big]}, too large to allocate (the limit is {limit} "
                          f"bytes of memory, which no dimension may pass)",
                          where.span, source=graph.source)
        what = f"shape {list(shape)}"
        count = math.prod(shape)
        if decl is not None and (decl.is_table or decl.auto_dim):  # a table holds capacity x entries
            dims = decl.table_indices if decl.is_table else decl.auto_dim
            fixed = decl.fixed_sizes(bound.sizes)
            caps = [fixed.get(d, INITIAL_CAPACITY) for d in dims]
            count *= math.prod(caps)
            what = f"{'table' if decl.is_table else 'auto_dim'} capacity {caps} x {list(shape)}"
        nbytes = dt.get(bound.dtype(name)).nbytes(count)
        if nbytes > limit:
            decl = graph.var(name) or graph.temporaries[name]
            raise OiError(f"{name} would need {nbytes} bytes ({what}): too large to allocate (the limit is "
                          f"{limit} bytes{limit_note(limit, device)}); check the size variables and @fixed sizes",
                          decl.span, source=graph.source)
        if decl is not None and decl.kind in HELD:
            held.append((nbytes, name))
    total = sum(n for n, _ in held)
    if total > limit:  # each fits, all together do not
        largest = sorted(held, reverse=True)[:3]
        decl = graph.var(largest[0][1])
        raise OiError(f"the graph's state, inputs and outputs would need {total} bytes together: too large to "
                      f"allocate (the limit is {limit} bytes{limit_note(limit, device)}); the largest: "
                      + ", ".join(f"{name} {n} bytes" for n, name in largest)
                      + "; check the size variables and @fixed sizes", decl.span, source=graph.source)


def limit_note(limit: int, device=None) -> str:
    if limit == device_memory(device):
        return f", the memory of {device}"
    return ", this machine's memory" if limit < MAX_VALUE_BYTES else ""


def growth_refused(name: str, nbytes: int, to: str, device=None) -> str | None:
    """THE refusal of a cache growing past memory (a write at index 10**12: compiled
    `Program.grow`, the interpreter's tables and @auto_dim tensors), said before anything is
    allocated: the message when `nbytes` pass the limit (`to`: the size it would grow to, and
    why), else None."""
    limit = memory_limit(device)
    if nbytes <= limit:
        return None
    return (f"cache {name} would need {nbytes} bytes to grow to {to}: too large to allocate (the limit is "
            f"{limit} bytes{limit_note(limit, device)})")


def allocation_error(exc: BaseException, what: str) -> "OiError | None":
    """A clear OiError for a host or device allocation failure, else None."""
    text = str(exc)
    if isinstance(exc, MemoryError) or "RESOURCE_EXHAUSTED" in text or "Out of memory" in text \
            or "out of memory" in text:
        return OiError(f"cannot allocate {what}: out of memory ({type(exc).__name__}: "
                       f"{text.splitlines()[0][:200] if text else 'no details'})")
    return None
