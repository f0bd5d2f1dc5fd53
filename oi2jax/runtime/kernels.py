"""The compiled kernels a session runs, for one set of cache capacities (rebuilt after growth).

- `after_unchecked(consts, (vars, caches), flags, dynamic) -> (vars, caches, flags, outputs)`: one
  step. Only vars and caches are donated: the guard flags `(err, errval, grow...)` of step k
  stay readable after step k+1 was dispatched, so the host reads step k's outcome late. A step whose incoming state holds
  an unreported error does nothing: the session reports that error first, and the state stays
  exactly as the failing step left it.
- `from_clean(consts, (vars, caches), dynamic) -> (vars, caches, flags, outputs)`: the same step for a
  state the session knows holds no error (it read the previous step's flags): no skip, the
  incoming guards the constant zero. Bit for bit what `after_unchecked` computes from zero flags. A step
  without any runtime guard returns `None` for its flags: it cannot fail, nothing is read.
- `multi(consts, state, per_step, fixed, base, n, collect, feedback=..., stop=...) -> FusedRun(state,
  last, stacked, status, fed, done)`: up to `n` steps as ONE `lax.while_loop` (state donated), step i
  reading `per_step[base + i]` (an input with feedback, once its per-step values run out, the value
  its source had after the step before: carried in the loop, no host round trip).
  The loop stops early after a step that recorded an error (that step is applied, its failing
  write skipped), that needs more cache capacity (that step is undone), or whose output is a stop
  id (`stop`: that step is applied; `run_rules.stop_hits`, `run_rules.stopped`); `status` is
  a `StepOutcome` vector (`status_vector`). So N fused steps equal N `after_unchecked` calls bit for bit, and
  growth resumes exactly at the undone step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.tree_util import tree_map_with_path

from .._signals import raise_pending
from ..lowering.caches import LayoutKind
from ..lowering.state import Guards, StepState
from .placement import TRIM_AFTER_SECONDS, return_freed_memory
from ..run_rules import fed_back, stop_from, stop_hits, stopped


SELECT_SKIP_BYTES = 1 << 16

# Steps of the fused loop per reading of its condition, by the platform the kernels run on. XLA:GPU
# copies a `while` loop's condition to the host at every iteration and only then launches the next
# iteration's CUDA graph: the GPU idles once a step (0.69 ms of a 2.25 ms Q4_K decode step on an
# H200, docs/performance.md). On a GPU the loop's body is therefore a `fori_loop` of this many steps
# (a trip count XLA knows: launched back to back, nothing read), each after the loop's end
# (the budget, a stop id, an error, a growth) a masked step that changes nothing: at most this many
# less one steps are computed and dropped at the end of a fused call. The CPU runs its loop on the
# host: one step per check, nothing computed in vain.
STEPS_PER_CHECK = {"gpu": 8}


def compiled(lowered):
    """`lowered.compile()`, then the heap pages XLA's compilation freed given back to the system
    (placement.return_freed_memory) where the compilation was a big one (`TRIM_AFTER_SECONDS`):
    without it a process's resident memory keeps each compile's working set (a 135M-parameter
    Llama's prompt and decode programs: 1.23 GB peak, 0.76 GB after the trim), and the next
    compilation's peak lands on top of it."""
    start = time.perf_counter()
    exe = lowered.compile()
    if time.perf_counter() - start >= TRIM_AFTER_SECONDS:
        return_freed_memory()
    raise_pending()  # a Ctrl-C during the compile (`_signals.deferred`): nothing has run yet
    return exe


def called(jitted, args):
    """`jitted(*args)`, then `return_freed_memory` where that call compiled (its cache grew) a big
    program (`TRIM_AFTER_SECONDS`, the call's run included)."""
    size = getattr(jitted, "_cache_size", lambda: 0)
    before = size()
    start = time.perf_counter()
    out = jitted(*args)
    if size() != before and time.perf_counter() - start >= TRIM_AFTER_SECONDS:
        return_freed_memory()
    return out


class StepKernels:
    """The kernels of one `Executable` (one generation of cache capacities): see the module doc."""

    def __init__(self, exe):
        self.exe = exe
        self.jit_options = opts = exe.host.placer.jit_options()  # every kernel's (placement.CPU_COMPILER_OPTIONS)
        builder, spec = exe.builder, exe.state_spec
        growable = exe.growable
        count, error_sites = exe.host.count, exe.lowering.error_sites
        self.input_avals = {name: jax.ShapeDtypeStruct(v.shape, v.dtype)
                            for name, v in exe.defaults.items()}

        # A step after an unreported error must leave the state as it is. With tables (updated in
        # place) or a large state that is a `lax.cond` around the step; a small state of plain
        # variables is cheaper to select after the step (the skipped step's outputs are never
        # shown: the session raises the error instead).
        layouts = exe.lowering.caches
        tables = {n for n, layout in layouts.items() if layout.kind is LayoutKind.TABLE}

        def is_table_data(path) -> bool:
            """A `StepState` path `.caches[T].data` of a table (gated row by row when skipped)."""
            return len(path) == 3 and getattr(path[0], "name", None) == "caches" and \
                getattr(path[1], "key", None) in tables and getattr(path[2], "name", None) == "data"
        self.select_skip = select_skip = not any(l.is_cache for l in layouts.values()) and sum(
            l.data_nbytes() for l in layouts.values()) <= SELECT_SKIP_BYTES

        extra = builder.all_names  # every variable, so that a session can `read` any of them
        self.steps_per_check = per_check = STEPS_PER_CHECK.get(exe.host.placer.platform(), 1)

        def guarded_trace(trace):
            """(trace(), whether tracing it registered a runtime guard): every guard registers
            its site while it is traced; a step that registered none cannot record an error."""
            sites = len(error_sites)
            out = trace()
            return out, len(error_sites) > sites

        def begin(consts, user, flags, dynamic):
            """The step's env, and the step as a function of it (shared by both forms)."""
            count("session step")
            env = spec.to_env(StepState(user[0], user[1], Guards(flags)))
            return env, lambda e, skip=None: builder(consts, e, dynamic, extra=extra, skip=skip)

        def after_unchecked(consts, user, flags, dynamic):
            env, run = begin(consts, user, flags, dynamic)
            failed = env.guards.err != 0  # an unreported error from the step before: change nothing
            if select_skip:  # small plain state: run, then keep the old values
                flat, outputs = run(env)
                flat = jax.tree.map(lambda old, new: jnp.where(failed, old, new), env, flat)
                new = spec.from_env(flat)
            else:
                # Not a lax.cond around the step: XLA copies every table through a conditional
                # (three copies of each K/V cache per Llama step). Table writes and
                # resets skip their own rows (`skip`), so the donated tables stay in place; every
                # other state entry (plain values, sizes, present, auto_dim data, the guards) is
                # small or rare and is selected after the step.
                flat, outputs = run(env, failed)
                old, new = spec.from_env(env), spec.from_env(flat)
                new = tree_map_with_path(
                    lambda path, before, after: after if is_table_data(path) else jnp.where(failed, before, after),
                    old, new)
            return new.vars, new.caches, new.guards.flags, outputs

        def from_clean(consts, user, dynamic):
            """`after_unchecked` for a state known to hold no error (the session read the last step's flags):
            no skip, and the incoming guards are the constant zero."""
            env, run = begin(consts, user, jnp.zeros((2 + spec.n_grow,), jnp.int64), dynamic)
            (flat, outputs), guarded = guarded_trace(lambda: run(env))
            new = spec.from_env(flat)
            if not guarded and not growable:  # cannot fail: no flags to return or read
                return new.vars, new.caches, None, outputs
            return new.vars, new.caches, new.guards.flags, outputs

        def fused_steps(consts, state, per_step, fixed, fed, base, n, stop_ids, done, collect, total, feedback):
            count("fused steps")
            # trace constants of the state (sizes of all-@fixed tables) are not loop-carried
            env0 = spec.strip_constants(spec.to_env(state))
            # every variable's last value; an input the graph does not write is taken after the
            # loop from the last applied step's slice (no per-step copy of it). An input with
            # feedback and its source are outputs of every step (the value it took, the value fed)
            extra = tuple(dict.fromkeys(collect + builder.all_names + tuple(x for pair in feedback for x in pair)
                                        + tuple(stop_ids)))

            def one(env, fb, i, skip=None):
                dyn = dict(fixed)
                for k, v in per_step.items():
                    if k not in fb:
                        dyn[k] = lax.dynamic_index_in_dim(v, base + i, keepdims=False)
                for k, v in fb.items():  # `fed_back`: an input not given per step starts from its value
                    if k in per_step:
                        given = per_step[k]
                        g = base + i
                        row = lax.dynamic_index_in_dim(given, jnp.minimum(g, given.shape[0] - 1), keepdims=False)
                        v = jnp.where(fed_back(g, given.shape[0]), v, row)
                    dyn[k] = v
                flat, outputs = builder(consts, spec.with_constants(env), dyn, extra=extra, skip=skip)
                return spec.strip_constants(flat), outputs

            # a stop counts once its output is fed back (not while a prompt is teacher-forced)
            counts_from = stop_from(stop_ids, feedback, lambda k: per_step[k].shape[0] if k in per_step else 1)
            out_shapes, guarded = guarded_trace(
                lambda: jax.eval_shape(lambda e, f: one(e, f, jnp.zeros((), n.dtype))[1], env0, fed))
            # a step that cannot record an error, without growth, runs exactly n times
            guarded = guarded or growable
            last0 = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), out_shapes)
            stacked0 = {k: jnp.zeros((total,) + out_shapes[k].shape, out_shapes[k].dtype) for k in collect}

            def cond_fn(carry):
                # stop after a step that recorded an error or was undone for growth (it asks for
                # capacity): read from the carried state, no flag of its own to compute and carry
                i, env = carry[0], carry[1]
                go = i < n
                if stop_ids:  # ends after the step whose output is a stop id (every sequence's)
                    go = go & ~stopped(carry[5], jnp)
                if not guarded:
                    return go
                go = go & (env.guards.err == 0)
                return go & ~jnp.any(env.guards.grow > 0) if growable else go

            def body(carry, skip=None):
                i, env, last, stacked, fb, hit = carry
                flat, outputs = one(env, fb, i, skip)
                rows = outputs if skip is None else \
                    {k: jnp.where(skip, lax.dynamic_index_in_dim(v, i, keepdims=False), outputs[k]) for k, v in stacked.items()}
                stacked = {k: lax.dynamic_update_index_in_dim(v, rows[k], i, 0)  # the call's own rows
                           for k, v in stacked.items()}
                new_fb = {k: outputs[source] for k, source in feedback}
                new_hit = {k: hit[k] | (stop_hits(outputs[k], ids, jnp) & (base + i >= counts_from[k])
                                        if counts_from[k] else stop_hits(outputs[k], ids, jnp))
                           for k, ids in stop_ids.items()}
                if growable:  # an undone step is not counted: the host re-runs it after growing
                    undone = jnp.any(flat.guards.grow > 0)
                    new_fb = {k: jnp.where(undone, fb[k], v) for k, v in new_fb.items()}  # nor fed back
                    new_hit = {k: jnp.where(undone, hit[k], v) for k, v in new_hit.items()}  # nor a stop
                    # nor its values: a growth the host refuses leaves the last applied step's
                    outputs = jax.tree.map(lambda value, old: jnp.where(undone, old, value), outputs, last)
                    return i + jnp.where(undone, 0, 1).astype(i.dtype), flat, outputs, stacked, new_fb, new_hit
                return i + 1, flat, outputs, stacked, new_fb, new_hit

            def masked(_, carry):
                """A step where the loop goes on, else one that changes nothing: its table writes
                skipped (`skip`), every other carried value kept (STEPS_PER_CHECK)."""
                active = cond_fn(carry)
                new = body(carry, skip=~active)
                i, env, last, _, fb, hit = carry
                ni, nenv, nlast, stacked, nfb, nhit = new

                def keep(old, value):
                    return jnp.where(active, value, old)
                nenv = tree_map_with_path(lambda path, old, value: value if is_table_data(path) else keep(old, value),
                                          env, nenv)
                return (keep(i, ni), nenv, jax.tree.map(keep, last, nlast), stacked, jax.tree.map(keep, fb, nfb),
                        jax.tree.map(keep, hit, nhit))

            init = (jnp.zeros((), n.dtype), env0, last0, stacked0, fed, done)
            loop_body = body if per_check == 1 else lambda carry: lax.fori_loop(0, per_check, masked, carry)
            i, flat, last, stacked, fb, done = lax.while_loop(cond_fn, loop_body, init)
            last = dict(last)
            for name in builder.dynamic:
                if name in last:
                    continue
                if name in per_step:  # the last applied step's value (unused when none applied)
                    last[name] = lax.dynamic_index_in_dim(per_step[name], jnp.maximum(base + i - 1, 0),
                                                          keepdims=False)
                elif name in fixed:
                    last[name] = fixed[name]
            new = spec.from_env(flat)
            if not guarded:  # the guards cannot change: passed through (donated, no copy)
                new = StepState(new.vars, new.caches, state.guards)
            return FusedRun(new, last, stacked, status_vector(new.guards.flags, i), fb, done)

        self.after_unchecked = jax.jit(after_unchecked, donate_argnums=(1,), **opts)  # the flags stay readable
        self.from_clean = jax.jit(from_clean, donate_argnums=(1,), **opts)
        self._form_fns = {True: from_clean, False: after_unchecked}
        self.generation = exe.generation  # the cache capacities these kernels are for
        self._forms: dict = {}  # input signature -> StepForms (the session step compiled ahead of time)
        self._pace = None  # seconds per step of the last fused call (`Session.run` sizes its calls by it)
        self.multi_jit = jax.jit(fused_steps, donate_argnums=(1,), static_argnums=(9, 10, 11), **opts)
        self._scalars: dict = {}  # (index type, value) -> device scalar (`multi`'s base and n)

    @property
    def pace(self) -> float | None:
        """Seconds per step of the last fused call on these kernels (None before the first)."""
        return self._pace

    def timed(self, seconds: float, steps: int) -> float:
        """Note that a fused call ran `steps` steps in `seconds`; returns the pace."""
        self._pace = seconds / steps
        return self._pace

    def session_forms(self, dynamic: dict) -> "StepForms":
        """The session step's compiled forms for this input signature (names, shapes, dtypes,
        placement of `dynamic`), shared by every session of the program until a growth
        replaces these kernels; each form is compiled on its first use (`StepForms.get`)."""
        key = tuple((k, v.shape, str(v.dtype), getattr(v, "committed", None)) for k, v in sorted(dynamic.items()))
        forms = self._forms.get(key)
        if forms is None:
            forms = self._forms[key] = StepForms(self, self.generation)
        return forms

    def call_session_step(self, flat: "FlatStep", clean: bool, consts, leaves: tuple, flags, dynamic) -> tuple:
        """One session step: `flat` (a form compiled ahead of time, its state as leaves) where it
        takes these arguments as they are (`FlatStep.accepts`: avals and placement), else the
        jitted form. A `SessionStep`."""
        if flat.accepts(leaves, flags, dynamic):
            return SessionStep(*flat.call(consts, leaves, flags, dynamic), ahead=True)
        user = flat.user_def.unflatten(leaves)
        with self.exe.scope():
            vars_, caches, flags, outputs = self.from_clean(consts, user, dynamic) if clean else \
                self.after_unchecked(consts, user, flags, dynamic)
        return SessionStep(tuple(jax.tree.leaves((vars_, caches))), flags, outputs, ahead=False)

    def multi(self, consts, state, per_step: dict, fixed: dict, base: int, n: int, collect: tuple = (),
              total: int = 0, exes: dict | None = None, feedback: tuple = (), fed: dict | None = None,
              stop: dict | None = None, done: dict | None = None) -> "FusedRun":
        """Up to `n` steps from global step `base`; `total`: length of the collected stacks.
        `feedback`: ((input, source), ...): from the step where its per-step values run out (or
        its second step, for an input not given per step), the input takes the value its source
        had after the step before; `fed`: each such input's fed-back value before this call.
        `stop`: {output: device array of stop ids}; `done`: {output: bool array of the output's
        shape}, the elements already stopped (all False at a run's start, then `FusedRun.done` of
        the call before): the loop ends after the step that leaves every element of one output
        stopped (`run_rules.stopped`).
        `exes`: the loops compiled ahead of time for one validated signature of arguments (a
        `ValidatedRun`), by index type (`AheadOfTime`): called without the jit's dispatch (a hot
        path) where it takes the arguments as they are; else (placed unlike them) the jit, from
        then on."""
        args = self.multi_args(consts, state, per_step, fixed, base, n, collect, total, feedback, fed, stop, done)
        if exes is None:
            return called(self.multi_jit, args)
        index = (args[5].dtype, args[10])  # and the stacks' length: a static argument the exe was built for
        if index not in exes:
            exes[index] = AheadOfTime(compiled(self.multi_jit.lower(*args)), first=1)
        loop = exes[index]
        if loop is not None:
            if loop.accepts(*args[1:9]):
                return loop.exe(*args[:9])
            exes[index] = None
        return called(self.multi_jit, args)

    def multi_args(self, consts, state, per_step: dict, fixed: dict, base: int, n: int, collect: tuple = (),
                   total: int = 0, feedback: tuple = (), fed: dict | None = None, stop: dict | None = None,
                   done: dict | None = None) -> tuple:
        """`multi_jit`'s arguments (also what `--dump-dir` lowers: the kernel a run executes)."""
        # the loop counts and indexes in int32 while every index fits (fewer bytes per iteration:
        # XLA:CPU runs a while loop that touches under 1 KiB per iteration as one compiled
        # function instead of one dispatch per fusion); int64 beyond (another trace)
        longest = max([v.shape[0] for v in per_step.values()] + [int(total) if collect else 0, base + n])
        index = np.int32 if longest < 2**31 else np.int64
        return (consts, state, per_step, fixed, dict(fed or {}), self._scalar(index, base), self._scalar(index, n),
                dict(stop or {}), dict(done or {}), tuple(collect), int(total) if collect else 0, tuple(feedback))

    def _scalar(self, index, value: int):
        """`base` / `n` as a device scalar kept for reuse (a host scalar is put on the device at
        every call, a few µs each; a decode loop passes the same few values again and again).
        Called inside the program's scope: placed on its device."""
        key = (index, int(value))
        scalar = self._scalars.get(key)
        if scalar is None:
            if len(self._scalars) >= 256:
                self._scalars.clear()
            scalar = self._scalars[key] = jnp.asarray(index(value))
        return scalar


