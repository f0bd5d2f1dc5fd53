"""Writing `.npz` files safely: members written one by one (any variable name, even `file` or
`allow_pickle`, which `np.savez(**kw)` would swallow) into a temporary file in the target's
directory that is renamed over the target only once complete, so an interrupted write never
leaves a half-written file nor destroys the previous one."""
from __future__ import annotations

import os
import tempfile
import zipfile

import numpy as np


def write_atomic(path, write) -> None:
    """Call `write(file_object)` on a temporary file next to `path`, then rename it to `path`."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(21, "is a directory", path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".oi2jax-", suffix=".tmp", dir=directory)
    except OSError as exc:  # report the path the user gave, not the temporary name
        raise type(exc)(exc.errno, exc.strerror, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def save_npz(path, arrays: dict) -> None:
    """Write `arrays` ({member name: array}) to exactly `path` (no `.npz` appended), atomically."""
    def write(f):
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name, value in arrays.items():
                with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
    write_atomic(path, write)


def write_text_atomic(path, text: str) -> None:
    write_atomic(path, lambda f: f.write(text.encode()))
