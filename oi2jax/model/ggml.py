"""GGML block-quantized tensors kept in an `.oinf` file (docs/models.md, docs/semantics.md).

A GGUF tensor of a quantized type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K) is stored unchanged:
an `.oinf` `u8` tensor of shape `[*logical[:-1], row_bytes]` holding GGUF's raw blocks, row-major
over ne0 (the logical last dim) exactly as in the GGUF file, plus one string metadata entry
`ggml_type.<tensor name>` naming its type. The logical shape follows from the stored one:
`row_bytes / type_size * block_size` values per row. OpenInfer's v2 QuantParams (one scale and
zero point per tensor or per axis) cannot describe these nested block scales, hence the extension.

    ggml_stored_shape("Q4_K", (64, 256)) == (64, 144)
    dequantize("Q4_K", raw_u8, (64, 256))  # exactly gguf.quants.dequantize, as float32
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..diagnostics import OiError

__all__ = ["BLOCK_TYPES", "META_PREFIX", "KeptBlocks", "meta_key", "block_layout", "ggml_stored_shape",
           "ggml_logical_shape", "dequantize"]

# the block-quantized types gguf.quants dequantizes, which an .oinf keeps as raw blocks
BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
META_PREFIX = "ggml_type."


@dataclass(frozen=True, eq=False)
class KeptBlocks:
    """The bound value of a float constant (or a stacked prefix-table family) whose model tensor
    is kept as GGML blocks: `raw` (uint8, GGUF's bytes, row-major over the blocks of the last axis)
    of ggml type `kind` and logical `shape`. A compiled program places it as its packed form
    (oi2jax/quantized: `prepare`), never dequantized; the interpreter reads its values."""

    kind: str
    raw: np.ndarray
    shape: tuple

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)


def meta_key(tensor: str) -> str:
    """The metadata key that records `tensor`'s GGML type."""
    return META_PREFIX + tensor


def block_layout(kind: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a kept GGML type; OiError for any other name."""
    if kind not in BLOCK_TYPES:
        raise OiError(f"GGML type {kind!r} is not a kept block type (one of {', '.join(BLOCK_TYPES)})")
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # deferred: gguf (30 ms with YAML), for kept blocks only
    return GGML_QUANT_SIZES[GGMLQuantizationType[kind]]


def ggml_stored_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The `u8` shape holding a `kind` tensor of logical `shape` (its last dim a whole number of blocks)."""
    block, size = block_layout(kind)
    if not shape or shape[-1] % block:
        raise OiError(f"a {kind} tensor's last dim must be a multiple of {block}, got shape {list(shape)}")
    return (*shape[:-1], shape[-1] // block * size)


def ggml_logical_shape(kind: str, stored: tuple[int, ...]) -> tuple[int, ...] | None:
    """The logical shape of `kind` blocks stored as `u8[stored]`; None when the row is not a whole
    number of blocks."""
    block, size = block_layout(kind)
    if not stored or stored[-1] % size:
        return None
    return (*stored[:-1], stored[-1] // size * block)


def dequantize(kind: str, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 values of `kind` blocks `raw` (uint8, any shape holding the right byte count)
    with logical `shape`: exactly `gguf.quants.dequantize`."""
    stored = ggml_stored_shape(kind, tuple(shape))
    rows = np.asarray(raw, dtype=np.uint8).reshape(stored)
    from gguf import quants  # deferred: gguf (30 ms with YAML), for kept blocks only
    from gguf.constants import GGMLQuantizationType  # deferred: as above
    out = quants.dequantize(rows, GGMLQuantizationType[kind])
    assert out.shape == tuple(shape), (out.shape, shape)
    return np.asarray(out, dtype=np.float32)
