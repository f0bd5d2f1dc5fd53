"""Continuous batching (docs/decode.md, "Batches"): B sequences decode in ONE compiled step, the
program's pure step (`Executable.pure_step`) under `jax.vmap` over B stacked states. Each slot has
its own position, cache rows, sampling settings, stop ids and token budget. A slot takes a new
prompt (`insert`: the same graph compiled at a prompt bucket S, run on that slot's state alone,
then written back into the stack) while the others go on, without a recompile. `run` fuses up to
`chunk` steps into one `lax.while_loop` with per-slot done flags; tokens reach the host once per
chunk.

A free or finished slot still runs through the step (one compiled shape for every mix of slots),
but what it produced is dropped: its variables, cache sizes and guard flags keep their values (a
select over those small buffers), and the one cache row at its position that the step wrote is no
valid entry (rows at and past `pos` are read by no step)."""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from .._signals import deferred, held, raise_pending
from ..diagnostics import OiError, check_whole, suggest
from ..limits import limit_note, memory_limit
from ..lowering.state import CacheState, Guards, StepState
from .buckets import bucket_program, program_buckets, prompt_steps
from .kernels import StepOutcome
from .settings import OFF, SETTINGS, as_input, check_settings
from .tokens import capacity, prompt_ids, stop_ids, vocabulary
MAX_STOPS = 16  # stop ids per slot (insert's and run's together; a GGUF's end-of-generation set is often 3-6)
CHUNK = 32  # steps per compiled call of `run`: tokens reach the host once per chunk
_NO_TOKEN = -1  # an unused stop-id entry; a step that produced no token for a slot
RUNNING, STOPPED, LENGTH, FAILED = 0, 1, 2, 3
FINISH = {RUNNING: None, STOPPED: "stop", LENGTH: "length", FAILED: "error"}
NO_BUDGET = np.iinfo(np.int32).max
# per program: its prompt programs by S, and the jitted batch functions by (B, chunk): a new batch
# of a program compiles nothing a batch before it compiled
_COMPILED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass
class SlotResult:
    """One slot's sequence: the prompt, the tokens generated (a stop id is not one of them), why
    it ended (`"stop"`, `"length"`, `"error"`, `"evicted"` while generating, `"interrupted"` in
    `generate_batch`'s partial after Ctrl-C; None while running)
    and the error."""

    prompt: np.ndarray
    tokens: list = field(default_factory=list)
    finish: str | None = None
    error: OiError | None = None


