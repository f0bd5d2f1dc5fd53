"""Writing a benchmark's markdown report: one place for the file name and the atomic write."""
from __future__ import annotations

from pathlib import Path

import jax

from oi2jax.npz import write_text_atomic


def write_report(out_dir: Path, stem: str, text: str) -> Path:
    """`text` to out_dir/STEM.md, or STEM-gpu.md when JAX's default device is not the CPU, written
    atomically; the text printed too. Returns the path."""
    gpu = jax.devices()[0].platform != "cpu"
    path = Path(out_dir) / f"{stem}{'-gpu' if gpu else ''}.md"
    write_text_atomic(path, text)
    print(text)
    return path
