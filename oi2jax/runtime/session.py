"""`Session`: the decode loop. It owns a program's state across steps (docs/decode.md).

    sess = prog.session()                 # or prog.session(state="s.npz") to resume
    for tok in tokens:
        out = sess.step(x=tok)            # one step, new inputs each call
    sess.run({"x": xs})                   # xs: [N, ...] -> N steps fused into ONE compiled loop
    sess.read("K"); sess.save("s.npz")

When errors surface. Step k's runtime error (a cache overflow, an out-of-range index, ...)
raises `OiError` naming the guard's message, its DSL location and "in step k":
- `run` raises before it returns, from the step that failed (later steps did not run);
- `step` on a graph with growable caches, or run by the yield/await driver, raises from step k's
  own call (those steps are checked before they return);
- `step` otherwise raises at the latest at the next call on the session (`step`, `run`, `read`,
  `save`, `state`, `check`): step k+1 is dispatched before step k's flag is read, so the host
  never waits for the device between steps. When call k+1 raises step k's error, step k+1 did
  nothing (the kernel skips a step whose incoming state holds an error), so the state is
  exactly what step k left: the failing write skipped, every other write of step k applied.
After raising, the error is cleared and the session can go on. No error is ever dropped.

No lost write: a step that needs more capacity in a growable table or auto_dim tensor is undone
in the kernel; the session doubles the capacity (one recompile) and re-runs it with its own
inputs, so n growth steps cost O(log n) compiles.
"""
from __future__ import annotations

import os
import time

import jax
import numpy as np

from .. import ir
from ..diagnostics import OiError, suggest
from ..lowering.state import Guards, StepState
from ..values import convert_output
from .runplan import collect_names, feedback_pairs, plan_run, split_inputs

CALL_SECONDS = 0.5  # a fused run's steps go in calls of about this long (Ctrl-C stays responsive)
STEPS_KEY = "#steps"  # in saved state files: steps the session had run (no identifier has '#')


def outcome_ready(flags) -> bool:
    """Whether a dispatched step has finished (its guard flags can be read without waiting)."""
    return flags.is_ready()


