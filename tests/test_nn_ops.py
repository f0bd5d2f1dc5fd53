"""The bundled `nn` op set (oi2jax/ops/nn/, docs/ops.md): every op against its NumPy reference.

Generated from the registry, like tests/test_ops.py: for every op of `ops.load(["nn"])` that is
not built in, every dtype it accepts among f16, bf16, f32, f64 (and, for ops taking any / integer /
numeric values, a representative set of i32, i8, u8, bool) and every case of its `samples(rng,
dtype)`, the kernel (`ops.apply`, all of an op's cases in one `jax.jit`) is held to the reference
(`ops.reference`: float64 NumPy, rounded once to the output dtype, what the interpreter runs):

- the output dtype and shape the checker infers (`ops.infer`, the op's shape rule) are the
  kernel's and the reference's;
- the runtime errors (`ctx.fail_if`) the kernel records are the ones the reference records, same
  message and value; a case with an error compares nothing else;
- values within TOLERANCE (below) by output dtype and op kind; EXACT ops (data movement, lookup,
  argmax) bit for bit for every dtype (NaN = NaN, the sign of zero counts).

Adding an op to the nn package adds its cases. Then a few graphs through the DSL: compiled against the
interpreter (which runs the references), the runtime error located at the node, check-time shape
errors with the caret on the attribute.
"""
from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import oi2jax
from conftest import run_cli, tolerance
from oi2jax import dtypes as D
from oi2jax import ops
from oi2jax.diagnostics import OiError

NN = ops.load(["nn"])
NN_OPS = {d.name: d for d in NN.added()}
DOCS = Path(__file__).resolve().parent.parent / "docs" / "ops.md"

FLOATS = ("f16", "bf16", "f32", "f64")
REPRESENTATIVE = ("i32", "i8", "u8", "bool")  # besides the floats, for the any / index / numeric ops

# Data movement, lookup and argmax: bit for bit, every dtype.
EXACT = {"transpose", "reshape", "concat", "embedding", "argmax", "sample"}
# Ops whose result sums many terms (or, rope, mixes two products of a cos / sin): the "reduction" row.
REDUCTION = {"softmax", "rms_norm", "layer_norm", "rope", "linear", "matmul_t", "einsum"}

# (rtol, atol) by output dtype and op kind: |got - want| <= atol + rtol * max(|got|, |want|).
# f64: computed in f64 as the reference, to ~1e-15; f32: XLA's transcendentals are within a few ulp
# (2^-23 = 1.2e-7), sums of f32 terms within ~1e-6 of the f64 sum; f16 and bf16 are computed in f32
# and rounded once, so they may differ from the once-rounded float64 reference by one ulp
# (2^-10 = 9.8e-4, 2^-7 = 7.8e-3; atol: f16's smallest subnormal step, and cancellation in sums).
TOLERANCE = {
    "f64": {"elementwise": (1e-12, 1e-300), "reduction": (1e-12, 1e-12)},
    "f32": {"elementwise": (2e-6, 1e-7), "reduction": (1e-5, 1e-6)},
    "f16": {"elementwise": (1e-3, 6e-8), "reduction": (1e-3, 1e-4)},
    "bf16": {"elementwise": (7.9e-3, 1e-38), "reduction": (7.9e-3, 1e-3)},
}
RNG_SEED = 31


def dtypes_for(op_def) -> list[str]:
    """The dtypes an op is tested with: its floats, and the representative others it accepts."""
    accepted = op_def.inputs[0].dtypes
    return [d for d in FLOATS + REPRESENTATIVE if d in accepted]


def dtype_name(array) -> str:
    np_dtype = np.asarray(array).dtype
    return next(name for name, dt in D.DTYPES.items() if np.dtype(dt.np_dtype) == np_dtype)


def is_variable(value) -> bool:
    """A sample's attribute given as a 0-d array stands for a variable (traced in the kernel)."""
    return isinstance(value, np.ndarray)


def cases_for(op_def) -> list[dict]:
    out = []
    for d in dtypes_for(op_def):
        rng = np.random.default_rng(RNG_SEED + sum(map(ord, op_def.name + d)))
        for inputs, attrs in op_def.samples(rng, d):
            in_dtypes = [d] + [d if spec.dtypes is None else dtype_name(x)
                               for spec, x in zip(op_def.inputs[1:], inputs[1:])]
            sig = ops.infer(op_def.name, in_dtypes, [np.shape(x) for x in inputs], dict(attrs), registry=NN)
            out.append(dict(dtype=d, in_dtypes=in_dtypes, inputs=list(inputs), attrs=dict(attrs), sig=sig,
                            static={k: v for k, v in attrs.items() if not is_variable(v)},
                            dynamic={k: v for k, v in attrs.items() if is_variable(v)}))
    return out


def run_cases(op_def, cases):
    """All of an op's cases in one jitted function: (outputs, fired guards per case)."""
    messages: list[list[str]] = [[] for _ in cases]

    def many(all_inputs, all_dynamic):
        outs, flags = [], []
        for i, (c, xs, dyn) in enumerate(zip(cases, all_inputs, all_dynamic)):
            guards: list = []
            outs.append(ops.apply(op_def, xs, {**c["static"], **dyn}, in_dtypes=c["in_dtypes"],
                                  out_dtype=c["sig"].out_dtype, mode="normal", guards=guards))
            messages[i] = [m for _, m, _ in guards]
            flags.append([(jnp.any(cond), jnp.asarray(value).astype(jnp.int64)) for cond, _, value in guards])
        return outs, flags

    with jax.enable_x64(True):
        outs, flags = jax.jit(many)([[jnp.asarray(x) for x in c["inputs"]] for c in cases],
                                    [{k: jnp.asarray(v) for k, v in c["dynamic"].items()} for c in cases])
        outs = [np.asarray(o) for o in outs]
        fired = [[m.format(value=int(v)) for m, (f, v) in zip(ms, fl) if bool(f)] for ms, fl in zip(messages, flags)]
    return outs, fired


