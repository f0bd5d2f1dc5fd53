"""Build the `.oinf` model of every example program with oi2jax's own writer.

    python examples/models.py                     # all ten, into examples/<name>.oinf
    python examples/models.py --out-dir /tmp/m mlp_regression kv_cache_decode

Each model has the same size variables, tensor names, dtypes and shapes as the
OpenInfer reference model of the same name (SPEC §9, `shared/openinfer/models/`);
the weights are random but deterministic (one fixed seed per example), so the files
are reproducible byte for byte.
"""
from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(HERE.parent))


def _dense(rng: np.random.Generator, fan_in: int, fan_out: int) -> np.ndarray:
    return (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)


def _bias(rng: np.random.Generator, n: int) -> np.ndarray:
    return (0.05 * rng.standard_normal(n)).astype(np.float32)


def _cache_window_slice(rng):
    sizes = {"D": 8}
    return sizes, {"limit": np.array(6, np.int32), "zero": np.array(0, np.int32)}


def _kv_cache_decode(rng):
    sizes = {"D": 16}
    return sizes, {"zero": np.zeros(16, np.float32)}


def _linear_attention(rng):
    sizes = {"B": 4, "D": 32, "num_heads": 2}
    d = sizes["D"]
    tensors = {}
    for head in range(sizes["num_heads"]):
        for kind in ("wq", "wk", "wv"):
            tensors[f"attn.{kind}.{head}"] = _dense(rng, d, d)
    tensors["w_out"] = _dense(rng, d, d)
    return sizes, tensors


def _mlp_regression(rng):
    sizes = {"B": 4, "D": 16, "H": 32, "O": 8}
    return sizes, {
        "w1": _dense(rng, 16, 32),
        "b1": _bias(rng, 32),
        "w2": _dense(rng, 32, 8),
        "b2": _bias(rng, 8),
    }


def _moe_routing(rng):
    sizes = {"B": 4, "D": 16, "O": 8}
    return sizes, {
        "w_gate": _dense(rng, 16, 2),
        "w0": _dense(rng, 16, 8),
        "b0": _bias(rng, 8),
        "w1": _dense(rng, 16, 8),
        "b1": _bias(rng, 8),
    }


def _online_weight_update(rng):
    sizes = {"B": 4, "D": 16, "O": 8}
    return sizes, {"zero": np.zeros((16, 8), np.float32)}


def _quantized_linear(rng):
    from oi2jax.model import Tensor
    sizes = {"B": 4, "D": 16, "O": 8}
    return sizes, {
        "x": Tensor("i4", rng.integers(-8, 8, size=(4, 16)).astype(np.int8)),
        "w": Tensor("i4", rng.integers(-8, 8, size=(16, 8)).astype(np.int8)),
    }


def _residual_mlp_stack(rng):
    sizes = {"B": 4, "D": 32, "num_layers": 3}
    d = sizes["D"]
    tensors = {"bias0": np.zeros(d, np.float32)}
    for layer in range(sizes["num_layers"]):
        tensors[f"res.mlp.w.{layer}"] = _dense(rng, d, d)
        tensors[f"res.mlp.b.{layer}"] = _bias(rng, d)
    return sizes, tensors


def _stability_guard(rng):
    sizes = {"B": 4, "D": 16}
    return sizes, {"bias": _bias(rng, 16)}


def _streaming_pipeline(rng):
    sizes = {"B": 4, "D": 16}
    return sizes, {"w": _dense(rng, 16, 16), "bias": _bias(rng, 16)}


BUILDERS = {
    "cache_window_slice": _cache_window_slice,
    "kv_cache_decode": _kv_cache_decode,
    "linear_attention": _linear_attention,
    "mlp_regression": _mlp_regression,
    "moe_routing": _moe_routing,
    "online_weight_update": _online_weight_update,
    "quantized_linear": _quantized_linear,
    "residual_mlp_stack": _residual_mlp_stack,
    "stability_guard": _stability_guard,
    "streaming_pipeline": _streaming_pipeline,
}
NAMES = tuple(BUILDERS)


def seed(name: str) -> int:
    """The example's fixed seed (stable across Python runs, unlike hash())."""
    return zlib.crc32(name.encode())


def contents(name: str) -> tuple[dict, dict]:
    """(sizevars, tensors) of the example's model; deterministic."""
    if name not in BUILDERS:
        raise KeyError(f"unknown example '{name}' (known: {', '.join(NAMES)})")
    return BUILDERS[name](np.random.default_rng(seed(name)))


def build(name: str, path: str | Path | None = None) -> Path:
    """Write example `name`'s model to `path` (default examples/<name>.oinf); returns the path."""
    from oi2jax.model import save
    path = Path(path) if path is not None else HERE / f"{name}.oinf"
    sizevars, tensors = contents(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    save(str(path), sizevars=sizevars, metadata={}, tensors=tensors)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Build the example models (.oinf).")
    p.add_argument("names", nargs="*", help=f"examples to build (default: all): {', '.join(NAMES)}")
    p.add_argument("--out-dir", type=Path, default=HERE, help="output folder (default: examples/)")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in BUILDERS]
    if unknown:
        p.error(f"unknown example(s): {', '.join(unknown)} (known: {', '.join(NAMES)})")
    for name in args.names or NAMES:
        path = build(name, args.out_dir / f"{name}.oinf")
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
