"""yield/await as a host driver over separately jitted kernels (SPEC §3.6, docs/yield_await.md).

The checker's yield phases (`CheckedGraph.yield_phases`, `phases.yield_phases`) split `entry` into
phases at its top-level `yield` / `await` nodes and names each yield's consumers (§0 item 3);
the checker already refused pairing errors and deadlocks. A `Program` built with `driver=` owns
a `Driver`, which compiles every entry phase and every consumer block into its own jitted kernel
(traced by the lowering: `StepBuilder.phase_kernel`, `StepBuilder.block_kernel`) and runs them
from the host:

    phase 0 -> [yield: dispatch consumers, no blocking] -> phase 1 (the window) -> [await: merge]
            -> phase 2 ... -> last phase (also commits the state / undoes a step that must grow)

Every kernel takes and returns a `PhaseIO` (lowering/state.py: the `Env`; the awaited
consumers' guards `pending`; the last phase's `old` state entries in, `new` committed ones out),
passed as flat tuples of its leaves: (the constants it uses, the leaves it reads but does not
replace, the leaves it replaces — donated). Which leaves (by their key path in the `PhaseIO`) a
kernel reads and writes is found once (per cache capacity) by tracing it abstractly and
inspecting the jaxpr. Consumers start from entry's env at the yield (the `Env` itself: it is
immutable); at the await their written variables (`CheckedGraph.writes`, `Env.take`: as the
fused lowering) are taken into entry's env on the host and their guards are merged in the next
phase kernel (`TraceGuards.merge`), so both modes agree bit for bit. A consumer may be placed on
another device: only what it reads goes there and only what it writes comes back.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import jax
import jax.numpy as jnp
from jax.extend.core import Var
from jax.sharding import SingleDeviceSharding
from jax.tree_util import DictKey, GetAttrKey, SequenceKey, tree_flatten_with_path

from ..diagnostics import OiError
from ..phases import Phase
from ..lowering.state import ERROR_PATHS, GUARDS, CacheState, Env, PhaseIO, TraceGuards, select
from .executor import DEFAULT_BUILD, DEFAULT_SCHEDULE, KernelBuilder, Task, check_build, check_schedule, \
    kernel_error, run_tasks
from .placement import Placer, device_name, parse_device

# ============================================================================ kernels


def _aval(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


ENV = (GetAttrKey("env"),)  # where a kernel's `PhaseIO` holds the env, the awaited guards, ...
PENDING = (GetAttrKey("pending"),)
OLD = (GetAttrKey("old"),)
NEW = (GetAttrKey("new"),)
GUARD_PATHS = tuple(ENV + (GUARDS, GetAttrKey(f.name)) for f in fields(TraceGuards))  # entry's guards


def _leaves(tree) -> dict:
    """{key path: leaf} of a pytree (a `PhaseIO`)."""
    return dict(tree_flatten_with_path(tree)[0])


def _entry_env(leaves: dict) -> Env:
    """Entry's `Env` from its leaves by key path (`ENV + ...`)."""
    values, caches, shapes, guards = {}, {}, {}, {}
    for path, leaf in leaves.items():
        if path[0] != ENV[0]:
            continue
        part, rest = path[1].name, path[2:]
        if part == "values":
            values[rest[0].key] = leaf
        elif part == "shapes":
            shapes[rest[0].key] = leaf
        elif part == "guards":
            guards[rest[0].name] = leaf
        else:
            caches.setdefault(rest[0].key, {})[rest[1].name] = leaf
    return Env(values, {n: CacheState(p.get("data"), p.get("size"), p.get("present")) for n, p in caches.items()},
               TraceGuards(**guards), shapes)


def _label(path) -> str:
    """How `kernels()` names a leaf: a variable's value by its name, else its place
    (`K.size`, `guards.err`, `old.t`, `pending.0.err`)."""
    parts = [str(k.key) if isinstance(k, DictKey) else k.name if isinstance(k, GetAttrKey) else str(k.idx)
             for k in path]
    return ".".join(p for p in parts if p not in ("env", "values", "caches"))