class Batch:
    """`Program.batch(B)`: B slots decoding together. `insert(slot, prompt_ids, max_tokens=,
    stop=, **settings)`, `step()`, `run(steps, stop=)`, `evict(slot)`, `result(slot)`,
    `read(slot, name)`. The program is the step graph at S=1 (examples/llama_prefill.oi: inputs
    `tokens: i32[1]` and `n`, output `next`, @fixed caches)."""

    def __init__(self, program, size: int, *, buckets=None, programs: dict | None = None, chunk: int = CHUNK,
                 mesh=None, axis: str | None = None):
        """`buckets`: the prompt step sizes S (default the program's: runtime/buckets.py);
        `programs`: the step programs by S to use and fill (a `Generator.programs`; default kept per
        program, shared by its batches). `mesh`: shard the slots over a device mesh (`axis`, default its first axis); a sharded
        program (`oi2jax.compile(..., mesh=, shard=)`) brings its own mesh and tensor-parallel
        placement, and the slot axis goes on `axis`, a mesh axis its shard spec leaves free."""
        exe = program.executable
        self.program, self._exe = program, exe
        _check_step_graph(program, exe)
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 1:
            raise OiError(f"batch size must be a positive integer, got {size!r}")
        positions = capacity(program)
        buckets = program_buckets(program) if buckets is None else buckets
        if isinstance(buckets, (str, bytes)) or not hasattr(buckets, "__iter__") or not list(buckets):
            raise OiError(f"prompt buckets: expected a list of sizes, got {buckets!r}")
        # a bucket is a prompt step's rows: a whole number, no more than the cache's positions (a
        # float was truncated, a bucket past T failed in every prompt step that took it)
        buckets = [check_whole("a prompt bucket", s, 1, positions) for s in buckets]
        chunk = check_whole("chunk", chunk, 1, np.iinfo(np.int32).max)  # the compiled loop counts in int32
        self.size, self.buckets, self.chunk = int(size), tuple(sorted(set(buckets))), chunk
        # the per-slot sampling inputs (one `Program.specialized` fixed is none: it is the program's)
        self.settings = tuple(name for name in SETTINGS if name in exe.defaults and name not in program.bound.fixed)
        self.vocab = vocabulary(program)  # prompt and stop ids are checked against it (runtime/tokens.py)
        self.capacity = positions  # and a prompt's length against the cache's positions
        self._shared = {k: v for k, v in exe.defaults.items() if k not in ("tokens", "n") + self.settings}
        self.mesh, self._axis = _batch_mesh(program, mesh, axis, self.size)
        self._compiled = _COMPILED.setdefault(program, {})
        self._programs = self._compiled if programs is None else programs
        self._fresh = exe.host_state(program.init_state())  # a slot's state at program start
        _check_batch_bytes(program, self.size, self.chunk, self._fresh, len(self.settings))
        self._results: list[SlotResult | None] = [None] * self.size
        self._prompt_steps = [0] * self.size  # each slot's prompt steps (a decode error names its step)
        defaults = {name: np.asarray(exe.to_host(exe.defaults[name])) for name in self.settings}
        self._defaults = defaults  # a slot's settings where its insert gives none
        self._slots = {
            "token": np.zeros(self.size, np.int32), "active": np.zeros(self.size, bool),
            "count": np.zeros(self.size, np.int32), "budget": np.full(self.size, NO_BUDGET, np.int32),
            "stops": np.full((self.size, MAX_STOPS), _NO_TOKEN, np.int32),
            "why": np.zeros(self.size, np.int32),
            **{name: np.repeat(value[None], self.size, 0) for name, value in defaults.items()}}
        self._consts = exe.consts
        stacked = jax.tree.map(lambda a: np.repeat(np.asarray(a)[None], self.size, 0), self._fresh)
        with program.scope():  # 64-bit buffers stay 64-bit
            if self.mesh is not None and program.mesh is None:  # a one-device program: constants replicated
                self._consts = jax.device_put(exe.consts, NamedSharding(self.mesh, P()))
            self._state = self._place(stacked, batched=True)
        key = (exe, self.size, self.chunk, self.mesh, self._axis)
        if key not in self._compiled:
            self._compiled[key] = self._build()
        self._chunk, self._put = self._compiled[key]

    # ------------------------------------------------------------------ compiled functions

    def _build(self) -> tuple:
        """The jitted (chunk, put) of this batch's shape."""
        one = self._exe.pure_step("batch step")
        settings, size, steps = self.settings, self.size, self.chunk  # no `self` in the cached closures

        def vstep(consts, shared, state, slots):
            per_slot = {"tokens": slots["token"][:, None], "n": jnp.ones_like(slots["token"]),
                        **{name: slots[name] for name in settings}}
            return jax.vmap(lambda s, d: one(consts, s, {**shared, **d}))(state, per_slot)

        def chunk(consts, shared, state, slots, limit):
            """Up to `limit` steps (while a slot runs): (state, slots, tokens [chunk, B], steps
            run, the last step's outputs). `step()` is this at limit 1: one compiled program."""
            buf = jnp.full((steps, size), _NO_TOKEN, jnp.int32)
            shapes = jax.eval_shape(vstep, consts, shared, state, slots)[1]
            outputs = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)

            def more(carry):
                i, _, slots, _, _ = carry
                return (i < limit) & slots["active"].any()

            def body(carry):
                i, state, slots, buf, _ = carry
                new, outputs = vstep(consts, shared, state, slots)
                state, slots, token = _advance(new, state, outputs, slots)
                return i + 1, state, slots, buf.at[i].set(token), outputs

            return jax.lax.while_loop(more, body, (jnp.int32(0), state, slots, buf, outputs))

        def put(state, one_state, slot):
            return jax.tree.map(lambda a, x: a.at[slot].set(x), state, one_state)

        opts = self.program.placer.jit_options()
        return jax.jit(chunk, donate_argnums=(2,), **opts), jax.jit(put, donate_argnums=(0,), **opts)

    def _place(self, state, batched: bool):
        """A host state on the batch's devices: stacked (`batched`, the slot axis over the mesh's
        batch axis) or one slot's (replicated over the mesh, as the program places it otherwise)."""
        placer = self.program.placer
        if self.mesh is None:
            return placer.put_state(state) if not batched else jax.device_put(state, self.program.device)
        if self.program.mesh is None:
            lead = (self._axis,) if batched else ()
            return jax.device_put(state, jax.tree.map(lambda a: NamedSharding(self.mesh, P(*lead)), state))
        unbatched = placer.state_shardings(jax.tree.map(lambda a: a[0], state) if batched else state)
        if not batched:
            return jax.device_put(state, unbatched)
        return jax.device_put(state, jax.tree.map(
            lambda s: NamedSharding(self.mesh, P(self._axis, *s.spec)), unbatched))

    def _run_compiled(self, fn, *args):
        if self._exe is not self.program.executable:
            raise OiError("the program's caches were regrown since this batch was made: make a new batch")
        with self.program.scope():
            return fn(self._consts, self._shared, *args)

    # ------------------------------------------------------------------ slots

    def _slot(self, slot) -> int:
        if not isinstance(slot, (int, np.integer)) or isinstance(slot, bool):
            raise OiError(f"slot must be an integer in 0..{self.size - 1}, got {type(slot).__name__} {slot!r}")
        if not 0 <= slot < self.size:
            raise OiError(f"slot {slot!r} is not in 0..{self.size - 1}")
        return int(slot)

    def prompt_program(self, size: int):
        """The step graph compiled at S = `size` (once per bucket; the same state layout; S = 1 is
        the batch's program)."""
        return bucket_program(self._programs, self.program, size)

    def insert(self, slot: int, prompt, *, max_tokens: int | None = None, stop=(), **settings) -> SlotResult:
        """Start `prompt` (token ids) in a free or finished `slot`: the prompt runs in prompt steps
        of its bucket on that slot's state alone (the other slots are not touched), and the token
        drawn after it is the slot's first generated token. `max_tokens`: the slot's budget (None:
        until a stop id or the cache's capacity); `stop`: ids that end it (not returned);
        `settings`: the graph's sampling inputs (temperature, top_k, top_p, min_p, seed) for this
        slot, checked and rounded as a single generation's (runtime/settings.py; those not given
        are the graph's defaults). Everything is checked before the prompt runs; an error of a
        prompt step raises (the slot stays free). `max_tokens=0`: nothing runs, the slot's result
        is empty (finish "length")."""
        slot = self._slot(slot)
        if self._slots["active"][slot]:
            raise OiError(f"slot {slot} is still generating: evict it before inserting a new prompt")
        ids = prompt_ids(prompt, self.vocab, positions=self.capacity)
        stops = _stop_ids(stop, self.vocab)
        if max_tokens is not None:
            check_whole("max_tokens", max_tokens, 0)
        for name in settings:
            if name in self.program.bound.fixed:
                raise OiError(f"{name} is fixed at {self.program.bound.fixed[name]!r} in this batch's program "
                              f"(Program.specialized): a slot cannot set it")
            if name not in self.settings:
                known = ", ".join(self.settings) or "none"
                raise OiError(f"the step graph has no sampling input {name}{suggest(name, self.settings)} "
                              f"(its sampling inputs: {known})")
        fixed = {k: v for k, v in self.program.bound.fixed.items() if k in SETTINGS}
        check_settings(max_tokens=None, **{**OFF, **{k: v.item() for k, v in self._defaults.items()}, **fixed,
                                           **settings}, vocab=self.vocab)
        values = {name: self.program.convert(name, as_input(name, value)) for name, value in settings.items()}
        result = SlotResult(ids)
        if max_tokens == 0:  # a budget of no token: no prompt step to run
            result.finish = FINISH[LENGTH]
            self._results[slot] = result
            self._slots["why"][slot] = LENGTH
            return result
        self._results[slot] = None  # free while the prompt runs: a prompt step's error leaves no old result
        state, first, self._prompt_steps[slot] = self._prefill(ids, values)
        slots = self._slots
        slots["stops"][slot] = _NO_TOKEN
        slots["stops"][slot, :len(stops)] = stops
        slots["budget"][slot] = NO_BUDGET if max_tokens is None else min(int(max_tokens), NO_BUDGET)
        for name in self.settings:
            slots[name][slot] = values.get(name, self._defaults[name])
        if first in stops:
            result.finish, why = "stop", STOPPED
        else:
            result.tokens.append(first)
            why = LENGTH if slots["budget"][slot] <= 1 else RUNNING
            result.finish = FINISH[why]
        slots["token"][slot], slots["count"][slot] = first, len(result.tokens)
        slots["why"][slot], slots["active"][slot] = why, why == RUNNING
        with self.program.scope():
            self._state = self._put(self._state, self._place(state, batched=False), np.int32(slot))
        self._results[slot] = result
        return result

    def _prefill(self, ids: np.ndarray, values: dict):
        """Run the prompt on a fresh one-slot state: (state as host arrays, first token, the number
        of prompt steps); a prompt step's error raises, naming the step."""
        state = self._fresh
        first, done, steps = None, 0, 0
        for size, n in prompt_steps(len(ids), self.buckets):
            prog = self.prompt_program(size)
            part = ids[done:done + n]
            tokens = np.zeros(size, np.int32)
            tokens[:n] = part
            with prog.scope():
                placed = prog.executable.place(state)
            new, out = prog.step(placed, tokens=tokens, n=np.int32(n), **values)
            steps += 1
            try:
                prog.check(new)
            except OiError as exc:
                raise exc.in_step(steps) from None
            state = prog.executable.host_state(new)
            nxt = np.asarray(out["next"]).reshape(-1)
            first = int(nxt[n - 1] if nxt.shape[0] > 1 else nxt[0])
            done += n
        return state, first, steps

    def evict(self, slot: int) -> SlotResult | None:
        """Stop `slot` and free it; its result (None for a slot never used), `finish` "evicted"
        where it was still generating."""
        slot = self._slot(slot)
        self._slots["active"][slot] = False
        result = self._results[slot]
        self._results[slot] = None
        if result is not None and result.finish is None:
            result.finish = "evicted"
        return result

    @property
    def active(self) -> list[int]:
        """The slots still generating."""
        return [int(i) for i in np.flatnonzero(self._slots["active"])]

    def result(self, slot: int) -> SlotResult | None:
        """The slot's sequence so far (None: free)."""
        return self._results[self._slot(slot)]

    # ------------------------------------------------------------------ decoding

    def step(self) -> dict:
        """One decode step of every slot (one compiled call); the step's outputs, each with the
        slot axis first (device arrays; a free or finished slot's row means nothing). Ctrl-C
        (`_signals.deferred`) is raised after the step, its tokens taken. With no slot generating
        it is an OiError: no row would mean anything (`run` returns at once there)."""
        if not self._slots["active"].any():
            raise OiError("Batch.step: no slot is generating (every slot is free or finished): insert a prompt first")
        with deferred(), held():  # the state and the host's copy of the slots change together
            _, self._state, slots, buf, outputs = self._run_compiled(self._chunk, self._state, self._slots, np.int32(1))
            self._take(slots, np.asarray(buf)[:1])
        return outputs

    def run(self, steps: int, stop=()) -> dict[int, list[int]]:
        """Up to `steps` decode steps of every running slot, fused `chunk` at a time into one
        compiled loop that ends early when every slot is done; `stop`: ids that end any slot (with
        its own). The tokens each slot generated in this call (a finished slot: none). Ctrl-C
        (`_signals.deferred`) is raised after the compiled call in flight, its tokens taken, with
        this result so far as the KeyboardInterrupt's `partial`."""
        steps = check_whole("steps", steps, 0)
        extra = _stop_ids(stop, self.vocab)
        saved = self._slots["stops"].copy()
        if extra:
            # every slot's merged ids built and checked before any is set: a slot with too many
            # left the slots before it holding this run's ids after the error, for every later run
            merged_stops = saved.copy()
            for slot in range(self.size):
                own = [int(t) for t in saved[slot] if t != _NO_TOKEN]
                merged = own + [t for t in extra if t not in own]
                if len(merged) > MAX_STOPS:
                    raise OiError(f"slot {slot}: {len(merged)} stop ids, at most {MAX_STOPS}")
                merged_stops[slot, :len(merged)] = merged
            self._slots["stops"] = merged_stops
        before = [len(r.tokens) if r is not None else 0 for r in self._results]

        def result():
            return {slot: (r.tokens[before[slot]:] if r is not None else []) for slot, r in enumerate(self._results)}
        try:
            with deferred():
                left = int(steps)
                while left > 0 and self._slots["active"].any():
                    limit = min(left, self.chunk)
                    with held():  # the state and the host's copy of the slots change together
                        done, self._state, slots, buf, _ = self._run_compiled(self._chunk, self._state, self._slots,
                                                                              np.int32(limit))
                        self._take(slots, np.asarray(buf)[:int(done)])
                    left -= int(done)
                    raise_pending()
        except KeyboardInterrupt as interrupt:
            interrupt.partial = result()
            raise
        finally:
            self._slots["stops"] = saved
        return result()

    def _take(self, slots: dict, tokens: np.ndarray) -> None:
        """The host's copy of the slots after a compiled call, and the tokens it produced
        (`[steps, B]`, `_NO_TOKEN` where a slot produced none)."""
        slots = {k: np.array(v) for k, v in slots.items()}
        stops = self._slots["stops"]
        self._slots = {**slots, "stops": stops}
        failed = []
        for slot, result in enumerate(self._results):
            if result is None:
                continue
            result.tokens.extend(int(t) for t in tokens[:, slot] if t != _NO_TOKEN)
            why = int(slots["why"][slot])
            if result.finish is None and why != RUNNING:
                result.finish = FINISH[why]
                if why == FAILED:
                    failed.append(slot)
        if failed:
            flags = self._exe.to_host(self._state.guards.flags)
            for slot in failed:  # the failing step: the slot's prompt steps, then one per token since
                result = self._results[slot]
                result.error = self._exe.status_error(StepOutcome.of_flags(flags[slot]),
                                                      step=self._prompt_steps[slot] + len(result.tokens))

    def memory(self) -> dict:
        """Bytes the device holds for the batch (`Program.memory`'s keys): the program's weights
        and B slots' states (each as `Program.memory` counts one: its persistent variables and caches)."""
        return {**self.program.memory(), "state": self.size * self._exe.memory()["state"]}

    def read(self, slot: int, name: str) -> np.ndarray:
        """A persistent variable of one slot (widened like `--out`)."""
        slot = self._slot(slot)
        one = jax.tree.map(lambda a: a[slot], self._state)
        values = self._exe.export_state(one)
        if name not in values:
            raise OiError(f"{name} is not a persistent variable of the graph{suggest(name, list(values))} "
                          f"(persistent: {', '.join(values)})")
        return values[name]


