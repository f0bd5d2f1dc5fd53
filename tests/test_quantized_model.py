"""Weights kept in GGML blocks stay packed on the device (issue #42 items 1-3): through a graph,
the nn ops `linear` and `embedding` over each kept type equal gguf.quants.dequantize followed by
NumPy (linear up to the matmul's summation order), any other op sees the dequantized values; a
compiled Llama's logits are its dequantized f32 twin's within conftest's KEPT_QUANTIZED_REL; the
placed constants hold the packed bytes, never a dequantized copy."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

import oi2jax
from oi2jax import quantized as Q
from oi2jax.model import ggml, open_model
from oi2jax.model.convert import convert_hf
from oi2jax.model.gguf import convert_gguf
from oi2jax.model.writer import save

from conftest import EXAMPLES, assert_kept_close, run_cli
from test_gguf import SMALL, WIDE, _twin, ex
from test_quantized import random_blocks

EPS32 = float(np.finfo(np.float32).eps)
O, I, S = 8, 256, 12  # S rows: more than quantized.kernels.FUSED_MAX_ROWS (the prompt path)
# a K-quant block's 12 bytes of 6-bit scales are held unpacked, as 16 (quantized/blocks.py)
PREPARED_EXTRA = {"Q4_K": 4, "Q5_K": 4}


def _graph(kinds) -> str:
    consts = "".join(f"    W{k}: f32[O, I];\n" for k in kinds)
    outs = "".join(f"    y1{k}: f32[O];\n    ys{k}: f32[S, O];\n    e{k}: f32[S, I];\n    d{k}: f32[O, I];\n"
                   for k in kinds)
    body = "".join(f"    op linear(x1, W{k}) >> y1{k};\n    op linear(xs, W{k}) >> ys{k};\n"
                   f"    op embedding(W{k}, ids) >> e{k};\n    op add(W{k}, W{k}) >> d{k};\n" for k in kinds)
    return (f"dynamic {{\n    x1: f32[I];\n    xs: f32[S, I];\n    ids: i32[S];\n}}\n"
            f"constant {{\n{consts}}}\nvolatile {{\n{outs}}}\nblock entry {{\n{body}}}\n")


@pytest.fixture(scope="module")
def ops_run(tmp_path_factory):
    """Every kept type's ops in one compiled program: (outputs, inputs, kind -> (raw, values), program)."""
    rng = np.random.default_rng(7)
    kinds = [k.replace("_", "") for k in Q.KINDS]
    weights, tensors, meta = {}, {}, {}
    for kind, name in zip(Q.KINDS, kinds):
        raw = random_blocks(rng, kind, O, I // Q.block_size(kind)[0])
        weights[name] = raw, quants.dequantize(raw, T[kind])
        tensors[f"W{name}"] = raw
        meta[f"ggml_type.W{name}"] = kind
    path = tmp_path_factory.mktemp("ops") / "kept.oinf"
    save(path, sizevars={"O": O, "I": I, "S": S}, metadata=meta, tensors=tensors)
    inputs = {"x1": rng.standard_normal(I).astype(np.float32), "xs": rng.standard_normal((S, I)).astype(np.float32),
              "ids": rng.integers(0, O, S).astype(np.int32)}
    program = oi2jax.compile(_graph(kinds), model=path, ops=["nn"])
    return program.run(inputs), inputs, weights, program


def _within_dot_bound(got, x, w):
    """got == x @ w.T up to the forward error bound of an f32 dot of length n (n eps sum |w x|)."""
    want = x.astype(np.float64) @ w.astype(np.float64).T
    bound = w.shape[1] * EPS32 * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T)
    assert got.dtype == np.float32 and np.all(np.abs(got - want) <= bound + 1e-30)


@pytest.mark.parametrize("kind", Q.KINDS)
def test_linear_and_embedding_through_a_graph_are_gguf_then_numpy(ops_run, kind):
    out, inputs, weights, _ = ops_run
    name = kind.replace("_", "")
    _, w = weights[name]
    _within_dot_bound(out[f"y1{name}"], inputs["x1"][None], w)  # one row: the fused matrix-vector product
    _within_dot_bound(out[f"ys{name}"], inputs["xs"], w)  # S rows: dequantized once, one matmul
    np.testing.assert_array_equal(out[f"e{name}"], w[inputs["ids"]])  # rows, bit for bit
    np.testing.assert_array_equal(out[f"d{name}"], w + w)  # another op: the values, dequantized at the use