@dataclass
class Kernel:
    """One jitted kernel: fn(consts: dict, io: PhaseIO) -> PhaseIO, with its planned flat signature
    (the leaves of the `PhaseIO`s by key path)."""

    name: str
    phase: int
    fn: object
    device: object = None  # None: the program's device
    placed: bool = False  # runs on another device than the entry
    const_keys: tuple = ()
    keep_keys: tuple = ()
    donate_keys: tuple = ()
    out_keys: tuple = ()  # the paths of the output leaves it writes (computes)
    reads: frozenset = frozenset()
    const_vals: tuple = ()
    jitted: object = None
    out_avals: dict = field(default_factory=dict)
    out_def: object = None  # the output `PhaseIO`'s tree structure, and the path of each of its leaves
    out_paths: tuple = ()
    commit: frozenset | None = None  # last entry phase: the state paths it commits (or undoes)
    back: tuple = ()  # consumer: indices of outputs merged into entry at the await (and its guards)
    writes_guards: bool = False  # consumer: it may record an error or ask for capacity
    merged: frozenset = frozenset()  # consumer: the leaves of entry's env its await takes
    span: object = None  # DSL location for errors (entry phase: its first node; consumer: its block)
    future: object = None  # executor: the compilation (result: the XLA executable)
    compiled: object = None  # the AOT executable once fetched (else `jitted` compiles lazily)
    arg_avals: tuple = ()  # (consts, keep, donated) avals, for `lower_for`

    def plan(self, const_avals: dict, io_avals: PhaseIO, owned: set, protected: set, counter) -> None:
        """Trace abstractly; find reads / writes; build the flat jitted kernel."""
        c_keys = tuple(const_avals)
        pairs, in_def = tree_flatten_with_path(io_avals)
        e_keys = tuple(path for path, _ in pairs)
        env_avals = dict(pairs)
        fn = self.fn
        self._plan_avals = (const_avals, env_avals)

        def flat(c_list, e_list):
            out = fn(dict(zip(c_keys, c_list)), in_def.unflatten(e_list))
            out_pairs, self.out_def = tree_flatten_with_path(out)
            self.out_paths = tuple(path for path, _ in out_pairs)
            return [leaf for _, leaf in out_pairs]

        closed, shape = jax.make_jaxpr(flat, return_shape=True)([const_avals[k] for k in c_keys],
                                                               [env_avals[k] for k in e_keys])
        jaxpr = closed.jaxpr
        invars = jaxpr.invars
        c_vars = dict(zip(c_keys, invars[:len(c_keys)]))
        e_vars = dict(zip(e_keys, invars[len(c_keys):]))
        outvars = dict(zip(self.out_paths, jaxpr.outvars))
        out_shapes = dict(zip(self.out_paths, shape))
        used = set()
        for eqn in jaxpr.eqns:
            used.update(v for v in eqn.invars if isinstance(v, Var))
        written = []
        for k in self.out_paths:
            var = outvars[k]
            if k in e_vars and var is e_vars[k]:
                continue  # returned unmodified
            written.append(k)
            if isinstance(var, Var):
                used.add(var)
        self.out_keys = tuple(written)
        self.out_avals = {k: out_shapes[k] for k in written}
        self.const_keys = tuple(k for k in c_keys if c_vars[k] in used)
        reads = [k for k in e_keys if e_vars[k] in used]
        self.reads = frozenset(reads)
        writes = set(written)
        if self.placed:  # fresh copies on the consumer's device: donate what it replaces
            donate = [k for k in reads if k in writes]
        else:  # buffers this step made and nobody else holds: XLA may reuse them for the outputs
            donate = [k for k in e_keys if k in writes and k in owned and k not in protected]
        self.donate_keys = tuple(donate)
        self.keep_keys = tuple(k for k in reads if k not in set(donate))
        placeholders_c = {k: const_avals[k] for k in c_keys if k not in set(self.const_keys)}
        placeholders_e = {k: env_avals[k] for k in e_keys if k not in self.reads and k not in set(donate)}
        const_keys, keep_keys, donate_keys, out_keys = self.const_keys, self.keep_keys, self.donate_keys, \
            self.out_keys

        def kernel(c_vals, keep, donated):
            counter()
            consts = {k: jnp.zeros(a.shape, a.dtype) for k, a in placeholders_c.items()}
            consts.update(zip(const_keys, c_vals))
            env = {k: jnp.zeros(a.shape, a.dtype) for k, a in placeholders_e.items()}
            env.update(zip(keep_keys, keep))
            env.update(zip(donate_keys, donated))
            consts = {k: consts[k] for k in c_keys}
            out = _leaves(fn(consts, in_def.unflatten([env[k] for k in e_keys])))
            return tuple(out[k] for k in out_keys)

        self.jitted = jax.jit(kernel, donate_argnums=(2,))

    def rebuild(self, args: dict, written: dict) -> PhaseIO:
        """The kernel's output `PhaseIO` from the leaves it wrote (`written`: path -> leaf) and
        its arguments' (`args`: path -> leaf) for those it returned unmodified."""
        return self.out_def.unflatten([written[k] if k in written else args[k] for k in self.out_paths])

    def lower_for(self, device):
        """`jitted.lower(...)` for the planned signature, committed to `device` (AOT build)."""
        const_avals, env_avals = self._plan_avals
        sharding = SingleDeviceSharding(device)

        def spec(a):
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)

        self.arg_avals = (tuple(spec(const_avals[k]) for k in self.const_keys),
                          tuple(spec(env_avals[k]) for k in self.keep_keys),
                          tuple(spec(env_avals[k]) for k in self.donate_keys))
        return self.jitted.lower(*self.arg_avals)


