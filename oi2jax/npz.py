"""Writing `.npz` files (and every other output) safely: members written one by one (any variable
name, even `file` or `allow_pickle`, which `np.savez(**kw)` would swallow) into a temporary file in
the target's directory that is renamed over the target only once complete, so an interrupted write
never leaves a half-written file nor destroys the previous one. The file gets the permissions a
plain write gives (`output_mode`: the umask, or the mode of the file replaced)."""
from __future__ import annotations

import errno
import os
import stat
import tempfile
import zipfile

import numpy as np

from ._signals import TEMP_FILES
from .diagnostics import OiError


def umask() -> int:
    """The process's umask, read without changing it where the system says it (/proc/self/status,
    Linux 4.7+: no window in which another thread creates files with a different mask); else set
    and restored at once."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def output_mode(path) -> int:
    """The permissions a plain `open(path, "w")` gives: those of the file it replaces, else 0o666
    less the umask (a temporary file is created 0o600: written outputs must not stay so)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~umask()


_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"))


class NotRegularFileError(OSError):
    """The target of a write exists and is not a regular file (a device, a FIFO, a socket), or is a
    symbolic link to a missing file: it is never replaced or written through, as `cp` refuses it. The CLI prints `error: PATH: not a regular file ...`."""


def load_error(exc: Exception) -> str:
    """What `np.load(..., allow_pickle=False)`'s failure means for the user: NumPy's own words advise
    `allow_pickle=` (unsafe, and not an option of oi2jax) for a file that is not NumPy's at all."""
    text = str(exc)
    if "pickled (object) data" in text:
        return "not a NumPy file"
    if "Object arrays cannot be loaded" in text:
        return "it holds Python objects, not numbers"
    return text


