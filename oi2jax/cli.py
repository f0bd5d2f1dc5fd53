"""`oi2jax` command line: check, fmt, inspect, run, compile, export, graph; the model-file commands
(convert-hf, convert-gguf, generate) in cli_models.py, the `run` command's files and printing in
cli_run_io.py.

Exit codes: 0 success, 1 user error (diagnostics printed), 2 usage error. Never a traceback
(set OI2JAX_DEBUG=1 to see one for an internal error).
"""
from __future__ import annotations

import argparse
import errno
import io
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

from . import __version__
from .cfg import format_for, render, to_dot
from .diagnostics import Diagnostic, OiError, OiNote, suggest
from .grammar.fmt import format_graph, scan_comments
from .grammar.parse import parse, parse_file
from .graph_json import to_json
from .ir import MemKind
from .model import open_model
from .model.inspect import render_model
from .naming import unknown_sizes
from .npz import refuse_inputs_as_outputs, save_npz, writable_target, write_atomic, write_text_atomic
from .run_rules import feedback_pairs, split_inputs
from . import progress  # progress.progress_for, looked up per call (tests stand in a bar)
from .tables import explained, narrow_tables
from .trace import Trace
from .cli_models import UsageError, add_cache_flag as _add_cache_flag, add_kernels_flag as _add_kernels_flag, \
    add_table_dtype_flag as _add_table_dtype_flag, \
    add_model_commands
from .values import check_every_step_input
from .cli_run_io import (load_inputs, main_outputs, per_step_inputs, report_trace, stop_ids,
                         write_outputs)

# The imports left inside functions below pull in JAX (the op registry, the checker, the lowering,
# the runtime): each says `# deferred: JAX`, so that `oi2jax inspect`, `convert-hf` and `--help`
# start without it (about a second).

EMIT_KINDS = ("jaxpr", "stablehlo", "hlo", "optimized-hlo", "graph-json")


