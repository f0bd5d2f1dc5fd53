"""Current upstream OpenInfer (SPEC-2026-03, issue 16): `.oinf` version 2 with quantization metadata,
`acc=[A, O]`, Rust literal forms, graph JSON without a model."""
from __future__ import annotations

import json
import random
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oi2jax.diagnostics import OiError
from oi2jax.model import ModelError, Tensor, open_model, save
from oi2jax.model.inspect import render_model
from oi2jax.model.quant import QuantParams

from conftest import EXAMPLES, MODELS, SHARED, open_everything, rewrite_model as rewrite, run_cli

UPSTREAM = SHARED / "upstream-2026-03"
UP_FILES = sorted(UPSTREAM.glob("*.oinf"))
GOOD = [p for p in UP_FILES if p.name != "encoder_bug_quant_then_data.oinf"]
CARRIED = ["cache_window_slice", "kv_cache_decode", "linear_attention", "mlp_regression", "moe_routing",
           "residual_mlp_stack", "stability_guard", "streaming_pipeline"]




# ---------------------------------------------------------------- .oinf v2: every upstream file

def test_upstream_directory_complete():
    assert len(UP_FILES) == 11 and len(GOOD) == 10


@pytest.mark.parametrize("path", GOOD, ids=[p.name for p in GOOD])
def test_v2_file_inspect_and_byte_exact_round_trip(path, tmp_path, capsys):
    m = open_model(path)
    assert m.version == 2
    text = render_model(m)
    assert text.startswith(f"{path}: .oinf v2, {path.stat().st_size} bytes")
    for name in m.tensors:
        assert name in text
    code, out, err = run_cli(capsys, "inspect", path)
    assert code == 0 and out.strip() == text.strip() and err == ""
    out_path = tmp_path / "copy.oinf"
    save(out_path, **rewrite(m))
    assert out_path.read_bytes() == path.read_bytes()


@pytest.mark.parametrize("name", CARRIED)
def test_carried_over_models_hold_the_v1_contents(name):
    """The eight carried-over models are the v1 models in a v2 container (same sizevars, bytes)."""
    v1, v2 = open_model(MODELS / f"{name}.oinf"), open_model(UPSTREAM / f"{name}.oinf")
    assert (v1.version, v2.version) == (1, 2)
    assert v1.sizevars == v2.sizevars and v1.metadata == v2.metadata and set(v1.tensors) == set(v2.tensors)
    for t in v1.tensors:
        assert v1.load_packed(t).tobytes() == v2.load_packed(t).tobytes()
        assert v2.tensors[t].quant is None


def test_corrupt_upstream_encoder_output_rejected(capsys):
    bad = UPSTREAM / "encoder_bug_quant_then_data.oinf"
    with pytest.raises(ModelError) as exc:
        open_model(bad)
    assert exc.value.reason == "tensor quant reserved must be 0 for a"
    code, out, err = run_cli(capsys, "inspect", bad)
    assert code == 1 and err == f"error: {bad}: tensor quant reserved must be 0 for a\n"


SPEC_QUANT = UPSTREAM / "spec_example_v2_quant.oinf"


def test_spec_worked_example_v2_written_byte_for_byte(tmp_path, capsys):
    q = QuantParams("asymmetric", "per_tensor", [0.125], zp_mode="per_tensor", zero_points=[3])
    out = tmp_path / "ex.oinf"
    save(out, sizevars={"N": 4}, tensors={"b": np.array([1.0, -2.0], np.float32),
                                          "q": Tensor("i8", np.array([-2, -1, 0, 3], np.int8), quant=q)})
    assert out.read_bytes() == SPEC_QUANT.read_bytes()
    assert len(out.read_bytes()) == 280
    m = open_model(SPEC_QUANT)
    info = m.tensors["q"]
    assert (info.quant_offset, info.quant_nbytes, info.offset) == (224, 56, 216)
    assert m.quant("q") == q and m.quant("b") is None
    assert q.scheme == "asymmetric" and q.scale_mode == "per_tensor" and q.zp_mode == "per_tensor"
    assert q.scales.dtype == np.float32 and q.scales.tolist() == [0.125] and q.zero_points.tolist() == [3]
    assert m.load("q").tolist() == [-2, -1, 0, 3]  # stored values: quantization is never applied
    code, text, _ = run_cli(capsys, "inspect", SPEC_QUANT)
    assert code == 0
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip().startswith("q "))
    assert lines[i + 1].strip() == "- quant: scheme=asymmetric, scale=per_tensor(0.125), zero_point=per_tensor(3)"