def out_shape(op_def, c):
    """The shape the checker infers. A variable-valued attribute makes the registry skip the shape
    rule (the attribute is DYNAMIC to it): then the rule is asked without the variables, which no
    nn shape depends on."""
    if c["sig"].out_shape is not None or not c["dynamic"]:
        return c["sig"].out_shape
    return ops.infer(op_def.name, c["in_dtypes"], [np.shape(x) for x in c["inputs"]], c["static"],
                     registry=NN).out_shape


def reference_of(op_def, c):
    guards: list = []
    with np.errstate(over="ignore"):  # dispatch.reference rounds float64 to the dtype: overflow gives inf
        want = ops.reference(op_def, c["inputs"], c["attrs"], in_dtypes=c["in_dtypes"], out_dtype=c["sig"].out_dtype,
                             mode="normal", guards=guards)
    return want, [m.format(value=int(np.asarray(v))) for cond, m, v in guards if bool(np.any(cond))]


def assert_close(got, want, op_name: str, out_dtype: str, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype == D.get(out_dtype).np_dtype, (what, got.dtype, want.dtype)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if not D.get(out_dtype).is_float:
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    ok = ((g == w) & (np.signbit(g) == np.signbit(w))) | (np.isnan(g) & np.isnan(w))
    if op_name not in EXACT:
        rtol, atol = TOLERANCE[out_dtype]["reduction" if op_name in REDUCTION else "elementwise"]
        with np.errstate(invalid="ignore"):
            ok |= np.abs(g - w) <= atol + rtol * np.maximum(np.abs(g), np.abs(w))
        ok |= (g == w)  # infinities of the same sign; 0 vs -0 from a cancelling sum
        device = tolerance([op_name])  # off a CPU: the device's entry of the one table (conftest EXACTNESS)
        if device:
            eps = float(ml_dtypes.finfo(got.dtype).eps)
            scale = float(np.max(np.abs(w[np.isfinite(w)]), initial=0.0))
            with np.errstate(invalid="ignore"):
                ok |= np.abs(g - w) <= device.get("ulp", 0) * eps * np.abs(w) + device.get("rel", 0) * eps * scale
    bad = ~ok
    assert not bad.any(), f"{what}: got {g[bad][:6]} want {w[bad][:6]} at {np.argwhere(bad)[:4].tolist()}"


@pytest.mark.parametrize("name", sorted(NN_OPS))
def test_nn_op_against_reference(name):
    op_def = NN_OPS[name]
    cases = cases_for(op_def)
    got, fired = run_cases(op_def, cases)
    for c, g, errs in zip(cases, got, fired):
        what = f"{name}[{c['in_dtypes']} {c['attrs']}]"
        want, want_errs = reference_of(op_def, c)
        assert errs == want_errs, f"{what}: runtime errors {errs} vs the reference's {want_errs}"
        assert tuple(g.shape) == tuple(out_shape(op_def, c)), f"{what}: shape rule, kernel {g.shape}"
        if errs:
            continue
        assert_close(g, want, name, c["sig"].out_dtype, what)


def test_every_nn_op_is_declared_documented_and_sampled():
    docs = DOCS.read_text(encoding="utf-8")
    assert "## The bundled nn set" in docs
    assert len(NN_OPS) >= 22
    assert f"`oi2jax.check`: {len(NN_OPS)} ops for a" in docs  # the count the page gives (it said 22 of 25)
    for name, op_def in NN_OPS.items():
        assert op_def.category == "nn" and op_def.op_set == "nn" and not op_def.builtin, name
        assert op_def.reference is not None, f"{name}: no NumPy reference"
        assert op_def.samples is not None, f"{name}: no samples"
        first = op_def.doc.splitlines()[0] if op_def.doc else ""
        assert first.endswith((".", ")")) and len(first) > 15, f"{name}: docstring's first line {first!r}"
        assert f"| `{name}(" in docs, f"{name}: no row in docs/ops.md's table"
        assert op_def.shape is not None, f"{name}: no shape rule"
        cases = cases_for(op_def)
        assert {c["dtype"] for c in cases} == set(dtypes_for(op_def)) != set(), name
        for d in dtypes_for(op_def):
            assert 2 <= sum(c["dtype"] == d for c in cases) <= 5, (name, d)
        if set(FLOATS) & op_def.inputs[0].dtypes:
            assert set(FLOATS) <= op_def.inputs[0].dtypes, f"{name}: a float op takes f16, bf16, f32 and f64"


@pytest.mark.parametrize("name", sorted(n for n, d in NN_OPS.items() if len(d.inputs[0].dtypes) > 4))
def test_samples_type_check_for_every_accepted_dtype(name):
    """The any / index / numeric ops' samples hold for every dtype they accept (typing only, no run)."""
    op_def = NN_OPS[name]
    for d in sorted(op_def.inputs[0].dtypes):
        for inputs, attrs in op_def.samples(np.random.default_rng(0), d):
            assert dtype_name(inputs[0]) == d or D.get(d).packed or d in ("bitset", "t1", "t2"), (name, d)
            in_dtypes = [d] + [d if s.dtypes is None else dtype_name(x) for s, x in zip(op_def.inputs[1:], inputs[1:])]
            sig = ops.infer(name, in_dtypes, [np.shape(x) for x in inputs], dict(attrs), registry=NN)
            assert sig.out_shape is not None


# ------------------------------------------------------------------ traced attributes, precision

def test_kernels_accept_variable_attributes_without_x64():
    """eps, theta, valid, approximate as traced 0-d values of other dtypes, x64 off (32-bit containers)."""
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    w = np.ones(4, np.float32)

    def f(eps, theta, valid, approx, pos):
        def run(name, inputs, attrs, dtypes):
            return ops.apply(NN[name], inputs, attrs, in_dtypes=dtypes, out_dtype="f32", mode="normal", guards=[])
        return (run("rms_norm", [x, w], {"eps": eps}, ["f32", "f32"]),
                run("rope", [x, pos], {"theta": theta}, ["f32", "i32"]),
                run("softmax", [x], {"valid": valid}, ["f32"]),
                run("gelu", [x], {"approximate": approx}, ["f32"]))
    with jax.enable_x64(False):
        got = jax.jit(f)(jnp.bfloat16(1e-3), jnp.float16(10000.0), jnp.uint8(2), jnp.int32(1), jnp.int32(3))
    want = (NN["rms_norm"].reference([x, w], {"eps": jnp.bfloat16(1e-3)}, None),
            NN["rope"].reference([x, np.int32(3)], {"theta": 10000.0}, None),
            NN["softmax"].reference([x], {"valid": 2, "axis": -1}, None),
            NN["gelu"].reference([x], {"approximate": True}, None))
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w_, rtol=1e-5, atol=1e-6)
    assert np.asarray(got[2])[:, 2:].tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_softmax_masks_with_a_finite_value_not_minus_inf():
    """Past `valid`: masked with finfo(f32).min (-inf appears only as the max reduction's identity),
    results exactly 0."""
    x = np.array([[1.0, 2.0, -np.inf, 4.0]], np.float32)
    lowered = jax.jit(lambda v: ops.apply(NN["softmax"], [v], {"valid": 2}, in_dtypes=["f32"], out_dtype="f32",
                                          mode="normal")).lower(x).as_text()
    assert "constant dense<-3.40282347E+38>" in lowered  # jnp.finfo(f32).min
    assert lowered.count("0xFF800000") == lowered.count("applies stablehlo.maximum")  # -inf: only max's identity
    y = np.asarray(ops.apply(NN["softmax"], [x], {"valid": 2}, in_dtypes=["f32"], out_dtype="f32", mode="normal"))
    assert y[0, 2:].tolist() == [0.0, 0.0] and abs(y[0, :2].sum() - 1) < 1e-6


