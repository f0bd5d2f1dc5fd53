"""`oi2jax export`: a jax.export artifact + manifest that runs without oi2jax (issue 11, part 1)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from oi2jax import api
from oi2jax.cli import main
from oi2jax.diagnostics import OiError
from oi2jax.export import MANIFEST_FORMAT, write_export

from conftest import EXAMPLES, REPO, assert_matches, graph_ops

# The loader a user without oi2jax writes: plain jax.export.deserialize + the manifest.
LOADER = textwrap.dedent("""
    import sys
    sys.modules["oi2jax"] = None  # any `import oi2jax` now fails
    import json
    import numpy as np
    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    for job in json.loads(sys.argv[1]):
        art = job["artifact"]
        exp = jax.export.deserialize(bytearray(open(art, "rb").read()))
        man = json.load(open(art + ".json"))
        npz = np.load(art.rsplit("/", 1)[0] + "/" + man["init_npz"])
        def buf(key, dtype):  # bf16/f8 are stored as their bits (uint16, uint8)
            return npz[key].view(jnp.dtype(dtype))
        st = man["state"]
        state = {"vars": {v["name"]: buf(v["npz_key"], v["dtype"]) for v in st["vars"]},
                 "caches": {c["name"]: {p: buf(c[p]["npz_key"], c[p]["dtype"]) for p in ("data", "size", "present")
                                        if p in c} for c in st["caches"]},
                 "guards": {g: buf(st["guards"][g]["npz_key"], st["guards"][g]["dtype"]) for g in ("err", "errval", "grow")}}
        dynamic = {d["name"]: buf(d["default_npz_key"], d["dtype"]) for d in man["inputs"]}
        if job.get("inputs"):
            given = np.load(job["inputs"])
            dynamic.update({k: given[k] for k in given.files})
        for _ in range(job["steps"]):
            state, outputs = exp.call(state, dynamic)
        def host(v):  # .npy cannot hold bf16/f8: the results widen them to float32 (exact)
            v = np.asarray(v)
            return v.astype(np.float32) if v.dtype.name in ("bfloat16", "float8_e5m2") else v
        res = {"out." + k: host(v) for k, v in outputs.items()}
        res.update({f"state.vars.{k}": host(v) for k, v in state["vars"].items()})
        res.update({f"state.caches.{k}.{p}": host(v) for k, c in state["caches"].items() for p, v in c.items()})
        res.update({f"state.guards.{k}": np.asarray(v) for k, v in state["guards"].items()})
        np.savez(job["result"], **res)
    bad = [m for m, v in sys.modules.items() if m.startswith("oi2jax") and v is not None]
    assert not bad, bad
    print("LOADED-WITHOUT-OI2JAX")
