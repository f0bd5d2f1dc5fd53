"""What every program is, whichever backend built it: `CompileOptions` (what `oi2jax.compile` was
asked, handed to the program's constructor, frozen) and the `Program` protocol that the compiled
program (`runtime.Program`) and the reference interpreter's (`interpret.InterpretedProgram`) both
implement. Callers (the CLI, tests, tools) use the protocol's members, never `hasattr` on a program.

Below both backends: imports nothing of oi2jax (the interpreter must not import `runtime/`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, runtime_checkable


@dataclass(frozen=True)
class CompileOptions:
    """The options of one `oi2jax.compile` that a program keeps (validated by `api.compile`).

    - `precision` ("highest" | "high" | "default"): float matmul precision while tracing
      (ops/numerical.py); the interpreter always computes at the highest.
    - `unroll` ("auto" | "none" | "full" | int k): how `loop` lowers (lowering/loops.py, docs/loops.md).
    - `platform` (a JAX platform name, or None: the program's device's): the platform the loop
      policy is for (an export's target, `loops.platform_of`).
    - `yield_mode` ("driver" | "fused"): a graph with yield/await run by the host driver
      (runtime/driver.py) or as one jit; a graph without yield is one jit either way.
    - `placement` ({block: device}), `build` ("concurrent" | "sequential"), `schedule`
      ("dataflow" | "linear"): the yield/await driver's options (runtime/executor.py).
    - `kernels` ("jax" | "ggml"): how weights kept in GGML blocks are held and multiplied: "jax"
      (default) their fields, oi2jax's exact pure-JAX kernels; "ggml" GGUF's raw blocks, a few rows'
      `linear` by ggml's CPU kernels with llama.cpp's numerics (quantized/ggml.py).

    - `members` (bool): on a CPU, families read at a rolled loop's index are held member by
      member too, each such read a `lax.switch` (`LoopPolicy.members`); `Program.rebound(...,
      rolled=True)` sets it with `unroll="none"` for a prompt program (runtime/buckets.py).

    `zero_missing_inputs` is a binding option: the `BoundGraph` carries it (model/bind.py), and so
    does a graph rebound at other sizes."""

    precision: str = "highest"
    unroll: object = "auto"
    platform: str | None = None
    yield_mode: str = "driver"
    placement: Mapping | None = None
    build: str = "concurrent"
    schedule: str = "dataflow"
    kernels: str = "jax"
    members: bool = False


@runtime_checkable
class Program(Protocol):
    """A runnable program (compiled or interpreted). `mode`: "compiled" | "interpret"."""

    mode: str
    options: CompileOptions
    bound: object  # the `model.bind.BoundGraph` it runs
    graph: object  # its `ir.Graph`
    zero_missing_inputs: bool  # run without an input that has no default: zeros (else an error)
    compile_log: list  # why each (re)compilation happened (`--explain-recompiles`); empty: none

    @property
    def model_path(self) -> str | None:
        """The model file bound (given, or found beside the graph); None without one."""

    @property
    def supports_batched(self) -> bool:
        """Whether `run_batched` runs (a compiled program) or raises OiError (the interpreter)."""

    def run(self, inputs: dict | None = None, steps=1, progress=None, *, collect=(), feedback=None,
            stop=None) -> dict:
        """`steps` steps from the initial state; every variable after the last (widened like `--out`),
        each `collect`ed one stacked per step; `feedback` and `stop` as run_rules.py defines them."""

    def run_batched(self, inputs: dict | None = None, batch_var: str = "B", steps: int = 1) -> dict:
        """Inputs with more rows than the size variable `batch_var`, run in chunks of it."""
