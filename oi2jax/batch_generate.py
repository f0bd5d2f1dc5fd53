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
from pathlib import Path

import numpy as np

from .diagnostics import OiError
from .generation import PROMPT_STEPS, check_settings
from .npz import write_atomic
from .runtime.batch import SlotResult
from .runtime.tokens import prompt_ids, stop_ids as checked_stops, vocabulary

DEFAULT_SETTINGS = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0}


def read_prompts(path, encode=None) -> list[np.ndarray]:
    """The prompts of `path` as 1-D int32 id arrays; `encode(text) -> ids` for a text file."""
    path = Path(path)
    if path.suffix in (".npy", ".npz"):
        try:
            data = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise OiError(f"{path}: cannot read the prompts: {exc}") from None
        if path.suffix == ".npz":
            arrays = [(f"{path}: member {name}", data[name]) for name in data.files]
        elif data.ndim == 2:
            arrays = [(f"{path}: row {k}", row) for k, row in enumerate(data)]
        else:
            arrays = [(str(path), data)]
        prompts = []
        for where, ids in arrays:
            if ids.dtype.kind not in "iu" or ids.ndim != 1 or ids.size == 0:
                raise OiError(f"{where}: a prompt is a non-empty 1-D array of integer token ids, got "
                              f"{ids.dtype}{list(ids.shape)}")
            prompts.append(ids.astype(np.int64))
    else:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise OiError(f"{path}: cannot read the prompts: {exc}") from None
        if encode is None:
            raise OiError(f"{path}: text prompts need a tokenizer (--tokenizer), or give token ids (.npy / .npz)")
        prompts = [np.asarray(encode(line), np.int64) for line in lines if line.strip()]
    if not prompts:
        raise OiError(f"{path}: no prompts")
    return prompts


def generate_batch(program, prompts, *, size: int = 8, max_tokens: int | None = None, stop_ids=(),
                   buckets=None, programs: dict | None = None, on_done=None, **settings) -> list[SlotResult]:
    """Every prompt generated through `program.batch(size, buckets=, programs=)` (the step graph
    at S=1; `Batch`): a finished slot takes the next prompt. One `SlotResult` per prompt, in order; a prompt whose prompt step
    fails gets its error (finish "error") and the others go on. `on_done(k, result)` is called as
    prompt k finishes. `settings`: sampling settings; one the graph has no input for is an error
    unless it has its default value."""
    known = {k: v for k, v in settings.items() if k in DEFAULT_SETTINGS}  # another name: Batch.insert says which
    check_settings(max_tokens=max_tokens, **{**DEFAULT_SETTINGS, **known})  # as a single generation's
    vocab = vocabulary(program)  # every prompt and stop id checked before any prompt runs: none lost to another's error
    prompts = [prompt_ids(p, vocab, f"prompt {k}") for k, p in enumerate(prompts)]
    stop_ids = checked_stops(stop_ids, vocab)
    batch = program.batch(max(1, min(size, len(prompts))), buckets=buckets, programs=programs)
    given = {k: v for k, v in settings.items() if k in batch.settings or v != DEFAULT_SETTINGS.get(k)}
    results: list[SlotResult | None] = [None] * len(prompts)
    queue = list(range(len(prompts)))
    running: dict[int, int] = {}  # slot -> prompt

    def finish(k: int, result: SlotResult) -> None:
        results[k] = result
        if on_done is not None:
            on_done(k, result)

    while queue or running:
        for slot in range(batch.size):
            while slot not in running and queue:
                k = queue.pop(0)
                batch.evict(slot)
                try:
                    batch.insert(slot, prompts[k], max_tokens=max_tokens, stop=stop_ids, **given)
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
            batch.run(batch.chunk)
    return results


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
    prompts = read_prompts(args.batch, encode if generator.tokenizer is not None else None)
    stops = sorted(set(() if args.ignore_eos else generator.stop_ids) | set(args.stop_id or ()))

    def show(k: int, result: SlotResult) -> None:
        text = generator.decode(result.tokens)
        body = " ".join(map(str, result.tokens)) if text is None else text
        print(f"=== {k} ({result.finish}) ===\n{body}", flush=True)
        if result.error is not None:
            print(result.error.render(), file=sys.stderr)

    programs = generator.programs_for({"temperature": args.temperature})  # greedy: the temperature fixed at 0
    results = generate_batch(programs[1], prompts, programs=programs, size=args.batch_size,
                             max_tokens=args.max_tokens, stop_ids=stops, on_done=show, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                             min_p=args.min_p, seed=args.seed)
    if args.ids_out is not None:
        arrays = {f"prompt_{k}": np.asarray(r.tokens, np.int32) for k, r in enumerate(results)}
        write_atomic(args.ids_out, lambda f: np.savez(f, **arrays))
    return 1 if any(r.error is not None for r in results) else 0
