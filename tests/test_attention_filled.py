"""nn op attention in the family decode graphs (issue #42 item 3): attention over the filled
positions of the per-layer K/V cache only, block by block with an online softmax.

- equal to the full-table form it replaced (the einsum / softmax(valid=n, window=W) / einsum
  over all T slots, rebuilt here from the shipped graph) and to the NumPy reference of the
  Hugging Face modeling code at every step of a teacher-forced run: logits within 1e-4 of the
  largest |logit| (test_families' bound), greedy tokens equal; with blocks of 4 positions so the
  run crosses block boundaries, with and without a sliding window that cuts blocks;
- gemma2 (soft-capping, windows) and gpt2 (q [H, HD]) in blocks of 6 of a T=20 cache, whose last
  block is read at T - 6, against their references;
- a bf16 K/V cache: half the bytes, the reference's result with K and V rounded to bf16;
- the cost claim from XLA's cost analysis of the compiled step (not a timing): the same bytes and
  FLOPs at capacities T=256 and T=4096 (the loop over filled blocks is the only attention work;
  nothing in the step has a size that grows with T), where the full-table form's grow with T; the
  same for a prompt step of S=16 rows (llama_prefill.oi: attention with one length per row)."""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import oi2jax
from oi2jax.model.convert import convert_hf

import gemma_gpt2_checkpoints
from conftest import EXAMPLES
from hf_ref import FamilyRef, write_family
from test_convert_gemma_gpt2 import config_of, reference

TOL = 1e-4
STEPS = 11  # blocks of 4: positions 0-3, 4-7, 8-10
SIZES = dict(vocab=48, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=40, max_positions=16)
ATTENTION = re.compile(r"op attention\((\w+), kc, vc, layer=li, valid=n(, window=\w+)?, scale=attn_scale\) >> (\w+);")


def full_table_form(text: str) -> str:
    """The graph as it read before the attention op: the layer's whole table, masked by softmax."""
    text = text.replace("    assign kc: f32[L, T, KVH, HD];\n    assign vc: f32[L, T, KVH, HD];\n",
                        "    assign kc: f32[T, KVH, HD];\n    assign vc: f32[T, KVH, HD];\n"
                        "    assign scores: f32[KVH, G, T];\n    assign probs: f32[KVH, G, T];\n")
    text = text.replace("cache.read Kc[..] >> kc;", "cache.read Kc[l] >> kc;")
    text = text.replace("cache.read Vc[..] >> vc;", "cache.read Vc[l] >> vc;")
    m = ATTENTION.search(text)
    assert m is not None
    q, window, out = m.groups()
    old = (f'op einsum({q}, kc, spec="kgd,tkd->kgt") >> scores;\n'
           f"        op mul(scores, attn_scale) >> scores;\n"
           f"        op softmax(scores, axis=-1, valid=n{window or ''}) >> probs;\n"
           f'        op einsum(probs, vc, spec="kgt,tkd->kgd") >> {out};')
    return text[:m.start()] + old + text[m.end():]


def with_block(text: str, block: int) -> str:
    text, n = ATTENTION.subn(lambda m: m.group(0).replace("scale=attn_scale)", f"scale=attn_scale, block={block})"),
                             text)
    assert n == 1
    return text


