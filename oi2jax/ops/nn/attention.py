"""nn op attention: one query row, or S causal rows of a prompt step, over the filled positions of
a K/V cache table, block by block with an online softmax, so that a step reads the positions
filled so far, not the table's capacity."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ...quantized import ggml
from .. import jax_numerics as N
from ..define import Attr, op
from ..errors import OpTypeError
from ..registry import DYNAMIC
from ._common import as_f64, float_attr, float_samples, matmul_precision, static_int


BLOCK = 64  # positions per block of the loop over the filled positions (CPU; `block=` overrides)


def _valid_message(n: int) -> str:
    return f"attention: valid length {{value}} is not in 1..{n}"


def _window_message() -> str:
    return "attention: window {value} is not positive"


def _layer_message(n: int) -> str:
    return f"attention: layer {{value}} is not in 0..{n - 1}"


def _int_scalar(value, attr: str):
    """An integer attribute: a Python int (a literal) or a 0-d integer array (a variable), in its
    own dtype (`N.saturate_i32` makes the index of it)."""
    if isinstance(value, (bool, int, np.integer)):
        return int(value)
    return _int_rows(value, attr, ()).reshape(())


def _int_rows(value, attr: str, rows: tuple[int, ...]):
    """An integer variable holding one value ([] or [1]) or, with `rows` = (S,), one per query row
    ([S]), of shape `rows` (or []: one value for all), in its own dtype: checked as given, never
    cut to 32 bits first (`N.saturate_i32` makes the index of it)."""
    if isinstance(value, (float, np.floating)) or not jnp.issubdtype(value.dtype, jnp.integer):
        raise OpTypeError(f"op attention: {attr} must be an integer, got {getattr(value, 'dtype', type(value).__name__)}",
                          attr=attr)
    shape = tuple(np.shape(value))
    if shape not in ((), (1,), rows):
        raise OpTypeError(f"op attention: {attr} has shape {list(shape)}; it holds one value or one per query row "
                          f"{list(rows)}", attr=attr)
    return jnp.asarray(value).reshape(shape if shape == rows else ())

def _attention_shape(shapes, attrs):
    q, k, v = shapes
    if tuple(k) != tuple(v):
        raise OpTypeError(f"op attention: k {list(k)} and v {list(v)} differ in shape", input=2)
    if len(k) not in (3, 4):
        raise OpTypeError(f"op attention: k must be a table [T, KVH, HD] or a stack of them [L, T, KVH, HD], "
                          f"got shape {list(k)}", input=1)
    kvh, hd = k[-2], k[-1]
    if len(q) not in (2, 3, 4) or q[-3 if len(q) == 4 else 0] != kvh or q[-1] != hd:
        raise OpTypeError(f"op attention: q must be [S, KVH, G, HD] (S rows), [KVH, G, HD] or [KVH, HD] (one row) "
                          f"with KVH={kvh}, HD={hd} of k, got shape {list(q)}", input=0)
    t = k[-3]
    valid = attrs.get("valid")
    if valid is not None and valid is not DYNAMIC and not 1 <= int(valid) <= t:
        raise OpTypeError(f"op attention: valid length {int(valid)} is not in 1..{t}", attr="valid")
    window = attrs.get("window")
    if window is not None and window is not DYNAMIC and int(window) < 1:
        raise OpTypeError(f"op attention: window {int(window)} is not positive", attr="window")
    if attrs.get("block") is not None and static_int(attrs["block"], "attention", "block") < 1:
        raise OpTypeError("op attention: block must be positive", attr="block")
    return q


def _attention_ref(q, k, v, layer=None, valid=None, window=None, scale=1.0, softcap=None, block=64, ctx=None):
    """float64: per query row, the scores of positions [max(n - window, 0), n) of the table
    (n: the row's valid length), scaled, soft-capped, softmax-normalised, times v."""
    q, k, v = as_f64(q), as_f64(k), as_f64(v)
    t = k.shape[-3]
    if q.ndim == 4:  # S rows: each row's own length
        ns = np.broadcast_to(np.asarray(t if valid is None else valid), q.shape[:1])
        bad = [int(x) for x in ns if not 1 <= int(x) <= t]
        if bad and ctx is not None:
            ctx.fail_if(np.bool_(True), _valid_message(t), bad[0])
        return np.stack([_attention_ref(q[i], k, v, layer, np.clip(ns[i], 1, t), window, scale, softcap, block, ctx)
                         for i in range(q.shape[0])])
    n = t if valid is None else int(np.asarray(valid))
    if not 1 <= n <= t and ctx is not None:
        ctx.fail_if(np.bool_(True), _valid_message(t), n)
    n = min(max(n, 0), t)
    lo = 0
    if window is not None:
        w = int(np.asarray(window))
        if w < 1 and ctx is not None:
            ctx.fail_if(np.bool_(True), _window_message(), w)
        lo = min(max(n - w, 0), n)
    if k.ndim == 4:
        li = int(np.asarray(layer))
        if not 0 <= li < k.shape[0] and ctx is not None:
            ctx.fail_if(np.bool_(True), _layer_message(k.shape[0]), li)
        li = min(max(li, 0), k.shape[0] - 1)
        k, v = k[li], v[li]
    qg = q if q.ndim == 3 else q[:, None, :]
    s = np.einsum("kgd,tkd->kgt", qg, k[lo:n]) * float(np.asarray(scale))
    if softcap is not None:
        cap = float(np.asarray(softcap))
        s = np.tanh(s / cap) * cap
    out = np.zeros(qg.shape)
    if n > lo:
        with np.errstate(all="ignore"):
            e = np.exp(s - np.max(s, axis=-1, keepdims=True))
            out = np.einsum("kgt,tkd->kgd", e / np.sum(e, axis=-1, keepdims=True), v[lo:n])
    return out if q.ndim == 3 else out[:, 0, :]


def _attention_samples(rng, d):
    def f(*shape, scale=1.0):
        return float_samples(rng, d, shape, scale)
    def i32(value):
        return np.array(value, np.int32)
    return [((f(2, 4), f(6, 2, 4), f(6, 2, 4)), {"valid": 4, "block": 8}),  # block > T: one block of T
            ((f(3, 2, 3, 4), f(7, 2, 4), f(7, 2, 4)), {"valid": i32([5, 6, 7]), "block": 3, "scale": 0.5}),  # rows
            ((f(2, 3, 4), f(7, 2, 4), f(7, 2, 4)), {"valid": i32(5), "window": i32(3), "block": 2}),  # 2..4
            ((f(1, 2, 4), f(3, 5, 1, 4), f(3, 5, 1, 4)), {"layer": i32(1), "valid": i32(2), "block": 2,
                                                             "softcap": np.array(2.0, np.float32), "scale": 4.0}),
            ((f(1, 2, 4), f(2, 3, 1, 4), f(2, 3, 1, 4)), {"layer": i32(2), "valid": i32(0)})]  # runtime errors


def _valid_rows(shapes, attrs):
    """`valid`'s rows (AttrSpec.rows): one length per query row of q [S, KVH, G, HD], else one."""
    q = shapes[0]
    return ((q[0],), "one per query row of q [S, KVH, G, HD]") if len(q) == 4 else ((1,), "one query row")


@op(inputs={"q": "float", "k": "float", "v": "float"},
    attrs={"layer": Attr("int"), "valid": Attr("int", rows=_valid_rows), "window": Attr("int"), "scale": 1.0,
           "softcap": Attr("float"), "block": Attr("int", static=True)},
    shape=_attention_shape, category="nn", op_set="nn", reference=_attention_ref, samples=_attention_samples)
def attention(q, k, v, *, layer=None, valid=None, window=None, scale=1.0, softcap=None, block=None, ctx):
    """Attention of one query row, or of S rows, over the filled positions of a K/V table.

    An online softmax over blocks of the table.

    A row reads positions max(n - window, 0)..n-1 only: the blocks of `block` positions that hold them.

    q [KVH, G, HD] (one row; query head h = kv head h / G; or [KVH, HD]: G = 1) or [S, KVH, G, HD]
    (S rows: a prompt step's queries, with `valid` one length per row: row i at position p + i
    reads 0..p+i, causal), k and v [T, KVH, HD] (a
    table as `cache.read K[..]` gives it) or [L, T, KVH, HD] with `layer=l` picking table l
    (`cache.read Kc[..]` of a per-layer cache: the kernel slices the blocks out of the whole
    cache, no copy of a layer's table). Per position t: s = (q . k[t]) * scale, soft-capped to
    tanh(s / softcap) * softcap when `softcap` is given; out = sum_t softmax(s)[t] v[t] over the
    read positions. `valid=n` (default T) and `window=W` (default: none) as softmax's: the
    positions n-W..n-1 of the first n. The kernel loops over blocks of b = min(max(block, S), T)
    positions (`block` default 64; on a GPU or TPU without a `block`, b = T: one masked pass over
    the table, since a loop whose trip count is a value costs a host round trip per iteration
    there), ceil(lo / b) .. ceil(n / b) (a `while` when n or W is a variable: its cost grows
    with n, not T; a table of one block, T <= b, is that block's pass without a loop; S rows read
    blocks of at least S positions, so a prompt step's scores take one or a few passes) keeping the running
    maximum, sum and weighted sum (an online softmax; equal to the masked softmax up to
    summation order). S rows share one loop over the blocks any of them reads (from the smallest
    row's start to the largest n), each block's scores computed for all rows at once and masked
    per row: their cost grows with S x (the positions read), not S x T. A block past T is read at T - block, its positions before the block's start
    masked. f16/bf16: computed in f32, rounded once. valid outside 1..T, window < 1 or layer outside
    0..L-1 is a runtime error of the node."""
    ct = N.compute_dtype(ctx.dtype)
    prec = matmul_precision(ctx)
    t, kvh, hd = k.shape[-3:]
    qr = q if q.ndim == 4 else (q if q.ndim == 3 else q[:, None, :])[None]  # [S, KVH, G, HD]
    rows = qr.shape[:1]
    # S rows read blocks of at least S positions: a prompt step's scores in one or a few passes. On an
    # accelerator, without a `block`, one masked pass over the table: a loop whose trip count is a
    # value costs a host round trip per iteration there (docs/performance.md, "Attention on a GPU")
    if block is None:
        b = t if ctx.accelerator else min(max(BLOCK, rows[0]), t)
    else:
        b = min(max(static_int(block, "attention", "block"), rows[0]), t)
    if valid is None or isinstance(valid, (bool, int, np.integer)):
        n = t if valid is None else int(valid)
        if not 1 <= n <= t:
            ctx.fail_if(jnp.asarray(True), _valid_message(t), n)
        n = jnp.full(rows, min(max(n, 0), t), jnp.int32)
    else:
        given = _int_rows(valid, "valid", rows if q.ndim == 4 else ())
        n = N.saturate_i32(given)
        bad = ((n < 1) | (n > t)).reshape(-1)
        anybad, first = N.first_true(bad)
        ctx.fail_if(anybad, _valid_message(t), given.reshape(-1)[first])
        n = jnp.broadcast_to(jnp.clip(n, 0, t), rows)
    lo = jnp.zeros(rows, jnp.int32)
    if window is not None:
        w = _int_scalar(window, "window")
        ctx.fail_if(jnp.asarray(w < 1), _window_message(), w)
        lo = jnp.clip(n - N.saturate_i32(w), 0, n)
    if (k.ndim == 4) != (layer is not None):
        raise OpTypeError("op attention: layer= picks the table of a stacked k/v [L, T, KVH, HD] and is given "
                          "exactly when k has rank 4", attr="layer")
    lead = []
    if k.ndim == 4:
        given = _int_scalar(layer, "layer")
        li = jnp.asarray(N.saturate_i32(given), jnp.int32)
        ctx.fail_if((li < 0) | (li >= k.shape[0]), _layer_message(k.shape[0]), given)
        lead = [N.unfolded_index(jnp.clip(li, 0, k.shape[0] - 1))]  # one kernel for every layer's reads
    qg = N.to_compute(qr, ctx.dtype)
    sc = float_attr(scale, ctx.dtype)
    cap = None if softcap is None else float_attr(softcap, ctx.dtype)

    if (ctx.kernels == "ggml" and not ctx.accelerator and qg.shape[0] == 1 and cap is None and ct == jnp.float32
            and k.dtype == v.dtype and k.dtype in ggml.ATTENTION_TABLES):
        # kernels="ggml": one query row (a decode step's, S=1 included) through the handler that reads
        # each filled K/V row once, in memory order (docs/performance.md, "Attention through ggml")
        out = ggml.attention(qg[0], k, v, lead[0] if lead else 0, lo[0], n[0], sc, 0.0)
        return N.store(out[None] if q.ndim == 4 else out if q.ndim == 3 else out[:, 0, :], ctx.out_dtype)
    # heads first: [KVH, S*G, HD] against a block [KVH, b, HD], one batched matmul per kv head
    rows_n, groups = qg.shape[0], qg.shape[2]
    qh = jnp.transpose(qg, (1, 0, 2, 3)).reshape(kvh, rows_n * groups, hd)

    def read(table, start):
        block_ = lax.dynamic_slice(table, lead + [start, jnp.int32(0), jnp.int32(0)], [1] * len(lead) + [b, kvh, hd])
        return jnp.transpose(N.to_compute(block_.reshape(b, kvh, hd), ctx.dtype), (1, 0, 2))

    def scores(i):  # block i: where it starts, its scores [KVH, S, G, b], which of them each row reads
        a = (i * b).astype(jnp.int32)
        start = jnp.minimum(a, jnp.int32(t - b))
        s = (jnp.einsum("kqd,ktd->kqt", qh, read(k, start), precision=prec) * sc).reshape(kvh, rows_n, groups, b)
        if cap is not None:
            s = jnp.tanh(s / cap) * cap
        pos = start + lax.broadcasted_iota(jnp.int32, (b,), 0)
        keep = ((pos >= jnp.maximum(a, lo)[:, None]) & (pos < n[:, None]))[None, :, None, :]
        return start, s, keep

    def body(i, carry):
        m, total, acc, odd = carry  # [KVH, S, G], [KVH, S, G], [KVH, S, G, HD], a non-finite v read
        start, s, keep = scores(i)
        s = jnp.where(keep, s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        m_sub = jnp.where(m_new == -jnp.inf, jnp.zeros((), ct), m_new)  # a row none of whose positions is read yet
        corr = jnp.exp(m - m_sub)
        p = jnp.where(keep, jnp.exp(s - m_sub[..., None]), jnp.zeros((), ct))
        total = total * corr + jnp.sum(p, axis=-1)
        # a position no row reads is zero in v too: p is 0 there, and 0 * NaN (an unfilled slot's
        # garbage) would be NaN in the product
        vb = jnp.where(jnp.any(keep, axis=(0, 1, 2))[None, :, None], read(v, start), jnp.zeros((), ct))
        if rows_n > 1:  # rows of their own lengths: another row's position is weighted 0, and 0 * NaN is
            finite = jnp.isfinite(vb)  # NaN; its non-finite values are added after the loop, to the rows
            odd = odd | ~jnp.all(finite)  # that read them (non_finite_read)
            vb = jnp.where(finite, vb, jnp.zeros((), ct))
        pv = jnp.einsum("kqt,ktd->kqd", p.reshape(kvh, rows_n * groups, b), vb, precision=prec)
        acc = acc * corr[..., None] + pv.reshape(kvh, rows_n, groups, hd)
        return m_new, total, acc, odd

    def non_finite_read(out, odd, vb):
        """Each row's result where it read a non-finite v, as its own weighted sum gives it (the
        reference's, in float64, where no weight of a read position is 0): NaN where it read a NaN
        or both infinities, else the inf's sign. Over blocks: no iteration where no block held one;
        `vb`: the one block's v [KVH, T, HD] where the table is one block."""
        def flags(i, seen):  # per row and column: how many NaN, +inf and -inf it reads (exact counts)
            a = (i * b).astype(jnp.int32)
            start = jnp.minimum(a, jnp.int32(t - b))
            pos = start + lax.broadcasted_iota(jnp.int32, (b,), 0)
            keep = (pos >= jnp.maximum(a, lo)[:, None]) & (pos < n[:, None])  # [S, b]
            vb = read(v, start)  # [KVH, b, HD]
            kinds = jnp.stack([jnp.isnan(vb), vb == jnp.inf, vb == -jnp.inf]).astype(ct)
            return seen + jnp.einsum("st,xktd->xksd", keep.astype(ct), kinds, precision=lax.Precision.HIGHEST)

        if b == t:  # one pass (an accelerator's: no loop, no branch): prefix counts along the table
            kinds = jnp.stack([jnp.isnan(vb), vb == jnp.inf, vb == -jnp.inf]).astype(jnp.int32)  # [3, KVH, T, HD]
            before = jnp.concatenate([jnp.zeros((3, kvh, 1, hd), jnp.int32), jnp.cumsum(kinds, axis=2)], axis=2)
            counts = jnp.take(before, n, axis=2) - jnp.take(before, lo, axis=2)  # [3, KVH, S, HD]
        else:
            first = jnp.min(lo) // b
            counts = lax.fori_loop(first, jnp.where(odd, (jnp.max(n) + b - 1) // b, first), flags,
                                   jnp.zeros((3, kvh, rows_n, hd), ct))
        nan, plus, minus = (counts > 0)[:, :, :, None]  # [KVH, S, 1, HD] each
        value = jnp.where(nan | (plus & minus), jnp.nan, jnp.where(plus, jnp.inf, -jnp.inf)).astype(ct)
        return jnp.where(jnp.isnan(out) | ~(nan | plus | minus), out, value)

    heads = (kvh, rows_n, groups)
    init = (jnp.full(heads, -jnp.inf, ct), jnp.zeros(heads, ct), jnp.zeros(heads + (hd,), ct), jnp.bool_(False))
    if b == t:  # the table is one block, which every valid row reads: the loop's one pass, without the loop
        _, total, acc, odd = body(jnp.int32(0), init)
    else:
        _, total, acc, odd = lax.fori_loop(jnp.min(lo) // b, (jnp.max(n) + b - 1) // b, body, init)
    out = acc / total[..., None]
    if rows_n > 1:
        out = non_finite_read(out, odd, read(v, jnp.int32(0)) if b == t else None)
    out = jnp.transpose(out, (1, 0, 2, 3))  # [S, KVH, G, HD]
    return N.store(out if q.ndim == 4 else out[0] if q.ndim == 3 else out[0, :, 0, :], ctx.out_dtype)
