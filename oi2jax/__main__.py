"""The `oi2jax` command's entry point: `python -m oi2jax` runs this module, and the installed
`oi2jax` script (pyproject's `[project.scripts]`) calls its `main`. Importing it installs the
interrupt handler (oi2jax/_signals.py) before anything else of oi2jax is imported, so an
interrupt at any moment after that -- importing JAX, parsing, compiling, running -- is one line
`error: interrupted` and exit 130. Before it only Python's own start-up and `oi2jax/__init__.py`
(which imports nothing) run: that window is as small as Python allows."""
import sys

from ._signals import INTERRUPTED, catching, install

install()  # first: before anything heavy is imported


def main(argv: list[str] | None = None) -> int:
    try:
        with catching():  # an interrupt is raised only in here (one before: raised once this is entered)
            from .cli import main as cli_main  # deferred: the interrupt handler is installed first (oi2jax/_signals.py)
            code = cli_main(argv)
    except KeyboardInterrupt:
        code = None
    if code is None or (INTERRUPTED and code != 130):
        INTERRUPTED.clear()
        print("error: interrupted", file=sys.stderr)
        code = 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
