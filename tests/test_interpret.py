"""The reference interpreter follows OpenInfer's execution model rule by rule (SPEC §3, §4).

Each test runs a small .oi program with `InterpretedProgram` and compares with NumPy.
"""
from __future__ import annotations

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError
from oi2jax.grammar.parse import parse
from oi2jax.interpret import InterpretedProgram
from oi2jax.trace import Trace


def bind_graph(graph, model=None, sizes=None):
    """check -> bind, as every program starts (the interpreter executes a checked graph)."""
    from oi2jax.check import check_graph
    from oi2jax.model.bind import bind
    return bind(check_graph(graph, model, sizes), model, sizes)


def make(text: str, model=None, sizes=None, trace=None) -> InterpretedProgram:
    graph = parse(text)
    return InterpretedProgram(bind_graph(graph, model, sizes), trace=trace)


def run(text: str, inputs=None, steps=1, sizes=None, model=None, trace=None):
    return make(text, model=model, sizes=sizes, trace=trace).run(inputs or {}, steps=steps)


F = np.float32


# ------------------------------------------------------------------------------- control flow


BRANCH_ORDER = """
dynamic { c: bool; }
volatile { x: i32 @init(1); }
block entry {
    op add(x, x) >> x;            // 2
    branch c yes no;
    op mul(x, x) >> x;            // after the call returns
    branch tail;
    op add(x, x) >> x;
    return;
}
block yes { op add(x, x) >> x; return; }
block no { op neg(x) >> x; }
block tail { op add(x, x) >> x; op add(x, x) >> x; return; op neg(x) >> x; }
"""


@pytest.mark.parametrize("c, expect", [(True, ((2 * 2) ** 2) * 4 * 2), (False, ((-2) ** 2) * 4 * 2)])
def test_branch_is_call_and_return(c, expect):
    out = run(BRANCH_ORDER, {"c": np.array(c)})
    assert out["x"].dtype == np.int32
    assert int(out["x"]) == expect


def test_branch_condition_truthiness_float_nan_and_int():
    text = """
    dynamic { c: f32; k: i8; }
    volatile { a: i32 @init(0); b: i32 @init(0); }
    block entry { branch c t1 f1; branch k t2 f2; return; }
    block t1 { op fill(a, value=1) >> a; }
    block f1 { op fill(a, value=2) >> a; }
    block t2 { op fill(b, value=1) >> b; }
    block f2 { op fill(b, value=2) >> b; }
    """
    out = run(text, {"c": F(np.nan), "k": np.int8(0)})
    assert (int(out["a"]), int(out["b"])) == (1, 2)
    out = run(text, {"c": F(0.0), "k": np.int8(-3)})
    assert (int(out["a"]), int(out["b"])) == (2, 1)


def test_nested_branches_and_blocks_falling_off_the_end():
    text = """
    volatile { x: i32 @init(0); one: i32 @init(1); ten: i32 @init(10); }
    block entry { branch a; op mul(x, ten) >> x; }
    block a { op add(x, one) >> x; branch b; op mul(x, ten) >> x; op add(x, one) >> x; }
    block b { op mul(x, ten) >> x; op add(x, one) >> x; }
    """
    # a: x=1 -> b: x=11 -> a: x=111 -> entry: 1110
    assert int(run(text)["x"]) == 1110


def test_nested_loops_and_index_visible_in_cache_and_prefix():
    text = """
    volatile { acc: f32[2] @init(0.0); one: f32[2] @init(1.0); }
    persistent { T(i, j): f32[2] @table; }
    block entry {
        loop outer (i in 0..3) {
            loop inner (j in 1..3) {
                op add(acc, one) >> acc;
                cache.write acc >> T[i, j];
            }
        }
        return;
    }
    """
    out = run(text)
    np.testing.assert_array_equal(out["acc"], [6, 6])
    T = out["T"]
    assert T.shape == (3, 3, 2)
    expect = np.zeros((3, 3, 2), F)
    n = 0
    for i in range(3):
        for j in range(1, 3):
            n += 1
            expect[i, j] = n
    np.testing.assert_array_equal(T, expect)