""")

# (example, steps, sizes for the run, symbolic) -- cover: no state, a table cache, yield/await.
CASES = [
    ("mlp_regression", 1, {}, ()),
    ("kv_cache_decode", 3, {}, ()),
    ("cache_window_slice", 4, {}, ()),
    ("streaming_pipeline", 2, {}, ()),
    ("residual_mlp_stack", 1, {}, ()),
    ("mlp_regression", 1, {"B": 7}, ("B",)),
    ("streaming_pipeline", 2, {"B": 3}, ("B",)),
]
OVERFLOW = ("kv_cache_decode", 5)  # the 5th write overflows K @fixed(i=4): a runtime guard


def _inputs(program, rng):
    inputs = {}
    for name in program.dynamic_names:
        shape = program.bound.shape(name)
        if program.bound.dtype(name) == "f32":
            inputs[name] = rng.standard_normal(shape).astype(np.float32)
    return inputs


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Export every case, run each artifact in ONE fresh subprocess without oi2jax."""
    tmp = tmp_path_factory.mktemp("export")
    rng = np.random.default_rng(0)
    jobs, expected = [], []
    for i, (name, steps, sizes, symbolic) in enumerate(CASES):
        graph, model = EXAMPLES / f"{name}.oi", EXAMPLES / f"{name}.oinf"
        art = tmp / f"{i}_{name}" / "step.jaxexport"
        args = ["export", str(graph), "--model", str(model), "-o", str(art)]
        for s in symbolic:
            args += ["--symbolic", s]
        assert main(args) == 0
        program = api.compile(graph, model=model, sizes=sizes)
        inputs = _inputs(program, rng)
        inp = tmp / f"{i}_inputs.npz"
        np.savez(inp, **inputs)
        expected.append(program.run(inputs, steps=steps))
        jobs.append({"artifact": str(art), "steps": steps, "inputs": str(inp), "result": str(tmp / f"{i}_res.npz")})
    over = tmp / "overflow" / "step.jaxexport"
    write_export(EXAMPLES / f"{OVERFLOW[0]}.oi", over, model=EXAMPLES / f"{OVERFLOW[0]}.oinf")
    jobs.append({"artifact": str(over), "steps": OVERFLOW[1], "inputs": None, "result": str(tmp / "over.npz")})
    proc = subprocess.run([sys.executable, "-c", LOADER, json.dumps(jobs)], capture_output=True, text=True,
                          cwd=str(tmp), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOADED-WITHOUT-OI2JAX" in proc.stdout
    return [(case, job, exp) for case, job, exp in zip(CASES + [OVERFLOW], jobs, expected + [None])]


def test_artifact_matches_oi2jax_run(exported):
    compared = 0
    for (name, steps, sizes, symbolic), job, expected in exported[:len(CASES)]:
        got = np.load(job["result"])
        ops = graph_ops(EXAMPLES / f"{name}.oi")  # bit for bit on a CPU, the device's tolerance elsewhere
        man = json.load(open(job["artifact"] + ".json"))
        assert int(got["state.guards.err"]) == 0, name
        for out in man["outputs"]:
            key = out["name"]
            assert key in expected, (name, key)
            assert_matches({key: got["out." + key]}, {key: expected[key]}, ops, f"{name}:{key}")
            compared += 1
        for var in man["state"]["vars"]:  # persistent values, through the manifest's structure
            assert_matches({var["name"]: got["state.vars." + var["name"]]}, {var["name"]: expected[var["name"]]},
                           ops, f"{name}:{var['name']}")
            compared += 1
        for info in man["state"]["caches"]:  # ... and caches through its view
            cache = info["name"]
            data = got[f"state.caches.{cache}.data"]
            if info["kind"] == "table":
                sizes_ = got[f"state.caches.{cache}.size"]
                data = data[tuple(slice(0, int(s)) for s in sizes_)]
            assert_matches({cache: data}, {cache: expected[cache]}, ops, f"{name}:{cache}")
            compared += 1
    assert compared >= 15


def test_symbolic_artifact_runs_at_another_size(exported):
    for (name, steps, sizes, symbolic), job, expected in exported[:len(CASES)]:
        if not symbolic:
            continue
        got = np.load(job["result"])
        man = json.load(open(job["artifact"] + ".json"))
        assert man["symbolic"] == ["B"] and man["sizes"]["B"] == "symbolic"
        assert man["inputs"][0]["shape"][0] == "B"
        batched = [o["name"] for o in man["outputs"] if o["shape"] and o["shape"][0] == "B"]
        assert batched and all(got["out." + n].shape[0] == sizes["B"] != 4 for n in batched)  # model B is 4


def test_manifest_contents(exported):
    (name, *_), job, _ = exported[3]
    assert name == "streaming_pipeline"
    man = json.load(open(job["artifact"] + ".json"))
    import hashlib
    import jax
    assert man["format"] == MANIFEST_FORMAT
    assert man["yield_mode"] == "fused"
    assert man["x64"] is True and "jax_enable_x64" in man["x64_note"]
    assert man["constants"] == "baked"
    assert man["jax_version"] == jax.__version__
    assert isinstance(man["serialization_version"], int) and "6 months" in man["compatibility"]
    source = (EXAMPLES / "streaming_pipeline.oi").read_text()
    assert man["graph"]["sha256"] == hashlib.sha256(source.encode()).hexdigest()
    assert [d["name"] for d in man["inputs"]] == ["x"]
    assert {o["name"] for o in man["outputs"]} == {"x", "h", "h2"}
    assert set(man["state"]["guards"]) >= {"err", "errval", "grow"}
    assert man["table_dtype"] is None and man["widen_floats"] is False
    (name, *_), job, _ = exported[0]
    assert json.load(open(job["artifact"] + ".json"))["yield_mode"] == "none"
    (name, *_), job, _ = exported[1]
    man = json.load(open(job["artifact"] + ".json"))
    caches = {c["name"]: c for c in man["state"]["caches"]}
    assert caches["K"]["kind"] == "table" and "t" in {v["name"] for v in man["state"]["vars"]}
    assert "dimension 0 of K: index {value} is past its fixed size 4" in man["errors"]


def test_runtime_guard_is_reported_through_the_manifest(exported, capsys):
    _, job, _ = exported[-1]
    got = np.load(job["result"])
    man = json.load(open(job["artifact"] + ".json"))
    code, value = int(got["state.guards.err"]), int(got["state.guards.errval"])
    assert code != 0
    assert man["errors"][code - 1].format(value=value) == "dimension 0 of K: index 4 is past its fixed size 4"
    assert int(got["state.vars.t"]) == 5  # later nodes of the failing step ran; the failing write was skipped
    rc = main(["run", str(EXAMPLES / "kv_cache_decode.oi"), "--steps", "5", "--quiet", "--cache-dir", "none",
               "--zero-missing-inputs"])
    assert rc == 1 and "dimension 0 of K: index 4 is past its fixed size 4" in capsys.readouterr().err


def test_symbolic_limits_are_clear_errors(tmp_path, capsys):
    rc = main(["export", str(EXAMPLES / "quantized_linear.oi"), "-o", str(tmp_path / "q.jaxexport"),
               "--symbolic", "B"])
    err = capsys.readouterr().err
    assert rc == 1 and "cannot export with symbolic B" in err and "constant x" in err
    with pytest.raises(OiError, match="not a size variable"):
        write_export(EXAMPLES / "kv_cache_decode.oi", tmp_path / "k.jaxexport",
                     model=EXAMPLES / "kv_cache_decode.oinf", symbolic=("B",))


def test_a_symbolic_size_used_as_a_capacity_or_a_loop_bound_is_refused_at_its_place(tmp_path, capsys):
    """`@fixed(i=B)` with B symbolic was exported at exit 0 with the bound B's capacity baked in
    while the manifest called B symbolic: at B = 5 the artifact's 4th write failed with `index 3 is
    past its fixed size 3` where `oi2jax run --size B=5` wrote it. A loop bound B failed with an
    unlocated `the lowering needs a concrete value there`. Both are located errors now, and
    nothing is written."""
    from oi2jax.model import save
    save(tmp_path / "m.oinf", sizevars={"B": 3, "D": 4}, tensors={})
    cap = tmp_path / "cap.oi"
    cap.write_text("dynamic { x: f32[B, D]; r: f32[D]; }\nvolatile { y: f32[B, D]; }\n"
                   "persistent { t: i32 @init(0); K(i): f32[D] @table @fixed(i=B); }\n"
                   "block entry {\n    op add(x, x) >> y;\n    cache.write r >> K[t];\n    cache.increment t;\n"
                   "    return;\n}\n")
    loop = tmp_path / "loop.oi"
    loop.write_text("dynamic { x: f32[B, D]; }\nvolatile { y: f32[B, D]; }\nblock entry {\n"
                    "    loop l (i in 0..B) {\n        op add(x, x) >> y;\n    }\n    return;\n}\n")
    for g, where, what in ((cap, "3:31", "@fixed(i=B) of K uses B as a table capacity"),
                           (loop, "4:5", "loop l uses B as a loop bound")):
        out = tmp_path / (g.stem + ".jaxexport")
        rc = main(["export", str(g), "--model", str(tmp_path / "m.oinf"), "-o", str(out), "--symbolic", "B"])
        err = capsys.readouterr().err
        assert rc == 1 and f"{g}:{where}: error: cannot export with symbolic B: {what}" in err, err
        assert "Traceback" not in err and not out.exists()
    # without --symbolic the same graph exports (B is the model's 3)
    assert main(["export", str(cap), "--model", str(tmp_path / "m.oinf"), "-o", str(tmp_path / "c.jaxexport")]) == 0


def test_export_cli_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["export", str(EXAMPLES / "mlp_regression.oi")])  # -o is required
    assert exc.value.code == 2
    assert REPO.is_dir()


