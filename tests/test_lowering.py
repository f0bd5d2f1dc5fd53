"""Lowering rules, one focused test each: outputs against NumPy, HLO constructs, no waste per step."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError


def compile_text(text, **kw):
    return oi2jax.compile(text, **kw)


BRANCH = """
dynamic { x: f32[4]; c: bool; }
volatile { y: f32[4]; z: f32[4]; }
block entry {
    op add(x, x) >> y;
    branch c pos neg;
    op mul(y, x) >> z;
    return;
}
block pos { op fill(y, value=1.0) >> y; return; }
block neg { op neg(y) >> y; }
"""


@pytest.fixture(scope="module")
def branch_prog():
    return compile_text(BRANCH)


@pytest.mark.parametrize("cond", [True, False])
def test_branch_calls_and_returns(branch_prog, cond):
    x = np.array([1, -2, 3, 0.5], np.float32)
    out = branch_prog.run({"x": x, "c": np.array(cond)})
    y = np.ones(4, np.float32) if cond else -(x + x)
    np.testing.assert_array_equal(out["y"], y)
    np.testing.assert_array_equal(out["z"], y * x)  # execution continued after the branch


def test_branch_is_a_conditional_in_hlo(branch_prog):
    text = branch_prog.emit("hlo")
    assert "conditional" in text


LOOP = """
dynamic { x: f32[2, 3]; }
volatile { y: f32[2, 3]; n: i32 @init(4); }
block entry {
    op fill(y, value=0.0) >> y;
    loop outer (i in 0..3) {
        loop inner (j in 1..n) {
            op add(y, x) >> y;
        }
    }
    return;
}
"""


def test_nested_loops_with_variable_bound():
    prog = compile_text(LOOP)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = prog.run({"x": x})
    np.testing.assert_allclose(out["y"], 9 * x)  # 3 outer x 3 inner (1..4)
    assert "while" in prog.emit("hlo")


def test_return_inside_loop_ends_the_loop():
    prog = compile_text("""
    volatile { y: i32 @init(0); one: i32 @init(1); }
    block entry {
        loop l (i in 0..5) { op add(y, one) >> y; return; }
        op add(y, one) >> y;
    }
    """)
    assert int(prog.run({})["y"]) == 2


PREFIX = """
dynamic { x: f32[2, 4]; }
constant { W(layer): f32[4, 4] @pattern("w.{layer}"); }
volatile { y: f32[2, 4]; }
block entry {
    transfer x >> y;
    loop layers (l in 0..L) { op matmul(y, W[l]) >> y; }
    return;
}
"""


def test_prefix_table_in_loop_is_one_stacked_array(tmp_path):
    from oi2jax.model import save
    rng = np.random.default_rng(1)
    ws = [rng.standard_normal((4, 4)).astype(np.float32) for _ in range(3)]
    path = tmp_path / "m.oinf"
    save(path, sizevars={"L": 3}, tensors={f"w.{i}": w for i, w in enumerate(ws)})
    prog = compile_text(PREFIX, model=path)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    # each member in its place: x W0 W1 W2 within the forward error bound of three f32 products of
    # length 4 (3 * 4 eps |x| |W0| |W1| |W2|, first order). Not bit for bit between the two forms:
    # XLA:CPU may pick another dot kernel inside a loop body (docs/loops.md)
    exact = x.astype(np.float64) @ ws[0] @ ws[1] @ ws[2]
    bound = 1.01 * 3 * 4 * float(np.finfo(np.float32).eps) * (np.abs(x) @ np.abs(ws[0]) @ np.abs(ws[1]) @
                                                               np.abs(ws[2]))
    assert np.all(np.abs(prog.run({"x": x})["y"] - exact) <= bound)
    assert prog.emit("jaxpr").count("dot_general") == 3  # auto: a layer loop within budget is unrolled
    as_loop = compile_text(PREFIX, model=path, unroll="none")
    assert np.all(np.abs(as_loop.run({"x": x})["y"] - exact) <= bound)
    assert as_loop.emit("jaxpr").count("dot_general") == 1  # a loop: the body traced once
    with pytest.raises(OiError, match=r"w\.3"):
        compile_text(PREFIX, model=path, sizes={"L": 4}).run({"x": x})


def test_barrier_and_dep_are_optimization_barriers():
    prog = compile_text("""
    dynamic { x: f32[3]; }
    volatile { y: f32[3]; z: f32[3]; }
    block entry {
        op add(x, x) >> y;
        barrier;
        op mul(y, y) >> z;
        dep after(y) before(z);
        dep after(matmul) before(cache.write);
        return;
    }
    """)
    text = prog.emit("hlo")
    assert text.count("opt-barrier") >= 2
    x = np.array([1, 2, 3], np.float32)
    np.testing.assert_array_equal(prog.run({"x": x})["z"], (2 * x) ** 2)


def test_named_scopes_map_hlo_back_to_nodes():
    prog = compile_text("""
    dynamic { a: f32[2, 2]; }
    volatile { b: f32[2, 2]; }
    block entry { op matmul(a, a) >> b; }
    """)
    assert "jit(step)/entry/0:matmul/dot_general" in prog.emit("stablehlo")
    assert 'op_name="jit(step)/entry/0:matmul/dot_general"' in prog.emit("optimized-hlo")


def test_volatile_resets_and_persistent_carries():
    prog = compile_text("""
    persistent { count: i32 @init(10); acc: f32[2] @init(0.5); }
    volatile { v: i32 @init(3); c: i32; one: i32 @init(1); a: f32[2]; }
    block entry {
        op add(v, one) >> v;
        cache.read count >> c;
        cache.increment count;
        cache.read acc >> a;
        op add(a, a) >> a;
        cache.write a >> acc;
        return;
    }
    """)
    out = prog.run({}, steps=3)
    assert int(out["v"]) == 4  # reset to @init(3) each step, +1
    assert int(out["c"]) == 12 and int(out["count"]) == 13
    np.testing.assert_array_equal(out["acc"], [4.0, 4.0])


def test_scalar_increment_wraps():
    prog = compile_text("""
    persistent { b: u8 @init(254); s: i8 @init(-127); }
    block entry { cache.increment b; cache.decrement 2 s; }
    """)
    out = prog.run({}, steps=2)
    assert out["b"].dtype == np.uint8 and int(out["b"]) == 0
    assert int(out["s"]) == 125  # -127 - 4 wraps


def test_named_return_selects_step_outputs():
    prog = compile_text("""
    dynamic { x: f32[2]; }
    volatile { y: f32[2]; z: f32[2]; }
    block entry { op add(x, x) >> y; op mul(x, x) >> z; return y; }
    """)
    state = prog.init_state()
    _, outputs = prog.step(state, x=jnp.asarray([1.0, 2.0], jnp.float32))
    assert set(outputs) == {"y"}


TABLE = """
dynamic { x: f32[2]; }
persistent { n: i32 @init(0); R(s): f32[2] @table @fixed(s=3); }
volatile { win: f32[3, 2]; last: f32[2, 2]; }
block entry {
    cache.write x >> R[n];
    cache.increment n;
    cache.read R[] >> win;
    cache.read R[1..3] >> last;
    return;
}
"""


def test_fixed_table_write_read_slice():
    prog = compile_text(TABLE)
    x = np.array([1.5, -2.0], np.float32)
    out = prog.run({"x": x}, steps=2)
    np.testing.assert_array_equal(out["win"], [x, x, [0, 0]])
    np.testing.assert_array_equal(out["last"], [x, [0, 0]])
    np.testing.assert_array_equal(out["R"], [x, x, [0, 0]])
    assert int(out["n"]) == 2


def test_fixed_table_overflow_is_an_error_naming_cache_and_index():
    prog = compile_text(TABLE)
    with pytest.raises(OiError, match=r"dimension 0 of R: index 3 is past its fixed size 3") as info:
        prog.run({"x": np.zeros(2, np.float32)}, steps=4)
    assert info.value.render().startswith("<string>:6:22: error:")  # at the cache.write target


def test_growable_table_doubles_capacity_with_log_compiles():
    prog = compile_text("""
    dynamic { x: f32[3]; }
    persistent { n: i64 @init(0); H(t): f32[3] @table; }
    volatile { row: f32[3]; }
    block entry {
        cache.write x >> H[n];
        cache.read H[n] >> row;
        cache.increment n;
        return;
    }
    """)
    x = np.array([1, 2, 3], np.float32)
    out = prog.run({"x": x}, steps=40)
    assert out["H"].shape == (40, 3)
    np.testing.assert_array_equal(out["H"], np.tile(x, (40, 1)))
    assert prog.compiles <= 1 + 4  # capacity 4 -> 8 -> 16 -> 32 -> 64


def test_auto_dim_grows_with_counters():
    prog = compile_text("""
    persistent { r: i32 @init(3); c: i32 @init(2); M(a, b): f32[2, 2] @auto_dim(a, b); }
    volatile { m: f32[5, 4]; }
    block entry {
        cache.read M[r, c] >> m;
        return;
    }
    """)
    out = prog.run({})
    assert out["M"].shape == (5, 4)
    np.testing.assert_array_equal(out["m"], np.zeros((5, 4)))


def test_no_retrace_and_no_host_transfer_across_100_steps():
    prog = compile_text(TABLE.replace("@fixed(s=3)", "@fixed(s=200)").replace("win: f32[3, 2]", "win: f32[200, 2]"))
    state = prog.init_state()
    x = jnp.asarray([1.0, 2.0], jnp.float32)
    state, _ = prog.step(state, x=x)
    before = prog.compiles
    with jax.transfer_guard("disallow"):
        for _ in range(100):
            state, outputs = prog.step(state, x=x)
    assert prog.compiles == before == 1
    assert int(np.asarray(state.vars["n"])) == 101


def test_step_composes_with_grad_and_vmap():
    prog = compile_text("""
    dynamic { x: f32[2, 3]; }
    constant { w: f32[3, 2] @init(0.5); }
    volatile { y: f32[2, 2]; }
    block entry { op matmul(x, w) >> y; }
    """)
    x = jnp.ones((2, 3), jnp.float32)
    with jax.enable_x64(True):
        grad = jax.grad(lambda x: prog.step(prog.init_state(), x=x)[1]["y"].sum())(x)
        np.testing.assert_allclose(np.asarray(grad), np.full((2, 3), 1.0))
        xs = jnp.stack([x, 2 * x])
        ys = jax.vmap(lambda xi: prog.step(prog.init_state(), x=xi)[1]["y"])(xs)
        np.testing.assert_allclose(np.asarray(ys)[1], np.full((2, 2), 3.0))


def test_lower_gives_jax_lowered():
    prog = compile_text("""
    dynamic { x: f32[8, 8]; }
    volatile { y: f32[8, 8]; }
    block entry { op matmul(x, x) >> y; }
    """)
    lowered = prog.lower()
    assert "dot_general" in lowered.as_text()
    compiled = lowered.compile()
    assert "dot" in compiled.as_text()


def test_yield_await_fused_snapshot_semantics():
    from test_driver import WRITER_READER  # the same program the driver tests run both ways
    prog = compile_text(WRITER_READER, yield_mode="fused")
    x = np.array([3.0, -1.0], np.float32)
    out = prog.run({"x": x})
    np.testing.assert_array_equal(out["x"], x * x)  # the writer's result after await
    np.testing.assert_array_equal(out["seen"], 2 * x)  # the reader saw the snapshot
    np.testing.assert_array_equal(out["h"], 2 * x)  # entry saw the snapshot in its window


def test_packed_values_stay_packed_on_device(tmp_path):
    from oi2jax.model import Tensor, save
    w = np.array([[-8, 7, 3], [0, -1, 5]], np.int8)
    path = tmp_path / "q.oinf"
    save(path, tensors={"w": Tensor("i4", w)})
    prog = compile_text("""
    dynamic { x: i4[2, 3]; }
    constant { w: i4[2, 3]; }
    persistent { P: i4[2, 3] @init(-3); U: u2[7] @init(3); }
    volatile { y: i4[2, 3]; z: i4[2, 3]; }
    block entry { cache.read P >> y; op add(y, x) >> z; op add(z, w) >> z; cache.write z >> P; }
    """, model=path)
    state = prog.init_state()
    assert state.vars["P"].dtype == np.uint8 and state.vars["P"].shape == (3,)  # 6 nibbles in 3 bytes
    assert state.vars["U"].shape == (2,)  # 7 two-bit values in 2 bytes
    assert prog.consts["w"].dtype == np.uint8 and prog.consts["w"].nbytes == 3
    x = np.array([[1, 2, 3], [4, 7, -8]], np.int8)
    out = prog.run({"x": x}, steps=2)
    expected = np.full((2, 3), -3)
    for _ in range(2):
        expected = expected + x + w
    wrapped = ((expected + 8) % 16) - 8  # i4 wrap-around
    np.testing.assert_array_equal(out["P"], wrapped)
    np.testing.assert_array_equal(out["U"], np.full(7, 3, np.uint8))


def test_sliding_window_over_eight_steps():
    """A window of the last 3 rows slides over a @fixed(i=10) table: 8 steps against NumPy."""
    prog = compile_text("""
    dynamic { x: f32[2]; }
    constant { three: i32 @init(3); }
    persistent { w: i32 @init(0); s: i32 @init(0); e: i32 @init(3); A(i): f32[2] @table @fixed(i=10); }
    volatile { window: f32[3, 2]; wv: i32; ready: bool; }
    block entry {
        cache.write x >> A[w];
        cache.increment w;
        cache.read w >> wv;
        op ge(wv, three) >> ready;
        branch ready slide wait;
        return;
    }
    block slide { cache.read A[s..e] >> window; cache.increment s; cache.increment e; }
    block wait { }
    """)
    x = np.array([1.0, -1.0], np.float32)
    state = prog.init_state()
    rows = np.zeros((10, 2), np.float32)
    for step in range(8):
        xs = (x * (step + 1)).astype(np.float32)
        state, out = prog.step(state, x=jnp.asarray(xs))
        rows[step] = xs
        if step >= 2:
            np.testing.assert_array_equal(np.asarray(out["window"]), rows[step - 2:step + 1])
        else:
            np.testing.assert_array_equal(np.asarray(out["window"]), np.zeros((3, 2)))
    assert int(np.asarray(state.vars["s"])) == 6 and int(np.asarray(state.guards.err)) == 0


def test_negative_slice_start_at_run_time_is_an_error():
    prog = compile_text("""
    persistent { s: i32 @init(-1); A(i): f32[2] @table @fixed(i=4); }
    volatile { win: f32[2, 2]; }
    block entry { cache.read A[s..1] >> win; }
    """)
    with pytest.raises(OiError, match=r"cache index cannot be negative: A slice start is -1 \(in step 1\)"):
        prog.run({})


def test_step_vmaps_over_a_batch_of_states():
    """jax.vmap over stacked persistent states: each lane carries its own counter and table."""
    prog = compile_text(TABLE)
    with jax.enable_x64(True):
        one = prog.init_state()
        states = jax.tree.map(lambda a: jnp.stack([a, a, a]), one)
        lanes = jnp.asarray([0, 1, 2], states.vars["n"].dtype)  # lanes start at other rows
        states = dataclasses.replace(states, vars={**states.vars, "n": lanes})
        xs = jnp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], jnp.float32)
        step = jax.vmap(lambda s, x: prog.step(s, x=x))
        new, outs = step(states, xs)
    assert np.asarray(new.vars["n"]).tolist() == [1, 2, 3]
    win = np.asarray(outs["win"])
    for lane in range(3):
        expected = np.zeros((3, 2), np.float32)
        expected[lane] = np.asarray(xs[lane])
        np.testing.assert_array_equal(win[lane], expected)


def test_prefix_index_from_a_runtime_bound_is_guarded(tmp_path):
    from oi2jax.model import save
    path = tmp_path / "m.oinf"
    save(path, sizevars={"L": 2}, tensors={f"w.{i}": np.eye(4, dtype=np.float32) for i in range(2)})
    prog = compile_text(PREFIX.replace("(l in 0..L)", "(l in 0..n)").replace(
        "volatile { y: f32[2, 4]; }", "dynamic { n: i32; } volatile { y: f32[2, 4]; }"), model=path)
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(prog.run({"x": x, "n": np.array(2, np.int32)})["y"], x)
    with pytest.raises(OiError, match=r"prefix table W: model tensor w\.2 not found \(in step 1\)"):
        prog.run({"x": x, "n": np.array(3, np.int32)})


def test_growth_makes_new_layouts_and_leaves_the_lowering_immutable():
    """Issue 33: the layout kind is an enum, `Lowering` and its cache layouts are immutable static
    facts; a growth gives the program a new lowering (and a new generation of kernels)."""
    from oi2jax.lowering.caches import LayoutKind
    src = ("persistent { t: i64 @init(0); A(i): f32[2] @table; }\ndynamic { x: f32[2]; }\n"
           "block entry { cache.write x >> A[t]; cache.increment t; return; }\n")
    prog = oi2jax.compile(src)
    before, generation = prog.lowering, prog.generation
    capacity = before.caches["A"].capacity
    assert before.caches["A"].kind is LayoutKind.TABLE and before.caches["t"].kind is LayoutKind.PLAIN
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.caches = {}
    with pytest.raises(TypeError):
        before.caches["A"] = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.caches["A"].capacity = (64,)
    out = prog.run({"x": np.ones(2, np.float32)}, steps=3 * capacity[0])
    assert out["A"].shape == (3 * capacity[0], 2)
    assert before.caches["A"].capacity == capacity  # the old facts untouched
    assert prog.lowering is not before and prog.lowering.caches["A"].capacity[0] >= 3 * capacity[0]
    assert prog.generation > generation and prog.lowering.error_sites is before.error_sites
