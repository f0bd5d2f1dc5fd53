"""Opt-in kernels (`oi2jax.compile(..., kernels="ggml")`, `--kernels ggml`): a quantized `linear` of
a few rows through ggml's own CPU kernels, llama.cpp's row dot products, called with `jax.ffi`.

Numerics are llama.cpp's, not oi2jax's exact default: each row of x is first rounded to 8 bits per
block of 32 (or 256 for K-quants) values, the kind's `vec_dot_type` (Q8_0, Q8_1 or Q8_K), and the
dot products are integer sums scaled per block (docs/semantics.md, "Quantized weights"; the bound
tests/test_ggml_kernels.py asserts). Weights are placed as GGUF's raw blocks (`raw_tensor`), the
bytes ggml reads, and nothing else. The nn op `attention` of one query row (a decode step) runs
through the handler's second function, which reads each filled K/V row once, with q rounded to the
table's dtype as llama.cpp rounds it (`attention` below).

ggml comes from the `llama-cpp-python` package (the benchmark extra: `pip install
llama-cpp-python`, which builds llama.cpp from source and installs ggml's headers and shared
libraries), or from a built ggml tree named by OI2JAX_GGML_DIR (its `include/` and the directory
holding `libggml-cpu.so` and `libggml-base.so`: `lib/` or `build/src/`). The C++ handler
`ggml_matvec.cc` is compiled once with the system C++ compiler (CXX, default g++; -O3 -march=native)
into the user cache's oi2jax/ggml ($XDG_CACHE_HOME, else ~/.cache), named by a hash of everything it
was built from, the CPU's feature flags included.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
from gguf import GGMLQuantizationType

from ..diagnostics import OiError
from ..xla_cache import user_cache_base

KERNELS = ("jax", "ggml")  # the `kernels=` choices: oi2jax's exact pure-JAX kernels (default), ggml's
SOURCE = Path(__file__).with_name("ggml_matvec.cc")
TARGET = "oi2jax_ggml_matvec"
SYMBOL = "Oi2jaxGgmlMatvec"
ATTENTION_TARGET = "oi2jax_ggml_attention"
ATTENTION_SYMBOL = "Oi2jaxGgmlAttention"
_LIBS = ("libggml-cpu.so", "libggml-base.so")
_HEADERS = ("ggml.h", "ggml-cpu.h")
_lock = threading.Lock()


def check_kernels(kernels) -> str:
    if kernels not in KERNELS:
        raise OiError(f"unknown kernels {kernels!r} (expected one of {', '.join(KERNELS)})")
    return kernels


def _llama_cpp_dirs():
    """(include, lib) of llama-cpp-python's installation, or None when it is not installed. Its
    wheel puts ggml's headers in site-packages/include and the libraries in llama_cpp/lib."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    package = Path(spec.origin).parent
    return package.parent / "include", package / "lib"


def ggml_dirs() -> tuple[Path, Path]:
    """(include dir, library dir) of the ggml to build against: OI2JAX_GGML_DIR, else llama-cpp-python's.
    OiError saying how to get one when neither has ggml's headers and CPU libraries."""
    given = os.environ.get("OI2JAX_GGML_DIR")
    if given:
        root = Path(given)
        libs = [d for d in (root / "lib", root / "build" / "src", root / "build" / "bin", root) if
                all((d / name).exists() for name in _LIBS)]
        dirs, where = (root / "include", libs[0] if libs else root / "lib"), f"OI2JAX_GGML_DIR={given}"
    else:
        dirs, where = _llama_cpp_dirs(), "llama-cpp-python's installation"
    if dirs is None:
        raise OiError("kernels='ggml' needs ggml's headers and CPU libraries: install the benchmark extra "
                      "(pip install llama-cpp-python; it builds llama.cpp from source) or set OI2JAX_GGML_DIR "
                      "to a built ggml tree (docs/performance.md)")
    include, lib = dirs
    missing = [str(include / h) for h in _HEADERS if not (include / h).is_file()] + \
              [str(lib / n) for n in _LIBS if not (lib / n).exists()]
    if missing:
        raise OiError(f"kernels='ggml': {where} lacks {', '.join(missing)} (ggml's headers and CPU libraries)")
    return include, lib


