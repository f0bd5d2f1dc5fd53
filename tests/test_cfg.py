"""`oi2jax graph`: control-flow pictures in DOT (SVG/PNG through Graphviz) (issue 11, part 3)."""
from __future__ import annotations

import re
import shutil

import pytest

from oi2jax import cfg
from oi2jax.cli import main
from oi2jax.diagnostics import OiError
from oi2jax.grammar.parse import parse, parse_file

from conftest import EXAMPLES

HAVE_DOT = shutil.which("dot") is not None
MISSING = "needs Graphviz's `dot`, which is not installed; install the `graphviz` package"


def _dot(name, sizes=None):
    return cfg.to_dot(parse_file(str(EXAMPLES / f"{name}.oi")), sizes)


def _edges(text):
    return re.findall(r'^\s*("[^"]+") -> ("[^"]+")(?: \[(.*)\])?;$', text, re.M)


def test_blocks_are_clusters_and_branches_are_labelled():
    text = _dot("stability_guard")
    for block in ("entry", "ok", "bad"):
        assert f'subgraph "cluster:{block}"' in text
    edges = _edges(text)
    branch_edges = {(a, b): attrs for a, b, attrs in edges if b in ('"block:ok"', '"block:bad"')}
    assert 'label="cond"' in branch_edges[('"entry:1"', '"block:ok"')]
    assert 'label="not cond"' in branch_edges[('"entry:1"', '"block:bad"')]
    assert '[shape="diamond", label="1: branch cond ok bad"]' in text
    # call semantics: each target returns to the node after the branch
    returns = [(a, b) for a, b, attrs in edges if 'label="return"' in (attrs or "")]
    assert sorted(returns) == [('"bad:6"', '"entry:2"'), ('"ok:4"', '"entry:2"')]


def test_loops_show_bounds_and_back_edges():
    text = _dot("residual_mlp_stack", {"num_layers": 3})
    assert "loop layers (l in 0..num_layers=3)" in text
    assert 'subgraph "cluster:entry:loop:5"' in text
    edges = _edges(text)
    assert ('"entry:5"', '"entry:1"', 'label="iterate"') in edges
    assert any(a == '"entry:4"' and b == '"entry:5"' and "next l" in attrs for a, b, attrs in edges)
    assert "loop layers (l in 0..num_layers)" in _dot("residual_mlp_stack")  # without sizes: as written


def test_yield_await_edges_between_entry_and_consumers():
    text = _dot("streaming_pipeline")
    edges = _edges(text)
    yields = {b for a, b, attrs in edges if a == '"entry:1"' and 'label="yield x"' in (attrs or "")}
    assert yields == {'"block:writer"', '"block:reader"'}
    awaits = {a for a, b, attrs in edges if b == '"entry:3"' and 'label="await x"' in (attrs or "")}
    assert awaits == {'"writer:7"', '"reader:10"'}


def test_cache_reads_and_writes_are_marked():
    text = _dot("kv_cache_decode")
    assert '"entry:1" [style="filled", fillcolor="orange", label="[W] 1: cache.write q >> K[t]"]' in text
    assert 'fillcolor="lightblue", label="[R] 3: cache.read K[] >> k_hist"' in text
    assert '[cache] 2: cache.increment t' in text


def test_every_example_draws_and_quotes_safely():
    for path in sorted(EXAMPLES.glob("*.oi")):
        text = cfg.to_dot(parse_file(str(path)))
        assert text.startswith("digraph cfg {") and text.rstrip().endswith("}")
        assert text.count("{") == text.count("}")
    g = parse('dynamic { x: f32[2]; }\nblock entry { op fill(x, value=1.0) >> x; branch nowhere; return; }')
    text = cfg.to_dot(g)
    assert 'label="unknown block nowhere"' in text


def test_cli_dot_on_stdout_and_to_file(tmp_path, capsys):
    assert main(["graph", str(EXAMPLES / "stability_guard.oi")]) == 0
    out = capsys.readouterr().out
    assert out == _dot("stability_guard", parse_sizes())
    assert main(["graph", str(EXAMPLES / "stability_guard.oi"), "-o", str(tmp_path / "g.dot")]) == 0
    assert (tmp_path / "g.dot").read_text() == out
    assert main(["graph", str(EXAMPLES / "stability_guard.oi"), "-o", str(tmp_path / "g.jpg")]) == 1
    assert "cannot tell the picture format" in capsys.readouterr().err


