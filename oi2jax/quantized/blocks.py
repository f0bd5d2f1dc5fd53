"""GGML's quantized block formats in JAX: a weight's raw GGUF bytes split once into per-field
arrays (`prepare`), and those fields dequantized to floats (`dequantize`), value for value what
`gguf.quants.dequantize` computes (the same f32 operations in the same order, each product
rounded before the add that follows it: `ops.jax_numerics.no_contract`).

A quantized tensor of logical shape [..., N] (NumPy order: N = GGUF's ne0, the innermost axis) is
stored in a GGUF file as rows of N / block_size blocks, each block `type_size` bytes
(`gguf.GGML_QUANT_SIZES`). `prepare` keeps every byte and adds none but the unpacked 6-bit K-quant
scales (12 bytes become 16 per 256 values): each block's fields become arrays with the block axis
second to last, so a kernel reads aligned planes instead of strided 18- to 210-byte records.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from jax import lax

from ..diagnostics import OiError
from ..ops.jax_numerics import no_contract

QK_K = 256


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class QuantTensor:
    """A GGML-quantized tensor on the device: `fields` (name -> array, each [..., blocks, width]
    or [..., blocks]) with the ggml type `kind` and the logical `shape` as static data."""

    fields: dict
    kind: str = field(metadata={"static": True})
    shape: tuple = field(metadata={"static": True})

    @property
    def nbytes(self) -> int:
        return sum(a.size * a.dtype.itemsize for a in self.fields.values())


@dataclass(frozen=True)
class Format:
    """One ggml type: how its raw block splits into fields (name, byte count, how the bytes
    become the field: None keeps them uint8; a dict names several fields) and how the fields
    dequantize to [..., blocks, block_size]."""

    split: tuple
    decode: Callable


def _half_float(b, dtype):
    """Little-endian byte pairs [..., 2] -> the 16-bit float `dtype` [...]."""
    u = b[..., 0].astype(jnp.uint16) | (b[..., 1].astype(jnp.uint16) << 8)
    return lax.bitcast_convert_type(u, dtype)


def _f16(b):
    return _half_float(b, jnp.float16)


def _bf16(b):
    return _half_float(b, jnp.bfloat16)


def _u16_halves(b):
    """Q5_0/Q5_1's 4 bytes of fifth bits -> fields qh_lo (bits of values 0..15) and qh_hi (16..31),
    uint16 each: the same bytes, in halves a float conversion holds exactly."""
    u = b.astype(jnp.uint16)
    return {"qh_lo": u[..., 0] | (u[..., 1] << 8), "qh_hi": u[..., 2] | (u[..., 3] << 8)}


def _i8(b):
    return lax.bitcast_convert_type(b, jnp.int8)


def _k4_scales(b):
    """Q4_K / Q5_K's 12 bytes of 6-bit scales and mins -> fields sc and m, uint8 [..., 8] each
    (gguf's `Q4_K.get_scale_min`)."""
    d, m, m_d = b[..., 0:4], b[..., 4:8], b[..., 8:12]
    sc = jnp.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = jnp.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return {"sc": sc, "m": mn}


def nibbles(qs):
    """Packed bytes [..., n] -> [..., 2n]: the low nibbles, then the high ones (ggml's order)."""
    return jnp.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fifth_bits(f):
    """Q5_0/Q5_1's fifth bits -> uint8 [..., 32], bit j of the block's value j."""
    shifts = jnp.arange(16, dtype=jnp.uint16)
    return jnp.concatenate([(f["qh_lo"][..., None] >> shifts) & 1, (f["qh_hi"][..., None] >> shifts) & 1],
                           axis=-1).astype(jnp.uint8)


def _f32(a):
    return a.astype(jnp.float32)


def _q8_0(f):
    return _f32(f["qs"]) * _f32(f["d"])[..., None]


def _q4_0(f):
    return _f32(f["d"])[..., None] * _f32(nibbles(f["qs"]).astype(jnp.int8) - 8)


def _q4_1(f):
    return no_contract(_f32(f["d"])[..., None] * _f32(nibbles(f["qs"]))) + _f32(f["m"])[..., None]


def _q5(f):
    return nibbles(f["qs"]) | (_fifth_bits(f) << 4)


def _q5_0(f):
    return _f32(f["d"])[..., None] * _f32(_q5(f).astype(jnp.int8) - 16)


def _q5_1(f):
    return no_contract(_f32(f["d"])[..., None] * _f32(_q5(f))) + _f32(f["m"])[..., None]


def _k_sub(f, q):
    """Q4_K / Q5_K: q [..., blocks, 8, 32] with the per-32 scales and mins -> [..., blocks, 256]."""
    d = (_f32(f["d"])[..., None] * _f32(f["sc"]))[..., None]
    dm = (_f32(f["dmin"])[..., None] * _f32(f["m"]))[..., None]
    return (no_contract(d * _f32(q)) - dm).reshape(q.shape[:-2] + (QK_K,))


def _q4_k_quants(qs):
    """Q4_K's 128 bytes [..., 128] -> [..., 8, 32]: each 32 bytes give 32 low nibbles, then 32 high."""
    qs = qs.reshape(qs.shape[:-1] + (4, 1, 32)) >> jnp.array([0, 4], jnp.uint8).reshape(2, 1)
    return (qs & 0x0F).reshape(qs.shape[:-3] + (8, 32))


def _q4_k(f):
    return _k_sub(f, _q4_k_quants(f["qs"]))


def _q5_k(f):
    qh = f["qh"][..., None, :] >> jnp.arange(8, dtype=jnp.uint8)[:, None]
    return _k_sub(f, _q4_k_quants(f["qs"]) | ((qh & 1) << 4))


def _q6_k(f):
    ql, qh = f["ql"], f["qh"]
    lead = ql.shape[:-1]
    ql = ql.reshape(lead + (2, 1, 64)) >> jnp.array([0, 4], jnp.uint8).reshape(2, 1)
    ql = (ql & 0x0F).reshape(lead + (8, 32))
    qh = qh.reshape(lead + (2, 1, 32)) >> jnp.array([0, 2, 4, 6], jnp.uint8).reshape(4, 1)
    qh = (qh & 0x03).reshape(lead + (8, 32))
    q = ((ql | (qh << 4)).astype(jnp.int8) - 32).reshape(lead + (16, 16))
    d = (_f32(f["d"])[..., None] * _f32(f["scales"]))[..., None]
    return (d * _f32(q)).reshape(lead + (QK_K,))


FORMATS = {
    "Q8_0": Format((("d", 2, _f16), ("qs", 32, _i8)), _q8_0),
    "Q4_0": Format((("d", 2, _f16), ("qs", 16, None)), _q4_0),
    "Q4_1": Format((("d", 2, _f16), ("m", 2, _f16), ("qs", 16, None)), _q4_1),
    "Q5_0": Format((("d", 2, _f16), ("qh", 4, _u16_halves), ("qs", 16, None)), _q5_0),
    "Q5_1": Format((("d", 2, _f16), ("m", 2, _f16), ("qh", 4, _u16_halves), ("qs", 16, None)), _q5_1),
    "Q4_K": Format((("d", 2, _f16), ("dmin", 2, _f16), ("scales", 12, _k4_scales), ("qs", 128, None)), _q4_k),
    "Q5_K": Format((("d", 2, _f16), ("dmin", 2, _f16), ("scales", 12, _k4_scales), ("qh", 32, None),
                    ("qs", 128, None)), _q5_k),
    "Q6_K": Format((("ql", 128, None), ("qh", 64, None), ("scales", 16, _i8), ("d", 2, _f16)), _q6_k),
}
KINDS = tuple(FORMATS)  # the quantized types


def _one_value(f):
    return _f32(f["v"])[..., None]


# bf16 / f16 weights held as their bytes, one value a block (kernels="ggml" on a bf16/f16 model,
# model/ggml.HALF_KINDS: `linear`'s few rows by ggml's row dot product, any other use their exact
# f32 values)
FORMATS.update({"BF16": Format((("v", 2, _bf16),), _one_value), "F16": Format((("v", 2, _f16),), _one_value)})


AFFINE = "AFFINE"  # stored i8/u8 integers with v2 QuantParams (`affine_tensor`): not a GGML type


def affine_decode(f):
    """real = scale * (q - zp) in f32: `model/quant.dequantize`'s values where `affine_parts` kept
    the integers (the difference exact, one rounding of the product, no subnormal)."""
    return no_contract((f["q"].astype(jnp.int32) - f["zp"]).astype(jnp.float32) * f["scale"])


def affine_tensor(q, scale, zp, shape) -> QuantTensor:
    """Stored integers `q` [*shape] (i8/u8) with their scale (f32) and zero point (i32), each
    broadcast against q (model/quant `affine_parts`): an AFFINE `QuantTensor`."""
    return QuantTensor({"q": jnp.asarray(q), "scale": jnp.asarray(scale, jnp.float32),
                        "zp": jnp.asarray(zp, jnp.int32)}, AFFINE, tuple(int(n) for n in shape))


def has_kernels(kind: str) -> bool:
    """Whether a ggml type (a name) has packed kernels here (`prepare`, `raw_tensor`); Q2_K and Q3_K,
    which an .oinf keeps too (model/ggml.BLOCK_TYPES), have none."""
    return kind in FORMATS or kind == AFFINE


def kind_name(kind) -> str:
    """A ggml type given as a name ("Q4_K") or a `gguf.GGMLQuantizationType` -> its name, checked."""
    name = kind.name if isinstance(kind, GGMLQuantizationType) else str(kind).upper()
    if name not in FORMATS:
        raise OiError(f"ggml type {kind!r} has no quantized kernels; supported: {', '.join(KINDS)}")
    return name


def block_size(kind) -> tuple[int, int]:
    """(values per block, bytes per block) of a ggml type."""
    return GGML_QUANT_SIZES[GGMLQuantizationType[kind_name(kind)]]


def raw_nbytes(kind, shape) -> int:
    """Bytes of a tensor of logical `shape` in GGUF's raw layout."""
    per, size = block_size(kind)
    rows = 1
    for n in shape[:-1]:
        rows *= n
    return rows * (shape[-1] // per) * size


def _checked(kind, raw, shape) -> tuple[str, tuple]:
    """(type name, shape as ints) of GGUF's raw bytes of a tensor of logical `shape`, checked: the
    last axis whole blocks, `raw` uint8 holding exactly the tensor's bytes."""
    name = kind_name(kind)
    shape = tuple(int(n) for n in shape)
    per = block_size(name)[0]
    if not shape or shape[-1] % per:
        raise OiError(f"a {name} tensor's last axis must be a multiple of {per}, got shape {list(shape)}")
    if np.dtype(raw.dtype) != np.uint8 or raw.size != raw_nbytes(name, shape):
        raise OiError(f"{name} data of shape {list(shape)} is {raw_nbytes(name, shape)} bytes of uint8, "
                      f"got {raw.size} values of {raw.dtype}")
    return name, shape


def prepare(kind, raw, shape) -> QuantTensor:
    """GGUF's raw bytes of a tensor of logical `shape` (uint8, any shape holding exactly those bytes,
    row-major over the blocks of the last axis) -> a `QuantTensor` of per-field arrays. Pure JAX:
    at load time on host bytes, or inside a jitted function on device bytes."""
    name, shape = _checked(kind, raw, shape)
    return _split(name, shape, raw)


RAW = "raw"  # the one field of a tensor kept as GGUF's raw blocks (`raw_tensor`)


def raw_tensor(kind, raw, shape) -> QuantTensor:
    """GGUF's raw bytes of a tensor of logical `shape` kept as they are, one field `raw` uint8
    [..., row bytes] (the layout ggml's kernels read: `quantized.ggml`); `fields_of` splits them
    inside a step where a pure-JAX kernel needs the fields."""
    name, shape = _checked(kind, raw, shape)
    return QuantTensor({RAW: raw.reshape(shape[:-1] + (raw_nbytes(name, shape[-1:]),))}, name, shape)


def is_raw(q: QuantTensor) -> bool:
    return RAW in q.fields


def fields_of(q: QuantTensor) -> dict:
    """The per-field arrays of `q`: its own, or those of its raw blocks split (inside the step)."""
    if not is_raw(q):
        return q.fields
    raw = q.fields[RAW]
    return _split(q.kind, tuple(raw.shape[:-1]) + tuple(q.shape[-1:]), raw).fields


@functools.partial(jax.jit, static_argnums=(0, 1))
def _split(name: str, shape: tuple, raw) -> QuantTensor:
    """`prepare`'s work, one compiled program per (type, shape): host bytes go to the device once
    and come back as the fields (no op-by-op dispatch over a model's weights)."""
    per, size = block_size(name)
    blocks = raw.reshape(shape[:-1] + (shape[-1] // per, size))
    fields, at = {}, 0
    for field_name, width, convert in FORMATS[name].split:
        part = blocks[..., at:at + width]
        at += width
        value = part if convert is None else convert(part)
        fields.update(value if isinstance(value, dict) else {field_name: value})
    return QuantTensor(fields, name, shape)


def member(q: QuantTensor, pick) -> QuantTensor:
    """The tensor `pick` (a function of one array: its leading axis indexed away, e.g.
    `lambda a: a[3]`) selects from every field of a stacked `q` [n, ...]: one member [...]."""
    return QuantTensor({k: pick(a) for k, a in q.fields.items()}, q.kind, q.shape[1:])


def dequantize_fields(q: QuantTensor):
    """f32 [..., blocks, block_size] of a prepared tensor (any leading rows a gather kept); an
    AFFINE tensor's f32 values."""
    if q.kind == AFFINE:
        return affine_decode(q.fields)
    return FORMATS[q.kind].decode(fields_of(q))


def dequantize(kind, raw, shape, dtype=jnp.float32):
    """The values of a quantized tensor given as GGUF's raw bytes: [*shape] of `dtype` (computed in
    f32, as gguf.quants.dequantize, then rounded once to `dtype`)."""
    return dequantize_prepared(prepare(kind, raw, shape), dtype)


def dequantize_prepared(q: QuantTensor, dtype=jnp.float32):
    lead = next(iter(q.fields.values())).shape[:len(q.shape) - 1]
    return dequantize_fields(q).reshape(lead + (q.shape[-1],)).astype(dtype)
