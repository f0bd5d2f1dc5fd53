"""Building and scheduling the driver's kernels (docs/executor.md).

Build modes (`build=`):

- `"sequential"`: every kernel is lowered and compiled, one after the other, before the first
  kernel runs.
- `"concurrent"` (default): each kernel is lowered in the main thread as soon as it is
  traced and its XLA compilation is handed to a thread pool (compilation releases the GIL); the
  run starts as soon as the first kernel is built and waits only for kernels not yet built.

Schedules (`schedule=`):

- `"dataflow"` (default): a ready queue. A kernel is ready when everything it depends on has been
  dispatched (an entry phase: the previous phase, and at an `await` every consumer of that window;
  a consumer: the entry phase that yielded every variable it awaits). Among the ready kernels the
  first one whose compilation has finished is dispatched (JAX async dispatch: independent
  kernels run concurrently, on one device or on several with placement).
- `"linear"`: a fixed topological order (entry phase, its yield's consumers in name order, next
  phase, ...); each kernel is waited for before the next starts. For debugging: same results,
  bit for bit.

Errors: the first failing compile or kernel call is raised ONCE as an `OiError` naming the block
and its DSL location; every other pending compilation is cancelled or waited for first, so no
compile is left running when `run` returns or raises.
"""
from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from ..diagnostics import Diagnostic, OiError

BUILDS = ("sequential", "concurrent")
SCHEDULES = ("dataflow", "linear")
DEFAULT_BUILD = "concurrent"
DEFAULT_SCHEDULE = "dataflow"


def check_build(build: str) -> str:
    if build not in BUILDS:
        raise OiError(f"unknown build {build!r} (expected one of {', '.join(BUILDS)})")
    return build


def check_schedule(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise OiError(f"unknown schedule {schedule!r} (expected one of {', '.join(SCHEDULES)})")
    return schedule


def kernel_error(graph, kernel, exc: BaseException, what: str) -> OiError:
    """An OiError naming the kernel's block and its DSL location (the phase's first node for entry)."""
    if isinstance(exc, OiError):
        return exc
    block_name = kernel.block
    span = getattr(kernel, "span", None)
    if span is None:
        block = graph.block(block_name)
        span = block.span if block is not None else None
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    where = f"block {block_name}" + (f" (phase {kernel.phase})" if block_name == "entry" else "")
    message = f"{what} of {where} failed: {type(exc).__name__}" + (f": {detail}" if detail else "")
    return OiError(Diagnostic(message, span), source=graph.source)


def compile_kernel(kernel, lowered):
    """XLA compilation of `kernel`'s `jax.stages.Lowered` (runs in worker threads): the default
    of `Driver.compile`, the hook through which a test injects a failing or slow compile."""
    return lowered.compile()


class KernelBuilder:
    """Compiles the kernels of one `DriverKernels` build, sequentially (inline) or on a thread pool."""

    def __init__(self, graph, build: str, workers: int | None = None):
        self.graph = graph
        self.build = check_build(build)
        self._pool = ThreadPoolExecutor(max_workers=workers or 8, thread_name_prefix="oi2jax-compile") \
            if build == "concurrent" else None
        self._futures: list[Future] = []
        self._lock = threading.Lock()
        self.closed = False

    def submit(self, kernel, lowered, compile=compile_kernel) -> Future:
        """Compile `lowered` for `kernel` with `compile(kernel, lowered)`; sets and returns
        `kernel.build.future` (its result: the executable)."""
        if self._pool is None:
            fut: Future = Future()
            try:
                fut.set_result(compile(kernel, lowered))
            except BaseException as exc:  # reported when the kernel is needed, like a worker's error
                fut.set_exception(exc)
        else:
            fut = self._pool.submit(compile, kernel, lowered)
        with self._lock:
            self._futures.append(fut)
        kernel.build.future = fut
        return fut

    def fail(self, kernel, exc: BaseException, what: str = "compile"):
        return kernel_error(self.graph, kernel, exc, what)

    def result(self, kernel):
        """The kernel's executable, waiting for its compilation; OiError (block + location) on failure."""
        fut = kernel.build.future
        try:
            return fut.result()
        except BaseException as exc:
            raise self.fail(kernel, exc) from None

    def close(self, cancel: bool = False) -> None:
        """Wait for (or cancel) every pending compilation and stop the pool: nothing left running."""
        if self.closed:
            return
        self.closed = True
        if self._pool is not None:
            if cancel:
                for fut in self._futures:
                    fut.cancel()
            self._pool.shutdown(wait=True, cancel_futures=cancel)

    def pending(self) -> int:
        return sum(1 for f in self._futures if not f.done())


class Task:
    """One kernel call of a step: `deps` are indices of tasks that must be dispatched first."""

    __slots__ = ("index", "kernel", "deps", "run", "dispatched")

    def __init__(self, index: int, kernel, deps: tuple[int, ...], run):
        self.index = index
        self.kernel = kernel
        self.deps = deps
        self.run = run
        self.dispatched = False


def run_tasks(tasks: list[Task], schedule: str, builder: KernelBuilder | None, block=None) -> list[int]:
    """Dispatch every task once, in `schedule` order; returns the dispatch order (task indices).

    `tasks` is in a topological order (the linear order). dataflow: among tasks whose deps are
    dispatched, the first (in linear order) whose kernel is compiled goes next; when none is
    compiled yet, wait for the first compilation among them to finish. linear: always the next
    task in order, waiting for its compilation, then for its outputs (`block(outputs)`)."""
    order: list[int] = []
    pending = list(tasks)
    while pending:
        ready = [t for t in pending if all(tasks[d].dispatched for d in t.deps)]
        if not ready:  # cannot happen for well-formed kernels
            raise OiError("internal error: the driver's ready queue is empty but kernels remain")
        if schedule == "linear" or builder is None:
            task = ready[0] if schedule != "linear" else pending[0]
        else:
            futures = [t.kernel.build.future for t in ready if t.kernel.build.future is not None]
            task = next((t for t in ready if t.kernel.build.future is None or t.kernel.build.future.done()), None)
            if task is None:
                wait(futures, return_when=FIRST_COMPLETED)
                task = next(t for t in ready if t.kernel.build.future.done())
        outs = task.run()
        if schedule == "linear" and block is not None and outs is not None:
            block(outs)
        task.dispatched = True
        order.append(task.index)
        pending.remove(task)
    return order
