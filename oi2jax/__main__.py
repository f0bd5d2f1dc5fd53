"""`python -m oi2jax`: the CLI. An interrupt while it is still starting up (importing JAX, say)
is the same one-line `error: interrupted`, exit 130, as one during a run."""
import sys

from ._signals import INTERRUPTED, install

install()  # before anything heavy is imported
try:
    from .cli import main  # deferred: the interrupt handler is installed first (oi2jax/_signals.py)
    code = main()
except KeyboardInterrupt:
    code = None
if code is None or (INTERRUPTED and code != 130):
    print("error: interrupted", file=sys.stderr)
    code = 130
raise SystemExit(code)
