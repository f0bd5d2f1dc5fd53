"""nn op `sample`: the next token drawn on the device with temperature, top-k, top-p and min-p.

Every setting is an attribute that may be a variable (a runtime value: changing it does not
recompile). The draw is counter-based: the noise of a draw is a pure function of `(seed,
position)`, so a run is reproducible for a seed, a replayed step draws the same token, and two
sequences with different seeds (or one sequence at different positions) draw independently. No
PRNG state has to be carried or donated: the position (a cache's fill count) is the counter.

The filters are transformers' logits warpers, in its order (`TemperatureLogitsWarper`,
`TopKLogitsWarper`, `TopPLogitsWarper`, `MinPLogitsWarper`), computed in f32; the draw is the
Gumbel-max trick over the kept logits, which samples exactly from their softmax.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import jax_numerics as N
from ..define import Attr, op
from ..errors import OpTypeError
from ._common import float_samples


_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_TINY = np.finfo(np.float32).tiny


def _threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 with 20 rounds (Random123; the generator of `jax.random`'s default keys),
    written out in uint32 lanes: one elementwise fusion, where `jax.random` lowers a loop of its
    own (10 fusions, 0.06-0.07 s more XLA per program; tests/test_sampling.py checks that the
    bits equal jax.random.bits')."""
    add, xor = lax.add, lax.bitwise_xor  # lax, not the operators: each jnp operator is a jit to trace

    def rotl(x, r):
        return lax.bitwise_or(lax.shift_left(x, np.uint32(r)), lax.shift_right_logical(x, np.uint32(32 - r)))
    k2 = xor(xor(k0, k1), np.uint32(0x1BD11BDA))
    keys = (k0, k1, k2)
    x0, x1 = add(x0, k0), add(x1, k1)
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = add(x0, x1)
            x1 = xor(rotl(x1, r), x0)
        x0, x1 = add(x0, keys[(i + 1) % 3]), add(add(x1, keys[(i + 2) % 3]), np.uint32(i + 1))
    return x0, x1


def _key_words(seed, position):
    """The two key words of (seed, position): their low 32 bits; a 64-bit value's high word, where
    either is not zero, mixed in by threefry keyed by the two high words, so that seeds (or
    positions) that differ only above bit 31 draw independently (2^32 and 0 drew the same). Values
    that fit 32 bits keep the plain key (seed, position)."""
    seed, position = jnp.asarray(seed), jnp.asarray(position)
    k0, k1 = seed.astype(jnp.uint32), position.astype(jnp.uint32)  # the low words (two's complement)

    def high(v):
        if v.dtype.itemsize < 8:
            return jnp.zeros((), jnp.uint32)
        return lax.shift_right_logical(v.astype(jnp.uint64), np.uint64(32)).astype(jnp.uint32)
    h0, h1 = high(seed), high(position)
    if seed.dtype.itemsize < 8 and position.dtype.itemsize < 8:
        return k0, k1
    m0, m1 = _threefry2x32(h0, h1, k0, k1)
    wide = (h0 != 0) | (h1 != 0)
    return jnp.where(wide, m0, k0), jnp.where(wide, m1, k1)


def gumbel_noise(seed, position, n: int):
    """The Gumbel noise of one draw over `n` tokens: f32[n], exactly `jax.random.gumbel` of the
    threefry key whose two words are (seed, position) (a counter-based stream per pair; no
    `fold_in`), computed as JAX does (bits i = the xor of threefry's two words at counter (0, i);
    uniform = the top 23 bits as the mantissa of [1, 2) minus 1, at least the smallest normal;
    -log(-log u)). The one definition: the kernel traces it, the NumPy reference evaluates it on
    the host, so both draw the same token."""
    k0, k1 = _key_words(seed, position)
    counter = lax.iota(jnp.uint32, n)
    hi, lo = _threefry2x32(k0, k1, jnp.zeros_like(counter), counter)
    mantissa = lax.shift_right_logical(hi ^ lo, np.uint32(9)) | np.float32(1).view(np.uint32)
    u = lax.bitcast_convert_type(mantissa, jnp.float32) - np.float32(1)
    u = lax.max(np.float32(_TINY), u * (np.float32(1) - np.float32(_TINY)) + np.float32(_TINY))
    return -jnp.log(-jnp.log(u))


def _sample_shape(shapes, attrs):
    x = tuple(shapes[0])
    if len(x) < 1:
        raise OpTypeError("op sample: logits must have rank >= 1 (it draws over the last axis)", input=0)
    return x[:-1]


_SIGN = np.uint32(0x80000000)
_ALL = np.uint32(0xFFFFFFFF)
KEY_BITS = 32  # the bits of the ordered f32 keys, set from the top: exact after 32


