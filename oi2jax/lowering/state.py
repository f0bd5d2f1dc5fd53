"""The step state: what a program carries from one step to the next, as typed JAX pytrees.

    StepState(vars={P: value}, caches={T: CacheState(data, size, present)}, guards=Guards(flags))

- `vars`: plain persistent variables by declared name (sub-byte dtypes stay packed);
- `caches`: `@table` and `@auto_dim` variables: the data at its current capacity, the logical
  sizes (tables: one per table dim) or growth counts (auto_dim), and for growable tables which
  entries were touched;
- `guards`: bookkeeping the user never names: the first runtime error (`err`: 0 = none, else
  1 + index of the guard site; `errval`: the offending value) and `grow` (capacity each
  growable cache dim needs; a step that asks for more is undone and re-run by the host), as
  one vector.

Inside a trace the lowering works on an `Env` (the carry of every `lax.cond` /
`lax.fori_loop` / `lax.while_loop`): the values by DSL name, the caches as `CacheState`s, the
guards as `TraceGuards(err, errval, grow)` and the logical shapes of runtime-shaped values.
User values and bookkeeping live in different fields, so a variable named `__err` is just a
variable. This module is the ONE place that converts between the two (`StateSpec`) and that
defines what happens at step boundaries: the guard merge ("first error wins",
`TraceGuards.record` / `TraceGuards.merge`), what an await takes from a consumer (`Env.take`)
and commit/undo (`commit`). The fused step, the multi-step loop and the yield/await driver
(whose kernels pass `PhaseIO` records) all call these.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import jax
import jax.export  # a submodule `import jax` does not load
import jax.numpy as jnp
from jax import lax
import numpy as np
from jax.tree_util import DictKey, GetAttrKey, SequenceKey, tree_map_with_path

from .. import dtypes as dt


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class CacheState:
    """One `@table` / `@auto_dim` variable: data at capacity, logical sizes, touched entries."""

    data: object
    size: object  # int64[k]: table sizes, or auto_dim growth counts; None: all dims @fixed (constant)
    present: object = None  # bool[capacity...] for growable tables, else None


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Guards:
    """The recorded runtime error (first one wins) and the capacity the step asked for, as ONE
    int64 vector `[err, errval, grow...]` (a single small buffer: cheaper to pass, donate and
    read back than three)."""

    flags: object  # int64[2 + n_growable]

    @property
    def err(self):
        """0 = no error, else 1 + the index of the guard site that fired first."""
        return self.flags[0]

    @property
    def errval(self):
        """The offending value (an index, a size) of that error."""
        return self.flags[1]

    @property
    def grow(self):
        """The capacity each growable cache dim needs (0 = enough)."""
        return self.flags[2:]


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class StepState:
    """Everything a step carries: user state (`vars`, `caches`) apart from bookkeeping (`guards`)."""

    vars: dict = field(default_factory=dict)
    caches: dict = field(default_factory=dict)
    guards: Guards = None

    def __repr__(self) -> str:
        def show(x):
            return f"{getattr(x, 'dtype', type(x).__name__)}{list(getattr(x, 'shape', ()))}"
        parts = [f"{k}={show(v)}" for k, v in self.vars.items()]
        parts += [f"{k}=cache{show(c.data)}" for k, c in self.caches.items()]
        return f"StepState({', '.join(parts)})"


# ------------------------------------------------------------------------ inside a trace


_ZERO32 = np.int32(0)


def _scalar_bool(cond):
    """A guard's condition as a 0-d bool (JAX's own ops, no nested `jit` per site)."""
    cond = jnp.asarray(cond)
    return cond if cond.shape == () else cond.reshape(())


def _as(value, dtype):
    """A guard's code or value as a 0-d `dtype` array (a Python int: a literal)."""
    if isinstance(value, (int, np.integer)):
        return np.asarray(value, dtype)
    value = jnp.asarray(value)
    return (value if value.dtype == dtype else lax.convert_element_type(value, dtype)).reshape(())


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class TraceGuards:
    """The guards inside a trace, apart: `err` (int32: 0 = fine, else 1 + index into
    `Lowering.error_sites`), `errval` (int64: the offending value, an index or a size) and
    `grow` (int64[n_growable]: the capacity a growable cache dim needs, 0 = enough)."""

    err: object
    errval: object
    grow: object

    def record(self, cond, code, value) -> "TraceGuards":
        """Error `code` with `value` where `cond` holds, unless an error is already recorded:
        THE rule "first error wins" (a guard site, and a consumer's guards merged at an await)."""
        first = lax.bitwise_and(lax.eq(self.err, _ZERO32), _scalar_bool(cond))
        return TraceGuards(lax.select(first, _as(code, jnp.int32), self.err),
                           lax.select(first, _as(value, jnp.int64), self.errval), self.grow)

    def merge(self, other: "TraceGuards") -> "TraceGuards":
        """Fold in another run's guards (a consumer's at an await): its error if none is recorded
        yet, and the larger capacity request per dim."""
        merged = self.record(other.err != 0, other.err, other.errval)
        return replace(merged, grow=jnp.maximum(merged.grow, other.grow))

    def need(self, slot: int, needed) -> "TraceGuards":
        """Ask the host for capacity `needed` on growable slot `slot` (0 = fine)."""
        return replace(self, grow=self.grow.at[slot].max(jnp.asarray(needed, jnp.int64)))

    def vector(self):
        """int64[2 + n_grow]: (err, errval, grow...), `Guards.flags`: one small host transfer."""
        return jnp.concatenate([self.err.astype(jnp.int64).reshape(1), self.errval.astype(jnp.int64).reshape(1),
                                self.grow.astype(jnp.int64)])


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Env:
    """What the lowering rules read and replace while tracing a step: `values` (inputs,
    volatiles, temporaries and plain persistent values by DSL name), `caches` (tables and
    auto_dim tensors: `CacheState`), `guards` (`TraceGuards`) and `shapes` (the logical shape,
    int64[rank], of each runtime-shaped value: `phases.runtime_shaped`). Immutable: each rule
    returns a new one. Its structure never changes inside a step (it is the carry of every
    `lax.cond` / `lax.fori_loop`). The state a step carries is an `Env` too: its values the plain
    persistent ones, no shapes (`StateSpec.to_env`)."""

    values: dict
    caches: dict
    guards: TraceGuards
    shapes: dict = field(default_factory=dict)

    def get(self, name: str):
        """Variable `name`'s array: its value, or a cache's data; None when the env has neither."""
        if name in self.values:
            return self.values[name]
        cache = self.caches.get(name)
        return None if cache is None else cache.data

    def set(self, name: str, value) -> "Env":
        return replace(self, values={**self.values, name: value})

    def update(self, values: dict) -> "Env":
        return replace(self, values={**self.values, **values})

    def set_cache(self, name: str, **parts) -> "Env":
        """Cache `name` with some of its parts (`data`, `size`, `present`) replaced."""
        return replace(self, caches={**self.caches, name: replace(self.caches[name], **parts)})

    def set_shaped(self, name: str, value, logical) -> "Env":
        """Runtime-shaped `name`: its value at capacity and its logical shape."""
        return replace(self, values={**self.values, name: value}, shapes={**self.shapes, name: logical})

    def with_guards(self, guards: TraceGuards) -> "Env":
        return replace(self, guards=guards)

    def only(self, names) -> "Env":
        """The entries (value, cache, logical shape) of the variables `names`; no guards."""
        def pick(d):
            return {k: d[k] for k in names if k in d}
        return Env(pick(self.values), pick(self.caches), None, pick(self.shapes))

    def take(self, other: "Env", names) -> "Env":
        """This env with `other`'s entries of the variables `names`: what an `await` takes from a
        consumer (the variables it may write, `CheckedGraph.writes`), in the fused lowering and
        the driver alike; never its guards, which `TraceGuards.merge` folds in."""
        taken = other.only(names)
        return Env({**self.values, **taken.values}, {**self.caches, **taken.caches}, self.guards,
                   {**self.shapes, **taken.shapes})


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Shaped:
    """A runtime-shaped variable's value in a step's outputs (`phases.runtime_shaped`): the array
    at its capacity shape and its logical shape (int64[rank]), what `Program.trim` cuts it to."""

    value: object
    shape: object