def test_matmul_family_follows_the_program_precision():
    a = np.ones((2, 4), np.float32)
    for name, inputs, attrs in (("linear", [a, a], {}), ("matmul_t", [a, a], {}),
                                ("einsum", [a, a], {"spec": "ij,kj->ik"})):
        texts = {}
        for p in ("highest", "default"):
            texts[p] = jax.jit(lambda x, y: ops.apply(NN[name], [x, y], attrs, in_dtypes=["f32", "f32"],
                                                      out_dtype="f32", mode="normal", precision=p)
                               ).lower(*inputs).as_text()
        assert "HIGHEST" in texts["highest"] and "HIGHEST" not in texts["default"], name
    # a program's precision reaches the kernel through its lowering (`Lowering.precision`)
    src = "dynamic { a: f32[2, 4]; b: f32[2, 4]; }\nvolatile { y: f32[2, 2]; }\nblock entry { op matmul_t(a, b) >> y; return; }"
    for p in ("highest", "default"):
        prog = oi2jax.compile(src, ops=["nn"], precision=p)
        assert prog.lowering.precision == p
        assert ("HIGHEST" in prog.emit("stablehlo")) == (p == "highest"), p


# ------------------------------------------------------------------ through the DSL

def compile_both(source, sizes=None):
    return (oi2jax.compile(source, sizes=sizes, ops=["nn"]),
            oi2jax.compile(source, sizes=sizes, ops=["nn"], mode="interpret"))


def check_errors(source, sizes=None) -> str:
    with pytest.raises(OiError) as info:
        oi2jax.compile(source, sizes=sizes, ops=["nn"])
    return info.value.render()


ATTENTION = """
dynamic { s: f32[T]; }
volatile { p: f32[T]; }
persistent { n: i32 @init(0); }
block entry {
    cache.increment n;
    op softmax(s, valid=n) >> p;
    return;
}
"""