def test_return_inside_loop_ends_only_the_loop():
    text = """
    volatile { x: i32 @init(0); one: i32 @init(1); hundred: i32 @init(100); }
    block entry {
        loop L (i in 0..5) {
            op add(x, one) >> x;
            return;
            op add(x, hundred) >> x;
        }
        op add(x, hundred) >> x;      // still runs: return only ended the loop
        return;
    }
    """
    assert int(run(text)["x"]) == 101


def test_loop_bounds_from_variables_are_truncated_and_evaluated_once():
    text = """
    dynamic { n: f32; m: i64; }
    persistent { p: i32 @init(2); }
    volatile { x: i32 @init(0); one: i32 @init(1); cnt: f32 @init(0.0); fone: f32 @init(1.0); }
    block entry {
        loop a (i in 0..n) {
            op add(x, one) >> x;
            op add(n, fone) >> n;         // bound was read once: no effect on the count
        }
        loop b (i in p..m) { op add(x, one) >> x; }
        loop c (i in 0..0) { op add(x, one) >> x; }
        loop d (i in 5..2) { op add(x, one) >> x; }
        return;
    }
    """
    out = run(text, {"n": F(3.9), "m": np.int64(6)})
    assert int(out["x"]) == 3 + 4
    out = run(text, {"n": F(-2.5), "m": np.int64(1)})
    assert int(out["x"]) == 0


def test_loop_bound_from_sizevar():
    text = """
    volatile { x: i32[B] @init(0); one: i32[B] @init(1); }
    block entry { loop L (i in 0..N) { op add(x, one) >> x; } return; }
    """
    out = run(text, sizes={"B": 3, "N": 4})
    np.testing.assert_array_equal(out["x"], [4, 4, 4])


def test_assign_temporary_reset_each_step_but_kept_across_loop_iterations():
    text = """
    volatile { y: i32 @init(0); one: i32 @init(1); }
    persistent { total: i32 @init(0); }
    block entry {
        loop L (i in 0..3) {
            assign t: i32;
            op add(t, one) >> t;
        }
        op add(t, y) >> y;
        cache.read total >> y;
        op add(y, t) >> y;
        cache.write y >> total;
        return;
    }
    """
    out = run(text, steps=4)
    assert int(out["total"]) == 12  # t = 3 each step (reset to zero at every step)


def test_volatile_reset_per_step_and_persistent_carry():
    text = """
    dynamic { x: f32[2]; }
    volatile { v: f32[2] @init(1.0); }
    persistent { P: f32[2] @init(0.5); }
    volatile { p: f32[2]; }
    block entry {
        op add(v, x) >> v;
        cache.read P >> p;
        op add(p, v) >> p;
        cache.write p >> P;
        return;
    }
    """
    x = np.array([1.0, 2.0], F)
    for steps in (0, 1, 3):
        out = run(text, {"x": x}, steps=steps)
        if steps:
            np.testing.assert_array_equal(out["v"], 1.0 + x)  # reset to @init every step
        np.testing.assert_array_equal(out["P"], 0.5 + steps * (1.0 + x))
    assert set(out) == {"x", "v", "P", "p"}


