"""Values at the edges of their dtypes, where a compiled program once differed from the SPEC
(and from the interpreter): each case runs every way (`run_both`: interpreted, one call per
step, fused) and asserts the SPEC's value, written here with NumPy."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from conftest import run_both
from oi2jax.diagnostics import OiError

# i64/u64 values whose rounding to f32 straight from the integer differs from the SPEC's via f64
# (§6.4: an integer converts to f64, then rounds to f32, then to the target): the f64 rounding
# lands on a tie that f32 then breaks to even.
WIDE = {
    "i64": np.array([2**60 + 2**36 + 1, -(2**60 + 2**36 + 1), 2**62 + 2**38 + 1, 2**63 - 1, -2**63, 2**53 + 1, 0, -1],
                    np.int64),
    "u64": np.array([2**60 + 2**36 + 1, 2**63 + 2**39 + 1, 2**64 - 1, 2**63, 0, 1, 2**53 + 1, 2**40 + 2**16 + 1],
                    np.uint64),
}


@pytest.mark.parametrize("src", sorted(WIDE))
def test_wide_integer_to_float_casts_round_via_f64(src):
    x = WIDE[src]
    out = run_both(f"dynamic {{ x: {src}[8]; }}\nvolatile {{ a: f32[8]; b: bf16[8]; h: f16[8]; }}\n"
                   "block entry {\n  op cast(x, to=f32) >> a;\n  op cast(x, to=bf16) >> b;\n"
                   "  op cast(x, to=f16) >> h;\n  return;\n}\n", {"x": x})
    via = x.astype(np.float64).astype(np.float32)
    assert via[0] == 2.0**60  # one rounding of 2^60 + 2^36 + 1 to f32 gives 2^60 + 2^37
    np.testing.assert_array_equal(out["a"], via)
    np.testing.assert_array_equal(out["b"].astype(np.float32), via.astype(ml_dtypes.bfloat16).astype(np.float32))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out["h"].astype(np.float32), via.astype(np.float16).astype(np.float32))


LOOP = ("dynamic {{ s: {s}; e: {e}; }}\nvolatile {{ c: i32; one: i32 @init(1); }}\n"
        "block entry {{\n  loop l (i in s..e) {{ op add(c, one) >> c; }}\n  return;\n}}\n")


@pytest.mark.parametrize("s, e, trips", [
    (np.uint64(2**63 - 1), np.int64(3), 0),
    (np.uint64(2), np.uint64(5), 3),
    (np.float32(1.5), np.float64(4.9), 3),   # truncated toward zero
    (np.float32(-2.5), np.float64(0.0), 2),
])
def test_loop_bounds_in_range(s, e, trips):
    out = run_both(LOOP.format(s=s.dtype.name.replace("uint", "u").replace("int", "i").replace("float", "f"),
                               e=e.dtype.name.replace("uint", "u").replace("int", "i").replace("float", "f")),
                   {"s": s, "e": e})
    assert int(out["c"]) == trips


@pytest.mark.parametrize("s, e, message", [
    # a u64 start past i64's range ran 2^64 - 1 -> -1 .. 3 (4 trips) compiled; 2^63 never ended
    (np.uint64(2**64 - 1), np.int64(3), "loop bound s is 18446744073709551615"),
    (np.uint64(2**63), np.int64(3), "loop bound s is 9223372036854775808"),
    (np.float32(1e30), np.float64(3), "loop bound s is 1.0000000150474662e+30"),
    (np.float32(-1e30), np.float64(3), "loop bound s is -1.0000000150474662e+30"),
    (np.float32(0), np.float64(2.0**63), "loop bound e is 9.223372036854776e+18"),
    (np.float32(np.inf), np.float64(3), "loop bound s is not finite"),
])
def test_loop_bounds_outside_i64_are_errors(s, e, message):
    src = LOOP.format(s="u64" if s.dtype == np.uint64 else "f32", e="i64" if e.dtype == np.int64 else "f64")
    with pytest.raises(OiError) as err:
        run_both(src, {"s": s, "e": e})
    text = err.value.render()
    assert message in text and "(in step 1)" in text, text
    if "finite" not in message:
        assert "outside an index's range (i64: -2^63 to 2^63-1)" in text


def test_loop_literal_bound_outside_i64_is_a_check_error():
    src = ("volatile { c: i32; one: i32 @init(1); }\nblock entry {\n"
           "  loop l (i in 0..9223372036854775808) { op add(c, one) >> c; }\n  return;\n}\n")
    with pytest.raises(OiError) as err:
        run_both(src, ways=("interpreted", "fused"))
    assert err.value.render().splitlines()[0] == (
        "<string>:3:19: error: loop end bound 9223372036854775808 is invalid: "
        "outside an index's range (i64: -2^63 to 2^63-1)")


TABLES = {  # a persistent u64 index p (set from input d) into a table K, fixed or growable
    "fixed write": "K(t): f32 @table @fixed(t=4);", "growable write": "K(t): f32 @table;",
}
INDEXED = ("dynamic {{ d: u64; x: f32; }}\npersistent {{ p: u64; {table} }}\nvolatile {{ y: f32; }}\n"
           "block entry {{\n  cache.write d >> p;\n  cache.write x >> K[p];\n  cache.read K[p] >> y;\n  return;\n}}\n")
SLICED = ("dynamic {{ d: u64; }}\npersistent {{ p: u64; K(t): f32 @table @fixed(t=4); }}\nvolatile {{ y: f32[{n}]; }}\n"
          "block entry {{\n  cache.write d >> p;\n  cache.read K[0..p] >> y;\n  return;\n}}\n")


@pytest.mark.parametrize("table", sorted(TABLES))
@pytest.mark.parametrize("p", [2**64 - 1, 2**63])
def test_u64_cache_index_outside_i64_is_an_error(table, p):
    # compiled, 2^64 - 1 was "cache index cannot be negative: K index p is -1"; interpreted, a
    # growable table failed inside NumPy
    with pytest.raises(OiError) as err:
        run_both(INDEXED.format(table=TABLES[table]), {"d": np.uint64(p), "x": np.float32(1)})
    assert err.value.render().splitlines()[0] == (
        f"<string>:6:20: error: cache index p is {p}, outside an index's range (i64: -2^63 to 2^63-1) (in step 1)")


def test_u64_slice_end_outside_i64_is_an_error_not_counted_from_the_end():
    # compiled, 2^64 - 1 became -1: a slice end counted from the end, K[0..3] read in silence
    assert run_both(SLICED.format(n=3), {"d": np.uint64(3)})["y"].shape == (3,)
    with pytest.raises(OiError) as err:
        run_both(SLICED.format(n=3), {"d": np.uint64(2**64 - 1)})
    assert "cache index p is 18446744073709551615, outside an index's range" in err.value.render()


def test_u64_cache_index_in_range_reads_and_writes():
    out = run_both(INDEXED.format(table=TABLES["growable write"]), {"d": np.uint64(6), "x": np.float32(2.5)})
    assert out["y"] == np.float32(2.5) and out["K"].shape == (7,)
    np.testing.assert_array_equal(out["K"], [0, 0, 0, 0, 0, 0, 2.5])


def test_a_growth_too_large_to_allocate_names_its_step_and_keeps_the_run_so_far():
    """A write at index 2^40 asks a growable table for 4 TiB: refused before allocating, in every
    way, naming the step; the steps before it are returned (`partial`), the collected rows too."""
    import oi2jax
    from conftest import WAYS
    src = INDEXED.format(table=TABLES["growable write"])
    inputs = {"d": np.array([0, 1, 2**40, 1], np.uint64), "x": np.arange(1, 5, dtype=np.float32)}
    for way, kw in WAYS.items():
        prog = oi2jax.compile(src, **kw)
        runs = [lambda: prog.run(inputs)]
        if way != "interpreted":
            runs += [lambda: prog.run(inputs, collect=["y"]), lambda: prog.run(inputs, trace=True, collect=["y"])]
        for run in runs:
            with pytest.raises(OiError) as err:
                run()
            text = err.value.render()
            assert "cache K would need" in text and "too large to allocate" in text and text.splitlines()[0].endswith(
                "(in step 3)"), (way, text)
            partial = err.value.partial
            assert int(partial["p"]) == 1 and partial["y"].reshape(-1)[-1] == np.float32(2), (way, partial)
            np.testing.assert_array_equal(partial["K"], [1, 2])
            if partial["y"].ndim:  # collected: the rows of steps 1 and 2
                np.testing.assert_array_equal(partial["y"], [1, 2])
        if way != "interpreted":
            sess = prog.session()
            sess.step(d=np.uint64(1), x=np.float32(1))
            with pytest.raises(OiError) as err:
                sess.step(d=np.uint64(2**40), x=np.float32(1))
            assert err.value.render().splitlines()[0].endswith("(in step 2)")


# ------------------------------------------------------------------ reductions and settings


@pytest.mark.parametrize("op", ["max_axis", "min_axis", "argmax_axis", "argmin_axis"])
def test_first_element_reductions_over_an_empty_axis_are_check_errors(op):
    # SPEC §6.4 starts each group from its first element: an empty group has none (the run
    # failed in NumPy/JAX with a traceback)
    arg = op.startswith("arg")
    src = (f"dynamic {{ x: f32[2, 0]; }}\nvolatile {{ y: {'i64' if arg else 'f32'}[2]; }}\n"
           f"block entry {{\n  op {op}(x, {'axis=1' if arg else 'axes=[1]'}) >> y;\n  return;\n}}\n")
    with pytest.raises(OiError) as err:
        run_both(src, {"x": np.zeros((2, 0), np.float32)}, ways=("interpreted", "fused"))
    assert err.value.render().splitlines()[0].endswith(
        f"error: op {op} over an empty axis: axis 1 of the input [2, 0] has length 0, and an empty group has no "
        "first element to start from (SPEC §6.4)")


def test_sum_and_prod_over_an_empty_axis_are_their_identities():
    src = ("dynamic { x: f32[2, 0]; }\nvolatile { s: f32[2]; p: f32[2]; e: f32[0]; }\nblock entry {\n"
           "  op sum_axis(x, axes=[1]) >> s;\n  op prod_axis(x, axes=[1]) >> p;\n  op max_axis(x, axes=[0]) >> e;\n"
           "  return;\n}\n")  # max over an axis of 2 groups of none: no group, no error
    out = run_both(src, {"x": np.zeros((2, 0), np.float32)})
    np.testing.assert_array_equal(out["s"], [0, 0])
    np.testing.assert_array_equal(out["p"], [1, 1])
    assert out["e"].shape == (0,)


def test_an_integer_mean_over_an_empty_axis_is_a_runtime_error():
    """SPEC §6.4: an integer mean is the sum divided by the count, which OpenInfer's kernel does
    for each group: over an empty axis, a division by 0 (it gave 0 in silence). A float mean is
    0/0 = NaN, as IEEE; no group (an empty output) divides nothing."""
    src = ("dynamic { x: DT[2, 0]; }\nvolatile { y: DT[2]; e: DT[0]; }\nblock entry {\n"
           "  op mean_axis(x, axes=[0]) >> e;\n  op mean_axis(x, axes=[1]) >> y;\n  return;\n}\n")
    for dt, np_dt in (("i32", np.int32), ("u8", np.uint8), ("i64", np.int64)):
        with pytest.raises(OiError) as err:
            run_both(src.replace("DT", dt), {"x": np.zeros((2, 0), np_dt)})
        assert err.value.render().splitlines()[0].endswith(
            "5:3: error: mean_axis: an integer mean over an empty axis (input [2, 0]) divides its sum by a count "
            "of 0 (SPEC §6.4) (in step 1)")
    out = run_both(src.replace("DT", "f32"), {"x": np.zeros((2, 0), np.float32)})
    assert np.isnan(out["y"]).all() and out["e"].shape == (0,)


def test_a_table_read_of_another_rank_than_its_destination_is_a_check_error():
    # K[0..n] gives [n, 3] whatever n: into y [3] it failed inside the compiler (an assertion)
    src = ("dynamic { d: i64; }\npersistent { n: i64; K(t): f32[3] @table @fixed(t=4); }\nvolatile { y: f32[3]; }\n"
           "block entry {\n  cache.write d >> n;\n  cache.read K[0..n] >> y;\n  return;\n}\n")
    with pytest.raises(OiError) as err:
        run_both(src, {"d": np.int64(0)}, ways=("interpreted", "fused"))
    assert err.value.render().splitlines()[0] == (
        "<string>:6:25: error: cache.read K -> y shape mismatch: the read gives [?, 3], y is [3] "
        "(?: a length read at run time)")


ARG = ("dynamic {{ x: f32[3, 3]; a: {dt}; }}\nvolatile {{ y: i64[3]; m: i64[3]; }}\nblock entry {{\n"
       "  op argmax_axis(x, axis=a) >> y;\n  op argmin_axis(x, axis=a, select_first=false) >> m;\n  return;\n}}\n")
X33 = np.array([[0, 1, 2], [5, 4, 3], [6, 8, 7]], np.float32)


@pytest.mark.parametrize("dt, a", [("i32", 0), ("i32", 1), ("i32", -1), ("i32", -2), ("bool", True), ("u8", 1),
                                   ("u64", 0), ("i64", 0)])
def test_argmax_axis_from_a_variable(dt, a):
    # SPEC §6.3: a variable's value, read when the op runs; compiled it failed ("must be a static value")
    npd = {"i32": np.int32, "bool": np.bool_, "u8": np.uint8, "u64": np.uint64, "i64": np.int64}[dt]
    out = run_both(ARG.format(dt=dt), {"x": X33, "a": np.array(a, npd)})
    np.testing.assert_array_equal(out["y"], np.argmax(X33, axis=int(a)))
    np.testing.assert_array_equal(out["m"], np.argmin(X33, axis=int(a)))


@pytest.mark.parametrize("dt, a, message", [
    ("i32", 2, "op argmax_axis axis 2 out of range for rank 2"),
    ("i32", -3, "op argmax_axis axis -3 out of range for rank 2"),
    ("u64", 2**64 - 1, "op argmax_axis axis 18446744073709551615 out of range for rank 2"),
])
def test_argmax_axis_variable_out_of_range(dt, a, message):
    npd = {"i32": np.int32, "u64": np.uint64}[dt]
    with pytest.raises(OiError) as err:
        run_both(ARG.format(dt=dt), {"x": X33, "a": np.array(a, npd)})
    assert err.value.render().splitlines()[0] == f"<string>:4:3: error: {message} (in step 1)"


def test_keepdims_from_a_variable():
    src = ("dynamic { x: f32[2, 3]; k: i32; }\nvolatile { y: f32[2, 1]; }\nblock entry {\n"
           "  op max_axis(x, axes=[1], keepdims=k) >> y;\n  return;\n}\n")
    x = X33[:2]
    np.testing.assert_array_equal(run_both(src, {"x": x, "k": np.int32(1)})["y"], x.max(axis=1, keepdims=True))
    with pytest.raises(OiError) as err:  # keepdims false gives [2]: the interpreter's error, compiled too
        run_both(src, {"x": x, "k": np.int32(0)})
    assert "op max_axis output shape mismatch for y: y is [2, 1], the result is [2] (in step 1)" in err.value.render()


@pytest.mark.parametrize("decl, op, message", [
    ("x: i32[2]; b: f32;", "shl(x, bits=b)", "op shl setting bits must be an integer, but b is f32"),
    ("x: i8[2]; b: f32;", "relu(x, alpha=b)", "op relu setting alpha must be an integer for i8 inputs, but b is f32"),
    ("x: i8[2]; b: f32;", "fill(x, value=b)", "op fill setting value must be an integer for i8 inputs, but b is f32"),
    ("x: i8[2]; b: f64;", "clamp(x, min=b)", "op clamp setting min must be an integer for i8 inputs, but b is f64"),
    ("x: f32[2, 3]; b: f16;", "argmax_axis(x, axis=b)", "op argmax_axis setting axis must be an integer, but b is f16"),
])
def test_a_float_variable_in_an_integer_setting_is_a_check_error(decl, op, message):
    # SPEC §6.3: "integer" consumers reject a float; it was truncated in silence (1.5 -> 1)
    out = "i64[2]" if "argmax" in op else decl.split(";")[0].split(": ")[1]
    src = f"dynamic {{ {decl} }}\nvolatile {{ y: {out}; }}\nblock entry {{\n  op {op} >> y;\n  return;\n}}\n"
    with pytest.raises(OiError) as err:
        run_both(src, {}, ways=("interpreted", "fused"))
    assert err.value.render().splitlines()[0].endswith("error: " + message)


def test_a_float_variable_in_a_float_setting_is_fine():
    src = "dynamic { x: f32[2]; b: f64; }\nvolatile { y: f32[2]; }\nblock entry {\n  op clamp(x, min=b) >> y;\n  return;\n}\n"
    np.testing.assert_array_equal(run_both(src, {"x": np.array([0, 3], np.float32), "b": np.float64(1.5)})["y"],
                                  [1.5, 3])


@pytest.mark.parametrize("op, name", [("fill(x, value=b)", "value"), ("clamp(x, max=b)", "max"),
                                      ("div(x, x, div_by_zero_mask=b)", "div_by_zero_mask")])
def test_a_negative_variable_in_an_unsigned_setting_is_a_runtime_error(op, name):
    # SPEC §6.3: unsigned consumers reject negative ints (fill wrapped -1 to 255; clamp ignored it)
    src = f"dynamic {{ x: u8[2]; b: i32; }}\nvolatile {{ y: u8[2]; }}\nblock entry {{\n  op {op} >> y;\n  return;\n}}\n"
    x = np.array([1, 2], np.uint8)
    with pytest.raises(OiError) as err:
        run_both(src, {"x": x, "b": np.int32(-1)})
    assert err.value.render().splitlines()[0] == (
        f"<string>:4:3: error: op {op.split('(')[0]} setting {name} must be non-negative for unsigned dtype u8, "
        "got -1 (in step 1)")
    assert run_both(src, {"x": x, "b": np.int32(7)})["y"].dtype == np.uint8  # a non-negative one runs


@pytest.mark.parametrize("bits, shl, shr", [(2**63 + 1, [6, 0], [1, 64]), (2**64 - 1, [0, 0], [0, 0]),
                                            (65, [6, 0], [1, 64]), (0, [3, 128], [3, 128])])
def test_u64_shift_amounts_are_never_negative(bits, shl, shr):
    # SPEC §6.4: shifted by bits mod 64; a u64 at 2^63 or more read as a negative shift (none)
    src = ("dynamic { x: u8[2]; b: u64; }\nvolatile { l: u8[2]; r: u8[2]; }\nblock entry {\n"
           "  op shl(x, bits=b) >> l;\n  op shr(x, bits=b) >> r;\n  return;\n}\n")
    out = run_both(src, {"x": np.array([3, 128], np.uint8), "b": np.uint64(bits)})
    np.testing.assert_array_equal(out["l"], shl)
    np.testing.assert_array_equal(out["r"], shr)


@pytest.mark.parametrize("dt, values", [
    ("f32", [0.0, -0.0, np.nan, 1e-45, -2.5, np.inf]),  # 1e-45: a subnormal, not zero
    ("f64", [0.0, -0.0, np.nan, 5e-324, -2.5, -np.inf]),
    ("f16", [0.0, -0.0, np.nan, 6e-8, -2.5, np.inf]),
    ("bf16", [0.0, -0.0, np.nan, 1e-40, -2.5, -np.inf]),
    ("f8", [0.0, -0.0, np.nan, 2.0**-16, -2.5, np.inf]),
    ("i8", [0, -1, 1, 127, -128, 0]),
    ("u64", [0, 2**64 - 1, 1, 2, 0, 5]),
    ("i4", [0, -8, 7, 1, 0, -1]),
])
def test_cast_to_bool(dt, values):
    # SPEC-2026-03 D4: x != 0, NaN true, ±0 false (it was refused: "unsupported cast")
    npd = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
           "f8": ml_dtypes.float8_e5m2, "i8": np.int8, "u64": np.uint64, "i4": np.int8}[dt]
    x = np.array(values, np.float64 if dt[0] in "fb" else object).astype(npd)
    src = f"dynamic {{ x: {dt}[6]; }}\nvolatile {{ y: bool[6]; }}\nblock entry {{\n  op cast(x, to=bool) >> y;\n  return;\n}}\n"
    want = [not (v == 0) for v in values]  # NaN != 0
    np.testing.assert_array_equal(run_both(src, {"x": x})["y"], want)


@pytest.mark.parametrize("dt, value, taken", [("f32", 1e-45, 1), ("f32", -1e-40, 1), ("f64", 5e-324, 1),
                                              ("bf16", 1e-40, 1), ("f32", -0.0, 0), ("f32", np.nan, 1)])
def test_a_subnormal_branch_condition_is_true(dt, value, taken):
    # SPEC §3.2: a float is true when != 0.0; compiled, XLA:CPU's compare read a subnormal as 0
    src = (f"dynamic {{ c: {dt}; }}\nvolatile {{ y: i32; one: i32 @init(1); }}\nblock entry {{ branch c yes no; return; }}\n"
           "block yes { op add(y, one) >> y; return; }\nblock no { return; }\n")
    npd = {"f32": np.float32, "f64": np.float64, "bf16": ml_dtypes.bfloat16}[dt]
    assert int(run_both(src, {"c": np.array(value).astype(npd)})["y"]) == taken


@pytest.mark.parametrize("dt, text, value", [("f32", "3.4028235e38", float(np.finfo(np.float32).max)),
                                             ("f16", "65519.0", 65504.0), ("f8", "61439.0", 57344.0)])
def test_an_init_that_rounds_to_the_largest_finite_value_is_kept(dt, text, value):
    # 3.4028235e38 is f32's largest as NumPy prints it; it was refused as beyond the largest
    src = f"volatile {{ y: {dt} @init({text}); }}\nblock entry {{ return; }}\n"
    assert float(run_both(src)["y"]) == value


@pytest.mark.parametrize("dt, text", [("f32", "3.4028236e38"), ("f16", "65520.0"), ("f8", "61440.0"),
                                      ("bf16", "3.4e38")])
def test_an_init_that_rounds_past_the_largest_finite_value_is_an_error(dt, text):
    with pytest.raises(OiError) as err:
        run_both(f"volatile {{ y: {dt} @init({text}); }}\nblock entry {{ return; }}\n", ways=("interpreted", "fused"))
    assert f"{dt} init {float(text)!r} is out of range" in err.value.render()


@pytest.mark.parametrize("index", [2**40, 2**62])
def test_an_auto_dim_growth_too_large_to_allocate_is_refused_before_allocating(index):
    """Interpreted, NumPy was asked for the padded tensor (4 TiB; at 2^62 a ValueError traceback)."""
    from conftest import outcome
    src = ("dynamic { d: i64; }\npersistent { i: i64; M(r): f32[2] @auto_dim(r); }\nvolatile { m: f32[2]; }\n"
           "block entry {\n  cache.write d >> i;\n  cache.read M[i] >> m;\n  return;\n}\n")
    for way in ("interpreted", "fused"):
        out, err = outcome(src, {"d": np.int64(index)}, way=way)
        first = err.render().splitlines()[0]
        assert f"cache M would need {4 * (index + 2)} bytes to grow" in first and "too large to allocate" in first \
            and first.endswith("(in step 1)"), (way, first)


@pytest.mark.parametrize("dt, tiny", [("f32", 1e-40), ("bf16", 1e-40), ("f64", 1e-310), ("f16", 2.0**-24)])
def test_filter_condition_reads_a_subnormal_as_true(dt, tiny):
    """SPEC §6.4: out = a where cond != 0. A subnormal cond is not 0; XLA:CPU's float compare
    flushes it, so filter chose b (bf16: interpreted b, compiled a)."""
    npd = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16}[dt]
    c = np.array([tiny, -tiny, 0.0, -0.0, np.nan, 1.0]).astype(npd)
    assert c[0] != 0 and c[1] != 0  # representable subnormals, not rounded to zero
    out = run_both(f"dynamic {{ a: {dt}[6]; b: {dt}[6]; c: {dt}[6]; }}\nvolatile {{ y: {dt}[6]; }}\n"
                   "block entry {\n  op filter(a, b, c) >> y;\n  return;\n}\n",
                   {"a": np.full(6, 1.0, npd), "b": np.full(6, 2.0, npd), "c": c})
    np.testing.assert_array_equal(np.asarray(out["y"], np.float64), [1.0, 1.0, 2.0, 2.0, 1.0, 1.0])


@pytest.mark.parametrize("access", ["cache.write v >> K[i];", "cache.read K[i] >> r;"])
def test_a_table_index_at_the_largest_i64_is_past_a_fixed_size(access):
    """SPEC §4.2: an index k with k + 1 > the fixed size is an error. Compiled, k + 1 wrapped to
    -2^63 at k = 2^63 - 1 and passed the bound: the write was dropped (the read gave zeros) with
    no error, where the interpreter refused it."""
    src = ("dynamic { v: f32[2]; }\npersistent { i: i64 @init(9223372036854775807); K(t): f32[2] @table @fixed(t=4); }\n"
           f"volatile {{ r: f32[2]; }}\nblock entry {{\n  {access}\n  return;\n}}\n")
    with pytest.raises(OiError) as err:
        run_both(src, {"v": np.array([1, 2], np.float32)})
    assert "dimension 0 of K: index 9223372036854775807 is past its fixed size 4" in err.value.render()


def test_a_growable_table_index_at_the_largest_i64_is_refused():
    from conftest import outcome
    src = ("dynamic { v: f32[2]; }\npersistent { i: i64 @init(9223372036854775807); K(t): f32[2] @table; }\n"
           "volatile { r: f32[2]; }\nblock entry {\n  cache.write v >> K[i];\n  cache.read K[i] >> r;\n  return;\n}\n")
    for way in ("interpreted", "driver", "fused"):
        out, err = outcome(src, {"v": np.array([1, 2], np.float32)}, way=way)
        assert err is not None, (way, out)  # compiled: no error, K left empty and r read as zeros
        assert "too large to allocate" in err.render(), (way, err.render())


def test_float_matmul_is_xlas_dot_within_its_bound_of_the_spec_loop():
    """docs/semantics.md, "Float matmul on a CPU": XLA's dot (FMA, its own order), the same in
    every way a program runs, within K x eps x sum |a||b| of SPEC §6.5's loop of rounded
    products and sums (written here)."""
    rng = np.random.RandomState(5)
    for m, k, n in ((2, 3, 2), (4, 16, 4), (3, 64, 2), (8, 100, 8)):
        a, b = rng.randn(m, k).astype(np.float32), rng.randn(k, n).astype(np.float32)
        src = (f"dynamic {{ a: f32[{m}, {k}]; b: f32[{k}, {n}]; }}\nvolatile {{ y: f32[{m}, {n}]; }}\n"
               "block entry {\n  op matmul(a, b) >> y;\n  return;\n}\n")
        got = run_both(src, {"a": a, "b": b})["y"]  # every way bit for bit (run_both)
        loop = np.zeros((m, n), np.float32)
        for i in range(k):
            loop = loop + a[:, i:i + 1] * b[i:i + 1, :]  # f32: each product and sum rounded
        bound = k * np.finfo(np.float32).eps * (np.abs(a).astype(np.float64) @ np.abs(b))
        assert np.all(np.abs(got.astype(np.float64) - loop) <= bound), (m, k, n)


NEGATIVE_END = """
dynamic {{ x: f32; }}
volatile {{ w: f32[{n}]; }}
persistent {{ e: i32 @init({e}); K(a): f32 @table @init(5.0); }}
block entry {{
    cache.write x >> K[2];
    cache.read K[0..e] >> w;
    return;
}}
"""


def test_a_variables_negative_slice_end_counts_from_the_end():
    """SPEC §4.2: a negative slice end e means size - |e|, whatever names it: `K[0..e]` with a
    persistent e = -1 over a table of 3 entries reads entries 0..2, in every way. Compiled, a
    variable's negative end was taken as it is (`slice end -1 before start in K`) while the
    interpreter counted it from the end."""
    out = run_both(NEGATIVE_END.format(n=2, e=-1), {"x": np.float32(2)})
    np.testing.assert_array_equal(out["w"], np.array([5.0, 5.0], np.float32))
    np.testing.assert_array_equal(out["K"], np.array([5.0, 5.0, 2.0], np.float32))
    out = run_both(NEGATIVE_END.format(n=0, e=-3), {"x": np.float32(2)})
    assert out["w"].shape == (0,)
    with pytest.raises(OiError, match=r"slice end underflow for size 3 .*\(in step 1\)"):
        run_both(NEGATIVE_END.format(n=0, e=-4), {"x": np.float32(2)})


BIG_AMOUNTS = """
volatile { a: u8; b: i8; c: u64; d: i64; e: u32; }
persistent { pa: u8 @init(0); pb: i8 @init(0); pc: u64 @init(0); pd: i64 @init(0); pe: u32 @init(5); }
block entry {
    cache.increment 300 pa;
    cache.decrement 9223372036854775807 pb;
    cache.decrement 18446744073709551615 pc;
    cache.increment 9223372036854775808 pd;
    cache.increment 9223372036854775808 pe;
    cache.read pa >> a; cache.read pb >> b; cache.read pc >> c; cache.read pd >> d; cache.read pe >> e;
    return;
}
"""


def test_increment_by_an_amount_past_int64_wraps_in_every_way():
    """SPEC §4.6: increment/decrement wrap in the variable's width, for any amount a literal holds
    (up to 2^64 - 1). Compiled, an amount no int64 holds was a Python OverflowError traceback
    (`Python int -18446744073709551615 too large to convert to int64`); the interpreter wrapped."""
    for steps in (1, 2):
        out = run_both(BIG_AMOUNTS, steps=steps)
        expected = {"a": (300 * steps) % 256, "b": (-(2**63 - 1) * steps) % 256, "c": (-(2**64 - 1) * steps) % 2**64,
                    "d": (2**63 * steps) % 2**64, "e": (5 + 2**63 * steps) % 2**32}
        for name, value in expected.items():
            dtype = out[name].dtype
            bits = dtype.itemsize * 8
            if dtype.kind == "i" and value >= 2 ** (bits - 1):
                value -= 2**bits
            assert int(out[name]) == value, (name, steps, out[name])


SIZE_AS_INDEX = """
dynamic { x: f32; }
volatile { w: f32[N]; }
persistent { K(t): f32 @table @fixed(t=N); }
block entry {
    cache.write x >> K[M];
    cache.read K[0..N] >> w;
    return;
}
"""


def test_a_size_used_only_as_a_cache_index_can_be_given():
    """SPEC §4.1: a cache index may name a size variable. One the graph uses only there (`K[M]`)
    is a size of the graph, given with sizes= / --size like any other; it was refused as
    `unknown size M: the graph and model sizes are N` (naming.size_names saw dims, @fixed, loop
    bounds and int lists only, though its docstring listed cache indices)."""
    out = run_both(SIZE_AS_INDEX, {"x": np.float32(5)}, sizes={"N": 4, "M": 2})
    np.testing.assert_array_equal(out["w"], np.array([0.0, 0.0, 5.0, 0.0], np.float32))
    with pytest.raises(OiError, match="unknown size Q"):  # a name the graph does not use is still refused
        run_both(SIZE_AS_INDEX, {"x": np.float32(5)}, sizes={"N": 4, "M": 2, "Q": 1})


def test_a_float_increment_past_the_range_is_inf_without_a_warning():
    """SPEC §4.6: f16/bf16/f8 increments add in f32 and round back: 65504 + 16 is 65520, a tie
    that rounds to even, inf, in every way. The interpreter said so with NumPy's `RuntimeWarning:
    overflow encountered in cast` on stderr as well."""
    import warnings
    src = ("volatile { a: f16; c: f8; }\npersistent { pa: f16 @init(65504.0); pc: f8 @init(57344.0); }\n"
           "block entry {\n    cache.increment 16 pa;\n    cache.increment 8192 pc;\n"
           "    cache.read pa >> a;\n    cache.read pc >> c;\n    return;\n}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = run_both(src)
    assert np.isposinf(out["a"].astype(np.float32)) and np.isposinf(out["c"].astype(np.float32))
