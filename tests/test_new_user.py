"""Issue 41, "tried as a new user would": what a first session with the docs runs into, each with
the message (or the behaviour) it should have had."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError

from conftest import REPO, run_cli

COUNTER = """dynamic { x: f32 @init(0.5); }
volatile { v: i32; f: f32; }
persistent { c: i32 @init(0); }
block entry {
    loop l (s in 0..3) {
        OP
    }
    return;
}
"""


def test_ops_is_an_attribute_after_import_oi2jax():
    """docs/ops.md: `import oi2jax` then `oi2jax.ops.load([...])` (a fresh interpreter: no test
    has imported oi2jax.ops yet)."""
    code = "import oi2jax; print(oi2jax.ops.load(['nn']) is not None, 'ops' in dir(oi2jax) or 'ops' in oi2jax.__all__)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["True", "True"], proc.stderr


def test_a_loop_index_as_an_op_input_says_how_to_get_its_value(capsys, tmp_path):
    g = tmp_path / "g.oi"
    g.write_text(COUNTER.replace("OP", "op add(x, s) >> x;"))
    code, _, err = run_cli(capsys, "check", g)
    assert code == 1
    assert (f"{g}:6:19: error: loop index s is not a variable: it is an integer for cache and prefix-table indices "
            f"only (K[s], W[s]); to use its value, count the iterations in a volatile scalar (declare `c: i32;` "
            f"among the volatiles, 0 at the start of every step; write `op add(c, 1) >> c;` as the loop body's last "
            f"node) and use c (`op embedding(xs, c) >> x;` picks row c of xs)") in err


def test_the_loop_index_counter_the_message_gives_is_the_index_at_every_step():
    """The way forward, as the message words it, gives the loop index in every step (the user probe
    followed the former advice, a persistent counter with cache.increment: it went on counting
    from the previous step, so step 2 read row 3 of a 3-row input: `id 3 is outside 0..2`)."""
    graph = """dynamic { xs: f32[3]; }