@dataclass(eq=False)
class StepForms:
    """A session step compiled ahead of time for one input signature and one generation of
    cache capacities (`StepKernels.session_forms`): `from_clean` for a state known to hold no
    error, `after_unchecked` for one that may follow unchecked steps (it skips a step whose incoming state holds
    an error). `Session.step`'s hot path calls them directly."""

    kernels: StepKernels
    generation: int
    from_clean: "FlatStep | None" = None
    after_unchecked: "FlatStep | None" = None

    def form(self, clean: bool) -> "FlatStep | None":
        """The form for a state known clean (else one that may follow unchecked steps), if compiled."""
        return self.from_clean if clean else self.after_unchecked

    def compile(self, clean: bool, consts, user, flags, dynamic) -> "FlatStep":
        """Compile the form `from_clean` (`clean`; `flags` None) else `after_unchecked` for these
        arguments."""
        flat = FlatStep(self.kernels._form_fns[clean], consts, user, None if clean else flags, dynamic,
                        self.kernels.jit_options)
        if clean:
            self.from_clean = flat
        else:
            self.after_unchecked = flat
        return flat


class StepOutcome(NamedTuple):
    """What the host learns of dispatched steps: the recorded error (`err`: 0 = none, else 1 + its
    guard site; `errval`: the offending value), how many steps were `applied`, and the capacity
    each growable cache dim asked for (`grow`: any > 0 = the last step was undone). ONE layout on
    the device too (`status_vector`): `[err, errval, applied, grow...]`."""

    err: int
    errval: int
    applied: int
    grow: tuple

    @classmethod
    def of_status(cls, status) -> "StepOutcome":
        """From a fused run's status vector (`status_vector`; one host transfer)."""
        values = np.asarray(status).tolist()
        return cls(values[0], values[1], values[2], tuple(values[3:]))

    @classmethod
    def of_flags(cls, flags) -> "StepOutcome":
        """From one step's guard flags `[err, errval, grow...]` (`Guards`): applied unless undone.
        A hot path (a session reads a step's flags about once per step): the common outcome, no
        error and no growth, is one shared record per vector length."""
        values = np.asarray(flags).tolist()
        if not any(values):
            fine = _FINE.get(len(values))
            if fine is None:
                fine = _FINE[len(values)] = cls(0, 0, 1, (0,) * (len(values) - 2))
            return fine
        grow = tuple(values[2:])
        return cls(values[0], values[1], 0 if any(grow) else 1, grow)

    @property
    def undone(self) -> bool:
        """The last step asked for more cache capacity (`grow` >= 0 per dim, > 0: needed): it was
        undone (the host grows, re-runs it)."""
        return any(self.grow)


