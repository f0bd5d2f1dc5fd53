"""`oi2jax generate --batch FILE`: many prompts generated together through continuous batching
(runtime/batch.py; docs/decode.md "Batches"). The prompts come from a text file (one prompt per
line, encoded with the model's tokenizer, `--chat` rendered), an `.npy` (a 2-D integer array, one
prompt per row, or a 1-D one: a single prompt) or an `.npz` (each member a 1-D integer array, in
the file's order). The `Generator`'s step graph (the model's family's `<family>_prefill.oi`, or
`--graph`) runs at S=1 with B slots (`--batch-size`), its prompts in the Generator's bucket
programs (each shape compiled once); a finished slot takes the next prompt. Each generation is printed as it
finishes, under `=== K (FINISH) ===` (K: the prompt's index in the file)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from .diagnostics import OiError, check_whole
from .generation import PROMPT_STEPS, Stats
from .npz import load_error, regular_input, write_atomic
from .runtime import runstats
from .runtime.batch import MAX_STOPS, SlotResult
from .runtime.settings import OFF as DEFAULT_SETTINGS, check_settings
from .runtime.tokens import capacity, prompt_ids, stop_ids as checked_stops, vocabulary


def read_prompts(path, encode=None, text_only: str | None = None) -> list[np.ndarray]:
    """The prompts of `path` as 1-D integer id arrays (an .npy / .npz's as stored; `prompt_ids` checks
    them against the vocabulary); `encode(text) -> ids` for a text file.
    `text_only`: a flag that applies to text prompts only (refused with a file of ids)."""
    path = Path(path)
    regular_input(path, "the prompts")
    suffix = path.suffix.lower()  # `P.NPY` is ids as `p.npy` is (it was read as text: a UTF-8 error)
    if suffix in (".npy", ".npz") and text_only is not None:
        raise OiError(f"{path}: {text_only} renders text prompts with the chat template; a file of token ids is "
                      f"the model's input as it is (leave out {text_only}, or give a text file)")
    if suffix in (".npy", ".npz"):
        try:
            data = np.load(path, allow_pickle=False)
        except Exception as exc:  # missing, not an array, a damaged zip: numpy and zipfile raise several kinds
            raise OiError(f"{path}: cannot read the prompts: {load_error(exc)}") from None
        if suffix == ".npz":
            try:
                arrays = [(f"{path}: member {name}", data[name]) for name in data.files]
            except Exception as exc:  # a damaged member: zip, zlib and numpy raise several kinds
                raise OiError(f"{path}: cannot read the prompts: {load_error(exc)}") from None
        elif data.ndim == 2:
            arrays = [(f"{path}: row {k}", row) for k, row in enumerate(data)]
        else:
            arrays = [(str(path), data)]
        prompts = []
        for where, ids in arrays:
            if not isinstance(ids, np.ndarray):  # an .npz member that is no .npy: NumPy hands its bytes
                raise OiError(f"{where}: a prompt is a non-empty 1-D array of integer token ids, got a file that "
                              f"is not an .npy array")
            if ids.dtype.kind not in "iu" or ids.ndim != 1 or ids.size == 0:
                raise OiError(f"{where}: a prompt is a non-empty 1-D array of integer token ids, got "
                              f"{ids.dtype}{list(ids.shape)}")
            prompts.append(ids)  # as stored: a uint64 id past int64 is named as it is, not wrapped negative
    else:
        try:
            # utf-8-sig: a byte-order mark (an editor's UTF-8 file) is no part of the first prompt
            lines = path.read_text(encoding="utf-8-sig").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise OiError(f"{path}: cannot read the prompts: {exc}") from None
        if encode is None:
            raise OiError(f"{path}: text prompts need a tokenizer (--tokenizer), or give token ids (.npy / .npz)")
        prompts = [np.asarray(encode(line), np.int64) for line in lines if line.strip()]
        last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
        blank = [i + 1 for i, line in enumerate(lines[:last]) if not line.strip()]
        if blank:  # before a prompt: the prompts' indices are no longer their lines' (trailing ones shift nothing)
            shown = ", ".join(map(str, blank[:8])) + (" ..." if len(blank) > 8 else "")
            print(f"note: {path}: blank line{'s' if len(blank) > 1 else ''} {shown} skipped: a prompt's index K "
                  f"counts the prompts, not the lines", file=sys.stderr)
    if not prompts:
        raise OiError(f"{path}: no prompts")
    return prompts


class BatchResults(list):
    """`generate_batch`'s answer: one `SlotResult` per prompt, in order (a list), and `stats`
    (generation.Stats) over the whole batch: the prompt tokens its prompt steps ran and their
    seconds (`Batch.insert`), the tokens generated and the seconds of the batched decode
    (`Batch.run`), each with compiling left out, and the seconds compiled (`compile_s`); `slots`,
    the batch's B; `memory`, what the device held for it (`Batch.memory`)."""

    stats: Stats
    slots: int
    memory: dict