def test_platform_names_are_lowering_platforms(monkeypatch):
    """JAX names every GPU device and backend `gpu`; jax.export records and checks `cuda` /
    `rocm`, so an artifact exported for `gpu` is refused where it runs (issue 32). One mapping,
    `placement.lowering_platform`, simulated here on a CPU machine."""
    import jax
    from oi2jax.export import export_platforms
    from oi2jax.runtime.placement import lowering_platform
    assert lowering_platform(jax.devices()[0]) == jax.export.default_export_platform()
    assert export_platforms() == (jax.export.default_export_platform(),)
    assert [lowering_platform(p) for p in ("cpu", "cuda", "rocm", "tpu")] == ["cpu", "cuda", "rocm", "tpu"]
    if jax.default_backend() == "cpu":
        with pytest.raises(OiError, match="platform gpu: no GPU is present.*cuda or rocm"):
            lowering_platform("gpu")
    real = jax.devices

    def with_gpu(kind):  # a machine with one CUDA device
        def devices(backend=None):
            if backend == kind:
                return ["fake-gpu"]
            if backend in ("cuda", "rocm"):
                raise RuntimeError(f"Unknown backend {backend}")
            return real(backend)
        return devices

    for kind in ("cuda", "rocm"):
        monkeypatch.setattr(jax, "devices", with_gpu(kind))
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
        assert lowering_platform("gpu") == kind
        assert export_platforms() == (kind,)  # the default: the backend's lowering platform
        assert export_platforms(["cpu", "gpu", kind]) == ("cpu", kind)


