"""nn matmul family: linear (x @ W^T, torch layout), matmul_t, einsum of two operands."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import quantized
from .. import jax_numerics as N
from ..define import Attr, op
from ..errors import OpTypeError
from ..shapes import broadcast_shapes
from ._common import as_f64, matmul_precision, float_samples


def _linear_shape(shapes, attrs):
    x, w = (tuple(s) for s in shapes[:2])
    if len(x) < 1:
        raise OpTypeError("op linear: x must have rank >= 1", input=0)
    if len(w) != 2 or w[1] != x[-1]:
        raise OpTypeError(f"op linear: weight has shape {list(w)}, expected [OUT, {x[-1]}] ([out, in], in = the "
                          f"last axis of x)", input=1)
    if len(shapes) > 2 and tuple(shapes[2]) != (w[0],):
        raise OpTypeError(f"op linear: bias has shape {list(shapes[2])}, expected [{w[0]}] (the weight's out)", input=2)
    return x[:-1] + (w[0],)


def _linear_ref(x, weight, bias=None):
    y = as_f64(x) @ as_f64(weight).T
    return y if bias is None else y + as_f64(bias)


def _matmul_samples(kind: str):
    def samples(rng, d):
        def f(*shape):
            return float_samples(rng, d, shape, 1.0)
        if kind == "linear":
            return [((f(3, 4), f(5, 4)), {}), ((f(6), f(2, 6)), {}), ((f(2, 2, 16), f(3, 16)), {}),
                    ((f(3, 4), f(5, 4), f(5)), {}), ((f(6), f(2, 6), f(2)), {})]
        if kind == "matmul_t":
            return [((f(2, 3, 4), f(5, 4)), {}), ((f(3, 4), f(2, 5, 4)), {}), ((f(2, 1, 3, 16), f(2, 5, 16)), {})]
        return [((f(2, 3, 4), f(5, 2, 4)), {"spec": "kgd,tkd->kgt"}), ((f(3, 4), f(4, 2)), {"spec": "ij,jk->ik"}),
                ((f(2, 3, 8), f(2, 3, 8)), {"spec": "bhd,bhd->bh"}), ((f(3,), f(2,)), {"spec": "i,j->ji"})]
    return samples


def _one_row(x) -> bool:
    """x [..., in] holds at most one row (a symbolic dimension counts as several)."""
    rows = x.shape[:-1]
    return all(isinstance(d, int) for d in rows) and math.prod(rows) <= 1


def _product(x, weight, precision, out_type):
    """x [..., in] . weight [out, in] -> [..., out]. One row as `dot_general(x, weight)`; several
    rows (a prompt step, a batch's slots, a symbolic dimension of `jax.export`) with the weight as
    the left operand and the out axis moved last. The same products: XLA's CPU dot runs a batch's
    8 rows about 25% faster weight first (benchmarks/batch_dots.py), one row 5% faster x first,
    a prompt's 512 rows alike."""
    if _one_row(x):
        return lax.dot_general(x, weight, (((x.ndim - 1,), (1,)), ((), ())), precision=precision,
                               preferred_element_type=out_type)
    y = lax.dot_general(weight, x, (((1,), (x.ndim - 1,)), ((), ())), precision=precision,
                        preferred_element_type=out_type)
    return lax.transpose(y, tuple(range(1, y.ndim)) + (0,))


@functools.lru_cache(maxsize=None)
def _product_fn(precision, out_type):
    """`_product` whose rows are counted after `jax.vmap` (`Program.batch`: a step traced for one
    slot): the vmapped product takes every slot's rows at once, so a batch's step gets the
    several-rows form where its one slot's trace sees one row."""
    def plain(x, weight):
        return _product(x, weight, precision, out_type)
    product = jax.custom_batching.custom_vmap(plain)

    @product.def_vmap
    def _batched(axis_size, in_batched, x, weight):
        if in_batched[1]:  # a weight per slot: vmap's own rule
            return jax.vmap(plain, in_axes=(0 if in_batched[0] else None, 0))(x, weight), True
        return _product(x, weight, precision, out_type), True  # x [slots, ..., in]: one product

    # a custom_vmap has no derivative of its own: the product's, with plain dot_generals (a user's
    # jax.grad of the pure step, tests/test_user_jit.py)
    differentiable = jax.custom_jvp(lambda x, weight: product(x, weight))

    @differentiable.defjvp
    def _jvp(primals, tangents):
        (x, weight), (dx, dw) = primals, tangents
        return product(x, weight), _product(dx, weight, precision, out_type) + _product(x, dw, precision, out_type)
    return differentiable


@op(inputs={"x": "float", "weight": "same", "bias?": "same"}, shape=_linear_shape, category="nn", op_set="nn",
    reference=_linear_ref, samples=_matmul_samples("linear"), quantized=("weight",))
def linear(x, weight, bias=None, *, ctx):
    """x @ weight^T (+ bias) with weight [out, in] (the torch / Hugging Face layout): x [..., in] -> [..., out].

    `op linear(h, W, b)`: the optional third input bias [out] is added to the product (as torch's
    `F.linear`). f16/bf16 accumulate in f32, the bias is added in f32 and the sum rounded once;
    f32 uses the program's matmul precision (`--precision`, default highest: exact f32
    products), f64 computes in f64. A weight kept in GGML blocks (docs/models.md) stays packed:
    dequantized inside the step (`quantized.linear`), in f32."""
    if isinstance(weight, quantized.QuantTensor):
        y = quantized.linear(x, weight)
    else:
        precision, out_type = matmul_precision(ctx), np.dtype(N.compute_dtype(ctx.dtype))
        if _one_row(x):  # a slot's row, which vmap may make several: the product decides after it
            y = _product_fn(precision, out_type)(x, weight)
        else:  # several rows (vmap's rule keeps the weight first): no wrapper to trace
            y = _product(x, weight, precision, out_type)
    if bias is not None:
        y = y + N.to_compute(bias, ctx.dtype)
    return N.store(y, ctx.out_dtype)


def _matmul_t_shape(shapes, attrs):
    a, b = (tuple(s) for s in shapes)
    if len(a) < 2 or len(b) < 2:
        raise OpTypeError("op matmul_t: a and b must have rank >= 2", input=0 if len(a) < 2 else 1)
    if a[-1] != b[-1]:
        raise OpTypeError(f"op matmul_t: a [.., M, K] and b [.., N, K] differ in K: {a[-1]} vs {b[-1]}", input=1)
    try:
        batch = broadcast_shapes(a[:-2], b[:-2])
    except OpTypeError as exc:
        raise OpTypeError(f"op matmul_t: batch dimensions {list(a[:-2])} and {list(b[:-2])}: {exc}", input=1) \
            from None
    return batch + (a[-2], b[-2])


@op(inputs={"a": "float", "b": "same"}, shape=_matmul_t_shape, category="nn", op_set="nn",
    reference=lambda a, b: np.matmul(as_f64(a), np.swapaxes(as_f64(b), -1, -2)), samples=_matmul_samples("matmul_t"))
def matmul_t(a, b, *, ctx):
    """a @ swapaxes(b, -1, -2): a [..., M, K], b [..., N, K] -> [..., M, N], batch dimensions broadcast (e.g. q @ k^T).

    Numerics as linear: f32 accumulation for f16/bf16, the program's matmul precision for f32."""
    y = jnp.matmul(a, jnp.swapaxes(b, -1, -2), precision=matmul_precision(ctx),
                   preferred_element_type=N.compute_dtype(ctx.dtype))
    return N.store(y, ctx.out_dtype)


def _parse_einsum(spec, ranks) -> tuple[list[str], str]:
    def fail(why: str):
        raise OpTypeError(f"op einsum: spec {spec!r}: {why}", attr="spec")
    if not isinstance(spec, str):
        fail("expected a string")
    text = spec.replace(" ", "")
    if text.count("->") != 1:
        fail("expected 'A,B->OUT' (two operands and an explicit output)")
    lhs, out = text.split("->")
    operands = lhs.split(",")
    if len(operands) != 2:
        fail(f"expected two operands, got {len(operands)}")
    for part in operands + [out]:
        if not all(c.isalpha() and c.isascii() for c in part):
            fail(f"subscripts are letters only (no '...'), got {part!r}")
        if len(set(part)) != len(part):
            fail(f"a letter repeats in {part!r}")
    for i, (part, rank) in enumerate(zip(operands, ranks)):
        if len(part) != rank:
            fail(f"operand {i + 1} has {len(part)} subscripts ({part!r}) but rank {rank}")
    missing = [c for c in out if c not in operands[0] + operands[1]]
    if missing:
        fail(f"output letter {missing[0]!r} is in no operand")
    return operands, out


def _einsum_shape(shapes, attrs):
    operands, out = _parse_einsum(attrs.get("spec"), [len(s) for s in shapes])
    sizes: dict[str, int] = {}
    for part, shape in zip(operands, shapes):
        for c, n in zip(part, shape):
            if sizes.setdefault(c, n) != n:
                raise OpTypeError(f"op einsum: spec {attrs['spec']!r}: {c!r} is {sizes[c]} in one place and {n} "
                                  f"in another", attr="spec")
    return tuple(sizes[c] for c in out)


@op(inputs={"a": "float", "b": "same"}, attrs={"spec": Attr("string", required=True)}, shape=_einsum_shape,
    category="nn", op_set="nn", reference=lambda a, b, spec: np.einsum(spec, as_f64(a), as_f64(b)),
    samples=_matmul_samples("einsum"))
def einsum(a, b, *, spec, ctx):
    """Two-operand Einstein summation given by `spec` ("kgd,tkd->kgt"): letters only, an explicit output.

    Numerics as linear: f32 accumulation for f16/bf16, the program's matmul precision for f32."""
    _parse_einsum(spec, (a.ndim, b.ndim))
    y = jnp.einsum(spec, a, b, precision=matmul_precision(ctx), preferred_element_type=N.compute_dtype(ctx.dtype))
    return N.store(y, ctx.out_dtype)
