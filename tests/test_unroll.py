"""How `loop` lowers (issue #32 item 4; oi2jax/lowering/loops.py, docs/loops.md): the policy's rule
per platform, the per-graph override (`compile(unroll=...)`, `--unroll`), the HLO each choice gives
(while loops, dynamic-slices, per-member weight buffers) and the same values bit for bit whichever
is chosen, equal to the interpreter (on a CPU; on a GPU within conftest's EXACTNESS for the ops)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError
from oi2jax.lowering import loops
from oi2jax.lowering.context import Tracer
from oi2jax.lowering.loops import LoopPolicy
from oi2jax.model import save

from conftest import EXAMPLES, REPO, assert_matches, device_platform, graph_ops, run_cli

sys.path.insert(0, str(REPO))
from benchmarks.loops import kv_model  # noqa: E402

RES = EXAMPLES / "residual_mlp_stack.oi"
RES_MODEL = EXAMPLES / "residual_mlp_stack.oinf"
KV = REPO / "benchmarks" / "graphs" / "kv_layers.oi"
POLICIES = ("none", "full", 2, "auto")

DYNAMIC = """
dynamic { x: f32[2]; n: i32; }
constant { W(l): f32[2] @pattern("w.{l}"); }
volatile { y: f32[2]; }
block entry {
    loop ls (l in 0..n) { op mul(y, W[l]) >> y; op add(y, x) >> y; }
    loop fixed (i in 0..3) { op add(y, W[i]) >> y; }
    return;
}
"""


def whiles(text: str) -> int:
    return len(re.findall(r"\bwhile\(", text))


def dynamic_slices(text: str) -> int:
    return len(re.findall(r"dynamic-slice\(", text))


@pytest.fixture(scope="module")
def res_model(tmp_path_factory):
    """residual_mlp_stack with 4 layers (an even count, so unroll=2 divides it)."""
    path = tmp_path_factory.mktemp("res") / "res4.oinf"
    rng = np.random.default_rng(0)
    tensors = {"bias0": rng.standard_normal(8).astype(np.float32)}
    for l in range(4):
        tensors[f"res.mlp.w.{l}"] = (rng.standard_normal((8, 8)) / 3).astype(np.float32)
        tensors[f"res.mlp.b.{l}"] = rng.standard_normal(8).astype(np.float32)
    save(str(path), sizevars={"B": 2, "D": 8, "num_layers": 4}, metadata={}, tensors=tensors)
    return path


@pytest.fixture(scope="module")
def kv(tmp_path_factory):
    path = tmp_path_factory.mktemp("kv") / "kv.oinf"
    kv_model(path, D=8, F=16, L=3, T=4)
    return path


# ------------------------------------------------------------------------------ the rule


def _plan(prog, policy: LoopPolicy, which: int = 0) -> loops.Unrolling:
    tr = Tracer(prog.lowering, {})
    node = [n for n in prog.graph.entry.walk() if hasattr(n, "body")][which]
    return loops.unrolling(node, loops.static_trips(node, tr), tr, policy)


def test_the_rule_per_platform_and_option(res_model):
    prog = oi2jax.compile(RES, model=res_model)  # a layer loop: 4 iterations of 4 nodes
    assert prog.loop_policy() == LoopPolicy("auto", device_platform())
    for platform in ("cpu", "gpu", "cuda", "rocm", "tpu"):  # a layer loop within the budget: unrolled
        assert _plan(prog, LoopPolicy("auto", platform)).unroll
    assert not _plan(prog, LoopPolicy("none", "gpu")).unroll
    assert _plan(prog, LoopPolicy("full", "cpu")).unroll
    p = _plan(prog, LoopPolicy(2, "cpu"))
    assert (p.unroll, p.factor) == (False, 2)
    assert _plan(prog, LoopPolicy(4, "cpu")).unroll and _plan(prog, LoopPolicy(9, "cpu")).unroll  # k >= n: full


def test_auto_keeps_compile_time_bounded(monkeypatch, res_model):
    """Over the budget (n x body nodes), a layer loop is partly unrolled by the largest factor within it."""
    prog = oi2jax.compile(RES, model=res_model)
    monkeypatch.setattr(loops, "UNROLL_BUDGET", 8)  # 4 iterations x 4 nodes = 16 > 8
    p = _plan(prog, LoopPolicy("auto", "gpu"))
    assert (p.unroll, p.factor) == (False, 2)
    p = _plan(prog, LoopPolicy("auto", "cpu"))  # CPU: no partial unrolling (measured slower: docs/loops.md)
    assert (p.unroll, p.factor) == (False, 1) and p.reason.endswith("a loop")
    monkeypatch.setattr(loops, "UNROLL_BUDGET", 5)
    p = _plan(prog, LoopPolicy("auto", "gpu"))
    assert (p.unroll, p.factor) == (False, 1)


def test_dynamic_trip_counts_and_loops_without_per_iteration_constants(tmp_path):
    model = tmp_path / "w.oinf"
    save(str(model), tensors={f"w.{l}": np.full(2, l + 1, np.float32) for l in range(3)})
    prog = oi2jax.compile(DYNAMIC, model=model)
    for policy in (LoopPolicy("full", "cpu"), LoopPolicy("auto", "gpu"), LoopPolicy(2, "gpu")):
        assert _plan(prog, policy, 0).reason == "trip count read at run time"
    assert _plan(prog, LoopPolicy("auto", "gpu"), 1).unroll  # W[i]: per iteration
    plain = oi2jax.compile("dynamic { x: f32[2]; }\nvolatile { y: f32[2]; }\n"
                           "block entry { loop t (i in 0..4) { op add(y, x) >> y; } return; }")
    assert not _plan(plain, LoopPolicy("auto", "gpu")).unroll  # no W[i]: stays a loop
    assert _plan(plain, LoopPolicy("full", "cpu")).unroll


# ------------------------------------------------------------------------------ the HLO


def test_hlo_per_policy(res_model):
    none = oi2jax.compile(RES, model=res_model, unroll="none")
    text = none.emit("hlo")
    assert whiles(text) == 1 and dynamic_slices(text) == 2  # W[l], b[l] sliced every iteration
    assert "W" in none.consts and "W[0]" not in none.consts

    full = oi2jax.compile(RES, model=res_model, unroll="full")
    text = full.emit("hlo")
    assert whiles(text) == 0 and dynamic_slices(text) == 0
    # every member its own buffer: no slice of a stacked family either, before or after XLA
    assert {f"W[{l}]" for l in range(4)} <= set(full.consts) and "W" not in full.consts
    for hlo in (text, full.emit("optimized-hlo")):
        assert "f32[4,8,8]" not in hlo and "f32[1,8,8]" not in hlo  # no stacked W, no slice of it
    assert "f32[4,8,8]" in none.emit("optimized-hlo")

    two = oi2jax.compile(RES, model=res_model, unroll=2)
    assert whiles(two.emit("hlo")) == 1 and "unroll=2" in two.emit("jaxpr")  # the body twice per iteration
    assert "W" in two.consts


def test_export_for_gpu_unrolls_layer_loops_on_a_machine_without_one(tmp_path):
    """`export --platforms cuda` lowers with the platform's policy here (a layer loop within the budget
    is unrolled on every platform; only over it do CPU and accelerators differ: the plan tests above)."""
    from oi2jax.export import build_export
    exported, manifest, _ = build_export(RES, model=RES_MODEL, platforms=["cuda"])
    assert manifest["unroll"] == "auto" and "stablehlo.while" not in exported.mlir_module()
    exported, manifest, _ = build_export(RES, model=RES_MODEL, platforms=["cuda"], unroll="none")
    assert manifest["unroll"] == "none" and "stablehlo.while" in exported.mlir_module()
    exported, _, _ = build_export(RES, model=RES_MODEL, platforms=["cpu"])  # within the budget: CPU too
    assert "stablehlo.while" not in exported.mlir_module()


# ------------------------------------------------------------------------------ the values


def test_same_bits_every_policy_and_the_interpreter(res_model):
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    want = oi2jax.compile(RES, model=res_model, mode="interpret").run({"x": x})
    for policy in POLICIES:
        got = oi2jax.compile(RES, model=res_model, unroll=policy).run({"x": x})
        assert_matches(got, want, graph_ops(RES), policy)


def test_same_bits_with_a_dynamic_trip_count(tmp_path):
    model = tmp_path / "w.oinf"
    save(str(model), tensors={f"w.{l}": np.asarray([0.5 + l, 1.25], np.float32) for l in range(3)})
    x = np.asarray([0.1, -0.3], np.float32)
    interpreted = oi2jax.compile(DYNAMIC, model=model, mode="interpret")
    want = {n: interpreted.run({"x": x, "n": np.int32(n)}) for n in (0, 2, 3)}
    for policy in POLICIES:
        prog = oi2jax.compile(DYNAMIC, model=model, unroll=policy)  # one program runs every trip count
        for n in (0, 2, 3):
            got = prog.run({"x": x, "n": np.int32(n)})
            assert_matches({"y": got["y"]}, {"y": want[n]["y"]}, graph_ops(DYNAMIC), f"{policy}, n={n}")
        assert "W" in prog.consts  # read at a traced index: the family stays stacked
    with pytest.raises(OiError, match="prefix table W: model tensor w.3 not found"):
        oi2jax.compile(DYNAMIC, model=model, unroll="full").run({"x": x, "n": np.int32(4)})


def test_caches_indexed_by_an_unrolled_loop(kv):
    """kv_layers: per-layer weights and K/V rows (Kc[l, pos]) over steps, every policy, interpreter."""
    x = np.random.default_rng(2).standard_normal((1, 8)).astype(np.float32)
    want = oi2jax.compile(KV, model=kv, mode="interpret").run({"x": x}, steps=3)
    for policy in ("none", "full"):
        prog = oi2jax.compile(KV, model=kv, unroll=policy)
        got = prog.run({"x": x}, steps=3)
        names = ("x", "Kc", "Vc", "pos")
        assert_matches({n: got[n] for n in names}, {n: want[n] for n in names}, graph_ops(KV), policy)
    assert whiles(prog.emit("hlo")) == 0


def test_static_range_outside_the_family_is_the_same_error_unrolled(tmp_path):
    model = tmp_path / "w.oinf"
    save(str(model), tensors={"w.0": np.ones(2, np.float32), "w.1": np.ones(2, np.float32)})
    src = ("constant { W(l): f32[2] @pattern(\"w.{l}\"); }\nvolatile { y: f32[2]; }\n"
           "block entry { loop ls (l in 0..3) { op add(y, W[l]) >> y; } return; }\n")
    for policy in ("none", "full"):
        with pytest.raises(OiError, match="prefix table W: model tensor w.2 not found"):
            oi2jax.compile(src, model=model, unroll=policy).run({})


def test_the_policy_is_the_lowerings_own(res_model):
    """The loop policy is a field of the program's lowering, fixed when it is built: the families
    it splits (`Lowering.split`) are the ones its trace reads member by member."""
    x = np.ones((2, 8), np.float32)
    want = oi2jax.compile(RES, model=res_model).run({"x": x})
    for unroll, loops_left in (("full", 0), ("none", 1)):
        prog = oi2jax.compile(RES, model=res_model, unroll=unroll)
        assert prog.lowering.loop_policy == LoopPolicy(unroll, device_platform())
        assert (prog.lowering.split == {"W", "b"}) == (unroll == "full")
        assert {getattr(key, 'family', key) for key in prog.consts} >= {"W", "b"}  # W[0]: W's member, not parsed
        assert whiles(prog.emit("hlo")) == loops_left
        np.testing.assert_array_equal(prog.run({"x": x})["y"], want["y"])


def test_a_rolled_program_reads_its_sources_members_by_switch(res_model, tmp_path):
    """`Program.rebound(sizes, rolled=True)` (a prompt program on a CPU: runtime/buckets.py): its
    loop rolled, the families still held member by member (`LoopPolicy.members`), each read at
    the loop's index a `lax.switch` over the members: it holds its source's buffers (no second
    copy of the weights, no dynamic-slice of a stacked family) and gives the unrolled program's
    values bit for bit; a traced index outside the family is reported as the stacked read's."""
    x = np.random.default_rng(4).standard_normal((2, 8)).astype(np.float32)
    full = oi2jax.compile(RES, model=res_model, unroll="full")
    rolled = full.rebound(dict(full.bound.sizes), rolled=True)
    cpu = device_platform() == "cpu"
    assert rolled.lowering.loop_policy == LoopPolicy("none", device_platform(), members=cpu)
    np.testing.assert_array_equal(rolled.run({"x": x})["y"], full.run({"x": x})["y"])
    if not cpu:
        return  # members only on a CPU: elsewhere a switch in a loop is a host round trip per read
    text = rolled.emit("hlo")
    assert rolled.lowering.split == {"W", "b"} and whiles(text) == 1 and dynamic_slices(text) == 0
    assert len(re.findall(r"\bconditional\(", text)) == 2  # W[l] and b[l]
    assert all(rolled.consts[k] is full.consts[k] for k in full.consts)  # the source's buffers
    assert rolled.memory()["weights"] == full.memory()["weights"]
    model = tmp_path / "w.oinf"
    save(str(model), tensors={f"w.{l}": np.asarray([0.5 + l, 1.25], np.float32) for l in range(3)})
    dyn = oi2jax.compile(DYNAMIC, model=model, unroll="full")
    dyn_rolled = dyn.rebound({}, rolled=True)
    assert dyn_rolled.lowering.split == {"W"} and "W" not in dyn_rolled.consts and "W" in dyn.consts
    v = np.asarray([0.1, -0.3], np.float32)
    for n in (0, 2, 3):
        np.testing.assert_array_equal(dyn_rolled.run({"x": v, "n": np.int32(n)})["y"],
                                      dyn.run({"x": v, "n": np.int32(n)})["y"])
    with pytest.raises(OiError, match="prefix table W: model tensor w.3 not found"):
        dyn_rolled.run({"x": v, "n": np.int32(4)})