def test_export_for_cpu_and_cuda(tmp_path):
    """JAX lowers for CUDA on a machine without a GPU: one artifact holds both lowerings, the
    manifest names them as jax.export does, and it runs here (CPU) like oi2jax."""
    import jax
    graph, model = EXAMPLES / "mlp_regression.oi", EXAMPLES / "mlp_regression.oinf"
    art = tmp_path / "step.jaxexport"
    write_export(graph, art, model=model, platforms=("cpu", "cuda"))
    man = json.load(open(str(art) + ".json"))
    assert man["platforms"] == ["cpu", "cuda"]
    with jax.enable_x64(True):
        exp = jax.export.deserialize(bytearray(art.read_bytes()))
        assert exp.platforms == ("cpu", "cuda")
        npz = np.load(tmp_path / man["init_npz"])
        st = man["state"]
        state = {"vars": {v["name"]: npz[v["npz_key"]] for v in st["vars"]},
                 "caches": {c["name"]: {p: npz[c[p]["npz_key"]] for p in ("data", "size", "present") if p in c}
                            for c in st["caches"]},
                 "guards": {g: npz[st["guards"][g]["npz_key"]] for g in ("err", "errval", "grow")}}
        x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
        _, outputs = exp.call(state, {"x": x})
        expected = api.compile(graph, model=model).run({"x": x})
        assert_matches({k: np.asarray(v) for k, v in outputs.items()}, {k: expected[k] for k in outputs},
                       graph_ops(graph))


