"""Per-op property tests: `oi2jax.ops.apply` against a NumPy / Python-int formulation of SPEC §6.

Cases are generated from the registry: every op x every supported dtype (normal and, where the
schema allows it, inplace) x every accumulate pair, with explicit edge values (int min/max,
NaN, +-inf, -0.0, zero divisors) mixed with seeded random values. One jitted function per op
runs all of its cases (keeps compile time low); a few tests also run eagerly, without x64,
and with variable-valued (traced) attributes.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oi2jax
from oi2jax import dtypes as D
from oi2jax import host_numerics as HN
from oi2jax.ops import REGISTRY, apply, cast_allowed
from oi2jax.ops import jax_numerics as JN

from conftest import assert_matches, tolerance

RNG_SEED = 1234
SHAPE = (4, 6)

# ------------------------------------------------------------------ value generation


def py_wrap(v: int, d: str) -> int:
    dt = D.get(d)
    v &= (1 << dt.bits) - 1
    if dt.is_signed and v >= 1 << (dt.bits - 1):
        v -= 1 << dt.bits
    return v


def rep_ints(values, d: str) -> np.ndarray:
    """Python ints -> representation array of d (wrapping)."""
    flat = [py_wrap(int(v), d) for v in np.asarray(values, dtype=object).reshape(-1)]
    return np.array(flat, dtype=D.get(d).np_dtype).reshape(np.shape(values))


def rstore(y, d: str) -> np.ndarray:
    """Reference rounding of a float result to dtype d (f16/bf16 RNE, f8 §5.4)."""
    y = np.asarray(y)
    with np.errstate(over="ignore", invalid="ignore"):
        if d == "f64":
            return y.astype(np.float64)
        y32 = y.astype(np.float32)
        if d == "f8":
            return HN.f8_encode(y32)
        return y32.astype(D.get(d).np_dtype)


FLOAT_EDGES = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -2.5, 0.5, 1.9, -3.8, 2.5, 65504.0, 1e-5, -7.0]


def gen(d: str, rng, shape=SHAPE, nonneg=False) -> np.ndarray:
    dt = D.get(d)
    n = math.prod(shape)
    if d == "bool":
        return rng.random(shape) < 0.5
    if dt.is_float:
        vals = np.concatenate([np.array(FLOAT_EDGES), rng.normal(size=n) * 10.0, rng.normal(size=n) * 1000.0])
        vals = rng.permutation(vals)[:n]
        if nonneg:
            vals = np.abs(vals)
        return rstore(vals, d).reshape(shape)
    lo, hi = int(dt.min), int(dt.max)
    edges = [lo, hi, 0, 1, lo + 1, hi - 1] + ([-1, -2] if dt.is_signed else [2])
    rand = [int(x) for x in rng.integers(lo, hi, size=n, endpoint=True, dtype=np.int64 if hi < 2**63 else np.uint64)]
    small = [int(x) for x in rng.integers(max(lo, -9), min(hi, 9), size=n, endpoint=True)]
    vals = list(rng.permutation(np.array(edges + rand + small, dtype=object)))[:n]
    if nonneg:
        vals = [abs(v) if abs(v) <= hi else hi for v in vals]
    return rep_ints(np.array(vals, dtype=object).reshape(shape), d)


# ------------------------------------------------------------------ reference formulation


def as_values(x, d: str):
    """Reference view of a representation array: f32/f64 for floats, object ints, bools."""
    dt = D.get(d)
    if dt.is_float:
        return np.asarray(x).astype(np.float64 if d == "f64" else np.float32)
    if d == "bool":
        return np.asarray(x).astype(bool)
    return np.array([int(v) for v in np.asarray(x).reshape(-1)], dtype=object).reshape(np.shape(x))


def finish(y, d: str):
    dt = D.get(d)
    if dt.is_float:
        return rstore(y, d)
    if d == "bool":
        return np.asarray(y).astype(bool)
    return rep_ints(y, d)


def vec(fn):
    return np.frompyfunc(fn, 2, 1)


def tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def euclid(a: int, b: int) -> int:
    q = a // abs(b)
    return q if b > 0 else -q


def ref_round(x):
    if x.dtype == np.float32:  # exact in f64
        w = x.astype(np.float64)
        return np.copysign(np.floor(np.abs(w) + 0.5), w).astype(np.float32)
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def py_float_attr(v, d):
    return np.float64(float(v)) if d == "f64" else np.float32(float(v))


def ref(op, xs, attrs, d, out, mode):
    """The expected result in out's representation."""
    v = [as_values(x, d) for x in xs]
    fl = D.get(d).is_float
    with np.errstate(all="ignore"):
        if op in ("add", "sub", "mul"):
            if d == "bool":
                return (v[0] | v[1]) if op == "add" else (v[0] & v[1])
            f = {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op]
            return finish(f(v[0], v[1]), out)  # ints: exact (object), wrap once: = widen-then-truncate
        if op == "div":
            m = attrs.get("div_by_zero_mask", np.nan if fl else 0)
            if fl:
                return finish(np.where(v[1] == 0, py_float_attr(m, d), v[0] / np.where(v[1] == 0, 1, v[1])), out)
            a, b = np.broadcast_arrays(v[0], v[1])
            return finish(np.array([int(m) if y == 0 else tdiv(x, y) for x, y in zip(a.flat, b.flat)],
                                   dtype=object).reshape(a.shape), out)
        if op == "floor_div":
            m = attrs.get("div_by_zero_mask", 0)
            a, b = np.broadcast_arrays(v[0], v[1])
            return finish(np.array([int(m) if y == 0 else euclid(x, y) if D.get(d).is_signed else x // y
                                    for x, y in zip(a.flat, b.flat)], dtype=object).reshape(a.shape), out)
        if op == "rem":
            a, b = np.broadcast_arrays(v[0], v[1])
            return finish(np.array([0 if y == 0 else x - y * tdiv(x, y) for x, y in zip(a.flat, b.flat)],
                                   dtype=object).reshape(a.shape), out)
        if op == "fma":
            return finish(v[0] * v[1] + v[2], out)
        if op == "neg":
            return finish(-v[0], out)
        if op == "abs":
            return finish(np.abs(v[0]) if fl else np.array([abs(x) for x in v[0].flat], dtype=object).reshape(
                v[0].shape), out)
        if op == "recip":
            m = py_float_attr(attrs.get("div_by_zero_mask", np.nan), d)
            one = np.asarray(1, v[0].dtype)
            return finish(np.where(v[0] == 0, m, one / np.where(v[0] == 0, one, v[0])), out)
        if op == "relu":
            if fl:
                al = py_float_attr(attrs.get("alpha", 0.0), d)
                cm = py_float_attr(attrs.get("clamp_max", np.inf), d)
                y = np.where(v[0] >= 0, v[0], v[0] * al)
                return finish(np.where(y > cm, cm, y), out)
            al, cm = int(attrs.get("alpha", 0)), int(attrs.get("clamp_max", 2**63 - 1))
            ys = []
            for x in v[0].flat:
                y = x if x >= 0 else py_wrap(x * al, "i64")
                ys.append(cm if y > cm else y)
            return finish(np.array(ys, dtype=object).reshape(v[0].shape), out)
        if op in ("min", "max"):
            if fl:
                return finish((np.fmin if op == "min" else np.fmax)(v[0], v[1]), out)
            return finish(np.where((v[0] < v[1]) == (op == "min"), v[0], v[1]), out)
        if op == "sign":
            return np.array([1 if x > 0 else -1 if x < 0 else 0 for x in v[0].flat], np.int8).reshape(v[0].shape)
        if op == "clamp":
            if fl:
                lo = attrs.get("min", -1.7976931348623157e308)
                hi = attrs.get("max", 1.7976931348623157e308)
                if d == "f64":
                    return finish(np.fmin(np.fmax(v[0], lo), hi), out)
                # low precision: in f64 with f64 bounds, then f32, then the dtype
                return finish(np.fmin(np.fmax(v[0].astype(np.float64), float(lo)), float(hi)).astype(np.float32), out)
            unsigned = not D.get(d).is_signed
            lo = int(attrs.get("min", 0 if unsigned else -2**63))
            hi = int(attrs.get("max", 2**64 - 1 if unsigned else 2**63 - 1))
            return finish(np.array([min(max(x, lo), hi) for x in v[0].flat], dtype=object).reshape(v[0].shape), out)
        if op in ("floor", "ceil", "trunc"):
            return finish(getattr(np, op)(v[0]), out)
        if op == "round":
            return finish(ref_round(v[0]), out)
        if op in ("and", "or", "xor"):
            if d == "bool":
                return {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[op](v[0], v[1])
            f = {"and": lambda x, y: x & y, "or": lambda x, y: x | y, "xor": lambda x, y: x ^ y}[op]
            return finish(vec(f)(v[0], v[1]), out)
        if op == "not":
            if d == "bool":
                return ~v[0]
            return finish(np.array([~x for x in v[0].flat], dtype=object).reshape(v[0].shape), out)
        if op in ("shl", "shr"):
            bits = int(attrs["bits"])
            s = 0 if bits < 0 else bits % (8 if D.get(d).packed else 64)
            f = (lambda x: x << s) if op == "shl" else (lambda x: x >> s)
            return finish(np.array([f(x) for x in v[0].flat], dtype=object).reshape(v[0].shape), out)
        if op == "popcount":
            w = D.get(d).bits
            return np.array([bin(x & ((1 << w) - 1)).count("1") for x in v[0].flat], np.uint8).reshape(v[0].shape)
        if op in ("eq", "ne", "lt", "le", "gt", "ge"):
            f = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
                 "ge": np.greater_equal}[op]
            return np.asarray(f(v[0], v[1]), dtype=bool)
        if op == "filter":
            return np.where(v[2] != 0, xs[0], xs[1])  # NaN != 0 is true
        if op == "is_nan":
            return np.isnan(v[0])
        if op == "is_inf":
            return np.isinf(v[0])
        if op == "is_neg":
            return np.signbit(v[0]) if fl else np.array([x < 0 for x in v[0].flat], bool).reshape(v[0].shape)
        if op == "is_finite":
            return np.array(bool(np.isfinite(v[0]).all()))
        if op == "fill":
            val = attrs["value"]
            if fl:
                one = rstore(np.array(float(val)), d)
            elif d == "bool":
                one = np.array(bool(val))
            else:
                one = rep_ints(np.array(int(val), dtype=object), d)
            return np.broadcast_to(one, np.shape(xs[0])).astype(D.get(d).np_dtype)
        if op in ("sum_axis", "mean_axis", "prod_axis"):
            axes = tuple(sorted({a % v[0].ndim for a in attrs["axes"]}))
            kd = bool(attrs.get("keepdims", False))
            if fl:
                f = np.prod if op == "prod_axis" else np.sum
                y = f(v[0], axis=axes, keepdims=kd)
                if op == "mean_axis":
                    y = y / np.asarray(math.prod(v[0].shape[a] for a in axes), v[0].dtype)
                return finish(y, out)
            x = v[0]
            if op == "prod_axis":
                y = np.prod(x, axis=axes, keepdims=kd)
                y = np.vectorize(lambda t: py_wrap(int(t), "i64"), otypes=[object])(y)
            else:
                y = np.sum(x, axis=axes, keepdims=kd)
                if op == "mean_axis":  # the 64-bit (wrapped) sum, truncating division by the count
                    n = math.prod(x.shape[a] for a in axes)
                    w64 = "i64" if D.get(d).is_signed else "u64"
                    y = np.vectorize(lambda t: tdiv(py_wrap(int(t), w64), n), otypes=[object])(y)
            return finish(np.asarray(y, dtype=object), out)
        if op in ("max_axis", "min_axis", "argmax_axis", "argmin_axis"):
            return ref_scan(op, xs[0], v[0], attrs, out)
        if op == "cast":
            return ref_cast(xs[0], d, out, attrs)
        if op == "matmul":
            if fl:
                return finish(np.matmul(v[0].astype(np.float64 if d == "f64" else np.float32),
                                        v[1].astype(np.float64 if d == "f64" else np.float32)), out)
            if d == "bool":
                return np.matmul(v[0].astype(np.int64), v[1].astype(np.int64)) > 0
            return finish(np.matmul(v[0], v[1]), out)
    raise AssertionError(f"no reference for {op}")