def parse_sizes():
    from oi2jax.model import open_model
    return open_model(str(EXAMPLES / "stability_guard.oinf")).sizevars


@pytest.mark.parametrize("fmt", ["svg", "png"])
def test_cli_svg_png_with_graphviz_or_clear_error(tmp_path, capsys, fmt):
    target = tmp_path / f"cfg.{fmt}"
    rc = main(["graph", str(EXAMPLES / "residual_mlp_stack.oi"), "-o", str(target)])
    if HAVE_DOT:
        assert rc == 0
        data = target.read_bytes()
        assert (b"<svg" in data and b"block entry" in data) if fmt == "svg" else data[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert rc == 1 and MISSING in capsys.readouterr().err and not target.exists()


def test_missing_graphviz_message(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cfg.shutil, "which", lambda name: None)
    with pytest.raises(OiError, match=re.escape(MISSING)):
        cfg.render("digraph { a -> b }", "svg")
    rc = main(["graph", str(EXAMPLES / "mlp_regression.oi"), "-o", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    note = f"note: using model {EXAMPLES / 'mlp_regression.oinf'} (beside the graph)\n"
    assert rc == 1 and err.startswith(note + "error: ") and "apt-get install graphviz" in err and "Traceback" not in err


def test_cli_an_unknown_size_is_an_error_as_for_check(tmp_path, capsys):
    """`graph --size Q=3` (a name neither the graph nor its model knows: a typo) was drawn at exit 0
    with the size dropped, where check, run and compile refuse it; a known one labels the loop."""
    g = EXAMPLES / "residual_mlp_stack.oi"
    assert main(["graph", str(g), "--size", "num_layer=5", "-o", str(tmp_path / "g.dot")]) == 1
    err = capsys.readouterr().err
    assert "error: unknown size num_layer (did you mean num_layers?)" in err and "Traceback" not in err
    assert not (tmp_path / "g.dot").exists()
    assert main(["graph", str(g), "--no-model", "--size", "num_layers=5"]) == 0
    assert "loop layers (l in 0..num_layers=5)" in capsys.readouterr().out


def test_node_ids_of_two_blocks_never_meet():
    """Emit probe 9: ids joined by '_' made block x_5's box and node 5 of block block_x one DOT
    node, `block_x_5`; joined by ':' (no block name holds one) they stay two."""
    g = parse("dynamic { x: f32[2]; }\nblock entry { branch x_5; branch block_x; return; }\n"
              "block x_5 { return; }\n"
              "block block_x { op abs(x) >> x; op abs(x) >> x; op abs(x) >> x; op abs(x) >> x; op abs(x) >> x;\n"
              "    op abs(x) >> x; return; }\n")
    text = cfg.to_dot(g, {})
    declared = re.findall(r'^\s*("[^"]+") \[', text, re.M)
    assert len(declared) == len(set(declared)) and '"block:x_5"' in declared and '"block_x:5"' in declared


def test_cli_an_invalid_graph_is_its_errors_not_a_picture(tmp_path, capsys):
    """`graph` drew a graph `check` refuses (a branch to a missing block, a duplicate declaration)
    at exit 0 with nothing said (frontend probe); now its errors, as `check` prints them, exit 1,
    nothing written. A warning (a block never run) is printed and the picture drawn."""
    bad = tmp_path / "bad.oi"
    bad.write_text("dynamic { c: bool; }\nblock entry {\n    branch c a b;\n    return;\n}\nblock a { return; }\n")
    assert main(["graph", str(bad), "--no-model", "-o", str(tmp_path / "g.dot")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == (f"{bad}:3:16: error: branch target block not found: b\n"
                                 "        branch c a b;\n                   ^\n")
    assert not (tmp_path / "g.dot").exists()
    dead = tmp_path / "dead.oi"
    dead.write_text("block entry { return; }\nblock unused { return; }\n")
    assert main(["graph", str(dead), "--no-model"]) == 0
    out, err = capsys.readouterr()
    assert "warning: block unused is never run" in err and '"block:unused"' in out
