"""Unreadable entries of the persistent XLA compilation cache: one clean warning, then recompile.

JAX reads an executable it cannot decode (a cache file truncated, overwritten or damaged on disk)
as a cache miss: it compiles again, and says so with a Python `UserWarning` per entry, printed with
JAX's own file and line. It also keeps the damaged file (its cache never overwrites an entry), so
every later run would warn and compile again. `watch(directory)` (called by
`api.enable_compilation_cache`) turns that into ONE `warning:` line per process on stderr, and
removes each damaged entry it can identify, so that the executable compiled in its place is
written and the next run reads it. Every other warning goes where it went before.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings
from pathlib import Path

_PREFIX = "Error reading persistent compilation cache entry for "
_lock = threading.Lock()
_state = {"directory": None, "warned": False}


def user_cache_base() -> Path:
    """oi2jax's folder of the user's cache: $XDG_CACHE_HOME/oi2jax, else ~/.cache/oi2jax (the XLA
    cache's default home, `api.default_cache_dir`, and the built ggml handler's, quantized/ggml.py)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "oi2jax"


def reopen_cache() -> None:
    """Make JAX open its persistent cache again at its next compile (it opens the directory once
    per process, so a directory set after the first compile would otherwise be ignored)."""
    try:
        from jax._src.compilation_cache import reset_cache  # optional: a JAX internal (ImportError: nothing to reopen)
    except ImportError:
        return
    reset_cache()


def watch(directory: str) -> None:
    """Route JAX's unreadable-cache-entry warnings for `directory` through `_unreadable`
    (installed once per process; a later call only changes the directory)."""
    with _lock:
        _state["directory"] = directory
        if getattr(warnings.showwarning, "oi2jax_xla_cache", False):
            return
        previous = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            text = str(message)
            if text.startswith(_PREFIX):
                _unreadable(text[len(_PREFIX):])
                return
            previous(message, category, filename, lineno, file, line)

        showwarning.oi2jax_xla_cache = True
        warnings.showwarning = showwarning


def _unreadable(detail: str) -> None:
    """`detail`: "'jit_step': error: Error -3 while decompressing data: ..." (the entry's module
    name or cache key, then why)."""
    name, _, why = detail.partition(": ")
    name = name.strip("'\"")
    directory = _state["directory"]
    removed = _remove_damaged(directory, name) if directory else 0
    with _lock:
        if _state["warned"]:
            return
        _state["warned"] = True
    what = "; the entry was removed and is written again" if removed else ""
    print(f"warning: compilation cache {directory}: cannot read the entry for {name} ({why.strip()}); "
          f"compiling again{what}", file=sys.stderr)


def _remove_damaged(directory: str, name: str) -> int:
    """Remove the entries of `name` (a module name, or a whole cache key) that do not decompress;
    how many were removed. Best effort: an entry that decompresses but does not load stays."""
    try:
        from jax._src.compilation_cache import decompress_executable  # optional: a JAX internal (ImportError: skip)
        files = [f for f in os.listdir(directory)
                 if f.endswith("-cache") and (f == f"{name}-cache" or f.startswith(f"{name}-"))]
    except (ImportError, OSError):
        return 0
    removed = 0
    for f in files:
        path = os.path.join(directory, f)
        try:
            with open(path, "rb") as handle:
                decompress_executable(handle.read())
        except OSError:
            continue
        except Exception:  # noqa: BLE001 (whatever the codec raises: the entry cannot be read)
            try:
                os.unlink(path)
                removed += 1
            except OSError:
                pass
    return removed