def _key(v, xp):
    """f32 -> uint32 keys in the order of the values (-inf < ... < -0.0 < +0.0 < ... < inf)."""
    u = (v.view(np.uint32) if xp is np else lax.bitcast_convert_type(v, jnp.uint32))
    return u ^ xp.where(u >= _SIGN, _ALL, _SIGN)


def _value(k, xp):
    u = k ^ xp.where(k >= _SIGN, _SIGN, _ALL)
    return u.view(np.float32) if xp is np else lax.bitcast_convert_type(u, jnp.float32)


def _largest_key(holds, shape, xp):
    """The largest uint32 key c (per row, `shape`) with holds(c), for a predicate that holds at 0
    and is monotone (true, then false): built bit by bit from the top, KEY_BITS masked
    reductions over the row, exact. Where the predicate changes only at keys of a row, the
    result is one of them: an order statistic without a sort (XLA's CPU sort of 49152 logits
    takes 14 ms; this 32 masked sums over precomputed integer keys)."""
    def step(i, c):
        bit = (np.uint32(1) << np.uint32(31 - i)) if xp is np else \
            lax.shift_left(np.uint32(1), (31 - i).astype(jnp.uint32))
        candidate = c | bit
        return xp.where(holds(candidate), candidate, c)
    c = xp.zeros(shape, np.uint32)
    if xp is np:
        for i in range(KEY_BITS):
            c = step(i, c)
        return c
    return lax.fori_loop(0, KEY_BITS, step, c)


def _maybe(flag, f, otherwise, xp):
    """f() where any row needs it (a lax.cond at run time: a step without that filter skips it)."""
    if xp is np:
        return f() if bool(np.any(flag)) else otherwise
    return lax.cond(jnp.any(flag), f, lambda: otherwise)


def _first_kept(z, weight, at_most, top, xp):
    """The smallest value f of each row of z (as its key) whose values <= f weigh more than
    `at_most`, at most the row's largest (`top`, its key): the largest key c whose keys <= c weigh
    at most `at_most`, then the next key. THE search of both filters: top-k weighs each value 1
    (the k-th largest is the first value with more than V - k values at or below it), top-p by its
    probability (the first value kept has more than 1 - p of the probability at or below it).
    One form for both: `_filter` runs it in one loop body over the two filters, so XLA compiles
    the search once (two calls compile it twice: XLA took 0.20 s over the filters of a V = 8192
    draw that way, 0.17 s this way)."""
    keys = _key(z, xp)
    c = _largest_key(lambda c: xp.sum(xp.where(keys <= c, weight, np.float32(0)), axis=-1, keepdims=True) <= at_most,
                     top.shape, xp)
    return _value(xp.where(c >= top, top, c + np.uint32(1)), xp)


def _filter(z, top_k, top_p, min_p, xp):
    """The kept logits (the others -inf) of z (f32 [..., V], already divided by the temperature),
    written once for both array modules: `xp` is jax.numpy (the kernel) or numpy (the reference).
    The thresholds are order statistics built bit by bit (`_first_kept`), not by a sort."""
    v = z.shape[-1]
    neg = xp.asarray(-np.inf, np.float32)
    top_k = xp.asarray(top_k)
    top_p = xp.asarray(top_p, np.float32)
    min_p = xp.asarray(min_p, np.float32)
    hi = xp.max(z, axis=-1, keepdims=True)
    top = _key(hi, xp)
    none = xp.full(hi.shape, neg, np.float32)  # a filter no row uses: keeps all
    # top-k (i = 0): keep the values >= the k-th largest (ties at it kept); k <= 0 or k >= V keeps
    # all. Each value weighs 1, counted in f32 (exact below 2^24 values).
    # top-p (i = 1): in ascending order, drop the prefix whose cumulative probability is <= 1 - p
    # (the most likely token always stays); p >= 1 keeps all. Each value weighs its probability
    # after top-k.
    uses = (((top_k > 0) & (top_k < v))[..., None], (top_p < 1)[..., None])
    at_most = ((v - xp.clip(top_k, 1, v)).astype(np.float32)[..., None], (1 - top_p)[..., None])

    def one(i, z):
        """Filter i of the two: one loop body, so XLA compiles the search once for both."""
        use = xp.where(i == 0, uses[0], uses[1])

        def first_kept(z=z):  # inside the filter's branch: a step without that filter skips it
            e = xp.exp(z - hi)
            weight = xp.where(i == 0, np.float32(1), e / xp.sum(e, axis=-1, keepdims=True))
            return _first_kept(z, weight, xp.where(i == 0, at_most[0], at_most[1]), top, xp)
        threshold = _maybe(use, first_kept, none, xp)
        return xp.where(use & (z < threshold), neg, z)
    if xp is np:
        for i in range(2):
            z = one(i, z)
    else:
        z = lax.fori_loop(0, 2, one, z)
    # min-p: drop the tokens whose probability is below min_p x the largest probability
    e = xp.exp(z - xp.max(z, axis=-1, keepdims=True))
    probs = e / xp.sum(e, axis=-1, keepdims=True)
    z = xp.where((min_p > 0)[..., None] & (probs < min_p[..., None] * xp.max(probs, axis=-1, keepdims=True)), neg, z)
    return z


