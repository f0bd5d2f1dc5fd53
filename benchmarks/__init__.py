"""oi2jax benchmarks: `python -m benchmarks [--quick] [--device gpu]` (see benchmarks/README.md)."""
