"""`@oi2jax.ops.op(...)`: declare an op from its JAX kernel (docs/ops.md), and `from_schema`: an op
from an OpenInfer `ops.json`-format entry.

    import jax.numpy as jnp
    from oi2jax.ops import op

    @op(inputs={"x": "float"}, attrs={"scale": 1.0}, elementwise=True,
        reference=lambda x, scale: np.tanh(x) * scale)
    def scaled_tanh(x, *, scale):
        return jnp.tanh(x) * scale

The decorator returns the function unchanged, with its `OpDef` as `fn.oi2jax_op`; nothing is
registered anywhere: loading a module (`oi2jax.ops.load`, `--ops FILE.py`, `ops=[...]`) collects
the ops it declares into a registry value.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

from .. import dtypes as D
from ..diagnostics import suggest
from ..naming import RUST_KEYWORDS
from .dispatch import raised
from .errors import OpTypeError
from .shapes import broadcast_shapes
from .registry import ATTR_KINDS, DYNAMIC, AttrSpec, InputSpec, OpDef, dtype_set

_NAME_OK = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"  # SPEC §1.2 NAME (case-sensitive)


@dataclass(frozen=True)
class Attr:
    """An attribute of an added op: kind 'float' | 'int' | 'bool' | 'string' | 'dtype' | 'int_list'
    (ints or size names) | 'scalar' (OpenInfer's: any number or bool); `default` None and
    `required=False`: optional, absent from the kernel's keywords when not given."""

    kind: str
    default: object = None
    required: bool = False
    doc: str = ""
    static: bool = False  # a literal only (it fixes the output's shape): a variable is a check error
    rows: object = False  # a variable may hold one value per row, not only a scalar (softmax's valid=): AttrSpec.rows


def _attr_from(name: str, value, where: str) -> AttrSpec:
    if isinstance(value, AttrSpec):
        return value
    if isinstance(value, Attr):
        a = value
    elif isinstance(value, str) and value in ("float", "int", "bool", "string", "dtype", "int_list", "scalar"):
        a = Attr(value, required=True)
    elif isinstance(value, bool):
        a = Attr("bool", value)
    elif isinstance(value, int):
        a = Attr("int", value)
    elif isinstance(value, float):
        a = Attr("float", value)
    elif isinstance(value, (tuple, list)):
        a = Attr("int_list", tuple(value))
    else:
        raise OpTypeError(f"{where}: attribute {name}: give a default value or a kind (float, int, bool, string, "
                          f"dtype, int_list, scalar) or oi2jax.ops.Attr(...), not {value!r}")
    if a.kind not in ATTR_KINDS:
        raise OpTypeError(f"{where}: attribute {name}: unknown kind {a.kind!r} (expected one of "
                          f"{', '.join(ATTR_KINDS)})")
    if a.default is not None and not _default_ok(a.kind, a.default):
        raise OpTypeError(f"{where}: attribute {name}: default {a.default!r} is not a{'n' if a.kind[0] in 'aeiou' else ''} "
                          f"{a.kind} value")
    if a.kind == "int_list" and isinstance(a.default, list):
        a = dataclasses.replace(a, default=tuple(a.default))
    return AttrSpec(name, a.kind, a.default, a.required and a.default is None, None, (), a.doc, a.static,
                    a.rows)


def _inputs_from(inputs, where: str) -> tuple[InputSpec, ...]:
    if isinstance(inputs, Mapping):
        items = list(inputs.items())
    else:
        items = [(n, None) for n in inputs]
    if not items:
        raise OpTypeError(f"{where}: an op needs at least one input")
    out = []
    for i, (name, dtypes) in enumerate(items):
        if i == 0 and dtypes in (None, "same"):
            dtypes = "float"  # the default: a float op
        name = str(name)
        optional = name.endswith("?")  # "bias?": an optional trailing input
        name = name.rstrip("?")
        if out and out[-1].optional and not optional:
            raise OpTypeError(f"{where}: input {name} follows an optional input: only trailing inputs may be optional")
        if optional and i == 0:
            raise OpTypeError(f"{where}: input {name}: the first input cannot be optional")
        out.append(InputSpec(name, dtype_set(dtypes, f"{where}: input {name}"), optional))
    return tuple(out)


def _out_dtype_rule(rule, attrs: Mapping[str, AttrSpec], inputs: tuple[InputSpec, ...], name: str,
                    where: str) -> Callable:
    if callable(rule):
        def user_rule(in_dtypes, attr_lits):
            try:
                out = rule(list(in_dtypes), {k: getattr(v, "value", v) for k, v in attr_lits.items()})
            except OpTypeError:
                raise
            except Exception as exc:  # user code: a named error, never a traceback
                raise raised(f"op {name} (defined in {where})", exc, "output dtype rule") from None
            if not isinstance(out, str) or not D.is_dtype(out):
                raise OpTypeError(f"op {name} (defined in {where}): its output dtype rule returned {out!r}, "
                                  f"not a dtype name")
            return out
        return user_rule
    if rule in (None, "same"):
        return lambda in_dtypes, _: in_dtypes[0]
    if isinstance(rule, str) and rule.startswith("attr:"):
        attr = rule[5:]
        if attr not in attrs or attrs[attr].kind != "dtype":
            raise OpTypeError(f"{where}: out_dtype {rule!r} names no dtype attribute")
        return lambda in_dtypes, attr_lits: str(getattr(attr_lits[attr], "value", attr_lits[attr])) \
            if attr in attr_lits else attrs[attr].default_for(in_dtypes[0])
    if isinstance(rule, str) and rule.startswith("input:"):
        text = rule[6:]
        index = int(text) if text.isdigit() and text.isascii() else None
        if index is None or index >= len(inputs):
            listing = ", ".join(f"{i} ({x.name})" for i, x in enumerate(inputs))
            raise OpTypeError(f"{where}: out_dtype {rule!r} names no input of the op (N is one of {listing})")
        if inputs[index].optional:
            raise OpTypeError(f"{where}: out_dtype {rule!r} names input {index} ({inputs[index].name}), which is "
                              f"optional: a node may leave it out")
        return lambda in_dtypes, _: in_dtypes[index]
    if isinstance(rule, str) and D.is_dtype(rule):
        return lambda in_dtypes, _: rule
    raise OpTypeError(f"{where}: out_dtype must be 'same', a dtype, 'attr:NAME', 'input:N' or a function, not {rule!r}")


def _shape_rule(shape, elementwise: bool, name: str, where: str) -> Callable | None:
    if shape is None and not elementwise:
        return None  # from the kernel (jax.eval_shape)
    if shape in ("broadcast", None):
        def broadcast(shapes, attrs):
            if any(s is None for s in shapes):
                return None
            out = tuple(shapes[0])
            for s in shapes[1:]:
                out = broadcast_shapes(out, tuple(s))
            return out
        return broadcast
    if shape == "same":
        return lambda shapes, attrs: None if shapes[0] is None else tuple(shapes[0])
    if callable(shape):
        def user_rule(shapes, attrs):
            # an attribute given as a variable reaches the rule as oi2jax.ops.DYNAMIC: a rule that
            # needs its value may fail on it, and the shape is then left to run time
            if any(s is None for s in shapes):
                return None
            dynamic = any(v is DYNAMIC for v in attrs.values())
            try:
                out = shape([tuple(s) for s in shapes], dict(attrs))
            except OpTypeError:
                raise
            except Exception as exc:
                if dynamic:
                    return None
                raise OpTypeError(f"op {name} (defined in {where}): its shape rule raised "
                                  f"{type(exc).__name__}: {exc}") from None
            if out is None:
                return None
            try:
                return tuple(int(d) for d in out)
            except (TypeError, ValueError):
                raise OpTypeError(f"op {name} (defined in {where}): its shape rule returned {out!r}, "
                                  f"not a tuple of ints") from None
        return user_rule
    raise OpTypeError(f"{where}: shape must be None (from the kernel), 'same', 'broadcast' or a function, "
                      f"not {shape!r}")


def _source_of(fn) -> str:
    try:
        path = inspect.getsourcefile(fn) or "<unknown>"
        line = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return getattr(fn, "__module__", "<unknown>")
    return f"{path}:{line}"


def _kernel_caller(fn: Callable) -> Callable:
    """The registry's kernel form `(inputs, attrs, ctx)` of a user kernel `fn(*inputs, **attrs)`
    (`ctx=` passed too when the function takes it)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    wants_ctx = "ctx" in params

    def kernel(inputs, attrs, ctx):
        kw = {k: v for k, v in attrs.items()}
        if wants_ctx:
            kw["ctx"] = ctx
        return fn(*inputs, **kw)
    kernel.__wrapped__ = fn
    return kernel


def _reference_caller(ref: Callable | None) -> Callable | None:
    if ref is None:
        return None
    try:
        wants_ctx = "ctx" in inspect.signature(ref).parameters
    except (TypeError, ValueError):
        wants_ctx = False

    def reference(inputs, attrs, ctx):
        return ref(*inputs, **attrs, **({"ctx": ctx} if wants_ctx else {}))
    reference.__wrapped__ = ref
    return reference


def make_op(fn: Callable, name: str | None = None, *, inputs=("x",), attrs=None, out_dtype="same", shape=None,
            elementwise: bool = False, inplace: bool = True, reference=None, samples=None, category: str = "user",
            doc: str | None = None, op_set: str = "user", source: str | None = None, quantized=()) -> OpDef:
    name = name or fn.__name__
    where = source or _source_of(fn)
    if not isinstance(name, str) or not name or name[0].isdigit() or any(c not in _NAME_OK for c in name):
        raise OpTypeError(f"{where}: op name {name!r} is not a DSL identifier (ASCII letters, digits and _, not "
                          f"starting with a digit: SPEC §1.2)")
    if name in RUST_KEYWORDS:
        raise OpTypeError(f"{where}: op name {name!r} is a reserved word and cannot be used as a name (SPEC §1: "
                          f"Rust keywords and a lone _ are not names)")
    attr_specs = {k: _attr_from(k, v, where) for k, v in (attrs or {}).items()}
    inputs_t = _inputs_from(inputs, where)
    dtype_rule = _out_dtype_rule(out_dtype, attr_specs, inputs_t, name, where)
    unknown = sorted(set(quantized) - {i.name for i in inputs_t})
    if unknown:
        raise OpTypeError(f"{where}: quantized names {unknown[0]!r}, not one of the op's inputs")
    return OpDef(
        name=name, category=category, inputs=inputs_t, attrs=MappingProxyType(attr_specs),
        kernel=_kernel_caller(fn), out_dtype=dtype_rule,
        shape=_shape_rule(shape, elementwise, name, where),
        type_rule=MappingProxyType({"kind": "oi2jax", "out_dtype": out_dtype if isinstance(out_dtype, str)
                                    else "function"}),
        broadcast=elementwise and len(inputs_t) > 1, elementwise=elementwise, inplace=inplace,
        reference=_reference_caller(reference), samples=samples, quantized_inputs=frozenset(quantized),
        doc=(doc if doc is not None else inspect.getdoc(fn) or "").strip(), source=where, op_set=op_set)


def op(name: str | None = None, **declaration):
    """Declare an op; the decorated function is its JAX kernel `fn(*inputs, **attrs)`.

    inputs: names (`["x", "w"]`: the first a float, the others of its dtype) or `{name: dtypes}`
      where dtypes is a group ('float', 'int', 'index', 'signed', 'unsigned', 'bool', 'numeric',
      'any'), a dtype, a list of those, or 'same' (the first input's dtype). A name ending in `?`
      (`"bias?"`) is optional: trailing inputs only; a node without it calls the kernel and
      reference without it (give that parameter a default of None).
    attrs: `{name: default}` (kind from the default's type), `{name: kind}` (required), or
      `{name: Attr(kind, default, required)}`.
    out_dtype: 'same' | a dtype | 'attr:NAME' | 'input:N' | fn(in_dtypes, attrs) -> dtype.
    shape: None (from the kernel, by `jax.eval_shape`) | 'same' | 'broadcast' | fn(in_shapes, attrs)
      (an attribute given as a variable reaches it as `oi2jax.ops.DYNAMIC`; return None when the
      shape depends on it).
    elementwise: the output has the broadcast shape of the inputs, and it may take a runtime-shaped
      (`@auto_dim`) operand.
    inplace: the output may be one of the inputs (`op rope(q, p) >> q;`; default true: a result is a
      new value either way, docs/semantics.md; ops.json-form ops keep their schema's flag).
    reference: a NumPy function with the kernel's signature (tests; the interpreter runs it).
    samples: fn(rng, dtype) -> [(inputs, attrs), ...]: cases for the generated tests.
    quantized: names of inputs whose kernel also takes a `quantized.QuantTensor` (a constant kept
      in GGML blocks, e.g. linear's weight); any other input gets such a constant dequantized.
    """
    if callable(name) and not declaration:  # bare @op
        return op()(name)

    def decorate(fn):
        fn.oi2jax_op = make_op(fn, name, **declaration)
        return fn
    return decorate


# --------------------------------------------------------------------- OpenInfer ops.json form

MAX_INPUTS = 256  # an op's inputs: a schema's "count" past this is refused before anything is built

# the keys of OpenInfer's ops.json (and oi2jax's additions: an attr_def's default/required, an
# entry's dtypes and devices.jax.kernel); any other key is an error, never ignored
_FILE_KEYS = ("version", "attr_defs", "dtype_sets", "output_dtype_sets", "ops")
_ENTRY_KEYS = ("name", "kind", "inputs", "outputs", "attrs", "broadcast", "inplace", "accumulate", "type_rule",
               "dtype_support_ref", "output_dtypes_ref", "dtypes", "devices", "category")
_ARITY_KEYS = ("arity", "count")
_ATTR_DEF_KEYS = ("kind", "default", "required", "scalar_kinds")
_DTYPE_SET_KEYS = ("normal", "accumulate")
_TYPE_RULE_KEYS = {"same_as_input": ("kind", "index"), "fixed": ("kind", "dtype"), "acc_from_attr": ("kind", "attr")}
_SCALAR_KINDS = ("float", "int", "uint", "bool")
_ATTACHED = ("_attr_defs", "_dtype_sets", "_output_dtype_sets", "_path", "_index")  # what load_schema adds


def _json_word(value) -> str:
    """What a JSON value is, for a message: `"false" (a string)`, `[1] (a list)`."""
    kind = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return f"{text if len(text) <= 40 else text[:32] + '...'} ({kind})"


def _known_keys(obj: dict, known, where: str) -> None:
    for key in obj:
        if key not in known:
            raise OpTypeError(f"{where}: unknown key \"{key}\"{suggest(str(key), known)} (known keys: "
                              f"{', '.join(known)})")


def _whole(value, where: str, low: int, high: int) -> int:
    """A JSON count or index: an integer (not true/false, not 1.0) in low..high."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise OpTypeError(f"{where} must be a whole number in {low}..{high}, got {_json_word(value)}")
    return value


def _default_ok(kind: str, value, scalar_kinds=()) -> bool:
    """An attribute's default has its declared kind (a dtype-dependent default, a function, is not checked)."""
    if callable(value):
        return True
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "float":
        return number
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "dtype":
        return isinstance(value, str) and D.is_dtype(value)
    if kind == "int_list":
        return isinstance(value, (list, tuple)) and all(
            isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) for v in value)
    if kind == "scalar":
        if not (number or isinstance(value, bool)):
            return False
        word = "bool" if isinstance(value, bool) else "float" if isinstance(value, float) else "int"
        return not scalar_kinds or word in scalar_kinds or (word == "int" and value >= 0 and "uint" in scalar_kinds)
    return True


def _attr_def(name: str, d, where: str) -> AttrSpec:
    """An `attr_defs` entry, every field checked (no coercion: `"required": "false"` is a string)."""
    at = f"{where}: attr_defs.{name}"
    if not isinstance(d, dict):
        raise OpTypeError(f"{at}: expected an object with a \"kind\", got {_json_word(d)}")
    _known_keys(d, _ATTR_DEF_KEYS, at)
    kind = d.get("kind")
    if kind not in _SCHEMA_KINDS:
        raise OpTypeError(f"{at}: \"kind\" must be one of {', '.join(_SCHEMA_KINDS)}, got {_json_word(kind)}")
    required = d.get("required", False)
    if not isinstance(required, bool):
        raise OpTypeError(f"{at}: \"required\" must be true or false, got {_json_word(required)}")
    kinds = d.get("scalar_kinds", [])
    if not isinstance(kinds, list) or any(k not in _SCALAR_KINDS for k in kinds):
        raise OpTypeError(f"{at}: \"scalar_kinds\" must be a list of {', '.join(_SCALAR_KINDS)}, got "
                          f"{_json_word(kinds)}")
    if kinds and kind != "scalar":
        raise OpTypeError(f"{at}: \"scalar_kinds\" is for a scalar attribute, not a {kind} one")
    default = d.get("default")
    if default is not None and not _default_ok(_SCHEMA_KINDS[kind], default, kinds):
        want = f"{' or '.join(kinds)} " if kinds else ""
        raise OpTypeError(f"{at}: \"default\" {_json_word(default)} is not a {want}{kind} value")
    if isinstance(default, list):
        default = tuple(default)
    return AttrSpec(name, _SCHEMA_KINDS[kind], default, required and default is None, None, tuple(kinds))


def load_schema(path) -> dict[str, dict]:
    """The op entries of an OpenInfer `ops.json`-format file, by name, each with its file's
    `attr_defs` and `dtype_sets` attached (`_attr_defs`, `_dtype_sets`, `_path`). The file's
    shape is checked here: its keys, `attr_defs` and `dtype_sets`, one entry per name."""
    path = os.fspath(path)
    try:
        data = json.loads(open(path, encoding="utf-8").read())
    except FileNotFoundError:
        raise OpTypeError(f"op schema file not found: {path}") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise OpTypeError(f"{path}: cannot read the op schema: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("ops"), list):
        raise OpTypeError(f"{path}: not an OpenInfer ops.json schema (expected an object with an \"ops\" list)")
    _known_keys(data, _FILE_KEYS, path)
    attr_defs = data.get("attr_defs", {})
    if not isinstance(attr_defs, dict):
        raise OpTypeError(f"{path}: attr_defs: expected an object (attribute name -> definition), got "
                          f"{_json_word(attr_defs)}")
    for name, d in attr_defs.items():
        _attr_def(name, d, path)
    sets = data.get("dtype_sets", {})
    if not isinstance(sets, dict):
        raise OpTypeError(f"{path}: dtype_sets: expected an object (set name -> {{\"normal\": [...]}}), got "
                          f"{_json_word(sets)}")
    for name, d in sets.items():
        _dtype_set_normal(name, d, path)
    outputs = data.get("output_dtype_sets", {})  # name -> the output dtypes an op may give (cast's `to`)
    if not isinstance(outputs, dict) or not all(isinstance(v, list) and v and all(isinstance(x, str) and D.is_dtype(x)
                                                                                  for x in v) for v in outputs.values()):
        raise OpTypeError(f"{path}: output_dtype_sets: expected an object (set name -> a non-empty list of dtypes), "
                          f"got {_json_word(outputs)}")
    out: dict[str, dict] = {}
    for i, entry in enumerate(data["ops"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise OpTypeError(f"{path}: ops[{i}]: an op entry needs a \"name\"")
        first = out.get(entry["name"])
        if first is not None:
            raise OpTypeError(f"{path}: ops[{i}]: op {entry['name']} is defined twice in the file: ops[{first['_index']}] "
                              f"and ops[{i}]")
        out[entry["name"]] = dict(entry, _attr_defs=attr_defs, _dtype_sets=sets, _output_dtype_sets=outputs,
                                  _path=path, _index=i)
    return out


def _dtype_set_normal(name: str, d, where: str) -> list:
    """A `dtype_sets` entry's `normal` list (the first input's dtypes), checked."""
    at = f"{where}: dtype_sets.{name}"
    if not isinstance(d, dict):
        raise OpTypeError(f"{at}: expected an object with a \"normal\" list, got {_json_word(d)}")
    _known_keys(d, _DTYPE_SET_KEYS, at)
    normal = d.get("normal")
    if not isinstance(normal, list) or not normal or not all(isinstance(x, str) for x in normal):
        raise OpTypeError(f"{at}: \"normal\" must be a non-empty list of dtypes, got {_json_word(normal)}")
    if not isinstance(d.get("accumulate", []), list):
        raise OpTypeError(f"{at}: \"accumulate\" must be a list, got {_json_word(d['accumulate'])}")
    return normal


_SCHEMA_KINDS = {"dtype": "dtype", "scalar": "scalar", "int_list": "int_list", "string": "string"}


def from_schema(entry: dict, kernel: Callable, *, reference=None, samples=None, op_set: str = "user",
                source: str | None = None) -> OpDef:
    """An op from an OpenInfer ops.json-format entry (SPEC §6: arity, attrs by `attr_defs` kind,
    broadcast/inplace allow|deny, `type_rule` same_as_input|fixed|acc_from_attr, the `normal`
    dtypes of the first input from `dtype_support_ref`) and its JAX kernel `fn(*inputs, **attrs)`."""
    fields = schema_fields(entry, source)
    rule, broadcast, allowed = fields.pop("type_rule"), fields.pop("broadcast"), fields.pop("output_dtypes")
    op_def = make_op(kernel, reference=reference, samples=samples, op_set=op_set, **fields)

    def check(_in_dtypes, out_dtype, _attrs, spec):  # `output_dtypes_ref`: the dtypes its output may have
        if out_dtype not in allowed:
            raise OpTypeError(f"{spec.where()}: output dtype {out_dtype} is not in its output_dtypes_ref set "
                              f"{entry['output_dtypes_ref']} ({', '.join(allowed)})")
    return dataclasses.replace(op_def, broadcast=broadcast, type_rule=MappingProxyType(dict(rule)),
                               check=check if allowed is not None else None)


def schema_fields(entry: dict, source: str | None = None) -> dict:
    """An ops.json-form entry, every key checked with its type (a wrong one is an error naming the
    entry and the key; an unknown key is an error with a suggestion), as `make_op`'s keywords
    (and `broadcast`, `type_rule`): what `from_schema` declares, checked before any kernel is loaded."""
    path = entry.get("_path", "<schema>")
    where = source or f"{path}: ops[{entry.get('_index', '?')}] ({entry.get('name', '?')})"
    _known_keys({k: v for k, v in entry.items() if k not in _ATTACHED}, _ENTRY_KEYS, where)

    def need(key, kinds, word):
        if key not in entry:
            raise OpTypeError(f"{where}: missing \"{key}\"")
        if not isinstance(entry[key], kinds):
            raise OpTypeError(f"{where}: \"{key}\" must be {word}, got {_json_word(entry[key])}")
        return entry[key]

    def choice(key, default, allowed):
        value = entry.get(key, default)
        if value not in allowed or not isinstance(value, str):
            raise OpTypeError(f"{where}: \"{key}\" must be {' or '.join(json.dumps(a) for a in allowed)}, got "
                              f"{_json_word(value)}")
        return value

    name = need("name", str, "a string")
    for key in ("kind", "category"):
        if key in entry and not isinstance(entry[key], str):
            raise OpTypeError(f"{where}: \"{key}\" must be a string, got {_json_word(entry[key])}")
    ins = need("inputs", dict, "an object {\"arity\": \"fixed\", \"count\": N}")
    _known_keys(ins, _ARITY_KEYS, f"{where}: inputs")
    if ins.get("arity") != "fixed":
        raise OpTypeError(f"{where}: inputs.arity must be \"fixed\", got {_json_word(ins.get('arity'))}")
    count = _whole(ins.get("count"), f"{where}: inputs.count", 1, MAX_INPUTS)
    outs = entry.get("outputs", {"arity": "fixed", "count": 1})
    if not isinstance(outs, dict):
        raise OpTypeError(f"{where}: \"outputs\" must be an object {{\"arity\": \"fixed\", \"count\": 1}}, "
                          f"got {_json_word(outs)}")
    _known_keys(outs, _ARITY_KEYS, f"{where}: outputs")
    if outs.get("arity", "fixed") != "fixed" or outs.get("count", 1) != 1 or isinstance(outs.get("count"), bool):
        raise OpTypeError(f"{where}: an op has exactly one output (outputs must be {{\"arity\": \"fixed\", "
                          f"\"count\": 1}}, got arity {_json_word(outs.get('arity'))}, count "
                          f"{_json_word(outs.get('count'))})")
    attr_defs = entry.get("_attr_defs", {})
    if not isinstance(attr_defs, dict):
        raise OpTypeError(f"{path}: attr_defs: expected an object, got {_json_word(attr_defs)}")
    attrs = {}
    names = need("attrs", list, "a list of attribute names") if "attrs" in entry else []
    for a in names:
        if not isinstance(a, str):
            raise OpTypeError(f"{where}: \"attrs\" must list attribute names, got {_json_word(a)}")
        if a in attrs:
            raise OpTypeError(f"{where}: \"attrs\" lists {a} twice")
        if a not in attr_defs:
            raise OpTypeError(f"{where}: attribute {a} has no attr_defs entry{suggest(a, attr_defs)} (add "
                              f"\"attr_defs\": {{\"{a}\": {{\"kind\": ...}}}} with a kind: dtype, scalar, int_list, string)")
        attrs[a] = _attr_def(a, attr_defs[a], path)
    broadcast = choice("broadcast", "deny", ("allow", "deny"))
    inplace = choice("inplace", "deny", ("allow", "deny"))
    if entry.get("accumulate", "deny") != "deny":
        raise OpTypeError(f"{where}: accumulate is not supported for added ops (use acc in the kernel)")
    rule = need("type_rule", dict, "an object")
    kind = rule.get("kind")
    if kind not in _TYPE_RULE_KEYS:
        raise OpTypeError(f"{where}: type_rule kind {kind!r} (expected same_as_input, fixed or acc_from_attr)")
    _known_keys(rule, _TYPE_RULE_KEYS[kind], f"{where}: type_rule ({kind})")
    if kind == "same_as_input":
        index = rule.get("index", 0)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise OpTypeError(f"{where}: type_rule index {_json_word(index)} is not an input (0..{count - 1})")
        out_dtype = f"input:{index}"
    elif kind == "fixed":
        dtype = rule.get("dtype")
        if not isinstance(dtype, str) or not D.is_dtype(dtype):
            raise OpTypeError(f"{where}: type_rule fixed dtype {_json_word(dtype)} is not a dtype"
                              f"{suggest(dtype, D.DTYPES) if isinstance(dtype, str) else ''}")
        out_dtype = dtype
    else:
        if not isinstance(rule.get("attr"), str) or rule["attr"] not in attrs:
            raise OpTypeError(f"{where}: type_rule attr {_json_word(rule.get('attr'))} is not one of its attrs")
        if attrs[rule["attr"]].kind != "dtype":
            raise OpTypeError(f"{where}: type_rule attr {rule['attr']} is not a dtype attribute")
        out_dtype = f"attr:{rule['attr']}"
    ref = entry.get("dtype_support_ref")
    sets = entry.get("_dtype_sets", {})
    if not isinstance(sets, dict):
        raise OpTypeError(f"{path}: dtype_sets: expected an object, got {_json_word(sets)}")
    if ref is not None:
        if not isinstance(ref, str) or ref not in sets:
            raise OpTypeError(f"{where}: dtype_support_ref {_json_word(ref)} is not in dtype_sets"
                              f"{suggest(ref, sets) if isinstance(ref, str) else ''}")
        if "dtypes" in entry:
            raise OpTypeError(f"{where}: give \"dtype_support_ref\" or \"dtypes\", not both")
        normal = _dtype_set_normal(ref, sets[ref], path)
    else:
        normal = entry.get("dtypes", "float")
        if not isinstance(normal, str) and not (isinstance(normal, list) and normal
                                                and all(isinstance(x, str) for x in normal)):
            raise OpTypeError(f"{where}: \"dtypes\" must be a dtype group or a list of dtypes, got "
                              f"{_json_word(normal)}")
    devices = entry.get("devices", {})
    if not isinstance(devices, dict) or not all(isinstance(v, dict) for v in devices.values()):
        raise OpTypeError(f"{where}: \"devices\" must be an object of objects (device -> its settings), got "
                          f"{_json_word(devices)}")
    if "jax" in devices:
        _known_keys(devices["jax"], ("kernel",), f"{where}: devices.jax")
    oref, outputs = entry.get("output_dtypes_ref"), entry.get("_output_dtype_sets", {})
    if oref is not None and (not isinstance(oref, str) or oref not in outputs):
        raise OpTypeError(f"{where}: output_dtypes_ref {_json_word(oref)} is not in output_dtype_sets"
                          f"{suggest(oref, outputs) if isinstance(oref, str) else ''}")
    input_names = [f"x{i}" for i in range(count)]
    inputs = {input_names[0]: normal, **{n: "same" for n in input_names[1:]}}
    elementwise = broadcast == "allow"
    return dict(name=name, inputs=inputs, attrs=attrs, out_dtype=out_dtype,
                shape="broadcast" if elementwise else None, elementwise=False, inplace=inplace == "allow",
                category=entry.get("category", "user"), source=where, broadcast=elementwise, type_rule=rule,
                output_dtypes=None if oref is None else tuple(outputs[oref]))


del np