def _noise_for(seed, position, batch: tuple[int, ...], n: int, xp):
    """Noise [*batch, n]: one draw per sequence, each with its own seed and position (a scalar
    seed or position is shared by the batch)."""
    seed = xp.broadcast_to(xp.asarray(seed), batch).reshape(-1)
    position = xp.broadcast_to(xp.asarray(position), batch).reshape(-1)
    if xp is np:
        rows = [np.asarray(gumbel_noise(int(s), int(p), n)) for s, p in zip(seed, position)]
        return np.stack(rows).reshape(*batch, n) if rows else np.zeros((*batch, n), np.float32)
    return jax.vmap(lambda s, p: gumbel_noise(s, p, n))(seed, position).reshape(*batch, n)


def _argmax(x, xp):
    """The first maximum's index (i32) over the last axis; lax.argmax with an explicit index dtype
    in the kernel (jnp.argmax's follows the x64 flag when lowered: tests/test_user_jit.py)."""
    if xp is np:
        return np.argmax(x, axis=-1).astype(np.int32)
    return lax.argmax(x, x.ndim - 1, jnp.int32)


def _flushed(v, xp):
    """f32 subnormals as zero, explicitly, on every device and in NumPy: XLA:CPU reads and writes
    them as zero (flush-to-zero), XLA:GPU keeps them (`--xla_gpu_ftz` is off), NumPy keeps them.
    The logits and their quotient by t go through this, so that every device and the interpreter
    draw the same token (subnormal logits were ties in the CPU kernel, distinct values in NumPy
    and on an H200: a different token in 6 of 30 draws)."""
    zero = xp.copysign(xp.asarray(0, np.float32), v)
    return xp.where(xp.abs(v) < np.float32(_TINY), zero, v).astype(np.float32)


def _known_greedy(temperature) -> bool:
    """Whether a temperature known while tracing (a literal, a constant scalar, an input fixed by
    `Program.specialized`: a Python or NumPy value, not a traced one) makes every draw greedy
    (below the smallest normal f32, or NaN: then the node's error is raised too). The draw is
    then `argmax` of the flushed logits, what `_draw` computes for it."""
    if isinstance(temperature, (jax.core.Tracer, jax.Array)) or \
            not isinstance(temperature, (int, float, np.number, np.ndarray)):
        return False
    return not bool(np.all(np.asarray(temperature, np.float32) >= np.float32(_TINY)))


def _draw(logits, temperature, top_k, top_p, min_p, seed, position, xp):
    x = _flushed(xp.asarray(logits).astype(np.float32), xp)
    batch, v = x.shape[:-1], x.shape[-1]
    t = xp.broadcast_to(xp.asarray(temperature, np.float32), batch)
    greedy = _argmax(x, xp)
    # a temperature below the smallest normal f32 is 0 (XLA:CPU reads a subnormal as 0): on every
    # device and in NumPy
    samples = t >= np.float32(_TINY)

    def sampled():
        z = _flushed(x / xp.where(samples, t, xp.asarray(1, np.float32))[..., None], xp)
        kept = _filter(z, xp.broadcast_to(xp.asarray(top_k), batch),
                       xp.broadcast_to(xp.asarray(top_p, np.float32), batch),
                       xp.broadcast_to(xp.asarray(min_p, np.float32), batch), xp)
        drawn = _argmax(kept + _noise_for(seed, position, batch, v, xp), xp)
        # where logits / t overflowed to +inf (a temperature so small, or a logit +inf, that the
        # softmax is all at the maximum) the draw is that limit, the greedy token: the filters'
        # inf - inf would make it a NaN's
        return xp.where(samples & (xp.max(z, axis=-1) < np.inf), drawn, greedy)
    if xp is np:
        return sampled()
    # a greedy step (every temperature 0) skips the filters' sort and the noise at run time
    return lax.cond(jnp.any(samples), sampled, lambda: greedy)


@jax.custom_batching.custom_vmap
def _draw_jax(logits, temperature, top_k, top_p, min_p, seed, position):
    return _draw(logits, temperature, top_k, top_p, min_p, seed, position, jnp)