def _advance(new: StepState, old: StepState, outputs: dict, slots: dict):
    """The slots after one vmapped step: (state, slots, the token each slot produced or
    `_NO_TOKEN`). A slot not running keeps its old variables, cache sizes and guard flags; a
    running slot whose step recorded an error ends FAILED with the state before that step and the
    step's flags, one that drew a stop id STOPPED (the
    id is not produced), one that reaches its budget LENGTH."""
    active = slots["active"]
    failed = active & (new.guards.flags[:, 0] != 0)
    applied = active & ~failed  # a failed step's variables are dropped too: the state before it stays

    def keep(a, b, mask=applied):
        return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b)

    caches = {name: CacheState(c.data, None if c.size is None else keep(c.size, old.caches[name].size),
                               None if c.present is None else keep(c.present, old.caches[name].present))
              for name, c in new.caches.items()}
    state = StepState(jax.tree.map(keep, new.vars, old.vars), caches,
                      Guards(keep(new.guards.flags, old.guards.flags, active)))
    nxt = outputs["next"].reshape(active.shape[0], -1)[:, -1].astype(jnp.int32)
    stopped = active & ~failed & (nxt[:, None] == slots["stops"]).any(axis=1)
    emitted = active & ~failed & ~stopped
    count = slots["count"] + emitted.astype(jnp.int32)
    length = emitted & (count >= slots["budget"])
    why = jnp.where(failed, FAILED, jnp.where(stopped, STOPPED, jnp.where(length, LENGTH, slots["why"])))
    slots = {**slots, "token": jnp.where(emitted, nxt, slots["token"]), "count": count, "why": why,
             "active": active & (why == RUNNING)}
    return state, slots, jnp.where(emitted, nxt, _NO_TOKEN)