def test_softmax_valid_from_a_persistent_scalar():
    """Attention over a fixed-capacity cache: step k reads only the first k scores."""
    s = np.array([0.5, -1.0, 2.0, 0.25, 3.0, 1.0], np.float32)
    compiled, interpreted = compile_both(ATTENTION, {"T": 6})
    for steps in (1, 3, 6):
        got = compiled.run({"s": s}, steps=steps)["p"]
        ref = interpreted.run({"s": s}, steps=steps)["p"]
        e = np.exp(s[:steps] - s[:steps].max())
        np.testing.assert_allclose(got, np.concatenate([e / e.sum(), np.zeros(6 - steps)]), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
        assert (got[steps:] == 0).all()
    with pytest.raises(OiError) as info:
        compiled.run({"s": s}, steps=7)
    assert "softmax: valid length 7 is not in 1..6 (in step 7)" in info.value.render()


EMBED = """dynamic { ids: i32[S]; }
constant { table: f32[V, D]; }
volatile { h: f32[S, D]; }
block entry {
    op embedding(table, ids) >> h;
    return;
}
"""


def test_embedding_lookup_and_its_runtime_error_at_the_node(tmp_path):
    from conftest import run_both
    from oi2jax.model import Tensor, save
    table = np.arange(24, dtype=np.float32).reshape(8, 3)
    save(tmp_path / "m.oinf", sizevars={"V": 8, "D": 3, "S": 4}, tensors={"table": Tensor("f32", table)})
    graph = tmp_path / "graph.oi"
    graph.write_text(EMBED)
    out = run_both(graph, {"ids": np.array([7, 0, 3, 3], np.int32)}, model=tmp_path / "m.oinf", ops=["nn"])
    np.testing.assert_array_equal(out["h"], table[[7, 0, 3, 3]])
    with pytest.raises(OiError) as info:
        run_both(graph, {"ids": np.array([1, 9, 2, -1], np.int32)}, model=tmp_path / "m.oinf", ops=["nn"])
    assert info.value.render().splitlines()[0] == \
        f"{graph}:5:5: error: embedding: id 9 is outside 0..7 (in step 1)"


def test_rope_at_position_zero_is_the_identity():
    from conftest import run_both
    source = """dynamic { q: f32[H, HD]; t: i32; }
volatile { r: f32[H, HD]; }
block entry {
    op rope(q, t) >> r;
    return;
}
"""
    q = np.random.default_rng(0).normal(size=(2, 8)).astype(np.float32)
    out = run_both(source, {"q": q, "t": np.int32(0)}, sizes={"H": 2, "HD": 8}, ops=["nn"])
    np.testing.assert_array_equal(out["r"], q)
    moved = run_both(source, {"q": q, "t": np.int32(3)}, sizes={"H": 2, "HD": 8}, ops=["nn"],
                     ways=("driver", "fused"))["r"]
    np.testing.assert_allclose(np.linalg.norm(moved[:, [0, 4]], axis=1), np.linalg.norm(q[:, [0, 4]], axis=1),
                               rtol=1e-6)  # a rotation of each (i, i + HD/2) pair


def test_rms_norm_of_bf16_input():
    import ml_dtypes
    source = """dynamic { x: bf16[B, D]; w: bf16[D]; }
volatile { y: bf16[B, D]; }
block entry {
    op rms_norm(x, w, eps=1e-5) >> y;
    return;
}
"""
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(3, 16)) * 4).astype(ml_dtypes.bfloat16)
    w = (1 + rng.normal(size=16) * 0.1).astype(ml_dtypes.bfloat16)
    compiled, interpreted = compile_both(source, {"B": 3, "D": 16})
    got = compiled.run({"x": x, "w": w})["y"]
    ref = interpreted.run({"x": x, "w": w})["y"]
    assert (got.astype(ml_dtypes.bfloat16).astype(got.dtype) == got).all()  # bf16 values (run() gives them as f32)
    xf = x.astype(np.float64)
    want = (xf / np.sqrt((xf * xf).mean(-1, keepdims=True) + 1e-5) * w.astype(np.float64))
    for y in (got, ref):
        np.testing.assert_allclose(y.astype(np.float64), want, rtol=2 ** -7)


def test_argmax_gives_i32():
    from conftest import run_both
    source = """dynamic { logits: f32[B, V]; }
volatile { tok: i32[B]; }
block entry {
    op argmax(logits) >> tok;
    return;
}
"""
    logits = np.array([[0.0, 3.0, 3.0, -1.0], [np.nan, 1.0, 2.0, 0.0]], np.float32)
    out = run_both(source, {"logits": logits}, sizes={"B": 2, "V": 4}, ops=["nn"])
    assert out["tok"].dtype == np.int32 and out["tok"].tolist() == [1, 0]
    assert "op argmax output dtype mismatch for tok: expected i64, got i32" in \
        check_errors(source.replace("tok: i32", "tok: i64"), {"B": 2, "V": 4})


def test_shape_errors_at_check_time_point_at_the_attribute():
    source = """dynamic { x: f32[2, 3]; }
volatile { y: f32[4, 2]; z: f32[3, 2]; p: f32[2, 3]; }
block entry {
    op reshape(x, shape=[4, 2]) >> y;
    op transpose(x, perm=[1, 1]) >> z;
    op softmax(x, valid=4) >> p;
    op einsum(x, x, spec="ij,jk->iz") >> z;
    op concat(x, y) >> z;
    return;
}
"""
    text = check_errors(source)
    assert """<string>:4:19: error: op reshape: cannot reshape [2, 3] (6 elements) to [4, 2]
        op reshape(x, shape=[4, 2]) >> y;
                      ^
<string>:5:21: error: op transpose: perm [1, 1] is not a permutation of 0..1 (x has rank 2)
        op transpose(x, perm=[1, 1]) >> z;
                        ^
<string>:6:19: error: op softmax: valid length 4 is not in 1..3
        op softmax(x, valid=4) >> p;
                      ^
<string>:7:21: error: op einsum: spec 'ij,jk->iz': output letter 'z' is in no operand
        op einsum(x, x, spec="ij,jk->iz") >> z;
                        ^
<string>:8:18: error: op concat: shapes [2, 3] and [4, 2] differ outside axis 0
        op concat(x, y) >> z;
                     ^""" in text


def test_an_nn_op_without_the_set_is_pointed_at_it():
    with pytest.raises(OiError) as info:
        oi2jax.compile("dynamic { x: f32[2]; }\nvolatile { y: f32[2]; }\nblock entry {\n  op silu(x) >> y;\n}\n")
    assert 'unsupported op silu; it is in the bundled op set nn (--ops nn, or ops=["nn"])' in info.value.render()
    # not also a guess at a close built-in (`gelu`: "did you mean relu?", `softmax`: "did you mean max?")
    for op in ("gelu", "softmax"):
        with pytest.raises(OiError) as info:
            oi2jax.compile(f"dynamic {{ x: f32[2]; }}\nvolatile {{ y: f32[2]; }}\nblock entry {{\n  op {op}(x) >> y;\n}}\n")
        assert f'unsupported op {op}; it is in the bundled op set nn (--ops nn, or ops=["nn"])\n' in info.value.render()