class Session:
    def __init__(self, program, state=None):
        self.program = program
        self.steps = 0  # steps applied so far (a resumed session goes on counting)
        self._pending = None  # (status, step number) of a dispatched step whose status is unread
        self._vals: dict = {}  # last value of each dynamic / volatile variable (see _values)
        self._fresh = None  # (inputs, outputs) of the last fast step, merged into _vals lazily
        self._exe = None  # (kernels, {clean?: AOT executable}) of the fast step
        self._fast: dict = {}  # input name -> (shape, dtype, type) accepted without conversion
        self._given: tuple | None = None  # input names of the last step (checked complete)
        self._n_dynamic = len(program.defaults)
        self._user_tree = self._leaves = self._user_def = None  # see _user
        self._shaped = bool(program.shaped)
        # the yield/await driver runs a session's steps only where it places consumers on other
        # devices; otherwise the fused kernels run them (same results, one kernel per step)
        self._driver = program.driver is not None and bool(program.driver.placement)
        self._sync = program.growable or self._driver
        self._all_returned = set(program.builder.step_outputs) == set(program.builder.all_names)
        if state is None:
            self._state = program.init_state()
        elif isinstance(state, (str, os.PathLike)):
            self._state = self._load(os.fspath(state))
        elif isinstance(state, dict):
            self._state = self._from_values(state, "state")
        else:
            self._state = state
        # the guard flags known to hold no error (`is` the current ones: the next step needs no
        # skip); a state handed in as a StepState is not known clean until a step says so
        self._clean = None if isinstance(state, StepState) else self._flags

    # ------------------------------------------------------------------ state in / out

    # The user state (vars, caches) is held as a tree or as its leaves (what `Session.step`'s
    # flat kernel takes and returns), each made from the other on demand.
    @property
    def _user(self):
        if self._user_tree is None:
            self._user_tree = self._user_def.unflatten(self._leaves)
        return self._user_tree

    @_user.setter
    def _user(self, user) -> None:
        self._user_tree, self._leaves = user, None

    def _user_leaves(self) -> tuple:
        if self._leaves is None:
            leaves, self._user_def = jax.tree.flatten(self._user_tree)
            self._leaves = tuple(leaves)
        return self._leaves

    @property
    def _state(self):
        return StepState(self._user[0], self._user[1], Guards(self._flags))

    @_state.setter
    def _state(self, state):
        self._user, self._flags = (state.vars, state.caches), state.guards.flags

    @property
    def _values(self) -> dict:
        if self._fresh is not None:
            dyn, outputs = self._fresh
            self._fresh = None
            self._vals.update(dyn)
            self._vals.update(outputs)
        return self._vals

    def _load(self, path: str):
        try:
            with np.load(path, allow_pickle=False) as npz:
                values = {k: npz[k] for k in npz.files}
        except FileNotFoundError:
            raise OiError(f"state file not found: {path}") from None
        except Exception as exc:
            raise OiError(f"{path}: not a state file (.npz): {exc}") from None
        return self._from_values(values, path)

    def _from_values(self, values: dict, source: str):
        prog = self.program
        values = dict(values)
        if STEPS_KEY in values:
            self.steps = int(np.asarray(values.pop(STEPS_KEY)))
        persistent, others = {}, {}
        for name, value in values.items():
            decl = prog.graph.var(name)
            if decl is not None and decl.kind == ir.MemKind.PERSISTENT:
                persistent[name] = value
            elif decl is not None and decl.kind in (ir.MemKind.DYNAMIC, ir.MemKind.VOLATILE):
                others[name] = value  # last values, for `read` (a step recomputes them)
            else:
                known = [v.name for v in prog.graph.vars if v.kind != ir.MemKind.CONSTANT]
                raise OiError(f"{source}: {name} is not a variable of the graph{suggest(name, known)} (variables: "
                              f"{', '.join(known) or '(none)'})")
        for name, value in others.items():
            if name in prog.shaped:  # saved at its current shape: kept as such for `read`
                from ..values import convert_input
                self._values[name] = convert_input(f"{source}: {name}", np.asarray(value), prog.bound.dtype(name),
                                                   np.shape(value))
                continue
            self._values[name] = prog.convert(name, value)
        return prog.import_state(persistent, source)

    @property
    def state(self):
        """The current `StepState` (raises a pending error first)."""
        self.check()
        return self._state

    def check(self) -> None:
        """Raise the runtime error of a step not yet reported, if any."""
        pending, self._pending = self._pending, None
        if pending is not None:
            status = np.asarray(pending[0])
            if status[0]:
                self._raise_if_failed(status, pending[1])
            self._clean = pending[0]

    def read(self, name: str) -> np.ndarray:
        """A variable's current value, widened like `--out` (bf16/f8 -> float32, packed -> int8)."""
        self.check()
        prog = self.program
        decl = prog.graph.var(name)
        if decl is None or decl.kind == ir.MemKind.CONSTANT:
            known = [v.name for v in prog.graph.vars if v.kind != ir.MemKind.CONSTANT]
            raise OiError(f"read: unknown variable {name}{suggest(name, known)} "
                          f"(variables: {', '.join(known) or '(none)'})")
        if decl.kind == ir.MemKind.PERSISTENT:
            return prog.export_state(self._state)[name]
        return self._current(decl, self._values)

    def _current(self, decl, values: dict) -> np.ndarray:
        """A dynamic or volatile variable's last value (else its default / initial value), on the
        host, widened."""
        prog = self.program
        name = decl.name
        value = values.get(name)
        if value is None:
            value = prog.defaults[name] if decl.kind == ir.MemKind.DYNAMIC else prog.bound.initial(name)
        else:
            value = prog.trim(name, value, values)  # a runtime-shaped value: its current shape
        return convert_output(prog.to_host(value), decl.dtype)

    def values(self) -> dict:
        """Every dynamic, volatile and persistent variable (the `--out` layout). The end of
        every `run`: kept to one host fetch and one widening per variable."""
        self.check()
        prog = self.program
        persistent = prog.export_state(self._state)  # one host transfer of the state
        out = {}
        values = self._values
        for decl in prog.result_vars:
            name = decl.name
            out[name] = persistent[name] if name in persistent else self._current(decl, values)
        return out

    def save(self, path) -> None:
        """Write every variable (the `--out` layout) and the step count to an `.npz`, atomically;
        `Program.session(state=path)` resumes from it."""
        from ..npz import save_npz
        arrays = self.values()
        arrays[STEPS_KEY] = np.int64(self.steps)
        save_npz(path, arrays)

    # ------------------------------------------------------------------ errors

    def _raise_if_failed(self, status: np.ndarray, step: int) -> None:
        error = self.program.status_error(status, step=step)
        if error is not None:
            self._clear_error()
            raise error

    def _clear_error(self) -> None:
        import dataclasses
        flags = self._state.guards.flags
        with self.program.scope():
            self._state = dataclasses.replace(self._state, guards=type(self._state.guards)(
                flags.at[:2].set(0)))
        self._clean = self._flags

    # ------------------------------------------------------------------ inputs

    def _inputs(self, inputs: dict, steps: int | None = None) -> dict:
        """Validated inputs, on the device; conversion is exact or an OiError. `steps`: the
        values carry a leading step axis of that length."""
        prog = self.program
        out = {}
        if steps is not None:
            for name, value in inputs.items():
                want = prog.defaults[name]
                if isinstance(value, jax.Array) and value.shape == (steps,) + want.shape and value.dtype == want.dtype:
                    out[name] = value
                else:
                    out[name] = prog.convert(name, value, steps=steps)
            converted = {k: v for k, v in out.items() if isinstance(v, np.ndarray)}
            if converted:
                with prog.scope():
                    out.update(prog.placer.put("dynamic", converted))
            return out
        fast = self._fast
        all_fast = True
        for name, value in inputs.items():
            sig = fast.get(name)
            if sig is not None and type(value) is sig[2] and value.shape == sig[0] and value.dtype == sig[1]:
                out[name] = value
                continue
            if name not in prog.defaults:
                raise prog.unknown_input(name)
            want = prog.defaults[name]
            if isinstance(value, jax.Array) and value.shape == want.shape and value.dtype == want.dtype:
                fast[name] = (value.shape, value.dtype, type(value))
                out[name] = value
                continue
            all_fast = False
            out[name] = prog.convert(name, value)
        if all_fast:  # device arrays of the declared shape and dtype: nothing to convert or place
            return inputs
        converted = {k: v for k, v in out.items() if isinstance(v, np.ndarray)}
        if converted:
            with prog.scope():
                out.update(prog.placer.put("dynamic", converted))
        return out

    # ------------------------------------------------------------------ one step

    def step(self, **inputs) -> dict:
        """Run one step with these inputs (host or device arrays; a dynamic variable not given
        keeps its default). Returns the step's outputs as device arrays: every volatile and
        every dynamic the graph writes (or the names of a `return`). A hot path: kept lean."""
        hot = self.program.step_kernels.hot
        if hot is not None and len(inputs) == len(hot[1]) and not self._sync:
            # the common decode step: the same complete set of device inputs as the last step,
            # the state known clean, the kernel already compiled. The same checks as below, in
            # fewer Python operations (a bare jitted call costs a few µs; this adds well under 1).
            # The executable itself refuses a device array of another shape or dtype (TypeError:
            # then the general path below explains what is wrong); host values never come here.
            for name, typ in hot[1]:
                if type(inputs.get(name)) is not typ:
                    break
            else:
                if self._pending is not None:
                    self._settle_if_done()
                if self._pending is None and self._clean is self._flags:
                    flat = hot[0]
                    leaves = self._leaves
                    if leaves is None:
                        leaves = self._user_leaves()
                    try:
                        out = flat.exe(self.program.consts, leaves, inputs)
                    except (TypeError, ValueError):  # placed unlike the executable: the general path
                        pass
                    else:
                        self._leaves, self._user_tree, self._user_def = out[0], None, flat.user_def
                        self.steps += 1
                        if flat.has_flags:
                            self._flags = flags = out[1]
                            self._pending = (flags, self.steps)
                        outputs = out[-1]
                        self._fresh = (inputs, outputs)  # complete inputs: nothing older to flush
                        return outputs if hot[2] else self._returned(outputs)
        prog = self.program
        dyn = self._inputs(inputs)
        names = tuple(inputs)
        if names != self._given:  # the same names as last step: already known complete
            prog.check_given(names)
            self._given = names
        if self._sync:
            self.check()
            return self._step_checked(dyn)
        full = dyn if len(dyn) == self._n_dynamic else {**prog.defaults, **dyn}
        if self._pending is not None:
            self._settle_if_done()
        clean = self._clean is self._flags  # the state holds no error: the step needs no skip
        exes = self._exe
        if exes is None or exes[0] is not prog.step_kernels:
            exes = self._exe = (prog.step_kernels, {})
        exe = exes[1].get(clean)
        if exe is None:
            exe = exes[1][clean] = self._compile_fast(full, clean)
        try:
            vars_, caches, flags, outputs = exe(prog.consts, self._user, None if clean else self._flags, full)
        except (TypeError, ValueError):  # arguments placed unlike the executable's: the jit path
            with prog.scope():
                kernels = prog.step_kernels
                vars_, caches, flags, outputs = kernels.clean(prog.consts, self._user, full) if clean else \
                    kernels.single(prog.consts, self._user, self._flags, full)
        self._user = (vars_, caches)
        self.steps += 1
        previous = self._pending
        if flags is not None:  # None: a step without runtime guards, which cannot fail
            self._flags = flags
            self._pending = (flags, self.steps)
        if previous is not None:  # dispatched before the last step was done: read its outcome now
            prev_status = np.asarray(previous[0])
            if prev_status[0]:
                self._pending = None  # this step did nothing: its state had the error
                self.steps = previous[1]
                self._raise_if_failed(prev_status, previous[1])
        fresh = self._fresh
        if fresh is not None and not fresh[0].keys() <= dyn.keys():
            self._values  # noqa: B018  (flush: an input given last step but not now keeps its value)
        self._fresh = (dyn, outputs)  # outputs hold every variable: they supersede the last ones
        if clean and dyn is inputs and full is dyn and not self._shaped and previous is None:
            # every input a device array of its declared shape and dtype (`_inputs` passed them
            # through as given) and all of them given: the next such step takes the hot path
            fast = self._fast
            exes[0].hot = (exe, tuple((name, fast[name][2]) for name in inputs), self._all_returned)
        if self._shaped:  # runtime-shaped values: cut to their current shapes (reads the step's result)
            outputs = prog.trim_outputs(outputs)
        return outputs if self._all_returned else self._returned(outputs)

    def _settle_if_done(self) -> None:
        """If the last dispatched step has finished, take its outcome now: raise its error
        (before anything of this call is dispatched), else the state is known clean."""
        if outcome_ready(self._pending[0]):
            self.check()

    def _compile_fast(self, full: dict, clean: bool):
        """The session kernel compiled ahead of time for this signature, its state flat
        (`FlatStep`: no JAX config to enter nor state dataclass to flatten per call): `clean`
        (the state is known to hold no error) or `single` (a step that may follow an unreported
        error, which it must skip); a growth rebuilds the kernels and so these. Each form is
        compiled on its first use."""
        prog = self.program
        kernels = prog.step_kernels
        key = (clean,) + tuple((k, v.shape, str(v.dtype), getattr(v, "committed", None))
                               for k, v in sorted(full.items()))
        exe = kernels.compiled.get(key)
        if exe is None:  # shared by every session of the program (until a growth rebuilds kernels)
            with prog.scope():
                exe = kernels.compiled[key] = kernels.flat_step(
                    clean, prog.consts, self._user, None if clean else self._flags, full)
        return exe

    def _returned(self, outputs: dict) -> dict:
        return {k: outputs[k] for k in self.program.builder.step_outputs if k in outputs}

    def _step_checked(self, dyn: dict, wrap=None, driver: bool | None = None) -> dict:
        """One step, its status read before returning; growth re-runs it. `driver`: run it with
        the yield/await driver (default: when the session does)."""
        prog = self.program
        full = prog.dynamic_args(dyn)
        while True:
            with prog.scope():
                use_driver = self._driver if driver is None else driver
                one = prog.session_step if use_driver else prog.fused_session_step
                run = one if wrap is None else wrap(one)
                self._state, outputs = run(self._state, full)
            status = prog.to_host(self._state.guards.flags)
            if np.any(status[2:] > 0):  # undone: needs more capacity; grow and re-run
                self._state = prog.grow(self._state, status)
                continue
            break
        self.steps += 1
        self._values.update(dyn)
        self._values.update(outputs)
        self._raise_if_failed(status, self.steps)
        self._clean = self._flags
        return self._returned(prog.trim_outputs(outputs))

    # ------------------------------------------------------------------ many steps

    def run(self, inputs: dict | None = None, steps: int | None = None, collect=(), progress=None,
            feedback: dict | None = None) -> dict:
        """Run N steps as ONE compiled loop (`lax.while_loop`, state donated).

        An input of its declared shape is the same every step; one with a leading step axis
        `[N, ...]` gives step i the value `[i]` (`steps=None`: N; else at most N). Returns every
        dynamic, volatile and persistent variable after the last step (widened like `--out`);
        each name in `collect` holds instead every step's value stacked `[steps, ...]`.
        `feedback={IN: OUT}`: once IN's per-step values run out (after its first step, when it
        is given once or not at all), step i takes IN from step i-1's OUT, inside the loop
        (generation: a prompt teacher-forced, then each token fed back); `steps` may exceed the
        per-step values only of inputs with feedback.
        Errors raise from the step that failed (with its number); growth re-runs the step that
        needed it after doubling the capacity; the result equals `steps` calls of `step`."""
        self.check()
        prog = self.program
        inputs = dict(inputs or {})
        plan = plan_run(prog, inputs, steps, collect, self._inputs, feedback)
        steps, collect = plan.steps, plan.collect
        per_dev, fixed_dev, fed = plan.arguments(inputs)
        pieces: dict = {k: [] for k in collect}
        with prog.scope():
            base = 0
            # calls of about CALL_SECONDS each, so that Ctrl-C, progress and growth are never more
            # than a call away; the loop is traced once whatever n. The pace (seconds per step) is
            # the last call's, kept with the kernels; a program's first run measures it on 16 steps
            limit = steps if progress is None else max(1, -(-steps // 50))

            def steps_per_call(pace):
                return max(1, min(limit, int(CALL_SECONDS / max(pace, 1e-9))))

            pace = prog.step_kernels.pace
            chunk = min(16, limit) if pace is None else steps_per_call(pace)
            last = None
            while base < steps:
                n = min(chunk, steps - base)
                t0 = time.perf_counter()
                kernels = prog.step_kernels  # new ones after a growth (and new executables)
                res = kernels.multi(prog.consts, self._state, per_dev, fixed_dev, base, n, collect, steps,
                                    exes=plan.exes(kernels), feedback=plan.feedback, fed=fed)
                self._state, fed = res.state, res.fed
                status = np.asarray(res.status).tolist()  # (err, errval, applied, grow...): Python ints
                applied = status[2]
                if applied:
                    pace = kernels.pace = (time.perf_counter() - t0) / applied
                    chunk = steps_per_call(pace)
                    last = res.last
                    for k in collect:
                        pieces[k].append(res.stacked[k][base:base + applied])
                base += applied
                self.steps += applied
                step_status = status[:2] + status[3:]  # (err, errval, grow...)
                if status[0]:
                    self._set_values(last)
                    self._raise_if_failed(step_status, self.steps)
                if any(g > 0 for g in status[3:]):  # the undone step asks for capacity: grow
                    self._state = prog.grow(self._state, np.asarray(step_status, np.int64))
                if progress is not None:
                    progress(base)
            self._set_values(last)
        self._clean = self._flags  # the last status read said: no error, no growth pending
        result = self.values()
        for k in collect:
            if pieces[k]:
                result[k] = convert_output(np.concatenate([prog.to_host(p) for p in pieces[k]]),
                                           prog.bound.dtype(k))
            else:
                result[k] = np.zeros((0,) + result[k].shape, result[k].dtype)
        return result

    def _set_values(self, last) -> None:
        """The last applied step's values (the fused loop returns every variable, inputs too);
        `last` is None when no step was applied."""
        if last is not None:
            self._values.update(last)

    def run_stepwise(self, inputs: dict | None = None, steps: int | None = None, wrap=None, collect=(),
                     progress=None, driver: bool = False, feedback: dict | None = None) -> dict:
        """`run` as one checked step at a time (the yield/await driver, traced runs): same inputs,
        same result. `wrap(step_fn)` may wrap each kernel call (timing); `driver=True` runs each
        step with the program's yield/await driver. `feedback` as in `run`, through the host."""
        self.check()
        prog = self.program
        prog.check_given(inputs or {})
        pairs = feedback_pairs(prog, feedback)
        per_step, fixed, steps = split_inputs(prog, dict(inputs or {}), steps, pairs)
        collect = collect_names(prog, collect)
        per_host = {k: prog.convert(k, v, steps=np.shape(v)[0]) for k, v in per_step.items()}
        fixed_dev = self._inputs(fixed)
        stacks: dict = {k: [] for k in collect}
        for i in range(steps):
            dyn = dict(fixed_dev)
            given = {k: v[i] for k, v in per_host.items() if i < len(v)}
            for name, source in pairs:  # past its given values: what its source held after the last step
                if name not in given and (name in per_host or i > 0):
                    given[name] = self.read(source)  # widened, and converted back exactly
            if given:
                dyn.update(self._inputs(given))
            self._step_checked(dyn, wrap=wrap, driver=driver)
            for k in collect:
                stacks[k].append(self.read(k))
            if progress is not None:
                progress(i + 1)
        result = self.values()
        for k in collect:
            result[k] = np.stack(stacks[k]) if stacks[k] else np.zeros((0,) + result[k].shape, result[k].dtype)
        return result