def ref_scan(op, raw, x, attrs, out):
    """The reference kernels' scan: start with the first element, replace when strictly
    better (argmax with select_first=False: better or equal); NaN never replaces."""
    is_max = op.startswith("max") or op.startswith("argmax")
    if op.startswith("arg"):
        axes = (int(attrs["axis"]) % x.ndim,)
        select_first = bool(attrs.get("select_first", True))
    else:
        axes = tuple(sorted({a % x.ndim for a in attrs["axes"]}))
        select_first = True
    keep = [i for i in range(x.ndim) if i not in axes]
    perm = keep + list(axes)
    g = np.transpose(x, perm).reshape(tuple(x.shape[i] for i in keep) + (-1,))
    graw = np.transpose(raw, perm).reshape(g.shape)
    res_idx = np.zeros(g.shape[:-1], dtype=np.int64)
    for pos in np.ndindex(*g.shape[:-1]):
        row = g[pos]
        best, bi = row[0], 0
        for k in range(1, len(row)):
            c = row[k]
            better = (c > best) if is_max else (c < best)
            if not select_first:
                better = better or c == best
            if better:
                best, bi = c, k
        res_idx[pos] = bi
    kd = bool(attrs.get("keepdims", False))
    if op.startswith("arg"):
        return np.expand_dims(res_idx, axes[0]) if kd else res_idx
    y = np.take_along_axis(graw, res_idx[..., None], axis=-1)[..., 0]
    if kd:
        y = y.reshape(tuple(1 if i in axes else s for i, s in enumerate(x.shape)))
    return y


