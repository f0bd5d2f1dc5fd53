"""IR -> JAX rules. One module per construct, each registering its node rules in `rules.RULES`:
blocks (op, assign, transfer; an op's kernel is traced once per call signature: ops/calls.py),
control (branch, loop), machine (shared branch targets), caches (persistent state, tables), sync
(barrier, dep, yield/await); context (the env and guards a rule reads), state (the step state
pytree, start/merge/commit), step (the step function), subbyte (sub-byte values), locations
(`.oi` locations in dumps). Running the result is `oi2jax.runtime`."""
