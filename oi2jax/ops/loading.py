"""`load(specs) -> Registry`: the built-in ops plus the op sets named by `specs` (docs/ops.md).

A spec is, in this order of lookup:
  1. a bundled set name: `nn`;
  2. a `.py` file (its ops: every function decorated with `@oi2jax.ops.op`, and `OPS`, a list);
  3. a `.json` file in OpenInfer's ops.json form whose entries name their kernels
     (`"devices": {"jax": {"kernel": "FILE.py:function" | "module:function"}}`);
  4. the name of an installed package's entry point in the group `oi2jax.ops`;
  5. an importable module name.
In Python, a spec may also be a module, a decorated function, an `OpDef`, a `Registry` or a list.
A name defined twice (a clash with a built-in or with another loaded op) is an error naming both.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
from importlib.metadata import entry_points
import os
import sys
from pathlib import Path
from types import ModuleType

from ..diagnostics import OiError, suggest
from .define import from_schema, load_schema, schema_fields
from .errors import OpTypeError
from .registry import OpDef, Registry, builtin_registry

BUNDLED = {"nn": "oi2jax.ops.nn"}
ENTRY_POINT_GROUP = "oi2jax.ops"


def load(specs=None, base: Registry | None = None) -> Registry:
    """The registry of the built-in ops (or `base`) extended by every op set in `specs`."""
    reg = base if base is not None else builtin_registry()
    if specs is None:
        return reg
    if isinstance(specs, (str, os.PathLike, ModuleType, OpDef, Registry)) or callable(specs):
        specs = [specs]
    for spec in specs:
        if isinstance(spec, Registry):
            defs, set_name = spec.added(), ",".join(spec.sets) or "registry"
        else:
            defs, set_name = _defs_of(spec)
        try:
            reg = reg.extend(defs, set_name)
        except OpTypeError as exc:
            raise OiError(exc.message) from None
    return reg


def _defs_of(spec) -> tuple[list[OpDef], str]:
    if isinstance(spec, OpDef):
        return [spec], spec.op_set
    if callable(spec) and hasattr(spec, "oi2jax_op"):
        return [spec.oi2jax_op], spec.oi2jax_op.op_set
    if isinstance(spec, ModuleType):
        return module_ops(spec), spec.__name__
    if not isinstance(spec, (str, os.PathLike)):
        raise OiError(f"ops: cannot load {spec!r} (expected a set name, a .py or .json path, a module name, "
                      f"a module, a decorated function or an OpDef)")
    text = os.fspath(spec)
    if text in BUNDLED:
        return module_ops(importlib.import_module(BUNDLED[text])), text
    if text.endswith(".py"):
        return module_ops(_import_file(text)), text
    if text.endswith(".json"):
        return _schema_file_ops(text), text
    ep = _entry_points().get(text)
    if ep is not None:
        try:
            target = ep.load()
        except SystemExit as exc:
            raise _exited(f"--ops {text}: entry point {ep.value}", exc) from None
        except Exception as exc:
            raise OiError(f"--ops {text}: loading entry point {ep.value} raised {type(exc).__name__}: {exc}") from None
        defs, _ = _defs_of(target) if not isinstance(target, (list, tuple)) else (
            [d for t in target for d in _defs_of(t)[0]], text)
        return defs, text
    if os.sep in text or "/" in text or Path(text).exists():
        raise OiError(f"--ops {text}: not found (expected a .py or .json file)" if not Path(text).exists()
                      else f"--ops {text}: expected a .py or .json file")
    try:
        module = importlib.import_module(text)
    except ModuleNotFoundError as exc:
        if exc.name is not None and text.split(".")[0] != exc.name.split(".")[0]:
            raise OiError(f"--ops {text}: importing it failed: {exc}") from None
        known = list(BUNDLED) + list(_entry_points())
        raise OiError(f"unknown op set {text}{suggest(text, known)} (expected a bundled set ({', '.join(BUNDLED)}), "
                      f"a .py or .json file, an installed {ENTRY_POINT_GROUP} entry point or a module name)") from None
    except SystemExit as exc:
        raise _exited(f"--ops {text}", exc) from None
    except Exception as exc:
        raise OiError(f"--ops {text}: importing it raised {type(exc).__name__}: {exc}") from None
    return module_ops(module), text


def module_ops(module: ModuleType) -> list[OpDef]:
    """The ops a module declares: its decorated functions (in definition order) and its `OPS` list."""
    out: list[OpDef] = []
    where = getattr(module, "__file__", None) or module.__name__
    listed = getattr(module, "OPS", None)
    if listed is not None and not isinstance(listed, (list, tuple)):
        raise OiError(f"--ops {where}: OPS must be a list of ops (OpDefs or @oi2jax.ops.op functions), got "
                      f"{type(listed).__name__} {_shown(listed)}")
    for i, value in enumerate(listed or ()):
        if not isinstance(value, OpDef) and not isinstance(getattr(value, "oi2jax_op", None), OpDef):
            raise OiError(f"--ops {where}: OPS[{i}] is not an op (an OpDef or an @oi2jax.ops.op function), got "
                          f"{type(value).__name__} {_shown(value)}")
    for value in list(vars(module).values()) + list(listed or ()):
        d = value if isinstance(value, OpDef) else getattr(value, "oi2jax_op", None)
        if isinstance(d, OpDef) and not any(d is s for s in out):  # each declaration once
            out.append(d)
    if not out:
        raise OiError(f"--ops {where}: declares no op (decorate kernels with @oi2jax.ops.op)")
    return out


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:32] + "..."


@functools.lru_cache(maxsize=64)
def _import_cached(path: str, stamp: tuple) -> ModuleType:
    """`path` imported once per (mtime, size) stamp: an edited file is imported again."""
    del stamp  # part of the cache key only
    digest = hashlib.sha1(path.encode()).hexdigest()[:10]
    name = f"oi2jax_user_ops_{Path(path).stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except OiError:
        sys.modules.pop(name, None)
        raise
    except OpTypeError as exc:
        sys.modules.pop(name, None)
        raise OiError(exc.message) from None
    except SystemExit as exc:  # a script's exit: an error of the file, never the command's silent end
        sys.modules.pop(name, None)
        raise OiError(f"{path}: the op file called sys.exit({exc.code!r}) while being imported (at "
                      f"{_raised_at(exc, path)})") from None
    except BaseException as exc:
        sys.modules.pop(name, None)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise OiError(f"--ops {path}: importing it raised {type(exc).__name__}: {exc} (at "
                      f"{_raised_at(exc, path)})") from None
    return module


def _raised_at(exc: BaseException, path: str) -> str:
    """`path:LINE` of the innermost frame of `path` the exception passed through (else `path`)."""
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f"{path}:{line}" if line else path


def _exited(what: str, exc: SystemExit) -> OiError:
    return OiError(f"{what}: the op module called sys.exit({exc.code!r}) while being imported")


def _import_file(path: str) -> ModuleType:
    full = os.path.abspath(path)
    try:
        st = os.stat(full)
    except OSError:
        raise OiError(f"--ops {path}: file not found") from None
    return _import_cached(full, (st.st_mtime_ns, st.st_size))


def _resolve_kernel(ref: str, schema_path: str, where: str):
    if not isinstance(ref, str) or ":" not in ref:
        raise OpTypeError(f"{where}: devices.jax.kernel must be \"FILE.py:function\" or \"module:function\", "
                          f"got {ref!r}")
    target, _, fn_name = ref.rpartition(":")
    if target.endswith(".py"):
        path = target if os.path.isabs(target) else os.path.join(os.path.dirname(os.path.abspath(schema_path)),
                                                                     target)
        module = _import_file(path)
    else:
        try:
            module = importlib.import_module(target)
        except SystemExit as exc:
            raise _exited(f"{where}: kernel module {target}", exc) from None
        except Exception as exc:
            raise OpTypeError(f"{where}: kernel module {target}: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise OpTypeError(f"{where}: kernel {ref}: {fn_name} not found in {target}")
    return getattr(fn, "__wrapped__", fn)


def _schema_file_ops(path: str) -> list[OpDef]:
    try:
        entries = load_schema(path)
        out = []
        for name, entry in entries.items():
            where = f"{path}: ops[{entry['_index']}] ({name})"
            schema_fields(entry, where)  # the whole entry checked before its kernel's module is imported
            jax_dev = entry.get("devices", {}).get("jax")
            if not isinstance(jax_dev, dict) or "kernel" not in jax_dev:
                raise OpTypeError(f"{where}: no JAX kernel (add \"devices\": {{\"jax\": {{\"kernel\": "
                                  f"\"FILE.py:function\"}}}})")
            fn = _resolve_kernel(jax_dev["kernel"], path, where)
            out.append(from_schema(entry, fn, op_set=path, source=where))
        return out
    except OpTypeError as exc:
        raise OiError(exc.message) from None


@functools.lru_cache(maxsize=1)
def _entry_points_cached() -> tuple:
    try:
        return tuple(entry_points(group=ENTRY_POINT_GROUP))
    except Exception:  # a broken installed distribution must not break compilation
        return ()


def _entry_points() -> dict:
    return {ep.name: ep for ep in _entry_points_cached()}


def bundled_set_of(op_name: str) -> str | None:
    """The bundled set that defines `op_name`, if any (for the 'unsupported op' hint)."""
    for set_name, module in BUNDLED.items():
        try:
            mod = importlib.import_module(module)
        except Exception:
            continue
        if any(d.name == op_name for d in module_ops(mod)):
            return set_name
    return None