def test_the_placed_constants_are_the_packed_blocks(ops_run):
    *_, weights, program = ops_run
    consts = program.executable.consts
    for name, (raw, _) in weights.items():
        q = consts[f"W{name}"]
        assert isinstance(q, Q.QuantTensor) and all(isinstance(a, jax.Array) for a in q.fields.values())
        blocks = raw.shape[0] * raw.shape[1] // Q.block_size(q.kind)[1]
        assert q.nbytes == raw.nbytes + PREPARED_EXTRA.get(q.kind, 0) * blocks, name
    assert sum(a.nbytes for a in jax.tree.leaves(consts)) == sum(
        raw.nbytes + PREPARED_EXTRA.get(consts[f"W{n}"].kind, 0) * raw.size // Q.block_size(consts[f"W{n}"].kind)[1]
        for n, (raw, _) in weights.items())


# ---------------------------------------------------------------- a Llama, kept vs its f32 twin

MODELS = {"Q8_0": (SMALL, True), "Q4_1": (SMALL, False), "Q4_K": (WIDE, True), "Q6_K": (WIDE, False)}
TOKENS = [3, 1, 4]


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("twins")
    out = {}
    for kind, (sizes, tied) in MODELS.items():
        _, gguf_path, written = _twin(tmp, kind, sizes, tied=tied)
        convert_gguf(gguf_path, tmp / f"{kind}.oinf")
        convert_gguf(gguf_path, tmp / f"{kind}-f32.oinf", dtype="f32")
        out[kind] = tmp / f"{kind}.oinf", tmp / f"{kind}-f32.oinf", written, sizes
    return out


F32_LOGITS: dict = {}  # kind -> the f32 twin's logits (compiled once)


def _logits(program, vocab):
    sess = program.session()
    got = []
    for tok in TOKENS:
        sess.step(token=np.int32(tok % vocab))
        got.append(np.asarray(sess.read("logits")))
    return np.stack(got)


