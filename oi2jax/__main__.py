"""`python -m oi2jax`: the CLI. An interrupt while it is still starting up (importing JAX, say)
is the same one-line `error: interrupted`, exit 130, as one during a run."""
from ._signals import INTERRUPTED, install

install()  # before anything heavy is imported
try:
    from .cli import main
    code = main()
except KeyboardInterrupt:
    code = None
if code is None or (INTERRUPTED and code != 130):
    import sys
    print("error: interrupted", file=sys.stderr)
    code = 130
raise SystemExit(code)
