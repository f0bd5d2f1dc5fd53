"""IR -> JAX. `Program` (program.py) is the entry point; one module per concern:
context (env, guards), blocks (node rules), control (branch, loop), caches, sync
(barrier, dep, yield/await), step (the step function), packing (sub-byte constants)."""
from .program import Program

__all__ = ["Program"]
