"""`oi2jax` command line: check, fmt, inspect, run, compile.

Exit codes: 0 success, 1 user error (diagnostics printed), 2 usage error. Never a traceback
(set OI2JAX_DEBUG=1 to see one for an internal error).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .diagnostics import OiError

EMIT_KINDS = ("jaxpr", "stablehlo", "hlo", "optimized-hlo", "graph-json")


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 on usage errors; keep that, without a traceback
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _sizes(pairs: list[str] | None) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--size expects NAME=INT, got '{pair}'")
        try:
            sizes[name] = int(value)
        except ValueError:
            raise UsageError(f"--size {name}: '{value}' is not an integer") from None
        if sizes[name] < 0:
            raise UsageError(f"--size {name}: size must be non-negative, got {value}")
    return sizes


def _default_model(graph: str, model: str | None) -> str | None:
    """`--model` defaults to `<graph>.oinf` next to the graph when that file exists."""
    if model is not None:
        return model
    candidate = Path(graph).with_suffix(".oinf")
    return str(candidate) if candidate.exists() and Path(graph).suffix == ".oi" else None


def _load_graph(path: str):
    from .grammar.parse import parse_file
    return parse_file(path)


def cmd_check(args) -> int:
    from .check import check
    from .model import open_model
    graph = _load_graph(args.graph)
    model = open_model(args.model) if args.model else None
    diagnostics = check(graph, model=model, sizes=_sizes(args.size))
    for d in diagnostics:
        print(d.render(graph.source), file=sys.stderr)
    return 1 if any(d.severity == "error" for d in diagnostics) else 0


def cmd_fmt(args) -> int:
    from .grammar.fmt import format_graph
    graph = _load_graph(args.graph)
    text = format_graph(graph)
    if args.check:
        if text != graph.source:
            print(f"{args.graph}: would be reformatted", file=sys.stderr)
            return 1
        return 0
    if args.in_place:
        Path(args.graph).write_text(text)
        return 0
    sys.stdout.write(text)
    return 0


def cmd_inspect(args) -> int:
    from .model import open_model
    from .model.inspect import render_model
    print(render_model(open_model(args.model)))
    return 0


def _load_inputs(pairs: list[str] | None) -> dict:
    import numpy as np
    inputs = {}
    for pair in pairs or []:
        name, sep, file = pair.partition("=")
        if not sep or not name or not file:
            raise UsageError(f"--input expects NAME=FILE.npy, got '{pair}'")
        try:
            inputs[name] = np.load(file, allow_pickle=False)
        except FileNotFoundError:
            raise OiError(f"input file not found: {file}") from None
        except Exception as exc:  # corrupt .npy
            raise OiError(f"cannot read input {name} from {file}: {exc}") from None
    return inputs


def cmd_run(args) -> int:
    import numpy as np
    from . import api
    if args.steps < 0:
        raise UsageError("--steps must be >= 0")
    program = api.compile(args.graph, model=_default_model(args.graph, args.model), sizes=_sizes(args.size),
                          device=args.device, mode="interpret" if args.interpret else "compiled")
    outputs = program.run(_load_inputs(args.input), steps=args.steps)
    if args.out:
        np.savez(args.out, **outputs)
    if not args.quiet:
        for name, value in outputs.items():
            print(f"{name}: {value.dtype}{list(value.shape)}")
            print(np.array2string(value, threshold=64, edgeitems=3, precision=5))
    return 0


def cmd_compile(args) -> int:
    from . import api
    program = api.compile(args.graph, model=_default_model(args.graph, args.model), sizes=_sizes(args.size),
                          device=args.device)
    text = program.emit(args.emit)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="oi2jax", description="Compile OpenInfer graphs (.oi) to JAX.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("check", help="validate a graph (and its model)")
    c.add_argument("graph")
    c.add_argument("--model")
    c.add_argument("--size", action="append", metavar="NAME=INT")
    c.set_defaults(func=cmd_check)

    f = sub.add_parser("fmt", help="pretty-print a graph canonically")
    f.add_argument("graph")
    f.add_argument("--check", action="store_true", help="exit 1 if the file is not formatted")
    f.add_argument("-i", dest="in_place", action="store_true", help="rewrite the file in place")
    f.set_defaults(func=cmd_fmt)

    i = sub.add_parser("inspect", help="list a model's size variables, metadata and tensors")
    i.add_argument("model")
    i.set_defaults(func=cmd_inspect)

    r = sub.add_parser("run", help="run a graph for N steps")
    r.add_argument("graph")
    r.add_argument("--model")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    r.add_argument("--size", action="append", metavar="NAME=INT")
    r.add_argument("--steps", type=int, default=1)
    r.add_argument("--out")
    r.add_argument("--device", choices=("cpu", "gpu", "tpu"))
    r.add_argument("--interpret", action="store_true", help="use the reference interpreter")
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(func=cmd_run)

    k = sub.add_parser("compile", help="lower a graph and print jaxpr / StableHLO / HLO")
    k.add_argument("graph")
    k.add_argument("--model")
    k.add_argument("--size", action="append", metavar="NAME=INT")
    k.add_argument("--emit", choices=EMIT_KINDS, default="stablehlo")
    k.add_argument("-o", dest="output")
    k.add_argument("--device", choices=("cpu", "gpu", "tpu"))
    k.set_defaults(func=cmd_compile)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except OiError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # an oi2jax bug: still no traceback for the user
        if os.environ.get("OI2JAX_DEBUG"):
            raise
        print(f"error: internal error ({type(exc).__name__}: {exc}); rerun with OI2JAX_DEBUG=1 for details",
              file=sys.stderr)
        return 1
