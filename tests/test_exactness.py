"""Exactness by device (issue 32, item 3): the one per-op, per-device tolerance table that
compiled-vs-interpreted comparisons use (tests/conftest.py `EXACTNESS`, docs/semantics.md).
On a CPU it is empty: every comparison stays bit for bit."""
from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import EXACTNESS, EXAMPLES, REPO, assert_matches, graph_ops, tolerance


def test_a_cpu_compares_bit_for_bit():
    assert EXACTNESS["cpu"] == {}
    ops = {"div", "recip", "matmul", "sum_axis", "add"}
    assert tolerance(ops, "cpu") == {}
    one = np.array([1.0, 3.0], np.float32)
    nudged = np.nextafter(one, np.float32(4))
    with pytest.raises(AssertionError):
        assert_matches({"y": nudged}, {"y": one}, ops, platform="cpu")
    assert_matches({"y": -0.0 * one}, {"y": -0.0 * one}, ops, platform="cpu")
    with pytest.raises(AssertionError, match="differs"):  # the sign of a zero counts on a CPU
        assert_matches({"y": np.zeros(2, np.float32)}, {"y": -np.zeros(2, np.float32)}, ops, platform="cpu")


def test_a_gpu_allows_what_the_table_says_for_the_ops_used():
    one = np.array([1.0, 3.0, np.nan], np.float32)
    two_ulps = one * np.float32(1 + 2 * np.finfo(np.float32).eps)
    assert tolerance({"div", "add"}, "gpu") == {"ulp": 2}
    assert tolerance({"matmul", "recip"}, "gpu") == {"ulp": 2, "rel": 64}
    assert_matches({"y": two_ulps}, {"y": one}, {"div"}, platform="gpu")
    with pytest.raises(AssertionError, match=r"beyond the gpu tolerance"):
        assert_matches({"y": one * np.float32(1.0001)}, {"y": one}, {"div"}, platform="gpu")
    with pytest.raises(AssertionError):  # add, mul, ...: exact everywhere
        assert_matches({"y": two_ulps}, {"y": one}, {"add", "mul"}, platform="gpu")
    with pytest.raises(AssertionError):  # integers and bools stay exact
        assert_matches({"i": np.array([1, 2])}, {"i": np.array([1, 3])}, {"div"}, platform="gpu")
    with pytest.raises(AssertionError, match="NaNs differ"):
        assert_matches({"y": np.zeros(3, np.float32)}, {"y": one}, {"div"}, platform="gpu")
    acc = np.array([1000.0, 1e-3], np.float32)  # an accumulation: relative to the array's scale
    assert_matches({"y": acc + np.float32(1e-3)}, {"y": acc}, {"matmul"}, platform="gpu")


def test_graph_ops_and_the_documented_table():
    assert graph_ops(EXAMPLES / "mlp_regression.oi") == {"matmul", "add", "relu"}
    doc = (REPO / "docs" / "semantics.md").read_text()
    table = doc[doc.index("## Exactness by device"):]
    for op, (kind, amount) in EXACTNESS["gpu"].items():  # every entry documented, with its amount
        row = next(line for line in table.splitlines() if re.search(rf"`{op}`", line))
        assert str(amount) in row and kind in row, (op, row)
