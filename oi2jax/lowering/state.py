"""The step state: what a program carries from one step to the next, as a typed JAX pytree.

    StepState(vars={P: value}, caches={T: CacheState(data, size, present)}, guards=Guards(...))

- `vars`: plain persistent variables by declared name (sub-byte dtypes stay packed);
- `caches`: `@table` and `@auto_dim` variables: the data at its current capacity, the logical
  sizes (tables: one per table dim) or growth counts (auto_dim), and for growable tables which
  entries were touched;
- `guards`: bookkeeping the user never names: the first runtime error (`err`: 0 = none, else
  1 + index of the guard site; `errval`: the offending value) and `grow` (capacity each
  growable cache dim needs; a step that asks for more is undone and re-run by the host).

Inside a trace the lowering works on a flat environment (`env`: one dict, the carry of every
`lax.cond` / `lax.fori_loop`). Bookkeeping keys there start with `#`, which no DSL identifier
can contain, so they never collide with a user's variable (a variable named `__err` is just a
variable). This module is the ONE place that converts between the two and that defines what
happens at step boundaries: the fresh values at step start (`StepBuilder.start_env`), the guard
merge ("first error wins", `merge_guards`) and commit/undo (`commit`). The fused step, the
multi-step loop and the yield/await driver all call these.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

ERR = "#err"  # int32: 0 = fine, else 1 + index into Lowering.error_sites
ERRVAL = "#errval"  # int64: the offending value (an index, a size)
GROW = "#grow"  # int64[n_growable]: capacity a growable cache dim needs (0 = enough)
SHAPE = "#shape/"  # + name: int64[rank] logical shape of a runtime-shaped variable (phases.runtime_shaped)


def key_owner(key: str) -> str:
    """The variable an env key belongs to: `T#size` -> T, `#shape/a` -> a, `#err` -> ''."""
    return key[len(SHAPE):] if key.startswith(SHAPE) else key.split("#", 1)[0]
GUARD_KEYS = (ERR, ERRVAL, GROW)
# the yield/await driver's kernels pass these between phases (`/` never occurs in a DSL name):
OLD = "__old__/"  # + state key: its value at step start, for the last phase's commit
NEW = "__new__/"  # + state key: its committed value, returned by the last phase


def pending(j: int, guard: str) -> str:
    """The env key of the `j`-th awaited consumer's guard `guard`, merged by the next phase."""
    return f"__pending{j}/{guard}"


def is_transient(key: str) -> bool:
    """A key that lives only between two driver kernels (pending guards, old state values)."""
    return key.startswith("__pending") or key.startswith(OLD)


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


class StateSpec:
    """Converts between `StepState` and the flat environment for one program's cache layouts
    (a live view of `layouts`: cache growth replaces entries, the spec follows)."""

    def __init__(self, layouts: dict, n_grow: int):
        self.layouts = layouts
        self.n_grow = n_grow

    def to_env(self, state: StepState) -> dict:
        env = dict(state.vars)
        for name, cache in state.caches.items():
            layout = self.layouts[name]
            env[name] = cache.data
            # a table of @fixed dims only: its sizes are a constant of the trace
            env[layout.size_key()] = jnp.asarray(layout.fixed_sizes()) if cache.size is None else cache.size
            if cache.present is not None:
                env[f"{name}#present"] = cache.present
        flags = state.guards.flags
        env[ERR], env[ERRVAL], env[GROW] = flags[0].astype(jnp.int32), flags[1], flags[2:]
        return env

    def constant_keys(self) -> frozenset:
        """The env keys `to_env` fills with trace constants (the sizes of all-@fixed tables): a
        loop over steps need not carry them."""
        return frozenset(l.size_key() for l in self.layouts.values() if l.static_size)

    def from_env(self, env: dict) -> StepState:
        if isinstance(env[ERR], jax.sharding.Sharding):  # a tree of shardings (jit in/out_shardings)
            return self._assemble(env, env[ERR])
        return self._assemble(env, status_vector(env))

    def _assemble(self, env: dict, flags) -> StepState:
        vars_, caches = {}, {}
        for name, layout in self.layouts.items():
            if layout.kind == "plain":
                vars_[name] = env[name]
            else:
                size = None if layout.static_size else env[layout.size_key()]
                caches[name] = CacheState(env[name], size, env.get(f"{name}#present"))
        return StepState(vars_, caches, Guards(flags))

    def place(self, host_env: dict, put) -> StepState:
        """A `StepState` from a flat host state: `put({key: host array}) -> {key: device array}`
        places every buffer (the guards as one vector under `#guards`, replicated when sharded)."""
        static = self.constant_keys()
        host = {k: v for k, v in host_env.items() if k not in GUARD_KEYS and k not in static}
        host["#guards"] = np.concatenate([np.asarray(host_env[ERR], np.int64).reshape(1),
                                          np.asarray(host_env[ERRVAL], np.int64).reshape(1),
                                          np.asarray(host_env[GROW], np.int64).reshape(-1)])
        placed = put(host)
        return self._assemble(placed, placed.pop("#guards"))

    def keys(self) -> list[str]:
        """The flat environment keys that make up the state."""
        keys = []
        for name, layout in self.layouts.items():
            keys.append(name)
            if layout.kind != "plain" and not layout.static_size:
                keys.append(layout.size_key())
            if layout.kind == "table" and layout.growable:
                keys.append(f"{name}#present")
        return keys + list(GUARD_KEYS)

    def guard_values(self) -> dict:
        """Host values of the guards at program start."""
        return {ERR: np.int32(0), ERRVAL: np.int64(0), GROW: np.zeros((self.n_grow,), np.int64)}


# ------------------------------------------------------------------------ step boundaries


def merge_guards(env: dict, err, errval, grow) -> dict:
    """Fold another run's guards into `env` (a consumer's at an await): first error wins."""
    env = dict(env)
    first = (env[ERR] == 0) & (err != 0)
    env[ERR] = jnp.where(first, err, env[ERR])
    env[ERRVAL] = jnp.where(first, errval, env[ERRVAL])
    env[GROW] = jnp.maximum(env[GROW], grow)
    return env


def commit(old: dict, env: dict, keys, growable: bool) -> dict:
    """The committed value of each state key in `keys` after a step.

    Guards skip a failing write themselves, so the step's values are kept; a step that asked
    for more cache capacity (any `#grow` > 0) is undone as a whole -- every key, the recorded
    error included, takes its old value -- so that the host can grow and re-run it. `#grow` is
    always the step's request."""
    if not growable:
        return {k: env[k] for k in keys}
    undo = jnp.any(env[GROW] > 0)
    return {k: env[k] if k == GROW else jnp.where(undo, old[k], env[k]) for k in keys}


def status_vector(env: dict):
    """int64[2 + n_grow]: (err, errval, grow...) of a finished step, one small host transfer."""
    return jnp.concatenate([env[ERR].astype(jnp.int64).reshape(1), env[ERRVAL].astype(jnp.int64).reshape(1),
                            env[GROW].astype(jnp.int64)])
