"""Issue 33: one `Program` protocol that the compiled and the interpreted program both implement,
a frozen `CompileOptions` handed to their constructors (api.compile sets nothing on a built
program), the loaders in the pipeline (re-exported by the facade), and a program that rebinds
itself at other sizes without the front end."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import oi2jax
from oi2jax import api, pipeline
from oi2jax.diagnostics import OiError
from oi2jax.interpret import InterpretedProgram
from oi2jax.protocol import CompileOptions, Program as ProgramProtocol
from oi2jax.runtime.program import Program

from conftest import EXAMPLES

MLP = EXAMPLES / "mlp_regression.oi"


def test_both_backends_implement_the_protocol():
    compiled = oi2jax.compile(MLP)
    interpreted = oi2jax.compile(MLP, mode="interpret")
    assert isinstance(compiled, Program) and isinstance(interpreted, InterpretedProgram)
    for prog, mode, batched in ((compiled, "compiled", True), (interpreted, "interpret", False)):
        assert isinstance(prog, ProgramProtocol)
        assert prog.mode == mode and prog.supports_batched is batched
        assert isinstance(prog.options, CompileOptions) and isinstance(prog.compile_log, list)
        assert prog.model_path == str(EXAMPLES / "mlp_regression.oinf")
    with pytest.raises(OiError, match="run_batched needs a compiled program"):
        interpreted.run_batched({}, batch_var="B")
    # collect, feedback and stop: one set of rules (run_rules.py), the same refusals word for word
    x = np.ones((4, 16), np.float32)
    for kw in ({"collect": ["yy"]}, {"feedback": {"x": "y"}}, {"stop": {"y": [1]}}, {"feedback": {"y": "x"}}):
        messages = []
        for run in (compiled.session().run, interpreted.run):
            with pytest.raises(OiError) as err:
                run({"x": x}, **kw)
            messages.append(str(err.value))
        assert messages[0] == messages[1] and messages[0].startswith(f"error: {next(iter(kw))}"), messages


def test_compile_options_reach_the_constructor_frozen():
    prog = oi2jax.compile(MLP, precision="high", unroll="none", yield_mode="fused")
    assert prog.options == CompileOptions(precision="high", unroll="none", yield_mode="fused")
    assert (prog.precision, prog.unroll) == ("high", "none")
    with pytest.raises(dataclasses.FrozenInstanceError):
        prog.options.precision = "default"
    bound = pipeline.bound(MLP)
    assert Program(bound, CompileOptions(precision="default")).precision == "default"
    assert Program(bound).options == CompileOptions()  # api.compile's defaults


def test_loaders_live_in_the_pipeline_and_the_facade_reexports_them():
    assert api.load_graph is pipeline.load_graph and api.load_model is pipeline.load_model
    assert api.load_graph_json is pipeline.load_graph_json
    assert pipeline.load_graph(MLP).path == str(MLP)


def test_a_program_rebinds_itself_at_other_sizes():
    prog = oi2jax.compile(MLP)
    sizes = {**prog.bound.sizes, "B": 1}
    tail = prog.rebound(sizes)  # no front end: the bound graph rebinds itself (check.resize: the size rules only)
    assert isinstance(tail, Program) and tail.bound.sizes["B"] == 1 and tail.bound.shape("x")[0] == 1
    assert tail.bound.checked.ops is prog.bound.checked.ops and tail.bound.model is prog.bound.model
    assert tail.bound.checked.yield_phases is prog.bound.checked.yield_phases  # kept, not checked again
    x = np.ones((1,) + tuple(prog.bound.shape("x")[1:]), np.float32)
    np.testing.assert_array_equal(tail.run({"x": x})["y"], oi2jax.compile(MLP, sizes={"B": 1}).run({"x": x})["y"])


def _buffers(prog) -> dict:
    """Each placed constant's buffer address(es), by key."""
    import jax
    return {k: tuple(a.unsafe_buffer_pointer() for a in jax.tree.leaves(v)) for k, v in prog.executable.consts.items()}


@pytest.mark.parametrize("graph, unroll", [(MLP, "auto"), (EXAMPLES / "residual_mlp_stack.oi", "full"),
                                           (EXAMPLES / "residual_mlp_stack.oi", "none")])
def test_a_rebound_program_shares_the_placed_model(graph, unroll):
    """A program rebound at other sizes (a prompt bucket, a chunked run's tail) takes its source's
    placed constants -- the same buffers, not a second copy of the model -- where they are the
    same tensor at the same shape: plain constants, a family held member by member (unrolled) or
    stacked (a loop), and gives what a program compiled at those sizes gives."""
    prog = oi2jax.compile(graph, unroll=unroll)
    tail = prog.rebound({**prog.bound.sizes, "B": 1})
    ours, theirs = _buffers(prog), _buffers(tail)
    assert ours and theirs == ours
    x = np.linspace(-1, 1, int(np.prod(tail.bound.shape("x"))), dtype=np.float32).reshape(tail.bound.shape("x"))
    fresh = oi2jax.compile(graph, sizes={"B": 1}, unroll=unroll)
    assert not set(_buffers(fresh).values()) & set(ours.values())  # compiled apart: its own copy
    np.testing.assert_array_equal(tail.run({"x": x})["y"], fresh.run({"x": x})["y"])