@_draw_jax.def_vmap
def _draw_batched(axis_size, in_batched, *args):
    """Under `jax.vmap` (`Program.batch`: a slot per sequence), the draw of the whole batch at once
    (`_draw` takes leading batch axes): its greedy test is one `lax.cond` over every sequence's
    temperature. vmap's own rule would turn that cond into a select computing both branches, the
    sort and the noise of every slot at every greedy step."""
    moved = [a if batched else jnp.broadcast_to(a, (axis_size,) + jnp.shape(a)) for a, batched in zip(args, in_batched)]
    logits, temperature, top_k, top_p, min_p, seed, position = moved
    batch = logits.shape[:-1]
    per_row = [jnp.broadcast_to(a.reshape(a.shape + (1,) * (len(batch) - a.ndim)), batch)
               for a in (temperature, top_k, top_p, min_p, seed, position)]
    return _draw(logits, *per_row, jnp), True


def _any_nan(logits, xp):
    """Whether any logit is NaN. In the kernel: whether the value at each row's first maximum is NaN
    (lax.argmax picks the first NaN where a row has one, as np.argmax does), so the check is one
    gather beside the greedy draw's argmax, which XLA merges with it. A reduction of V bools
    compiles to a tree of reduce-windows on XLA:CPU (164 ms of LLVM time at V = 8192)."""
    x = xp.asarray(logits).astype(np.float32)
    if xp is np:
        return np.any(np.isnan(x))
    at = jnp.take_along_axis(x, _argmax(x, jnp)[..., None], axis=-1)
    return N.any_true(jnp.isnan(at))


def _bad_settings(logits, temperature, top_p, min_p, xp) -> list:
    """What makes a draw undefined, each with its message (the first that holds is the node's
    error): a NaN logit or temperature (it compared as no temperature > 0: a silent greedy draw),
    top_p outside (0, 1], min_p outside [0, 1]."""
    return [(_any_nan(logits, xp), "sample: a logit is NaN: no token can be drawn"),
            (xp.any(xp.isnan(xp.asarray(temperature, np.float32))), "sample: temperature is NaN"),
            (xp.any(~((xp.asarray(top_p) > 0) & (xp.asarray(top_p) <= 1))),
             "sample: top_p is outside (0, 1] (or NaN)"),
            (xp.any(~((xp.asarray(min_p) >= 0) & (xp.asarray(min_p) <= 1))),
             "sample: min_p is outside [0, 1] (or NaN)")]


def _sample_ref(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, position=0, ctx=None):
    if ctx is not None:
        for bad, message in _bad_settings(logits, temperature, top_p, min_p, np):
            if bad:
                ctx.fail_if(np.bool_(True), message, 1)
    with np.errstate(all="ignore"):
        return np.asarray(_draw(logits, temperature, top_k, top_p, min_p, seed, position, np))


def _sample_samples(rng, d):
    x = float_samples(rng, d, (3, 10), 2.0)
    return [((x,), {}),
            ((x,), {"temperature": 0.0}),
            ((x,), {"temperature": np.array(0.7, np.float32), "top_k": np.array(3, np.int32), "seed": 7}),
            ((x[0],), {"top_p": 0.9, "position": np.array(5, np.int32)}),
            ((x,), {"min_p": 0.1, "top_k": 4, "top_p": 0.8, "seed": np.array(3, np.int32)})]


@op(inputs={"logits": "float"}, attrs={"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                                       "seed": Attr("int", 0), "position": Attr("int", 0)},
    out_dtype="i32", shape=_sample_shape, category="nn", op_set="nn", reference=_sample_ref, samples=_sample_samples)
def sample(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, position=0, ctx):
    """The next token (i32, the last axis removed) drawn from the filtered softmax(logits / t).

    The filters are transformers' warpers, in its order: top_k (keep the logits >= the k-th largest; k <= 0 or
    k >= V keeps all), top_p (keep the smallest set of most likely tokens whose probability sum
    exceeds p; p = 1 keeps all), min_p (drop the tokens below min_p x the largest probability;
    0 keeps all). temperature <= 0 is greedy (the first maximum, as argmax), and so is one below
    the smallest normal f32 and a row whose logits / temperature overflow to +inf (the softmax's
    limit). The draw is the
    Gumbel-max trick with the noise of `gumbel_noise(seed, position)`: reproducible for a seed,
    independent across seeds and positions; a scalar seed/position is shared by a batch, arrays
    of the batch shape give each sequence its own. A NaN logit or temperature, top_p outside (0, 1]
    or min_p outside [0, 1] is a runtime error of the node. All settings may be variables."""
    for bad, message in _bad_settings(logits, temperature, top_p, min_p, jnp):
        ctx.fail_if(bad, message, jnp.int32(1))
    if _known_greedy(temperature):  # the greedy draw alone: no filters or noise traced or compiled
        return _argmax(_flushed(jnp.asarray(logits).astype(np.float32), jnp), jnp)
    return _draw_jax(logits, *(jnp.asarray(a) for a in (temperature, top_k, top_p, min_p, seed, position)))