GUARDS = GetAttrKey("guards")
GROW_PATH = (GUARDS, GetAttrKey("grow"))
ERROR_PATHS = ((GUARDS, GetAttrKey("err")), (GUARDS, GetAttrKey("errval")))


def leaf_at(tree, path):
    """The part of `tree` at `path` (a JAX key path of attribute and dict keys)."""
    for key in path:
        tree = tree[key.key] if isinstance(key, DictKey) else getattr(tree, key.name)
    return tree


def select(tree, paths):
    """`tree` with the leaves at `paths` kept and every other leaf None (a partial state)."""
    return tree_map_with_path(lambda path, leaf: leaf if path in paths else None, tree)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class PhaseIO:
    """What a kernel of the yield/await driver takes and returns besides the constants: the `env`;
    into an entry phase after an await, the guards of the awaited consumers that may record one
    (`pending`, merged in consumer order, first error wins); into the last phase, the state
    entries the step committed at their values at step start (`old`, a partial state: None
    elsewhere), and out of it their committed values (`new`: `commit`)."""

    env: Env
    pending: tuple = ()
    old: Env | None = None
    new: Env | None = None

    # The key paths of its leaves (the driver holds a kernel's leaves by them): made and read
    # here only.
    @staticmethod
    def env_path(path: tuple) -> tuple:
        """The key path of the env's leaf at `path` (a key path in the `Env`)."""
        return (_ENV,) + path

    @staticmethod
    def old_path(path: tuple) -> tuple:
        """The key path of the old state entry at `path` (a key path in the `Env`)."""
        return (_OLD,) + path

    @staticmethod
    def pending_path(j: int, guard: tuple) -> tuple:
        """The key path of the `j`-th awaited consumer's guard leaf at `guard` (a key path in
        `TraceGuards`: one of `GUARD_LEAVES`)."""
        return (_PENDING, SequenceKey(j)) + guard

    @staticmethod
    def part(path: tuple) -> str:
        """Which field holds the leaf at key path `path`: "env", "pending", "old" or "new"."""
        return path[0].name

    @staticmethod
    def is_env_guard(path: tuple) -> bool:
        """Whether the leaf at key path `path` is one of the env's guards."""
        return path[:2] == (_ENV, GUARDS)