def test_export_uses_the_model_beside_the_graph_and_the_users_umask(tmp_path, capsys):
    """Issue 34 items 2 and 5: export finds the model beside the graph (the one rule of
    pipeline.choose_model), and its files were written -rw------- (a temporary file's mode): they
    take the user's umask like every other output, and a file replaced keeps its mode."""
    import os
    import stat
    out = tmp_path / "k.jaxexport"
    previous = os.umask(0o027)
    try:
        paths = write_export(EXAMPLES / "kv_cache_decode.oi", out)  # no model=: kv_cache_decode.oinf beside it
    finally:
        os.umask(previous)
    assert json.loads((tmp_path / "k.jaxexport.json").read_text())["sizes"]["D"] == 16
    assert sorted(oct(stat.S_IMODE(os.stat(p).st_mode)) for p in paths) == ["0o640"] * 3
    os.chmod(out, 0o604)
    assert main(["export", str(EXAMPLES / "kv_cache_decode.oi"), "-o", str(out)]) == 0
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o604  # replaced: its mode kept, as by any plain write
    assert capsys.readouterr().err.startswith(f"note: using model {EXAMPLES / 'kv_cache_decode.oinf'} (beside the "
                                              f"graph)\nwrote {out}\n")


def test_an_nn_op_exports_with_a_symbolic_rows_dimension(tmp_path):
    """nn `linear` (an added op: its kernel's result shape is checked) over x [B, D] with B
    symbolic: one artifact, run at B = 1 and B = 5, against NumPy."""
    from oi2jax.model import save
    g = tmp_path / "lin.oi"
    g.write_text("dynamic { x: f32[B, D]; }\nconstant { w: f32[O, D]; }\nvolatile { y: f32[B, O]; }\n"
                 "block entry {\n    op linear(x, w) >> y;\n    return;\n}\n")
    w = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    save(tmp_path / "lin.oinf", sizevars={"B": 4, "D": 8, "O": 3}, tensors={"w": w})
    write_export(g, tmp_path / "lin.jaxexport", model=tmp_path / "lin.oinf", ops=["nn"], symbolic=("B",))
    with jax.enable_x64(True):
        exp, state = _load_cacheless(tmp_path / "lin.jaxexport")
        for b in (1, 5):
            x = np.random.default_rng(b).standard_normal((b, 8)).astype(np.float32)
            _, out = exp.call(state, {"x": x})
            np.testing.assert_allclose(np.asarray(out["y"]), x.astype(np.float64) @ w.T.astype(np.float64),
                                       rtol=1e-5, atol=1e-6)


def test_softmax_with_a_valid_length_exports_with_a_symbolic_rows_dimension(tmp_path):
    """nn `softmax(x, valid=n)` over x [B, D] with B symbolic, `n` one value or one per row [B]:
    its row-shape check used NumPy's broadcast, which cannot compare a symbolic dimension, so the
    export failed with `its kernel raised TypeError: '_DimExpr' object cannot be interpreted as an
    integer`. Run at B = 2 and B = 5 against the masked softmax."""
    from oi2jax.model import save
    save(tmp_path / "sm.oinf", sizevars={"B": 3, "D": 6}, tensors={})
    for valid, decl in (("n", "n: i32;"), ("nv", "nv: i32[B];")):
        g = tmp_path / f"sm_{valid}.oi"
        g.write_text(f"dynamic {{ x: f32[B, D]; {decl} }}\nvolatile {{ y: f32[B, D]; }}\n"
                     f"block entry {{\n    op softmax(x, valid={valid}) >> y;\n    return;\n}}\n")
        art = tmp_path / f"sm_{valid}.jaxexport"
        write_export(g, art, model=tmp_path / "sm.oinf", ops=["nn"], symbolic=("B",))
        with jax.enable_x64(True):
            exp, state = _load_cacheless(art)
            for b in (2, 5):
                x = np.random.default_rng(b).standard_normal((b, 6)).astype(np.float32)
                k = np.array(4, np.int32) if valid == "n" else (np.arange(b, dtype=np.int32) % 6) + 1
                _, out = exp.call(state, {"x": x, valid: k})
                rows = np.broadcast_to(k, (b,))
                want = np.zeros((b, 6))
                for r in range(b):
                    e = np.exp(x[r, :rows[r]].astype(np.float64) - x[r, :rows[r]].max())
                    want[r, :rows[r]] = e / e.sum()
                np.testing.assert_allclose(np.asarray(out["y"]), want, rtol=1e-5, atol=1e-7)
    bad = tmp_path / "sm_bad.oi"  # a per-row valid that does not broadcast to the rows is still refused
    bad.write_text("dynamic { x: f32[B, D]; nv: i32[D]; }\nvolatile { y: f32[B, D]; }\n"
                   "block entry {\n    op softmax(x, valid=nv) >> y;\n    return;\n}\n")
    with pytest.raises(OiError, match="valid has shape \\[6\\], which does not broadcast to the rows"):
        write_export(bad, tmp_path / "bad.jaxexport", model=tmp_path / "sm.oinf", ops=["nn"], symbolic=("B",))