def ref_cast(raw, src, dst, attrs):
    s, t = D.get(src), D.get(dst)
    if s.is_float and t.is_float:
        w = np.asarray(raw).astype(np.float64)
        return w if dst == "f64" else rstore(w.astype(np.float32), dst)
    if s.is_float:
        mode = attrs.get("rounding_mode", "trunc")
        sat = bool(attrs.get("saturate", True))
        outv = []
        for x in np.asarray(raw).astype(np.float64).flat:
            x = float(x)
            if math.isnan(x):
                outv.append(0)
                continue
            if math.isinf(x):
                outv.append((t.max if x > 0 else t.min) if sat else 0)
                continue
            r = {"trunc": math.trunc, "floor": math.floor, "ceil": math.ceil,
                 "nearest": lambda z: int(math.copysign(math.floor(abs(z) + 0.5), z))}[mode](x)
            outv.append(min(max(r, t.min), t.max) if sat else py_wrap(r, dst))
        return np.array(outv, dtype=t.np_dtype).reshape(np.shape(raw))
    vals = as_values(raw, src)
    if t.is_float:
        w = np.array([float(int(x)) for x in vals.flat], np.float64).reshape(vals.shape)  # exact-ish via f64
        return w if dst == "f64" else rstore(w.astype(np.float32), dst)
    return rep_ints(vals, dst)