def regular_input(path, what: str) -> None:
    """An input file named by the user (a tokenizer, a prompts or ids file) that exists but is not a
    regular file (a device such as /dev/zero, a FIFO, a directory) is an OiError naming it: it would
    be read without end, or not at all. A missing one is left to the reader to report."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else next((name for test, name in _KINDS if test(mode)),
                                                              "a special file")
        raise OiError(f"{os.fspath(path)}: {what}: not a regular file ({kind})")


def writable_target(path) -> str:
    """The file a write to `path` replaces: `path`, or the file a symbolic link names (the link
    stays a link). Raises `IsADirectoryError` or `NotRegularFileError` for an existing target that is
    not a regular file; nothing has been written then."""
    path = os.fspath(path)
    target = os.path.realpath(path) if os.path.islink(path) else path
    try:
        mode = os.stat(target).st_mode
    except OSError:  # absent (it will be created) or unreadable (the write itself reports it), or a
        try:  # link that only the kernel resolves (/dev/stdout -> /proc/self/fd/1 -> a pipe)
            mode = os.stat(path).st_mode
        except OSError as exc:
            if exc.errno == errno.ENOENT and target != path:
                # a symbolic link to a missing file: writing through it would create a file the user
                # never named, somewhere else (cp refuses too)
                raise NotRegularFileError(2, f"a symbolic link to a missing file ({target}); refusing to "
                                             f"write through it (remove the link or create the file)", path)
            if exc.errno == errno.ELOOP:
                # a loop of symbolic links names no file: replacing the link would destroy it (cp refuses too)
                raise NotRegularFileError(errno.ELOOP, "a loop of symbolic links (too many levels of symbolic "
                                                       "links); refusing to replace it", path) from None
            return target
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(21, "is a directory", path)
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "a special file")
        stdout = " (leave out -o to print on standard output)" if os.path.abspath(path) in ("/dev/stdout", "/dev/fd/1") \
            else ""
        raise NotRegularFileError(17, f"not a regular file ({kind}); refusing to replace it{stdout}", path)
    if not os.access(target, os.W_OK):  # a plain write would fail (a rename needs only the folder's permission)
        try:
            read_only = bool(os.statvfs(target).f_flag & os.ST_RDONLY)
        except OSError:
            read_only = False
        if read_only:
            raise OSError(30, "Read-only file system", path)
        raise PermissionError(13, "Permission denied (the file is not writable)", path)
    return target


def check_directory(path: str, target: str) -> None:
    """FileNotFoundError `PATH: no such directory: DIR` where the directory of `target` (the file a
    write to `path` replaces: `writable_target`) does not exist (`write_atomic` never makes one)."""
    if path.endswith(("/", os.sep)):  # abspath drops the slash: the rename failed naming the temporary
        raise IsADirectoryError(21, "ends with '/', which names a directory; give a file name", path)
    directory = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(directory):
        above = directory
        while above and not os.path.lexists(above):
            above = os.path.dirname(above) if os.path.dirname(above) != above else ""
        if above and not os.path.isdir(above):  # a component is a file: no directory can be made there
            raise NotADirectoryError(20, f"not a directory: {above} (a file, where the path needs a directory)", path)
        raise FileNotFoundError(2, f"no such directory: {directory}", path)


def refuse_inputs_as_outputs(outputs: dict, inputs: dict, makes_dirs: bool = False) -> None:
    """An output path that resolves to an input file (the graph, the model, a state or input file)
    is an error: writing it would destroy the input; so are an empty path, two outputs naming one
    file (the later write would replace the earlier), and one that is not a regular file
    (`npz.writable_target`) and one whose directory does not exist (`check_directory`; not where
    the writer makes it: `makes_dirs`, export's -o), and a `--dump-dir` that exists and is not a
    directory. All are told before any work is done (which files a dump writes is known once the
    program is: `runtime/emit.dump` refuses an output among them before writing any)."""
    def same(a, b) -> bool:
        try:
            if os.path.exists(a) and os.path.exists(b):
                return os.path.samefile(a, b)
        except OSError:
            pass
        return os.path.realpath(a) == os.path.realpath(b)

    given = [(flag, out) for flag, out in outputs.items() if out is not None]
    for flag, out in given:
        if not os.fspath(out):
            raise OiError(f"{flag}: the path is empty")
        if os.fspath(out) == "-" and flag.startswith("-"):  # a command line's "-" means standard output elsewhere
            raise OiError(f"{flag} -: this would write a file named '-', not standard output; leave out {flag} to "
                          f"print (where the command prints), or give ./- for a file of that name")
    for i, (flag, out) in enumerate(given):
        for other, path in given[i + 1:]:
            if same(out, path):
                what = "path" if "--dump-dir" in (flag, other) else "file"
                raise OiError(f"{flag} and {other} name the same {what} ({out}): one would overwrite the other; "
                              f"choose two paths")
    for flag, out in given:
        if flag == "--dump-dir":
            if os.path.exists(out) and not os.path.isdir(out):
                raise NotADirectoryError(20, "not a directory (--dump-dir writes files into a directory)", os.fspath(out))
        else:
            target = writable_target(out)
            if not makes_dirs:
                check_directory(os.fspath(out), target)
        for what, path in inputs.items():
            if path and same(out, path):
                raise OiError(f"{flag} {out} is the {what}: writing it would destroy the input; choose another path")


def write_atomic(path, write) -> None:
    """Call `write(file_object)` on a temporary file next to `path`, then rename it to `path`
    (with the permissions `output_mode` gives, as any other written file). A target that exists
    and is not a regular file is refused before anything is written (`writable_target`); a
    symbolic link is followed, so the file it names is replaced and the link kept."""
    shown = os.fspath(path)
    path = writable_target(shown)
    check_directory(shown, path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".oi2jax-", suffix=".tmp", dir=directory)
    except OSError as exc:  # report the path the user gave, not the temporary name
        where = f" (writing a file in {directory})" if isinstance(exc, PermissionError) else ""
        raise type(exc)(exc.errno, exc.strerror + where, shown) from None
    TEMP_FILES.add(tmp)  # an interrupt that ends the process from its watchdog removes it (_signals.py)
    try:
        os.chmod(tmp, output_mode(path))
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
    finally:
        TEMP_FILES.discard(tmp)


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