def _check_step_graph(program, exe) -> None:
    """OiError unless the program is a step graph a batch can run: `tokens: [1]` and `n` inputs,
    a `next` output, every cache @fixed."""
    bound = exe.lowering.bound
    dynamic, volatile = exe.builder.dynamic, exe.builder.volatile
    if "tokens" not in dynamic or tuple(bound.shape("tokens")) != (1,) or "n" not in dynamic or \
            "next" not in volatile:
        raise OiError(f"a batch runs a step graph at S=1 (examples/llama_prefill.oi with sizes={{'S': 1}}): "
                      f"inputs tokens: i32[1] and n, output next; {program.graph.path or 'this graph'} is not one "
                      f"(docs/decode.md, \"Batches\", says what a batched graph offers)")
    if exe.growable:
        caches = ", ".join(name for name, _ in exe.lowering.growable)
        raise OiError(f"a batch needs every cache @fixed (slots share one compiled shape): {caches} grows")


def _batch_mesh(program, mesh, axis, size: int):
    """(mesh, the slot axis's mesh axis) of a batch, or (None, None) on one device."""
    if program.mesh is not None and mesh is not None and mesh != program.mesh:
        # the program's tensors are placed on its own mesh: another was silently ignored
        raise OiError(f"this program is compiled sharded on its own mesh ({_axes(program.mesh)}): the slots go on "
                      f"a free axis of it (axis=); leave out mesh= (given {_axes(mesh)})")
    mesh = program.mesh if program.mesh is not None else mesh
    if mesh is None:
        if axis is not None:
            raise OiError(f"axis={axis!r} needs a mesh")
        return None, None
    axis = mesh.axis_names[0] if axis is None else axis
    if axis not in mesh.axis_names:
        raise OiError(f"mesh has no axis {axis!r} (its axes: {', '.join(mesh.axis_names)})")
    used = set(getattr(program.placer, "shard", {}).values())
    if axis in used:
        raise OiError(f"mesh axis {axis} already shards the program's tensors: put the slots on a free axis")
    if size % mesh.shape[axis]:
        raise OiError(f"batch size {size} is not divisible by mesh axis {axis} of size {mesh.shape[axis]}")
    return mesh, axis