def _rel(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


@pytest.fixture(scope="module", params=[("llama", None), ("mistral", 3), ("mistral", 6)],
                ids=["llama", "mistral-window-3", "mistral-window-6"])
def family(request, tmp_path_factory):
    model_type, window = request.param
    tmp = tmp_path_factory.mktemp(f"{model_type}{window}")
    kw = {} if window is None else {"sliding_window": window}
    ck, weights, config = write_family(tmp / "ck", model_type, seed=3, **SIZES, **kw)
    summary = convert_hf(ck, tmp / "m.oinf")
    text = (EXAMPLES / summary.graph).read_text()
    progs = {}
    for name, graph in (("blocks", with_block(text, 4)), ("full", full_table_form(text))):
        (tmp / f"{name}.oi").write_text(graph)
        progs[name] = oi2jax.compile(tmp / f"{name}.oi", model=tmp / "m.oinf", ops=["nn"])
    return progs, weights, config


def test_blocks_equal_the_full_table_form_and_the_reference_at_every_step(family):
    progs, weights, config = family
    ref = FamilyRef(weights, config)
    blocks, full = progs["blocks"].session(), progs["full"].session()
    for k, tok in enumerate(np.random.default_rng(4).integers(0, config["vocab_size"], STEPS)):
        blocks.step(token=np.int32(tok))
        full.step(token=np.int32(tok))
        want = ref.step(int(tok))
        got = blocks.read("logits")
        assert _rel(got, want) <= TOL, (k, _rel(got, want))
        assert _rel(got, np.asarray(full.read("logits"), np.float64)) <= TOL, k
        assert int(blocks.read("next")) == int(full.read("next")) == int(np.argmax(want)), k


@pytest.fixture(scope="module")
def costs(tmp_path_factory):
    """XLA's cost analysis of the compiled step of llama_decode.oi, of its full-table form and of
    llama_prefill.oi at S=16, at capacities T=256 and T=4096 of the same weights."""
    import jax
    tmp = tmp_path_factory.mktemp("cost")
    text = (EXAMPLES / "llama_decode.oi").read_text()
    (tmp / "full.oi").write_text(full_table_form(text))
    out = {}
    for t in (256, 4096):
        ck, _, _ = write_family(tmp / f"ck{t}", "llama", seed=5, **dict(SIZES, max_positions=t))
        convert_hf(ck, tmp / f"m{t}.oinf")
        for name, graph, sizes, inputs in (
                ("blocks", EXAMPLES / "llama_decode.oi", None, dict(token=np.int32(1))),
                ("full", tmp / "full.oi", None, dict(token=np.int32(1))),
                ("prompt", EXAMPLES / "llama_prefill.oi", {"S": 16}, dict(tokens=np.ones(16, np.int32), n=np.int32(9)))):
            # for the CPU, on any machine: the claim is the CPU's loop over filled blocks (a GPU or TPU
            # reads the table in one pass: test_on_an_accelerator_one_masked_pass_reads_the_table)
            prog = oi2jax.compile(graph, model=tmp / f"m{t}.oinf", ops=["nn"], sizes=sizes, device=jax.devices("cpu")[0])
            compiled = prog.lower(**inputs).compile()
            ca = compiled.cost_analysis()
            ca = ca[0] if isinstance(ca, list) else ca
            out[name, t] = (ca["bytes accessed"], ca["flops"])
            hlo = compiled.as_text().splitlines()
            out[name, t, "copies"] = [line for line in hlo if re.search(rf"\[[^\]]*\b{t}\b[^\]]*\][^=]*\bcopy\(", line)]
            out[name, t, "scatters"] = [line for line in hlo if re.search(rf"= f32\[2,{t},2,8\]\S* scatter\(", line)]
    return out


def test_the_step_costs_the_same_at_any_capacity(costs):
    """The attention loop reads ceil(n / block) blocks (a while loop: its body counted once by
    the cost analysis); nothing else in the step is sized by T, so a 16x larger cache costs
    exactly the same bytes and FLOPs. The full-table form reads and soft-maxes all T slots."""
    assert costs["blocks", 256] == costs["blocks", 4096]
    assert costs["blocks", 4096, "copies"] == []  # the optimized HLO copies nothing of T's size
    assert costs["full", 4096, "copies"] != []  # (the full-table form lays each layer's table out anew)
    assert costs["full", 4096][0] > 4 * costs["full", 256][0]
    assert costs["full", 4096][1] > 4 * costs["full", 256][1]
    assert costs["blocks", 4096][0] < costs["full", 4096][0] / 4


def test_a_prompt_step_costs_the_same_at_any_capacity(costs):
    """The S rows of a prompt step share one loop over the blocks that any of them reads: its
    FLOPs depend on pos + S, never on T, and nothing T-sized is copied. The one T-sized term in
    XLA's byte count is its accounting of the slice writes (`cache.write kh >> Kc[l, pos..end]`,
    a scatter of n rows): HloCostAnalysis counts a scatter as reading and writing its whole
    operand, though it runs in place on the donated table (no copy). Exactly that term differs:
    2 x (table bytes at 4096 - at 256) per write, 2 writes (K and V) a layer."""
    assert costs["prompt", 256][1] == costs["prompt", 4096][1]
    assert costs["prompt", 4096, "copies"] == []
    writes = len(costs["prompt", 4096, "scatters"])
    assert writes == len(costs["prompt", 256, "scatters"]) == 2 * SIZES["layers"]
    table = SIZES["layers"] * (4096 - 256) * SIZES["kv_heads"] * (SIZES["hidden"] // SIZES["heads"]) * 4
    assert costs["prompt", 4096][0] - costs["prompt", 256][0] == writes * 2 * table


def bf16_cache_form(text: str) -> str:
    """A family graph with its K/V cache in bf16 (docs/decode.md, *A bf16 KV cache*): the tables
    and their whole-cache reads declared bf16, k and v cast to bf16 before the write."""
    for c in ("Kc", "Vc"):
        text = text.replace(f"{c}(layer, slot): f32[", f"{c}(layer, slot): bf16[")
    text = text.replace("assign kc: f32[L", "assign kc: bf16[L").replace("assign vc: f32[L", "assign vc: bf16[L")
    text = text.replace("    assign kh: f32[KVH, HD];\n",
                        "    assign kh: f32[KVH, HD];\n    assign k16: bf16[KVH, HD];\n    assign v16: bf16[KVH, HD];\n")
    for x, c in (("k", "Kc"), ("v", "Vc")):
        text = text.replace(f"cache.write {x}h >> {c}[l, pos];",
                            f"op cast({x}h, to=bf16) >> {x}16;\n        cache.write {x}16 >> {c}[l, pos];")
    return text


class _Bf16Rows(list):
    """The reference's per-layer K or V rows, each stored as the graph stores it: f32, then bf16."""

    def __setitem__(self, i, rows):
        super().__setitem__(i, rows.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64))


def test_a_bf16_cache_halves_the_cache_and_matches_the_reference_with_bf16_k_v(tmp_path):
    ck, weights, config = write_family(tmp_path / "ck", "llama", seed=3, **SIZES)
    convert_hf(ck, tmp_path / "m.oinf")
    text = (EXAMPLES / "llama_decode.oi").read_text()
    (tmp_path / "g.oi").write_text(with_block(bf16_cache_form(text), 4))
    prog = oi2jax.compile(tmp_path / "g.oi", model=tmp_path / "m.oinf", ops=["nn"])
    f32 = oi2jax.compile(EXAMPLES / "llama_decode.oi", model=tmp_path / "m.oinf", ops=["nn"])
    state, state32 = prog.init_state(), f32.init_state()
    for name in ("Kc", "Vc"):  # the table's bytes, halved
        assert 2 * state.caches[name].data.nbytes == state32.caches[name].data.nbytes
    ref = FamilyRef(weights, config)
    ref.k, ref.v = _Bf16Rows(ref.k), _Bf16Rows(ref.v)
    sess = prog.session()
    for k, tok in enumerate(np.random.default_rng(4).integers(0, config["vocab_size"], STEPS)):
        sess.step(token=np.int32(tok))
        want = ref.step(int(tok))
        assert _rel(sess.read("logits"), want) <= TOL, (k, _rel(sess.read("logits"), want))


@pytest.mark.parametrize("name", ["gemma2", "gpt2"])
def test_softcap_window_and_single_row_heads_in_blocks_of_6(name, tmp_path):
    """gemma2 (soft-capped scores, a window of 5 over layers alternating with full attention) and
    gpt2 (q [H, HD]) with blocks of 6 in a T=20 cache: the last block is read at 14..19 with
    14..17 already counted; against their Hugging Face references at every step."""
    config = config_of(name)
    weights = gemma_gpt2_checkpoints.random_weights(config, seed=7)
    summary = convert_hf(gemma_gpt2_checkpoints.write_checkpoint(tmp_path / "ck", config, weights),
                         tmp_path / "m.oinf", max_positions=20 if name == "gpt2" else None)
    (tmp_path / "g.oi").write_text(re.sub(r"(op attention\([^)]*)\)", r"\1, block=6)",
                                          (EXAMPLES / summary.graph).read_text()))
    sess = oi2jax.compile(tmp_path / "g.oi", model=tmp_path / "m.oinf", ops=["nn"]).session()
    ref = reference(name, weights, config)
    for k, tok in enumerate(np.random.default_rng(1).integers(0, 64, 20)):
        sess.step(token=np.int32(tok))
        want = ref.step(int(tok))
        assert _rel(sess.read("logits"), want) <= TOL, (k, _rel(sess.read("logits"), want))
        assert int(sess.read("next")) == int(np.argmax(want)), k


def _distinct_kernels(hlo: str) -> int:
    """The fused computations of an optimized HLO module that differ in more than their names
    (XLA:CPU compiles one kernel per distinct fusion and reuses it for the identical ones)."""
    bodies = set()
    for m in re.finditer(r"\n%(fused_computation[\w.\-]*|wrapped_[\w.\-]*computation[\w.\-]*) \(([^\n]*)\{\n(.*?)\n\}",
                         hlo, re.S):
        body = re.sub(r"%[\w.\-]+", "%", re.sub(r", metadata=\{[^}]*\}", "", m.group(3)))
        bodies.add(re.sub(r"[\w.\-]+:", ":", m.group(2)) + body)
    return len(bodies)


def test_each_added_layer_adds_at_most_one_kernel_to_compile(tmp_path):
    """An unrolled layer's cache writes and attention reads are the same kernels as the layer
    before (the layer index reaches them as an argument, `jax_numerics.unfolded_index`, and the
    rows' checks are made once per step): a decode step of 6 layers has at most one distinct
    fusion per layer more than one of 2 (20 more before: XLA compiled each layer's writes and
    reads apart; a 30-layer decode step compiled 251 kernels, now 138)."""
    from llama_ref import converted_random_llama
    counts = {}
    for layers in (2, 6):
        model, _, _ = converted_random_llama(tmp_path / str(layers), seed=1, layers=layers, max_positions=32)
        prog = oi2jax.compile(EXAMPLES / "llama_prefill.oi", model=model, ops=["nn"], sizes={"S": 1}, device="cpu")
        hlo = prog.lower(tokens=np.zeros(1, np.int32), n=np.int32(1)).compile(prog.compile_options).as_text()
        counts[layers] = _distinct_kernels(hlo)
    assert counts[6] - counts[2] <= 4, counts


def _attention_jaxpr(platform: str, block=None):
    """attention's kernel for one query row over a T=256 table with a variable valid length, as the
    lowering traces it for a program lowered for `platform` (Ctx.platform): (jaxpr text, its value
    computed here, the NumPy reference's)."""
    import jax
    from oi2jax import ops
    attention = next(d for d in ops.load(["nn"]).added() if d.name == "attention")
    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, 3, 8)).astype(np.float32)
    k, v = (rng.standard_normal((256, 2, 8)).astype(np.float32) for _ in range(2))
    attrs = {} if block is None else {"block": block}

    def f(q, k, v, n):
        return ops.apply(attention, [q, k, v], {"valid": n, **attrs}, in_dtypes=("f32",) * 3,
                         out_dtype="f32", mode="normal", guards=[], platform=platform)
    args = (q, k, v, np.int32(150))
    return str(jax.make_jaxpr(f)(*args)), np.asarray(jax.jit(f)(*args)), _attention_reference(q, k, v, 150)


