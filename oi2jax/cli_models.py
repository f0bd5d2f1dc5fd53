"""The model-file commands of `oi2jax`: convert-hf, convert-gguf (a checkpoint to an .oinf) and
generate (text in, text out: oi2jax/generation.py); `add_model_commands` adds them to the parser
(docs/cli.md). `UsageError`: a usage error of any command (exit 2)."""
from __future__ import annotations

import functools
import os
import sys

import numpy as np

from .diagnostics import OiError
from .model.convert import convert_hf
from .model.ggml import QUANTIZE_TYPES
from .model.gguf import convert_gguf
from .model.hf.config import MAX_SIZE
from .tables import TABLE_DTYPES
from .npz import load_error, refuse_inputs_as_outputs, regular_input, write_atomic
from . import progress  # progress.progress_for, looked up per call (tests stand in a bar)


BATCH_SIZE = 8  # `generate --batch`'s slots by default


class UsageError(Exception):
    pass


def cmd_convert_hf(args) -> int:
    if args.max_positions is not None and args.max_positions <= 0:
        raise UsageError(f"--max-positions must be a positive integer, got {args.max_positions}")
    if args.max_positions is not None and args.max_positions > MAX_SIZE:
        raise UsageError(f"--max-positions {args.max_positions} is out of range (1..{MAX_SIZE})")
    convert = convert_gguf if args.command == "convert-gguf" else functools.partial(convert_hf, quantize=args.quantize)
    summary = convert(args.source, args.output, dtype=args.dtype, max_positions=args.max_positions,
                      nonfinite=args.nonfinite,
                      progress=lambda total_mib: progress.progress_for(total_mib, quiet=args.quiet, min_steps=64,
                                                                       label="MiB", unit="MiB"))
    for note in summary.notes:
        print(f"note: {note}", file=sys.stderr)
    if not args.quiet:
        sizes = " ".join(f"{k}={v}" for k, v in summary.sizevars.items())
        dtypes = ", ".join(sorted(set(summary.tensors.values())))
        n = summary.nbytes
        size = f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"
        print(f"wrote {summary.path}: {len(summary.tensors)} tensors ({dtypes}, {size}); {sizes}; {summary.model_type}: "
              f"run it with examples/{summary.graph}", file=sys.stderr)
    return 0


def cmd_generate(args) -> int:
    if args.batch is None and args.batch_size is not None:
        raise UsageError("--batch-size sets the slots of --batch FILE: give --batch, or leave out --batch-size")
    if args.prompt_ids is not None and (args.chat or args.system is not None):
        flag = "--chat" if args.chat else "--system"
        raise UsageError(f"{flag} renders a text prompt with the chat template; --prompt-ids are the model's input "
                         f"as they are: give --prompt TEXT, or leave out {flag}")
    if args.batch_size is None:
        args.batch_size = BATCH_SIZE
    elif args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    for flag, text in (("--prompt", args.prompt), ("--system", args.system)):
        try:
            (text or "").encode("utf-8")
        except UnicodeEncodeError as exc:  # bytes the terminal's encoding could not decode
            bad = exc.object[exc.start:exc.end].encode("utf-8", "surrogateescape")
            raise UsageError(f"{flag}: not UTF-8 text (bytes {bad!r} at character {exc.start})") from None
    from . import api  # deferred: JAX
    from .generation import Generator  # deferred: JAX
    from .runtime import tokens

    # --ids-out told before any work (a directory, a device, a missing directory, one of the inputs),
    # not after the generation whose ids it would hold
    refuse_inputs_as_outputs({"--ids-out": args.ids_out}, {"model": args.model, "--prompt-ids": args.prompt_ids,
                                                           "--batch file": args.batch, "graph": args.graph,
                                                           "tokenizer": args.tokenizer})
    api.enable_compilation_cache(args.cache_dir)  # a second generate with the model reads its programs back
    if args.batch is not None:
        from .batch_generate import cmd_generate_batch  # deferred: JAX
        return cmd_generate_batch(args, Generator(args.model, args.graph, tokenizer=args.tokenizer,
                                                  ops=args.ops or ["nn"], kernels=args.kernels,
                                                  kv_dtype=args.table_dtype))
    if args.prompt is not None and args.prompt_ids is not None:
        raise UsageError("give --prompt TEXT or --prompt-ids IDS.npy, not both")
    if args.prompt is None and args.prompt_ids is None:
        raise UsageError("give --prompt TEXT, --prompt-ids IDS.npy or --batch FILE")
    prompt_ids = None
    if args.prompt_ids is not None:
        prompt_ids = _load_npy(args.prompt_ids, "--prompt-ids")
        if prompt_ids.dtype.kind not in "iu" or prompt_ids.ndim != 1:
            raise OiError(f"{args.prompt_ids}: --prompt-ids takes a 1-D array of integer token ids, got "
                          f"{prompt_ids.dtype}{list(prompt_ids.shape)}")
    gen = Generator(args.model, args.graph, tokenizer=args.tokenizer, ops=args.ops or ["nn"], kernels=args.kernels,
                    kv_dtype=args.table_dtype)
    if prompt_ids is not None:  # named by its file (generate checks it again, as prompt_ids)
        prompt_ids = tokens.prompt_ids(prompt_ids, gen.vocab, args.prompt_ids)
    printed = []

    def show(piece: str) -> None:
        printed.append(piece)
        try:
            sys.stdout.write(piece)
            sys.stdout.flush()
        except BrokenPipeError:  # `generate ... | head -c 100`: the reader left
            if args.ids_out is None and not args.stats:
                raise  # nothing else to deliver: stop here (exit 0)
            sys.stdout = open(os.devnull, "w")  # --ids-out and --stats still get the whole generation
    try:
        result = gen.generate(args.prompt, prompt_ids=prompt_ids, chat=args.chat, system=args.system,
                              max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, min_p=args.min_p, seed=args.seed, stop_ids=args.stop_id,
                              ignore_eos=args.ignore_eos, on_text=show)
    except KeyboardInterrupt as exc:  # Ctrl-C: what was generated is shown and written, then `error: interrupted`
        partial = getattr(exc, "partial", None)
        if partial is not None:
            _report(args, gen, partial, show, printed)
        raise
    return _report(args, gen, result, show, printed)