def test_dynamic_not_given_reads_initial_value_or_is_missing_and_unknown_inputs_fail():
    text = """
    dynamic { a: i32 @init(7); b: i32; }
    volatile { y: i32; }
    block entry { op add(a, b) >> y; return; }
    """
    assert int(run(text, {"b": np.int32(2)})["y"]) == 9
    # b has no model tensor or @init: running without it is an error (issue 17), zeros on request
    with pytest.raises(OiError, match="missing input b: the graph reads it"):
        run(text)
    prog = make(text)
    prog.zero_missing_inputs = True
    assert int(prog.run({})["y"]) == 7  # a from its @init, b zeros
    assert int(run(text, {"b": np.int32(0)})["y"]) == 7
    with pytest.raises(OiError, match="unknown input"):
        run(text, {"nope": np.int32(1)})
    with pytest.raises(OiError, match="unknown input"):
        run(text, {"y": np.int32(1)})
    with pytest.raises(OiError, match="shape"):  # [3] would be 3 steps' values (as Program.run takes it)
        run(text, {"a": np.zeros((3, 2), np.int32)})


def test_transfer_copies():
    text = """
    volatile { a: f32[2] @init(1.0); b: f32[2]; }
    block entry { transfer a >> b; op add(a, a) >> a; return; }
    """
    out = run(text)
    np.testing.assert_array_equal(out["a"], [2, 2])
    np.testing.assert_array_equal(out["b"], [1, 1])


def test_variable_valued_attribute():
    text = """
    dynamic { x: f32[3]; leak: f32; }
    volatile { y: f32[3]; }
    block entry { op relu(x, alpha=leak) >> y; return; }
    """
    x = np.array([-2.0, 0.5, 3.0], F)
    out = run(text, {"x": x, "leak": F(0.25)})
    np.testing.assert_allclose(out["y"], np.where(x > 0, x, 0.25 * x))


def test_unbounded_recursion_is_an_error_not_a_crash():
    text = "volatile { x: i32; } block entry { branch entry; }"
    with pytest.raises(OiError, match="recursion through branches: entry -> entry"):  # refused by the checker
        run(text)


# ------------------------------------------------------------------------------------- caches


def test_fixed_table_worked_example_and_overflow():
    # SPEC §4.8
    text = """
    dynamic { one: f32[2]; }
    persistent { n: i32 @init(0); R(s): f32[2] @table @fixed(s=3); }
    volatile { win: f32[3, 2]; }
    block entry {
        cache.write one >> R[n];
        cache.increment n;
        cache.read R[] >> win;
        return;
    }
    """
    one = np.array([1.0, 2.0], F)
    out = run(text, {"one": one}, steps=1)
    np.testing.assert_array_equal(out["win"], [[1, 2], [0, 0], [0, 0]])
    assert out["R"].shape == (3, 2)
    out = run(text, {"one": one}, steps=3)
    np.testing.assert_array_equal(out["win"], [one, one, one])
    assert int(out["n"]) == 3
    with pytest.raises(OiError, match=r"dimension 0 of R: index 3 is past its fixed size 3"):
        run(text, {"one": one}, steps=4)


def test_growable_table_sizes_follow_writes_and_reads():
    text = """
    dynamic { v: f32[2]; }
    persistent { n: i32 @init(0); R(s): f32[2] @table @init(9.0); }
    volatile { last: f32[2]; }
    block entry {
        cache.write v >> R[n];
        cache.increment 2 n;         // leaves a hole at every odd index
        cache.read R[n] >> last;     // reading beyond the end grows the table (and reads @init)
        return;
    }
    """
    v = np.array([1.0, 2.0], F)
    out = run(text, {"v": v}, steps=2)
    # step 1: write 0, n=2, read 2 (size 3); step 2: write 2, n=4, read 4 (size 5)
    R = out["R"]
    assert R.shape == (5, 2)
    np.testing.assert_array_equal(R, [v, [9, 9], v, [9, 9], [9, 9]])
    np.testing.assert_array_equal(out["last"], [9, 9])