def _cpu_flags() -> str:
    """The CPU's feature flags (Linux's /proc/cpuinfo), part of the built handler's name: it is
    compiled for the CPU it is built on, and a cache shared by other machines must not serve it."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def library_path() -> tuple[Path, list[str]]:
    """Where the built handler lives and the compiler command that builds it (named by a hash of the
    source, the compiler, jax's FFI headers and ggml's headers and libraries)."""
    include, lib = ggml_dirs()
    cxx = os.environ.get("CXX", "g++")
    jax_include = jax.ffi.include_dir()
    command = [cxx, "-O3", "-march=native", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros",
               "-fno-trapping-math", "-std=c++17", "-shared", "-fPIC", f"-I{jax_include}", f"-I{include}", str(SOURCE),
               f"-L{lib}", "-lggml-cpu", "-lggml-base", f"-Wl,-rpath,{lib}"]
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    for part in (*command, jax.__version__, _cpu_flags()):  # -march=native: built for this CPU
        key.update(part.encode() + b"\0")
    for f in [include / h for h in _HEADERS] + [lib / n for n in _LIBS]:
        st = f.stat()
        key.update(f"{f}:{st.st_size}:{st.st_mtime_ns}".encode())
    target = user_cache_base() / "ggml" / f"libggml_matvec-{key.hexdigest()[:16]}.so"
    return target, command


def build() -> Path:
    """The built handler's path, compiling it first when the cache lacks it (written to a temporary
    file beside it, then renamed: a concurrent or interrupted build never leaves a partial library)."""
    target, command = library_path()
    if target.is_file():
        return target
    if shutil.which(command[0]) is None:
        raise OiError(f"kernels='ggml': the C++ compiler {command[0]!r} is not on PATH (set CXX to one)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run(command + ["-o", tmp], capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise OiError(f"kernels='ggml': building {SOURCE.name} failed ({' '.join(command)}):\n{tail}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.cache
def _registered() -> str:
    path = build()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise OiError(f"kernels='ggml': cannot load {path}: {exc}") from None
    for target, symbol in ((TARGET, SYMBOL), (ATTENTION_TARGET, ATTENTION_SYMBOL)):
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    lib.Oi2jaxGgmlSetThreads(ctypes.c_int(threads()))
    return str(path)


THREADS_ENV = "OI2JAX_GGML_THREADS"


def threads(environ=os.environ) -> int:
    """The threads a decode step's product may use, the calling one included (the handler's spinning
    helpers are this minus one): `OI2JAX_GGML_THREADS` when set (a positive integer), else the
    CPUs this process may run on (as llama.cpp's default uses the machine's cores)."""
    text = environ.get(THREADS_ENV)
    if text is None or not text.strip():
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):  # not Linux
            return max(1, os.cpu_count() or 1)
    try:
        n = int(text.strip())
    except ValueError:
        n = 0
    if not 1 <= n <= 1024:
        raise OiError(f"{THREADS_ENV}={text!r}: expected the number of threads for kernels='ggml', an integer "
                      f"from 1 to 1024 (1: the calling thread only)")
    return n


def ensure() -> str:
    """Build (once) and register the handler with XLA's CPU client; its path. Called where a program
    is compiled with kernels='ggml', so a missing ggml is reported there, not inside a trace."""
    with _lock:
        return _registered()


def matvec(x, raw, kind: str):
    """x [..., in] (f32) @ W^T for W [out, in] given as GGUF's raw blocks `raw` uint8 [out, in /
    block * bytes]: f32 [..., out], llama.cpp's numerics. jax.vmap adds leading axes to x (the
    unbatched weight gets axes of 1, which the handler accepts)."""
    ensure()
    out = raw.shape[0]
    x = x.astype(jnp.float32)
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(x.shape[:-1] + (out,), jnp.float32),
                            vmap_method="expand_dims")
    return call(x, raw, type=int(GGMLQuantizationType[kind]))


ATTENTION_TABLES = (jnp.float32, jnp.float16, jnp.bfloat16)  # the table dtypes the handler reads


def attention(q, k, v, layer, lo, n, scale, softcap):
    """One query row's attention over rows lo..n-1 of table `layer` of k/v ([L, T, KVH, HD], or
    [T, KVH, HD] with layer 0), as llama.cpp computes a decode step's: q [KVH, G, HD] rounded to
    the table's type for the scores (llama.cpp's row dot products), the softmax and the sum of the
    V rows in f32 -> f32 [KVH, G, HD]. softcap <= 0: none. Under jax.vmap (a batch's slots) one
    call for the batch, each slot's row reading its own table in place (a call per slot would
    slice each slot's whole table out first)."""
    ensure()
    q = q.astype(jnp.float32)
    if k.ndim == 3:  # one table: [1, T, KVH, HD] (a reshape, no copy)
        k, v = k[None], v[None]
    meta = jnp.stack([jnp.asarray(x, jnp.int32).reshape(()) for x in (layer, lo, n)])
    factors = jnp.stack([jnp.asarray(x, jnp.float32).reshape(()) for x in (scale, softcap)])
    call = jax.ffi.ffi_call(ATTENTION_TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method="expand_dims")
    return call(q, k, v, meta, factors)
