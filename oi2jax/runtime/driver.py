"""yield/await as a host driver over separately jitted kernels (SPEC §3.6, docs/yield_await.md).

The checker's yield phases (`CheckedGraph.yield_phases`, `phases.yield_phases`) split `entry` into
phases at its top-level `yield` / `await` nodes and names each yield's consumers (§0 item 3);
the checker already refused pairing errors and deadlocks. A `Program` whose graph yields (under
`yield_mode="driver"`) owns a `Driver`, which compiles every entry phase and every consumer block
of the `Executable` it is handed into its own jitted kernel (traced by the lowering:
`StepBuilder.phase_kernel`, `StepBuilder.block_kernel`) and runs them from the host:

    phase 0 -> [yield: dispatch consumers, no blocking] -> phase 1 (the window) -> [await: merge]
            -> phase 2 ... -> last phase (also commits the state / undoes a step that must grow)

Every kernel takes and returns a `PhaseIO` (lowering/state.py: the `Env`; the awaited
consumers' guards `pending`; the last phase's `old` state entries in, `new` committed ones out),
passed as flat tuples of its leaves: (the constants it uses, the leaves it reads but does not
replace, the leaves it replaces — donated). Which leaves (by their key path in the `PhaseIO`) a
kernel reads and writes is found once per executable (`trace_signature`: a `Signature`) by
tracing it abstractly and inspecting the jaxpr. Consumers start from entry's env at the yield (the `Env` itself: it is
immutable); at the await their written variables (`CheckedGraph.writes`, `Env.take`: as the
fused lowering) are taken into entry's env on the host and their guards are merged in the next
phase kernel (`TraceGuards.merge`), so both modes agree bit for bit. A consumer may be placed on
another device: only what it reads goes there and only what it writes comes back.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from jax.extend.core import Var
from jax.sharding import SingleDeviceSharding
from jax.tree_util import DictKey, GetAttrKey, tree_flatten_with_path

from ..diagnostics import OiError
from ..phases import Phase
from ..lowering.state import ERROR_PATHS, GUARD_LEAVES, GUARDS, Env, PhaseIO, leaf_at, select
from .executor import DEFAULT_BUILD, DEFAULT_SCHEDULE, KernelBuilder, Task, check_build, check_schedule, \
    compile_kernel, kernel_error, run_tasks
from . import faults
from .kernels import AheadOfTime
from .placement import device_name, jit_options, parse_device

# ============================================================================ kernels


def _aval(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _leaves(tree) -> dict:
    """{key path: leaf} of a pytree (a `PhaseIO`)."""
    return dict(tree_flatten_with_path(tree)[0])


def _label(path) -> str:
    """How `kernels()` names a leaf: a variable's value by its name, else its place
    (`K.size`, `guards.err`, `old.t`, `pending.0.err`)."""
    parts = [str(k.key) if isinstance(k, DictKey) else k.name if isinstance(k, GetAttrKey) else str(k.idx)
             for k in path]
    return ".".join(p for p in parts if p not in ("env", "values", "caches"))


@dataclass(frozen=True, eq=False)
class Signature:
    """What tracing a kernel abstractly found (`trace_signature`): the constants it uses, the
    leaves of its input `PhaseIO` it reads and keeps or reads and replaces (donated), the leaves
    of its output it writes, by key path; the output's tree structure and every leaf's path."""

    in_def: object  # the input `PhaseIO`'s tree structure
    in_keys: tuple  # the path of each of its leaves
    const_keys: tuple  # the constants it reads
    keep_keys: tuple  # leaves it reads and does not replace
    donate_keys: tuple  # leaves it replaces (donated)
    out_keys: tuple  # the paths of the output leaves it writes (computes)
    reads: frozenset
    out_avals: dict  # out key -> aval
    out_def: object  # the output `PhaseIO`'s tree structure
    out_paths: tuple  # the path of each of its leaves
    const_avals: dict
    env_avals: dict


def trace_signature(fn, const_avals: dict, io_avals: PhaseIO, owned: set, protected: set,
                    placed: bool) -> Signature:
    """Trace `fn(consts, io) -> PhaseIO` abstractly; find what it reads, writes and may donate
    (`owned`: buffers this step made; `protected`: leaves other kernels still read)."""
    c_keys = tuple(const_avals)
    pairs, in_def = tree_flatten_with_path(io_avals)
    e_keys = tuple(path for path, _ in pairs)
    env_avals = dict(pairs)
    found = {}

    def flat(c_list, e_list):
        out = fn(dict(zip(c_keys, c_list)), in_def.unflatten(e_list))
        out_pairs, found["def"] = tree_flatten_with_path(out)
        found["paths"] = tuple(path for path, _ in out_pairs)
        return [leaf for _, leaf in out_pairs]

    closed, shape = jax.make_jaxpr(flat, return_shape=True)([const_avals[k] for k in c_keys],
                                                           [env_avals[k] for k in e_keys])
    jaxpr = closed.jaxpr
    out_paths = found["paths"]
    invars = jaxpr.invars
    c_vars = dict(zip(c_keys, invars[:len(c_keys)]))
    e_vars = dict(zip(e_keys, invars[len(c_keys):]))
    outvars = dict(zip(out_paths, jaxpr.outvars))
    out_shapes = dict(zip(out_paths, shape))
    used = set()
    for eqn in jaxpr.eqns:
        used.update(v for v in eqn.invars if isinstance(v, Var))
    written = []
    for k in out_paths:
        var = outvars[k]
        if k in e_vars and var is e_vars[k]:
            continue  # returned unmodified
        written.append(k)
        if isinstance(var, Var):
            used.add(var)
    reads = [k for k in e_keys if e_vars[k] in used]
    writes = set(written)
    if placed:  # fresh copies on the consumer's device: donate what it replaces
        donate = [k for k in reads if k in writes]
    else:  # buffers this step made and nobody else holds: XLA may reuse them for the outputs
        donate = [k for k in e_keys if k in writes and k in owned and k not in protected]
    return Signature(in_def, e_keys, tuple(k for k in c_keys if c_vars[k] in used),
                     tuple(k for k in reads if k not in set(donate)), tuple(donate), tuple(written),
                     frozenset(reads), {k: out_shapes[k] for k in written}, found["def"], out_paths,
                     const_avals, env_avals)


def jit_kernel(fn, sig: Signature, counter, device):
    """The flat jitted kernel: `(const values, kept leaves, donated leaves) -> written leaves`,
    compiled with oi2jax's options for `device`'s platform (placement.jit_options)."""
    c_keys, e_keys = tuple(sig.const_avals), sig.in_keys
    placeholders_c = {k: a for k, a in sig.const_avals.items() if k not in set(sig.const_keys)}
    placeholders_e = {k: a for k, a in sig.env_avals.items() if k not in sig.reads and k not in set(sig.donate_keys)}
    const_keys, keep_keys, donate_keys, out_keys, in_def = sig.const_keys, sig.keep_keys, sig.donate_keys, \
        sig.out_keys, sig.in_def

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

    return jax.jit(kernel, donate_argnums=(2,), **jit_options(device.platform))


@dataclass(eq=False)
class Compilation:
    """A kernel's ahead-of-time build (executor.KernelBuilder): `future` its XLA compilation,
    `compiled` the executable once fetched (None: the kernel's jit compiles at its first call)."""

    future: object = None
    compiled: object = None


@dataclass(frozen=True, eq=False)
class Kernel:
    """One jitted kernel of the driver: `fn(consts: dict, io: PhaseIO) -> PhaseIO` run flat (the
    leaves of its `PhaseIO`s by key path, `sig`), named by `key` = (block, phase)."""

    key: tuple  # (block name, entry phase: the phase of entry it runs in or after)
    sig: Signature
    jitted: object
    const_vals: tuple  # the constants it reads (`sig.const_keys`), on its device
    span: object  # DSL location for errors (entry phase: its first node; consumer: its block)
    device: object = None  # None: the program's device
    placed: bool = False  # runs on another device than the entry
    commit: frozenset | None = None  # last entry phase: the state paths it commits (or undoes)
    writes: frozenset = frozenset()  # consumer: the variables its await takes (`CheckedGraph.writes`)
    merged: frozenset = frozenset()  # consumer: the leaves of entry's env its await takes
    back: tuple = ()  # consumer: indices of outputs merged into entry at the await (and its guards)
    writes_guards: bool = False  # consumer: it may record an error or ask for capacity
    build: Compilation = field(default_factory=Compilation)

    @property
    def block(self) -> str:
        return self.key[0]

    @property
    def phase(self) -> int:
        return self.key[1]

    @property
    def name(self) -> str:
        """How traces and listings show it: `entry:1` for an entry phase, a consumer by its block."""
        return f"{self.block}:{self.phase}" if self.block == "entry" else self.block

    def rebuild(self, args: dict, written: dict) -> PhaseIO:
        """The kernel's output `PhaseIO` from the leaves it wrote (`written`: path -> leaf) and
        its arguments' (`args`: path -> leaf) for those it returned unmodified."""
        return self.sig.out_def.unflatten([written[k] if k in written else args[k] for k in self.sig.out_paths])

    def lower_for(self, device):
        """`jitted.lower(...)` for the traced signature, committed to `device` (AOT build)."""
        sig = self.sig
        sharding = SingleDeviceSharding(device)

        def spec(a):
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)

        return self.jitted.lower(tuple(spec(sig.const_avals[k]) for k in sig.const_keys),
                                 tuple(spec(sig.env_avals[k]) for k in sig.keep_keys),
                                 tuple(spec(sig.env_avals[k]) for k in sig.donate_keys))