def test_a_constant_whose_shape_follows_a_size_is_not_shared(tmp_path):
    g = tmp_path / "g.oi"
    g.write_text("dynamic { x: f32[B]; }\nconstant { w: f32[B] @init(2.0); v: f32[4] @init(3.0); }\n"
                 "volatile { y: f32[B]; z: f32[4]; }\n"
                 "block entry {\n    op mul(x, w) >> y;\n    op add(v, v) >> z;\n    return;\n}\n")
    prog = oi2jax.compile(g, sizes={"B": 3})
    tail = prog.rebound({"B": 5})
    ours, theirs = _buffers(prog), _buffers(tail)
    assert theirs["v"] == ours["v"] and theirs["w"] != ours["w"]  # v: the same [4]; w: [3] there, [5] here
    out = tail.run({"x": np.arange(5, dtype=np.float32)})
    np.testing.assert_array_equal(out["y"], 2 * np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(out["z"], np.full(4, 6, np.float32))


def test_constants_are_placed_one_at_a_time_and_a_shared_tensor_once(tmp_path, monkeypatch):
    """On one device each constant is placed as soon as it is read and its host copy dropped
    before the next is read (the host never holds the whole model beside the device's copy), and
    two constants bound to one model tensor (a tied embedding's names) are one read and one buffer."""
    from oi2jax.runtime import placement
    g = tmp_path / "g.oi"
    g.write_text((EXAMPLES / "mlp_regression.oi").read_text().replace(
        "w2: f32[H, O];", 'w2: f32[H, O];\n    again: f32[D, H] @ref("w1");'))
    held, real = [], placement.Placer.put

    def put(self, role, values, names=None, sources=None):
        if role == "consts":
            held.append((sorted(values), len(bound_model[0].held)))
        return real(self, role, values, names, sources)
    bound_model = []
    real_bound = pipeline.bound

    def bound(*a, **kw):
        b = real_bound(*a, **kw)
        bound_model.append(b.model)
        return b
    monkeypatch.setattr(placement.Placer, "put", put)
    monkeypatch.setattr(api, "bound", bound, raising=False)
    monkeypatch.setattr(pipeline, "bound", bound)
    prog = oi2jax.compile(g, model=EXAMPLES / "mlp_regression.oinf")
    each = [keys for keys, _ in held[:-1]]  # the last call: every value, placed already
    assert sorted(k for keys in each for k in keys) == ["b1", "b2", "w1", "w2"] and all(len(k) == 1 for k in each)
    assert all(n <= 1 for _, n in held)  # at most the tensor being placed is held on the host
    assert _buffers(prog)["again"] == _buffers(prog)["w1"]
    assert not bound_model[0].held  # nothing left on the host
    x = np.ones(tuple(prog.bound.shape("x")), np.float32)
    np.testing.assert_array_equal(prog.run({"x": x})["y"], oi2jax.compile(MLP).run({"x": x})["y"])


def test_compile_names_a_mistaken_graph_or_model_argument():
    """(helper probe) a path without its `.oi` was parsed as program text (`expected memory section
    or block, got name 'examples'`), bytes as "b'...'", and `model=True` raised a TypeError."""
    stem = str(EXAMPLES / "mlp_regression")
    with pytest.raises(OiError, match=rf"^error: graph file not found: {re.escape(stem)} \(did you mean "
                                      rf"{re.escape(stem)}\.oi\?\); program text holds memory sections and blocks$"):
        oi2jax.compile(stem)
    with pytest.raises(OiError, match="graph: expected program text, a path or a graph-JSON dict, got bytes"):
        oi2jax.compile(MLP.read_bytes())
    with pytest.raises(OiError, match="model: expected a path, a Model, None or False, got True"):
        oi2jax.compile(MLP, model=True)


def test_the_interpreter_names_what_only_a_compiled_program_has():
    """Probe (runtime) 4: `session()`, `init_state()`, `check`, `batch` of an interpreted program
    were AttributeErrors; its `step({...})` dropped an unknown input name (the step ran with the
    default) and took a wrong shape to a TypeError inside an op."""
    interpreted = oi2jax.compile(MLP, mode="interpret")
    for name in ("session", "init_state", "check", "batch", "apply", "export_state", "emit"):
        with pytest.raises(OiError, match=rf'^error: {name} needs a compiled program \(mode="compiled"\); the '
                                          r"interpreter runs whole runs: run\(inputs, steps, collect=, feedback=, "
                                          r"stop=\), then step\(inputs\) to go on"):
            getattr(interpreted, name)
    assert getattr(interpreted, "mesh", None) is None and not hasattr(interpreted, "session")
    x = np.ones((4, 16), np.float32)
    first = interpreted.run({"x": x})["y"]
    with pytest.raises(OiError, match=r"^error: unknown input xx \(did you mean x\?\)"):
        interpreted.step({"xx": x})
    with pytest.raises(OiError, match=r"^error: input x: expected shape \[4, 16\], got \[3\]"):
        interpreted.step({"x": np.ones(3, np.float32)})
    interpreted.step({"x": x})
    np.testing.assert_array_equal(interpreted.outputs()["y"], first)