def test_an_artifact_for_a_cpu_and_a_gpu_adds_in_order_on_the_cpu(tmp_path):
    """A float sum_axis adds in row-major order on a CPU (SPEC §6.4); an artifact exported for
    cpu and cuda chose the accelerator's reduce for both (the review of 2026-11-28), so run on a
    CPU it gave [2^24, 1 x 63] as 2^24 + 32. The form is chosen per platform at lowering now."""
    g = tmp_path / "s.oi"
    g.write_text("dynamic { x: f32[64]; }\nvolatile { s: f32; }\nblock entry { op sum_axis(x, axes=[0]) >> s; return; }\n")
    x = np.ones(64, np.float32)
    x[0] = 2 ** 24
    write_export(g, tmp_path / "s.jaxexport", model=False, platforms=("cpu", "cuda"))
    with jax.enable_x64(True):
        exp, state = _load_cacheless(tmp_path / "s.jaxexport")
        _, out = exp.call(state, {"x": x})
    assert np.asarray(out["s"]) == np.float32(2 ** 24)


def _load_cacheless(artifact):
    """An artifact of a graph without caches and its initial state, read as a plain JAX user would
    (the manifest's npz keys; no oi2jax)."""
    exp = jax.export.deserialize(bytearray(artifact.read_bytes()))
    man = json.loads(artifact.with_name(artifact.name + ".json").read_text())
    npz = np.load(artifact.parent / man["init_npz"])
    st = man["state"]
    return exp, {"vars": {v["name"]: npz[v["npz_key"]] for v in st["vars"]}, "caches": {},
                 "guards": {k: npz[st["guards"][k]["npz_key"]] for k in ("err", "errval", "grow")}}


def test_the_manifest_records_the_table_dtype_it_was_exported_with(tmp_path):
    """Emit probe 8: with --table-dtype f16 the manifest gave K's dsl_dtype as f16 (the graph
    declares f32) and no key said why."""
    art = tmp_path / "k.jaxexport"
    write_export(str(EXAMPLES / "kv_cache_decode.oi"), str(art), table_dtype="f16")
    man = json.loads((tmp_path / "k.jaxexport.json").read_text())
    assert man["table_dtype"] == "f16"
    assert {c["name"]: c["dsl_dtype"] for c in man["state"]["caches"]}["K"] == "f16"


def test_an_unknown_symbolic_size_gets_a_suggestion():
    """Emit probe 9: `--symbolic b` listed the sizes without the close one."""
    with pytest.raises(OiError, match=r"--symbolic b: not a size variable of the graph/model \(did you mean B\?\)"):
        write_export(str(EXAMPLES / "mlp_regression.oi"), "/nonexistent/never-written", symbolic=["b"])


