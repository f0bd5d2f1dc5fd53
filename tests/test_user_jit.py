"""The pure step under the user's own `jax.jit`, `jax.vmap` and `jax.grad`, in JAX's default
configuration (no `jax_enable_x64`), for every op: generated from the registry (the 47 built-in
ops and the bundled `nn` set), all in one graph so that each transformation compiles once.

Every value must equal what `Program.run` gives (bit for bit: the same lowering), and a 64-bit
value that cannot exist under the user's trace is a clear `OiError`."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oi2jax
from oi2jax import dtypes as D
from oi2jax import ops
from oi2jax.diagnostics import OiError

from conftest import assert_matches

SHAPE = (2, 3)
_REQUIRED_VALUES = {"int_list": [1], "dtype": "f32"}  # the required attributes' values, by kind
_SCALAR_REQUIRED = {"int": 1, "scalar": 1, "float": 1.0, "bool": True}
_PREFERRED = ("f32", "i32", "u8", "bool", "bf16", "f16", "i8")


def _dtype_for(op_def) -> str | None:
    return next((d for d in _PREFERRED if d in op_def.normal_dtypes), None)


def _case(op_def, registry):
    """(input dtypes, input shapes, attrs text, attrs) for one op, or None if it needs more than
    this generator knows (then the test says so)."""
    samples = op_def.samples(np.random.default_rng(0), "f32") if op_def.samples is not None else None
    if samples:
        inputs, attrs = samples[0]
        in_dtypes = [("f32" if np.asarray(x).dtype.kind == "f" else
                      {np.dtype(np.int32): "i32", np.dtype(np.int64): "i64", np.dtype(np.bool_): "bool",
                       np.dtype(np.int8): "i8", np.dtype(np.uint8): "u8"}[np.asarray(x).dtype]) for x in inputs]
        return in_dtypes, [np.shape(x) for x in inputs], attrs, [np.asarray(x) for x in inputs]
    d = _dtype_for(op_def)
    if d is None:
        return None
    attrs = {}
    for name, a in op_def.attrs.items():
        if a.required:
            attrs[name] = _REQUIRED_VALUES.get(a.kind, _SCALAR_REQUIRED.get(a.kind))
    shapes = [SHAPE] * op_def.arity
    if op_def.shape is not None:
        try:
            op_def.shape(shapes, attrs)
        except ops.OpTypeError:  # matmul: [2, 3] x [3, 2]
            shapes = [SHAPE, SHAPE[::-1]] + [SHAPE] * (op_def.arity - 2)
    rng = np.random.default_rng(len(op_def.name))
    values = []
    for s in shapes:
        x = rng.standard_normal(s) * 3
        values.append(x.astype(D.get(d).np_dtype) if D.get(d).is_float else
                      (x > 0) if d == "bool" else np.abs(x).astype(D.get(d).np_dtype) if d[0] == "u"
                      else x.astype(D.get(d).np_dtype))
    return [d] * op_def.arity, shapes, attrs, values


def _attr_text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(str(int(x)) for x in v) + "]"
    if isinstance(v, str):
        return v if D.is_dtype(v) else f'"{v}"'
    return repr(v)


def _graph(registry):
    """One graph applying every op once: (source, inputs, op names covered, op names skipped)."""
    decls_in, decls_out, nodes, inputs, covered, skipped = [], [], [], {}, [], []
    for op_def in registry.values():
        case = _case(op_def, registry)
        if case is None:
            skipped.append(op_def.name)
            continue
        in_dtypes, shapes, attrs, values = case
        names = []
        for k, (d, s, v) in enumerate(zip(in_dtypes, shapes, values)):
            n = f"{op_def.name}_in{k}"
            decls_in.append(f"    {n}: {d}[{', '.join(map(str, s))}];" if s else f"    {n}: {d};")
            inputs[n] = v
            names.append(n)
        sig = ops.infer(op_def.name, in_dtypes, [tuple(s) for s in shapes],
                        {k: v for k, v in attrs.items()}, registry=registry)
        out = f"{op_def.name}_out"
        dims = ", ".join(map(str, sig.out_shape))
        decls_out.append(f"    {out}: {sig.out_dtype}[{dims}];" if sig.out_shape else f"    {out}: {sig.out_dtype};")
        settings = "".join(f", {k}={_attr_text(v)}" for k, v in attrs.items())
        nodes.append(f"    op {op_def.name}({', '.join(names)}{settings}) >> {out};")
        covered.append(op_def.name)
    src = ("dynamic {\n" + "\n".join(decls_in) + "\n}\nvolatile {\n" + "\n".join(decls_out) +
           "\n}\nblock entry {\n" + "\n".join(nodes) + "\n    return;\n}\n")
    return src, inputs, covered, skipped


@pytest.fixture(scope="module")
def every_op():
    registry = ops.load(["nn"])
    src, inputs, covered, skipped = _graph(registry)
    prog = oi2jax.compile(src, ops=registry)
    return prog, inputs, covered, skipped, registry


def test_every_op_is_covered(every_op):
    prog, inputs, covered, skipped, registry = every_op
    assert not skipped, f"ops this generator cannot build a case for: {skipped}"
    assert len(covered) == len(registry) >= 47 + 20


def _same(a: dict, b: dict, names) -> None:
    """Output `OP_out` of each name equal: bit for bit on a CPU; on a GPU within the device's
    tolerance for OP (conftest EXACTNESS: a jitted or vmapped step is another compilation)."""
    from conftest import assert_matches
    for n in names:
        x, y = np.asarray(a[n]), np.asarray(b[n])
        assert x.dtype == y.dtype and x.shape == y.shape, (n, x.dtype, y.dtype, x.shape, y.shape)
        assert_matches({n: x}, {n: y}, [n.rsplit("_out", 1)[0]], n)


def test_pure_step_under_users_jit_without_x64_equals_run(every_op):
    prog, inputs, covered, _, _ = every_op
    assert not jax.config.jax_enable_x64  # JAX's default configuration
    want = prog.run(inputs)
    outs = [f"{n}_out" for n in covered]
    step = jax.jit(lambda state, dyn: prog.step(state, **dyn))
    dyn = {k: jnp.asarray(v) for k, v in inputs.items()}
    state, got = step(prog.init_state(), dyn)
    prog.check(state)
    got = {k: D.to_output(np.asarray(v), prog.bound.dtype(k)) for k, v in got.items()}
    _same(want, got, outs)


def test_pure_step_under_users_vmap_without_x64_equals_run(every_op):
    prog, inputs, covered, _, _ = every_op
    want = prog.run(inputs)
    outs = [f"{n}_out" for n in covered]
    state = prog.init_state()
    batched = jax.jit(jax.vmap(lambda dyn: prog.step(state, **dyn)[1]))
    dyn = {k: jnp.stack([jnp.asarray(v)] * 2) for k, v in inputs.items()}
    got = batched(dyn)
    for k in outs:
        v = D.to_output(np.asarray(got[k]), prog.bound.dtype(k))
        _same(want, {k: v[1]}, [k])


FORWARD_ONLY = {"attention"}


def test_pure_step_under_users_grad_without_x64(every_op):
    """grad of the float outputs of the differentiable ops: the same under the user's default
    configuration as with x64 enabled (one lowering, either way)."""
    prog, inputs, covered, _, _ = every_op
    # attention loops over a run-time number of cache blocks (a lax.while_loop): forward only, as
    # docs/ops.md says; every other float op is differentiated
    floats = [n for n in covered if n not in FORWARD_ONLY and prog.bound.dtype(f"{n}_out") == "f32"
              and all(prog.bound.dtype(k) == "f32" for k in inputs if k.rsplit("_in", 1)[0] == n)]  # the node's inputs
    state = prog.init_state()
    fixed = {k: jnp.asarray(v) for k, v in inputs.items()}

    def loss(xs):
        outs = prog.step(state, **{**fixed, **xs})[1]
        return sum(jnp.sum(jnp.where(jnp.isfinite(outs[f"{n}_out"]), outs[f"{n}_out"], 0.0)) for n in floats)

    xs = {f"{n}_in0": fixed[f"{n}_in0"] for n in floats}
    g = jax.jit(jax.grad(loss))(xs)
    with jax.enable_x64(True):
        g64 = jax.jit(jax.grad(loss))(xs)
    assert set(g) == set(xs) and len(floats) >= 25
    for k in g:
        np.testing.assert_array_equal(np.asarray(g[k]), np.asarray(g64[k]), err_msg=k)


def test_a_traced_64_bit_input_without_x64_is_a_clear_error():
    prog = oi2jax.compile("dynamic { n: i64[2]; }\nvolatile { m: i64[2]; }\n"
                          "block entry {\n    op add(n, n) >> m;\n    return;\n}\n")
    state = prog.init_state()
    with pytest.raises(OiError, match=r"input n is i64: a traced value under jax.jit without jax_enable_x64 "
                                      r"cannot be 64-bit \(it is int32\)"):
        jax.jit(lambda s, n: prog.step(s, n=n))(state, np.arange(2))
    # a concrete array is converted exactly, under the user's jit too
    state, out = jax.jit(lambda s: prog.step(s, n=np.array([1, 2], np.int64)))(state)
    np.testing.assert_array_equal(np.asarray(out["m"]), [2, 4])


APPLY_GRAPH = """
dynamic { x: f32[1, N]; }
constant { W: f32[N, N]; }
volatile { y: f32[1, N]; }
persistent { t: i32 @init(0); }
block entry {
    op matmul(x, W) >> y;
    cache.increment t;
    return;
}
"""


def test_apply_takes_the_weights_as_an_argument_of_the_users_jit(tmp_path):
    """`prog.step` closes over the weights: inside a user's jit JAX compiles them into the program
    as constants (their values in the HLO text). `prog.apply(consts, ...)` with `prog.consts`
    passed in keeps them an argument: the same values, an HLO without them."""
    from oi2jax.model.writer import save
    n = 96
    rng = np.random.default_rng(3)
    w = rng.standard_normal((n, n)).astype(np.float32)
    save(tmp_path / "m.oinf", sizevars={"N": n}, tensors={"W": w})
    prog = oi2jax.compile(APPLY_GRAPH, model=tmp_path / "m.oinf")
    x = rng.standard_normal((1, n)).astype(np.float32)
    closed = jax.jit(lambda state, x: prog.step(state, x=x))
    given = jax.jit(lambda consts, state, x: prog.apply(consts, state, x=x))
    s1, o1 = closed(prog.init_state(), x)
    s2, o2 = given(prog.consts, prog.init_state(), x)
    # bit for bit on a CPU; on a GPU the weights as constants may get another matmul algorithm
    # than the weights as an argument (the per-device table, tests/conftest.py EXACTNESS: an H200
    # differed in the last bits of 72 of 96 values)
    assert_matches({"y": np.asarray(o1["y"])}, {"y": np.asarray(o2["y"])}, {"matmul"}, "closed over vs given")
    np.testing.assert_array_equal(np.asarray(o2["y"]), prog.run({"x": x})["y"])  # the same lowering
    np.testing.assert_allclose(np.asarray(o2["y"]), x.astype(np.float64) @ w, rtol=1e-5, atol=1e-4)
    assert int(s1.vars["t"]) == int(s2.vars["t"]) == 1
    weight_bytes = w.nbytes
    assert len(closed.lower(prog.init_state(), x).as_text()) > weight_bytes  # the weights, as text
    assert len(given.lower(prog.consts, prog.init_state(), x).as_text()) < weight_bytes // 4
    with pytest.raises(OiError, match=r"apply: consts must be the program's constants \(prog.consts: 1 entries, W\)"):
        prog.apply({}, prog.init_state(), x=x)
    with pytest.raises(OiError, match=r"apply: consts\['W'\] is float32\[96, 95\], but the program's is float32\[96, 96\]"):
        prog.apply({"W": w[:, 1:]}, prog.init_state(), x=x)


def test_check_of_a_vmapped_state_names_the_failing_element():
    """`prog.check(state)` after the pure step under `jax.vmap` (docs/decode.md: callers of the pure
    step must call it): a TypeError in the error table's lookup for any stacked state."""
    from conftest import EXAMPLES
    kv = oi2jax.compile(EXAMPLES / "kv_cache_decode.oi")
    d = kv.bound.shape("q")[0]
    states = jax.tree.map(lambda x: jnp.stack([x, x]), kv.init_state())
    step = jax.vmap(lambda s, q: kv.step(s, q=q))
    qs = np.ones((2, d), np.float32)
    for _ in range(4):  # K holds 4 entries: four steps are fine
        states, _ = step(states, qs)
        kv.check(states)
    states, _ = step(states, qs)
    with pytest.raises(OiError) as err:
        kv.check(states)
    assert err.value.render().splitlines()[0].endswith(
        "error: dimension 0 of K: index 4 is past its fixed size 4 (element 0 of the state's leading axes)")


def test_the_pure_step_exported_serializes_and_runs_back():
    """docs/decode.md: the step composes with `jax.export`; `Exported.serialize()` refused "an
    unregistered type CacheState" (helper probe): the state's pytrees register their serialization."""
    import jax.export
    from conftest import EXAMPLES
    kv = oi2jax.compile(EXAMPLES / "kv_cache_decode.oi")
    q = np.arange(kv.bound.shape("q")[0], dtype=np.float32)
    with kv.scope():
        exported = jax.export.export(jax.jit(lambda s, q: kv.step(s, q=q)))(kv.init_state(), q)
        back = jax.export.deserialize(exported.serialize())
        state, out = back.call(kv.init_state(), q)
        want_state, want = kv.step(kv.init_state(), q=q)
    np.testing.assert_array_equal(out["k_hist"], want["k_hist"])
    assert int(state.vars["t"]) == int(want_state.vars["t"]) == 1
    kv.check(state)