def _axes(mesh) -> str:
    return ", ".join(f"{name}={size}" for name, size in mesh.shape.items())


def _check_batch_bytes(program, size: int, chunk: int, fresh, settings: int) -> None:
    """Refuse, before anything is allocated, a batch whose B stacked slot states cannot fit (B
    times one slot's state, its per-slot rows and its `chunk` tokens of a call: `program.batch(10**9)`
    was NumPy's MemoryError on the host, and 10**6 slots of a small model ran out the machine's
    memory)."""
    per_slot = sum(np.asarray(a).nbytes for a in jax.tree.leaves(fresh)) + 4 * (5 + MAX_STOPS + settings + chunk)
    device = program.first_device()
    limit = memory_limit(device)
    if size * per_slot > limit:
        raise OiError(f"a batch of {size} slots needs {size * per_slot} bytes for their states and a call's tokens "
                      f"({per_slot} a slot, chunk {chunk}): too large to allocate (the limit is {limit} bytes"
                      f"{limit_note(limit, device)}); use fewer slots or a smaller chunk")


def _stop_ids(stop, vocab: int | None) -> list[int]:
    ids = stop_ids(stop, vocab)
    if len(ids) > MAX_STOPS:
        raise OiError(f"{len(ids)} stop ids, at most {MAX_STOPS}")
    return ids