def test_a_symbolic_size_in_a_list_setting_is_refused_at_its_node(tmp_path, capsys):
    """Emit probe 5 (what was left): `positions(s, shape=[B])` with B symbolic said "the lowering
    needs a concrete value there" without saying where; the node is named now."""
    g = tmp_path / "pos.oi"
    g.write_text("dynamic { s: i32; }\nvolatile { p: i32[B]; }\nblock entry {\n    op positions(s, shape=[B]) >> p;\n"
                 "    return;\n}\n")
    out = tmp_path / "pos.jaxexport"
    rc = main(["export", str(g), "--no-model", "--size", "B=4", "--ops", "nn", "--symbolic", "B", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith(f"{g}:4:5: error: cannot lower this node with a symbolic size: it needs a "
                                      f"concrete value there ("), err
    assert "export without --symbolic or use --size" in err and not out.exists()


BF16_F8 = """\
dynamic { a: bf16[N] @init(0.25); }
volatile { y: f32[N]; }
persistent {
    acc: bf16[N] @init(1.5);
    t: i32 @init(0);
    K(i): f8[N] @table @fixed(i=3);
}
block entry {
    assign s: bf16[N];
    cache.read acc >> s;
    op add(s, a) >> s;
    cache.write s >> acc;
    op cast(s, to=f32) >> y;
    assign e: f8[N];
    op cast(s, to=f8) >> e;
    cache.write e >> K[t];
    cache.increment t;
    return;
}
"""


def test_bf16_and_f8_buffers_of_the_npz_load_with_the_documented_loader(tmp_path):
    """Export probe: NumPy's .npy has no bfloat16/float8: the loader docs/ecosystem.md printed
    handed JAX a bf16 input or state as raw `|V2` records (`exp.call` raised TypeError: every
    artifact of a bf16 graph, or of `--table-dtype bf16`) and np.load refused an f8 buffer's
    `<f1` header. The .npz holds them as their bits; the loader views each as its manifest dtype."""
    g = tmp_path / "bf.oi"
    g.write_text(BF16_F8)
    art = tmp_path / "bf" / "step.jaxexport"
    assert main(["export", str(g), "--no-model", "--size", "N=4", "-o", str(art)]) == 0
    man = json.loads((tmp_path / "bf" / "step.jaxexport.json").read_text())
    assert man["inputs"][0]["dtype"] == "bfloat16"
    assert {v["name"]: v["dtype"] for v in man["state"]["vars"]}["acc"] == "bfloat16"
    assert man["state"]["caches"][0]["data"]["dtype"] == "float8_e5m2"
    job = {"artifact": str(art), "steps": 3, "inputs": None, "result": str(tmp_path / "res.npz")}
    proc = subprocess.run([sys.executable, "-c", LOADER, json.dumps([job])], capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(job["result"])
    # acc = 1.5 + k * 0.25 in bf16 (exact); K holds each step's sum encoded as f8 (E5M2, 2 mantissa
    # bits, SPEC §5.4: ties away from zero): 1.75 -> 1.75, 2.0 -> 2.0, 2.25 -> 2.5
    np.testing.assert_array_equal(got["out.y"], np.full(4, 2.25, np.float32))
    np.testing.assert_array_equal(got["state.vars.acc"], np.full(4, 2.25, np.float32))
    np.testing.assert_array_equal(got["state.caches.K.data"], np.repeat([[1.75], [2.0], [2.5]], 4, axis=1).astype(np.float32))
    want = api.compile(str(g), model=False, sizes={"N": 4}).run({}, steps=3)
    np.testing.assert_array_equal(got["out.y"], want["y"])


def test_a_kernel_calling_back_into_python_is_refused_at_its_node(tmp_path, capsys):
    """Export probe: a user op whose kernel uses jax.pure_callback made `oi2jax export` say
    `error: internal error (NotImplementedError: serialization of host_callbacks is not yet
    implemented)`, as if oi2jax had crashed. It is a user error now, at the node that holds it."""
    ops = tmp_path / "cb_ops.py"
    ops.write_text(textwrap.dedent('''
        import jax, numpy as np
        from oi2jax.ops import op

        @op(inputs={"x": "float"}, elementwise=True)
        def host_sin(x):
            """sin, computed on the host."""
            return jax.pure_callback(lambda a: np.sin(a).astype(a.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    '''))
    g = tmp_path / "cb.oi"
    g.write_text("dynamic { x: f32[N]; }\nvolatile { y: f32[N]; z: f32[N]; }\nblock entry {\n"
                 "    op relu(x) >> z;\n    op host_sin(z) >> y;\n    return;\n}\n")
    out = tmp_path / "out" / "cb.jaxexport"
    rc = main(["export", str(g), "--no-model", "--size", "N=4", "--ops", str(ops), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.startswith(f"{g}:5:5: error: cannot export: this node's kernel calls back into Python "
                          "(jax.pure_callback, io_callback, jax.debug.print/callback), which jax.export cannot "
                          "serialize; run the graph with `oi2jax run` instead\n"), err
    assert "    op host_sin(z) >> y;" in err and "internal error" not in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    # with N symbolic the callback does not even lower ("std::bad_cast"), which was blamed on N
    rc = main(["export", str(g), "--no-model", "--size", "N=4", "--ops", str(ops), "-o", str(out), "--symbolic", "N"])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith(f"{g}:5:5: error: cannot export: this node's kernel calls back into Python"), err
    assert "symbolic" not in err and not (tmp_path / "out").exists()
    # the same graph runs: the op itself is fine
    prog = api.compile(str(g), model=False, sizes={"N": 4}, ops=[str(ops)])
    x = np.array([-1.0, 0.5, 1.0, 2.0], np.float32)
    np.testing.assert_allclose(prog.run({"x": x})["y"], np.sin(np.maximum(x, 0)), rtol=1e-6)


def test_python_platforms_and_symbolic_take_a_comma_separated_string(tmp_path):
    """Export probe: `write_export(..., platforms="cpu")` iterated the string and refused platform
    'c'; `symbolic="Bx"` was read as B and x ("--symbolic x: not a size variable"), `"B,T"` as
    B, "," and T. A string is one comma-separated list, as on the command line."""
    art = tmp_path / "m.jaxexport"
    write_export(str(EXAMPLES / "mlp_regression.oi"), str(art), platforms="cpu,cuda", symbolic="B")
    man = json.loads((tmp_path / "m.jaxexport.json").read_text())
    assert man["platforms"] == ["cpu", "cuda"] and man["symbolic"] == ["B"] and man["sizes"]["B"] == "symbolic"
    write_export(str(EXAMPLES / "mlp_regression.oi"), str(art), platforms="cpu")
    assert json.loads((tmp_path / "m.jaxexport.json").read_text())["platforms"] == ["cpu"]
    with pytest.raises(OiError, match=r"--symbolic Bx: not a size variable of the graph/model \(did you mean B\?\)"):
        write_export(str(EXAMPLES / "mlp_regression.oi"), str(tmp_path / "never"), symbolic="Bx")
    with pytest.raises(OiError, match=r"cannot export with symbolic B, D: constant w1 has a dim in D"):
        write_export(str(EXAMPLES / "mlp_regression.oi"), str(tmp_path / "never"), symbolic="B,D")
    assert not (tmp_path / "never").exists()


def test_write_export_never_overwrites_its_graph_or_model(tmp_path):
    """Export probe: `oi2jax export -o` refused an output naming the graph or the model, but
    `write_export` in Python wrote the artifact over `g.oi` itself (or the manifest over a graph
    JSON `x.jaxexport.json`, or the artifact over the model). Each is an OiError now, before
    anything is written."""
    g, m = tmp_path / "g.oi", tmp_path / "g.oinf"
    shutil.copy(EXAMPLES / "mlp_regression.oi", g)
    shutil.copy(EXAMPLES / "mlp_regression.oinf", m)
    before = {p: p.read_bytes() for p in (g, m)}
    for output, what in ((g, "graph"), (m, "model"), (tmp_path / "g", None)):
        if what is None:  # the model is found beside g.oi; "g" + ".json"/".init.npz" names neither
            assert write_export(str(g), str(output)) == [str(output), f"{output}.json", f"{output}.init.npz"]
            continue
        with pytest.raises(OiError, match=f"output {output} is the {what}: writing it would destroy the input"):
            write_export(str(g), str(output))
    assert {p: p.read_bytes() for p in (g, m)} == before
    gj = tmp_path / "x.jaxexport.json"  # a graph JSON whose name is the manifest of -o x.jaxexport
    assert main(["compile", str(g), "--emit", "graph-json", "-o", str(gj)]) == 0
    text = gj.read_text()
    with pytest.raises(OiError, match=r"output .*x\.jaxexport\.json is the graph"):
        write_export(str(gj), str(tmp_path / "x.jaxexport"), model=str(m))
    assert gj.read_text() == text and not (tmp_path / "x.jaxexport").exists()