def generate_batch(program, prompts, *, size: int = 8, max_tokens: int | None = None, stop_ids=(),
                   buckets=None, programs: dict | None = None, on_done=None, **settings) -> BatchResults:
    """Every prompt generated through `program.batch(size, buckets=, programs=)` (the step graph
    at S=1; `Batch`): a finished slot takes the next prompt. One `SlotResult` per prompt, in order
    (`BatchResults`, with the batch's `stats`); a prompt whose prompt step fails gets its error
    (finish "error") and the others go on. `on_done(k, result)` is called as prompt k finishes.
    `settings`: sampling settings; one the graph has no input for is an error unless it has its
    default value. Ctrl-C: KeyboardInterrupt, its `partial` the BatchResults so far (a prompt in
    flight finish "interrupted", with its tokens; one not started None)."""
    known = {k: v for k, v in settings.items() if k in DEFAULT_SETTINGS}  # another name: Batch.insert says which
    vocab = vocabulary(program)  # every prompt and stop id checked before any prompt runs: none lost to another's error
    check_settings(max_tokens=max_tokens, **{**DEFAULT_SETTINGS, **known}, vocab=vocab)  # as a single generation's
    positions = capacity(program)
    prompts = [prompt_ids(p, vocab, f"prompt {k}", positions) for k, p in enumerate(prompts)]
    if not prompts:
        raise OiError("generate_batch: no prompts (give a list of token-id prompts)")
    stop_ids = checked_stops(stop_ids, vocab)
    check_whole("size", size, 1)
    batch = program.batch(min(size, len(prompts)), buckets=buckets, programs=programs)
    given = {k: v for k, v in settings.items() if k in batch.settings or v != DEFAULT_SETTINGS.get(k)}
    results: list[SlotResult | None] = [None] * len(prompts)
    queue = list(range(len(prompts)))
    running: dict[int, int] = {}  # slot -> prompt
    clock = {"prompt": 0.0, "decode": 0.0, "prompt_tokens": 0}  # seconds without compiling
    compiled_before = runstats.compile_seconds()

    def timed(part: str, call, *args, **kwargs):
        t0, c0 = time.perf_counter(), runstats.compile_seconds()
        try:
            return call(*args, **kwargs)
        finally:
            clock[part] += max(0.0, time.perf_counter() - t0 - (runstats.compile_seconds() - c0))

    def finish(k: int, result: SlotResult) -> None:
        results[k] = result
        if on_done is not None:
            on_done(k, result)

    def partial() -> BatchResults:
        return _results(results, clock, compiled_before, batch)

    try:
        _fill_and_run(batch, prompts, queue, running, results, clock, timed, finish, max_tokens, stop_ids, given)
    except KeyboardInterrupt as interrupt:  # Ctrl-C: the prompts finished so far, and those in flight as
        for slot, k in running.items():  # they stand (the tokens of the compiled call in flight taken)
            result = batch.result(slot)
            if result is not None and result.finish is None:
                result.finish = "interrupted"
            results[k] = result
        interrupt.partial = partial()
        raise
    return partial()


def _fill_and_run(batch, prompts, queue, running, results, clock, timed, finish, max_tokens, stop_ids, given) -> None:
    """generate_batch's loop: a free slot takes the next prompt, the batch runs a chunk."""
    while queue or running:
        for slot in range(batch.size):
            while slot not in running and queue:
                k = queue.pop(0)
                batch.evict(slot)
                try:
                    timed("prompt", batch.insert, slot, prompts[k], max_tokens=max_tokens, stop=stop_ids, **given)
                    clock["prompt_tokens"] += len(prompts[k])
                except OiError as exc:
                    if exc.step is None:
                        raise  # not a prompt step's runtime error: the same for every prompt
                    finish(k, SlotResult(np.asarray(prompts[k]), finish="error", error=exc))
                    continue
                running[slot] = k
        for slot, k in list(running.items()):
            result = batch.result(slot)
            if result.finish is not None:
                del running[slot]
                finish(k, result)
        if batch.active:
            timed("decode", batch.run, batch.chunk)