# ------------------------------------------------------------------------------ the option


@pytest.mark.parametrize("bad", ["fast", "0", 0, -2, True, 1.5, None])
def test_a_bad_value_is_a_clear_error(bad):
    with pytest.raises(OiError, match="unroll"):
        oi2jax.compile(RES, model=RES_MODEL, unroll=bad)


def test_normalized_values():
    assert [loops.check_unroll(v) for v in ("AUTO", " full", "none", "3", 1, 8)] == \
        ["auto", "full", "none", 3, 1, 8]


def test_interpreter_refuses_an_unroll_option():
    with pytest.raises(OiError, match="applies to compiled programs"):
        oi2jax.compile(RES, model=RES_MODEL, mode="interpret", unroll="full")
    oi2jax.compile(RES, model=RES_MODEL, mode="interpret", unroll="auto")


def test_cli_flag(capsys, tmp_path):
    code, out, err = run_cli(capsys, "compile", RES, "--emit", "hlo", "--unroll", "full")
    assert code == 0, err
    assert whiles(out) == 0
    code, out, err = run_cli(capsys, "compile", RES, "--emit", "hlo", "--unroll", "none")
    assert code == 0 and whiles(out) == 1
    np.save(tmp_path / "x.npy", np.ones((4, 32), np.float32))
    outs = []
    for flag in ("none", "full", "2", "auto"):
        code, _, err = run_cli(capsys, "run", RES, "--input", f"x={tmp_path / 'x.npy'}", "--quiet", "--unroll", flag,
                               "--out", tmp_path / f"{flag}.npz")
        assert code == 0, err
        outs.append(np.load(tmp_path / f"{flag}.npz")["y"])
    for o in outs:  # bit for bit on a CPU; on a GPU within its tolerance for the graph's ops
        assert_matches({"y": o}, {"y": outs[0]}, graph_ops(RES))
    code, _, err = run_cli(capsys, "export", RES, "-o", tmp_path / "s.jaxexport", "--unroll", "full")
    assert code == 0, err
    for command in (["run", RES], ["compile", RES], ["export", RES, "-o", tmp_path / "t.jaxexport"]):
        with pytest.raises(SystemExit) as exc:
            run_cli(capsys, *command, "--unroll", "fast")
        assert exc.value.code == 2
        assert "--unroll: unknown unroll 'fast' (expected auto, none, full" in capsys.readouterr().err


SHARDED = textwrap.dedent(r"""
    import sys, numpy as np, oi2jax
    from oi2jax.runtime.sharding import make_mesh
    graph, model = sys.argv[1], sys.argv[2]
    x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
    mesh, shard = make_mesh({"data": 2, "model": 2}), {"B": "data", "D": "model"}
    want = oi2jax.compile(graph, model=model, mesh=mesh, shard=shard, unroll="none").run({"x": x})["y"]
    prog = oi2jax.compile(graph, model=model, mesh=mesh, shard=shard, unroll="full")
    assert "W[0]" in prog.consts, sorted(prog.consts)
    assert prog.consts["W[0]"].sharding.spec == prog.placer.spec_for("W", (32, 32)), prog.consts["W[0]"].sharding
    np.testing.assert_array_equal(prog.run({"x": x})["y"], want)
    print("SHARDED-OK")
""")


def test_members_are_sharded_like_their_family():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))  # a 4-device CPU mesh
    proc = subprocess.run([sys.executable, "-c", SHARDED, str(RES), str(RES_MODEL)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert "SHARDED-OK" in proc.stdout, proc.stderr[-3000:]