# ------------------------------------------------------------------ comparison


def assert_same(got, want, d, name, tol=False, op=None):
    """A kernel's result against the NumPy reference: bit for bit (NaN equal to NaN); `tol`: within
    atol/rtol (a reduction the reference sums in another order). Where neither holds, `op`'s entry
    in conftest's per-device EXACTNESS table decides (none on a CPU: exact there)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
    if not D.get(d).is_float:
        np.testing.assert_array_equal(got, want, err_msg=name)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    ok = (g == w) | (np.isnan(g) & np.isnan(w))
    if tol:
        atol, rtol = {"f64": (1e-9, 1e-9), "f32": (1e-4, 1e-4), "f16": (1e-3, 2e-3), "bf16": (1e-2, 1.6e-2),
                      "f8": (1e-2, 0.26)}[d]
        with np.errstate(invalid="ignore"):
            ok |= np.abs(g - w) <= atol + rtol * np.maximum(np.abs(g), np.abs(w))
    if op is not None and not ok.all() and tolerance((op,)):  # this device's allowance for the op
        assert_matches({name: np.where(ok, want, got)}, {name: want}, ops=(op,))
        return
    bad = ~ok
    assert not bad.any(), f"{name}: got {got[bad][:8]} want {want[bad][:8]} (at {np.argwhere(bad)[:4].tolist()})"


# ------------------------------------------------------------------ case generation

ROUNDED_SUMS = {"sum_axis", "mean_axis", "prod_axis", "matmul"}


def attr_variants(op, d, rng):
    fl = D.get(d).is_float
    unsigned = D.get(d).family in (D.UNSIGNED, D.BITSET)
    if op in ("div", "recip", "floor_div"):
        return [{}, {"div_by_zero_mask": 2.5 if fl else 5}, {"div_by_zero_mask": True}]
    if op == "relu":
        return [{}, {"alpha": 0.1, "clamp_max": 6.0} if fl else {"alpha": 3, "clamp_max": 50},
                {"alpha": -2 if not fl else -2.0, "clamp_max": -1}, {"negative_slope": 1 if not fl else 0.25}]
    if op == "clamp":
        if fl:
            return [{}, {"min": -1.5, "max": 2.0}, {"min": 0.1, "max": 1e300}, {"min": 3.0, "max": -3.0}]
        return [{}, {"min": 0 if unsigned else -3, "max": 7}, {"min": 300, "max": 400}, {"max": 5}]
    if op in ("shl", "shr"):
        return [{"bits": b} for b in (-1, 1, 9, 63, 70)]
    if op == "fill":
        if fl:
            return [{"value": 0.1}, {"value": -3}, {"value": True}, {"value": 1e10}]
        if d == "bool":
            return [{"value": True}, {"value": 0}, {"value": 7}]
        return [{"value": 5}, {"value": 300}, {"value": 2**64 - 1 if unsigned else -(2**63)}, {"value": False}]
    if op in ("sum_axis", "mean_axis", "prod_axis", "max_axis", "min_axis"):
        return [{"axes": (1, 1)}, {"axes": (0, -1), "keepdims": True}, {"axes": (-2,), "keepdims": 1}]
    if op in ("argmax_axis", "argmin_axis"):
        return [{"axis": 1}, {"axis": 0, "keepdims": True}, {"axis": -1, "select_first": False}]
    return [{}]


def inputs_for(op, d, rng):
    spec = REGISTRY[op]
    if op == "matmul":
        return [gen(d, rng, (2, 3, 4)), gen(d, rng, (4, 5))]
    xs = [gen(d, rng) for _ in range(spec.arity)]
    if op in ("div", "floor_div", "rem") and d != "bool":
        xs[1].reshape(-1)[:5] = np.zeros(5, xs[1].dtype)  # zero divisors
        if D.get(d).is_signed:
            xs[0].reshape(-1)[6], xs[1].reshape(-1)[6] = D.get(d).min, -1  # min / -1
    if op == "filter" and D.get(d).is_float:
        xs[2].reshape(-1)[:3] = np.array([np.nan, 0.0, -0.0]).astype(xs[2].dtype)
    if op in ("max_axis", "argmax_axis", "min_axis", "argmin_axis") and D.get(d).is_float:
        xs[0][0, :] = xs[0][0, 0]  # ties
        xs[0][1, 0] = np.nan  # NaN first
    return xs


def cases_for(op):
    rng = np.random.default_rng(RNG_SEED + sum(map(ord, op)))
    spec = REGISTRY[op]
    out = []
    for d in sorted(spec.normal_dtypes):
        for attrs in attr_variants(op, d, rng):
            xs = inputs_for(op, d, rng)
            rule = spec.type_rule
            od = rule.get("dtype", d) if rule["kind"] == "fixed" else d
            out.append(dict(dtype=d, out=od, mode="normal", attrs=attrs, xs=xs))
            if spec.inplace:
                out.append(dict(dtype=d, out=od, mode="inplace", attrs=attrs, xs=xs))
    for d, acc in sorted(spec.accumulate_pairs):
        for attrs in attr_variants(op, d, rng)[:2]:
            out.append(dict(dtype=d, out=acc, mode="accumulate", attrs={**attrs, "acc": acc},
                            xs=inputs_for(op, d, rng)))
    if spec.broadcast and op != "matmul":
        for d in sorted(spec.normal_dtypes)[:6]:
            xs = [gen(d, rng), gen(d, rng, (6,))]
            if op in ("div", "floor_div", "rem"):
                xs[1][0] = np.zeros((), xs[1].dtype)
            out.append(dict(dtype=d, out=d, mode="normal", attrs={}, xs=xs))
            out.append(dict(dtype=d, out=d, mode="normal", attrs={}, xs=[xs[0], gen(d, rng, ())]))
    return out


def cast_cases():
    rng = np.random.default_rng(RNG_SEED)
    out = []
    for src in sorted(REGISTRY["cast"].normal_dtypes):
        x = gen(src, rng)
        if D.get(src).is_float:
            x.reshape(-1)[:6] = rstore(np.array([-5.0, 260.0, 3.7, -3.7, 2.5, -2.5]), src)
        for dst in sorted(REGISTRY["cast"].output_dtypes):
            if not cast_allowed(src, dst):
                continue
            variants = [{"to": dst}]
            if D.get(src).is_float and not D.get(dst).is_float:  # 2 of the 8 (mode, saturate) combos per
                k = len(out)                                      # pair, cycling so all 8 are covered
                combos = [(m, s) for m in ("trunc", "floor", "ceil", "nearest") for s in (True, False)]
                variants = [{"to": dst, "rounding_mode": m, "saturate": s}
                            for m, s in (combos[k % 8], combos[(k + 3) % 8])]
            for attrs in variants:
                out.append(dict(dtype=src, out=dst, mode="normal", attrs=attrs, xs=[x]))
    return out


def run_cases(op, cases):
    """All of an op's cases in one jitted function (static config closed over)."""
    def many(all_xs):
        return [apply(op, xs, c["attrs"], in_dtypes=[c["dtype"]] * len(xs), out_dtype=c["out"], mode=c["mode"])
                for c, xs in zip(cases, all_xs)]
    with jax.enable_x64(True):
        got = jax.jit(many)([[jnp.asarray(x) for x in c["xs"]] for c in cases])
        return [np.asarray(g) for g in got]