def _report(args, gen, result, show, printed: list) -> int:
    """The end of a generation (or of one cut off by Ctrl-C: its `partial`): the rest of its text
    (the ids, without a tokenizer), --ids-out, --stats, a step's error."""
    shown = "".join(printed)
    if result.text is None:  # no tokenizer: the ids
        print(" ".join(str(i) for i in result.ids))
    else:
        if result.text.startswith(shown) and len(result.text) > len(shown):  # the tokens since the last piece
            show(result.text[len(shown):])
        if printed:
            print()
    if args.ids_out is not None:
        write_atomic(args.ids_out, lambda f: np.save(f, np.asarray(result.ids, np.int32), allow_pickle=False))
    if args.stats:
        print(f"compile {gen.compile_s + result.stats.compile_s:.3f} s ({gen.graph_path}: {gen.mode})",
              file=sys.stderr)
        for line in result.stats.lines():
            print(line, file=sys.stderr)
        from .runtime.runstats import memory_line  # deferred: JAX (generate's runs import it anyway)
        print(memory_line(gen.memory()), file=sys.stderr)
    if result.error is not None:
        print(result.error.render(), file=sys.stderr)
        n = len(result.ids)
        print(f"note: {n} token{' was' if n == 1 else 's were'} generated before the failing step (shown above)",
              file=sys.stderr)
        return 1
    return 0


def _load_npy(path: str, flag: str) -> np.ndarray:
    regular_input(path, flag)
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise OiError(f"{path}: {flag}: no such file") from None
    except Exception as exc:  # a corrupt or foreign file: numpy raises several kinds
        raise OiError(f"{path}: {flag}: not a .npy array ({load_error(exc)})") from None
    if not isinstance(data, np.ndarray):  # an .npz: several arrays
        data.close()
        raise OiError(f"{path}: {flag}: an .npz of arrays ({', '.join(data.files)}); {flag} takes one .npy array")
    return data


def add_kernels_flag(p) -> None:
    p.add_argument("--kernels", choices=("jax", "ggml"), default="jax",
                   help="weights kept in GGML blocks: jax (default) oi2jax's exact kernels; ggml llama.cpp's CPU "
                        "kernels and numerics for decode rows (needs llama-cpp-python; docs/performance.md)")


def add_table_dtype_flag(p, flag: str = "--table-dtype") -> None:
    what = "the K/V caches (the graph's cache tables)" if flag == "--kv-dtype" else "every float cache table"
    p.add_argument(flag, dest="table_dtype", choices=TABLE_DTYPES, default=None,
                   help=f"store {what} in this dtype, values rounded once when written (default: as the graph "
                        "declares them; f16 holds and reads half the bytes of f32; docs/semantics.md, 'Table dtype')")


def add_cache_flag(p) -> None:
    p.add_argument("--cache-dir", default="default", metavar="DIR|none",
                   help="persistent XLA compilation cache (default: ~/.cache/oi2jax/xla, or $OI2JAX_CACHE_DIR); "
                        "'none' disables it")