def test_per_channel_quant_round_trip(tmp_path):
    q = QuantParams("asymmetric", "per_channel", [0.1, 0.2, 0.3], zp_mode="per_channel", zero_points=[0, 1, -1],
                    scale_axis=1, zp_axis=1)
    out = tmp_path / "pc.oinf"
    save(out, tensors={"w": Tensor("i8", np.arange(6, dtype=np.int8).reshape(2, 3), quant=q)})
    m = open_model(out)
    assert m.quant("w") == q and m.tensors["w"].quant_nbytes == 72
    assert "- quant: scheme=asymmetric, scale=per_channel(axis=1, count=3), zero_point=per_channel(axis=1, count=3)" \
        in render_model(m)
    save(tmp_path / "again.oinf", **rewrite(m))
    assert (tmp_path / "again.oinf").read_bytes() == out.read_bytes()
    # a quantized tensor without data (HAS_QUANT only) and a quantized scalar
    sym = QuantParams("symmetric", "per_tensor", [2.0])
    save(tmp_path / "nd.oinf", tensors={"d": Tensor("i8", None, shape=(4,), quant=sym),
                                        "s": Tensor("i32", np.array(5, np.int32), quant=sym)})
    m = open_model(tmp_path / "nd.oinf")
    assert not m.tensors["d"].has_data and m.quant("d") == sym and m.quant("s") == sym
    assert "zero_point=none" in render_model(m)


def test_v1_written_on_request_and_refused_with_quant(tmp_path):
    save(tmp_path / "v1.oinf", tensors={"b": np.ones(2, np.float32)}, version=1)
    assert open_model(tmp_path / "v1.oinf").version == 1
    q = QuantParams("symmetric", "per_tensor", [0.5])
    with pytest.raises(ModelError, match="quantization metadata needs OINF version 2"):
        save(tmp_path / "x.oinf", tensors={"a": Tensor("i8", np.zeros(4, np.int8), quant=q)}, version=1)
    with pytest.raises(ModelError, match="cannot write OINF version 3"):
        save(tmp_path / "x.oinf", tensors={}, version=3)
    assert not (tmp_path / "x.oinf").exists()


@pytest.mark.parametrize("kwargs, message", [
    (dict(scheme="sym", scale_mode="per_tensor", scales=[1.0]), "quant scheme must be symmetric or asymmetric"),
    (dict(scheme="symmetric", scale_mode="per_row", scales=[1.0]), "scale mode must be per-tensor or per-channel"),
    (dict(scheme="symmetric", scale_mode="per_tensor", scales=[]), "per-tensor scale requires a value"),
    (dict(scheme="symmetric", scale_mode="per_channel", scales=[]), "per-channel scale requires axis and values"),
    (dict(scheme="symmetric", scale_mode="per_tensor", scales=[1.0], zp_mode="per_tensor", zero_points=[1]),
     "symmetric quantization does not support zero_point"),
    (dict(scheme="asymmetric", scale_mode="per_channel", scales=[1.0], zp_mode="per_tensor", zero_points=[1]),
     "per-tensor zero_point requires per-tensor scale"),
    (dict(scheme="asymmetric", scale_mode="per_tensor", scales=[1.0], zp_mode="per_channel", zero_points=[1]),
     "per-channel zero_point requires per-channel scale"),
    (dict(scheme="asymmetric", scale_mode="per_channel", scales=[1.0], zp_mode="per_channel", zero_points=[1],
          scale_axis=0, zp_axis=1), "zero_point axis must match scale axis"),
    (dict(scheme="asymmetric", scale_mode="per_tensor", scales=[1.0], zp_mode="other"),
     "zero_point mode must be per-tensor or per-channel"),
])
def test_quant_params_construction_uses_the_encoder_texts(kwargs, message):
    with pytest.raises(OiError, match=message):
        QuantParams(**kwargs)