_FINE: dict = {}  # flags length -> the `StepOutcome` of a step applied without error or growth


def status_vector(flags, applied):
    """The device form of a `StepOutcome`: guard `flags` `[err, errval, grow...]` and the count
    of applied steps as ONE int64 vector `[err, errval, applied, grow...]`."""
    return jnp.concatenate([flags[:2], applied.astype(jnp.int64).reshape(1), flags[2:]])


class FusedRun(NamedTuple):
    """What one call of the fused loop returns (`StepKernels.multi`)."""

    state: StepState  # after the last applied step
    last: dict  # every variable's value at the last step applied
    stacked: dict  # collect name -> [total, ...] (rows 0 .. applied - 1 written: the call's steps)
    status: object  # int64 `status_vector`: read it with `StepOutcome.of_status`
    fed: dict  # input with feedback -> the value its next step takes when fed back
    done: dict  # stop output -> bool [output's shape]: the elements that gave a stop id so far


class SessionStep(NamedTuple):
    """What one session step returns (`StepKernels.call_session_step`)."""

    leaves: tuple  # the new state (vars, caches) as leaves
    flags: object  # its guard flags (None: a step that cannot fail)
    outputs: dict
    ahead: bool  # the form compiled ahead of time ran (not the jit): the next call may go to it directly


