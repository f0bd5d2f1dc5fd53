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