def test_slice_reads_grow_negative_ends_and_errors():
    base = """
    persistent {{ T(i): i32[2] @table @init(5); k: i32 @init(0); }}
    dynamic {{ v: i32[2]; }}
    volatile {{ out: i32[{n}, 2]; }}
    block entry {{
        cache.write v >> T[k];
        cache.increment k;
        cache.read T[{sel}] >> out;
        return;
    }}
    """
    v = np.array([1, 2], np.int32)
    out = run(base.format(n=4, sel="0..4"), {"v": v})  # grows to 4 by the slice end
    np.testing.assert_array_equal(out["out"], [v, [5, 5], [5, 5], [5, 5]])
    assert out["T"].shape == (4, 2)
    fixed = base.replace("@table @init(5)", "@table @fixed(i=3) @init(5)")
    out = run(fixed.format(n=2, sel="1.."), {"v": v}, steps=2)  # size 3 -> 1..3
    np.testing.assert_array_equal(out["out"], [v, [5, 5]])
    out = run(fixed.format(n=2, sel="..-1"), {"v": v}, steps=3)  # end = 3 - 1
    np.testing.assert_array_equal(out["out"], [v, v])
    # growable: at step 1 the table has size 1, so `1..` selects 0 rows: the destination's declared
    # [2, 2] no longer fits, which oi2jax reports (SPEC §0 item 12) instead of reshaping `out`
    with pytest.raises(OiError, match=r"cache.read T: slice of length 0 does not match the destination's "
                                      r"dimension 2 \(in step 1\)"):  # the compiled guard's words (messages.py)
        run(base.format(n=2, sel="1.."), {"v": v}, steps=3)
    out = run(base.format(n=0, sel="2..2"), {"v": v}, steps=1)  # empty, still grows to 2
    assert out["out"].shape == (0, 2) and out["T"].shape == (2, 2)
    with pytest.raises(OiError, match="slice end underflow for size 1"):
        run(base.format(n=0, sel="..-2"), {"v": v})
    with pytest.raises(OiError, match=r"slice end 1 before start in T \(in step 1\)"):
        run(base.format(n=0, sel="3..1"), {"v": v})


def test_two_index_table_partial_selection_and_reset_prefix():
    text = """
    dynamic { v: f32[1]; }
    persistent { K(l, t): f32[1] @table; }
    volatile { row: f32[3, 1]; all: f32[2, 3, 1]; after: f32[2, 3, 1]; }
    block entry {
        loop L (l in 0..2) {
            loop T (t in 0..3) {
                cache.write v >> K[l, t];
            }
        }
        cache.read K[1] >> row;        // missing trailing index = full slice over t
        cache.read K[] >> all;
        cache.reset K[1];              // remove every entry K[1, *]: sizes shrink to (1, 3)
        cache.reset K[0, 2];           // then t-size recomputes to 2
        return;
    }
    """
    v = np.array([3.0], F)
    out = run(text, {"v": v})
    np.testing.assert_array_equal(out["row"], np.full((3, 1), 3.0))
    np.testing.assert_array_equal(out["all"], np.full((2, 3, 1), 3.0))
    assert out["K"].shape == (1, 2, 1)
    np.testing.assert_array_equal(out["K"], np.full((1, 2, 1), 3.0))


def test_table_reset_everything_restores_fixed_sizes():
    text = """
    dynamic { v: f32[1]; }
    persistent { A(i): f32[1] @table @fixed(i=4) @init(-1.0); B(i): f32[1] @table; }
    block entry {
        cache.write v >> A[2];
        cache.write v >> B[2];
        cache.reset A[];
        cache.reset B[];
        cache.write v >> B[0];
        return;
    }
    """
    out = run(text, {"v": np.array([7.0], F)})
    np.testing.assert_array_equal(out["A"], np.full((4, 1), -1.0))
    np.testing.assert_array_equal(out["B"], [[7.0]])


def test_negative_single_index_and_unfixed_overflow_messages():
    text = """
    persistent { T(i): f32[1] @table @fixed(i=2); k: i32 @init(-1); }
    volatile { o: f32[1]; }
    block entry { cache.read T[k] >> o; return; }
    """
    with pytest.raises(OiError, match="cache index cannot be negative"):
        run(text)
    text2 = text.replace("@init(-1)", "@init(2)")
    with pytest.raises(OiError, match="dimension 0 of T: index 2 is past its fixed size 2") as err:
        run(text2)
    assert err.value.diagnostics[0].span is not None  # located at the node


