"""`Session`: the decode loop. It owns a program's state across steps (docs/decode.md).

    sess = prog.session()                 # or prog.session(state="s.npz") to resume
    for tok in tokens:
        out = sess.step(x=tok)            # one step, new inputs each call
    sess.run({"x": xs})                   # xs: [N, ...] -> N steps fused into ONE compiled loop
    sess.read("K"); sess.save("s.npz")

Errors (docs/decode.md, "When errors surface"): step k's runtime error raises `OiError` naming its
guard, its DSL location and "in step k": from `run` before it returns (later steps did not run;
`err.partial` holds what the steps before it produced); from `step` at the next point where the
session hands data to the host, or at the latest at call k + K (`max_unchecked`), the steps
dispatched after it skipped in the kernel. Then the error is cleared; none is ever dropped.
Growth: a step that needs more capacity is undone in the kernel, the capacity doubled (one
recompile) and the step re-run with its own inputs: n growth steps cost O(log n) compiles.
"""
from __future__ import annotations

import atexit
import dataclasses
import itertools
import os
import sys
import warnings
import weakref

import jax
import numpy as np

from .. import ir
from ..diagnostics import OiError, suggest
from ..lowering.state import Guards, StepState
from .._signals import deferred, held, raise_pending
from ..values import convert_output
from . import state_file
from .kernels import StepOutcome, compiled
from .placement import Placer
from .runstats import RunClock
from ..run_rules import (collect_names, fed_back, feedback_pairs, split_inputs, stop_from, stop_hits, stop_set,
                         stopped, with_collected)
from .runargs import call_limit, collected_rows, device_inputs, stop_arrays, validate_run

CALL_SECONDS = 0.5  # a fused run's steps go in calls of about this long (Ctrl-C stays responsive)


# Every session, so that one still holding a step whose outcome is unread when the interpreter
# exits reports that step's error (`Session._report_unchecked`); one let go earlier reports it
# from `__del__`. Registered after JAX's own exit handlers, so it runs before them.
_SESSIONS: weakref.WeakSet = weakref.WeakSet()
_SERIAL = itertools.count(1)


@atexit.register
def _report_unchecked_at_exit() -> None:
    for sess in list(_SESSIONS):
        try:  # each session's report on its own: one that raises (`-W error`) does not stop the others'
            sess._report_unchecked("the interpreter exits")
        except Exception as exc:  # noqa: BLE001 (a warning turned into an error: said, then the next)
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)


MAX_UNCHECKED = 8  # default K: steps `Session.step` may leave unchecked (docs/decode.md, "When errors surface")
RECENT = 32  # values of this many steps are kept apart before they are merged (see `_last_values`)


class DeviceOutcomes:
    """How a session learns the outcome of a dispatched step from its guard flags: `ready(flags)`
    says whether the step has finished (the flags can be read without waiting), `read(flags)`
    reads its `StepOutcome` (waiting for it). `Session.outcomes` is this by default; a test
    replaces it (per session) to steer or count what the session sees of the device."""

    @staticmethod
    def ready(flags) -> bool:
        return flags.is_ready()

    @staticmethod
    def read(flags) -> StepOutcome:
        return StepOutcome.of_flags(flags)


class SessionHotPath:
    """`Session.step`'s hot path: the executable and its compiled forms for the signature of the
    last step, which gave every input as a device array of its declared shape and dtype (`types`:
    each input's name and array type, checked per call; the compiled form checks shapes and dtypes
    itself)."""

    __slots__ = ("executable", "forms", "types")

    def __init__(self, executable, forms, types: tuple):
        self.executable, self.forms, self.types = executable, forms, types


