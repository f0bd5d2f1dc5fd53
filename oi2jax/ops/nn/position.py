"""nn ops of token positions and ids: the rotary embedding (rope) and the embedding lookup."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ... import dtypes as D
from ... import host_numerics as HN
from ... import quantized
from .. import jax_numerics as N
from ..define import Attr, op
from ..errors import OpTypeError
from ._common import as_f64, float_samples, sample_values

# ====================================================================== rotary embedding


def _rope_shape(shapes, attrs):
    x, pos = shapes[:2]
    if len(x) < 1 or x[-1] % 2 or x[-1] == 0:
        raise OpTypeError(f"op rope: x must end in an even head dimension, got shape {list(x)}", input=0)
    if tuple(pos) != tuple(x[:len(pos)]) or len(pos) >= len(x):
        raise OpTypeError(f"op rope: pos must be one position (shape []) or one per leading row of x "
                          f"(shape {list(x[:1])}, a leading part of {list(x[:-1])}), got shape {list(pos)}", input=1)
    if len(shapes) > 2 and tuple(shapes[2]) != (x[-1] // 2,):
        raise OpTypeError(f"op rope: inv_freq has shape {list(shapes[2])}, expected [{x[-1] // 2}] (one frequency "
                          f"per pair of the head dimension {x[-1]})", input=2)
    return x


def _rope_ref(x, pos, inv_freq=None, theta=10000.0):
    f64 = np.asarray(x).dtype == np.float64
    f = np.float64 if f64 else np.float32
    x = as_f64(x)
    hd = x.shape[-1]
    theta = float(np.asarray(theta, np.float64 if f64 else np.float32))
    inv = HN.default_inv_freq(theta, hd, f64) if inv_freq is None else np.asarray(inv_freq).astype(f)
    pos = np.asarray(pos).reshape(np.shape(pos) + (1,) * (x.ndim - 1 - np.ndim(pos)) + (1,))
    freqs = (f(pos) * inv).astype(np.float64)  # rounded to f32: HF's angles
    emb = np.concatenate([freqs, freqs], axis=-1)
    rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], axis=-1)
    return x * np.cos(emb) + rot * np.sin(emb)


def _rope_samples(rng, d):
    return [((float_samples(rng, d, (2, 8), 1.0), np.array(0, np.int32)), {}),
            ((float_samples(rng, d, (2, 8), 1.0), np.array(5, np.int32)), {}),
            ((float_samples(rng, d, (3, 2, 8), 2.0), np.array(100, np.int64)), {"theta": 500000.0}),
            ((float_samples(rng, d, (4, 6), 1.0), np.array(37, np.uint16)), {"theta": np.array(10000.0, np.float32)}),
            ((float_samples(rng, d, (2, 8), 1.0), np.array(9, np.int32), _inv_freq_samples(rng, d, 4)), {})]


def _inv_freq_samples(rng, d, n):
    """Frequencies of a scaled rope (llama3-like: some divided by 8), in x's dtype."""
    inv = HN.default_inv_freq(10000.0, 2 * n, d == "f64")
    inv[n // 2:] /= 8
    return inv.astype(float_samples(rng, d, (1,), 1.0).dtype)


@op(inputs={"x": "float", "pos": "index", "inv_freq?": "float"}, attrs={"theta": 10000.0}, shape=_rope_shape,
    category="nn", op_set="nn", reference=_rope_ref, samples=_rope_samples)
def rope(x, pos, inv_freq=None, *, theta=10000.0, ctx):
    """Rotary position embedding of x [..., HD] at the integer position `pos`, in Hugging Face Llama's form.

    `pos` is one position (shape []) or one per leading row: x [S, ..., HD] with pos [S] (a prompt's
    S tokens at their own positions; more generally pos's shape is a leading part of x's shape
    without HD), each row rotated at its own position.

    With a third input `inv_freq` [HD/2] (any float dtype, used in f32; e.g. the `rope.inv_freq` tensor convert-hf
    computes for any rope type, default, linear or llama3, as transformers does) those are the
    frequencies and `theta` is unused: freqs = pos * inv_freq in f32 (f64 for f64), then as below.
    Without it:

    inv_freq[i] = 1 / theta^(2i/HD) for i in 0..HD/2-1, computed in f32 as HF does
    (`1.0 / (theta ** (arange(0, HD, 2).float() / HD))`; a literal theta: on the host, each step
    rounded to f32, the power correctly rounded; a variable theta: in the kernel, within an ulp);
    freqs = pos * inv_freq (f32), emb = concat(freqs, freqs),
    out = x * cos(emb) + rotate_half(x) * sin(emb), rotate_half(x) = concat(-x[..., HD/2:], x[..., :HD/2]).
    f64 inputs: everything in f64. f16/bf16: the products in f32, rounded once (HF rounds cos/sin to
    x's dtype first and rounds each product: results can differ by an ulp). pos 0 is the identity
    (for finite x)."""
    ct = N.compute_dtype(ctx.dtype)
    hd = x.shape[-1]
    if inv_freq is not None:
        inv = jnp.asarray(inv_freq).astype(ct)
    elif isinstance(theta, (bool, int, float, np.integer, np.floating)):
        inv = jnp.asarray(HN.default_inv_freq(float(theta), hd, ctx.dtype == "f64"))
    else:
        t = jnp.asarray(theta).astype(ct)
        inv = jnp.asarray(1.0, ct) / t ** (jnp.arange(0, hd, 2).astype(ct) / jnp.asarray(hd, ct))
    pos = jnp.asarray(pos)
    pos = pos.reshape(pos.shape + (1,) * (x.ndim - 1 - pos.ndim) + (1,))
    freqs = pos.astype(ct) * inv
    # the formula above, half by half (both halves of emb are freqs): cos and sin of the HD/2
    # frequencies, with no concatenate around them. Taken of the concatenated emb, XLA:CPU
    # compiled the fused cos/sin table in 150 ms of LLVM time (a prompt program's rope kernels:
    # 268 ms then, 161 ms now; the prompt step's run time unchanged).
    cos, sin = jnp.cos(freqs), jnp.sin(freqs)
    xc = N.to_compute(x, ctx.dtype)
    x1, x2 = xc[..., :hd // 2], xc[..., hd // 2:]
    return N.store(jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1), ctx.out_dtype)


# ====================================================================== embedding lookup


def _embedding_message(v: int) -> str:
    return f"embedding: id {{value}} is outside 0..{v - 1}"


def _embedding_shape(shapes, attrs):
    table, ids = shapes
    if len(table) < 1 or table[0] == 0:
        raise OpTypeError(f"op embedding: table must have rank >= 1 and at least one row, got shape {list(table)}",
                          input=0)
    return tuple(ids) + tuple(table[1:])


def _embedding_ref(table, ids, ctx=None):
    table, ids = np.asarray(table), np.asarray(ids)
    v = table.shape[0]
    bad = (ids < 0) | (ids >= v)
    if bad.any() and ctx is not None:
        ctx.fail_if(np.bool_(True), _embedding_message(v), int(ids.reshape(-1)[np.argmax(bad.reshape(-1))]))
    return table[np.clip(ids, 0, v - 1)]


def _embedding_samples(rng, d):
    table = sample_values(rng, d, (8, 3))
    return [((table, rng.integers(0, 8, size=(2, 3)).astype(np.int32)), {}),
            ((table, np.array([7, 0, 3, 7], np.int64)), {}),
            ((sample_values(rng, d, (5,)), np.array(4, np.uint8)), {}),
            ((table, np.array([1, 9, -2, 9], np.int32)), {})]  # a runtime error: id 9


@op(inputs={"table": "any", "ids": "index"}, shape=_embedding_shape, category="nn", op_set="nn",
    reference=_embedding_ref, samples=_embedding_samples, quantized=("table",))
def embedding(table, ids, *, ctx):
    """Rows of `table` [V, D...] picked by the integer `ids` (any shape S): the result has shape S + [D...].

    Any table dtype (the result has it); ids of any integer dtype, e.g. a variable holding token ids.
    An id outside 0..V-1 is a runtime error of the node naming the first such id ("embedding: id 9
    is outside 0..7"), never clamped silently. A table kept in GGML blocks (docs/models.md) stays
    packed: only the rows picked are dequantized (`quantized.embedding`)."""
    v = table.shape[0]
    ids = jnp.asarray(ids)
    bad = (ids < 0) | (ids >= v)
    if ids.size:
        anybad, first = N.first_true(bad)
        ctx.fail_if(anybad, _embedding_message(v), ids.reshape(-1)[first])
    if isinstance(table, quantized.QuantTensor):
        return quantized.embedding(table, jnp.clip(ids, 0, v - 1))  # kept blocks bind to f32 only
    return jnp.take(table, jnp.clip(ids, 0, v - 1), axis=0, mode="clip")


# ====================================================================== positions


def _positions_shape(shapes, attrs):
    if tuple(shapes[0]) != ():
        raise OpTypeError(f"op positions: start must be one position (shape []), got shape {list(shapes[0])}", input=0)
    shape = tuple(int(s) for s in attrs["shape"])
    if len(shape) != 1 or shape[0] < 1:
        raise OpTypeError(f"op positions: shape must be one positive length [S], got {list(shape)}", attr="shape")
    return shape


def _positions_message(dtype: str, last: int) -> str:
    return f"positions: start {{value}} + {last} is past the largest {dtype}"


def _positions_ref(start, shape, ctx=None):
    start = np.asarray(start)
    n = int(shape[0])
    info = np.iinfo(start.dtype)
    bound = int(info.max) - (n - 1)  # the largest start whose last position fits
    if int(start) > bound and ctx is not None:
        ctx.fail_if(np.bool_(True), _positions_message(start.dtype.name, n - 1), int(start))
    first = max(min(int(start), bound), int(info.min))  # exact integers: no float64 on the way
    wide = np.uint64 if info.min == 0 else np.int64
    return (np.arange(n, dtype=wide) + wide(first)).astype(start.dtype)


def _positions_samples(rng, d):
    d = d if D.get(d).is_int else "i32"  # asked for another dtype's cases (test_user_jit): an index's
    np_dtype, top = D.get(d).np_dtype, int(D.get(d).max)
    return [((np.array(0, np_dtype),), {"shape": (4,)}), ((np.array(9, np_dtype),), {"shape": (1,)}),
            ((np.array(top - 3, np_dtype),), {"shape": (4,)}),  # up to the largest value
            ((np.array(top - 1, np_dtype),), {"shape": (3,)})]  # a runtime error: past it


@op(inputs={"start": "index"}, attrs={"shape": Attr("int_list", required=True)}, shape=_positions_shape,
    category="nn", op_set="nn", reference=_positions_ref, samples=_positions_samples)
def positions(start, *, shape, ctx):
    """The S positions start, start+1, ..., start+S-1 (`shape=[S]`), in start's integer dtype.

    S is a literal or a size name. These are the positions of a step's S tokens after the `start` already cached
    (`rope(q, ps)`, softmax's per-row `valid`). A last position past the dtype's largest value is
    a runtime error of the node, never a wrap."""
    start = jnp.asarray(start)
    n = int(shape[0])
    info = np.iinfo(start.dtype)
    bound = int(info.max) - (n - 1)  # the largest start whose last position fits
    if bound < int(info.min):  # S positions more than the dtype holds: every start fails
        ctx.fail_if(jnp.asarray(True), _positions_message(start.dtype.name, n - 1), start)
        first = jnp.asarray(info.min, start.dtype)
    else:  # compared in start's own dtype (a Python int past i64 would not convert; one below 0 would wrap)
        ctx.fail_if(start > jnp.asarray(bound, start.dtype), _positions_message(start.dtype.name, n - 1), start)
        first = jnp.minimum(start, jnp.asarray(bound, start.dtype))
    return (first + jnp.arange(n, dtype=start.dtype)).astype(start.dtype)