def _results(results: list, clock: dict, compiled_before: float, batch) -> BatchResults:
    """The BatchResults of `results` (None: a prompt not started, after Ctrl-C)."""
    out = BatchResults(results)
    done = [r for r in results if r is not None]
    out.stats = Stats(prompt_tokens=clock["prompt_tokens"], prompt_s=clock["prompt"],
                      generated_tokens=sum(len(r.tokens) for r in done), generate_s=clock["decode"],
                      compile_s=runstats.compile_seconds() - compiled_before,
                      from_prompt=sum(1 for r in done if r.tokens))  # each prompt step's drawn token
    out.slots, out.memory = batch.size, batch.memory()
    return out


def cmd_generate_batch(args, generator) -> int:
    """The `generate --batch FILE` command: `generator` (generation.Generator, with `--graph` if
    given) gives the model's tokenizer, chat template, stop ids and its compiled step programs
    (`Generator.programs_for` the settings: the S=1 program runs the batch, the others its prompt
    steps; greedy, the programs with the temperature fixed at 0)."""
    if args.prompt is not None or args.prompt_ids is not None:
        raise OiError("--batch takes the prompts from its file: leave out --prompt / --prompt-ids")
    if args.ids_out is not None and not str(args.ids_out).endswith(".npz"):
        raise OiError(f"--ids-out with --batch writes one array per prompt: give an .npz path, not {args.ids_out}")

    def encode(text):
        return generator.prompt_ids(text, chat=args.chat, system=args.system)

    if generator.mode != PROMPT_STEPS:
        raise OiError(f"{generator.graph_path}: --batch runs the step-graph interface (dynamic `tokens: i32[S]` "
                      f"and `n: i32`: examples/llama_prefill.oi), not the token-by-token one")
    prompts = read_prompts(args.batch, encode if generator.tokenizer is not None else None,
                           text_only="--chat" if args.chat else "--system" if args.system is not None else None)
    model_stops = set(() if args.ignore_eos else generator.stop_ids)
    stops = sorted(model_stops | set(args.stop_id or ()))
    if len(stops) > MAX_STOPS:  # a slot's stop ids are a row of MAX_STOPS on the device
        raise OiError(f"--batch: {len(stops)} stop ids (the model's {len(model_stops)} and --stop-id's), at most "
                      f"{MAX_STOPS} a slot: give fewer --stop-id" + (" (or --ignore-eos)" if model_stops else ""))

    def show(k: int, result: SlotResult) -> None:
        text = generator.decode(result.tokens)
        body = " ".join(map(str, result.tokens)) if text is None else text
        print(f"=== {k} ({result.finish}) ===\n{body}", flush=True)
        if result.error is not None:  # named by its prompt: the others' text goes on around it
            n = len(result.tokens)
            print(f"{result.error.render()}\nnote: prompt {k}: {n} token{' was' if n == 1 else 's were'} generated "
                  f"before the failing step (shown under === {k} (error) ===)", file=sys.stderr)

    programs = generator.programs_for({"temperature": args.temperature})  # greedy: the temperature fixed at 0
    shown = set()

    def done(k: int, result: SlotResult) -> None:
        shown.add(k)
        show(k, result)
    try:
        results = generate_batch(programs[1], prompts, programs=programs, size=args.batch_size,
                                 max_tokens=args.max_tokens, stop_ids=stops, on_done=done, temperature=args.temperature,
                                 top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed)
    except KeyboardInterrupt as exc:  # Ctrl-C: the prompts in flight shown, --ids-out and --stats, then `error: interrupted`
        partial = getattr(exc, "partial", None)
        if partial is not None:
            for k, result in enumerate(partial):
                if result is not None and k not in shown:
                    show(k, result)
            _report_batch(args, generator, partial)
        raise
    return _report_batch(args, generator, results)


def _report_batch(args, generator, results: BatchResults) -> int:
    """--ids-out and --stats of a batch (or of one cut off by Ctrl-C: a prompt not started has no
    array); exit 1 where a prompt failed."""
    if args.ids_out is not None:
        arrays = {f"prompt_{k}": np.asarray(r.tokens, np.int32) for k, r in enumerate(results) if r is not None}
        write_atomic(args.ids_out, lambda f: np.savez(f, **arrays))
    if args.stats:  # the lines of a single generation's --stats, over the whole batch
        print(f"compile {generator.compile_s + results.stats.compile_s:.3f} s ({generator.graph_path}: "
              f"batch of {len(results)} prompts in {results.slots} slot{'s' if results.slots != 1 else ''})", file=sys.stderr)
        for line in results.stats.lines():
            print(line, file=sys.stderr)
        print(runstats.memory_line(results.memory), file=sys.stderr)
    return 1 if any(r is not None and r.error is not None for r in results) else 0