SLIDING = """
dynamic { s: f32[T]; w: i32; }
volatile { p: f32[T]; }
persistent { n: i32 @init(0); }
block entry {
    cache.increment n;
    op softmax(s, valid=n, window=w) >> p;
    return;
}
"""


def test_softmax_window_reads_the_last_w_of_the_valid_positions():
    """A sliding-window attention: step k (n = k valid positions) reads n-W..n-1 only."""
    s = np.array([0.5, -1.0, 2.0, 0.25, 3.0, 1.0], np.float32)
    compiled, interpreted = compile_both(SLIDING, {"T": 6})
    for steps, w in ((1, 2), (4, 2), (6, 3), (5, 9)):
        got = compiled.run({"s": s, "w": np.int32(w)}, steps=steps)["p"]
        ref = interpreted.run({"s": s, "w": np.int32(w)}, steps=steps)["p"]
        lo = max(0, steps - w)
        e = np.exp(s[lo:steps] - s[lo:steps].max())
        want = np.zeros(6)
        want[lo:steps] = e / e.sum()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(ref, want, rtol=1e-6, atol=1e-7)
        assert (got[:lo] == 0).all() and (got[steps:] == 0).all()
    with pytest.raises(OiError) as info:
        compiled.run({"s": s, "w": np.int32(0)}, steps=1)
    assert "softmax: window 0 is not positive (in step 1)" in info.value.render()
    assert "op softmax: window 0 is not positive" in check_errors(
        "dynamic { x: f32[3]; }\nvolatile { y: f32[3]; }\nblock entry {\n  op softmax(x, window=0) >> y;\n}\n")


def test_linear_with_a_bias_and_rope_with_frequencies():
    """The optional third inputs: linear's bias [out], rope's inv_freq [HD/2] (any rope type),
    compiled and interpreted against NumPy in f64 (the kernel rounds the product, then the sum)."""
    source = """dynamic { x: f32[D]; W: f32[O, D]; b: f32[O]; q: f32[H, HD]; f: f32[R]; t: i32; }
volatile { y: f32[O]; z: f32[O]; r: f32[H, HD]; }
block entry {
    op linear(x, W, b) >> y;
    op linear(x, W) >> z;
    op rope(q, t, f) >> r;
    return;
}
"""
    rng = np.random.default_rng(0)
    x, W, b = (rng.normal(size=s).astype(np.float32) for s in ((4,), (3, 4), (3,)))
    q = rng.normal(size=(2, 8)).astype(np.float32)
    f = np.array([1.0, 0.3, 0.01, 0.002], np.float32)  # e.g. a llama3-scaled set
    sizes = {"D": 4, "O": 3, "H": 2, "HD": 8, "R": 4}
    emb = np.concatenate([np.float32(7) * f] * 2).astype(np.float64)
    rot = np.concatenate([-q[:, 4:], q[:, :4]], axis=1)
    for prog in compile_both(source, sizes):
        out = prog.run({"x": x, "W": W, "b": b, "q": q, "f": f, "t": np.int32(7)})
        np.testing.assert_allclose(out["y"], x.astype(np.float64) @ W.T + b, rtol=1e-6)
        np.testing.assert_allclose(out["z"], x.astype(np.float64) @ W.T, rtol=1e-6)
        np.testing.assert_allclose(out["r"], q * np.cos(emb) + rot * np.sin(emb), rtol=1e-5, atol=1e-6)
    assert "op linear: bias has shape [4], expected [3] (the weight's out)" in check_errors(
        source.replace("b: f32[O]", "b: f32[D]"), sizes)
    assert "op rope: inv_freq has shape [3], expected [4]" in check_errors(source.replace("f: f32[R]", "f: f32[3]"),
                                                                           sizes)
    assert "op linear expects 2 to 3 (x, weight, bias) inputs, got 4" in check_errors(
        source.replace("op linear(x, W) >> z", "op linear(x, W, b, b) >> z"), sizes)


# ------------------------------------------------------------------ a helper's probe of the nn ops

def _one_op(decls: str, out: str, line: str):
    src = f"dynamic {{ {decls} }}\nvolatile {{ {out} }}\nblock entry {{\n    {line}\n    return;\n}}\n"
    return compile_both(src)


