"""`oi2jax.ops.infer`: modes, output dtypes/shapes, and one case per error message."""
from __future__ import annotations

import json

import pytest

from oi2jax import dtypes as D
from oi2jax.ir import Literal as L
from oi2jax.ops import REGISTRY, OpSig, OpTypeError, cast_allowed, infer

from conftest import SHARED


def f(v):
    return L("float", v)


def i(v):
    return L("int", v)


def b(v):
    return L("bool", v)


def dt(v):
    return L("dtype", v)


def axes(*v):
    return L("int_list", tuple(v))


# ------------------------------------------------------------------ registry


def test_registry_matches_schema():
    src = json.loads((SHARED / "ops.json").read_text())
    assert len(REGISTRY) == 47 == len(src["ops"])
    for op in src["ops"]:
        spec = REGISTRY[op["name"]]
        sup = src["dtype_sets"][op["dtype_support_ref"]]
        assert spec.arity == op["inputs"]["count"]
        assert spec.broadcast == (op["broadcast"] == "allow")
        assert spec.inplace == (op["inplace"] == "allow")
        assert spec.accumulate == (op["accumulate"] == "allow")
        assert set(spec.attrs) == set(op["attrs"])
        assert spec.normal_dtypes == set(sup["normal"])
        assert spec.accumulate_pairs == {(p["input"], p["acc"]) for p in sup["accumulate"]}
        assert spec.kernel is not None
        assert spec.category == op["category"]
    assert REGISTRY["shl"].attrs["bits"].required and REGISTRY["cast"].attrs["to"].kind == "dtype"
    assert REGISTRY["sum_axis"].attrs["axes"].kind == "int_list"
    assert REGISTRY["cast"].attrs["rounding_mode"].default == "trunc"


def test_package_does_not_read_shared():
    import oi2jax.ops.builtin as r  # the built-in declarations read the generated table
    assert r._TABLE_PATH.parent.name == "ops" and r._TABLE_PATH.exists()


# ------------------------------------------------------------------ successes


def test_modes_and_dtypes():
    assert infer("add", ["f32", "f32"], [(2, 3), (3,)], {}) == OpSig("normal", "f32", (2, 3))
    assert infer("add", ["f32", "f32"], [(2, 3), ()], {}, "x", ["x", "y"]) == OpSig("inplace", "f32", (2, 3))
    assert infer("add", ["i8", "i8"], [(4,), (4,)], {"acc": dt("i16")}).mode == "accumulate"
    assert infer("add", ["i8", "i8"], [(4,), (4,)], {"acc": dt("i16")}).out_dtype == "i16"
    assert infer("sub", ["u2", "u2"], [None, None], {"acc": dt("u8")}) == OpSig("accumulate", "u8", None)
    assert infer("eq", ["f16", "f16"], [(2,), (2,)], {}).out_dtype == "bool"
    assert infer("sign", ["f32"], [(2,)], {}).out_dtype == "i8"
    assert infer("popcount", ["i4"], [(2,)], {}).out_dtype == "u8"
    assert infer("argmax_axis", ["f32"], [(2, 3)], {"axis": i(-1)}) == OpSig("normal", "i64", (2,))
    assert infer("cast", ["f32"], [(2,)], {"to": dt("u8")}).out_dtype == "u8"
    assert infer("is_finite", ["f32"], [(2, 3)], {}).out_shape == ()
    assert infer("matmul", ["f16", "f16"], [(5, 2, 3), (1, 3, 4)], {}).out_shape == (5, 2, 4)
    assert infer("matmul", ["i4", "i4"], [(2, 3), (3, 4)], {"acc": dt("i32")}) == OpSig("accumulate", "i32", (2, 4))
    assert infer("fill", ["bitset"], [(3,)], {"value": i(300)}).out_dtype == "bitset"


def test_reduction_shapes():
    s = infer("sum_axis", ["f32"], [(2, 3, 4)], {"axes": axes(-1, 0, 2)})
    assert s.out_shape == (3,)
    s = infer("max_axis", ["i8"], [(2, 3, 4)], {"axes": axes(1), "keepdims": b(True)})
    assert s.out_shape == (2, 1, 4)
    s = infer("mean_axis", ["i8"], [(2, 3)], {"axes": axes(1), "keepdims": i(1)})  # any scalar kind (§11.30)
    assert s.out_shape == (2, 1)
    assert infer("prod_axis", ["f32"], [(2, 3)], {"axes": axes(0), "keepdims": L("var", "k")}).out_shape is None