OPS = sorted(n for n in REGISTRY if n != "cast")


@pytest.mark.parametrize("op", OPS)
def test_op_against_reference(op):
    cases = cases_for(op)
    assert cases
    got = run_cases(op, cases)
    for c, g in zip(cases, got):
        want = ref(op, c["xs"], {k: v for k, v in c["attrs"].items() if k != "acc"} |
                   ({"alpha": c["attrs"]["negative_slope"]} if "negative_slope" in c["attrs"] else {}),
                   c["dtype"], c["out"], c["mode"])
        name = f"{op}[{c['dtype']}->{c['out']} {c['mode']} {c['attrs']}]"
        assert_same(g, want, c["out"], name, tol=op in ROUNDED_SUMS and D.get(c["out"]).is_float, op=op)


def test_cast_against_reference():
    cases = cast_cases()
    assert len(cases) > 100
    combos = {(c["attrs"].get("rounding_mode"), c["attrs"].get("saturate")) for c in cases}
    assert len(combos) == 9  # 8 float->int combos + the plain {"to": ...}
    got = run_cases("cast", cases)
    for c, g in zip(cases, got):
        want = ref_cast(c["xs"][0], c["dtype"], c["out"], c["attrs"])
        assert_same(g, want, c["out"], f"cast[{c['dtype']}->{c['out']} {c['attrs']}]", op="cast")