class AheadOfTime:
    """An executable compiled ahead of time (`exe`, a `jax.stages.Compiled`) and what it takes
    for its positional arguments from `first` on: their tree structure and each leaf's aval
    (shape, dtype, weak type) and sharding. `accepts(*args)` is the explicit check made before
    calling it: every leaf a live, concrete `jax.Array` of its aval and sharding. The executable
    is called only with arguments it takes (anything else goes to the jit, which places, converts
    or explains), so an error it raises is reported, never taken for a refusal."""

    __slots__ = ("exe", "treedef", "expected", "_seen")

    def __init__(self, exe, first: int = 0):
        self.exe = exe
        avals, self.treedef = jax.tree.flatten(exe.in_avals[0][first:])
        self.expected = tuple(zip(avals, jax.tree.leaves(exe.input_shardings[0][first:])))
        # per leaf, the sharding object of the last array found placed as compiled: the next one
        # placed alike costs one identity test (comparing shardings costs about 1 µs)
        self._seen = [sharding for _, sharding in self.expected]

    def accepts(self, *args) -> bool:
        """Whether the executable takes `args` (its positional arguments from `first`) as they are."""
        leaves, treedef = jax.tree.flatten(args)
        if treedef != self.treedef:
            return False
        seen = self._seen
        for i, (leaf, (aval, sharding)) in enumerate(zip(leaves, self.expected)):
            if not isinstance(leaf, jax.Array) or isinstance(leaf, jax.core.Tracer) or leaf.is_deleted() or \
                    not _placed_as(leaf, aval, sharding, seen, i):
                return False
        return True


