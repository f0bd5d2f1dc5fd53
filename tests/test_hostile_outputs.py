"""Issue 41 item 4: every written output (convert-hf -o, run --out / --state-out / --trace-json,
export -o, fmt -i, graph -o) refuses a target that exists and is not a regular file -- a
character device, a FIFO, a symbolic link to one -- as `cp` and editors do: `error: PATH: not a
regular file (...)`, exit 1, the node left as it was, no temporary file left behind. A symbolic
link to a regular file is followed: the file is replaced, the link kept."""
from __future__ import annotations

import importlib.util
import os
import stat

import pytest

from oi2jax.npz import NotRegularFileError, write_text_atomic

from conftest import EXAMPLES, run_cli

GRAPH = """persistent { acc: f32[2] @init(0.0); }
volatile { y: f32[2]; }
block entry {
    cache.read acc >> y;
    cache.write y >> acc;
    return;
}
"""
ROOT = os.geteuid() == 0


def _char_device(path):
    """A copy of /dev/null's node (character device 1:3) at `path`."""
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return path


def _fifo(path):
    os.mkfifo(path)
    return path


def _link_to_char_device(path):
    os.symlink(_char_device(path.with_name(path.name + ".dev")), path)
    return path


KINDS = {
    "char": (_char_device, "a character device", stat.S_ISCHR),
    "fifo": (_fifo, "a FIFO", stat.S_ISFIFO),
    "link": (_link_to_char_device, "a character device", stat.S_ISCHR),
}
NEEDS_ROOT = {"char", "link"}  # mknod of a device node


def _make(kind, path):
    if kind in NEEDS_ROOT and not ROOT:
        pytest.skip("mknod of a character device needs root")
    make, words, _ = KINDS[kind]
    return make(path), words


def _untouched(kind, path):
    """The node is what it was and nothing was left beside it."""
    assert KINDS[kind][2](os.stat(path).st_mode), f"{path} was replaced"
    leftovers = [p.name for p in path.parent.iterdir() if p.name.startswith(".oi2jax-")]
    assert leftovers == []


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("llama_checkpoint", EXAMPLES / "llama_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_random_llama(tmp_path_factory.mktemp("hostile") / "ck", vocab=16, hidden=8, layers=1,
                                     heads=2, kv_heads=1, intermediate=8, max_positions=8)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_convert_hf_refuses_a_non_regular_output(capsys, tmp_path, checkpoint, kind):
    out, words = _make(kind, tmp_path / "model.oinf")
    code, _, err = run_cli(capsys, "convert-hf", checkpoint, "-o", out, "--quiet")
    assert code == 1
    assert err.strip() == f"error: {out}: not a regular file ({words}); refusing to replace it"
    _untouched(kind, out)


def test_convert_hf_into_a_missing_directory_is_named(capsys, tmp_path, checkpoint):
    out = tmp_path / "no" / "model.oinf"
    code, _, err = run_cli(capsys, "convert-hf", checkpoint, "-o", out, "--quiet")
    assert (code, err) == (1, f"error: {out}: no such directory: {out.parent}\n")  # not the OSError's repr