def _serializable(*classes) -> None:
    """Let `jax.export` serialize a function that takes or returns these pytrees (the pure step's
    state and outputs: `Exported.serialize()` refused "an unregistered type CacheState"). Each is
    a `register_dataclass` node without static fields: its auxiliary data is always `()`."""
    for cls in classes:
        jax.export.register_pytree_node_serialization(
            cls, serialized_name=f"oi2jax.{cls.__name__}", serialize_auxdata=lambda _: b"",
            deserialize_auxdata=lambda _: ())


_serializable(CacheState, Guards, StepState, Shaped)

_ENV, _PENDING, _OLD = GetAttrKey("env"), GetAttrKey("pending"), GetAttrKey("old")
GUARD_LEAVES = tuple((GetAttrKey(f.name),) for f in fields(TraceGuards))  # key paths in `TraceGuards`


class StateSpec:
    """Converts between `StepState` and the trace's `Env` for one program's cache layouts."""

    def __init__(self, layouts, n_grow: int):
        self.layouts = layouts
        self.n_grow = n_grow
        self.static = tuple(name for name, layout in layouts.items() if layout.static_size)

    def to_env(self, state: StepState) -> Env:
        """The state as an `Env`: the guards apart, an all-@fixed table's sizes a trace constant."""
        caches = dict(state.caches)
        for name in self.static:  # a table of @fixed dims only: its sizes are a constant of the trace
            caches[name] = replace(caches[name], size=self.layouts[name].fixed_sizes())
        flags = state.guards.flags
        return Env(dict(state.vars), caches, TraceGuards(flags[0].astype(jnp.int32), flags[1], flags[2:]))

    def strip_constants(self, env: Env) -> Env:
        """`env` without the trace constants `to_env` adds (the sizes of all-@fixed tables): what a
        loop over steps carries."""
        if not self.static:
            return env
        return replace(env, caches={n: replace(c, size=None) if n in self.static else c for n, c in env.caches.items()})

    def with_constants(self, env: Env) -> Env:
        """The inverse of `strip_constants`."""
        if not self.static:
            return env
        return replace(env, caches={n: replace(c, size=self.layouts[n].fixed_sizes()) if n in self.static
                                    else c for n, c in env.caches.items()})

    def from_env(self, env: Env) -> StepState:
        vars_ = {name: env.values[name] for name, layout in self.layouts.items() if not layout.is_cache}
        caches = {name: replace(env.caches[name], size=None) if name in self.static else env.caches[name]
                  for name, layout in self.layouts.items() if layout.is_cache}
        return StepState(vars_, caches, Guards(env.guards.vector()))

    def to_tree(self, env: Env) -> dict:
        """A state `Env` as plain nested dicts, what an exported artifact takes and returns:
        `{"vars": {P: value}, "caches": {T: {"data", "size"[, "present"]}}, "guards": {"err",
        "errval", "grow"}}` (an all-@fixed table's sizes included, as `to_env` makes them)."""
        caches = {}
        for name, layout in self.layouts.items():
            if layout.is_cache:
                cache = env.caches[name]
                caches[name] = {"data": cache.data, "size": cache.size}
                if cache.present is not None:
                    caches[name]["present"] = cache.present
        guards = env.guards
        return {"vars": {name: env.values[name] for name, layout in self.layouts.items() if not layout.is_cache},
                "caches": caches, "guards": {"err": guards.err, "errval": guards.errval, "grow": guards.grow}}

    def from_tree(self, tree: dict) -> Env:
        """The inverse of `to_tree`."""
        return Env(dict(tree["vars"]), {n: CacheState(c["data"], c["size"], c.get("present"))
                                        for n, c in tree["caches"].items()}, TraceGuards(**tree["guards"]))

    def avals(self) -> StepState:
        """The `StepState` of `jax.ShapeDtypeStruct`s: every buffer's shape and dtype."""
        def aval(shape, dtype):
            return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))

        vars_, caches = {}, {}
        for name, layout in self.layouts.items():
            if not layout.is_cache:
                d = dt.get(layout.dtype)
                vars_[name] = aval((d.nbytes(math.prod(layout.shape)),), np.uint8) if layout.packed else \
                    aval(layout.shape, d.np_dtype)
                continue
            k = (len(layout.capacity),)
            caches[name] = CacheState(aval(layout.data_shape(), dt.get(layout.dtype).np_dtype),
                                      None if layout.static_size else aval(k, np.int64),
                                      aval(layout.capacity, np.bool_) if layout.has_present else None)
        return StepState(vars_, caches, Guards(aval((2 + self.n_grow,), np.int64)))


# ------------------------------------------------------------------------ step boundaries


def commit(old: Env, new: Env, growable: bool) -> Env:
    """The committed value of each entry `old` holds (a partial state: the entries it holds as
    None are not committed) after a step that ended in `new`.

    Guards skip a failing write themselves, so the step's values are kept; a step that asked
    for more cache capacity (any `grow` > 0) is undone as a whole -- every entry, the recorded
    error included, takes its old value -- so that the host can grow and re-run it. `grow` is
    always the step's request."""
    undo = jnp.any(new.guards.grow > 0) if growable else None

    def committed(path, before):
        after = leaf_at(new, path)
        return after if undo is None or path == GROW_PATH else jnp.where(undo, before, after)
    return tree_map_with_path(committed, old)