def _placed_as(value, aval, sharding, seen, key) -> bool:
    """Whether the device array `value` has `aval` and `sharding`. `seen[key]`: the sharding
    object of the last array found placed so: the next one placed alike costs one identity test
    (comparing shardings costs about 1 µs)."""
    if value.aval != aval:
        return False
    placed = value.sharding
    if placed is not seen[key]:
        if placed != sharding:
            return False
        seen[key] = placed
    return True


class FlatStep:
    """A session step (`from_clean` or `after_unchecked`) compiled ahead of time, its state FLAT: called as
    `exe(consts, leaves, [flags,] dynamic) -> (leaves, [flags,] outputs)`, where `leaves` is
    the tuple of the leaves of (vars, caches). JAX flattens pytree arguments and rebuilds pytree
    results at every call of an executable; dicts it does in C++, but the state's dataclasses
    (a `CacheState` per table) call back into Python: about 0.7 µs per step of a one-table
    decode step on CPU. `Session.step` keeps its state as these leaves between steps.
    `call` takes and returns the leaves, the flags and the outputs."""

    def __init__(self, fn, consts, user, flags, dynamic, jit_options: dict):
        leaves, self.user_def = jax.tree.flatten(user)
        self.takes_flags = takes_flags = flags is not None
        traced = {}

        def flat(consts_, leaves_, *rest):
            user_ = self.user_def.unflatten(leaves_)
            vars_, caches, flags_, outputs = fn(consts_, user_, *rest)
            new_leaves, new_def = jax.tree.flatten((vars_, caches))
            assert new_def == self.user_def, (new_def, self.user_def)  # a step keeps its state's form
            traced["flags"] = flags_ is not None
            return (tuple(new_leaves), flags_, outputs) if flags_ is not None else (tuple(new_leaves), outputs)

        self.exe = compiled(jax.jit(flat, donate_argnums=(1,), **jit_options).lower(
            consts, tuple(leaves), *((flags,) if takes_flags else ()), dynamic))
        self.has_flags = traced["flags"]
        self.takes = AheadOfTime(self.exe, first=1)  # the state leaves, [flags,] the inputs
        # each input's name, aval and sharding: `Session.step`'s hot path checks them per call
        self.inputs = tuple((name, aval, sharding) for (name, aval), sharding in
                            zip(self.exe.in_avals[0][-1].items(), self.exe.input_shardings[0][-1].values()))
        self._seen = {name: sharding for name, _, sharding in self.inputs}

    def accepts(self, leaves: tuple, flags, dynamic: dict) -> bool:
        """Whether the compiled form takes these arguments as they are (`AheadOfTime.accepts`)."""
        return self.takes.accepts(leaves, flags, dynamic) if self.takes_flags else \
            self.takes.accepts(leaves, dynamic)

    def takes_inputs(self, dynamic: dict) -> bool:
        """Whether the compiled form takes these inputs as they are (each its aval and sharding):
        `Session.step`'s hot path, whose state leaves and flags are this form's own results and
        whose inputs are all the form's, each a device array of the type the form was called with."""
        seen = self._seen
        for name, aval, sharding in self.inputs:
            if not _placed_as(dynamic[name], aval, sharding, seen, name):
                return False
        return True

    def call(self, consts, leaves: tuple, flags, dynamic) -> tuple:
        """`(leaves, flags or None, outputs)`; `flags` is passed only to a form that takes them."""
        out = self.exe(consts, leaves, flags, dynamic) if self.takes_flags else self.exe(consts, leaves, dynamic)
        return out if self.has_flags else (out[0], None, out[1])