def test_every_op_dtype_mode_is_covered():
    for op, spec in REGISTRY.items():
        cases = cast_cases() if op == "cast" else cases_for(op)
        seen = {(c["dtype"], c["mode"]) for c in cases}
        for d in spec.normal_dtypes:
            assert (d, "normal") in seen, (op, d)
            if spec.inplace:
                assert (d, "inplace") in seen, (op, d)
        for d, acc in spec.accumulate_pairs:
            assert any(c["dtype"] == d and c["out"] == acc and c["mode"] == "accumulate" for c in cases)


# ------------------------------------------------------------------ f8 encoder


def test_f8_encoder_bit_exact_with_numpy():
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, size=400_000, dtype=np.uint64).astype(np.uint32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.9, 3.8, 0.95, -0.95, 57344.0, 61439.0, 61440.0,
                        65536.0, 2.0**-14, 2.0**-15 * 1.5, 2.0**-16, 2.0**-17, 2.0**-17 * 1.01, 2.0**-18, 1e-40, -1e-40,
                        3.4e38, 1.25, 1.125, 1.375, 0.75], np.float32)
    x = np.concatenate([bits.view(np.float32), special, (rng.normal(size=100_000) * 50).astype(np.float32),
                        (rng.normal(size=20_000) * 1e-5).astype(np.float32)])
    with jax.enable_x64(False):
        got = np.asarray(jax.jit(JN.f8_encode_bits)(x))
    np.testing.assert_array_equal(got, HN.f8_encode_bits(x))
    assert got[len(bits):len(bits) + 10].tolist() == [0x00, 0x80, 0x7C, 0xFC, 0x7D, 0x7D, 0x3C, 0x40, 0x38, 0xB8]
    np.testing.assert_array_equal(np.asarray(JN.f8_encode(special)).view(np.uint8), HN.f8_encode_bits(special))


# ------------------------------------------------------------------ spec examples (explicit values)

EXAMPLES = [
    ("add", ["i8", "i8"], "i16", "accumulate", [[127], [1]], {"acc": "i16"}, [128]),
    ("sub", ["u8", "u8"], "u16", "accumulate", [[0], [1]], {"acc": "u16"}, [65535]),
    ("sub", ["u2", "u2"], "u8", "accumulate", [[0], [1]], {"acc": "u8"}, [255]),
    ("sub", ["u8", "u8"], "u8", "normal", [[1], [2]], {}, [255]),
    ("add", ["i4", "i4"], "i4", "normal", [[7], [1]], {}, [-8]),
    ("add", ["u2", "u2"], "u2", "normal", [[3], [1]], {}, [0]),
    ("abs", ["i8"], "i16", "accumulate", [[-128]], {"acc": "i16"}, [128]),
    ("abs", ["i8"], "i8", "normal", [[-128]], {}, [-128]),
    ("neg", ["i1"], "i1", "normal", [[-1]], {}, [-1]),
    ("div", ["i8", "i8"], "i8", "normal", [[-128, -7], [-1, 2]], {}, [-128, -3]),
    ("floor_div", ["i32", "i32"], "i32", "normal", [[7, -7, 7, -7], [2, 2, -2, -2]], {}, [3, -4, -3, 4]),
    ("rem", ["i32", "i32"], "i32", "normal", [[-7, 7, 3], [3, -3, 0]], {}, [-1, 1, 0]),
    ("relu", ["i8"], "i8", "normal", [[-100]], {"alpha": 3}, [-44]),
    ("not", ["u8"], "u8", "normal", [[77]], {}, [178]),
    ("shl", ["u8"], "u8", "normal", [[3]], {"bits": 9}, [0]),
    ("shl", ["u8"], "u8", "normal", [[3]], {"bits": 64}, [3]),
    ("popcount", ["i8"], "u8", "normal", [[-1, -2, 5]], {}, [8, 7, 2]),
    ("popcount", ["i4"], "u8", "normal", [[-8, -1]], {}, [1, 4]),
    ("popcount", ["i2"], "u8", "normal", [[-1]], {}, [2]),
    ("popcount", ["i16"], "u8", "normal", [[-1]], {}, [16]),
    ("cast", ["f32"], "u8", "normal", [[-5.0, 260.0]], {"to": "u8"}, [0, 255]),
    ("cast", ["f32"], "i32", "normal", [[3.7, -3.7]], {"to": "i32"}, [3, -3]),
    ("cast", ["f32"], "u8", "normal", [[-5.0, 260.0]], {"to": "u8", "saturate": False}, [251, 4]),
    ("round", ["f32"], "f32", "normal", [[2.5, -2.5, 0.5]], {}, [3.0, -3.0, 1.0]),
    ("sign", ["f32"], "i8", "normal", [[np.nan, -0.0, -3.0, 2.0]], {}, [0, 0, -1, 1]),
    ("is_neg", ["f32"], "bool", "normal", [[-0.0, 0.0]], {}, [True, False]),
    ("mean_axis", ["i32"], "i32", "normal", [[[-7, 0]]], {"axes": (1,)}, [-3]),
    ("fill", ["f8"], "f8", "normal", [[0.0]], {"value": 1.9}, [1.0]),
]