class Session:
    def __init__(self, program, state=None, max_unchecked: int | None = None):
        self.program = program
        if max_unchecked is None:
            max_unchecked = MAX_UNCHECKED
        if isinstance(max_unchecked, bool) or not isinstance(max_unchecked, int) or max_unchecked < 1:
            raise OiError(f"max_unchecked must be an integer >= 1, got {max_unchecked!r}")
        self.max_unchecked = max_unchecked  # K: dispatched steps whose outcome may stay unread
        self.steps = 0  # steps applied so far (a resumed session goes on counting)
        # the guard flags of the newest dispatched steps whose outcome is unread, oldest first: the
        # last is step `steps` (a step dispatched while any is unread may follow an error, so it
        # returns flags), `_pending[i]` step `steps - len(_pending) + 1 + i`
        self._pending: list = []
        self._merged: dict = {}  # last value of each dynamic / volatile variable (see _last_values)
        # the values of the steps not merged into _merged, oldest first, each a tuple
        # (step, inputs, outputs, complete: every input given, superseding every earlier step's)
        self._recent: list[tuple] = []
        self._hot: SessionHotPath | None = None  # Session.step's hot path (see step)
        self._fast: dict = {}  # device inputs accepted without conversion: name -> runargs.InputSig
        self._given: tuple | None = None  # input names of the last step (checked complete)
        self._closed = False
        self._closed_why = ""  # why the session closed itself (not `close()`): said by every later use
        self.outcomes = DeviceOutcomes  # how dispatched steps' outcomes are read (a documented hook)
        self.call_seconds = CALL_SECONDS  # `run`: the length of one fused call, about
        self.general_steps = 0  # `step` calls that took the general path (validated, maybe compiled)
        self.last_run = None  # `RunStats` of the last `run` (runtime/runstats.py)
        self._n_dynamic = len(program.defaults)
        self._user_tree = self._leaves = self._user_def = None  # see _user
        self._shaped = bool(program.shaped)
        # the yield/await driver runs a session's steps only where it places consumers on other
        # devices; otherwise the fused kernels run them (same results, one kernel per step)
        self._driver = program.driver is not None and bool(program.driver.placement)
        self._sync = program.growable or self._driver
        builder = program.executable.builder
        self._returns = builder.step_outputs  # what a step returns (its `return`, else every output)
        self._all_returned = set(builder.step_outputs) == set(builder.all_names)
        if state is None:
            self._state = program.init_state()
        elif isinstance(state, (str, os.PathLike)):
            path = os.fspath(state)
            self._state = self._from_values(state_file.load(path), path, whole=True)
        elif isinstance(state, dict):
            self._state = self._from_values(state, "state")
        elif not isinstance(state, StepState):
            raise OiError(f"state: expected a StepState, a {{name: array}} dict or a state file's path, got "
                          f"{type(state).__name__}")
        else:
            program.refuse_used(state, "start the session from host values instead "
                                        "(`prog.session(state=sess.values())`) or from a copy of the tree")
            program.refuse_foreign(state)  # another graph's, or at other sizes: named, before any step
            self._state = state
            # a session whose state this is hands it over (its next use would find the buffers
            # donated away, a raw JAX error): closed, saying so
            given = {id(a) for a in jax.tree.leaves((state.vars, state.caches))}
            for other in list(_SESSIONS):
                if not other._closed and any(id(a) in given for a in other._user_leaves()):
                    other._let_go("its state was handed to another session (Program.session(state="
                                  "sess.state)), which steps it now; to keep both, start the other from a copy "
                                  "(state=sess.values())")
        # whether the state's guard flags are known to hold no error (every dispatched step's
        # outcome read): the next step needs no skip. A StepState handed in is not known clean.
        self._clean = not isinstance(state, StepState)
        _SESSIONS.add(self)
        self._serial = next(_SERIAL)  # named in the unreported-error warning (two alike are two warnings)

    def __del__(self):
        self._report_unchecked("the session was let go")

    def _report_unchecked(self, when: str) -> None:
        """A session let go (or still open when the interpreter exits) with dispatched steps whose
        outcome is unread: their error, if any, is reported as a RuntimeWarning, not lost with
        the session (a script that ends right after `step`)."""
        if getattr(self, "_closed", True) or not getattr(self, "_pending", None):
            return
        try:
            self.check()
        except OiError as exc:
            warnings.warn(f"the runtime error of session #{self._serial} of this process was never reported ({when} "
                          f"before a later step, `read`, `check`, `save` or `close`):\n{exc.render()}", RuntimeWarning,
                          stacklevel=2)
        except Exception:  # noqa: BLE001 (the device already gone at exit: nothing left to read)
            pass

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
    def held_as(self) -> str:
        """How the session holds its state now (introspection): "leaves" (only the flat leaves
        that `Session.step`'s compiled form takes and returns) or "tree" (the `StepState` tree,
        made on demand: reading `state`, a fused `run`)."""
        return "leaves" if self._user_tree is None else "tree"

    @property
    def _state(self):
        return StepState(self._user[0], self._user[1], Guards(self._flags))

    @_state.setter
    def _state(self, state):
        self._user, self._flags = (state.vars, state.caches), state.guards.flags

    @property
    def _last_values(self) -> dict:
        """Every dynamic / volatile variable's last value (device or host arrays). Steps leave
        theirs in `_recent`, merged here in order; read only when no step is unchecked (a step
        found failing drops the entries of the steps after it, which did nothing)."""
        if self._recent:
            self._merge(self.steps)
        return self._merged

    def _merge(self, through: int) -> None:
        """Merge the values of the steps up to number `through` into `_merged` (from the last step
        given every input: its inputs and outputs hold every variable, superseding older ones)."""
        recent = self._recent
        start = n = 0
        for i, (step, _, _, complete) in enumerate(recent):
            if step > through:
                break
            n = i + 1
            if complete:
                start = i
        vals = self._merged
        for _, inputs, outputs, _ in recent[start:n]:
            vals.update(inputs)
            vals.update(outputs)  # outputs hold every variable a step writes
        del recent[:n]

    def _from_values(self, values: dict, source: str, whole: bool = False):
        """The state of saved `values` (state_file.py); their step count and last values taken.
        `whole`: a state file, which must hold every persistent variable."""
        steps, persistent, last, present = state_file.split_saved(self.program, values, source, whole)
        if steps is not None:
            self.steps = steps
        self._last_values.update(last)
        return self.program.import_state(persistent, source, present=present)

    @property
    def state(self):
        """The current `StepState` (raises a pending error first): the session's own buffers,
        which its next step donates -- keep `values()` (host copies), or copy the tree, to use
        them after that."""
        self.check()
        return self._state

    def check(self) -> None:
        """Raise the runtime error of a step not yet reported, if any (waits for the last
        dispatched step: a point where the session hands data to the host)."""
        if self._closed:
            raise self._closed_error()
        if self._pending:
            self._confirm(len(self._pending) - 1)

    @property
    def unchecked(self) -> int:
        """How many dispatched steps' outcomes the session has not read yet (at most
        `max_unchecked`)."""
        return len(self._pending)

    def close(self) -> None:
        """Raise the error of a step not yet reported, if any, and let the state go; the
        session cannot be used after. `with prog.session() as sess:` closes it at the end (an
        exception leaving the block is not masked by a pending error)."""
        if self._closed:
            return
        try:
            self.check()
        finally:
            self._let_go()

    def _closed_error(self) -> OiError:
        return OiError("this session is closed" + (f": {self._closed_why}" if self._closed_why else ""))

    def _let_go(self, why: str = "") -> None:
        """Closed: the state let go; `why` (the session closed itself) said by every later use."""
        self._closed, self._hot, self._pending, self._recent = True, None, [], []
        self._user_tree = self._leaves = self._flags = None
        self._closed_why = why

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type, *exc) -> bool:
        if exc_type is None:
            self.close()
        else:
            self._pending = []
            self.close()
        return False

    # ------------------------------------------------------------------ outcomes of dispatched steps

    def _poll(self) -> None:
        """Take the outcome of the dispatched steps found finished, without waiting: one read, of
        the newest finished one (a step's flags carry any earlier unreported error: the steps
        after a failing one skip, passing its error on). Raises a step's error."""
        pending = self._pending
        ready = self.outcomes.ready
        if not ready(pending[0]):  # in dispatch order: the oldest not finished, none is
            return
        done, n = 0, len(pending)
        while done + 1 < n and ready(pending[done + 1]):
            done += 1
        self._confirm(done)

    def _confirm(self, i: int) -> None:
        """Read the outcome of unchecked step `_pending[i]` (waiting for it): no error -> it and
        every step before it are checked; an error -> raised for the first step that has it."""
        pending = self._pending
        read = self.outcomes.read
        first = self.steps - len(pending) + 1  # the step of `pending[0]`
        outcome = read(pending[i])
        if outcome.err:
            # the steps after a failing one carry its error: the failing step starts that run
            while i > 0:
                earlier = read(pending[i - 1])
                if not earlier.err:
                    break
                i, outcome = i - 1, earlier
            self._fail(outcome, first + i)
        through = first + i
        del pending[:i + 1]
        if not pending:
            self._clean = True
        if len(self._recent) > RECENT:
            self._merge(through)

    def _fail(self, outcome: StepOutcome, step: int) -> None:
        """Step `step` failed: the steps dispatched after it did nothing (skipped in the kernel):
        forget them, so that the session is exactly where step `step` left it; raise its error."""
        self._pending = []
        self.steps = step
        self._recent = [(n, i, o, c) for n, i, o, c in self._recent if n <= step]  # the steps after it did nothing
        self._raise_if_failed(outcome, step)

    def read(self, name: str) -> np.ndarray:
        """A variable's current value, widened like `--out` (bf16/f8 -> float32, packed -> int8)."""
        self.check()
        prog = self.program
        decl = prog.graph.var(name)
        if decl is not None and decl.kind == ir.MemKind.CONSTANT:
            raise OiError(f"read: {name} is a constant (a model tensor), not part of the session's state: "
                          f"read it from the model file")
        if decl is None:
            known = [v.name for v in prog.graph.vars if v.kind != ir.MemKind.CONSTANT]
            raise OiError(f"read: unknown variable {name}{suggest(name, known)} "
                          f"(variables: {', '.join(known) or '(none)'})")
        if decl.kind == ir.MemKind.PERSISTENT:
            return prog.executable.export_state(self._state)[name]
        return self._current(decl, self._last_values)

    def _current(self, decl, values: dict) -> np.ndarray:
        """A dynamic or volatile variable's last value (else its default / initial value), on the
        host, widened."""
        prog = self.program
        exe = prog.executable
        name = decl.name
        value = values.get(name)
        if value is None:
            value = exe.defaults[name] if decl.kind == ir.MemKind.DYNAMIC else prog.bound.initial(name)
        else:
            value = exe.trim(value)  # a runtime-shaped value: its current shape
        return convert_output(exe.to_host(value), decl.dtype)

    def values(self) -> dict:
        """Every dynamic, volatile and persistent variable (the `--out` layout). The end of
        every `run`: kept to one host fetch and one widening per variable."""
        self.check()
        prog = self.program
        persistent = prog.executable.export_state(self._state)  # one host transfer of the state
        out = {}
        values = self._last_values
        for decl in prog.result_vars:
            name = decl.name
            out[name] = persistent[name] if name in persistent else self._current(decl, values)
        return out

    def save(self, path) -> None:
        """Write every variable (the `--out` layout) and the step count to an `.npz`, atomically;
        `Program.session(state=path)` resumes from it (the state file it started from may be
        replaced: a checkpoint kept up to date). An OiError, with nothing written, for the
        program's graph or model file, a directory, a device, an empty path or a missing folder."""
        values = self.values()  # checks first: a pending error is raised before anything is read
        present = self.program.executable.export_present(self._state)
        state_file.save(path, values, self.steps, {"graph": self.program.graph.path,
                                                   "model": self.program.model_path}, present=present)

    # ------------------------------------------------------------------ errors

    def _raise_if_failed(self, outcome: StepOutcome, step: int) -> None:
        error = self.program.executable.status_error(outcome, step=step)
        if error is not None:
            self._clear_error()
            raise error

    def _clear_error(self) -> None:
        flags = self._state.guards.flags
        with self.program.scope():
            self._state = dataclasses.replace(self._state, guards=type(self._state.guards)(
                flags.at[:2].set(0)))
        self._clean = True

    # ------------------------------------------------------------------ inputs

    def _inputs(self, inputs: dict, steps: int | None = None) -> dict:
        """Validated inputs, on the device (`runargs.device_inputs`; `_fast` the accepted signatures)."""
        return device_inputs(self.program, inputs, self._fast, steps)

    # ------------------------------------------------------------------ one step

    def step(self, **inputs) -> dict:
        """Run one step with these inputs (host or device arrays; a dynamic variable not given
        keeps its default). Returns the step's outputs as device arrays: every volatile and
        every dynamic the graph writes (or the names of a `return`). A hot path: kept lean."""
        hot = self._hot
        if hot is not None and len(inputs) == len(hot.types) and hot.executable is self.program.executable:
            # the common decode step: the same complete set of device inputs as the step that set
            # `_hot`, its kernel compiled. The same checks as the general path, in fewer Python
            # operations (a bare jitted call costs a few µs; this adds well under 1): each input's
            # array type, then its aval and sharding against the compiled form's
            # (`FlatStep.takes_inputs`; anything else: the general path explains or converts it);
            # host values never come here.
            for name, typ in hot.types:
                if type(inputs.get(name)) is not typ:
                    break
            else:
                if self._pending:
                    self._poll()
                clean = self._clean
                flat = hot.forms.from_clean if clean else hot.forms.after_unchecked
                if flat is not None and flat.takes_inputs(inputs):
                    leaves = self._leaves
                    if leaves is None:
                        leaves = self._user_leaves()
                    out = flat.exe(hot.executable.consts, leaves, inputs) if clean else \
                        flat.exe(hot.executable.consts, leaves, self._flags, inputs)
                    self._leaves, self._user_tree, self._user_def = out[0], None, flat.user_def
                    outputs = out[-1]
                    self._dispatched(inputs, out[1] if flat.has_flags else None, outputs)
                    return outputs if self._all_returned else self._returned(outputs)
        return self._step_general(inputs)

    def _step_general(self, inputs: dict) -> dict:
        """`step` for anything the hot path does not take: validates and converts the inputs,
        compiles the kernel form for their signature, and sets up the hot path. A Ctrl-C
        during a compile is raised once it returns, before anything runs (`_signals.deferred`;
        not around every step: installing a handler costs microseconds)."""
        if self._closed:
            raise self._closed_error()
        self.general_steps += 1
        prog = self.program
        exe = prog.executable
        dyn = self._inputs(inputs)
        names = tuple(inputs)
        if names != self._given:  # the same names as last step: already known complete
            prog.check_given(names)
            self._given = names
        if self._sync:
            self.check()
            return self._step_checked(dyn)
        full = dyn if len(dyn) == self._n_dynamic else {**exe.defaults, **dyn}
        if self._pending:
            self._poll()
        elif not self._clean and self._flags is not None:
            # a state handed in (not known clean): its flags read once (the step waits for that
            # state anyway); no error and no growth asked for -> the clean form, not a second
            # compiled form that can skip (a prompt session's state handed to the decode program)
            outcome = self.outcomes.read(self._flags)
            self._clean = not outcome.err and outcome.applied
        clean = self._clean  # the state holds no error: the step needs no skip
        kernels = exe.kernels
        forms = kernels.session_forms(full)
        flat = forms.form(clean)
        if flat is None:  # each form compiled on its first use
            with prog.scope(), deferred():
                flat = forms.compile(clean, exe.consts, self._user, self._flags, full)
        with held():  # the state handed over and taken back, and the step counted, as one
            leaves, flags, outputs, ahead = kernels.call_session_step(flat, clean, exe.consts, self._user_leaves(),
                                                                      self._flags, full)
            self._leaves, self._user_tree, self._user_def = leaves, None, flat.user_def
            if ahead and dyn is inputs and full is dyn and not self._shaped:
                # every input a device array of its declared shape and dtype (`_inputs` passed them
                # through as given), all of them given, and the compiled form took the step (the state
                # is placed as it takes it): the next such step takes the hot path
                fast = self._fast
                self._hot = SessionHotPath(exe, forms, tuple((name, fast[name].type) for name in inputs))
            self._dispatched(dyn, flags, outputs)
        if self._shaped:  # runtime-shaped values: cut to their current shapes (reads the step's result)
            outputs = exe.trim_outputs(outputs)
        return outputs if self._all_returned else self._returned(outputs)

    def _dispatched(self, dyn: dict, flags, outputs: dict) -> None:
        """Account for a step just dispatched: its values, its outcome to read later (`flags`;
        None: a step without runtime guards, which cannot fail). More than `max_unchecked`
        unchecked steps: wait for the oldest ones (raises the error of a failed one; this step
        then did nothing and its outputs are never returned)."""
        self.steps += 1
        complete = len(dyn) == self._n_dynamic
        entry = (self.steps, dyn, outputs, complete)
        if complete and not self._pending:  # every input given, every earlier step checked: supersedes them
            self._recent = [entry]
        else:
            self._recent.append(entry)
            if len(self._recent) > RECENT and not self._pending:
                self._merge(self.steps)
        if flags is None:
            return
        self._flags = flags
        self._clean = False
        pending = self._pending
        pending.append(flags)
        if len(pending) > self.max_unchecked:
            self._confirm(len(pending) - self.max_unchecked - 1)

    def _grown(self, outcome: StepOutcome, step: int):
        """The state grown for undone step `step` (`Program.grow`); a growth refused before
        allocating (too large) names that step, as its guard's error would."""
        try:
            return self.program.grow(self._state, outcome)
        except OiError as exc:
            raise exc.in_step(step) from None

    def _returned(self, outputs: dict) -> dict:
        return {k: outputs[k] for k in self._returns if k in outputs}

    def _step_checked(self, dyn: dict, wrap=None, driver: bool | None = None) -> dict:
        """One step, its status read before returning; growth re-runs it. `driver`: run it with
        the yield/await driver (default: when the session does)."""
        prog = self.program
        full = prog.executable.dynamic_args(dyn)
        while True:
            exe = prog.executable  # the next one after a growth
            with prog.scope():
                use_driver = self._driver if driver is None else driver
                one = prog.session_step if use_driver else exe.session_step
                run = one if wrap is None else wrap(one)
                self._state, outputs = run(self._state, full)
            outcome = StepOutcome.of_flags(exe.to_host(self._state.guards.flags))
            if outcome.undone:  # needs more capacity: grow and re-run
                self._state = self._grown(outcome, self.steps + 1)
                continue
            break
        self.steps += 1
        self._last_values.update(dyn)
        self._last_values.update(outputs)
        self._raise_if_failed(outcome, self.steps)
        self._clean = True
        return self._returned(exe.trim_outputs(outputs))

    # ------------------------------------------------------------------ many steps

    def run(self, inputs: dict | None = None, steps: int | None = None, collect=(), progress=None,
            feedback: dict | None = None, stop: dict | None = None, on_chunk=None, every: int | None = None) -> dict:
        """Run N steps as ONE compiled loop (`lax.while_loop`, state donated).

        An input of its declared shape is the same every step; one with a leading step axis
        `[N, ...]` gives step i the value `[i]` (`steps=None`: N; else at most N). Returns every
        dynamic, volatile and persistent variable after the last step (widened like `--out`);
        each name in `collect` holds instead every step's value stacked `[steps, ...]`.
        `feedback={IN: OUT}`: once IN's per-step values run out (after its first step, when it
        is given once or not at all), step i takes IN from step i-1's OUT, inside the loop
        (generation: a prompt teacher-forced, then each token fed back); `steps` may exceed the
        per-step values only of inputs with feedback. IN not given: its default in the session's
        first step, else the session's last OUT (`continued`).
        `stop={OUT: [ID, ...]}`: the loop ends after the step whose OUT is one of the ids (every
        element of OUT, each of a batch's sequences at its own step: `run_rules.stopped`), on the
        device, no host read per step; that step is the run's last and is kept (its OUT, the stop
        id, is in the result), no later step runs; `steps` is then a budget.
        `on_chunk(rows, done)`: streaming; called after each fused call with the collected rows
        that call produced (`{name: [k, ...]}`, host arrays widened like the result) and the steps
        done so far. The first call runs one step (the first token reaches the host at once), the
        others at most `every` steps (default: about `call_seconds` of steps).
        Errors raise from the step that failed (with its number); nothing is lost: the error's
        `partial` is the run's result up to the step before the failing one (the collected rows of
        the steps before it; every other variable as the session holds it: the failing step's
        state, its failing write skipped). Growth re-runs the step that needed it after doubling
        the capacity; the result equals `steps` calls of `step`. Ctrl-C (`_signals.deferred`):
        KeyboardInterrupt after the call in flight, its `partial` the result so far (the session
        goes on from there). `last_run` (`RunStats`): steps, seconds, compiling, the first call
        and the steady rate of this run."""
        self.check()
        prog = self.program
        inputs = self.continued(dict(inputs or {}), feedback)
        stop_ids = stop_set(prog, stop)
        call = validate_run(prog, inputs, steps, collect, self._inputs, feedback, stop_ids)
        steps, collect = call.steps, call.collect
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise OiError(f"every must be an integer >= 1, got {every!r}")
        per_dev, fixed_dev, fed = call.arguments(inputs)
        pieces: dict = {k: [] for k in collect}
        limit = call_limit(steps, progress is not None, every)
        rows = collected_rows(limit, collect)  # a call's own rows (runargs.call_limit)
        clock = RunClock()
        with prog.scope(), deferred():
            stop_dev, done = stop_arrays(prog, stop_ids)
            base = 0
            # calls of about CALL_SECONDS each, so that Ctrl-C, progress and growth are never more
            # than a call away; the loop is traced once whatever n. The pace (seconds per step, its
            # compiling left out) is the last call's, kept with the kernels; a program's first run
            # measures it on 16 steps
            def steps_per_call(pace):
                return max(1, min(limit, int(self.call_seconds / max(pace, 1e-9))))

            pace = prog.executable.kernels.pace
            chunk = min(16, limit) if pace is None else steps_per_call(pace)
            if on_chunk is not None:
                chunk = 1
            last, over, res = None, False, None  # res: a call whose steps are not counted yet

            def account(call_res):
                """Count a call's steps and keep its rows (its state is the session's already):
                (steps applied, outcome, its seconds); its error raises with the run's result
                before it. What waits for the device comes first; the bookkeeping after it is
                one `held` block, so an interrupt leaves the call counted entirely or not at all."""
                nonlocal base, last, over, res
                outcome = StepOutcome.of_status(call_res.status)
                stops_now = bool(stopped(jax.device_get(call_res.done))) if call_res.done else False
                applied = outcome.applied
                # sliced on the host: a device slice per `applied` compiles
                got = {k: exe.to_host(call_res.stacked[k])[:applied] for k in collect} if applied else {}
                with held():
                    over = stops_now
                    running = clock.stop(applied)
                    if applied:
                        last = call_res.last
                        for k in collect:
                            pieces[k].append(got[k])
                    base += applied
                    self.steps += applied
                    res = None
                if outcome.err:
                    self._set_values(last)
                    error = exe.status_error(outcome, step=self.steps)
                    self._clear_error()
                    self.last_run = clock.stats(stopped=False)
                    error.partial = self._result(pieces, drop=1)
                    if on_chunk is not None and applied > 1:  # this call's rows before the failing
                        # step reach a stream too, as they reach `partial` (streamed rows + partial's)
                        on_chunk({k: self._collected([got[k][:applied - 1]], k) for k in collect}, base - 1)
                    raise error
                return applied, outcome, running

            try:
                while base < steps:
                    n = min(chunk, steps - base)
                    clock.start()
                    exe = prog.executable  # the next one after a growth
                    kernels = exe.kernels
                    with held():  # the state handed over and taken back as one
                        res = kernels.multi(exe.consts, self._state, per_dev, fixed_dev, base, n, collect, rows,
                                            exes=call.exes(kernels), feedback=call.feedback, fed=fed, stop=stop_dev,
                                            done=done)
                        self._state, fed, done = res.state, res.fed, res.done
                    applied, outcome, running = account(res)
                    if applied and running > 0:
                        pace = kernels.timed(running, applied)
                        chunk = steps_per_call(pace)
                    if outcome.undone:  # the undone step asks for capacity: grow
                        with held():
                            try:
                                self._state = self._grown(outcome, self.steps + 1)
                            except OiError as error:  # refused: the run so far goes with it
                                self._set_values(last)
                                self.last_run = clock.stats(stopped=False)
                                error.partial = self._result(pieces)
                                if on_chunk is not None and applied:
                                    on_chunk({k: self._collected([pieces[k][-1]], k) for k in collect}, base)
                                raise
                    if on_chunk is not None and applied:
                        on_chunk({k: self._collected([pieces[k][-1]], k) for k in collect}, base)
                    if progress is not None:
                        progress(base)
                    if over:
                        break
                    raise_pending()  # Ctrl-C: after the call in flight, with what the run made
                self._set_values(last)
                result = self._result(pieces)
                raise_pending()
            except KeyboardInterrupt as interrupt:
                def so_far():  # the call in flight counted, if it was not, then the run's result
                    if res is not None:
                        account(res)
                    self._set_values(last)
                    return self._result(pieces)
                self._interrupted(interrupt, so_far, pieces)
                raise
        self._clean = True  # the last status read said: no error, no growth pending
        self.last_run = clock.stats(stopped=over if steps else False)
        return self._given_at_zero(result, inputs, steps)

    def _given_at_zero(self, result: dict, inputs: dict, steps: int) -> dict:
        """A run of zero steps reports each dynamic input it was given as given (a per-step input:
        its first value), as the interpreter does: no step ran to take it in, and the session's
        own value (zeros, or an earlier run's) is not what this run was given."""
        if steps:
            return result
        prog = self.program
        for name, value in inputs.items():
            decl = prog.graph.var(name)
            if decl is None or decl.kind != ir.MemKind.DYNAMIC:
                continue
            value = np.asarray(value)
            if value.shape != tuple(prog.bound.shape(name)):  # one value per step
                if not len(value):
                    continue
                value = value[0]
            result[name] = convert_output(prog.convert(name, value), decl.dtype)
        return result

    def continued(self, inputs: dict, feedback) -> dict:
        """`inputs`, with each fed-back input that is not given taken from this session's value of
        its output: a run that continues the session (steps run, or a state resumed) starts where
        the last step left off, its first step's IN that step's OUT, as `feedback` defines it for
        every later step. A session with no step yet: unchanged (its first IN must be given)."""
        if not isinstance(feedback, dict) or not self.steps:
            return inputs
        graph = self.program.graph
        missing = {i: o for i, o in feedback.items() if i not in inputs and isinstance(o, str) and graph.var(o)}
        return {**inputs, **{i: self.read(o) for i, o in missing.items()}} if missing else inputs

    def _interrupted(self, interrupt: KeyboardInterrupt, so_far, pieces: dict) -> None:
        """A Ctrl-C in `run` (deferred to the end of a fused call, or a second one at once): the
        run's result so far (`so_far()`: the call in flight counted, its state the session's
        already) as the interrupt's `partial`. Where the
        interrupt cut a call off before it returned, its state may be gone with it (JAX donated
        it): the session is closed then, saying so, rather than left on a deleted state, and the
        partial result is the rows collected before that call."""
        if any(getattr(leaf, "is_deleted", lambda: False)() for leaf in jax.tree.leaves(self._state)):
            self._let_go("its state was given to a fused call that a second Ctrl-C cut off")
            interrupt.partial = {k: self._collected(parts, k) for k, parts in pieces.items() if parts}
            return
        try:
            interrupt.partial = so_far()
        except KeyboardInterrupt:  # yet another Ctrl-C: out at once, without a partial result
            pass

    def _collected(self, pieces: list, name: str) -> np.ndarray:
        """A collected variable's rows from the pieces the fused calls left (host), widened."""
        return convert_output(np.concatenate(pieces), self.program.bound.dtype(name))

    def _result(self, pieces: dict, drop: int = 0) -> dict:
        """`run`'s result: every variable (`values`), each collected one as its rows stacked, the
        last `drop` rows left out (those of a failing step)."""
        result = self.values()
        for k, parts in pieces.items():
            rows = self._collected(parts, k) if parts else np.zeros((0,) + result[k].shape, result[k].dtype)
            result[k] = rows[:len(rows) - drop] if drop else rows
        return result

    def _set_values(self, last) -> None:
        """The last applied step's values (the fused loop returns every variable, inputs too);
        `last` is None when no step was applied."""
        if last is not None:
            self._last_values.update(last)

    def run_stepwise(self, inputs: dict | None = None, steps: int | None = None, wrap=None, collect=(),
                     progress=None, driver: bool = False, feedback: dict | None = None, stop: dict | None = None) -> dict:
        """`run` as one checked step at a time (the yield/await driver, traced runs): same inputs,
        same result. `wrap(step_fn)` may wrap each kernel call (timing); `driver=True` runs each
        step with the program's yield/await driver. `feedback` and `stop` as in `run`, through the host."""
        self.check()
        prog = self.program
        inputs = self.continued(dict(inputs or {}), feedback)
        prog.check_given(inputs)
        pairs = feedback_pairs(prog, feedback)
        stop_ids = stop_set(prog, stop)
        done = {k: np.zeros(tuple(prog.bound.shape(k)), bool) for k in stop_ids}
        per_step, fixed, steps = split_inputs(prog, dict(inputs or {}), steps, pairs)
        collect = collect_names(prog, collect)
        per_host = {k: prog.convert(k, v, steps=np.shape(v)[0]) for k, v in per_step.items()}
        fixed_dev = self._inputs(fixed)
        stacks: dict = {k: [] for k in collect}

        def stacked() -> dict:  # every variable, each collected one as its rows stacked
            return with_collected(self.values(), stacks)

        counts_from = stop_from(stop_ids, pairs, lambda k: len(per_host[k]) if k in per_host else 1)
        clock = RunClock()  # `last_run` (--stats) as the fused loop keeps it: each step one call
        over = False
        for i in range(steps):
            dyn = dict(fixed_dev)
            given = {k: v[i] for k, v in per_host.items() if i < len(v)}
            for name, source in pairs:  # past its given values: what its source held after the last step
                if fed_back(i, len(per_host[name]) if name in per_host else 1):
                    given[name] = self.read(source)  # widened, and converted back exactly
            if given:
                dyn.update(self._inputs(given))
            clock.start()
            try:
                self._step_checked(dyn, wrap=wrap, driver=driver)
            except OiError as error:  # what the steps before it produced goes with it, as from `run`
                error.partial = stacked()
                self.last_run = clock.stats(stopped=False)
                raise
            clock.stop(1)
            for k in collect:
                stacks[k].append(self.read(k))
            if progress is not None:
                progress(i + 1)
            for k, ids in stop_ids.items():
                if i >= counts_from[k]:
                    done[k] = done[k] | stop_hits(self.read(k), ids)
            if done and stopped(done):
                over = True
                break
        self.last_run = clock.stats(stopped=over)
        return self._given_at_zero(stacked(), inputs, steps)