def add_model_commands(sub) -> None:
    """convert-hf, convert-gguf and generate on the `oi2jax` subcommand parser `sub`."""
    h = sub.add_parser("convert-hf", help="convert a Hugging Face checkpoint directory (llama, mistral, qwen2, "
                                          "qwen3, phi3, ...: docs/models.md) to a .oinf model")
    h.add_argument("source", metavar="DIR", help="the checkpoint directory: config.json + model.safetensors "
                   "(or model-*.safetensors with model.safetensors.index.json)")
    h.add_argument("--quantize", type=str.lower, choices=[t.lower() for t in QUANTIZE_TYPES],
                   help="store the 2-D weights as these GGML blocks, kept packed when run (docs/models.md)")
    gg = sub.add_parser("convert-gguf", help="convert a GGUF file (llama.cpp: llama, qwen2, qwen3, phi3, gemma2, "
                                             "gemma3) to a .oinf model")
    gg.add_argument("source", metavar="FILE.gguf", help="the GGUF file")
    for h, keeps in ((h, "the checkpoint's; with --quantize it applies to the weights left unquantized"),
                     (gg, "F32/F16/BF16, and the quantized types' raw blocks")):
        h.add_argument("-o", dest="output", required=True, metavar="MODEL.oinf", help="the .oinf file to write")
        h.add_argument("--dtype", choices=("f32", "bf16", "f16"),
                       help=f"store every weight in this dtype (default: keep {keeps}; narrowing rounds to "
                            f"nearest even; the computed rope.inv_freq stays f32)")
        h.add_argument("--max-positions", type=int, metavar="N",
                       help="the size variable T (default: the model's trained context length)")
        h.add_argument("--nonfinite", choices=("note", "error"), default="note",
                       help="NaN/Inf weights: convert them with a note naming each tensor and the counts (default), "
                            "or refuse the model")
        h.add_argument("--quiet", action="store_true", help="no progress bar and no summary line (notes still shown)")
        h.set_defaults(func=cmd_convert_hf)
    gen = sub.add_parser("generate", help="generate text with a converted model (its tokenizer, chat template, "
                                          "stop ids and example graph)")
    gen.add_argument("model", metavar="MODEL.oinf", help="a model from convert-hf or convert-gguf")
    gen.add_argument("--prompt", metavar="TEXT", help="the prompt text")
    gen.add_argument("--prompt-ids", metavar="IDS.npy", help="the prompt as token ids (a 1-D integer .npy)")
    gen.add_argument("--chat", action="store_true", help="render the prompt as a user message with the model's "
                                                        "chat template")
    gen.add_argument("--system", metavar="TEXT", help="a system message (with --chat)")
    gen.add_argument("--max-tokens", type=int, default=256, metavar="N", help="at most N new tokens (default 256)")
    gen.add_argument("--temperature", type=float, default=0.0, metavar="T",
                     help="sampling temperature (default 0: greedy)")
    gen.add_argument("--top-k", type=int, default=0, metavar="K", help="keep the K most likely tokens (0: off)")
    gen.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling (1: off)")
    gen.add_argument("--min-p", type=float, default=0.0, metavar="P",
                     help="drop tokens below P x the top probability (0: off)")
    gen.add_argument("--seed", type=int, default=0, metavar="S", help="the sampling seed (default 0)")
    gen.add_argument("--stop-id", type=int, action="append", metavar="ID",
                     help="another stop token id (repeatable; besides the model's)")
    gen.add_argument("--ignore-eos", action="store_true", help="do not stop at the model's stop ids")
    gen.add_argument("--ids-out", metavar="OUT.npy", help="write the generated token ids")
    gen.add_argument("--stats", action="store_true", help="print compile time, prompt and generation rates, "
                                                          "and memory (weights, state, peak resident) on stderr")
    gen.add_argument("--graph", metavar="G.oi", help="the graph to run (default: the model's example graph)")
    gen.add_argument("--tokenizer", metavar="tokenizer.json", help="a tokenizer (default: the model's own)")
    gen.add_argument("--ops", action="append", metavar="SPEC", help="op sets (default: nn)")
    add_kernels_flag(gen)
    add_table_dtype_flag(gen, "--kv-dtype")
    add_cache_flag(gen)
    gen.add_argument("--batch", metavar="FILE", help="generate every prompt of FILE together (a text file, one "
                                                     "prompt a line; .npy / .npz token ids): docs/decode.md")
    gen.add_argument("--batch-size", type=int, metavar="B", help=f"sequences at once with --batch ({BATCH_SIZE})")
    gen.set_defaults(func=cmd_generate)
