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

__all__ = ["BLOCK_TYPES", "UNPACKED_TYPES", "HALF_KINDS", "META_PREFIX", "QUANTIZE_TYPES", "KeptBlocks", "AFFINE", "meta_key",
           "block_layout", "ggml_stored_shape", "ggml_logical_shape", "dequantize", "nonfinite_counts", "quantize"]

# the block-quantized types gguf.quants dequantizes, which an .oinf keeps as raw blocks
BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# of those, the types no packed kernel reads (oi2jax/quantized): a compiled program places their f32 values
UNPACKED_TYPES = ("Q2_K", "Q3_K")
META_PREFIX = "ggml_type."
# the types `quantize` writes (convert-hf --quantize): gguf.quants' quantizers, and Q4_K / Q6_K here
QUANTIZE_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K")
# a bf16 / f16 matrix widened for an f32 declaration, held as its bytes where the program's kernels
# are ggml's (`BoundGraph.kept_blocks(..., half=True)`): its dtype -> the ggml type of those bytes
HALF_KINDS = {"bf16": "BF16", "f16": "F16"}
AFFINE = "AFFINE"  # KeptBlocks / QuantTensor kind of stored integers with v2 QuantParams (oi2jax.quantized)


@dataclass(frozen=True, eq=False)
class KeptBlocks:
    """The bound value of a float constant (or a stacked prefix-table family) whose model tensor
    is kept as GGML blocks: `raw` (uint8, GGUF's bytes, row-major over the blocks of the last axis)
    of ggml type `kind` and logical `shape`. A compiled program places it as its packed form
    (oi2jax/quantized: `prepare`), never dequantized; the interpreter reads its values. Also a
    bf16/f16 matrix a kernels="ggml" program holds as its bytes (`HALF_KINDS`: one value a block),
    and (kind `AFFINE`) an i8/u8 tensor with v2 QuantParams read by an f32 declaration: `raw` its
    stored integers [*shape], `affine` its (scale f32, zero point i32) broadcast against them
    (model/quant `affine_parts`)."""

    kind: str
    raw: np.ndarray
    shape: tuple
    affine: tuple | None = None

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes) + sum(int(a.nbytes) for a in self.affine or ())


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


# the byte offsets of each kept type's f16 block scales (d; and m / dmin where it has one), in
# gguf.quants' block layouts: a block's values are finite exactly when these are (the rest are
# small integers), so a file's NaN/Inf weights are found without dequantizing every block
_SCALE_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82),
                  "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def nonfinite_counts(kind: str, raw: np.ndarray) -> tuple[int, int]:
    """(NaN count, infinite count) of the values of `kind` blocks `raw` (uint8, whole blocks): the
    blocks whose f16 scales are not finite, and only those, dequantized (`gguf.quants`)."""
    _, size = block_layout(kind)
    rows = np.asarray(raw, dtype=np.uint8).reshape(-1, size)
    bad = np.zeros(len(rows), bool)
    for offset in _SCALE_OFFSETS[kind]:
        bad |= ~np.isfinite(np.ascontiguousarray(rows[:, offset:offset + 2]).view(np.float16)[:, 0])
    if not bad.any():
        return 0, 0
    from gguf import quants  # deferred: as in dequantize
    from gguf.constants import GGMLQuantizationType  # deferred: as above
    with np.errstate(all="ignore"):
        values = quants.dequantize(rows[bad], GGMLQuantizationType[kind])  # (a row of blocks each)
    return int(np.count_nonzero(np.isnan(values))), int(np.count_nonzero(np.isinf(values)))