def compile_run(prog, inputs: dict, steps: int, collect=(), feedback: dict | None = None, stop: dict | None = None,
                every: int | None = None) -> bool:
    """Compile the fused loop that a session of `prog` runs for `run(inputs, steps, collect=,
    feedback=, stop=, every=)`, without running a step or keeping a state: its state is described by
    shapes and dtypes (`jax.ShapeDtypeStruct`s, as uncommitted as the state a program on JAX's
    default device holds), so that the run, from such a state, finds the loop compiled (JAX's
    cache of the jitted loop). `Generator.generate` does it in a second thread while the prompt's
    program compiles. Returns False, doing nothing, where the run would not take the jitted loop
    this way: a program placed on a device or a mesh (the state's placement decides the
    executable), one with a yield/await driver, or device-array inputs (the ahead-of-time path)."""
    if type(prog.placer) is not Placer or prog.placer.device is not None or prog.driver is not None:
        return False
    with prog.scope():
        stop_ids = stop_set(prog, stop)
        call = validate_run(prog, dict(inputs), steps, collect, lambda given, steps=None: device_inputs(prog, given, {}, steps),
                            feedback, stop_ids)
        if call.values is None:
            return False
        per_dev, fixed_dev, fed = call.arguments(dict(inputs))
        stop_dev, done = stop_arrays(prog, stop_ids)
        exe = prog.executable
        state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), jax.dtypes.canonicalize_dtype(np.asarray(a).dtype)),
                             exe.initial_host_state())
        kernels = exe.kernels
        args = kernels.multi_args(exe.consts, state, per_dev, fixed_dev, 0, 1, call.collect,
                                  collected_rows(call_limit(call.steps, False, every), call.collect), call.feedback,
                                  fed, stop_dev, done)
        compiled(kernels.multi_jit.lower(*args))
    return True