@pytest.mark.parametrize("op,in_dtypes,out,mode,xs,attrs,want", EXAMPLES, ids=[f"{e[0]}-{i}" for i, e in
                                                                            enumerate(EXAMPLES)])
def test_spec_examples(op, in_dtypes, out, mode, xs, attrs, want):
    with jax.enable_x64(True):
        arrays = [np.asarray(x).astype(D.get(d).np_dtype) for x, d in zip(xs, in_dtypes)]
        got = np.asarray(apply(op, arrays, attrs, in_dtypes=in_dtypes, out_dtype=out, mode=mode))
    assert got.dtype == D.get(out).np_dtype
    np.testing.assert_array_equal(got.astype(np.float64).reshape(-1), np.asarray(want, np.float64))


def test_clamp_f64_keeps_precision_and_nan_goes_to_lower_bound():
    with jax.enable_x64(True):
        x = np.array([np.nan, 0.1, 5.0], np.float64)
        got = np.asarray(apply("clamp", [x], {"min": 0.10000000000000002, "max": 1.0}, in_dtypes=["f64"],
                               out_dtype="f64", mode="normal"))
        assert got.tolist() == [0.10000000000000002, 0.10000000000000002, 1.0]
        got = np.asarray(apply("clamp", [np.array([np.nan], np.float64)], {}, in_dtypes=["f64"], out_dtype="f64",
                               mode="normal"))
        assert got.tolist() == [-1.7976931348623157e308]
        got = np.asarray(apply("clamp", [np.array([np.nan], np.float16)], {}, in_dtypes=["f16"], out_dtype="f16",
                               mode="normal"))
        assert got.tolist() == [-np.inf]
        got = np.asarray(apply("fill", [np.zeros(1)], {"value": 0.1}, in_dtypes=["f64"], out_dtype="f64",
                               mode="normal"))
        assert got.tolist() == [0.1]


# ------------------------------------------------------------------ traced attributes, eager, no-x64


TRACED = [
    ("div", "f32", {"div_by_zero_mask": 7.0}), ("div", "i16", {"div_by_zero_mask": 9}),
    ("recip", "bf16", {"div_by_zero_mask": -1.0}), ("relu", "f16", {"alpha": 0.5, "clamp_max": 2.0}),
    ("relu", "i32", {"alpha": 2, "clamp_max": 10}), ("clamp", "f32", {"min": -1.0, "max": 1.0}),
    ("clamp", "u16", {"min": 3, "max": 9}), ("fill", "f8", {"value": 1.9}), ("fill", "i4", {"value": 9}),
    ("fill", "bool", {"value": True}), ("shl", "i16", {"bits": 70}), ("shr", "u4", {"bits": -2}),
    ("argmax_axis", "f32", {"axis": 1, "select_first": False}),
]


@pytest.mark.parametrize("op,d,attrs", TRACED, ids=[f"{t[0]}-{t[1]}" for t in TRACED])
def test_variable_valued_attrs_match_static(op, d, attrs):
    rng = np.random.default_rng(3)
    spec = REGISTRY[op]
    xs = [gen(d, rng) for _ in range(spec.arity)]
    static = {k: v for k, v in attrs.items() if k in ("axis",)}
    dynamic = {k: v for k, v in attrs.items() if k not in static}
    out = "i64" if op == "argmax_axis" else d
    with jax.enable_x64(True):
        want = np.asarray(apply(op, xs, attrs, in_dtypes=[d] * spec.arity, out_dtype=out, mode="normal"))
        f = jax.jit(lambda xs, dyn: apply(op, xs, {**static, **dyn}, in_dtypes=[d] * spec.arity, out_dtype=out,
                                          mode="normal"))
        got = np.asarray(f(xs, {k: jnp.asarray(v) for k, v in dynamic.items()}))
    assert_same(got, want, out, op, op=op)


def test_without_x64_32bit_paths_work():
    rng = np.random.default_rng(5)
    with jax.enable_x64(False):
        for op, d, attrs in [("add", "i8", {}), ("mul", "u4", {}), ("div", "i32", {}), ("add", "f8", {}),
                             ("matmul", "bf16", {}), ("shl", "u32", {"bits": 33}), ("clamp", "i16", {"min": -3}),
                             ("relu", "i8", {"alpha": 2}), ("sum_axis", "i8", {"axes": (1,)}),
                             ("cast", "f32", {"to": "i32", "saturate": False})]:
            spec = REGISTRY[op]
            xs = inputs_for(op, d, rng)
            out = attrs.get("to", d)
            got = np.asarray(apply(op, xs, attrs, in_dtypes=[d] * spec.arity, out_dtype=out, mode="normal"))
            want = ref_cast(xs[0], d, out, attrs) if op == "cast" else ref(op, xs, attrs, d, out, "normal")
            assert_same(got, want, out, f"{op}[{d}] no-x64", tol=op in ROUNDED_SUMS, op=op)