def test_attention_never_reads_unfilled_slots_even_nan():
    """p is 0 at an unread position, but 0 * NaN is NaN: compiled gave all-NaN rows for a table
    whose unfilled slots held NaN (docs/ops.md: what lies there is never read into the result)."""
    rng = np.random.default_rng(3)
    q = rng.normal(size=(1, 1, 4)).astype(np.float32)
    k = rng.normal(size=(16, 1, 4)).astype(np.float32)
    v = rng.normal(size=(16, 1, 4)).astype(np.float32)
    s = (k[:10, 0] @ q[0, 0]).astype(np.float64)
    e = np.exp(s - s.max())
    want = (e / e.sum()) @ v[:10, 0].astype(np.float64)
    for garbage in (np.nan, np.inf):
        k2, v2 = k.copy(), v.copy()
        k2[10:], v2[10:] = garbage, garbage
        for block in ("", ", block=4"):
            for prog in _one_op("q: f32[1,1,4]; k: f32[16,1,4]; v: f32[16,1,4];", "y: f32[1,1,4];",
                                f"op attention(q, k, v, valid=10{block}) >> y;"):
                got = prog.run({"q": q, "k": k2, "v": v2})["y"].reshape(-1)
                np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def test_attention_rows_never_read_another_rows_positions_even_nan():
    """S query rows, each with its own valid length: a row weights a position it does not read by
    exactly 0, but 0 * NaN is NaN, so compiled, a NaN or inf in v at a position only a later row
    reads reached the earlier rows (the interpreter, the reference, computes each row alone)."""
    rng = np.random.default_rng(4)
    q = rng.normal(size=(3, 1, 2, 4)).astype(np.float32)
    k = rng.normal(size=(16, 1, 4)).astype(np.float32)
    v = rng.normal(size=(16, 1, 4)).astype(np.float32)
    valid = np.array([3, 6, 9], np.int32)
    for bad in ({4: (np.nan, 1)}, {4: (np.inf, 0), 7: (-np.inf, 0), 11: (np.nan, 2)}, {2: (np.inf, 3)}):
        v2 = v.copy()
        for pos, (value, col) in bad.items():
            v2[pos, 0, col] = value
        want = np.zeros((3, 1, 2, 4))
        for i, n in enumerate(valid):
            s = np.einsum("gd,td->gt", q[i, 0].astype(np.float64), k[:n, 0].astype(np.float64))
            e = np.exp(s - s.max(axis=-1, keepdims=True))
            with np.errstate(invalid="ignore"):
                want[i, 0] = (e / e.sum(axis=-1, keepdims=True)) @ v2[:n, 0].astype(np.float64)
        for block in ("", ", block=4"):
            for prog in _one_op("q: f32[3,1,2,4]; k: f32[16,1,4]; v: f32[16,1,4]; n: i32[3];", "y: f32[3,1,2,4];",
                                f"op attention(q, k, v, valid=n{block}) >> y;"):
                got = prog.run({"q": q, "k": k, "v": v2, "n": valid})["y"]
                np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{bad} {block}")
                np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=f"{bad} {block}")
        # lowered for a GPU (one masked pass over the table, T=16 here being no CPU block either):
        # prefix counts along the table, no loop and no branch (each a host round trip there)
        attention = next(d for d in ops.load(["nn"]).added() if d.name == "attention")

        def f(q, k, v, n):
            return ops.apply(attention, [q, k, v], {"valid": n}, in_dtypes=("f32",) * 3, out_dtype="f32",
                             mode="normal", guards=[], platform="cuda")
        jaxpr = str(jax.make_jaxpr(f)(q, k, v2, valid))
        assert "while" not in jaxpr and "cond" not in jaxpr
        got = np.asarray(jax.jit(f)(q, k, v2, valid))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{bad} cuda")
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=f"{bad} cuda")


@pytest.mark.parametrize("dtype, start, n", [("u8", 0, 300), ("u64", 5, 3), ("u64", 2**63, 2),
                                             ("u64", 2**64 - 3, 3), ("u64", 2**64 - 3, 4), ("i8", -128, 129)])
def test_positions_are_exact_or_an_error_in_every_integer_dtype(dtype, start, n):
    """Compiled, a u8 start with S=300 wrapped and every u64 start failed in the kernel; interpreted,
    u64 starts past 2^63 went through float64."""
    np_dtype = D.get(dtype).np_dtype
    info = np.iinfo(np_dtype)
    for prog in _one_op(f"s: {dtype};", f"p: {dtype}[{n}];", f"op positions(s, shape=[{n}]) >> p;"):
        if start + n - 1 > info.max:
            with pytest.raises(OiError, match=rf"positions: start {start} \+ {n - 1} is past the largest "
                                              rf"{np.dtype(np_dtype).name} \(in step 1\)"):
                prog.run({"s": np.array(start, np_dtype)})
        else:
            got = prog.run({"s": np.array(start, np_dtype)})["p"]
            assert got.dtype == np_dtype and [int(x) for x in got] == [start + i for i in range(n)]


def test_integer_settings_are_checked_before_any_32_bit_cut():
    """softmax's window and attention's layer and valid were cast to i32 first: 2^32 + 1 ran as 1."""
    x = np.random.default_rng(2).normal(size=(2, 6)).astype(np.float32)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    for prog in _one_op("x: f32[2,6]; w: i64;", "y: f32[2,6];", "op softmax(x, window=w) >> y;"):
        got = prog.run({"x": x, "w": np.int64(2**32 + 1)})["y"]  # a window wider than the row: all of it
        np.testing.assert_allclose(got, e / e.sum(axis=-1, keepdims=True), rtol=2e-6)
    rng = np.random.default_rng(3)
    q = rng.normal(size=(2, 1, 4)).astype(np.float32)
    kv = rng.normal(size=(3, 16, 2, 4)).astype(np.float32)
    for li, n, message in ((2**32 + 1, 8, "attention: layer 4294967297 is not in 0..2"),
                           (1, 2**32 + 8, "attention: valid length 4294967304 is not in 1..16"),
                           (2**64 - 1, 8, "attention: layer 18446744073709551615 is not in 0..2")):
        dt = "u64" if li == 2**64 - 1 else "i64"
        for prog in _one_op(f"q: f32[2,1,4]; k: f32[3,16,2,4]; v: f32[3,16,2,4]; li: {dt}; n: i64;", "y: f32[2,1,4];",
                            "op attention(q, k, v, layer=li, valid=n) >> y;"):
            with pytest.raises(OiError) as info:
                prog.run({"q": q, "k": kv, "v": kv, "li": np.array(li, D.get(dt).np_dtype), "n": np.int64(n)})
            assert info.value.diagnostics[0].message == message + " (in step 1)"


def test_sample_seeds_and_positions_differing_above_bit_31_draw_independently():
    logits = np.random.default_rng(5).normal(size=(64, 50)).astype(np.float32)
    prog = oi2jax.compile("dynamic { l: f32[64,50]; sd: i64; pos: i64; }\nvolatile { y: i32[64]; }\n"
                          "block entry {\n    op sample(l, seed=sd, position=pos) >> y;\n    return;\n}\n", ops=["nn"])

    def draw(seed, pos):
        return prog.run({"l": logits, "sd": np.int64(seed), "pos": np.int64(pos)})["y"]
    # 64 draws over 50 tokens: two independent streams agree on all 64 with probability ~1e-100
    assert not np.array_equal(draw(0, 0), draw(2**32, 0))
    assert not np.array_equal(draw(0, 3), draw(0, 2**32 + 3))
    assert not np.array_equal(draw(1, 0), draw(1 - 2**32, 0))
    assert np.array_equal(draw(7, 9), draw(7, 9))