class _Once(argparse.Action):
    """A flag that takes one value, given twice, is a usage error (argparse kept the last value
    without a word: `--steps 1 --steps 2` ran 2 steps, `-o a -o b` wrote only b)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault("_given_once", {})  # per parse: the namespace is new
        if self.dest in given:
            first, value = given[self.dest]
            parser.error(f"{option_string} given twice ({first} {value}, {option_string} {values}); give it once")
        given[self.dest] = (option_string, values)
        setattr(namespace, self.dest, values)


class _Parser(argparse.ArgumentParser):
    """No abbreviated flags (argparse takes `--mode` for `--model`, `--step` for `--steps`): a
    script's flags keep their meaning when a flag is added. An unknown flag gets a suggestion. A
    flag of one value given twice is an error (`_Once`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._argv: list[str] = []

    def add_argument(self, *args, **kwargs):
        if args and str(args[0]).startswith("-") and "action" not in kwargs and kwargs.get("nargs") is None:
            kwargs["action"] = _Once
        return super().add_argument(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def _flags(self) -> list[str]:
        """The long flags of the command being parsed (the subcommand's, when one is named)."""
        for action in self._actions:
            commands = action.choices if isinstance(action.choices, dict) else {}  # the subcommands' parsers
            command = next((a for a in self._argv if isinstance(commands.get(a), _Parser)), None)
            if command is not None:
                return commands[command]._flags()
        return [o for a in self._actions for o in a.option_strings if o.startswith("--")]

    def _print_message(self, message, file=None):  # argparse's own drops a failed write (--help >&-)
        if message:
            try:
                (file or sys.stderr).write(message)
            except OSError as exc:
                print(f"error: {exc.strerror or exc}", file=sys.stderr)
                raise SystemExit(1) from None

    def error(self, message):  # argparse exits 2 on usage errors; keep that, without a traceback
        self.print_usage(sys.stderr)
        if message.startswith("unrecognized arguments: "):
            known = self._flags()
            for word in message.split(": ", 1)[1].split():
                if word == "--":  # the end of the flags: what follows is not one
                    break
                flag = word.partition("=")[0]
                if not flag.startswith("--") or len(flag) < 3:
                    continue
                longer = [k for k in known if k.startswith(flag)]  # what argparse's abbreviation would have read
                close = suggest(flag[2:], [k[2:] for k in known]).replace("(did you mean ", "(did you mean --")
                hint = f" (did you mean {' or '.join(longer)}?)" if longer else close
                if hint:
                    message += hint
                    break
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _sizes(pairs: list[str] | None) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--size expects NAME=INT, got '{pair}'")
        if name in sizes:
            raise UsageError(f"--size {name} is given twice")
        try:
            sizes[name] = int(value)
        except ValueError:
            if value.strip().isdigit():  # more digits than Python converts (4300): no size is that large
                raise UsageError(f"--size {name}: a number of {len(value.strip())} digits is too large") from None
            raise UsageError(f"--size {name}: '{value}' is not an integer") from None
        if sizes[name] < 0:
            raise UsageError(f"--size {name}: size must be non-negative, got {value}")
        if sizes[name] > (1 << 64) - 1:  # a model's size variable is a u64 (SPEC §7): check passed 10**23
            raise UsageError(f"--size {name}: {value.strip()} is past u64's largest value, "
                             f"18446744073709551615 (a size variable is a u64)")
    return sizes


def _model(args):
    """This command's model (`pipeline.choose_model`, the one rule: `--model`, else GRAPH.oinf beside
    the graph when it exists, none with `--no-model`), as a `ModelChoice` to pass on; a note says
    which file when it was found beside the graph (not with --quiet)."""
    choice = getattr(args, "model_choice", None)
    if choice is None:
        from .pipeline import NO_MODEL, choose_model  # deferred: JAX
        if args.no_model and args.model:
            raise UsageError("give either --model or --no-model, not both")
        choice = args.model_choice = choose_model(Path(args.graph), NO_MODEL if args.no_model else args.model)
        if choice.beside and not getattr(args, "quiet", False):
            print(f"note: using model {choice.path} (beside the graph)", file=sys.stderr)
    return choice


def _ops(args):
    """The op registry of `--ops SPEC ...` (docs/ops.md); the built-in ops without it."""
    from .pipeline import registry  # deferred: JAX
    return registry(args.ops or None)


def _add_ops_flag(p) -> None:
    p.add_argument("--ops", action="append", metavar="SPEC",
                   help="load an op set (repeatable): a bundled set (nn), a .py or .json op file, a module, "
                        "or an installed oi2jax.ops entry point (docs/ops.md)")


def _load_graph(path: str):
    if path.endswith(".json"):  # OpenInfer graph JSON (SPEC §8.1)
        from .pipeline import load_graph_json  # deferred: JAX
        return load_graph_json(path)
    return parse_file(path)


def cmd_check(args) -> int:
    from .check import check  # deferred: JAX
    sizes, ops = _sizes(args.size), _ops(args)  # the flags first: an error in them before any note
    choice = _model(args)
    declared = _load_graph(args.graph)
    graph = narrow_tables(declared, args.table_dtype)
    model = open_model(choice.model) if choice.model else None
    diagnostics = explained(check(graph, model=model, sizes=sizes, ops=ops, no_model=choice.no_model_reason(),
                                  widen_floats=args.widen_floats), declared, args.table_dtype)
    return _reported(diagnostics, graph.source)


def _reported(diagnostics, source: str) -> int:
    """Print `diagnostics` on stderr; 1 when one is an error, else 0 (check's and graph's verdict)."""
    code = 1 if any(d.severity == "error" for d in diagnostics) else 0
    try:
        for d in diagnostics:
            print(d.render(source), file=sys.stderr)
    except BrokenPipeError:  # `oi2jax check g.oi 2>&1 | head -1`: the reader left, the verdict stands
        try:                 # (it was 0, `_dispatch`'s answer for a closed standard output)
            sys.stderr = open(os.devnull, "w")  # no second error while flushing at exit
        except OSError:
            pass
    return code


def cmd_fmt(args) -> int:
    _ops(args)  # an op file that does not load is reported (fmt itself formats any op)
    if args.in_place:
        writable_target(args.graph)  # before reading: a FIFO would block the read
    if args.graph.endswith(".json") and (args.in_place or args.check):
        raise UsageError(f"fmt {'-i' if args.in_place else '--check'} takes .oi text, not a graph-JSON file; "
                         f"fmt GRAPH.json prints its .oi text")
    graph = _load_graph(args.graph)
    text = same_program(graph, format_graph(graph))
    if args.check:  # the file's own bytes: CRLF line ends or a BOM are a reformatting too
        if text.encode() != Path(args.graph).read_bytes():
            print(f"{args.graph}: would be reformatted", file=sys.stderr)
            return 1
        return 0
    if args.in_place:
        write_text_atomic(args.graph, text)  # never a half-written graph
        return 0
    sys.stdout.write(text)
    return 0


def _unnumbered(value):
    """Graph JSON without its nodes' numbers (`index`, and the `uuid` made from it): `.oi` text
    numbers nodes in source order, a graph JSON need not (a node a rewrite inserted, such as
    `--table-dtype`'s casts, takes the next free number), and the numbers are not the program."""
    if isinstance(value, dict):
        node = "kind" in value and "uuid" in value
        return {k: _unnumbered(v) for k, v in value.items() if not (node and k in ("index", "uuid"))}
    if isinstance(value, list):
        return [_unnumbered(v) for v in value]
    return value


def same_program(graph, text: str) -> str:
    """`text` (`format_graph(graph)`) when it parses to the same program with every comment of the
    source, in their order; else an error, before anything is printed or written: fmt must never
    change a graph."""
    try:
        again = parse(text, "<formatted>")
        same = _unnumbered(to_json(again)) == _unnumbered(to_json(graph))
    except OiError:
        same = False
    kept = [c[3].strip() for c in scan_comments(text)] == [c[3].strip() for c in scan_comments(graph.source or "")]
    if not (same and kept):
        raise OiError(f"{graph.path or 'the graph'}: fmt would change the program or lose a comment (an oi2jax "
                      f"bug: please report it with this file); nothing was written")
    return text


def cmd_inspect(args) -> int:
    print(render_model(open_model(args.model)))
    return 0


def _sharding_kwargs(args) -> dict:
    """--coordinator/--num-processes/--process-id (jax.distributed), --mesh, --shard -> compile kwargs."""
    coordinator = getattr(args, "coordinator", None)
    if coordinator is None and (getattr(args, "num_processes", None) is not None
                                or getattr(args, "process_id", None) is not None):
        raise UsageError("--num-processes / --process-id need --coordinator HOST:PORT")
    if coordinator is not None:
        from .runtime.sharding import init_distributed  # deferred: JAX
        init_distributed(coordinator, args.num_processes, args.process_id)
    if not args.mesh and not args.shard:
        return {}
    if not args.mesh:
        raise UsageError("--shard needs --mesh AXIS=INT[,AXIS=INT...]")
    if args.device is not None:
        raise UsageError("--mesh and --device are exclusive")
    from .runtime.sharding import make_mesh, parse_mesh_spec, parse_shard_specs  # deferred: JAX
    try:  # the flags' text is a usage error, as --shard without --mesh is; too few devices is not
        axes, shard = parse_mesh_spec(args.mesh), parse_shard_specs(args.shard)
    except OiError as exc:
        raise UsageError(exc.diagnostics[0].message) from None
    return {"mesh": make_mesh(axes), "shard": shard}


def cmd_run(args) -> int:
    from . import api  # deferred: JAX
    ins = {"graph": args.graph, "model": _model(args).path, "--state-in file": args.state_in,
           "--inputs-per-step file": args.inputs_per_step}
    ins.update({f"--input file of {p.partition('=')[0]}": p.partition("=")[2] for p in args.input or []})
    refuse_inputs_as_outputs({"--out": args.out, "--state-out": args.state_out, "--trace-json": args.trace_json},
                              ins)
    if args.steps is not None and args.steps < 0:
        raise UsageError("--steps must be >= 0")
    if args.quiet and args.show:
        raise UsageError("--show and --quiet: --quiet prints no variables; give one of them")
    session_flags = [f for f, v in (("--inputs-per-step", args.inputs_per_step), ("--collect", args.collect),
                                    ("--feedback", args.feedback), ("--stop", args.stop), ("--state-in", args.state_in),
                                    ("--state-out", args.state_out), ("--stats", args.stats)) if v]
    feedback = {}
    for item in args.feedback or []:
        for pair in (p.strip() for p in item.split(",") if p.strip()):
            name, eq, source = (x.strip() for x in pair.partition("="))
            if not (eq and name and source):
                raise UsageError(f"--feedback expects INPUT=OUTPUT (e.g. token=next), got {pair!r}")
            if name in feedback:
                raise UsageError(f"--feedback {name}: given twice ({name}={feedback[name]}, {pair})")
            feedback[name] = source
    stop = stop_ids(args.stop)
    # the interpreter takes per-step inputs, --collect, --feedback and --stop (run_rules.py)
    compiled_only = [f for f in session_flags if f not in ("--inputs-per-step", "--collect", "--feedback", "--stop")]
    if args.interpret and compiled_only:
        raise UsageError(f"{compiled_only[0]} needs a compiled run (not --interpret)")
    sharding = _sharding_kwargs(args)
    if sharding and args.interpret:
        raise UsageError("--mesh/--shard cannot be used with --interpret")
    if not args.interpret:
        api.enable_compilation_cache(args.cache_dir)
    tracing = args.trace or bool(args.trace_json) or os.environ.get("OI2JAX_TRACE") == "full"
    node_trace = None
    if tracing and args.interpret:
        node_trace = Trace()
    t0 = time.perf_counter()
    program = api.compile(args.graph, model=_model(args), sizes=_sizes(args.size),
                          device=args.device, mode="interpret" if args.interpret else "compiled",
                          trace=node_trace, build=args.build, schedule=args.schedule, precision=args.precision,
                          zero_missing_inputs=args.zero_missing_inputs, ops=_ops(args), unroll=args.unroll,
                          widen_floats=args.widen_floats, kernels=args.kernels, table_dtype=args.table_dtype,
                          **sharding)
    compile_s = time.perf_counter() - t0
    inputs = load_inputs(args.input)
    every_step = [name for name in inputs if (decl := program.graph.var(name)) is not None
                  and decl.kind == MemKind.DYNAMIC]  # others: the run names them
    for name in every_step:
        check_every_step_input(name, inputs[name], program.bound.shape(name))
    if args.inputs_per_step:
        inputs.update(per_step_inputs(args, program, inputs))
    steps = args.steps if args.steps is not None else (None if args.inputs_per_step else 1)
    batch_var = args.batch_var
    if batch_var is None and program.supports_batched and not session_flags:
        from .runtime.chunked import over_long_input  # deferred: JAX
        found = over_long_input(program, inputs)  # an input longer than its batch size variable
        if found is not None:
            batch_var, name, rows = found
            if not args.quiet:  # said, not silent: the run's shape is not the graph's
                size = program.bound.sizes[batch_var]
                print(f"note: {name} holds {rows} row{'' if rows == 1 else 's'} where {batch_var}={size}: running them "
                      f"in chunks of {size} rows (docs/executor.md; --batch-var {batch_var} asks for it)",
                      file=sys.stderr)
    if batch_var is not None:
        if not program.supports_batched:
            raise UsageError("--batch-var needs a compiled run (not --interpret)")
        if session_flags:
            raise UsageError(f"{session_flags[0]} cannot be combined with a batch-chunked run (--batch-var)")
        if steps is None or steps < 1:
            raise UsageError("a batch-chunked run needs --steps >= 1")
        if program.bound.sizes.get(batch_var, 1) < 1:
            raise OiError(f"--batch-var {batch_var}: chunks of {batch_var}={program.bound.sizes[batch_var]} rows "
                          f"hold no row (give --size {batch_var}=N with N >= 1)")
        try:
            outputs = program.run_batched(inputs, batch_var=batch_var, steps=steps)
        except OiError as exc:  # the rows of the chunks before the failing one are written, not lost
            partial = getattr(exc, "partial", None)
            if args.out and partial is not None:
                save_npz(args.out, partial)
                print(f"note: wrote {args.out}: the batched outputs' rows of the chunks before the failing chunk "
                      f"{exc.chunk} ({', '.join(partial) or 'none'})", file=sys.stderr)
            raise
        write_outputs(args, outputs, main_outputs(program, ()))
        return 0
    for name in every_step:  # not chunked: the declared shape exactly, said as --input's rule
        check_every_step_input(name, inputs[name], program.bound.shape(name), dims=True)
    run_kwargs = {}
    if not args.interpret:
        session = program.session(state=args.state_in)
        run_kwargs["session"] = session
    if args.collect:
        run_kwargs["collect"] = tuple(n.strip() for item in args.collect for n in item.split(",") if n.strip())
        if not run_kwargs["collect"]:
            raise UsageError("--collect needs one or more variable names (--collect A,B)")
    if feedback:
        run_kwargs["feedback"] = feedback
    if stop:
        run_kwargs["stop"] = stop
    if steps is None:  # --inputs-per-step without --steps: its length (as the run counts it)
        steps = split_inputs(program, inputs, None, feedback_pairs(program, feedback))[2]
    bar = progress.progress_for(steps, quiet=args.quiet)
    if bar is not None:
        run_kwargs["progress"] = bar
    if tracing and not args.interpret:
        run_kwargs["trace"] = True
    try:
        outputs = program.run(inputs, steps=steps, **run_kwargs)
    except OiError as exc:  # what the steps before the failing one produced is written, not lost
        partial = getattr(exc, "partial", None)
        if partial is not None:
            collected = run_kwargs.get("collect", ())
            write_outputs(args, partial, main_outputs(program, collected), partial=exc.step, collected=collected,
                          interpreted=args.interpret)
        if args.state_out and partial is not None and "session" in run_kwargs:
            session.save(args.state_out)  # the session's state, as --out's variables: resumable
            print(f"note: wrote {args.state_out}: the state after the failing step {exc.step} (its failing write "
                  f"skipped, its other writes applied); resume with --state-in", file=sys.stderr)
        if args.stats and "session" in run_kwargs and session.last_run is not None:  # the steps before it
            print(session.last_run.line(compile_before=compile_s), file=sys.stderr)
        if tracing:  # the trace up to the failing step (node): what one debugs a failure with
            report_trace(args, program, node_trace)
        raise
    finally:
        if bar is not None:
            bar.close()
    if args.stats and "session" in run_kwargs and session.last_run is not None:
        print(session.last_run.line(compile_before=compile_s), file=sys.stderr)
    if args.state_out:
        session.save(args.state_out)
    if tracing:
        report_trace(args, program, node_trace)
    if args.explain_recompiles:
        for line in program.compile_log or ["(no compilation: interpreted run)"]:
            print(f"note: {line}", file=sys.stderr)
    if getattr(args, "coordinator", None) is not None and args.process_id != 0:
        return 0  # every process computed the same gathered outputs; process 0 reports them
    write_outputs(args, outputs, main_outputs(program, run_kwargs.get("collect", ())))
    return 0


def cmd_export(args) -> int:
    from .export import write_export  # deferred: JAX
    model = _model(args)
    for suffix in ("", ".json", ".init.npz"):
        refuse_inputs_as_outputs({"-o": args.output + suffix}, {"graph": args.graph, "model": model.path},
                                 makes_dirs=True)  # write_export makes the artifact's directory
    symbolic = [s.strip() for item in args.symbolic or [] for s in item.split(",") if s.strip()]
    platforms = [p.strip() for p in args.platforms.split(",") if p.strip()] if args.platforms else None
    for path in write_export(args.graph, args.output, model=model, sizes=_sizes(args.size), symbolic=symbolic,
                             platforms=platforms, ops=_ops(args), unroll=args.unroll,
                             zero_missing_inputs=args.zero_missing_inputs, widen_floats=args.widen_floats,
                             table_dtype=args.table_dtype):
        print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_graph(args) -> int:
    from .check import check  # deferred: JAX
    ops = _ops(args)  # an op file that does not load is reported
    if args.output is not None:
        refuse_inputs_as_outputs({"-o": args.output}, {"graph": args.graph, "model": _model(args).path})
    graph = _load_graph(args.graph)
    sizes = {}
    choice = _model(args)
    model = choice.model
    opened = open_model(model) if model else None
    if opened is not None:
        sizes.update(opened.sizevars)
    given = _sizes(args.size)
    unknown = unknown_sizes(graph, opened, given)  # a typo (b=8 for B) is an error, as for check/run/compile
    if unknown:
        raise OiError(unknown[0] if len(unknown) == 1 else [Diagnostic(m) for m in unknown])
    # the graph is checked as `check` checks it: an invalid one (a branch to a missing block, a
    # duplicate declaration) is its errors and exit 1, not a picture of a program that cannot run.
    # Without a model, sizes stay names there (a `--size` that only labels a loop is not asked to
    # complete every shape, as `check --size` asks)
    if _reported(check(graph, model=opened, sizes=given if opened is not None else None, ops=ops,
                       no_model=choice.no_model_reason()), graph.source):
        return 1
    sizes.update(given)
    fmt = format_for(args.output)
    text = to_dot(graph, sizes)
    if fmt == "dot":
        if args.output:
            write_text_atomic(args.output, text)
        else:
            sys.stdout.write(text)
        return 0
    image = render(text, fmt)
    write_atomic(args.output, lambda f: f.write(image))
    return 0


def cmd_compile(args) -> int:
    from . import api  # deferred: JAX
    api.enable_compilation_cache(args.cache_dir)
    refuse_inputs_as_outputs({"-o": args.output, "--dump-dir": args.dump_dir},
                              {"graph": args.graph, "model": _model(args).path})
    if args.emit == "graph-json" and not args.dump_dir and not _sharding_kwargs(args):
        # graph JSON keeps dims symbolic (OpenInfer serializes graphs without a model): check the
        # graph (against the model when there is one) and write it; nothing to compile, so a flag
        # that only shapes what is compiled is refused, not dropped
        # given at all, its default value too (`--precision highest` shapes nothing here either)
        given_once = getattr(args, "_given_once", {})
        unused = [flag for flag, given in (("--precision", "precision" in given_once), ("--unroll", "unroll" in given_once),
                                           ("--kernels", "kernels" in given_once), ("--device", "device" in given_once),
                                           ("--zero-missing-inputs", args.zero_missing_inputs)) if given]
        if unused:
            raise UsageError(f"{unused[0]} has no effect on --emit graph-json: nothing is compiled (the JSON is the graph "
                             f"as written; with --dump-dir it applies to the forms dumped)")
        from . import pipeline  # deferred: JAX
        graph = pipeline.checked(Path(args.graph), _model(args), _sizes(args.size), _ops(args),
                                 widen_floats=args.widen_floats, table_dtype=args.table_dtype)[0].graph
        if args.size:
            print("note: --size checks the graph at those sizes; graph JSON keeps the size names (it is written "
                  "without a model, as OpenInfer writes it)", file=sys.stderr)
        return _write_output(args.output, json.dumps(to_json(graph), indent=2))
    program = api.compile(args.graph, model=_model(args), sizes=_sizes(args.size), device=args.device,
                          precision=args.precision, zero_missing_inputs=args.zero_missing_inputs, ops=_ops(args),
                          unroll=args.unroll, widen_floats=args.widen_floats, kernels=args.kernels,
                          table_dtype=args.table_dtype, **_sharding_kwargs(args))
    if args.dump_dir:
        for path in program.dump(args.dump_dir, not_over=[args.output] if args.output else []):
            print(f"wrote {path}", file=sys.stderr)
    return _write_output(args.output, program.emit(args.emit))


def _write_output(output: str | None, text: str) -> int:
    if output:
        write_text_atomic(output, text)  # never a half-written file
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def _add_sharding_flags(p, distributed: bool) -> None:
    p.add_argument("--mesh", metavar="AXIS=INT[,AXIS=INT...]", help="device mesh, e.g. data=4,model=2")
    p.add_argument("--shard", action="append", metavar="SIZEVAR=AXIS", help="shard a size variable's dims "
                   "over a mesh axis (repeatable), e.g. B=data")
    if distributed:
        p.add_argument("--coordinator", metavar="HOST:PORT", help="jax.distributed coordinator (multi-process)")
        p.add_argument("--num-processes", type=int, help="number of processes (multi-process runs)")
        p.add_argument("--process-id", type=int, help="this process's index, 0..N-1")


def _add_precision_flag(p) -> None:
    p.add_argument("--precision", choices=("highest", "high", "default"), default="highest",
                   help="float matmul precision: highest (default) keeps OpenInfer's exact f32 numerics; "
                        "high/default allow faster TF32/bf16 paths on GPU/TPU")


def _unroll_arg(text: str):
    """`--unroll auto|none|full|K`: a bad value is a usage error (exit 2)."""
    from .lowering.loops import check_unroll  # deferred: JAX
    try:
        return check_unroll(text)
    except OiError as exc:
        raise argparse.ArgumentTypeError(exc.diagnostics[0].message) from None


def _add_unroll_flag(p) -> None:
    p.add_argument("--unroll", type=_unroll_arg, default="auto", metavar="auto|none|full|K",
                   help="how loops lower (docs/loops.md): auto (default: layer loops unrolled on GPU/TPU within a "
                        "size budget, loops kept on CPU), none (always a loop), full (every loop with a static trip "
                        "count unrolled), K (partial unroll by K)")


def _add_model_flags(p) -> None:
    p.add_argument("--model", help="the .oinf model (default: GRAPH with .oinf beside the graph, when it exists)")
    p.add_argument("--no-model", action="store_true", help="use no model, even when GRAPH.oinf exists")


def _add_zero_flag(p, run: bool = False) -> None:
    p.add_argument("--zero-missing-inputs", action="store_true",
                   help=("run even if an input the graph reads is not given and has no model tensor or @init, or a "
                         "constant has no model tensor or @init" if run else
                         "let a constant with no model tensor and no @init be zeros") +
                        " (OpenInfer's zero-filled default); without it that is an error")
    _add_widen_flag(p)


def _add_widen_flag(p) -> None:
    p.add_argument("--widen-floats", action="store_true",
                   help="let a constant declared f32 read a bf16/f16 model tensor as its exact f32 values (an f32 "
                        "graph on a bf16 checkpoint's conversion); without it that is a dtype mismatch")
    _add_table_dtype_flag(p)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="oi2jax", description="Compile OpenInfer graphs (.oi) to JAX.")
    p.add_argument("--version", action="version", version=f"oi2jax {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("check", help="validate a graph (and its model)")
    c.add_argument("graph", help="the graph: a .oi file or an OpenInfer graph .json")
    _add_model_flags(c)
    c.add_argument("--size", action="append", metavar="NAME=INT", help="set a size variable (repeatable)")
    _add_ops_flag(c)
    _add_widen_flag(c)
    c.set_defaults(func=cmd_check)

    f = sub.add_parser("fmt", help="pretty-print a graph canonically")
    f.add_argument("graph", help="the .oi file")
    f.add_argument("--check", action="store_true", help="exit 1 if the file is not formatted")
    f.add_argument("-i", dest="in_place", action="store_true", help="rewrite the file in place")
    _add_ops_flag(f)
    f.set_defaults(func=cmd_fmt)

    i = sub.add_parser("inspect", help="list a model's size variables, metadata and tensors")
    i.add_argument("model", help="the .oinf file")
    i.set_defaults(func=cmd_inspect)

    r = sub.add_parser("run", help="run a graph for N steps")
    r.add_argument("graph", help="the graph: a .oi file or an OpenInfer graph .json")
    _add_model_flags(r)
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="a dynamic variable's value, the same every step (repeatable)")
    r.add_argument("--size", action="append", metavar="NAME=INT", help="set a size variable (repeatable)")
    r.add_argument("--steps", type=int, default=None,
                   help="number of steps (default: 1, or the length of --inputs-per-step)")
    r.add_argument("--inputs-per-step", metavar="FILE.npz",
                   help="one value per step: arrays with a leading step axis [N, ...] (steps fused in one loop)")
    r.add_argument("--collect", action="append", metavar="NAME[,NAME...]",
                   help="write every step's value of these variables to --out, stacked [steps, ...]")
    r.add_argument("--feedback", action="append", metavar="INPUT=OUTPUT",
                   help="once INPUT's per-step values run out, each step takes INPUT from the previous step's "
                        "OUTPUT, inside the fused loop (generation: --feedback token=next; repeatable)")
    r.add_argument("--stop", action="append", metavar="OUTPUT=ID[,ID...]",
                   help="end the run after the step whose OUTPUT is one of the ids, inside the fused loop (that "
                        "step kept; --steps is the budget), e.g. --stop next=2,32000 (repeatable)")
    r.add_argument("--show", action="append", metavar="all|NAME[,NAME...]",
                   help="what to print (default: the collected variables, else the volatile ones, and the "
                        "scalars; not whole caches)")
    r.add_argument("--stats", action="store_true",
                   help="print one line on stderr: compile time, first step, steady steps/s")
    r.add_argument("--state-in", metavar="S.npz", help="start from this saved state (--state-out / --out)")
    r.add_argument("--state-out", metavar="S.npz", help="save the state after the last step (resume with --state-in)")
    r.add_argument("--out", help="write every variable after the last step to this .npz (exactly this path)")
    _add_zero_flag(r, run=True)
    r.add_argument("--device", choices=("cpu", "gpu", "tpu"), help="where to run (default: JAX's default)")
    r.add_argument("--interpret", action="store_true", help="use the reference interpreter")
    r.add_argument("--trace", action="store_true", help="print a trace (per node interpreted, per kernel compiled)")
    r.add_argument("--trace-json", metavar="FILE", help="write the trace events as JSON")
    r.add_argument("--quiet", action="store_true", help="print no values and no progress bar")
    r.add_argument("--build", choices=("sequential", "concurrent"), default="concurrent",
                   help="compile the driver's kernels all first, or on a thread pool while running")
    r.add_argument("--schedule", choices=("dataflow", "linear"), default="dataflow",
                   help="yield/await consumers from a ready queue, or in a fixed order (debugging)")
    r.add_argument("--batch-var", metavar="SIZEVAR",
                   help="run inputs longer than this size variable in chunks of it (auto-detected)")
    r.add_argument("--explain-recompiles", action="store_true",
                   help="report every compilation of the step and why it happened")
    _add_sharding_flags(r, distributed=True)
    _add_precision_flag(r)
    _add_kernels_flag(r)
    _add_unroll_flag(r)
    _add_cache_flag(r)
    _add_ops_flag(r)
    r.set_defaults(func=cmd_run)

    k = sub.add_parser("compile", help="lower a graph and print jaxpr / StableHLO / HLO")
    k.add_argument("graph", help="the graph: a .oi file or an OpenInfer graph .json")
    _add_model_flags(k)
    k.add_argument("--size", action="append", metavar="NAME=INT", help="set a size variable (repeatable)")
    k.add_argument("--emit", choices=EMIT_KINDS, default="stablehlo", help="what to print (default: stablehlo)")
    k.add_argument("-o", dest="output", help="write to this file instead of stdout")
    k.add_argument("--dump-dir", help="also write the step program and each block's kernel here")
    k.add_argument("--device", choices=("cpu", "gpu", "tpu"), help="the platform to compile for")
    _add_zero_flag(k)
    _add_sharding_flags(k, distributed=False)
    _add_precision_flag(k)
    _add_kernels_flag(k)
    _add_unroll_flag(k)
    _add_cache_flag(k)
    _add_ops_flag(k)
    k.set_defaults(func=cmd_compile)

    e = sub.add_parser("export", help="write the step as a serialized jax.export artifact + manifest")
    e.add_argument("graph", help="the graph: a .oi file or an OpenInfer graph .json")
    _add_model_flags(e)
    e.add_argument("--size", action="append", metavar="NAME=INT", help="set a size variable (repeatable)")
    e.add_argument("-o", dest="output", required=True, metavar="STEP.jaxexport",
                   help="the artifact to write (plus STEP.jaxexport.json and .init.npz beside it)")
    e.add_argument("--symbolic", action="append", metavar="SIZEVAR",
                   help="export with this size variable as a symbolic dimension (repeatable, or B,T)")
    e.add_argument("--platforms", metavar="cpu,cuda,...", help="lowering platforms (default: the current backend)")
    _add_zero_flag(e)
    _add_unroll_flag(e)
    _add_ops_flag(e)
    e.set_defaults(func=cmd_export)

    g = sub.add_parser("graph", help="draw the control-flow graph (DOT; SVG/PNG with Graphviz)")
    g.add_argument("graph", help="the graph: a .oi file or an OpenInfer graph .json")
    _add_model_flags(g)
    g.add_argument("--size", action="append", metavar="NAME=INT", help="set a size variable (repeatable)")
    g.add_argument("-o", dest="output", metavar="cfg.svg|cfg.png|cfg.dot", help="default: DOT on stdout")
    _add_ops_flag(g)
    g.set_defaults(func=cmd_graph)

    add_model_commands(sub)
    return p


from ._signals import INTERRUPTED as _INTERRUPTED, catching as _catching, install as _install_signals, \
    restore as _restore_signals


class _ClosedStdout(io.TextIOBase):
    """sys.stdout when the process started with it closed (`oi2jax fmt g.oi >&-`: Python sets None):
    a command that prints fails as any unwritable output does, one that writes files goes on."""

    def write(self, text):
        raise OSError(errno.EBADF, "standard output is closed: nowhere to print")


def main(argv: list[str] | None = None) -> int:
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()
    previous = _install_signals()
    try:
        try:
            with _catching():  # the handler raises KeyboardInterrupt only in here (oi2jax/_signals.py)
                args = build_parser().parse_args(argv)
                code = _dispatch(args)
        except KeyboardInterrupt:
            _INTERRUPTED.append(signal.SIGINT)
            code = 0
        if _INTERRUPTED:  # also when a library callback caught the KeyboardInterrupt and carried on
            _INTERRUPTED.clear()
            if code != 130:
                print("error: interrupted", file=sys.stderr)
            return 130
        return code
    finally:
        _restore_signals(previous)


def _dispatch(args) -> int:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", OiNote)
            shown = warnings.showwarning

            def show(message, category, *rest, **kw):
                if issubclass(category, OiNote):
                    print(f"note: {message}", file=sys.stderr)
                else:
                    shown(message, category, *rest, **kw)
            warnings.showwarning = show
            return args.func(args)
    except OiError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `oi2jax inspect m.oinf | head`: the reader left; nothing to report
        try:
            sys.stdout = open(os.devnull, "w")  # no second error while flushing at exit
        except OSError:
            pass
        return 0
    except OSError as exc:  # a path the user gave cannot be read or written
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        _INTERRUPTED.clear()
        return 130
    except Exception as exc:  # an oi2jax bug: still no traceback for the user
        if _INTERRUPTED:  # a library turned the interrupt into another error (an import, say)
            print("error: interrupted", file=sys.stderr)
            _INTERRUPTED.clear()
            return 130
        from .limits import allocation_error  # deferred: JAX
        oom = allocation_error(exc, "memory for the program's values")
        if oom is not None:  # host MemoryError or the device's RESOURCE_EXHAUSTED: not a bug
            print(oom.render(), file=sys.stderr)
            return 1
        if os.environ.get("OI2JAX_DEBUG"):
            raise
        print(f"error: internal error ({type(exc).__name__}: {exc}); rerun with OI2JAX_DEBUG=1 for details",
              file=sys.stderr)
        return 1
