"""`Program`: a compiled graph, the user's handle. It compiles (the lowering, the placed
constants), keeps the current `Executable` (executable.py: one generation of cache capacities
with its kernels) and delegates to it; a cache growth builds the next executable. It validates
inputs, runs, traces and reports errors."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

import jax
import numpy as np

from .. import dtypes as dt
from .. import ir, quantized
from ..diagnostics import OiError
from ..limits import allocation_error, check_sizes, growth_refused
from ..lowering import loops
from ..lowering.caches import TABLE
from ..lowering.loops import LoopPolicy
from ..lowering.state import Guards, StepState
from ..lowering.step import StepBuilder, build_lowering
from ..model.ggml import KeptBlocks, dequantize as ggml_dequantize
from ..model.quant import affine_values
from ..model.packing import pack
from ..protocol import CompileOptions
from ..values import check_given_inputs, convert_input, convert_inputs, unknown_input
from . import cache_state, chunked, faults, state_file
from .batch import Batch
from .driver import Driver
from .emit import dump as dump_kernels, emit as emit_text
from .executable import Executable, Host
from .kernels import AheadOfTime, StepOutcome
from .placement import TRIM_AFTER_BYTES, Placer, device_name, resolve_device, return_freed_memory
from .session import Session

class Program:
    """A graph lowered to one jitted step function. See docs/architecture.md and docs/decode.md.

    Three ways to run it:
    - `run(inputs, steps)`: N steps fused into ONE compiled loop, every variable returned;
    - `session()`: a decode loop that owns the state (`session.step(**inputs)`, `session.run`),
      reports every runtime error and grows caches transparently;
    - `step(state, **inputs)`: the pure jitted function, for `jax.jit` / `vmap` / `grad` /
      `jax.export`; its caller must call `check(state)` to see runtime errors."""

    mode = "compiled"  # the Program protocol (protocol.py): the interpreter's is "interpret"
    supports_batched = True  # `run_batched` runs (runtime/chunked.py)

    def __init__(self, bound, options: CompileOptions | None = None, device=None, placer: "Placer | None" = None,
                 shared: "Program | None" = None):
        """`options`: what `oi2jax.compile` was asked (protocol.CompileOptions; default: its
        defaults). `shared`: the program this one is `rebound` from, whose placed constants it
        takes where they are the same (`_const_values`), not a second copy. A graph with
        yield/await under `options.yield_mode == "driver"` runs each step with the host driver
        (driver.Driver, with `options.placement`, `build`, `schedule`); otherwise the fused step.
        `placer`: where values live (placement.Placer; sharding.ShardingPlacer over a mesh).
        `options.unroll`: the loop policy's option (lowering/loops.py; it also decides which
        families are held member by member)."""
        self.options = options = options if options is not None else CompileOptions()
        self.unroll = loops.check_unroll(options.unroll)
        self.precision = options.precision  # float matmul precision while tracing (Program.scope)
        self.bound = bound
        self.graph: ir.Graph = bound.graph
        self.zero_missing_inputs = bound.zero_missing_inputs  # asked for at binding (api.compile)
        self.device = resolve_device(device)
        self.placer = placer if placer is not None else Placer(self.device)
        self.yield_mode = options.yield_mode
        self.compiles = 0  # number of (re)traces of the step kernels: the recompile counter
        self.compile_log: list[str] = []  # why each (re)trace happened (--explain-recompiles)
        self.last_trace: list[dict] = []  # run(trace=True): one event per step (per kernel when driven)
        self._next_reason = "first call"
        self._count_lock = threading.Lock()
        self._given_ok: set = set()  # input name sets known to leave no input without a value
        self.validated_runs: dict = {}  # `Session.run` input signature -> its ValidatedRun (runtime/runargs.py)
        self._step_hot: StepHotPath | None = None  # `step`'s hot path
        self._const_ids: dict = {}  # each constant key's provenance (`_const_values`): what a rebound program shares
        self.general_steps = 0  # eager `step` calls that took the general path (validated, maybe compiled)
        check_sizes(bound, self.first_device())
        # every variable a result holds (the `--out` layout), in order
        self.result_vars = tuple(d for d in self.graph.vars
                                 if d.kind != ir.MemKind.CONSTANT and not d.is_prefix_table)
        self.driver = None
        if options.yield_mode == "driver" and bound.checked.yield_phases.has_yield:
            self.driver = Driver(bound, self.device, aot=type(self.placer) is Placer, placement=options.placement,
                                 build=options.build, schedule=options.schedule)
        if options.kernels == "ggml" and self._platform() != "cpu":
            raise OiError(f"kernels='ggml' runs on the CPU; this program's device is {self._platform()} "
                          f"(use kernels='jax' there)")
        with self.scope():
            policy = LoopPolicy(self.unroll, self._platform(), members=options.members and self._platform() == "cpu")
            lowering = build_lowering(bound, policy, self.precision,
                                      options.kernels)
            builder = StepBuilder(lowering)
            try:
                consts, defaults = self._place(bound, lowering, builder, shared)
            except OiError:
                raise
            except Exception as exc:  # the device's allocator refused: said, not a JAX traceback
                error = allocation_error(exc, "the program's constants and input defaults on the device")
                if error is None:
                    raise
                raise error from None
            self.executable = Executable(1, lowering, builder, consts, defaults,
                                         Host(self.placer, self.scope, self.count_trace, self.note))
        # the constants are on the device now: no host copy of the model stays (a Llama's
        # weights held twice made its peak memory 1.5x the hand-written program's)
        bound.release_host_values()
        if sum(getattr(v, "nbytes", 0) for v in jax.tree.leaves(consts)) >= TRIM_AFTER_BYTES:
            return_freed_memory()

    # ------------------------------------------------------------------ plumbing

    @property
    def model_path(self) -> str | None:
        """The model file this program was bound to: the one given, or the `.oinf` found beside the
        graph (pipeline.choose_model); None without a model."""
        return self.bound.model_path

    def check_given(self, names) -> None:
        """OiError unless every input the graph reads without a default of its own is in `names`
        (cached per set of names: a hot path)."""
        key = tuple(names)
        if key not in self._given_ok:
            check_given_inputs(self.bound, key, self.zero_missing_inputs)
            self._given_ok.add(key)

    def _platform(self) -> str:
        """The platform the loops are lowered for (lowering/loops.py): `options.platform` (an
        export's target), else the device's, the mesh's, or JAX's default backend."""
        if self.options.platform is not None:
            return self.options.platform
        return self.first_device().platform

    def _place(self, bound, lowering, builder, shared):
        """The program's constants and input defaults, read and placed on the device."""
        options = self.options
        values, names, sources = self._const_values(lowering, builder, shared)
        if options.kernels == "ggml":
            if not any(isinstance(v, quantized.QuantTensor) for v in values.values()):
                raise OiError(f"kernels='ggml' multiplies weights kept in GGML blocks or widened bf16/f16 "
                              f"weights, and {self.model_path or 'this program'} has none: nothing would "
                              f"change (leave kernels='ggml' out, or use a quantized model: convert-gguf keeps "
                              f"GGUF's blocks, convert-hf --quantize makes them)")
            quantized.ggml.ensure()  # built and registered now: a missing ggml is said here, not in a trace
        consts = self.placer.put("consts", values, names, sources)  # (streamed ones are placed already)
        del values  # the host copies go now, so that `return_freed_memory` can give their pages back
        defaults = self.placer.put("defaults", {name: bound.initial(name) for name in builder.dynamic})
        return consts, defaults

    def first_device(self):
        """The program's device, a mesh's first, or JAX's default device."""
        mesh = getattr(self.placer, "mesh", None)
        if self.device is not None:
            return self.device
        return mesh.devices.flat[0] if mesh is not None else jax.devices()[0]

    def memory(self) -> dict:
        """Bytes the program keeps in device memory (`Executable.memory`: `weights`, `state`) and
        `where`: its device, or its mesh (then the sizes are the arrays' global ones)."""
        mesh = getattr(self.placer, "mesh", None)
        where = f"a mesh of {mesh.devices.size} devices" if mesh is not None else device_name(self.first_device())
        return {**self.executable.memory(), "where": where}

    def loop_policy(self) -> LoopPolicy:
        """The loop lowering policy the program was lowered under (`Lowering.loop_policy`)."""
        return self.lowering.loop_policy

    def scope(self) -> "_Scope":
        """The context every trace and dispatch of this program runs in: 64-bit types on and the
        program's device (a plain class: entered on hot paths)."""
        return _Scope(self)

    def _const_values(self, lowering, builder, shared: "Program | None" = None) -> tuple[dict, dict, dict]:
        """`(values, names, sources)`: every constant (packed types packed), prefix-table family
        and variable's non-uniform initial value, by its IR name; a family whose every read is at
        a static index under the loop policy held member by member (`W[0]`, `W[1]`, ...:
        loops.member_key, lowering/loops.split_families), else stacked. `names`: each member key's
        family (placement reads it; no key is parsed back). `sources`: each constant bound to a
        model tensor, that tensor's name after the model's aliases and the constant's dtype
        (constants of one source are placed once: a tied embedding). A constant of the same
        provenance in `shared` (the same model tensor or family at the same shape and dtype, placed
        the same way) is `shared`'s placed value, not read or placed again: a prompt bucket's
        program holds no second copy of the model.

        On one device (the plain `Placer`) each constant is placed as soon as it is read and its
        host copy dropped before the next is read (the values come back placed): the host never
        holds more than one tensor of the model beside the device's copy, where reading all, then
        placing all held the whole model twice (a mesh's placer places the values together)."""
        split = lowering.split
        consts, names, sources = {}, {}, {}
        model = self.bound.model
        by_source: dict = {}  # one value per model tensor (placed, or packed): a tied embedding's names share it
        placed = self._shareable(shared)  # key -> (provenance, placed value)
        stream = type(self.placer) is Placer

        # kernels="ggml": GGUF's raw blocks, the bytes ggml's kernels read (quantized/ggml.py)
        pack_blocks = quantized.raw_tensor if self.options.kernels == "ggml" else quantized.prepare

        def put(key, value, source=None):
            """consts[key]: `value`, GGML blocks (`KeptBlocks`) in their packed form
            (`quantized.prepare`, or as they are for kernels="ggml"), never dequantized, stored
            integers with QuantParams as an AFFINE tensor (on a mesh, which cannot shard packed
            tensors, as their f32 values); placed now when streaming."""
            if isinstance(value, KeptBlocks) and value.affine:  # a mesh shards values: their f32 reading
                value = quantized.affine_tensor(value.raw, *value.affine, value.shape) if stream else \
                    affine_values(value.raw, *value.affine)
            elif isinstance(value, KeptBlocks) and not quantized.has_kernels(value.kind):
                # a type kept in the file that no kernel reads (Q2_K, Q3_K): its exact f32 values
                # (gguf.quants.dequantize), as every use of them would read
                value = ggml_dequantize(value.kind, value.raw, value.shape)
            elif isinstance(value, KeptBlocks):
                value = pack_blocks(value.kind, value.raw, value.shape)
            if stream:
                value = self.placer.put("consts", {key: value}, names)[key]
                self.bound.release_host_values()  # the host copy (the reader's too) goes before the next read
            if source is not None:
                by_source[source] = value
            consts[key] = value

        def reused(keys: dict) -> bool:
            """Record each key's provenance; True when `shared` placed every one of them (their values taken)."""
            self._const_ids.update(keys)
            if not all(placed.get(k, (None,))[0] == ident for k, ident in keys.items()):
                return False
            consts.update({k: placed[k][1] for k in keys})
            return True

        for decl in self.graph.vars:
            if decl.is_prefix_table and decl.kind == ir.MemKind.CONSTANT:
                family = ("family", decl.name, decl.dtype, self.bound.shape(decl.name),
                          tuple(self.bound.family_counts(decl.name)), decl.name in split)
            if decl.is_prefix_table and decl.name in split:  # each member read on its own, not stacked
                keys = {loops.member_key(decl.name, index): (*family, index)
                        for index in np.ndindex(*family[4])} if decl.kind == ir.MemKind.CONSTANT else {}
                names.update(dict.fromkeys(keys, decl.name))
                if keys and reused(keys):
                    continue
                for index, value in self.bound.family_items(decl.name, kept=True, half=self._half):
                    key = loops.member_key(decl.name, index)
                    names[key] = decl.name
                    put(key, value)
            elif decl.is_prefix_table:
                if decl.kind == ir.MemKind.CONSTANT and reused({decl.name: family}):
                    continue
                blocks = self.bound.kept_blocks(decl.name, self._half)
                put(decl.name, blocks if blocks is not None else self.bound.family(decl.name))
            elif decl.kind == ir.MemKind.CONSTANT:
                source = None
                if model is not None and self.bound.model_name(decl) in model.tensors:
                    source = sources[decl.name] = ("model tensor", self.bound.model_name(decl), decl.dtype)
                if reused({decl.name: ("constant", decl.name, source, decl.dtype, self.bound.shape(decl.name))}):
                    continue
                if source in by_source:  # a tied embedding: read and placed once
                    consts[decl.name] = by_source[source]
                    continue
                put(decl.name, self._const_value(decl), source)
        for name, value in builder.init_args.items():  # a variable's non-uniform initial value
            consts[name] = value
        return consts, names, sources

    def _shareable(self, shared: "Program | None") -> dict:
        """{key: (provenance, placed value)} of `shared`'s constants this program may take: the
        same model (one open reader), the same kernels and float widening, both on one device
        with the plain placer (a mesh places by the program's own shardings)."""
        if shared is None or type(self.placer) is not Placer or type(shared.placer) is not Placer or \
                shared.device != self.device or shared.bound.model is not self.bound.model or \
                shared.options.kernels != self.options.kernels or \
                shared.bound.widen_floats != self.bound.widen_floats:
            return {}
        consts = shared.executable.consts
        return {k: (ident, consts[k]) for k, ident in shared._const_ids.items() if k in consts}

    @property
    def _half(self) -> bool:
        """Whether a widened bf16/f16 matrix is held as its bytes (kernels="ggml": its few-row
        products by ggml's row dot product; model/bind `kept_blocks`)."""
        return self.options.kernels == "ggml"

    def _const_value(self, decl: ir.VarDecl):
        """A constant's host value, its GGML blocks (`KeptBlocks`), or what the placer loads
        lazily (sharded model tensors)."""
        lazy = self.placer.lazy_const(decl)
        if lazy is not None:
            return lazy
        blocks = self.bound.kept_blocks(decl.name, self._half)
        if blocks is not None:
            return blocks
        value = self.bound.initial(decl.name)
        return pack(decl.dtype, value) if dt.get(decl.dtype).packed else value

    def count_trace(self, what: str):
        """Count a (re)trace of a step kernel and say why (--explain-recompiles)."""
        with self._count_lock:
            self.compiles += 1
            self.compile_log.append(f"compile #{self.compiles}: {self._next_reason} ({what})")

    def note(self, text: str) -> None:
        """A line of the compile log besides a (re)trace (--explain-recompiles)."""
        with self._count_lock:
            self.compile_log.append(text)

    # ------------------------------------------------------------------ the current executable

    @property
    def lowering(self):
        """The current executable's lowering (its cache layouts change with growth)."""
        return self.executable.lowering

    @property
    def consts(self) -> dict:
        """The placed constants, by IR name (the same in every generation)."""
        return self.executable.consts

    @property
    def defaults(self) -> dict:
        """Each input's placed default value (its @init, else zeros)."""
        return self.executable.defaults

    @property
    def generation(self) -> int:
        """The current executable's generation: 1, bumped by each change of cache capacities."""
        return self.executable.generation

    # ------------------------------------------------------------------ public API

    @property
    def dynamic_names(self) -> list[str]:
        return list(self.executable.builder.dynamic)

    @property
    def growable(self) -> bool:
        """Whether some cache grows at run time (a step may be undone and re-run after growth)."""
        return self.executable.growable

    def init_state(self) -> StepState:
        """The state at program start (honours @init): a `StepState` pytree on the device."""
        return self.executable.init_state()

    def dynamic_args(self, dynamic: dict) -> dict:
        """Every dynamic variable: the given value, else its default."""
        return self.executable.dynamic_args(dynamic)

    def unknown_input(self, name: str) -> OiError:
        return unknown_input(name, self.graph)

    def step(self, state: StepState, **dynamic):
        """The pure step: `(state, outputs)`; jit-, vmap-, grad- and export-composable.

        The state's buffers are donated (use the returned state). Inputs must have their
        declared shape; host arrays are converted exactly (else OiError); traced values must
        already have the declared dtype. Runtime errors (a cache overflow, an index out of
        range) do not raise here: they are recorded in the state (the failing write is skipped;
        the first error wins) and **the caller must call `check(state)`** to see them. A step of
        a graph with growable caches that needs more capacity returns the old state with
        `state.guards.grow > 0` -- `check` says so; `session()` handles both for you. Inside a
        `jax.jit` of your own, use `apply` with the weights an argument (`step` closes over them,
        and JAX compiles closed-over arrays into the program)."""
        hot, exe = self._step_hot, self.executable
        if hot is not None and hot.executable is exe and len(dynamic) == len(hot.names) and \
                hot.step.accepts(state, dynamic):
            # called eagerly again with every input a live device array of the aval and placement
            # of the last call, the state too: the step compiled ahead of time, no JAX
            # configuration entered. Anything else (another shape, dtype or placement, a traced
            # value, a used state's buffers): the general path below explains, traces or runs it
            return hot.step.exe(exe.consts, state, dynamic)
        self.general_steps += 1
        checked, full, out = self._pure_step(exe, exe.consts, state, dynamic)
        with self.scope():
            array = type(out[0].guards.flags)  # a concrete jax.Array type, unless traced
            if (hot is None or hot.executable is not exe) and len(checked) == len(full) and \
                    not isinstance(out[0].guards.flags, jax.core.Tracer) and \
                    all(type(v) is array for v in checked.values()):
                # concrete device inputs, all given: compile this signature for the next call
                lowered = exe.jit_step.lower(exe.consts, out[0], full)
                self._step_hot = StepHotPath(exe, AheadOfTime(lowered.compile(exe.compile_options),
                                                              first=1), tuple(full))
            return out

    def apply(self, consts, state: StepState, **dynamic):
        """`step` with the program's constants given: `prog.apply(prog.consts, state, **inputs)`
        equals `prog.step(state, **inputs)`. Inside a `jax.jit` of your own, pass `prog.consts` in
        as an argument of your function and call this: `step` closes over the weights, and JAX
        compiles closed-over arrays into the program as constants (every weight a literal of its
        HLO: a TinyLlama-sized model's loop took 50 s to compile on an H200). `consts` must have
        the structure, shapes and dtypes of `prog.consts` (traced or concrete)."""
        exe = self.executable
        if jax.tree.structure(consts) != jax.tree.structure(exe.consts):
            names = sorted(exe.consts)
            raise OiError(f"apply: consts must be the program's constants (prog.consts: {len(names)} entries, "
                          f"{', '.join(names[:4])}{', ...' if len(names) > 4 else ''}), got another structure")
        for (path, have), need in zip(jax.tree_util.tree_flatten_with_path(consts)[0], jax.tree.leaves(exe.consts)):
            shape, dtype = list(getattr(have, "shape", ())), str(getattr(have, "dtype", type(have).__name__))
            if (shape, dtype) != (list(need.shape), str(need.dtype)):
                raise OiError(f"apply: consts{jax.tree_util.keystr(path)} is {dtype}{shape}, but the program's "
                              f"is {need.dtype}{list(need.shape)}")
        return self._pure_step(exe, consts, state, dynamic)[2]

    def _pure_step(self, exe, consts, state, dynamic: dict) -> tuple:
        """The checked inputs, every input (defaults added) and the jitted step's `(state, outputs)`."""
        checked = self.validate_inputs(dynamic)
        if not isinstance(state, StepState):  # an AttributeError deep in the step before
            raise OiError(f"step: state must be a StepState (prog.init_state(), or the state a step returned), "
                          f"got {type(state).__name__}")
        self.refuse_used(state)  # before the call: XLA would print its own error line first
        with self.scope():
            full = exe.dynamic_args(checked)
            try:
                return checked, full, exe.jit_step(consts, state, full)
            except (RuntimeError, ValueError, TypeError, KeyError):  # KeyError: a state of another graph
                self.refuse_used(state)
                self.refuse_foreign(state)
                raise

    def refuse_foreign(self, state) -> None:
        """OiError naming the first entry of `state` that this program's state has not, or holds
        at another dtype or shape (a variable; a table's entry, and its rows where all are
        @fixed): a state of another graph, or of this one at other sizes, which failed deep in the
        step in JAX's words. Leading axes of a stacked or vmapped state are allowed. From the
        layouts: nothing is allocated."""
        layouts = self.executable.lowering.caches
        given = {**getattr(state, "vars", {}), **getattr(state, "caches", {})}
        for name in [*layouts, *(n for n in given if n not in layouts)]:
            if name not in given or name not in layouts:
                where = "has no" if name not in given else "has a"
                raise OiError(f"state: not this program's: it {where} {name}, which this program's state "
                              f"{'has' if name in layouts else 'has not'} (a state of another graph?)") from None
            layout, value = layouts[name], given[name]
            data = value.data if layout.is_cache else value
            if layout.packed or not hasattr(data, "shape"):
                continue
            full = layout.data_shape()
            if not layout.growable:
                want = full
            elif layout.kind is TABLE:
                want = tuple(layout.shape)  # its entry's shape; its rows grow
            else:  # an @auto_dim tensor that grows: every dim may
                want = None
            rank = len(full) if want is None else len(want)
            got = tuple(data.shape)[len(data.shape) - rank:] if len(data.shape) >= rank else None
            if np.dtype(data.dtype) != np.dtype(dt.get(layout.dtype).np_dtype) or got is None or \
                    (want is not None and got != want):
                raise OiError(f"state: not this program's: its {name} is {np.dtype(data.dtype)}{list(data.shape)}, "
                              f"where this program's is {layout.dtype}{list(layout.data_shape())} (a state made at "
                              f"other sizes, or of another graph?)") from None

    # what to do about a used state handed to `check` or `export_state`
    _used_fix = "check (or read) the state that step returned (`state, out = prog.step(state, ...)`)"

    @staticmethod
    def refuse_used(state, fix: str = "pass the state that step returned (`state, out = "
                                            "prog.step(state, ...)`)") -> None:
        """OiError when `state` holds buffers an earlier step took over (donated)."""
        if any(isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer) and a.is_deleted()
               for a in jax.tree.leaves(state)):
            raise OiError("this state was already used by a step, which took over (donated) its "
                          f"buffers: {fix}") from None

    def check(self, state: StepState) -> None:
        """Raise the runtime error recorded in `state` (OiError), if any; also raise when a step
        was undone because a growable cache needs more capacity (run it under a session)."""
        exe = self.executable
        try:
            flags = np.asarray(exe.to_host(state.guards.flags))
        except RuntimeError:  # its buffers donated to a step: check the state that step returned
            self.refuse_used(state, self._used_fix)
            raise
        if flags.ndim > 1:  # a state stacked or vmapped over leading axes: each element's own flags
            for index in np.ndindex(flags.shape[:-1]):
                try:
                    self.check(replace(state, guards=Guards(flags[index])))
                except OiError as error:
                    raise error.where(f"element {index[0] if len(index) == 1 else index} of the state's "
                                      f"leading axes") from None
            return
        outcome = StepOutcome.of_flags(flags)
        error = exe.status_error(outcome)
        if error is not None:
            raise error
        if outcome.undone:
            caches = sorted({exe.lowering.growable[i][0] for i, g in enumerate(outcome.grow) if g > 0})
            raise OiError(f"the last step was not applied: growable cache {', '.join(caches)} needs more "
                          f"capacity; run the graph with Program.session() or Program.run, which grow "
                          f"caches and re-run the step")

    def session(self, state=None, max_unchecked: int | None = None) -> "Session":
        """A decode-loop session owning the state: `step(**inputs)`, `run(...)`, `read`, `save`.
        `state`: None (program start), a `StepState` (the session owns it: its first step donates
        the buffers; a state already donated is an OiError), a `{name: array}` dict or an `.npz` path
        written by `Session.save` / `--out` / `--state-out`. `max_unchecked` (K, default 8):
        how many dispatched steps `step` may leave unchecked before it waits for the oldest;
        1 raises step k's error by call k+1 at the latest (docs/decode.md)."""
        return Session(self, state, max_unchecked)

    def batch(self, size: int, **options) -> Batch:
        """`size` sequences decoding together in one compiled step (continuous batching:
        runtime/batch.py, docs/decode.md "Batches"); this program is the S=1 step graph.
        `options`: `buckets`, `programs`, `chunk`, `mesh`, `axis` (`Batch`)."""
        return Batch(self, size, **options)

    @property
    def compile_options(self) -> dict:
        """The XLA options oi2jax compiles this program's kernels with (on a CPU, the memory-
        optimized schedule: runtime/placement.py `CPU_COMPILER_OPTIONS`); `lower(...).compile(
        prog.compile_options)` gives the executable a session runs."""
        return self.executable.compile_options

    def lower(self, state: StepState | None = None, **dynamic):
        """JAX's `Lowered` for the step (`.as_text()`, `.compile()`, `cost_analysis()`; compile it
        with `compile_options` for the executable oi2jax runs)."""
        exe = self.executable
        with self.scope():
            state = exe.init_state() if state is None else state
            return exe.jit_step.lower(exe.consts, state, exe.dynamic_args(self.validate_inputs(dynamic, running=False)))

    def validate_inputs(self, inputs: dict, running: bool = True) -> dict:
        """Check names, shapes and dtypes of step inputs; convert host arrays exactly.
        Device arrays / tracers of the declared shape and dtype pass through untouched.
        `running`: also refuse a missing input (not when only lowering for inspection)."""
        if running:
            self.check_given(inputs)
        out = {}
        expected = self.executable.kernels.input_avals
        for name, value in inputs.items():
            want = expected.get(name)
            if want is None:
                raise self.unknown_input(name)
            shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
            if shape == want.shape and dtype == want.dtype:
                out[name] = value
            elif isinstance(value, jax.core.Tracer):
                if tuple(shape) != tuple(want.shape):
                    raise OiError(f"input {name}: expected shape {list(want.shape)}, got {list(shape)}")
                if np.dtype(want.dtype).itemsize == 8 and np.dtype(dtype).itemsize == 4 and \
                        not jax.config.jax_enable_x64:
                    raise OiError(f"input {name} is {self.bound.dtype(name)}: a traced value under jax.jit without "
                                  f"jax_enable_x64 cannot be 64-bit (it is {dtype}); pass a concrete array (converted "
                                  f"exactly) or enable x64 (jax.config.update('jax_enable_x64', True))")
                raise OiError(f"input {name}: expected dtype {want.dtype} ({self.bound.dtype(name)}), got "
                              f"{dtype}; cast it before the step (traced values are not converted)")
            else:
                out[name] = self.convert(name, value)
        return out

    def convert(self, name: str, value, steps: int | None = None) -> np.ndarray:
        shape = tuple(self.bound.shape(name))
        return convert_input(name, np.asarray(value), self.bound.dtype(name),
                             shape if steps is None else (steps,) + shape)

    def convert_inputs(self, inputs: dict) -> dict:
        """User arrays -> representation of each dynamic variable's dtype (no silent loss)."""
        return convert_inputs(inputs, self.graph, self.bound.shape)

    def run(self, inputs: dict | None = None, steps: int | None = None, progress=None, trace: bool = False,
            collect=(), session=None, feedback: dict | None = None, stop: dict | None = None) -> dict:
        """Run `steps` steps from the program's initial state (or `session`'s state); every
        dynamic, volatile and persistent variable after the last step (widened like `--out`).

        An input of its declared shape is the same every step; one with an extra leading axis
        `[N, ...]` gives one value per step (`steps=None`, the default: N, else 1). The steps run
        as ONE compiled loop
        (`Session.run`). `collect=("y", ...)`: those names hold every step's value, stacked
        `[N, ...]`, instead of the last one. `feedback={"token": "next"}`: once `token`'s per-step
        values run out, each step takes it from the step before's `next` (inside the one loop;
        `Session.run`). `stop={"next": [2, 32000]}`: the run ends after the step whose `next` is one
        of the ids, that step kept (`Session.run`).
        `trace=True` records `last_trace`: one event per step, each step waited for and timed."""
        session = self.session() if session is None else session
        faults.reach(faults.RUN)
        inputs = session.continued(inputs or {}, feedback)
        if self.driver is not None:  # its steps one at a time from the host: a stop is read after each
            result, events = self.driver.run(session, inputs or {}, steps, bool(trace), progress, collect, feedback,
                                             stop)
            self.last_trace = events
            return result
        if trace:
            return self._traced_run(session, inputs, steps, collect, feedback, stop)
        return session.run(inputs or {}, steps=steps, collect=collect, progress=progress, feedback=feedback, stop=stop)

    def _traced_run(self, session, inputs, steps: int | None, collect=(), feedback=None, stop=None) -> dict:
        events = []
        device = device_name(self.device or jax.devices()[0])  # the device's own name (cpu:0, gpu:0)

        def timed(step_fn):
            def one_step(*args):
                compiles = self.compiles
                start = time.perf_counter()
                result = step_fn(*args)
                jax.block_until_ready(result)
                compiled = self.compiles > compiles  # this call traced and compiled the kernel first
                kernel = "step (whole graph, one kernel" + ("; includes XLA compilation)" if compiled else ")")
                events.append({"step": len(events) + 1, "phase": 0, "kernel": kernel, "device": device,
                               "ms": (time.perf_counter() - start) * 1e3, "compile": compiled})
                return result
            return one_step

        self.last_trace = events
        return session.run_stepwise(inputs or {}, steps=steps, wrap=timed, collect=collect, feedback=feedback,
                                    stop=stop)

    def trace_text(self, events: list[dict] | None = None) -> str:
        """One line per kernel call: `step S phase P KERNEL on DEVICE: MS ms` (S from 1, as a runtime
        error's `(in step k)` counts)."""
        events = self.last_trace if events is None else events
        return "\n".join(f"step {e['step']} phase {e['phase']} {e['kernel']} on {e['device']}: {e['ms']:.3f} ms"
                         for e in events)

    def rebound(self, sizes: dict, rolled: bool = False) -> "Program":
        """The same graph, model and op registry checked and bound at other `sizes`, as a fused
        program on this device with this program's options (precision, unroll: a chunked run's
        tail computes as its chunks do): the bound graph rebinds itself (`BoundGraph.rebind`),
        the front end is not called again, and the model is not placed again: the new program
        holds this one's placed constants where they are the same (`_const_values`).
        `rolled` (a prompt program on a CPU: runtime/buckets.py): its loops rolled
        (`unroll="none"`), a layer's weights read member by member (`CompileOptions.members`),
        so it still holds this program's buffers; the values are the same."""
        options = replace(self.options, yield_mode="fused")
        if rolled:
            options = replace(options, unroll="none", members=True)
        return Program(self.bound.rebind(sizes), options, device=self.device, shared=self)

    def specialized(self, values: dict) -> "Program":
        """This program with the dynamic scalars `values` names fixed at compile time
        (`BoundGraph.specialized`: each a constant of that value), on this device with these
        options, holding this program's placed constants (the weights are not placed again). An
        op attribute reading one is a value known while tracing: `sample` at a fixed temperature
        0 compiles the greedy draw alone (what `generate` runs for a greedy generation). The
        fixed names are no longer inputs."""
        bound = self.bound.specialized(values)
        placer = None  # a program sharded over a mesh: the same mesh and shard spec
        if getattr(self.placer, "mesh", None) is not None:
            placer = type(self.placer)(bound, self.placer.mesh, self.placer.shard)
        return Program(bound, self.options, device=self.device, placer=placer, shared=self)

    def run_batched(self, inputs: dict | None = None, batch_var: str = "B", steps: int = 1) -> dict:
        """Like `run`, for inputs with more rows than the size variable `batch_var`: chunks of
        `batch_var` rows in one compiled program, state carried (runtime/chunked.py)."""
        return chunked.run_batched(self, inputs, batch_var, steps)

    # ------------------------------------------------------------------ host side of a step

    def session_step(self, state: StepState, dynamic: dict):
        """One step for a session: the yield/await driver's when the program has one, else the
        executable's fused session step."""
        if self.driver is not None:
            return self.driver.step(self.executable, state, dynamic)
        return self.executable.session_step(state, dynamic)

    def grow(self, state: StepState, outcome: StepOutcome) -> StepState:
        """Double the capacity of every cache dim that asked for more (`outcome.grow`; and of every
        other growable dim at least 3/4 full); rebuild the kernels. n growth steps cost O(log n)
        recompiles."""
        exe = self.executable
        need = np.asarray(outcome.grow, np.int64)
        host = exe.host_state(state)
        layouts = dict(exe.lowering.caches)
        per_cache = cache_state.plan_growth(layouts, exe.lowering.growable, need,
                                            {name: host.caches[name].size for name, _ in exe.lowering.growable})
        for name, cap in per_cache.items():  # refuse before allocating: a write at index 10**9 ...
            layout = layouts[name]
            nbytes = replace(layout, capacity=tuple(cap)).data_nbytes()
            refused = growth_refused(name, nbytes, f"capacity {cap} (a write needs {int(max(need))} entries)",
                                     self.first_device())
            if refused is not None:
                decl = self.graph.var(name)
                raise OiError(refused, decl.span if decl else None, source=self.graph.source)
        reasons = []
        caches = dict(host.caches)
        for name, cap in per_cache.items():
            layout = layouts[name]
            if tuple(cap) == layout.capacity:
                continue
            reasons.append(f"cache {name} capacity {list(layout.capacity)} -> {cap}")
            try:
                layouts[name], caches[name] = cache_state.grow(layout, caches[name], tuple(cap))
            except MemoryError as exc:
                raise allocation_error(exc, f"cache {name} at capacity {cap}") from None
        if not reasons:
            raise OiError("internal error: a cache asked to grow but no capacity changed")
        flags = np.array(host.guards.flags, np.int64)
        flags[2:] = 0  # the capacity asked for is there now
        self._next_reason = "growth: " + "; ".join(reasons)
        self.executable = exe = exe.grown(layouts)
        with self.scope():
            return self.placer.put_state(StepState(host.vars, caches, Guards(flags)))

    def to_host(self, value) -> np.ndarray:
        """A device value as a full host array (gathered when sharded)."""
        return self.placer.fetch(value)

    @property
    def mesh(self):
        """The device mesh of a sharded program (sharding.py), else None."""
        return getattr(self.placer, "mesh", None)

    @property
    def shaped(self) -> dict:
        """Runtime-shaped variables (phases.runtime_shaped): name -> @auto_dim tensor."""
        return self.executable.shaped

    def trim(self, value):
        """A runtime-shaped variable's value (a `Shaped` output) cut to its logical shape, on the
        host; any other value as it is."""
        return self.executable.trim(value)

    def export_state(self, state: StepState) -> dict:
        """Every persistent variable's user-visible value (widened like `--out`). A state a step
        took over, or one of another graph, is an OiError that says so."""
        try:
            return self.executable.export_state(state)
        except (RuntimeError, KeyError, AttributeError):  # a donated buffer; another graph's state
            self.refuse_used(state, self._used_fix)
            self.refuse_foreign(state)
            raise

    def import_state(self, values: dict, source: str = "state", present: dict | None = None) -> StepState:
        """A `StepState` from user-visible persistent values (`export_state` / `--out` layout);
        a variable not given keeps its initial value. Tables take their sizes from the array;
        a growable table's existing entries from `present` (bool[sizes...], a saved state's
        `T#present`), else every entry within its sizes."""
        present = dict(present or {})
        exe = self.executable
        host = exe.initial_values()
        layouts = dict(exe.lowering.caches)
        unknown = sorted(set(values) - set(layouts))
        if unknown:
            raise OiError(f"{source}: {unknown[0]} is not a persistent variable of the graph "
                          f"(persistent: {', '.join(layouts) or '(none)'})")
        grew = False
        for name, value in values.items():
            layout = layouts[name]
            layouts[name], host[name] = cache_state.import_value(layout, np.asarray(value), source,
                                                                 present.pop(name, None))
            grew = grew or layouts[name] is not layout
        if present:
            name = sorted(present)[0]
            raise OiError(f"{source}: {name}{state_file.PRESENT} is given without the table {name} it belongs to")
        if grew:
            self._next_reason = f"{source}: caches restored at a larger capacity"
            self.executable = exe = exe.grown(layouts)
        return exe.place(exe.assemble(host))

    # ------------------------------------------------------------------ inspection (runtime/emit.py)

    def emit(self, kind: str = "stablehlo") -> str:
        """jaxpr | stablehlo | hlo | optimized-hlo | graph-json text of the step."""
        return emit_text(self, kind)

    def dump(self, directory, *, not_over=()) -> list[str]:
        """Write into `directory` the step in every --emit form and every kernel a run executes
        (runtime/emit.py: all or none of the files it creates); returns the paths written.
        `not_over`: paths it must not write (an error before any file is)."""
        return dump_kernels(self, directory, not_over=not_over)


@dataclass(eq=False)
class StepHotPath:
    """`Program.step`'s hot path: the jitted step compiled ahead of time for the signature of an
    eager call whose inputs were all given as device arrays of one type."""

    executable: Executable  # the generation it was compiled for (a growth makes it stale)
    step: AheadOfTime  # the compiled step (consts, state, dynamic) -> (state, outputs); what it takes
    names: tuple  # the input names (every dynamic variable)


class _Scope:
    """`Program.scope()`: `jax.enable_x64(True)` and the default device."""
    __slots__ = ("program", "x64", "dev")

    def __init__(self, program):
        self.program = program

    def __enter__(self):
        prog = self.program
        self.dev = None
        self.x64 = jax.enable_x64(True)
        self.x64.__enter__()
        if prog.device is not None:
            try:
                self.dev = jax.default_device(prog.device)
                self.dev.__enter__()
            except BaseException:
                self.dev = None
                self.__exit__(None, None, None)
                raise

    def __exit__(self, *exc):
        try:
            if self.dev is not None:
                self.dev.__exit__(*exc)
        finally:
            self.x64.__exit__(*exc)
        return False