def _attention_reference(q, k, v, n):
    """NumPy: softmax over the first n positions of q . k, weighting v (one row, heads [KVH, G])."""
    s = np.einsum("kgd,tkd->kgt", q.astype(np.float64), k[:n].astype(np.float64))
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.einsum("kgt,tkd->kgd", e / e.sum(axis=-1, keepdims=True), v[:n].astype(np.float64))


@pytest.mark.parametrize("platform", ["cpu", "gpu", "cuda", "rocm", "tpu"])
def test_on_an_accelerator_one_masked_pass_reads_the_table(platform):
    """Lowered for a GPU or TPU, the op without `block` reads the table in one masked pass (no
    while loop: a loop whose trip count is a value costs a host round trip per iteration there);
    on a CPU, and with an explicit `block` everywhere, the loop over the filled blocks. Each is the
    masked softmax of the reference within f32 rounding (computed here, on this machine's device)."""
    jaxpr, got, want = _attention_jaxpr(platform)
    assert ("while" in jaxpr) == (platform == "cpu")
    assert np.max(np.abs(got - want)) <= 1e-6 * np.max(np.abs(want))
    jaxpr, got, _ = _attention_jaxpr(platform, block=64)
    assert "while" in jaxpr
    assert np.max(np.abs(got - want)) <= 1e-6 * np.max(np.abs(want))


def test_a_program_exported_for_cuda_has_no_attention_loop(tmp_path):
    """The platform reaches the op through the lowering (LoopPolicy.platform -> Ctx.platform): the
    decode step exported for CUDA (lowered on this machine) has one `while` fewer per layer than
    the same step exported for the CPU, whose attention loops over the filled blocks."""
    import jax
    from oi2jax.export import write_export
    ck, _, _ = write_family(tmp_path / "ck", "llama", seed=5, **dict(SIZES, max_positions=256))  # T > a block
    convert_hf(ck, tmp_path / "m.oinf")
    whiles = {}
    for platform in ("cpu", "cuda"):
        art = tmp_path / f"{platform}.jaxexport"
        write_export(EXAMPLES / "llama_decode.oi", art, model=tmp_path / "m.oinf", ops=["nn"], platforms=(platform,))
        with jax.enable_x64(True):
            text = jax.export.deserialize(bytearray(art.read_bytes())).mlir_module()
        whiles[platform] = text.count("stablehlo.while")
    assert whiles["cpu"] - whiles["cuda"] == SIZES["layers"], whiles