def test_aliases_vars_and_unknown_shapes():
    assert infer("relu", ["f32"], [(2,)], {"negative_slope": f(0.1)}).out_dtype == "f32"
    assert infer("relu", ["i8"], [(2,)], {"alpha": L("var", "leak")}).mode == "normal"
    assert infer("add", ["f32", "f32"], [None, (3,)], {}).out_shape is None
    assert infer("cast", ["f32"], [None], {"to": dt("i32"), "rounding_mode": L("str", "nearest"),
                                           "saturate": b(False)}).out_dtype == "i32"
    assert infer("shl", ["u8"], [(1,)], {"bits": i(-3)}).out_dtype == "u8"  # negative bits: shift 0
    assert infer("clamp", ["i8"], [(1,)], {"min": i(-3), "max": b(True)}).out_dtype == "i8"
    assert infer("fill", ["f64"], [(1,)], {"value": b(True)}).out_dtype == "f64"


def test_cast_pairs():
    assert cast_allowed("f8", "u64") and cast_allowed("f64", "f16") and cast_allowed("f32", "f32")
    assert cast_allowed("i8", "i16") and not cast_allowed("i8", "i8") and not cast_allowed("i32", "i16")
    assert not cast_allowed("i8", "u8") and not cast_allowed("u8", "i16") and cast_allowed("u8", "f8")
    assert cast_allowed("i4", "i8") and cast_allowed("u2", "u8") and not cast_allowed("i4", "u8")
    assert not cast_allowed("f32", "i4") and not cast_allowed("bool", "f32") and not cast_allowed("bool", "bool")
    # SPEC-2026-03 D4: to=bool from every dtype cast takes
    assert all(cast_allowed(d, "bool") for d in ("f8", "bf16", "f32", "f64", "i8", "u64", "i4", "u1"))


# ------------------------------------------------------------------ one case per error message

