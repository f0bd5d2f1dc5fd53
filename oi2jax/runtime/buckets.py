"""The prompt buckets of a step graph (docs/decode.md, "The prompt in buckets"): the sizes S a
prompt runs in, one compiled program each, and how a prompt of m tokens is cut into steps of
them. `Generator` (generation.py) and `Batch` (runtime/batch.py) both use this one rule."""
from __future__ import annotations

from ..lowering.context import Tracer
from ..lowering.loops import most_unrolled_trips

SMALLEST, LARGEST = 16, 1024  # the prompt buckets: powers of two from SMALLEST up to T (at most LARGEST)
# a prompt program on a CPU rolls its loops where the step program unrolls one of at least this
# many trips (a model's layers): fewer compile faster unrolled (2 layers: 0.4-0.6 s a bucket less),
# more compile and first run faster rolled (docs/performance.md, "A rolled prompt program")
ROLL_FROM_TRIPS = 8


def buckets(capacity: int) -> tuple[int, ...]:
    """The prompt step sizes S compiled for a cache of `capacity` positions: 1 (the decode step),
    then 16, 32, 64, ... up to `capacity` (at most 1024). A prompt of m tokens runs in the
    smallest S >= m, a longer one in steps of the largest, then the rest (`prompt_steps`)."""
    sizes, s = [1], SMALLEST
    while s <= min(capacity, LARGEST):
        sizes.append(s)
        s *= 2
    return tuple(sizes)


def program_buckets(program) -> tuple[int, ...]:
    """`buckets` of a step-graph program: its caches' capacity is its size T (1 without one)."""
    return buckets(program.bound.sizes.get("T", 1))


def bucket_program(programs: dict, program, size: int):
    """The step-graph `program` (S = 1) at S = `size`: from `programs` (step programs by S), else
    compiled (`Program.rebound`) and kept there, so that each bucket compiles once. On a CPU (one
    device) a prompt program whose step program unrolls a loop of ROLL_FROM_TRIPS trips or more (a
    model's layers) has its loops rolled (`rebound(rolled=True)`): a prompt step is matrix work,
    which a rolled layer loop runs as fast, and its program compiles and first runs in a fraction
    of the unrolled one's time (docs/performance.md, "A rolled prompt program")."""
    if size == 1:
        return program
    prog = programs.get(size)
    if prog is None:
        prog = programs[size] = program.rebound({"S": size}, rolled=rolls_prompts(program))
    return prog


def rolls_prompts(program) -> bool:
    """Whether `bucket_program` rolls `program`'s prompt programs (a CPU, one device, a loop of
    ROLL_FROM_TRIPS trips or more unrolled)."""
    if program.first_device().platform != "cpu" or getattr(program.placer, "mesh", None) is not None:
        return False
    lowering = program.lowering
    return most_unrolled_trips(Tracer(lowering, {}), lowering.loop_policy) >= ROLL_FROM_TRIPS


def prompt_steps(m: int, sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    """(S, n) of each prompt step of an m-token prompt over the ascending bucket `sizes`: steps of
    the largest bucket while more tokens remain than it holds, then the smallest bucket that holds
    the rest."""
    largest, steps = sizes[-1], []
    while m > largest:
        steps.append((largest, largest))
        m -= largest
    steps.append((min(s for s in sizes if s >= m), m))
    return steps