def dequantize(kind: str, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 values of `kind` blocks `raw` (uint8, any shape holding the right byte count)
    with logical `shape`: exactly `gguf.quants.dequantize`."""
    stored = ggml_stored_shape(kind, tuple(shape))
    rows = np.asarray(raw, dtype=np.uint8).reshape(stored)
    if rows.size == 0:  # no blocks (a dim of 0): gguf.quants cannot reshape an empty array
        return np.zeros(tuple(shape), np.float32)
    from gguf import quants  # deferred: gguf (30 ms with YAML), for kept blocks only
    from gguf.constants import GGMLQuantizationType  # deferred: as above
    with np.errstate(all="ignore"):  # an inf/NaN scale gives inf/NaN values (the converter's --nonfinite
        out = quants.dequantize(rows, GGMLQuantizationType[kind])  # says so), not NumPy's RuntimeWarning
    assert out.shape == tuple(shape), (out.shape, shape)
    return np.asarray(out, dtype=np.float32)


def quantize(kind: str, values: np.ndarray) -> np.ndarray:
    """float32 [..., n] (n a whole number of `kind` blocks) -> its `kind` blocks, u8 [..., row_bytes]
    (`ggml_stored_shape`): gguf.quants.quantize for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (llama.cpp's
    reference quantizers); gguf-py has no K-quant quantizer, so Q4_K and Q6_K are plain
    round-to-nearest ones here (llama.cpp's own search for better scales gives other values)."""
    if kind not in QUANTIZE_TYPES:
        raise OiError(f"cannot quantize to {kind!r}: one of {', '.join(QUANTIZE_TYPES)}")
    values = np.asarray(values, dtype=np.float32)
    stored = ggml_stored_shape(kind, values.shape)
    rows = values.reshape(-1, values.shape[-1])
    if kind == "Q4_K":
        out = _quantize_q4_k(rows)
    elif kind == "Q6_K":
        out = _quantize_q6_k(rows)
    else:
        from gguf import quants  # deferred: gguf (30 ms with YAML), for kept blocks only
        from gguf.constants import GGMLQuantizationType  # deferred: as above
        out = quants.quantize(rows, GGMLQuantizationType[kind])
    return np.ascontiguousarray(out, dtype=np.uint8).reshape(stored)


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b, 0 where b is 0 (an all-zero group)."""
    return np.divide(a, b, out=np.zeros(np.broadcast_shapes(a.shape, b.shape), np.float32), where=b > 0)


def _quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> Q4_K blocks (ggml-common.h's block_q4_K: f16 d, f16 dmin, 12 bytes of
    6-bit scales and mins, 128 of nibbles): per 32-value sub-block, scale (max - min) / 15 and
    offset -min, both 6-bit multiples of the block's two f16 scales."""
    rows, cols = x.shape
    sub = x.reshape(rows, cols // 256, 8, 32)
    lo = np.minimum(sub.min(axis=-1), 0)
    scale = (sub.max(axis=-1) - lo) / 15
    d = (scale.max(axis=-1) / 63).astype(np.float16)
    dmin = (lo.min(axis=-1) / -63).astype(np.float16)
    df, dminf = d.astype(np.float32)[..., None], dmin.astype(np.float32)[..., None]
    sc = np.clip(np.round(_ratio(scale, df)), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(_ratio(-lo, dminf)), 0, 63).astype(np.uint8)
    q = np.clip(np.round(_ratio(sub + (dminf * mn)[..., None], (df * sc)[..., None])), 0, 15).astype(np.uint8)
    packed = np.zeros((rows, cols // 256, 12), np.uint8)  # get_scale_min_k4's layout
    packed[..., 0:4] = sc[..., 0:4] | ((sc[..., 4:8] >> 4) << 6)
    packed[..., 4:8] = mn[..., 0:4] | ((mn[..., 4:8] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:8] & 15) | ((mn[..., 4:8] & 15) << 4)
    nibbles = q.reshape(rows, cols // 256, 4, 2, 32)  # 64 values a chunk: sub-block 2c low, 2c+1 high
    qs = (nibbles[:, :, :, 0] | (nibbles[:, :, :, 1] << 4)).reshape(rows, cols // 256, 128)
    blocks = np.concatenate([d[..., None].view(np.uint8), dmin[..., None].view(np.uint8), packed, qs], axis=-1)
    return blocks.reshape(rows, cols // 256 * 144)


def _quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> Q6_K blocks (block_q6_K: 128 bytes of low nibbles, 64 of high bit
    pairs, 16 int8 scales, f16 d): per 16-value group, scale max |x| / 31, an int8 multiple of d;
    q + 32 in 0..63. Value r of a 128-value half: low nibble r // 64 of ql[r % 64], bits
    2 (r // 32) of qh[r % 32]."""
    rows, cols = x.shape
    n = rows * (cols // 256)
    groups = x.reshape(n, 16, 16)
    scale = np.abs(groups).max(axis=-1) / 31
    d = (scale.max(axis=-1) / 127).astype(np.float16)
    sc = np.clip(np.round(_ratio(scale, d.astype(np.float32)[:, None])), 0, 127).astype(np.int8)
    step = d.astype(np.float32)[:, None, None] * sc.astype(np.float32)[..., None]
    q = (np.clip(np.round(_ratio(groups, step)), -32, 31) + 32).astype(np.uint8).reshape(n, 2, 128)
    lo, hi = q & 15, q >> 4
    ql = lo[..., :64] | (lo[..., 64:] << 4)
    qh = hi[..., 0:32] | (hi[..., 32:64] << 2) | (hi[..., 64:96] << 4) | (hi[..., 96:128] << 6)
    blocks = np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), d[:, None].view(np.uint8)],
                            axis=-1)
    return blocks.reshape(rows, cols // 256 * 210)