volatile { c: i32; x: f32; y: f32 @init(0.5); }
block entry {
    loop l (s in 0..3) {
        op embedding(xs, c) >> x;
        op add(y, x) >> y;
        op add(c, 1) >> c;
    }
    return;
}
"""
    out = oi2jax.compile(graph, ops=["nn"]).run({"xs": np.float32([[1, 2, 4], [8, 16, 32]])}, steps=2,
                                                 collect=("y", "c"))
    assert out["y"].tolist() == [7.5, 56.5] and out["c"].tolist() == [3, 3]


def test_a_loop_index_as_a_bound_says_how_to_get_its_value(capsys, tmp_path):
    g = tmp_path / "g.oi"
    g.write_text(COUNTER.replace("OP", "loop m (t in 0..s) { cache.increment c; }"))
    code, _, err = run_cli(capsys, "check", g)
    assert code == 1
    assert ("error: loop end bound s is invalid: loop index s is not a variable: it is an integer for cache and "
            "prefix-table indices only (K[s], W[s]); to use its value, count the iterations in a volatile scalar "
            "(declare `c: i32;` among the volatiles, 0 at the start of every step; write `op add(c, 1) >> c;` as "
            "the loop body's last node) and use c as the bound") in err


FIXED_TABLE = """dynamic { x: f32[2] @init(1.0); }
volatile { y: f32[2]; }
persistent { t: i32 @init(0); K(slot): f32[2] @table @fixed(slot=4); G(i): f32[2] @table; }
block entry {
    cache.write x >> K[t];
    cache.write x >> G[t];
    cache.read K[t] >> y;
    cache.increment t;
    return;
}
"""


def test_collect_of_a_fixed_table_does_not_say_its_shape_changes():
    prog = oi2jax.compile(FIXED_TABLE)
    with pytest.raises(OiError) as info:
        prog.run({}, steps=2, collect="K")
    assert str(info.value) == ("error: collect: K is a cache table: its entries are cache state (every index @fixed, "
                               "so its shape does not change), not a value a step leaves; cache.read it into a "
                               "volatile and collect that")
    with pytest.raises(OiError) as info:
        prog.run({}, steps=2, collect="G")
    assert str(info.value) == ("error: collect: G is a cache table, whose shape changes from step to step (i grows); "
                               "cache.read it into a volatile and collect that")
    assert prog.run({}, steps=2, collect="y")["y"].shape == (2, 2)  # the way the message says


LITERAL = """dynamic { x: f32[2] @init(2.0); }
volatile { y: f32[2]; }
block entry {
    op mul(x, ARG) >> y;
    return;
}
"""


@pytest.mark.parametrize("arg", ["0.125", "- 2.5e-1"])
def test_a_literal_op_input_is_the_variable_holding_it(arg):
    """A literal op input (an oi2jax extension, docs/semantics.md) computes exactly what the variable
    declared to hold it does, compiled and interpreted."""
    text = arg.replace(" ", "")
    declared = LITERAL.replace("volatile { y: f32[2]; }", f"volatile {{ y: f32[2]; c: f32 @init({text.removesuffix('f32')}); }}")
    want = oi2jax.compile(declared.replace("ARG", "c")).run({})["y"]
    np.testing.assert_array_equal(want, np.float32([2.0, 2.0]) * np.float32(float(text.removesuffix("f32"))))
    for mode in ("compiled", "interpret"):
        np.testing.assert_array_equal(oi2jax.compile(LITERAL.replace("ARG", arg), mode=mode).run({})["y"], want)


def test_a_literal_that_does_not_fit_its_input_says_how_to_write_it():
    with pytest.raises(OiError) as info:
        oi2jax.compile(LITERAL.replace("ARG", "-1"))
    assert str(info.value).startswith(
        "<string>:4:15: error: op mul input 1: the literal -1 takes f32 (the dtype of x): int literal requires an "
        "integer, bool or bitset dtype, got f32 (write -1.0)")
    np.testing.assert_array_equal(oi2jax.compile(LITERAL.replace("ARG", "-1.0")).run({})["y"], np.float32([-2, -2]))


LINEAR = """dynamic { h: f32[1, 4] @init(1.0); }
constant { W(l): f32[3, 4] @pattern("w.{l}"); bq(l): f32[3] @pattern("b.{l}"); b: f32[3]; }
volatile { y: f32[1, 3]; }
block entry {
    loop layers (l in 0..1) {
        op linear(h, W[l], bias=ARG) >> y;
    }
    return;
}
"""


@pytest.mark.parametrize("arg", ["bq[l]", "b"])
def test_linear_bias_setting_says_bias_is_an_input(capsys, tmp_path, arg):
    """`bias=bq[l]` is a parse error, `bias=b` an op-typing one: both say the same."""
    g = tmp_path / "g.oi"
    g.write_text(LINEAR.replace("ARG", arg))
    code, _, err = run_cli(capsys, "check", g, "--no-model", "--ops", "nn")
    assert code == 1
    assert ("error: op linear has no setting bias: settings (NAME=value) are literals or a scalar variable's name, "
            "and a tensor is given as an input; linear takes a bias as its optional third input: "
            "op linear(h, W, b)") in err, err


TRACED_BOOL = '''import jax.numpy as jnp
from oi2jax.ops import op


@op(inputs={"x": "float"}, elementwise=True)
def bad_relu(x):
    if x > 0:  # a Python `if` on a traced value
        return x
    return jnp.zeros_like(x)
'''


def test_a_user_kernel_raising_on_a_traced_value_is_three_lines(capsys, tmp_path):
    """The located error keeps the exception's first line (JAX's reason) and the op's own line
    that raised, not JAX's page of where each traced value came from."""
    (tmp_path / "bad_ops.py").write_text(TRACED_BOOL)
    g = tmp_path / "g.oi"
    g.write_text("dynamic { x: f32 @init(1.0); }\nvolatile { y: f32; }\nblock entry {\n    op bad_relu(x) >> y;\n"
                 "    return;\n}\n")
    code, _, err = run_cli(capsys, "run", g, "--ops", tmp_path / "bad_ops.py", "--quiet")
    assert code == 1
    assert err.splitlines() == [
        f"{g}:4:5: error: op bad_relu (defined in {tmp_path / 'bad_ops.py'}:5): its kernel raised "
        f"TracerBoolConversionError: Attempted boolean conversion of traced array with shape bool[]. (at "
        f"{tmp_path / 'bad_ops.py'}:7, in bad_relu)",
        "        op bad_relu(x) >> y;",
        "        ^"], err