# ============================================================================ program


class Driver:
    """The yield/await host driver of a `Program` (`program.driver`; see the module doc): every
    entry phase and consumer block its own kernel, dispatched from the host.

    `placement={"block": device | "cpu:1"}` runs a consumer block on another device.
    `trace_enabled = True` (or `program.run(..., trace=True)`) fills `program.last_trace` with one
    dict per kernel call: {"step", "phase", "kernel", "device", "ms"} (kernels are waited for only
    when tracing). The program calls `step` for each driven step, `invalidate` after a cache
    grew, and `lowered_kernels` for dumps; it reads nothing else of the driver."""

    def __init__(self, program, placement=None, build: str = DEFAULT_BUILD, schedule: str = DEFAULT_SCHEDULE):
        graph = program.graph
        self.program = program
        self.analysis = program.bound.checked.yield_phases  # computed once, by the checker
        self.placement = {name: parse_device(dev) for name, dev in (placement or {}).items()}
        for name in self.placement:
            if graph.block(name) is None or name == "entry":
                raise OiError(f"placement: {name} is not a consumer block")
        self.build = check_build(build)
        self.schedule = check_schedule(schedule)
        self.trace_enabled = False
        self.last_order: list[str] = []  # kernels of the last step, in dispatch (start) order
        self.plan = None  # (phase kernels, {window: [(consumer kernel, merged keys, {})]}) once planned
        self.kernel_builder: KernelBuilder | None = None  # the builder of the step being planned
        self._step_no = 0

    # ------------------------------------------------------------------ kernels

    def invalidate(self):
        """Shapes changed (a cache grew): re-plan the kernels on the next step."""
        self.plan = None

    def step(self, state, dynamic: dict):
        """One step run by the host driver: `(state, outputs)`; `dynamic` complete and placed."""
        spec = self.program.state_spec
        new, outputs = self._drive(spec.to_env(state), dynamic)
        return spec.from_env(new), outputs

    def _count(self):
        self.program.count_trace("driver kernel")

    def _aot(self) -> bool:
        """Kernels are built ahead of time (sequential/concurrent build) unless a custom placer
        (shardings) decides where values live: then each kernel's jit compiles at its first call."""
        return type(self.program.placer) is Placer

    def _submit(self, kern: Kernel) -> None:
        """Lower `kern` here (tracing needs this thread's JAX config) and hand its XLA compilation
        to the kernel builder (inline for build="sequential", a worker thread for "concurrent")."""
        if self.kernel_builder is None or not self._aot():
            return
        dev = kern.device if kern.placed else self._main_device()
        try:
            lowered = kern.lower_for(dev)
        except OiError:
            raise
        except Exception as exc:
            raise kernel_error(self.program.graph, kern, exc, "compile") from None
        self.kernel_builder.submit(kern, lowered)

    def _main_device(self):
        return self.program.device if self.program.device is not None else jax.devices()[0]

    def _phase_fn(self, phase: Phase):
        return self.program.builder.phase_kernel(phase.nodes, phase.index == 0, self.analysis.fused_fallback)

    def _consumer_fn(self, name: str):
        block = self.program.builder.block_kernel(name)
        return lambda consts, io: PhaseIO(block(consts, io.env))

    def _make_plan(self, state: Env, dynamic: dict):
        """Trace every kernel abstractly in step order: its signature, reads, writes, donations."""
        analysis = self.analysis
        const_avals = {k: _aval(v) for k, v in self.program.consts.items()}
        state = jax.tree.map(_aval, state)
        env = state.update({k: _aval(v) for k, v in dynamic.items()})
        owned: set = set()
        step_writes: set = set()
        phase_kernels: list[Kernel] = []
        consumers: dict[int, list[tuple[Kernel, frozenset, frozenset]]] = {}  # (kernel, writes, merged)
        protected: set = set()  # read by consumers in flight, or kept for their merge
        main = self._main_device()
        snapshots: dict[int, Env] = {}
        last = len(analysis.phases) - 1
        for phase in analysis.phases:
            pending = []
            if phase.merges is not None:
                snap = _leaves(PhaseIO(snapshots.pop(phase.merges)))
                for kern, writes, _ in consumers[phase.merges]:
                    env, guards = self._merge(env, kern, writes, snap, kern.out_avals)
                    step_writes |= kern.merged
                    owned |= kern.merged & set(kern.out_keys)
                    pending += guards
                protected = self._protected(snapshots, consumers)
            io = PhaseIO(env, tuple(pending))
            if phase.index == last:
                probe = Kernel(f"entry:{phase.index}", phase.index, self._phase_fn(phase))
                probe.plan(const_avals, io, owned, protected, lambda: None)
                written = step_writes | set(probe.out_keys)
                # what the step wrote; with growable caches also the error guards (an undone step
                # leaves no error behind: state.commit)
                commit = frozenset(path for path, _ in tree_flatten_with_path(state)[0]
                                   if (path[0] != GUARDS and ENV + path in written)
                                   or (path in ERROR_PATHS and self.program.lowering.growable))
                io = PhaseIO(env, tuple(pending), select(state, commit))
                owned_now = owned | {path for path in _leaves(io) if path[0] == OLD[0]}
            else:
                commit, owned_now = None, owned
            kern = Kernel(f"entry:{phase.index}", phase.index, self._phase_fn(phase))
            kern.commit = commit
            kern.plan(const_avals, io, owned_now, protected, self._count)
            kern.const_vals = tuple(self.program.consts[k] for k in kern.const_keys)
            kern.span = phase.nodes[0].span if phase.nodes else self.program.graph.entry.span
            if kern.out_keys:
                self._submit(kern)
            phase_kernels.append(kern)
            env = kern.rebuild(_leaves(io), kern.out_avals).env
            owned |= set(kern.out_keys)
            step_writes |= set(kern.out_keys)
            if phase.launches is not None:
                w = phase.launches
                snapshots[w] = env
                consumers[w] = []
                snap = PhaseIO(env)
                for name in analysis.windows[w].consumers:
                    dev = self.placement.get(name)
                    placed = dev is not None and dev != main
                    ck = Kernel(name, phase.index, self._consumer_fn(name), device=dev if placed else None,
                                placed=placed)
                    ck.plan(const_avals, snap, set(), set(_leaves(snap)), self._count)
                    vals = tuple(self.program.consts[k] for k in ck.const_keys)
                    ck.const_vals = tuple(jax.device_put(v, dev) for v in vals) if placed else vals
                    writes = frozenset(self.program.bound.checked.writes[name])
                    ck.merged = frozenset(_leaves(PhaseIO(env.only(writes))))  # what the await takes
                    ck.writes_guards = any(k[:2] == ENV + (GUARDS,) for k in ck.out_keys)
                    ck.back = tuple(i for i, k in enumerate(ck.out_keys) if k in ck.merged or k[:2] == ENV + (GUARDS,))
                    ck.span = self.program.graph.block(name).span
                    self._submit(ck)
                    consumers[w].append((ck, writes, ck.merged))
                protected = self._protected(snapshots, consumers)
        self.plan = (phase_kernels, consumers)
        return self.plan

    @staticmethod
    def _protected(snapshots: dict, consumers: dict) -> set:
        """What an entry phase must not donate: the leaves the consumers in flight read or whose
        values their awaits take back."""
        protected = set()
        for w in snapshots:
            for ck, _, _ in consumers[w]:
                protected |= set(ck.reads) | ck.merged
        return protected

    @staticmethod
    def _merge(env: Env, ck: Kernel, writes: frozenset, snap: dict, written: dict) -> tuple[Env, list]:
        """An await taking consumer `ck`'s result (`written`: the leaves it wrote that came back;
        `snap`: the leaves of its snapshot) into entry's `env` (`Env.take`); and its guards, for
        the next phase to merge, if it may have recorded any."""
        result = ck.rebuild(snap, written).env
        return env.take(result, writes), [result.guards] if ck.writes_guards else []

    # ------------------------------------------------------------------ the driver

    def _executable(self, kern: Kernel):
        """What to call for `kern`: its AOT executable (waiting for its compilation) or its jit."""
        if kern.compiled is None and kern.future is not None:
            kern.compiled = self.kernel_builder.result(kern) if self.kernel_builder is not None else kern.future.result()
        return kern.compiled

    def invoke(self, kern: Kernel, args):
        exe = self._executable(kern)
        try:
            if exe is not None:
                try:
                    return exe(*args)
                except TypeError:  # refused: avals or shardings differ from the AOT signature (raised
                    # before anything ran); the jit runs it, or raises a genuine error itself
                    self.program.compile_log.append(f"kernel {kern.name}: AOT executable rejected its arguments; "
                                            f"jit recompiles it")
                    kern.compiled = None
                    kern.future = None
            return kern.jitted(*args)
        except OiError:
            raise
        except Exception as exc:
            raise kernel_error(self.program.graph, kern, exc, "run") from None

    def _call(self, kern: Kernel, env: dict, step: int):
        if kern.placed:
            keep = jax.device_put(tuple(env[k] for k in kern.keep_keys), kern.device)
            donated = jax.device_put(tuple(env[k] for k in kern.donate_keys), kern.device)
        else:
            keep = tuple(env[k] for k in kern.keep_keys)
            donated = []
            for k in kern.donate_keys:
                v = env[k]
                if sum(1 for x in env.values() if x is v) > 1:
                    v = jnp.copy(v)  # aliased by another name: donate a copy
                donated.append(v)
            donated = tuple(donated)
        self.last_order.append(kern.name)
        if not self.trace_enabled:
            return self.invoke(kern, (kern.const_vals, keep, donated))
        self._executable(kern)  # compile wait is not kernel time
        t0 = time.perf_counter()
        dev = kern.device if kern.placed else self._main_device()
        event = {"step": step, "phase": kern.phase, "kernel": kern.name, "device": device_name(dev), "ms": 0.0}
        self.program.last_trace.append(event)  # appended at the start: the list is the actual start order
        outs = self.invoke(kern, (kern.const_vals, keep, donated))
        jax.block_until_ready(outs)
        event["ms"] = (time.perf_counter() - t0) * 1e3
        return outs

    def _drive(self, state: Env, dynamic: dict):
        with self.program.scope():
            fresh = self.plan is None
            try:
                if fresh:
                    self.kernel_builder = KernelBuilder(self.program.graph, self.build)
                    self._make_plan(state, dynamic)
                return self._drive_planned(state, dynamic)
            except BaseException:
                if fresh:
                    self.plan = None  # a failed build is retried by the next run
                if self.kernel_builder is not None:
                    self.kernel_builder.close(cancel=True)
                raise
            finally:
                if self.kernel_builder is not None:  # every kernel ran: no compile is left pending
                    self.kernel_builder.close()
                    self.kernel_builder = None

    def _drive_planned(self, state: Env, dynamic: dict):
        """One step: the kernels as tasks of a ready queue (executor.run_tasks). The host holds
        the kernels' `PhaseIO` leaves by key path (`leaves`: entry's env; `snaps`: a window's
        snapshot); a kernel takes the leaves of its planned paths and returns those it writes."""
        phase_kernels, consumers = self.plan
        step = self._step_no
        self._step_no += 1
        self.last_order = []
        main = self._main_device()
        state_pairs, state_def = tree_flatten_with_path(state)
        leaves = _leaves(PhaseIO(state.update(dynamic)))
        snaps: dict[int, dict] = {}
        inflight: dict[int, dict] = {w: {} for w in consumers}

        def run_phase(phase: Phase, kern: Kernel):
            if phase.merges is not None:
                j = 0
                for i in sorted(inflight[phase.merges]):
                    ck, snap, outs = inflight[phase.merges].pop(i)
                    back = tuple(outs[i] for i in ck.back)
                    if ck.placed:
                        back = jax.device_put(back, main)
                    result = dict(zip((ck.out_keys[i] for i in ck.back), back))
                    for k in ck.merged:  # what the await takes (`Env.take`)
                        leaves[k] = result.get(k, snap[k])
                    if ck.writes_guards:  # its guards, merged by this phase (`TraceGuards.merge`)
                        for k in GUARD_PATHS:
                            leaves[PENDING + (SequenceKey(j),) + k[2:]] = result.get(k, snap[k])
                        j += 1
                snaps.pop(phase.merges, None)
            for path in kern.commit or ():  # the committed entries at their values at step start
                leaves[OLD + path] = state_leaves[path]
            outs = self._call(kern, leaves, step) if kern.out_keys else ()
            for k in [k for k in leaves if k[0] != ENV[0]]:  # pending guards, old entries: this phase's
                del leaves[k]
            leaves.update(zip(kern.out_keys, outs))
            if phase.launches is not None:
                snaps[phase.launches] = dict(leaves)  # every consumer of the window starts from this
            return outs or None

        def run_consumer(w: int, i: int, ck: Kernel):
            snap = snaps[w]
            outs = self._call(ck, snap, step)
            inflight[w][i] = (ck, snap, outs)
            return outs

        state_leaves = dict(state_pairs)
        # the linear (topological) order: phase, its yield's consumers (name order), next phase, ...
        # A consumer depends on the phase whose yield completes the variables it awaits (every
        # consumer of window w awaits a variable yielded there, and the checker rejects
        # awaiting one yielded later); a phase depends on the previous phase and, at an await, on
        # every consumer of that window.
        tasks: list[Task] = []
        window_tasks: dict[int, list[int]] = {}
        prev = None
        for phase, kern in zip(self.analysis.phases, phase_kernels):
            deps = () if prev is None else (prev,)
            if phase.merges is not None:
                deps += tuple(window_tasks[phase.merges])
            idx = prev = len(tasks)
            tasks.append(Task(idx, kern, deps, lambda phase=phase, kern=kern: run_phase(phase, kern)))
            if phase.launches is not None:
                w = phase.launches
                window_tasks[w] = []
                for i, (ck, _, _) in enumerate(consumers[w]):
                    window_tasks[w].append(len(tasks))
                    tasks.append(Task(len(tasks), ck, (idx,), lambda w=w, i=i, ck=ck: run_consumer(w, i, ck)))
        run_tasks(tasks, self.schedule, self.kernel_builder, block=jax.block_until_ready)
        commit = phase_kernels[-1].commit or ()
        new_state = state_def.unflatten([leaves.pop(NEW + path) if path in commit else leaves[ENV + path]
                                         for path, _ in state_pairs])
        env = _entry_env(leaves)
        names = tuple(self.analysis.outputs or ()) + tuple(self.program.builder.dynamic + self.program.builder.volatile)
        # everything a session may read (runtime-shaped values with their logical shapes: `Shaped`)
        outputs = self.program.builder.outputs(env, dict.fromkeys(names))
        return new_state, outputs

    # ------------------------------------------------------------------ public API

    def run(self, session, inputs: dict, steps: int | None, trace: bool | None, progress, collect,
            feedback: dict | None = None) -> dict:
        """`Program.run` of a driven program: each step run by this driver (per-phase and
        per-consumer kernels); `trace=True` records `last_trace` (per kernel call, waited for)."""
        previous = self.trace_enabled
        if trace is not None:
            self.trace_enabled = bool(trace)
        self.program.last_trace = []
        self._step_no = 0
        try:
            return session.run_stepwise(inputs, steps=steps, collect=collect, progress=progress, driver=True,
                                        feedback=feedback)
        finally:
            self.trace_enabled = previous

    def lowered_kernels(self, state, dynamic):
        """(file stem, Lowered) of every per-phase and per-consumer kernel the driver runs:
        `kernel.<block>.phase<k>` (planned here without running a step)."""
        if self.plan is None:
            self._make_plan(self.program.state_spec.to_env(state), dynamic)
        phase_kernels, consumers = self.plan
        main = self._main_device()
        for kern in phase_kernels + [ck for w in sorted(consumers) for ck, _, _ in consumers[w]]:
            block, _, _ = kern.name.partition(":")
            yield f"kernel.{block}.phase{kern.phase}", kern.lower_for(kern.device if kern.placed else main)

    def kernels(self) -> list[dict]:
        """The planned kernels (after the first step): name, phase, device, reads, writes, donated."""
        if self.plan is None:
            return []
        phase_kernels, consumers = self.plan
        out = []
        for kern in phase_kernels + [ck for w in sorted(consumers) for ck, _, _ in consumers[w]]:
            out.append({"kernel": kern.name, "phase": kern.phase,
                        "device": device_name(kern.device if kern.placed else self._main_device()),
                        "reads": sorted(map(_label, kern.reads)), "writes": [_label(k) for k in kern.out_keys],
                        "donated": [_label(k) for k in kern.donate_keys]})
        return out