def _in_order_reference(x: np.ndarray, axes, kind: str, acc_dtype) -> np.ndarray:
    """SPEC §6.4: accumulate in row-major input order, one element after another, each partial
    rounded in the accumulation dtype (a Python loop: NumPy's own sum is pairwise)."""
    keep = [i for i in range(x.ndim) if i not in axes]
    g = np.transpose(x, keep + sorted(axes)).reshape([x.shape[i] for i in keep] + [-1]).astype(acc_dtype)
    out = np.full(g.shape[:-1], 1 if kind == "prod" else 0, acc_dtype)
    for i in range(g.shape[-1]):
        out = (out * g[..., i] if kind == "prod" else out + g[..., i]).astype(acc_dtype)
    if kind == "mean":
        out = (out / acc_dtype(g.shape[-1])).astype(acc_dtype)
    return out


@pytest.mark.parametrize("dtype,shape,axes", [("f32", (3, 200), [1]), ("f32", (5, 7, 9), [0, 2]), ("f16", (2, 100), [1]),
                                              ("f64", (70,), [0]), ("f32", (4, 20), [1])])
def test_float_reductions_accumulate_in_row_major_order(dtype, shape, axes):
    """sum/mean/prod_axis on floats add one element after another in row-major input order (SPEC
    §6.4), compiled and interpreted alike: XLA's own reduce (a vectorized, tree-shaped order)
    gave another result from 64 elements on (the helper probe: [2^24, 1 x 63] summed to 2^24 + 32,
    where OpenInfer's loop keeps 2^24), and the interpreter, sharing the kernel, agreed with it."""
    np_dtype = {"f32": np.float32, "f16": np.float16, "f64": np.float64}[dtype]
    acc = np.float64 if dtype == "f64" else np.float32  # f16 accumulates in f32, rounded once
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * rng.choice([1, 1e4, 1e-3], size=shape)).astype(np_dtype)
    prod_x = (1 + rng.standard_normal(shape) / 50).astype(np_dtype)  # a product that stays finite
    dims = ", ".join(map(str, shape))
    out_shape = [d for i, d in enumerate(shape) if i not in axes]
    out_t = f"{dtype}[{', '.join(map(str, out_shape))}]" if out_shape else dtype
    src = (f"dynamic {{ x: {dtype}[{dims}]; p: {dtype}[{dims}]; }}\n"
           f"volatile {{ s: {out_t}; m: {out_t}; q: {out_t}; }}\n"
           f"block entry {{ op sum_axis(x, axes={axes}) >> s; op mean_axis(x, axes={axes}) >> m; "
           f"op prod_axis(p, axes={axes}) >> q; return; }}\n")
    want = {"s": _in_order_reference(x, axes, "sum", acc), "m": _in_order_reference(x, axes, "mean", acc),
            "q": _in_order_reference(prod_x, axes, "prod", acc)}
    for mode in ("compiled", "interpret"):
        got = oi2jax.compile(src, mode=mode).run({"x": x, "p": prod_x})
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value.astype(np_dtype), err_msg=f"{mode} {name}")
    ones = np.ones(64, np.float32)
    ones[0] = 2 ** 24
    one_src = "dynamic { x: f32[64]; }\nvolatile { s: f32; }\nblock entry { op sum_axis(x, axes=[0]) >> s; return; }\n"
    for mode in ("compiled", "interpret"):
        assert oi2jax.compile(one_src, mode=mode).run({"x": ones})["s"] == np.float32(2 ** 24)


def test_subnormals_read_as_zero_on_a_cpu_as_documented():
    """docs/semantics.md, "Subnormal floats on a CPU": XLA:CPU runs with flush-to-zero and
    denormals-are-zero, compiled and interpreted alike; pinned here so that a JAX which keeps
    subnormals shows up (and the page changes with it)."""
    from conftest import device_platform
    if device_platform() != "cpu":
        pytest.skip("the CPU's flush-to-zero")
    src = ("dynamic { a: f32[3]; b: f32[3]; }\nvolatile { q: f32[3]; s: f32[3]; z: bool[3]; }\n"
           "block entry { op div(a, b) >> q; op add(a, a) >> s; op eq(a, b) >> z; return; }\n")
    a = np.array([1e-38, 1e-40, 1], np.float32)
    b = np.array([100, 0, 1e-40], np.float32)
    for mode in ("compiled", "interpret"):
        out = oi2jax.compile(src, mode=mode).run({"a": a, "b": b})
        assert out["s"].tolist() == [0.0, 0.0, 2.0], mode  # 2e-38 and 2e-40 in IEEE arithmetic
        assert out["z"].tolist() == [False, True, False], mode  # 1e-40 == 0
        assert out["q"][0] == 0 and np.isnan(out["q"][1:]).all(), mode  # a subnormal divisor: the mask (0 -> NaN)