@pytest.mark.parametrize("graph, message", [
    ("dynamic { x: f32[B, D]; nv: i32[D]; }\nvolatile { y: f32[B, D]; }\nblock entry {\n"
     "    op softmax(x, valid=nv) >> y;\n    return;\n}\n",
     "4:19: error: op softmax: valid has shape [8], which does not broadcast to the rows [3] (x's shape without "
     "the axis)"),
    ("dynamic { q: f32[3, 2, 1, 4]; k: f32[6, 2, 4]; n: i32[2]; }\nvolatile { o: f32[3, 2, 1, 4]; }\n"
     "block entry {\n    op attention(q, k, k, valid=n) >> o;\n    return;\n}\n",
     "4:27: error: op attention: valid has shape [2], which does not broadcast to the rows [3] (one per query row "
     "of q [S, KVH, G, HD])"),
])
def test_check_refuses_a_per_row_setting_of_the_wrong_shape(tmp_path, capsys, graph, message):
    """Emit probe 6: `check` passed a per-row `valid=` variable of the wrong shape (exit 0) that
    compile then refused; the shape rule of a per-row setting is the checker's too now."""
    g = tmp_path / "v.oi"
    g.write_text(graph)
    sizes = ["--size", "B=3", "--size", "D=8"] if "[B, D]" in graph else []
    code, _, err = run_cli(capsys, "check", g, "--no-model", "--ops", "nn", *sizes)
    assert code == 1 and err.splitlines()[0] == f"{g}:{message}", err
    ok = graph.replace("nv: i32[D]", "nv: i32[B]").replace("n: i32[2]", "n: i32[3]")
    g.write_text(ok)
    code, _, err = run_cli(capsys, "check", g, "--no-model", "--ops", "nn", *sizes)
    assert code == 0, err


def test_softmax_nan_or_inf_read_makes_the_whole_row_nan_in_both_modes():
    """A NaN or +inf among the read positions (or only -inf read) makes the whole row NaN, the
    masked positions included, compiled and interpreted alike (as torch: NaN - max is NaN
    everywhere). The interpreter's reference left the masked positions at 0 while the compiled
    kernel (0 / NaN) made them NaN. A NaN or inf only in masked positions has no effect."""
    source = ("dynamic { x: f32[4]; n: i32; }\nvolatile { y: f32[4]; }\n"
              "block entry {\n    op softmax(x, valid=n) >> y;\n    return;\n}\n")
    compiled, interpreted = compile_both(source)
    for x, n, nan in (([1.0, np.nan, 3.0, 4.0], 2, True), ([1.0, np.inf, 3.0, 4.0], 2, True),
                      ([-np.inf, -np.inf, 3.0, 4.0], 2, True), ([1.0, 2.0, np.nan, np.inf], 2, False)):
        inputs = {"x": np.array(x, np.float32), "n": np.int32(n)}
        got = np.asarray(compiled.run(inputs, steps=1)["y"])
        ref = np.asarray(interpreted.run(inputs, steps=1)["y"])
        if nan:
            assert np.isnan(got).all() and np.isnan(ref).all(), (x, got, ref)
        else:
            assert got[2:].tolist() == ref[2:].tolist() == [0.0, 0.0]
            np.testing.assert_array_equal(got, ref)