ERRORS = [
    (("frob", ["f32"], [None], {}), "unsupported op frob", None, None),
    (("add", ["f32"], [None], {}), r"op add expects Fixed\(2\) inputs, got 1", None, None),
    (("relu", ["f32"], [None], {"acc": dt("f64")}), "op relu does not support accumulation", "acc", None),
    (("eq", ["f32", "f32"], [(2,), (1,)], {}), "op eq does not allow broadcast inputs", None, 1),
    (("fma", ["f32"] * 3, [(2,), (2,), (3,)], {}), "op fma does not allow broadcast inputs", None, 2),
    (("add", ["bool", "bool"], [None, None], {"acc": dt("i8")}),
     "op add does not support bool -> i8 for mode accumulate", "acc", None),
    (("sub", ["bool", "bool"], [None, None], {}), "op sub does not support bool -> bool for mode normal", None, 0),
    (("add", ["f16", "f16"], [None, None], {"acc": dt("f32")}),
     "op add does not support f16 -> f32 for mode accumulate", "acc", None),
    (("relu", ["f32"], [None], {"beta": f(1.0)}), "unsupported relu setting: beta", "beta", None),
    (("relu", ["f32"], [None], {"alpha": L("str", "x")}), "unsupported relu setting type: alpha", "alpha", None),
    (("sum_axis", ["f32"], [None], {"axes": i(1)}), "unsupported sum_axis setting type: axes", "axes", None),
    (("cast", ["f32"], [None], {"to": f(1.0)}), "unsupported cast setting type: to", "to", None),
    (("popcount", ["u8"], [None], {}, "x", ["x"]), "op popcount does not support inplace writes", None, None),
    (("add", ["f32", "f16"], [None, None], {}), "input 1 has dtype f16, expected f32", None, 1),
    (("add", ["f32", "f32"], [(2, 3), (4,)], {}), "incompatible broadcast dims 3 and 4", None, None),
    (("matmul", ["f32", "f32"], [(3,), (3, 4)], {}), r"matmul expects inputs with rank >= 2", None, 0),
    (("matmul", ["f32", "f32"], [(2, 3), (4, 5)], {}), "matmul inner dim mismatch", None, 1),
    (("sum_axis", ["f32"], [(2, 3)], {"axes": axes(2)}), "axis 2 out of range for rank 2", "axes", None),
    (("argmax_axis", ["f32"], [(2, 3)], {"axis": i(-3)}), "axis -3 out of range for rank 2", None, None),
    (("shl", ["u8"], [None], {}), "shl requires bits attribute", "bits", None),
    (("shr", ["u8"], [None], {}), "shr requires bits attribute", "bits", None),
    (("fill", ["f32"], [None], {}), "fill requires value attribute", "value", None),
    (("mean_axis", ["f32"], [None], {}), "mean_axis requires axes attribute", "axes", None),
    (("min_axis", ["f32"], [None], {"axes": axes()}), "non-empty axes", "axes", None),
    (("argmin_axis", ["f32"], [None], {}), "argmin_axis requires axis attribute", "axis", None),
    (("cast", ["f32"], [None], {}), "cast requires to attribute", "to", None),
    (("cast", ["i8"], [None], {"to": dt("u8")}), "unsupported cast from i8 to u8", "to", None),
    (("cast", ["f32"], [None], {"to": dt("i4")}), "unsupported cast from f32 to i4", "to", None),
    (("cast", ["f32"], [None], {"to": dt("i8"), "rounding_mode": L("str", "up")}), "rounding_mode", "rounding_mode",
     None),
    (("relu", ["i8"], [None], {"alpha": f(0.0)}), "alpha must be an integer for i8", "alpha", None),
    (("clamp", ["i32"], [None], {"max": f(3.5)}), "max must be an integer for i32", "max", None),
    (("div", ["u8", "u8"], [None, None], {"div_by_zero_mask": f(1.0)}), "div_by_zero_mask must be an integer",
     "div_by_zero_mask", None),
    (("fill", ["bool"], [None], {"value": f(1.0)}), "value must be an integer for bool", "value", None),
    (("shl", ["i8"], [None], {"bits": f(1.0)}), "bits must be an integer", "bits", None),
    (("argmax_axis", ["f32"], [None], {"axis": f(1.0)}), "axis must be an integer", "axis", None),
    (("clamp", ["u8"], [None], {"min": i(-1)}), "min must be non-negative for unsigned dtype u8", "min", None),
    (("fill", ["u4"], [None], {"value": i(-2)}), "value must be non-negative for unsigned dtype u4", "value", None),
    (("floor_div", ["u16", "u16"], [None, None], {"div_by_zero_mask": i(-1)}), "must be non-negative", None, None),
    (("relu", ["f32"], [None], {"alpha": f(0.1), "negative_slope": f(0.2)}), "duplicate setting: alpha", None,
     None),
    (("add", ["f32", "f32"], [None, None], {"acc": dt("q7")}), "unknown dtype q7", "acc", None),
]


@pytest.mark.parametrize("args,message,attr,input", ERRORS, ids=[e[1][:40] for e in ERRORS])
def test_errors(args, message, attr, input):
    with pytest.raises(OpTypeError, match=message) as info:
        infer(*args)
    if attr is not None:
        assert info.value.attr == attr
    if input is not None:
        assert info.value.input == input
    assert str(info.value) == info.value.message


def test_float_values_fine_for_float_consumers():
    for op, attrs in [("relu", {"alpha": f(0.1), "clamp_max": L("float", float("inf"))}),
                      ("clamp", {"min": i(-1), "max": b(True)}), ("fill", {"value": i(3)}),
                      ("div", {"div_by_zero_mask": b(False)})]:
        dts = ["f16"] * REGISTRY[op].arity
        assert infer(op, dts, [None] * len(dts), attrs).out_dtype == "f16"


def test_every_op_every_normal_dtype_types():
    for name, spec in REGISTRY.items():
        req = {"shl": {"bits": i(1)}, "shr": {"bits": i(1)}, "fill": {"value": i(1)}, "cast": {"to": dt("f32")},
               "argmax_axis": {"axis": i(0)}, "argmin_axis": {"axis": i(0)}}.get(name, {})
        if spec.category == "reduction" and "axes" in spec.attrs:
            req = {"axes": axes(0)}
        for d in spec.normal_dtypes:
            shapes = [(2, 2)] * spec.arity
            sig = infer(name, [d] * spec.arity, shapes, req)
            assert D.is_dtype(sig.out_dtype)
        for src, acc in spec.accumulate_pairs:
            sig = infer(name, [src] * spec.arity, [(2, 2)] * spec.arity, {**req, "acc": dt(acc)})
            assert sig.out_dtype == acc and sig.mode == "accumulate"
