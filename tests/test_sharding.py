"""Sharding over a device mesh (oi2jax/runtime/sharding.py, docs/scaling.md).

The main pytest process has one CPU device, so the multi-device checks run once in a
subprocess with 8 forced host devices (`WORKER` below) that reports JSON; the tests assert on
that report. The multi-process test starts two `python -m oi2jax run --coordinator ...`
processes on localhost (gloo collectives)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError

from conftest import EXAMPLES, MODELS, REPO

# example -> (data-only shard spec, data+model shard spec or None when it has no matmul)
CONFIGS = {
    "mlp_regression": ({"B": "data"}, {"B": "data", "H": "model"}),
    "linear_attention": ({"B": "data"}, {"B": "data", "D": "model"}),
    "residual_mlp_stack": ({"B": "data"}, {"B": "data", "D": "model"}),
    "online_weight_update": ({"B": "data"}, {"B": "data", "D": "model"}),
    "moe_routing": ({"B": "data"}, {"B": "data", "D": "model"}),
    "quantized_linear": ({"B": "data"}, {"B": "data", "D": "model"}),
    "streaming_pipeline": ({"B": "data"}, {"B": "data", "D": "model"}),
    "stability_guard": ({"B": "data"}, None),
    "kv_cache_decode": ({"D": "data"}, None),
    "cache_window_slice": ({"D": "data"}, None),
}

WORKER = textwrap.dedent(r'''
    import json, re, sys
    import jax, numpy as np
    import oi2jax
    from oi2jax.diagnostics import OiError
    from oi2jax.runtime.sharding import make_mesh
    examples, models, configs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    COLL = re.compile(r"(\w+\[[\d,]*\])\S* (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                      r"(?:-start)?\(")
    assert jax.device_count() == 8, jax.devices()
    mesh_dm = make_mesh({"data": 4, "model": 2})
    mesh_d = make_mesh({"data": 4}, devices=jax.devices()[:4])
    report = {"examples": {}, "errors": {}}

    def ulps(a, b):
        """The largest distance in units in the last place between two float arrays (0: equal)."""
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind != "f" or a.shape != b.shape:
            return 0 if np.array_equal(a, b) else 1 << 62
        ia, ib = (np.asarray(x, np.float32).view(np.int32).astype(np.int64) for x in (a, b))
        ia, ib = (np.where(i < 0, -(1 << 31) - i, i) for i in (ia, ib))  # monotone in the value
        return int(np.max(np.abs(ia - ib), initial=0))

    def inputs_for(prog, seed):
        rng = np.random.default_rng(seed)
        out = {}
        for n in prog.dynamic_names:
            decl = prog.graph.var(n)
            shape = prog.bound.shape(n)
            out[n] = np.asarray(True) if decl.dtype == "bool" else rng.standard_normal(shape).astype(np.float32)
        return out

    for name, (data_spec, model_spec) in configs.items():
        graph, model = f"{examples}/{name}.oi", f"{models}/{name}.oinf"
        ref = oi2jax.compile(graph, model=model)
        inputs = inputs_for(ref, 0)
        want = ref.run(inputs, steps=3)
        entry = {}
        for label, mesh, spec in (("data", mesh_d, data_spec), ("model", mesh_dm, model_spec)):
            if spec is None:
                continue
            prog = oi2jax.compile(graph, model=model, mesh=mesh, shard=spec)
            got = prog.run(inputs, steps=3)
            run_compiles = prog.compiles  # the 3 steps: one fused loop, traced once
            hlo = prog.emit("optimized-hlo")
            colls = [(shape, kind) for shape, kind in COLL.findall(hlo)]
            const_shapes = sorted({f"{np.dtype(v.dtype).name}{list(v.shape)}" for v in prog.consts.values()})
            entry[label] = {
                # bit for bit (NaN == NaN); "close": within the rounding of a reduction whose
                # terms are split over devices (a model-sharded contraction sums partial sums)
                "equal": sorted(want) == sorted(got) and all(
                    np.array_equal(want[k], got[k], equal_nan=want[k].dtype.kind == "f") for k in want),
                "ulps": max([ulps(want[k], got[k]) for k in want if k in got] or [0]),
                "close": sorted(want) == sorted(got) and all(
                    np.allclose(want[k], got[k], rtol=1e-5, atol=1e-5, equal_nan=True) for k in want),
                "collectives": colls,
                "const_specs": {k: str(v.sharding.spec) for k, v in prog.consts.items()},
                "const_full_shapes": {k: list(v.shape) for k, v in prog.consts.items()},
                "compiles": run_compiles,
            }
        report["examples"][name] = entry

    # Program.step returns sharded arrays; persistent state keeps its sharding; no retrace
    prog = oi2jax.compile(f"{examples}/online_weight_update.oi", model=f"{models}/online_weight_update.oinf",
                          mesh=mesh_dm, shard={"B": "data", "D": "model"})
    ins = inputs_for(prog, 1)
    state = prog.init_state()
    specs0 = {jax.tree_util.keystr(k): str(v.sharding.spec) for k, v in jax.tree_util.tree_leaves_with_path(state)}
    for _ in range(3):
        state, outs = prog.step(state, **ins)
    report["step"] = {
        "state_specs_before": specs0,
        "state_specs_after": {jax.tree_util.keystr(k): str(v.sharding.spec)
                              for k, v in jax.tree_util.tree_leaves_with_path(state)},
        "output_specs": {k: str(v.sharding.spec) for k, v in outs.items()},
        "output_types": sorted({type(v).__name__ for v in outs.values()}),
        "compiles": prog.compiles,
        "W": np.asarray(state.vars["W"]).tolist(),
        "W_want": (3 * ins["delta"]).tolist(),
    }

    # a program specialized (Program.specialized) keeps its mesh and shard spec
    prog = oi2jax.compile("dynamic { x: f32[B, D]; s: f32; } volatile { y: f32[B, D]; } "
                          "block entry { op mul(x, s) >> y; return; }", sizes={"B": 8, "D": 4}, model=False,
                          mesh=mesh_d, shard={"B": "data"})
    fixed = prog.specialized({"s": 2.5})
    xs = np.arange(32, dtype=np.float32).reshape(8, 4)
    state, outs = fixed.step(fixed.init_state(), x=xs)
    report["specialized"] = {"mesh": None if fixed.mesh is None else dict(fixed.mesh.shape),
                             "y": np.asarray(outs["y"]).tolist(), "want": (xs * 2.5).tolist(),
                             "y_spec": str(outs["y"].sharding.spec)}

    # constants are read shard by shard from the mmap, never whole
    prog = oi2jax.compile(f"{examples}/mlp_regression.oi", model=f"{models}/mlp_regression.oinf",
                          mesh=mesh_dm, shard={"B": "data", "H": "model"})
    m = prog.bound.model
    report["lazy"] = {"bytes_loaded": m.bytes_loaded, "tensor_bytes": sum(i.nbytes for i in m.tensors.values()),
                      "whole_loaded": m.loaded_whole,
                      "w1_shards": [list(s.data.shape) for s in prog.consts["w1"].addressable_shards]}

    # bad shard specs
    bad = {"not_divisible": ({"data": 8}, {"B": "data"}), "unknown_axis": ({"data": 8}, {"B": "batch"}),
           "unknown_sizevar": ({"data": 8}, {"Q": "data"})}
    for key, (axes, spec) in bad.items():
        try:
            oi2jax.compile(f"{examples}/mlp_regression.oi", model=f"{models}/mlp_regression.oinf",
                           mesh=make_mesh(axes), shard=spec)
            report["errors"][key] = None
        except OiError as exc:
            report["errors"][key] = str(exc)
    print("REPORT " + json.dumps(report))
''')


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="module")
def report():
    proc = subprocess.run([sys.executable, "-c", WORKER, str(EXAMPLES), str(MODELS), json.dumps(CONFIGS)],
                          env=_env(8), capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")][-1]
    return json.loads(line[len("REPORT "):])


# Sharded equals unsharded bit for bit where no float contraction runs on per-device shapes:
# caches, elementwise ops, integer matmuls. A float dot or sum over a batch- or model-sharded
# operand is computed by XLA on the per-device shapes, and its CPU dot picks its kernel (gemv for
# one row, blocked gemm, ...) and so its summation order by shape; a model-sharded contraction
# also sums partial sums across devices. There the claim is equality up to the rounding of that
# reduction, measured here in ulps for the record (up to a few thousand next to a cancelling zero).
EXACT = {"cache_window_slice", "kv_cache_decode", "quantized_linear", "stability_guard"}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sharded_equals_unsharded(report, name):
    entry = report["examples"][name]
    for label, cfg in entry.items():
        if name in EXACT:
            assert cfg["equal"], f"{name} sharded ({label}) differs from the unsharded run: {cfg['ulps']} ulps"
        else:
            assert cfg["close"], f"{name} sharded ({label}) is not the unsharded run up to reduction rounding"
    for cfg in entry.values():
        assert cfg["compiles"] == 1  # 3 steps, one trace: state keeps its sharding


def test_a_specialized_program_keeps_its_mesh(report):
    got = report["specialized"]
    assert got["mesh"] == {"data": 4} and got["y"] == got["want"] and "data" in got["y_spec"]


def test_data_parallel_has_no_collectives(report):
    # batch-only sharding of a feed-forward graph: weights replicated, every row independent
    for name in ("mlp_regression", "linear_attention", "residual_mlp_stack", "streaming_pipeline"):
        assert report["examples"][name]["data"]["collectives"] == [], name


def test_model_sharded_contraction_all_reduces(report):
    mlp = report["examples"]["mlp_regression"]["model"]
    assert mlp["const_specs"] == {"w1": "P(None, 'model')", "b1": "P('model',)",
                                  "w2": "P('model',)", "b2": "P()"}
    kinds = [k for _, k in mlp["collectives"]]
    assert "all-reduce" in kinds  # h·w2 contracts over the model-sharded H
    assert "all-gather" not in kinds
    # y = f32[B, O] partial sums are all-reduced: the reduced value is the (batch-sharded) output
    assert any(k == "all-reduce" and shape.startswith("f32[1,") for shape, k in mlp["collectives"]), mlp


@pytest.mark.parametrize("name", [n for n, (_, m) in CONFIGS.items() if m is not None])
def test_no_full_all_gather_of_weights(report, name):
    cfg = report["examples"][name]["model"]
    full = {f"[{','.join(map(str, s))}]" for s in cfg["const_full_shapes"].values() if len(s) >= 2}
    for shape, kind in cfg["collectives"]:
        if kind == "all-gather":
            assert shape[shape.index("["):] not in full, f"{name}: all-gather of a whole weight {shape}"


def test_step_keeps_state_sharding_and_returns_sharded_outputs(report):
    step = report["step"]
    assert step["state_specs_before"][".vars['W']"] == "P('model',)"
    assert step["state_specs_after"] == step["state_specs_before"]
    assert step["output_types"] == ["ArrayImpl"]
    assert "x" not in step["output_specs"]  # an input the graph never writes is not copied out
    assert "data" in step["output_specs"]["y"]
    assert step["compiles"] == 1
    np.testing.assert_array_equal(step["W"], step["W_want"])  # 0 + d + d + d == 3d exactly in f32


def test_constants_loaded_shard_by_shard(report):
    lazy = report["lazy"]
    assert lazy["whole_loaded"] == ["b2"]  # b2: f32[O] is replicated, so read whole
    assert lazy["bytes_loaded"] == lazy["tensor_bytes"]  # each unique shard read once, nothing twice
    assert lazy["w1_shards"] == [[16, 16]] * 8  # w1: f32[D=16, H=32] split over model=2


def test_bad_shard_specs(report):
    errors = report["errors"]
    assert "B = 4 is not divisible by mesh axis data of size 8" in errors["not_divisible"]
    assert "unknown mesh axis batch" in errors["unknown_axis"]
    assert "unknown size variable Q" in errors["unknown_sizevar"]


def test_bad_specs_in_process():
    import jax
    from jax.sharding import Mesh
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    graph, model = EXAMPLES / "mlp_regression.oi", MODELS / "mlp_regression.oinf"
    with pytest.raises(OiError, match="unknown mesh axis model"):
        oi2jax.compile(graph, model=model, mesh=mesh, shard={"H": "model"})
    with pytest.raises(OiError, match="unknown size variable Z"):
        oi2jax.compile(graph, model=model, mesh=mesh, shard={"Z": "data"})
    with pytest.raises(OiError, match="needs a mesh"):
        oi2jax.compile(graph, model=model, shard={"B": "data"})
    # a 1-device mesh is a valid (trivial) sharding
    prog = oi2jax.compile(graph, model=model, mesh=mesh, shard={"B": "data"})
    x = np.ones((4, 16), np.float32)
    np.testing.assert_allclose(prog.run({"x": x})["y"], oi2jax.compile(graph, model=model).run({"x": x})["y"])


def test_cli_flag_errors(tmp_path):
    from oi2jax.cli import main
    graph, model = str(EXAMPLES / "mlp_regression.oi"), str(MODELS / "mlp_regression.oinf")
    assert main(["compile", graph, "--model", model, "--shard", "B=data"]) == 2  # --shard without --mesh
    assert main(["compile", graph, "--model", model, "--mesh", "data=4", "--shard", "B=data"]) == 1  # 1 device
    assert main(["compile", graph, "--model", model, "--mesh", "data=x"]) == 2  # the flag's text: a usage error
    assert main(["run", graph, "--model", model, "--num-processes", "2"]) == 2  # without --coordinator
    out = tmp_path / "hlo.txt"
    assert main(["compile", graph, "--model", model, "--mesh", "data=1", "--shard", "B=data",
                 "--emit", "optimized-hlo", "-o", str(out)]) == 0
    assert "HloModule" in out.read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_run_equals_single_process(tmp_path):
    graph, model = str(EXAMPLES / "mlp_regression.oi"), str(MODELS / "mlp_regression.oinf")
    x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    port = _free_port()
    procs = []
    for i in range(2):
        cmd = [sys.executable, "-m", "oi2jax", "run", graph, "--model", model, "--input", f"x={tmp_path}/x.npy",
               "--mesh", "data=2,model=2", "--shard", "B=data", "--shard", "H=model", "--steps", "2",
               "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(i),
               "--out", str(tmp_path / f"out{i}.npz"), "--quiet"]
        procs.append(subprocess.Popen(cmd, env=_env(2), cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for p in procs:
            results.append(p.communicate(timeout=120))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-3000:]
    assert not (tmp_path / "out1.npz").exists()  # only process 0 writes the results
    got = np.load(tmp_path / "out0.npz")
    want = oi2jax.compile(graph, model=model).run({"x": x}, steps=2)
    assert sorted(got.files) == sorted(want)
    for k in want:  # H is model-sharded: h @ w2 sums partial sums across devices (see EXACT)
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


MP_WORKER = textwrap.dedent(r'''
    import json, sys
    import jax, numpy as np
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
    import oi2jax
    from oi2jax.runtime.sharding import make_mesh
    prog = oi2jax.compile(sys.argv[3], model=sys.argv[4], mesh=make_mesh({"model": 2}), shard={"H": "model"})
    m = prog.bound.model
    y = prog.run({"x": np.ones((4, 16), np.float32)})["y"]
    print("REPORT " + json.dumps({"procs": jax.process_count(), "bytes": m.bytes_loaded,
                                  "w1": m.tensors["w1"].nbytes, "w2": m.tensors["w2"].nbytes,
                                  "rest": m.tensors["b2"].nbytes, "y": y.tolist()}))
''')


def test_two_processes_each_read_only_their_shards():
    graph, model = str(EXAMPLES / "mlp_regression.oi"), str(MODELS / "mlp_regression.oinf")
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", MP_WORKER, f"127.0.0.1:{port}", str(i), graph, model],
                              env=_env(1), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    want = oi2jax.compile(graph, model=model).run({"x": np.ones((4, 16), np.float32)})["y"]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        rep = json.loads([ln for ln in out.splitlines() if ln.startswith("REPORT ")][-1][7:])
        assert rep["procs"] == 2
        # w1, b1, w2 are split over the two processes (half each); b2 is replicated (whole)
        b1 = 32 * 4
        assert rep["bytes"] == (rep["w1"] + b1 + rep["w2"]) // 2 + rep["rest"]
        np.testing.assert_allclose(rep["y"], want, rtol=1e-5, atol=1e-6)  # a split contraction (EXACT)


def test_mesh_and_shard_text_is_checked_before_xla_sees_it():
    """(helper probe) `--mesh 'é=4'` aborted the process inside XLA (exit 134, a native stack);
    a stray space in `--shard ' B=data'` made an unknown size variable ' B'; close names had no
    suggestion; the interpreter took mesh= and ignored it."""
    from oi2jax.runtime.sharding import make_mesh, parse_mesh_spec, parse_shard_specs, validate_shard
    with pytest.raises(OiError, match=r"--mesh: axis name 'é' must be ASCII letters, digits and _"):
        parse_mesh_spec("é=4")
    with pytest.raises(OiError, match=r"mesh axis name 'é' must be ASCII"):
        make_mesh({"é": 1})
    assert parse_mesh_spec(" data = 1 ") == {"data": 1} and parse_shard_specs([" B = data "]) == {"B": "data"}
    prog = oi2jax.compile(str(EXAMPLES / "mlp_regression.oi"), model=str(MODELS / "mlp_regression.oinf"))
    mesh = make_mesh({"data": 1})
    with pytest.raises(OiError, match=r"unknown size variable b \(did you mean B\?\)"):
        validate_shard(prog.bound, mesh, {"b": "data"})
    with pytest.raises(OiError, match=r"unknown mesh axis dat \(did you mean data\?\)"):
        validate_shard(prog.bound, mesh, {"B": "dat"})
    with pytest.raises(OiError, match=r"mesh=/shard= apply to compiled programs; the interpreter runs on one device"):
        oi2jax.compile(str(EXAMPLES / "mlp_regression.oi"), model=str(MODELS / "mlp_regression.oinf"),
                       mode="interpret", mesh=mesh, shard={"B": "data"})


def test_a_shard_spec_that_splits_nothing_is_noted(capsys):
    """Probe (sharding) 7: `shard={"num_heads": "data"}` on linear_attention (num_heads sizes a
    loop and the prefix tables' leading dims) placed every value replicated, without a word."""
    import warnings
    from oi2jax.diagnostics import OiNote
    from oi2jax.runtime.sharding import make_mesh
    graph, model = str(EXAMPLES / "linear_attention.oi"), str(MODELS / "linear_attention.oinf")
    with pytest.warns(OiNote, match=r"shard num_heads=data shards nothing: no value has a dim it splits"):
        prog = oi2jax.compile(graph, model=model, mesh=make_mesh({"data": 1}), shard={"num_heads": "data"})
    from jax.sharding import PartitionSpec
    assert prog.consts and all(v.sharding.spec == PartitionSpec() for v in prog.consts.values())
    with warnings.catch_warnings():
        warnings.simplefilter("error", OiNote)  # B splits x: no note
        oi2jax.compile(graph, model=model, mesh=make_mesh({"data": 1}), shard={"B": "data"})
    from conftest import run_cli
    code, _, err = run_cli(capsys, "compile", graph, "--model", model, "--emit", "jaxpr", "--mesh", "data=1",
                           "--shard", "num_heads=data")
    assert code == 0 and err.startswith("note: shard num_heads=data shards nothing: "), err


@pytest.mark.parametrize("coordinator, n, i, message", [
    ("xx", 1, 0, "--coordinator xx: expects HOST:PORT (PORT a number 1..65535)"),
    ("localhost:notaport", 1, 0, "--coordinator localhost:notaport: expects HOST:PORT (PORT a number 1..65535)"),
    (":1234", 1, 0, "--coordinator :1234: expects HOST:PORT (PORT a number 1..65535)"),
    ("localhost:70000", 1, 0, "--coordinator localhost:70000: expects HOST:PORT (PORT a number 1..65535)"),
    ("localhost:1234", 0, 0, "--num-processes must be >= 1, got 0"),
    ("localhost:1234", -3, 0, "--num-processes must be >= 1, got -3"),
])
def test_bad_distributed_flags_are_named_before_jax_distributed_starts(coordinator, n, i, message):
    """`--coordinator xx` was an internal error (IndexError inside jax.distributed), a port that is
    not a number an internal error after a glog line, `--num-processes 0` "--process-id 0 is not in 0..-1"."""
    from oi2jax.diagnostics import OiError
    from oi2jax.runtime.sharding import init_distributed
    with pytest.raises(OiError) as info:
        init_distributed(coordinator, n, i)
    assert str(info.value) == f"error: {message}"


@pytest.mark.parametrize("flags, message", [
    (["--mesh", "data=x"], "--mesh data: 'x' is not an integer"),
    (["--mesh", "data"], "--mesh expects AXIS=INT[,AXIS=INT...], got 'data'"),
    (["--mesh", "data=1", "--shard", "B"], "--shard expects SIZEVAR=AXIS, got 'B'"),
])
def test_malformed_mesh_and_shard_flags_are_usage_errors(capsys, flags, message):
    """A flag's text is a usage error (exit 2), as `--shard` without `--mesh` is (it exited 1)."""
    from conftest import run_cli
    code, _, err = run_cli(capsys, "run", EXAMPLES / "mlp_regression.oi", "--model", MODELS / "mlp_regression.oinf",
                           *flags)
    assert code == 2 and err.strip() == f"error: {message}"