def test_a_static_int_setting_may_name_a_size():
    """`top_k(x, k=K)`: a shape-fixing int setting takes a size name, as an int list does; a
    variable there, an unknown size, or a k past the row is a located check error."""
    src = ("dynamic { x: f32[E]; }\nvolatile { i: i32[K]; v: f32[K]; }\n"
           "block entry { op top_k(x, k=K) >> i; op take_along(x, i) >> v; return; }\n")
    x = np.array([1, 5, 3, 5, -1, np.nan], np.float32)
    for mode in ("compiled", "interpret"):
        out = oi2jax.compile(src, sizes={"E": 6, "K": 3}, ops=["nn"], mode=mode).run({"x": x})
        assert out["i"].tolist() == [5, 1, 3] and out["v"][1:].tolist() == [5.0, 5.0] and np.isnan(out["v"][0])
    assert oi2jax.check(oi2jax.parse(src), ops=["nn"]) == []  # without sizes: K stays a name
    for bad, message in ((src.replace("k=K", "k=Q"), "3:27: error: op top_k setting k: unknown size Q"),
                         (src.replace("k=K", "k=x"), "op top_k setting k must be a literal (it fixes the "
                                                     "output's shape), not the variable x"),
                         (src.replace("k=K", "k=7"), "op top_k: k must be 1..6 (the last axis' length), got 7")):
        with pytest.raises(oi2jax.OiError, match=re.escape(message)):
            oi2jax.compile(bad, sizes={"E": 6, "K": 3}, ops=["nn"])


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_top_k_orders_subnormals_by_value_in_both_modes(dtype):
    """A subnormal is above 0 and below the smallest normal, compiled (XLA:CPU reads it as zero in
    a float compare: `x == 0` tied it with 0, top_k gave [0, 1, 2] below) as interpreted; -0.0 and
    +0.0 still tie, NaN still first."""
    tiny = {"f32": 1e-40, "bf16": 9.183549615799121e-41, "f64": 1e-310}[dtype]
    npd = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f64": np.float64}[dtype]
    src = (f"dynamic {{ x: {dtype}[7]; }}\nvolatile {{ i: i32[7]; j: i32[3]; }}\n"
           "block entry { op top_k(x, k=7) >> i; op top_k(x, k=3) >> j; return; }\n")
    x = np.array([3e38, 2.0, 0.0, -0.0, tiny, -tiny, 2 * tiny], np.float64)
    if dtype == "bf16":
        x[0] = 1e38
    x = x.astype(npd)
    y = x.copy()
    y[1] = np.nan
    for mode in ("compiled", "interpret"):
        prog = oi2jax.compile(src, ops=["nn"], mode=mode)
        out = prog.run({"x": x}, steps=1)
        assert out["i"].tolist() == [0, 1, 6, 4, 2, 3, 5], mode
        assert out["j"].tolist() == [0, 1, 6], mode
        assert prog.run({"x": y}, steps=1)["i"].tolist() == [1, 0, 6, 4, 2, 3, 5], mode


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_argmax_of_subnormals_is_the_largest_in_both_modes(dtype):
    """argmax([0, tiny, 2 tiny, -tiny]) is 2 compiled (XLA:CPU's float compare read the subnormals
    as 0: it gave 0) as interpreted, and top_k(x, k=1)'s first entry."""
    tiny = {"f32": 1e-40, "bf16": 9.183549615799121e-41, "f64": 1e-310}[dtype]
    npd = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f64": np.float64}[dtype]
    src = (f"dynamic {{ x: {dtype}[2, 4]; }}\nvolatile {{ a: i32[2]; t: i32[2, 1]; c: i32[4]; }}\n"
           "block entry { op argmax(x) >> a; op top_k(x, k=1) >> t; op argmax(x, axis=0) >> c; return; }\n")
    x = np.array([[0.0, tiny, 2 * tiny, -tiny], [-0.0, -tiny, 0.0, -2 * tiny]]).astype(npd)
    for mode in ("compiled", "interpret"):
        out = oi2jax.compile(src, ops=["nn"], mode=mode).run({"x": x}, steps=1)
        assert out["a"].tolist() == [2, 0] and out["t"][:, 0].tolist() == [2, 0], mode
        assert out["c"].tolist() == [0, 0, 0, 0], mode


def test_take_along_ids_of_the_wrong_shape_is_a_located_check_error():
    """The expected shape reads as a shape ([3, K]), not a Python list (['K'] before)."""
    src = ("dynamic { x: f32[3, 5]; ids: i32[2, 2]; }\nvolatile { t: f32[2, 2]; }\n"
           "block entry { op take_along(x, ids) >> t; return; }\n")
    for bad, message in ((src, "3:32: error: op take_along: ids must have x's shape but for the last axis "
                               "([3, K]), got [2, 2]"),
                         (src.replace("f32[3, 5]", "f32[5]"),
                          "op take_along: ids must have x's shape but for the last axis ([K]), got [2, 2]")):
        with pytest.raises(oi2jax.OiError, match=re.escape(message)):
            oi2jax.compile(bad, ops=["nn"])


def test_a_loop_index_in_a_setting_is_named_as_one():
    """`top_k(x, k=l)` inside `loop (l in ...)`: l is a loop index, neither a size ("unknown size
    l" before) nor a variable ("unknown attribute variable l" for a run-time setting before)."""
    src = ("dynamic { x: f32[E]; }\nvolatile { i: i32[K]; p: f32[E]; }\n"
           "block entry { loop ls (l in 0..K) { op top_k(x, k=l) >> i; } return; }\n")
    for bad, message in ((src, "3:49: error: op top_k setting k must be a literal or a size name (it fixes the "
                               "output's shape), not the loop index l"),
                         (src.replace("top_k(x, k=l) >> i", "softmax(x, valid=l) >> p"),
                          "3:51: error: op softmax setting valid: loop index l is not a variable")):
        with pytest.raises(oi2jax.OiError, match=re.escape(message)):
            oi2jax.compile(bad, sizes={"E": 6, "K": 3}, ops=["nn"])


def test_a_size_named_only_by_a_setting_may_be_given_or_is_unknown(tmp_path, capsys):
    """`top_k(x, k=K)` with K in no declaration: `--size K=2` / sizes={"K": 2} is taken (it was
    refused: "unknown size K: the graph and model sizes are (none)"), and without it the check
    leaves K a name while running says K is an unknown size (it said "k must be a literal integer
    ... not a variable", from the check as well)."""
    src = "dynamic { x: f32[8]; }\nvolatile { top: i32[2]; }\nblock entry { op top_k(x, k=K) >> top; return; }\n"
    x = np.array([0, 5, 1, 7, 2, 7, 3, 4], np.float32)
    for mode in ("compiled", "interpret"):
        assert oi2jax.compile(src, sizes={"K": 2}, ops=["nn"], mode=mode).run({"x": x})["top"].tolist() == [3, 5]
    assert oi2jax.check(oi2jax.parse(src), ops=["nn"]) == []
    for mode in ("compiled", "interpret"):
        with pytest.raises(oi2jax.OiError, match=re.escape("3:27: error: op top_k setting k: unknown size K")):
            oi2jax.compile(src, ops=["nn"], mode=mode)
    (tmp_path / "g.oi").write_text(src)
    np.save(tmp_path / "x.npy", x)
    code, out, err = run_cli(capsys, "run", tmp_path / "g.oi", "--ops", "nn", "--size", "K=2",
                             "--input", f"x={tmp_path / 'x.npy'}", "--show", "top")
    assert code == 0 and "[3 5]" in out, err
    code, out, err = run_cli(capsys, "check", tmp_path / "g.oi", "--ops", "nn", "--size", "J=2")
    assert code == 1 and "error: unknown size J: the graph and model sizes are K" in err