@pytest.mark.parametrize("kind", list(MODELS))
def test_a_kept_llama_decodes_as_its_f32_twin_holding_only_packed_bytes(twins, kind):
    path, f32_path, written, sizes = twins[kind]
    kept = oi2jax.compile(EXAMPLES / "llama_decode.oi", model=path, ops=["nn"])
    f32 = oi2jax.compile(EXAMPLES / "llama_decode.oi", model=f32_path, ops=["nn"])
    F32_LOGITS[kind] = _logits(f32, sizes["vocab"])
    assert_kept_close(_logits(kept, sizes["vocab"]), F32_LOGITS[kind], kind)
    # memory: the packed blocks (each GGUF tensor once: a tied lm_head is the embedding's), then
    # only what the GGUF holds in f32 (norms) and the converter's computed tensors and scalars
    consts = kept.executable.consts
    packed = {id(v): v for v in consts.values() if isinstance(v, Q.QuantTensor)}
    per_block = Q.block_size(kind)[1] + PREPARED_EXTRA.get(kind, 0)
    quantized_raw = [a for a in written.values() if a.dtype == np.uint8]
    assert sum(q.nbytes for q in packed.values()) == sum(a.size // Q.block_size(kind)[1] * per_block
                                                         for a in quantized_raw)
    floats = sum(a.nbytes for v in consts.values() if not isinstance(v, Q.QuantTensor) for a in jax.tree.leaves(v))
    f32_in_gguf = sum(a.nbytes for a in written.values() if a.dtype == np.float32)
    assert floats <= f32_in_gguf + 4 * (sizes["hidden"] // sizes["heads"]) // 2 + 64  # + rope.inv_freq, scalars
    if MODELS[kind][1]:
        assert consts["embed"] is consts["lm_head"]  # a tied embedding: one packed copy


def test_stacked_families_read_their_members_packed(twins):
    """unroll none: the layers' weights stacked ([L, ...] blocks), each layer's read by a traced index."""
    path, f32_path, _, sizes = twins["Q4_1"]
    kept = oi2jax.compile(EXAMPLES / "llama_decode.oi", model=path, ops=["nn"], unroll="none")
    assert isinstance(kept.executable.consts["Wq"], Q.QuantTensor)
    assert kept.executable.consts["Wq"].shape[0] == sizes["layers"]
    if "Q4_1" not in F32_LOGITS:  # run on its own
        F32_LOGITS["Q4_1"] = _logits(oi2jax.compile(EXAMPLES / "llama_decode.oi", model=f32_path, ops=["nn"]),
                                     sizes["vocab"])
    assert_kept_close(_logits(kept, sizes["vocab"]), F32_LOGITS["Q4_1"], "stacked")


def test_a_mesh_refuses_kept_blocks_by_name(ops_run):
    from jax.sharding import Mesh
    *_, program = ops_run
    with pytest.raises(oi2jax.OiError, match="constant WQ80: its model tensor is kept as Q8_0 blocks, which a "
                                             "mesh cannot shard yet; convert the model with --dtype f32"):
        oi2jax.compile(program.graph.source, model=program.model_path, ops=["nn"],
                       mesh=Mesh(np.array(jax.devices()[:1]), ("model",)), shard={"O": "model"})



# ---------------------------------------------------------------- convert-hf --quantize

@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_k_quantizers_are_read_back_by_gguf_within_a_step(kind):
    """gguf-py has no K-quant quantizer: oi2jax's (model/ggml.quantize) writes blocks gguf.quants
    dequantizes to within one quantization step of each group (Q4_K: (max - min) / 15 of 32
    values, with the 6-bit scales' rounding; Q6_K: max |x| / 31 of 16)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 512)).astype(np.float32) * np.float32(0.05)
    x[1, :256] = 0  # an all-zero block
    got = quants.dequantize(ggml.quantize(kind, x), T[kind])
    group = 32 if kind == "Q4_K" else 16
    xs, err = x.reshape(-1, group), np.abs(got - x).reshape(-1, group).max(axis=-1)
    step = (xs.max(-1) - np.minimum(xs.min(-1), 0)) / 15 if kind == "Q4_K" else np.abs(xs).max(-1) / 31
    assert np.all(err <= 1.05 * step + 1e-7) and np.all(got[1, :256] == 0)


def test_convert_hf_quantize_stores_the_matrices_as_blocks(tmp_path, capsys):
    directory = ex.write_random_llama(tmp_path / "ck", vocab=64, tied=True)
    convert_hf(directory, tmp_path / "q8.oinf", quantize="q8_0")
    m = open_model(tmp_path / "q8.oinf")
    f32 = open_model(convert_hf(directory, tmp_path / "f32.oinf").path)
    assert m.metadata["alias.lm_head.weight"].value == "model.embed_tokens.weight"
    for name, info in f32.tensors.items():
        if len(info.shape) == 2:  # every matrix, the embedding too: gguf.quants' Q8_0 blocks of its values
            assert m.ggml_type(name) == "Q8_0" and m.tensors[name].value_shape == info.shape
            assert m.load_packed(name).tobytes() == quants.quantize(f32.load(name), T.Q8_0).tobytes(), name
        else:  # norms and rope.inv_freq: as they were
            assert m.ggml_type(name) is None and m.load(name).tobytes() == f32.load(name).tobytes(), name
    # rows of 32 values are no Q4_K block (256): each matrix stays f32, said by name
    code, _, err = run_cli(capsys, "convert-hf", directory, "-o", tmp_path / "q4k.oinf", "--quantize", "q4_k", "--quiet")
    assert code == 0, err
    assert ("note: tensor model.layers.0.mlp.down_proj.weight is kept as f32: its rows of 64 values are not whole "
            "Q4_K blocks of 256") in err
    assert not any(t.ggml for t in open_model(tmp_path / "q4k.oinf").tensors.values())


# ---------------------------------------------------------------- OpenInfer v2 QuantParams

QP_GRAPH = """dynamic {
    x: f32[I];
}
constant {
    Wf: f32[O, I] @ref("w");
    Wi: u8[O, I] @ref("w");
    Sf: f32[O, I] @ref("s");
}
volatile {
    y: f32[O];
    z: f32[O];
    raw: u8[O, I];
}
block entry {
    op linear(x, Wf) >> y;
    op linear(x, Sf) >> z;
    op add(Wi, Wi) >> raw;
}
"""


@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_quant_params_are_honoured_by_a_float_constant_only(tmp_path, mode):
    """An i8/u8 tensor with v2 QuantParams bound to an f32 constant reads scale[c] * (q - zp[c])
    (per-channel asymmetric u8, per-tensor symmetric i8); bound to its stored dtype, the stored
    values (OpenInfer's meaning, unchanged)."""
    from oi2jax.model.quant import QuantParams
    from oi2jax.model.writer import Tensor
    rng = np.random.default_rng(5)
    q = rng.integers(0, 256, (3, 8), dtype=np.uint8)
    s = rng.integers(-128, 128, (3, 8), dtype=np.int8)
    scales, zps = np.array([0.5, 0.25, 0.125], np.float32), np.array([128, 100, 3], np.int32)
    save(tmp_path / "m.oinf", sizevars={"O": 3, "I": 8}, tensors={
        "w": Tensor("u8", q, quant=QuantParams("asymmetric", "per_channel", scales, "per_channel", zps)),
        "s": Tensor("i8", s, quant=QuantParams("symmetric", "per_tensor", np.array([0.0625], np.float32)))})
    x = rng.standard_normal(8).astype(np.float32)
    out = oi2jax.compile(QP_GRAPH, model=tmp_path / "m.oinf", ops=["nn"], mode=mode).run({"x": x})
    _within_dot_bound(out["y"][None], x[None], scales[:, None] * (q.astype(np.float32) - zps[:, None]))
    _within_dot_bound(out["z"][None], x[None], np.float32(0.0625) * s.astype(np.float32))
    np.testing.assert_array_equal(out["raw"], q + q)  # u8 arithmetic on the stored values
    with pytest.raises(oi2jax.OiError, match="model dtype mismatch for Wf: model u8, graph bf16"):
        oi2jax.compile(QP_GRAPH.replace("Wf: f32", "Wf: bf16").replace("y: f32", "y: bf16")
                       .replace("x: f32", "x: bf16"), model=tmp_path / "m.oinf", ops=["nn"])



@pytest.mark.parametrize("mode", ["compiled", "interpret"])
def test_a_quantized_scalar_reads_as_an_f32_scalar(tmp_path, mode):
    """A 0-d u8 tensor with per-tensor QuantParams bound to an f32 scalar: its affine value
    0.125 * (200 - 3), a scalar. dequantize gave shape [1] (np.ascontiguousarray makes a 0-d array
    1-d), so every op on it failed at run time with 'z is [], the result is [1]' (upstream probe)."""
    from oi2jax.model.quant import QuantParams, dequantize
    from oi2jax.model.writer import Tensor
    q = QuantParams("asymmetric", "per_tensor", [0.125], "per_tensor", [3])
    assert dequantize(q, np.array(200, np.uint8)).shape == ()
    save(tmp_path / "m.oinf", tensors={"s": Tensor("u8", np.array(200, np.uint8), quant=q)})
    out = oi2jax.compile("constant { s: f32; }\nvolatile { z: f32; }\nblock entry { op add(s, 1.0) >> z; return; }",
                         model=tmp_path / "m.oinf", mode=mode).run({})
    assert out["z"].shape == () and float(out["z"]) == 0.125 * 197 + 1.0


AFFINE_GRAPH = """dynamic {
    x: f32[I];
    xs: f32[3, I];
    ids: i32[2];
}
constant {
    Wf: f32[O, I] @ref("w");
    Cf: f32[O, I] @ref("c");
    Sf: f32[O, I] @ref("s");
    Zf: f32[O, I] @ref("far");
    W(l): f32[O, I] @pattern("m.{l}");
}
volatile {
    y: f32[O];
    y3: f32[3, O];
    e: f32[2, I];
    z: f32[O, I];
    f: f32[O];
    far: f32[O, I];
}
block entry {
    op linear(x, Wf) >> y;
    op linear(xs, Cf) >> y3;
    op embedding(Wf, ids) >> e;
    op add(Sf, Sf) >> z;
    op add(Zf, Zf) >> far;
    loop layers (l in 0..L) {
        op linear(x, W[l]) >> f;
    }
}
"""


def test_quant_params_stay_packed_in_a_compiled_program(tmp_path):
    """A compiled program keeps i8/u8 integers with v2 QuantParams packed (an AFFINE tensor: the
    integers, the scales, the zero points; a stacked family its members') and dequantizes them in
    the step, with the values the interpreter reads at load: rows of a table and an op without a
    quantized input bit for bit, products within the f32 dot bound. Zero points too far for f32 to
    hold q - zp exactly are read as f32 at load instead, and so is every such constant of a program
    on a mesh (which shards values, not packed tensors)."""
    from jax.sharding import Mesh

    from oi2jax.model.quant import QuantParams, dequantize
    from oi2jax.model.writer import Tensor
    rng = np.random.default_rng(11)
    o, i = 6, 16

    def u8():
        return rng.integers(0, 256, (o, i), dtype=np.uint8)

    def i8():
        return rng.integers(-128, 128, (o, i), dtype=np.int8)
    qp = {"w": QuantParams("asymmetric", "per_channel", rng.uniform(0.01, 1, o), "per_channel",
                           rng.integers(-300, 300, o), scale_axis=0, zp_axis=0),
          "c": QuantParams("asymmetric", "per_channel", rng.uniform(0.01, 1, i), "per_channel",
                           rng.integers(-9, 9, i), scale_axis=1, zp_axis=1),
          "s": QuantParams("symmetric", "per_tensor", np.array([0.0625], np.float32)),
          "far": QuantParams("asymmetric", "per_tensor", np.array([2.0 ** -20], np.float32), "per_tensor",
                             np.array([1 << 25], np.int32)),
          "m.0": QuantParams("symmetric", "per_tensor", np.array([0.5], np.float32)),
          "m.1": QuantParams("symmetric", "per_channel", rng.uniform(0.01, 1, o))}
    stored = {"w": u8(), "c": i8(), "s": i8(), "far": u8(), "m.0": i8(), "m.1": i8()}
    save(tmp_path / "m.oinf", sizevars={"O": o, "I": i, "L": 2},
         tensors={k: Tensor(str(v.dtype).replace("int", "i").replace("ui", "u"), v, quant=qp[k])
                  for k, v in stored.items()})
    real = {k: dequantize(qp[k], v) for k, v in stored.items()}
    inputs = {"x": rng.standard_normal(i).astype(np.float32), "xs": rng.standard_normal((3, i)).astype(np.float32),
              "ids": np.array([4, 1], np.int32)}
    prog = oi2jax.compile(AFFINE_GRAPH, model=tmp_path / "m.oinf", ops=["nn"], unroll="none")
    consts = prog.executable.consts
    for name, dtype in [("Wf", np.uint8), ("Cf", np.int8), ("Sf", np.int8), ("W", np.int8)]:
        assert isinstance(consts[name], Q.QuantTensor) and consts[name].kind == Q.AFFINE, name
        assert consts[name].fields["q"].dtype == dtype
    assert consts["W"].fields["scale"].shape == (2, o, 1)  # the family's members' scales, stacked
    # the device holds the integers and one scale and zero point per channel: no f32 copy
    assert consts["Wf"].nbytes == o * i + 2 * 4 * o and consts["Cf"].nbytes == o * i + 2 * 4 * i
    assert not isinstance(consts["Zf"], Q.QuantTensor) and consts["Zf"].dtype == np.float32
    meshed = oi2jax.compile(AFFINE_GRAPH, model=tmp_path / "m.oinf", ops=["nn"], unroll="none",
                            mesh=Mesh(np.array(jax.devices()[:1]), ("data",)), shard={"O": "data"})
    assert not any(isinstance(v, Q.QuantTensor) for v in meshed.executable.consts.values())
    interpreted = oi2jax.compile(AFFINE_GRAPH, model=tmp_path / "m.oinf", ops=["nn"], mode="interpret")
    for out in (prog.run(inputs), meshed.run(inputs), interpreted.run(inputs)):
        np.testing.assert_array_equal(out["e"], real["w"][[4, 1]])
        np.testing.assert_array_equal(out["z"], real["s"] + real["s"])
        np.testing.assert_array_equal(out["far"], real["far"] + real["far"])
        _within_dot_bound(out["y"][None], inputs["x"][None], real["w"])
        _within_dot_bound(out["y3"], inputs["xs"], real["c"])
        _within_dot_bound(out["f"][None], inputs["x"][None], real["m.1"])


MIXED_GRAPH = """dynamic {
    x: f32[I];
}
constant {
    W(l): f32[O, I] @pattern("w.{l}");
}
volatile {
    y: f32[O];
}
block entry {
    loop layers (l in 0..L) {
        op linear(x, W[l]) >> y;
    }
}
"""


def test_a_family_of_mixed_types_runs_member_by_member_and_refuses_to_stack(tmp_path):
    """A Q4_K_M file mixes types across layers: read member by member (an unrolled loop), each
    member keeps its own blocks; stacked (a traced index), the family must hold one type."""
    rng = np.random.default_rng(9)
    raws = {"Q8_0": random_blocks(rng, "Q8_0", O, I // 32), "Q4_0": random_blocks(rng, "Q4_0", O, I // 32)}
    save(tmp_path / "mixed.oinf", sizevars={"O": O, "I": I, "L": 2},
         metadata={"ggml_type.w.0": "Q8_0", "ggml_type.w.1": "Q4_0"}, tensors={"w.0": raws["Q8_0"], "w.1": raws["Q4_0"]})
    x = rng.standard_normal(I).astype(np.float32)
    out = oi2jax.compile(MIXED_GRAPH, model=tmp_path / "mixed.oinf", ops=["nn"], unroll="full").run({"x": x})
    _within_dot_bound(out["y"][None], x[None], quants.dequantize(raws["Q4_0"], T.Q4_0))  # the last layer's
    with pytest.raises(oi2jax.OiError, match=r"prefix table W: its members are stored as Q4_0, Q8_0, and a stacked "
                                             r"family holds one type; unroll the loop that reads it \(--unroll full"):
        oi2jax.compile(MIXED_GRAPH, model=tmp_path / "mixed.oinf", ops=["nn"], unroll="none")


def test_a_prompt_steps_temporaries_do_not_grow_with_the_layers(tmp_path):
    """A prompt step (S > FUSED_MAX_ROWS rows) dequantizes each kept weight for its matmul. XLA's
    CPU default schedule may keep every layer's dequantized weights live at once (a 512-token step
    of a 135M Q4_1 model: 496 MB of temporaries); oi2jax compiles with the memory-optimized schedule
    (runtime/placement.py `CPU_COMPILER_OPTIONS`), so XLA's own memory analysis of the executable a
    session runs is the same at 2 and at 6 layers (one layer's at a time). Compiled for the CPU, which
    every JAX has, so it runs on a GPU machine too."""
    temp = {}
    for layers in (2, 6):
        sizes = dict(vocab=64, hidden=64, layers=layers, heads=4, kv_heads=2, intermediate=128, max_positions=32)
        _, gguf_path, _ = _twin(tmp_path, "Q8_0", sizes)
        convert_gguf(gguf_path, tmp_path / f"m{layers}.oinf")
        prog = oi2jax.compile(EXAMPLES / "llama_prefill.oi", model=tmp_path / f"m{layers}.oinf", ops=["nn"],
                              sizes={"S": 16}, device="cpu")  # the schedule option is XLA CPU's: on the CPU anywhere
        assert prog.compile_options == {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}
        lowered = prog.lower(tokens=np.zeros(16, np.int32), n=np.int32(16))
        temp[layers] = lowered.compile(prog.compile_options).memory_analysis().temp_size_in_bytes
    assert temp[6] <= temp[2] * 1.1, temp


def test_a_jaxlib_without_the_schedule_option_compiles_without_it(monkeypatch):
    """`jax>=0.4.30` is allowed, and an older XLA rejects an unknown option by name (every compile
    with it would fail): oi2jax probes it once per process and leaves it out where it is refused."""
    from oi2jax.runtime import placement
    assert placement.jit_options("gpu") == {}
    monkeypatch.setattr(placement, "CPU_COMPILER_OPTIONS", {"xla_cpu_scheduler_type": "NO_SUCH_SCHEDULE"})
    placement._cpu_options_known.cache_clear()
    try:
        assert placement.jit_options("cpu") == {}
    finally:
        monkeypatch.undo()
        placement._cpu_options_known.cache_clear()
    assert placement.jit_options("cpu") == {"compiler_options": dict(placement.CPU_COMPILER_OPTIONS)}