@pytest.mark.parametrize("flag", ["--out", "--state-out", "--trace-json"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_run_refuses_a_non_regular_output_before_running(capsys, tmp_path, kind, flag):
    graph = tmp_path / "g.oi"
    graph.write_text(GRAPH)
    out, words = _make(kind, tmp_path / "o.npz")
    code, _, err = run_cli(capsys, "run", graph, flag, out, "--quiet")
    assert code == 1
    assert err.strip() == f"error: {out}: not a regular file ({words}); refusing to replace it"
    _untouched(kind, out)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_export_refuses_a_non_regular_output(capsys, tmp_path, kind):
    graph = tmp_path / "g.oi"
    graph.write_text(GRAPH)
    out, words = _make(kind, tmp_path / "g.jaxexport")
    code, _, err = run_cli(capsys, "export", graph, "-o", out)
    assert code == 1
    assert err.strip() == f"error: {out}: not a regular file ({words}); refusing to replace it"
    _untouched(kind, out)
    assert not out.with_name(out.name + ".json").exists()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fmt_in_place_refuses_a_non_regular_graph_without_reading_it(capsys, tmp_path, kind):
    graph, words = _make(kind, tmp_path / "g.oi")  # a FIFO read would block: refused before
    code, _, err = run_cli(capsys, "fmt", "-i", graph)
    assert code == 1
    assert err.strip() == f"error: {graph}: not a regular file ({words}); refusing to replace it"
    _untouched(kind, graph)


def test_graph_output_refuses_a_fifo(capsys, tmp_path):
    graph = tmp_path / "g.oi"
    graph.write_text(GRAPH)
    out = _fifo(tmp_path / "cfg.dot")
    code, _, err = run_cli(capsys, "graph", graph, "-o", out)
    assert code == 1 and err.strip() == f"error: {out}: not a regular file (a FIFO); refusing to replace it"
    _untouched("fifo", out)


def test_a_link_to_a_regular_file_is_followed_and_kept(capsys, tmp_path):
    real = tmp_path / "real.oi"
    real.write_text("block   entry { return; }\n")
    link = tmp_path / "link.oi"
    os.symlink(real, link)
    code, _, err = run_cli(capsys, "fmt", "-i", link)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "block entry {\n    return;\n}\n"


def test_the_writer_raises_a_typed_error(tmp_path):
    fifo = _fifo(tmp_path / "f")
    with pytest.raises(NotRegularFileError) as info:
        write_text_atomic(fifo, "x")
    assert info.value.filename == str(fifo)
    _untouched("fifo", fifo)


@pytest.mark.parametrize("target", ["missing.txt", "nodir/missing.txt"])
def test_a_link_to_a_missing_file_is_not_written_through(capsys, tmp_path, target):
    """A dangling link names a file the user never named, elsewhere: `cp` refuses to write through
    it, and so does every output here (before this, `compile -o` created the missing target)."""
    graph = tmp_path / "g.oi"
    graph.write_text(GRAPH)
    link = tmp_path / "out.txt"
    os.symlink(tmp_path / target, link)
    code, out, err = run_cli(capsys, "compile", graph, "--emit", "jaxpr", "-o", link)
    assert code == 1 and out == ""
    assert err.strip() == (f"error: {link}: a symbolic link to a missing file ({tmp_path / target}); refusing "
                           f"to write through it (remove the link or create the file)")
    assert os.readlink(link) == str(tmp_path / target) and not os.path.lexists(tmp_path / target)
    assert sorted(os.listdir(tmp_path)) == ["g.oi", "out.txt"]


@pytest.mark.parametrize("loop", ["self", "pair"])
def test_a_loop_of_symbolic_links_is_not_replaced(capsys, tmp_path, loop):
    """A link that names itself (or a pair naming each other) resolves to no file: `cp` refuses it
    (`Too many levels of symbolic links`); `compile -o` replaced the link with a regular file at
    exit 0, and so did every other output (the same writer)."""
    graph = tmp_path / "g.oi"
    graph.write_text(GRAPH)
    link = tmp_path / "out.txt"
    if loop == "self":
        os.symlink(link, link)
    else:
        os.symlink(tmp_path / "other.txt", link)
        os.symlink(link, tmp_path / "other.txt")
    code, out, err = run_cli(capsys, "compile", graph, "--emit", "jaxpr", "-o", link)
    assert code == 1 and out == ""
    assert err.strip() == (f"error: {link}: a loop of symbolic links (too many levels of symbolic links); "
                           f"refusing to replace it")
    assert link.is_symlink() and not [p for p in os.listdir(tmp_path) if p.startswith(".oi2jax-")]
    with pytest.raises(NotRegularFileError):
        write_text_atomic(link, "x")
    assert link.is_symlink()


def test_an_output_below_a_regular_file_says_not_a_directory(tmp_path):
    """Emit probe 9: `-o afile/x/out.txt` (afile a regular file) said "no such directory"."""
    (tmp_path / "afile").write_text("keep")
    with pytest.raises(NotADirectoryError, match=rf"not a directory: {tmp_path / 'afile'} \(a file, where the "
                                                 r"path needs a directory\)"):
        write_text_atomic(tmp_path / "afile" / "x" / "out.txt", "text")
    assert (tmp_path / "afile").read_text() == "keep"
    with pytest.raises(FileNotFoundError, match="no such directory"):
        write_text_atomic(tmp_path / "missing" / "out.txt", "text")


@pytest.mark.parametrize("argv", [["compile", str(EXAMPLES / "mlp_regression.oi"), "-o", "-"],
                                  ["run", str(EXAMPLES / "mlp_regression.oi"), "--out", "-"]])
def test_a_dash_output_is_not_a_file_named_dash(tmp_path, capsys, monkeypatch, argv):
    """Emit probe 9: `-o -` wrote a file named '-' in the working directory (exit 0), where '-'
    means standard output to most tools."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, *argv)
    flag = argv[-2]
    assert code == 1 and err.strip().endswith(
        f"error: {flag} -: this would write a file named '-', not standard output; leave out {flag} to print "
        f"(where the command prints), or give ./- for a file of that name"), err
    assert not (tmp_path / "-").exists()