def test_quant_shape_rules_in_the_writer(tmp_path):
    pc = QuantParams("symmetric", "per_channel", [1.0, 2.0], scale_axis=1)
    with pytest.raises(ModelError, match=r"Tensor 'w' per-channel scale length mismatch: expected 3, got 2"):
        save(tmp_path / "a.oinf", tensors={"w": Tensor("i8", np.zeros((2, 3), np.int8), quant=pc)})
    with pytest.raises(ModelError, match=r"Tensor 'v' per-channel scale axis out of range"):
        save(tmp_path / "a.oinf", tensors={"v": Tensor("i8", np.zeros(2, np.int8), quant=pc)})
    with pytest.raises(ModelError, match=r"Tensor 'v' quant must be QuantParams"):
        save(tmp_path / "a.oinf", tensors={"v": Tensor("i8", np.zeros(2, np.int8), quant="sym")})


# ---------------------------------------------------------------- v2 validation rules (Rust loader texts)

EX2 = SPEC_QUANT.read_bytes()
Q_ENTRY = 0x94  # tensor entry of q: flags at +0x10, quant_nbytes at +0x2c, quant_offset at +0x34
QP = 224  # quant payload


def _set(data: bytes, offset: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


@pytest.mark.parametrize("data, message", [
    (_set(EX2, Q_ENTRY + 0x10, "<I", 7), "tensor flags contain unsupported bits for q"),
    (_set(EX2, 0x60 + 8, "<I", 1), None),  # b: flags HAS_DATA only (unchanged): fine
    (_set(EX2, 0x84, "<Q", 8), "tensor without quant must have zero quant offset/size for b"),
    (_set(EX2, Q_ENTRY + 0x34, "<Q", 228), "tensor quant offset not aligned for q"),
    (_set(EX2, Q_ENTRY + 0x34, "<Q", 200), "tensor quant offset precedes data section for q"),
    (_set(EX2, Q_ENTRY + 0x2c, "<Q", 40), "tensor quant payload too small for q"),
    (_set(EX2, Q_ENTRY + 0x2c, "<Q", 64), "tensor quant payload out of bounds for q"),
    (_set(EX2, QP + 12, "<I", 1), "tensor quant reserved must be 0 for q"),
    (_set(EX2, QP + 24, "<Q", 2), "tensor quant payload size mismatch for q"),
    (_set(EX2, QP + 0, "<I", 3), "invalid quant scheme for q"),
    (_set(EX2, QP + 4, "<I", 0), "invalid quant scale mode for q"),
    (_set(EX2, QP + 16, "<Q", 1), "per-tensor scale requires axis=0,count=1 for q"),
    (_set(EX2, QP + 4, "<I", 2), "per-channel scale count mismatch for q"),
    (_set(_set(EX2, QP + 4, "<I", 2), QP + 16, "<Q", 1), "per-channel scale axis out of range for q"),
    (_set(EX2, QP + 8, "<I", 5), "invalid quant zero-point mode for q"),
    (_set(_set(_set(EX2, QP + 8, "<I", 0), QP + 40, "<Q", 1), QP + 24, "<Q", 1),
     "zero-point none mode requires count=0 for q"),
    (_set(EX2, QP + 32, "<Q", 1), "per-tensor zero-point requires axis=0,count=1 for q"),
    (_set(EX2, QP + 8, "<I", 2), "per-channel zero-point requires per-channel scale for q"),
    (_set(EX2, QP + 0, "<I", 1), "symmetric quantization cannot include zero-point for q"),
    (_set(EX2, 5, "<I", 3), "unsupported OINF version 3"),
])
def test_v2_quant_rules(tmp_path, data, message):
    p = tmp_path / "bad.oinf"
    p.write_bytes(data)
    if message is None:
        assert open_model(p).quant("q") is not None
        return
    with pytest.raises(ModelError) as exc:
        open_model(p)
    assert exc.value.reason.startswith(message), exc.value.reason


def _per_channel_file(tmp_path):
    q = QuantParams("asymmetric", "per_channel", [0.1, 0.2, 0.3], zp_mode="per_channel", zero_points=[0, 1, -1],
                    scale_axis=1, zp_axis=1)
    p = tmp_path / "pc.oinf"
    save(p, sizevars={"N": 3}, tensors={"a": np.ones(3, np.float32),
                                        "w": Tensor("i8", np.arange(6, dtype=np.int8).reshape(2, 3), quant=q)})
    return p.read_bytes()


def test_fuzz_v2_headers_and_quant_payloads(tmp_path):
    """Truncations and bit flips anywhere (header, tables, quant payloads) never crash, hang or
    over-allocate: either a clean ModelError or a file that loads completely."""
    target = tmp_path / "fuzz.oinf"
    for data in (EX2, _per_channel_file(tmp_path), (UPSTREAM / "mlp_regression.oinf").read_bytes()):
        rng = random.Random(len(data))
        for cut in sorted(set([0, 68, 72, len(data) - 1] + [rng.randrange(len(data)) for _ in range(20)])):
            target.write_bytes(data[:cut])
            assert open_everything(target) is False
        table_end = struct.unpack_from("<Q", data, 53)[0]
        opened = 0
        for i in range(250):
            b = bytearray(data)
            pos = rng.randrange(table_end) if i % 3 == 0 else rng.randrange(len(data))
            b[pos] ^= 1 << rng.randrange(8)
            if i % 4 == 0:  # a random byte in the quant payload region (the last 80 bytes)
                b[rng.randrange(max(len(data) - 80, 0), len(data))] = rng.randrange(256)
            target.write_bytes(bytes(b))
            opened += open_everything(target)
        assert opened > 0


@st.composite
def quant_params(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
    scheme = draw(st.sampled_from(["symmetric", "asymmetric"]))
    per_channel = bool(shape) and draw(st.booleans())
    f32 = st.floats(width=32, allow_nan=False)
    i32 = st.integers(-(2 ** 31), 2 ** 31 - 1)
    if per_channel:
        axis = draw(st.integers(0, len(shape) - 1))
        scales = draw(st.lists(f32, min_size=shape[axis], max_size=shape[axis]))
        zp_mode = "none" if scheme == "symmetric" else draw(st.sampled_from(["none", "per_channel"]))
        zps = draw(st.lists(i32, min_size=shape[axis], max_size=shape[axis])) if zp_mode != "none" else []
        q = QuantParams(scheme, "per_channel", scales, zp_mode, zps, scale_axis=axis, zp_axis=axis if zps else 0)
    else:
        zp_mode = "none" if scheme == "symmetric" else draw(st.sampled_from(["none", "per_tensor"]))
        q = QuantParams(scheme, "per_tensor", [draw(f32)], zp_mode, [draw(i32)] if zp_mode != "none" else [])
    return shape, q


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(quant_params(), min_size=1, max_size=4), st.data())
def test_property_quant_round_trip(tmp_path, items, data):
    tensors = {}
    for i, (shape, q) in enumerate(items):
        dtype = data.draw(st.sampled_from(["i8", "u8", "i32", "f32", "i4"]))
        values = np.zeros(shape, np.int8 if dtype in ("i8", "i4") else np.dtype({"u8": "uint8", "i32": "int32",
                                                                                   "f32": "float32"}.get(dtype, "int8")))
        with_data = data.draw(st.booleans())
        tensors[f"t{i}"] = Tensor(dtype, values if with_data else None, None if with_data else shape, quant=q)
    out = tmp_path / "q.oinf"
    save(out, tensors=tensors)
    m = open_model(out)
    for name, t in tensors.items():
        got = m.quant(name)
        assert got == t.quant
        assert got.scales.tobytes() == t.quant.scales.tobytes()  # bit-exact f32 (−0.0, subnormals)
    save(tmp_path / "q2.oinf", **rewrite(m))
    assert (tmp_path / "q2.oinf").read_bytes() == out.read_bytes()


# ---------------------------------------------------------------- the models' graphs on the v2 files

def _relu(a):
    return np.maximum(a, np.float32(0))


def _normal(seed, shape, scale=1.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def _expected(name, w):
    """(inputs, NumPy outputs) of one SPEC §9 program on the model's weights `w(tensor)`."""
    if name == "mlp_regression":
        x = _normal(1, (4, 16))
        h = _relu(x @ w("w1") + w("b1"))
        return {"x": x}, {"h": h, "y": h @ w("w2") + w("b2")}
    if name == "linear_attention":
        x = _normal(2, (4, 32))
        acc = np.zeros((4, 32), np.float32)
        for head in range(2):
            h = x @ w(f"attn.wq.{head}") + x @ w(f"attn.wk.{head}")
            acc = acc + h @ w(f"attn.wv.{head}")
        return {"x": x}, {"out": acc @ w("w_out")}
    if name == "residual_mlp_stack":
        x = _normal(3, (4, 32))
        y = x + w("bias0")
        for layer in range(3):
            y = y + _relu(y @ w(f"res.mlp.w.{layer}") + w(f"res.mlp.b.{layer}"))
        return {"x": x}, {"y": y}
    if name == "moe_routing":
        x = _normal(4, (4, 16))
        return {"x": x, "route": np.array(False)}, {"gate": x @ w("w_gate"), "y": x @ w("w1") + w("b1")}
    if name == "stability_guard":
        x = _normal(5, (4, 16))
        return {"x": x}, {"y": x + w("bias"), "cond": np.array(True)}
    if name == "streaming_pipeline":
        x = _normal(7, (4, 16), 4.0)
        return {"x": x}, {"x": x + w("bias"), "h": np.minimum(_relu(x @ w("w")), 6), "h2": np.minimum(_relu(x), 6)}
    if name == "kv_cache_decode":
        q = _normal(10, (16,))
        k_hist = np.zeros((4, 16), np.float32)
        k_hist[:3] = q + w("zero")
        return {"q": q}, {"k_hist": k_hist, "t": np.array(3, np.int32)}
    if name == "cache_window_slice":
        x = _normal(11, (8,))
        window = np.zeros((3, 8), np.float32)
        window[0] = x  # step 3 reads A[2..5]: only row 2 was written
        return {"x": x}, {"window": window, "write_idx": np.array(3, np.int32),
                          "start": np.array(3, np.int32), "end": np.array(6, np.int32)}
    raise AssertionError(name)


@pytest.mark.parametrize("name", CARRIED)
def test_example_graphs_run_on_the_v2_models(name):
    import oi2jax
    model = open_model(UPSTREAM / f"{name}.oinf")
    inputs, expected = _expected(name, lambda t: np.asarray(model.load(t)))
    steps = 3 if name in ("kv_cache_decode", "cache_window_slice") else 1
    out = oi2jax.compile(str(EXAMPLES / f"{name}.oi"), model=str(UPSTREAM / f"{name}.oinf")).run(inputs, steps=steps)
    for key, value in expected.items():
        assert out[key].dtype == np.asarray(value).dtype, key
        np.testing.assert_allclose(out[key], value, rtol=1e-5, atol=1e-5, err_msg=key)


ACCUMULATION_DEMO = """\
// accumulation_demo (upstream examples/accumulation_demo.rs): acc=[f32, f32] on matmul and sum_axis
dynamic {
    x: f32[B, D];
}

constant {
    w: f32[D, H];
}

volatile {
    h: f32[B, H];
    y: f32[B, 1];
}

block entry {
    op matmul(x, w, acc=[f32, f32]) >> h;
    op sum_axis(h, axes=[1], keepdims=true, acc=[f32, f32]) >> y;
    return;
}
"""


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_accumulation_demo(tmp_path, mode):
    import oi2jax
    m = open_model(UPSTREAM / "accumulation_demo.oinf")
    assert m.sizevars == {"B": 4, "D": 8, "H": 6}
    x, w = np.asarray(m.load("x")), np.asarray(m.load("w"))
    out = oi2jax.compile(ACCUMULATION_DEMO, model=str(UPSTREAM / "accumulation_demo.oinf"), mode=mode).run({"x": x})
    np.testing.assert_allclose(out["h"], x @ w, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["h"], m.load("matmul_out"), rtol=1e-4, atol=1e-4)  # the model's expectations
    np.testing.assert_allclose(out["y"], m.load("sum_axis_out"), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["y"], (x @ w).sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- graph JSON, check and fmt without a model

def test_graph_json_check_and_fmt_without_a_model(tmp_path, capsys):
    g = tmp_path / "g.oi"
    g.write_text((EXAMPLES / "mlp_regression.oi").read_text())  # no model beside it
    code, out, err = run_cli(capsys, "compile", g, "--emit", "graph-json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert doc["vars"]["x"]["dims"] == ["B", "D"]  # sizes stay names
    code, _, err = run_cli(capsys, "compile", g, "--emit", "graph-json", "-o", tmp_path / "g.json")
    assert code == 0 and json.loads((tmp_path / "g.json").read_text()) == doc
    assert run_cli(capsys, "check", g)[0] == 0
    assert run_cli(capsys, "fmt", "--check", g)[0] == 0
    # the JSON graph reads back, and runs once a model gives the sizes
    code, _, err = run_cli(capsys, "check", tmp_path / "g.json", "--model", EXAMPLES / "mlp_regression.oinf")
    assert code == 0, err
    # a graph error is still reported without a model
    g.write_text("dynamic { x: f32[B]; }\nblock entry { op relu(x) >> y; return; }\n")
    code, _, err = run_cli(capsys, "compile", g, "--emit", "graph-json")
    assert code == 1 and "error:" in err and "y" in err


# ---------------------------------------------------------------- one @init rule (issue 15, first bug)

F8_INIT = """\
dynamic { x: f32[2]; }
volatile { y: f32[2]; }
persistent {
    p: f8 @init(9.0);
    q: f8 @init(-7.9375);
    r: bf16 @init(1.00390625);
}
block entry {
    yield x;
    await x;
    cache.reset q;
    cache.reset r;
    return;
}
block side {
    await x;
    op add(x, x) >> y;
    yield x;
}
"""


@pytest.mark.parametrize("mode, yield_mode", [("interpret", "driver"), ("compiled", "driver"),
                                              ("compiled", "fused")])
def test_init_literals_use_the_spec_encoders_every_way(mode, yield_mode):
    """`@init` -> value through one function (host_numerics.init_scalar): f8 by the SPEC §5.4 encoder
    (9.0 -> 10.0, -7.9375 -> -4.0; np.full's nearest-even gave 8.0 and -8.0 compiled), bf16 by
    round-to-nearest-even from f32; the same after an in-kernel `cache.reset`."""
    import oi2jax
    from oi2jax.host_numerics import f8_encode, init_scalar
    from oi2jax.ir import Literal
    assert float(init_scalar("f8", Literal("float", 9.0))) == float(f8_encode(np.float32(9.0))) == 10.0
    assert float(init_scalar("f8", Literal("float", -7.9375))) == -4.0
    prog = oi2jax.compile(F8_INIT, mode=mode, yield_mode=yield_mode)
    out = prog.run({"x": np.ones(2, np.float32)}, steps=2)
    assert float(out["p"]) == 10.0 and float(out["q"]) == -4.0 and float(out["r"]) == 1.0
    init = prog.session().values() if hasattr(prog, "session") else None
    if init is not None and "p" in init:
        assert float(init["p"]) == 10.0


@pytest.mark.parametrize("mode, yield_mode", [("interpret", "driver"), ("compiled", "driver"),
                                              ("compiled", "fused")])
def test_two_consumers_writing_one_cache_is_a_check_error(capsys, mode, yield_mode):
    """Issue 15, second bug: the checker's "what a node writes" (phases.node_writes, the one
    definition) now includes cache writes, so every way of running refuses the program before it
    runs, with both writers' locations (compiled used to keep the last consumer's P silently)."""
    import oi2jax
    from conftest import REPO
    path = REPO / "tests" / "regressions" / "two_consumers_write_one_cache.oi"
    with pytest.raises(OiError) as exc:
        oi2jax.compile(str(path), mode=mode, yield_mode=yield_mode)
    text = exc.value.render()
    assert f"{path}:17:5: error: multiple blocks mutated P: block c2 and block c1 write it in the same " \
           f"yield..await window" in text
    assert f"{path}:12:5: note: P also written here (block c1)" in text
    code, _, err = run_cli(capsys, "check", path)
    assert code == 1 and "multiple blocks mutated P" in err


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_one_size_limit_for_both_executors(mode):
    """Issue 15: the interpreter refused > 2**31 elements, the compiled program > 1 TiB; both now use
    oi2jax/limits.py (1 TiB, or this machine's memory) with the same located message."""
    import oi2jax
    from oi2jax.limits import memory_limit
    text = "dynamic { x: f32[S]; }\nvolatile { y: f32[S]; }\nblock entry { op relu(x) >> y; return; }\n"
    big = memory_limit() // 4 + 1  # f32: one element more than the limit allows
    with pytest.raises(OiError) as exc:
        oi2jax.compile(text, sizes={"S": big}, mode=mode)
    assert f"<string>:1:11: error: x would need {4 * big} bytes (shape [{big}]): too large to allocate" \
        in exc.value.render()
    small = (1 << 31) + 1  # over the interpreter's old element limit, under the byte limit: not refused up front
    if 4 * small * 2 < memory_limit():
        from oi2jax.limits import check_sizes
        from oi2jax.model.bind import bind
        check_sizes(bind(oi2jax.parse(text), sizes={"S": small}))


def test_one_prefix_member_matcher(tmp_path, capsys):
    """Issue 15: the checker matched `w.{l}` members with \\d+ (so `w.01` counted) while binding took
    only canonical indices; both now use model.bind.pattern_regex, so check and run agree."""
    m = tmp_path / "m.oinf"
    save(m, tensors={"w.01": np.ones(2, np.float32)})
    g = tmp_path / "g.oi"
    g.write_text('constant { W(l): f32[2] @pattern("w.{l}"); }\nvolatile { y: f32[2]; }\n'
                 'block entry { op relu(W[0]) >> y; return; }\n')
    code, _, err = run_cli(capsys, "check", g, "--model", m)
    assert code == 1 and 'constant W not found in model: no tensor matches @pattern("w.{l}")' in err, err
    save(m, tensors={"w.0": np.ones(2, np.float32), "w.01": np.ones(2, np.float32)})
    assert run_cli(capsys, "check", g, "--model", m)[0] == 0


def test_a_scale_past_float32_is_refused_not_kept_as_inf():
    """Models probe: `QuantParams(scales=[1e40])` narrowed the scale to f32 inf without a word (the
    format stores f32 scales); a scale in range narrows as the format says."""
    with pytest.raises(OiError, match=r"invalid quantization parameters: scale 1e\+40 is past float32's range"):
        QuantParams(scheme="symmetric", scale_mode="per_tensor", scales=[1e40], zp_mode="none", zero_points=[])
    q = QuantParams(scheme="symmetric", scale_mode="per_tensor", scales=[0.1], zp_mode="none", zero_points=[])
    assert q.scales.dtype == np.float32 and q.scales[0] == np.float32(0.1)
