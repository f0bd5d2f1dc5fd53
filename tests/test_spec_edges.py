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
        assert "outside a loop index's range (i64: -2^63 to 2^63-1)" in text


def test_loop_literal_bound_outside_i64_is_a_check_error():
    src = ("volatile { c: i32; one: i32 @init(1); }\nblock entry {\n"
           "  loop l (i in 0..9223372036854775808) { op add(c, one) >> c; }\n  return;\n}\n")
    with pytest.raises(OiError) as err:
        run_both(src, ways=("interpreted", "fused"))
    assert err.value.render().splitlines()[0] == (
        "<string>:3:19: error: loop end bound 9223372036854775808 is invalid: "
        "outside a loop index's range (i64: -2^63 to 2^63-1)")