def test_plain_persistent_scalar_increment_decrement_wrap():
    text = """
    persistent { u: u8 @init(254); s: i8 @init(-127); f: f16 @init(0.5); g: f64 @init(0.25); }
    block entry {
        cache.increment u;
        cache.decrement 2 s;
        cache.increment 3 f;
        cache.decrement g;
        return;
    }
    """
    out = run(text, steps=2)
    assert out["u"].dtype == np.uint8 and int(out["u"]) == 0  # 254 -> 255 -> 0
    assert out["s"].dtype == np.int8 and int(out["s"]) == 125  # -127 -> -129=127 -> 125
    assert out["f"].dtype == np.float16 and float(out["f"]) == 6.5
    assert float(out["g"]) == -1.75


def test_plain_persistent_tensor_read_write_reset():
    text = """
    dynamic { d: f32[2, 2]; }
    persistent { W: f32[2, 2] @init(1.0); }
    volatile { w: f32[2, 2]; before: f32[2, 2]; }
    block entry {
        cache.read W >> before;
        op add(before, d) >> w;
        cache.write w >> W;
        return;
    }
    """
    d = np.arange(4, dtype=F).reshape(2, 2)
    out = run(text, {"d": d}, steps=3)
    np.testing.assert_array_equal(out["W"], 1.0 + 3 * d)
    np.testing.assert_array_equal(out["before"], 1.0 + 2 * d)
    reset = text.replace("cache.write w >> W;", "cache.write w >> W; cache.reset W;")
    np.testing.assert_array_equal(run(reset, {"d": d}, steps=3)["W"], np.ones((2, 2)))


def test_auto_dim_growth_shapes_like_the_reference_log():
    """§4.6: a [2, 2]-based tensor with counters 3k, 2k has shape [2+3k, 2+2k] ([5, 4], [8, 6],
    [11, 8] in the reference log). Reading destinations take the tensor's current shape (SPEC §0
    item 12, revised); here they are also declared at that shape."""
    template = """
    persistent {{
        i: i32 @init({i});
        j: i32 @init({j});
        M(r, c): f32[2, 2] @auto_dim(r, c) @init(4.0);
    }}
    volatile {{ one: f32 @init(1.0); }}
    block entry {{
        assign m: f32[{rows}, {cols}];
        cache.read M[i, j] >> m;      // the whole tensor at its grown shape
        op add(m, one) >> m;
        cache.write m >> M[i, j];
        return;
    }}
    """
    for k in (1, 2, 3):
        text = template.format(i=3 * k, j=2 * k, rows=2 + 3 * k, cols=2 + 2 * k)
        out = run(text, steps=2)
        assert out["M"].shape == (2 + 3 * k, 2 + 2 * k)
        # zeros at creation (@init ignored until a reset); the whole tensor gets +1 per step
        np.testing.assert_array_equal(out["M"], np.full((2 + 3 * k, 2 + 2 * k), 2.0))
    # SPEC.md §0 item 12 (revised): the read gives m the tensor's CURRENT shape, whatever m's
    # declaration ([5, 4] here, while M has grown to [8, 4])
    grown = template.format(i=3, j=2, rows=5, cols=4).replace("cache.read M[i, j] >> m;",
                                                                "cache.increment 3 i; cache.read M[i, j] >> m;")
    out = run(grown, steps=1)
    np.testing.assert_array_equal(out["M"], np.ones((8, 4), np.float32))