@dataclass(frozen=True, eq=False)
class DriverKernels:
    """Every kernel of a driven step for one executable (one generation of cache capacities):
    the entry phases in order and each window's consumers (name order)."""

    executable: object
    phases: tuple
    windows: dict  # window -> tuple of consumer `Kernel`s

    def all(self) -> list:
        """Every kernel: the phases, then the consumers window by window."""
        return list(self.phases) + [ck for w in sorted(self.windows) for ck in self.windows[w]]


# ============================================================================ program


class Driver:
    """The yield/await host driver of a program (`program.driver`; see the module doc): every
    entry phase and consumer block its own kernel, dispatched from the host. A client of the
    `Executable` it is handed each step: it builds its kernels (`DriverKernels`) for that
    executable and builds them again for the next one (after a growth).

    `placement={"block": device | "cpu:1"}` runs a consumer block on another device. `run(...,
    trace=True)` returns one event per kernel call: {"step" (from 1), "phase", "kernel", "device", "ms"}
    (kernels are waited for only when tracing). `forget()` drops the built kernels (the next step
    builds them again); `kernels()` lists them, `lowered_kernels` lowers them for dumps."""

    def __init__(self, bound, device=None, aot: bool = True, placement=None, build: str = DEFAULT_BUILD,
                 schedule: str = DEFAULT_SCHEDULE):
        """`device`: the program's (None: JAX's default); `aot`: build kernels ahead of time (not
        under a custom placer, whose shardings decide where values live: then each kernel's jit
        compiles at its first call)."""
        graph = self.graph = bound.graph
        self.analysis = bound.checked.yield_phases  # computed once, by the checker
        self.writes = bound.checked.writes
        self.device = device
        self.aot = aot
        self.placement = {name: parse_device(dev) for name, dev in (placement or {}).items()}
        for name in self.placement:
            if graph.block(name) is None or name == "entry":
                raise OiError(f"placement: {name} is not a consumer block")
        self.build = check_build(build)
        self.schedule = check_schedule(schedule)
        self.last_order: list[str] = []  # kernels of the last step, in dispatch (start) order
        self.built: DriverKernels | None = None  # the kernels of the last executable a step ran
        self.kernel_builder: KernelBuilder | None = None  # the builder of the kernels being built
        self._events: list | None = None  # while tracing: each kernel call's event
        self._step_no = 0
        # the XLA compilation of a kernel built ahead of time: `compile(kernel, lowered) ->
        # executable`; a test may replace it to inject a failing or slow compile
        self.compile = compile_kernel

    # ------------------------------------------------------------------ kernels

    def forget(self) -> None:
        """Drop the built kernels: the next step traces and compiles them again."""
        self.built = None

    def step(self, exe, state, dynamic: dict):
        """One step of executable `exe` run by the host driver: `(state, outputs)`; `dynamic`
        complete and placed."""
        spec = exe.state_spec
        new, outputs = self._drive(exe, spec.to_env(state), dynamic)
        return spec.from_env(new), outputs

    def _submit(self, kern: Kernel) -> None:
        """Lower `kern` here (tracing needs this thread's JAX config) and hand its XLA compilation
        to the kernel builder (inline for build="sequential", a worker thread for "concurrent")."""
        if self.kernel_builder is None or not self.aot:
            return
        dev = kern.device if kern.placed else self._main_device()
        try:
            lowered = kern.lower_for(dev)
        except OiError:
            raise
        except Exception as exc:
            raise kernel_error(self.graph, kern, exc, "compile") from None
        self.kernel_builder.submit(kern, lowered, self.compile)

    def _main_device(self):
        return self.device if self.device is not None else jax.devices()[0]

    def _build(self, exe, state: Env, dynamic: dict) -> DriverKernels:
        """Trace every kernel abstractly in step order: its signature, reads, writes, donations."""
        analysis = self.analysis
        builder, consts = exe.builder, exe.consts

        def count():
            exe.host.count("driver kernel")

        const_avals = {k: _aval(v) for k, v in consts.items()}
        state = jax.tree.map(_aval, state)
        env = state.update({k: _aval(v) for k, v in dynamic.items()})
        owned: set = set()
        step_writes: set = set()
        phase_kernels: list[Kernel] = []
        consumers: dict[int, list[Kernel]] = {}
        protected: set = set()  # read by consumers in flight, or kept for their merge
        main = self._main_device()
        snapshots: dict[int, Env] = {}
        last = len(analysis.phases) - 1
        for phase in analysis.phases:
            pending = []
            if phase.merges is not None:
                snap = _leaves(PhaseIO(snapshots.pop(phase.merges)))
                for ck in consumers[phase.merges]:
                    env, guards = self._merge(env, ck, snap, ck.sig.out_avals)
                    step_writes |= ck.merged
                    owned |= ck.merged & set(ck.sig.out_keys)
                    pending += guards
                protected = self._protected(snapshots, consumers)
            fn = builder.phase_kernel(phase.nodes, phase.index == 0, analysis.fused_fallback)
            io = PhaseIO(env, tuple(pending))
            if phase.index == last:
                probe = trace_signature(fn, const_avals, io, owned, protected, False)
                written = step_writes | set(probe.out_keys)
                # what the step wrote; with growable caches also the error guards (an undone step
                # leaves no error behind: state.commit)
                commit = frozenset(path for path, _ in tree_flatten_with_path(state)[0]
                                   if (path[0] != GUARDS and PhaseIO.env_path(path) in written)
                                   or (path in ERROR_PATHS and exe.growable))
                io = PhaseIO(env, tuple(pending), select(state, commit))
                owned_now = owned | {path for path in _leaves(io) if PhaseIO.part(path) == "old"}
            else:
                commit, owned_now = None, owned
            sig = trace_signature(fn, const_avals, io, owned_now, protected, False)
            kern = Kernel(("entry", phase.index), sig, jit_kernel(fn, sig, count, main),
                          tuple(consts[k] for k in sig.const_keys),
                          phase.nodes[0].span if phase.nodes else self.graph.entry.span, commit=commit)
            if sig.out_keys:
                self._submit(kern)
            phase_kernels.append(kern)
            env = kern.rebuild(_leaves(io), sig.out_avals).env
            owned |= set(sig.out_keys)
            step_writes |= set(sig.out_keys)
            if phase.launches is not None:
                w = phase.launches
                snapshots[w] = env
                consumers[w] = []
                snap = PhaseIO(env)
                for name in analysis.windows[w].consumers:
                    dev = self.placement.get(name)
                    placed = dev is not None and dev != main
                    block = builder.block_kernel(name)

                    def fn(consts_, io_, block=block):
                        return PhaseIO(block(consts_, io_.env))
                    sig = trace_signature(fn, const_avals, snap, set(), set(_leaves(snap)), placed)
                    vals = tuple(consts[k] for k in sig.const_keys)
                    writes = frozenset(self.writes[name])
                    merged = frozenset(_leaves(PhaseIO(env.only(writes))))  # what the await takes
                    ck = Kernel((name, phase.index), sig, jit_kernel(fn, sig, count, dev if placed else main),
                                tuple(jax.device_put(v, dev) for v in vals) if placed else vals,
                                self.graph.block(name).span, device=dev if placed else None, placed=placed,
                                writes=writes, merged=merged,
                                back=tuple(i for i, k in enumerate(sig.out_keys)
                                           if k in merged or PhaseIO.is_env_guard(k)),
                                writes_guards=any(PhaseIO.is_env_guard(k) for k in sig.out_keys))
                    self._submit(ck)
                    consumers[w].append(ck)
                protected = self._protected(snapshots, consumers)
        return DriverKernels(exe, tuple(phase_kernels), {w: tuple(c) for w, c in consumers.items()})

    @staticmethod
    def _protected(snapshots: dict, consumers: dict) -> set:
        """What an entry phase must not donate: the leaves the consumers in flight read or whose
        values their awaits take back."""
        protected = set()
        for w in snapshots:
            for ck in consumers[w]:
                protected |= set(ck.sig.reads) | ck.merged
        return protected

    @staticmethod
    def _merge(env: Env, ck: Kernel, snap: dict, written: dict) -> tuple[Env, list]:
        """An await taking consumer `ck`'s result (`written`: the leaves it wrote that came back;
        `snap`: the leaves of its snapshot) into entry's `env` (`Env.take`); and its guards, for
        the next phase to merge, if it may have recorded any."""
        result = ck.rebuild(snap, written).env
        return env.take(result, ck.writes), [result.guards] if ck.writes_guards else []

    # ------------------------------------------------------------------ the driver

    def _executable(self, kern: Kernel):
        """What to call for `kern`: its AOT executable (waiting for its compilation) or its jit."""
        build = kern.build
        if build.compiled is None and build.future is not None:
            compiled = self.kernel_builder.result(kern) if self.kernel_builder is not None else \
                build.future.result()
            build.compiled = AheadOfTime(compiled, first=1)  # its constants are the kernel's own
        return build.compiled

    def invoke(self, kern: Kernel, args):
        exe = self._executable(kern)
        try:
            faults.reach(faults.KERNEL, kern.name)
            if exe is not None:
                if exe.accepts(*args[1:]):
                    return exe.exe(*args)
                # avals or shardings other than the AOT signature's: the jit runs it from now on
                self.built.executable.host.note(f"kernel {kern.name}: AOT executable does not take its "
                                                f"arguments; jit recompiles it")
                kern.build.compiled = None
                kern.build.future = None
            return kern.jitted(*args)
        except OiError:
            raise
        except Exception as exc:
            raise kernel_error(self.graph, kern, exc, "run") from None

    def _call(self, kern: Kernel, env: dict, step: int):
        sig = kern.sig
        if kern.placed:
            keep = jax.device_put(tuple(env[k] for k in sig.keep_keys), kern.device)
            donated = jax.device_put(tuple(env[k] for k in sig.donate_keys), kern.device)
        else:
            keep = tuple(env[k] for k in sig.keep_keys)
            donated = []
            for k in sig.donate_keys:
                v = env[k]
                if sum(1 for x in env.values() if x is v) > 1:
                    v = jnp.copy(v)  # aliased by another name: donate a copy
                donated.append(v)
            donated = tuple(donated)
        self.last_order.append(kern.name)
        if self._events is None:
            return self.invoke(kern, (kern.const_vals, keep, donated))
        self._executable(kern)  # compile wait is not kernel time
        t0 = time.perf_counter()
        dev = kern.device if kern.placed else self._main_device()
        event = {"step": step, "phase": kern.phase, "kernel": kern.name, "device": device_name(dev), "ms": 0.0}
        self._events.append(event)  # appended at the start: the list is the actual start order
        outs = self.invoke(kern, (kern.const_vals, keep, donated))
        jax.block_until_ready(outs)
        event["ms"] = (time.perf_counter() - t0) * 1e3
        return outs

    def _drive(self, exe, state: Env, dynamic: dict):
        with exe.scope():
            fresh = self.built is None or self.built.executable is not exe
            try:
                if fresh:
                    self.built = None
                    self.kernel_builder = KernelBuilder(self.graph, self.build)
                    self.built = self._build(exe, state, dynamic)
                return self._drive_built(self.built, state, dynamic)
            except BaseException:
                if fresh:
                    self.built = None  # a failed build is retried by the next run
                if self.kernel_builder is not None:
                    self.kernel_builder.close(cancel=True)
                raise
            finally:
                if self.kernel_builder is not None:  # every kernel ran: no compile is left pending
                    self.kernel_builder.close()
                    self.kernel_builder = None

    def _drive_built(self, built: DriverKernels, state: Env, dynamic: dict):
        """One step: the kernels as tasks of a ready queue (executor.run_tasks). The host holds
        the kernels' `PhaseIO` leaves by key path (`leaves`: entry's env; `snaps`: a window's
        snapshot); a kernel takes the leaves of its traced paths and returns those it writes."""
        phase_kernels, consumers = built.phases, built.windows
        self._step_no += 1
        step = self._step_no  # 1-based, as a runtime error's `(in step k)` counts
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
                    result = dict(zip((ck.sig.out_keys[i] for i in ck.back), back))
                    for k in ck.merged:  # what the await takes (`Env.take`)
                        leaves[k] = result.get(k, snap[k])
                    if ck.writes_guards:  # its guards, merged by this phase (`TraceGuards.merge`)
                        for guard in GUARD_LEAVES:
                            k = PhaseIO.env_path((GUARDS,) + guard)
                            leaves[PhaseIO.pending_path(j, guard)] = result.get(k, snap[k])
                        j += 1
                snaps.pop(phase.merges, None)
            for path in kern.commit or ():  # the committed entries at their values at step start
                leaves[PhaseIO.old_path(path)] = state_leaves[path]
            outs = self._call(kern, leaves, step) if kern.sig.out_keys else ()
            for k in [k for k in leaves if PhaseIO.part(k) != "env"]:  # pending guards, old entries: this phase's
                del leaves[k]
            leaves.update(zip(kern.sig.out_keys, outs))
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
                for i, ck in enumerate(consumers[w]):
                    window_tasks[w].append(len(tasks))
                    tasks.append(Task(len(tasks), ck, (idx,), lambda w=w, i=i, ck=ck: run_consumer(w, i, ck)))
        run_tasks(tasks, self.schedule, self.kernel_builder, block=jax.block_until_ready)
        # the last phase's output: entry's env and the committed state entries (`PhaseIO.new`)
        last = phase_kernels[-1]
        final = last.rebuild(leaves, {})
        commit = last.commit or ()
        new_state = state_def.unflatten([leaf_at(final.new, path) if path in commit else leaves[PhaseIO.env_path(path)]
                                         for path, _ in state_pairs])
        builder = built.executable.builder
        names = tuple(self.analysis.outputs or ()) + tuple(builder.dynamic + builder.volatile)
        # everything a session may read (runtime-shaped values with their logical shapes: `Shaped`)
        return new_state, builder.outputs(final.env, dict.fromkeys(names))

    # ------------------------------------------------------------------ public API

    def run(self, session, inputs: dict, steps: int | None, trace: bool, progress, collect,
            feedback: dict | None = None, stop: dict | None = None) -> tuple[dict, list]:
        """`Program.run` of a driven program: each step run by this driver (per-phase and
        per-consumer kernels), `feedback` and `stop` read on the host after each step (the same
        rules as the fused loop's: `Session.run_stepwise`). `(result, events)`: with `trace=True`
        one event per kernel call, each waited for and timed; else no events."""
        events: list = []
        self._events = events if trace else None
        self._step_no = 0
        try:
            return session.run_stepwise(inputs, steps=steps, collect=collect, progress=progress, driver=True,
                                        feedback=feedback, stop=stop), events
        finally:
            self._events = None

    def lowered_kernels(self, exe, state, dynamic):
        """(file stem, Lowered) of every per-phase and per-consumer kernel the driver runs for
        executable `exe`: `kernel.<block>.phase<k>` (built here without running a step)."""
        if self.built is None or self.built.executable is not exe:
            with exe.scope():
                self.built = self._build(exe, exe.state_spec.to_env(state), dynamic)
        main = self._main_device()
        for kern in self.built.all():
            yield f"kernel.{kern.block}.phase{kern.phase}", kern.lower_for(kern.device if kern.placed else main)

    def kernels(self) -> list[dict]:
        """The built kernels (after the first step): name, phase, device, reads, writes, donated."""
        if self.built is None:
            return []
        out = []
        for kern in self.built.all():
            sig = kern.sig
            out.append({"kernel": kern.name, "phase": kern.phase,
                        "device": device_name(kern.device if kern.placed else self._main_device()),
                        "reads": sorted(map(_label, sig.reads)), "writes": [_label(k) for k in sig.out_keys],
                        "donated": [_label(k) for k in sig.donate_keys]})
        return out