def test_auto_dim_fixed_max_and_reset_uses_init():
    text = """
    persistent { i: i32 @init(2); M(r): f32[1] @auto_dim(r) @fixed(r=2) @init(3.0); }
    volatile { m: f32[3]; }
    block entry {
        cache.increment i;
        cache.read M[i] >> m;
        return;
    }
    """
    with pytest.raises(OiError, match="auto_dim M exceeds fixed max 2 for r"):
        run(text, steps=1)  # i = 3 > 2
    text = text.replace("cache.increment i;", "")
    out = run(text, steps=2)  # M[2]: count 2 -> shape [1 + 2]
    assert out["M"].shape == (3,)
    reset = text.replace("cache.read M[i] >> m;", "cache.read M[i] >> m; cache.reset M;")
    out = run(reset, steps=2)
    np.testing.assert_array_equal(out["M"], [3.0])


# ---------------------------------------------------------------------------------- yield/await


PIPELINE = """
dynamic { x: f32[2]; }
constant { bias: f32[2] @init(10.0); }
volatile { h: f32[2]; h2: f32[2]; seen: f32[2]; other: f32[2]; }
block entry {
    op add(x, x) >> h;          // h = 2x
    yield x;
    op add(h, h) >> h;          // h = 4x (entry keeps running)
    await x;
    op add(x, x) >> seen;       // sees the writer's result
    return;
}
block writer { await x; op add(x, bias) >> x; yield x; }
block reader { await x; op add(x, h) >> h2; op mul(x, x) >> other; yield x; }
block idle { op fill(other, value=99.0) >> other; }
"""


def test_yield_await_snapshot_semantics():
    x = np.array([1.0, -2.0], F)
    out = run(PIPELINE, {"x": x}, steps=2)
    np.testing.assert_array_equal(out["x"], x + 10)  # inputs re-given each step
    np.testing.assert_array_equal(out["h"], 4 * x)
    np.testing.assert_array_equal(out["h2"], x + 2 * x)  # reader: snapshot x and snapshot h (=2x)
    np.testing.assert_array_equal(out["other"], x * x)  # non-yielded consumer write kept
    np.testing.assert_array_equal(out["seen"], 2 * (x + 10))


def test_yield_consumers_run_in_name_order_and_are_traced():
    tr = Trace()
    run(PIPELINE, {"x": np.ones(2, F)}, trace=tr)
    blocks = [line.split("]")[0].split("[")[1] for line in tr.lines()]
    assert blocks == ["entry", "entry", "reader", "reader", "reader", "reader",
                      "writer", "writer", "writer", "entry", "entry", "entry", "entry"]


def test_two_consumers_mutating_the_same_variable_is_an_error():
    text = """
    dynamic { x: f32; }
    block entry { yield x; await x; }
    block a { await x; op add(x, x) >> x; yield x; }
    block b { await x; op mul(x, x) >> x; yield x; }
    """
    with pytest.raises(OiError, match="multiple blocks mutated x"):
        run(text, {"x": F(1)})


def test_second_yield_before_await_is_an_error():
    text = """
    dynamic { x: f32; }
    block entry { yield x; yield x; await x; }
    block a { await x; yield x; }
    """
    with pytest.raises(OiError, match="await required before next yield"):
        run(text, {"x": F(1)})


def test_consumer_cache_writes_are_merged():
    text = """
    dynamic { x: f32; }
    persistent { P: f32 @init(0.0); T(i): f32 @table; }
    block entry { yield x; await x; return; }
    block w { await x; cache.write x >> P; cache.write x >> T[2]; yield x; }
    """
    out = run(text, {"x": F(3.0)})
    assert float(out["P"]) == 3.0
    np.testing.assert_array_equal(out["T"], [0, 0, 3])


# ------------------------------------------------------------------------------ output contract


def test_output_contract_dtypes_and_constants_excluded():
    text = """
    dynamic { a: bf16[2]; }
    constant { k: f32 @init(2.0); }
    volatile { b: f8[2] @init(1.5); c: i4[2] @init(-3); }
    persistent { T(i): i16 @table @fixed(i=2) @init(4); }
    block entry { return; }
    """
    out = run(text, {"a": np.array([1.5, 2.0], F)})
    assert set(out) == {"a", "b", "c", "T"}
    assert out["a"].dtype == np.float32 and out["b"].dtype == np.float32
    assert out["c"].dtype == np.int8 and list(out["c"]) == [-3, -3]
    np.testing.assert_array_equal(out["T"], np.array([4, 4], np.int16))


def test_prefix_tables_from_the_model_residual_mlp_stack():
    from conftest import EXAMPLES, MODELS
    from oi2jax.model import open_model
    path = MODELS / "residual_mlp_stack.oinf"
    assert path.exists(), "reference model not found"
    model = open_model(str(path))
    prog = InterpretedProgram(bind_graph(parse((EXAMPLES / "residual_mlp_stack.oi").read_text()), model))
    x = np.random.default_rng(0).standard_normal((4, 32)).astype(F)
    out = prog.run({"x": x})
    y = x + model.load("bias0")
    for layer in range(model.sizevars["num_layers"]):
        h = np.maximum(y @ model.load(f"res.mlp.w.{layer}") + model.load(f"res.mlp.b.{layer}"), 0)
        y = y + h
    np.testing.assert_allclose(out["y"], y, rtol=1e-5, atol=1e-5)


def test_the_interpreter_takes_per_step_inputs_as_the_compiled_run_does(tmp_path, capsys):
    """`[N, ...]` inputs give step i the value [i] in the interpreter too (its `run` refused them:
    `expected shape [4, 16], got [3, 4, 16]`, and the CLI refused --inputs-per-step with
    --interpret; helper probe): the same result as the compiled run, bit for bit, with steps
    defaulting to N, fewer allowed, more an error."""
    from conftest import run_cli
    src = ("dynamic { x: f32[2]; k: f32; }\nvolatile { y: f32[2]; }\npersistent { acc: f32[2] @init(0.0); }\n"
           "block entry { cache.read acc >> y; op mul(x, k) >> x; op add(y, x) >> y; cache.write y >> acc; return; }\n")
    xs = np.random.default_rng(1).standard_normal((5, 2)).astype(np.float32)
    k = np.float32(0.5)
    compiled = oi2jax.compile(src).run({"x": xs, "k": k})
    interpreted = oi2jax.compile(src, mode="interpret").run({"x": xs, "k": k})
    for name in compiled:
        np.testing.assert_array_equal(interpreted[name], compiled[name], err_msg=name)
    np.testing.assert_array_equal(interpreted["acc"], (xs * k).astype(np.float32).cumsum(0, dtype=np.float32)[-1])
    three = oi2jax.compile(src, mode="interpret").run({"x": xs, "k": k}, steps=3)
    np.testing.assert_array_equal(three["acc"], oi2jax.compile(src).run({"x": xs, "k": k}, steps=3)["acc"])
    with pytest.raises(OiError, match="6 steps asked for, but the per-step inputs hold 5 values"):
        oi2jax.compile(src, mode="interpret").run({"x": xs, "k": k}, steps=6)
    (tmp_path / "g.oi").write_text(src)
    np.savez(tmp_path / "xs.npz", x=xs)
    np.save(tmp_path / "k.npy", k)
    outs = {}
    for flag in ((), ("--interpret",)):
        code, _, err = run_cli(capsys, "run", tmp_path / "g.oi", "--inputs-per-step", tmp_path / "xs.npz", "--input",
                               f"k={tmp_path / 'k.npy'}", "--quiet", "--out", tmp_path / f"o{len(flag)}.npz", *flag)
        assert code == 0, err
        with np.load(tmp_path / f"o{len(flag)}.npz") as f:
            outs[flag] = dict(f)
    for name, value in outs[()].items():
        np.testing.assert_array_equal(outs[("--interpret",)][name], value, err_msg=name)
