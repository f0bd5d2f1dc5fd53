"""Outputs, state files and sizes under mistakes a user makes (a probe of the CLI and the
Python API, 2026-11-27): nothing an output writes replaces the program's own files, a failing run
keeps what it produced in every file it was asked for, a state file is whole, and sizes that do not
fit together are refused before anything is allocated."""
from __future__ import annotations

import re

import numpy as np
import pytest

import oi2jax
from oi2jax.diagnostics import OiError
from oi2jax.limits import memory_limit

from conftest import EXAMPLES, run_cli

# a fixed table of 4 rows written at t: the 5th step writes past it (a runtime error in step 5)
KV = """
dynamic { q: f32[3]; }
constant { zero: f32[3] @init(0.0); }
volatile { k_hist: f32[4, 3]; }
persistent { t: i32 @init(0); K(i): f32[3] @table @fixed(i=4); }
block entry {
    op add(q, zero) >> q;
    cache.write q >> K[t];
    cache.increment t;
    cache.read K[] >> k_hist;
    return;
}
"""
Q = np.array([1.0, 2.0, -3.0], np.float32)


@pytest.fixture
def kv(tmp_path):
    (tmp_path / "kv.oi").write_text(KV)
    np.save(tmp_path / "q.npy", Q)
    return tmp_path


def test_session_save_never_replaces_the_programs_files_and_names_a_bad_path(kv):
    prog = oi2jax.compile(kv / "kv.oi", model=False)
    sess = prog.session()
    sess.step(q=Q)
    graph_text = (kv / "kv.oi").read_text()
    with pytest.raises(OiError, match="kv.oi is the graph: writing it would destroy the input"):
        sess.save(kv / "kv.oi")
    assert (kv / "kv.oi").read_text() == graph_text
    (kv / "folder").mkdir()
    for path, why in ((kv / "folder", "is a directory"), ("", "the path is empty"),
                      (kv / "missing" / "s.npz", "no such directory"), ("/dev/null", "not a regular file")):
        with pytest.raises(OiError, match=why):
            sess.save(path)
    sess.save(kv / "s.npz")
    resumed = prog.session(state=kv / "s.npz")
    resumed.step(q=Q)
    resumed.save(kv / "s.npz")  # a checkpoint kept up to date: the file it started from, replaced
    saved = np.load(kv / "s.npz")
    assert int(saved["#steps"]) == 2 and int(saved["t"]) == 2
    np.testing.assert_array_equal(saved["K"][:2], [Q, Q])


def test_a_state_file_must_hold_every_persistent_variable_and_a_whole_step_count(kv):
    prog = oi2jax.compile(kv / "kv.oi", model=False)
    sess = prog.session()
    sess.step(q=Q)
    sess.save(kv / "s.npz")
    whole = dict(np.load(kv / "s.npz"))
    np.savez(kv / "no_t.npz", **{k: v for k, v in whole.items() if k != "t"})
    with pytest.raises(OiError, match="no value for the persistent variable t: a state file holds every one"):
        prog.session(state=kv / "no_t.npz")
    # a dict may leave some out: they start from their @init (as documented)
    assert int(prog.session(state={"K": whole["K"]}).read("t")) == 0
    for bad in (np.int64(-5), np.float64(2.5), np.array([1, 2]), np.int64(2**63 - 2)):  # 2^63-2 overflowed later
        np.savez(kv / "bad.npz", **{**whole, "#steps": bad})
        with pytest.raises(OiError, match=r"#steps must be the step count, a whole number 0\.\.2\^62"):
            prog.session(state=kv / "bad.npz")


def test_a_failing_cli_run_writes_its_state_out_and_resumes(capsys, kv):
    code, _, err = run_cli(capsys, "run", kv / "kv.oi", "--no-model", "--input", f"q={kv / 'q.npy'}",
                           "--steps", "6", "--out", kv / "out.npz", "--state-out", kv / "state.npz", "--quiet")
    assert code == 1 and "(in step 5)" in err
    assert "note: wrote" in err and "state.npz: the state after the failing step 5" in err
    state = np.load(kv / "state.npz")
    # the failing step's write skipped, its other writes applied (docs/decode.md), as --out's variables
    assert int(state["#steps"]) == 5 and int(state["t"]) == 5
    np.testing.assert_array_equal(state["K"], [Q] * 4)
    out = np.load(kv / "out.npz")
    assert int(out["t"]) == 5
    code, _, err = run_cli(capsys, "run", kv / "kv.oi", "--no-model", "--input", f"q={kv / 'q.npy'}",
                           "--state-in", kv / "state.npz", "--quiet")
    assert code == 1 and "(in step 6)" in err  # resumed: the next step is the 6th, still past the table


def test_an_interpreted_failing_run_writes_the_steps_before_it(capsys, kv):
    code, _, err = run_cli(capsys, "run", kv / "kv.oi", "--no-model", "--interpret", "--input", f"q={kv / 'q.npy'}",
                           "--steps", "6", "--out", kv / "out.npz", "--quiet")
    assert code == 1 and "(in step 5)" in err and "note: wrote" in err
    out = np.load(kv / "out.npz")
    assert int(out["t"]) == 4  # the variables after step 4: the interpreter stops at the failing node
    np.testing.assert_array_equal(out["K"], [Q] * 4)
    np.testing.assert_array_equal(out["k_hist"], [Q] * 4)
    prog = oi2jax.compile(kv / "kv.oi", model=False, mode="interpret")
    with pytest.raises(OiError) as caught:
        prog.run({"q": Q}, steps=6)
    assert caught.value.step == 5 and int(caught.value.partial["t"]) == 4


def test_output_flags_that_would_lose_a_file_are_refused_before_running(capsys, kv):
    base = ["run", kv / "kv.oi", "--no-model", "--input", f"q={kv / 'q.npy'}"]
    code, _, err = run_cli(capsys, *base, "--out", kv / "same.npz", "--state-out", f"{kv}/./same.npz")
    assert code == 1 and "--out and --state-out name the same file" in err
    assert not (kv / "same.npz").exists()
    for flag in ("--out", "--state-out"):
        code, _, err = run_cli(capsys, *base, flag, "")
        assert code == 1 and f"error: {flag}: the path is empty" in err
    code, _, err = run_cli(capsys, "compile", kv / "kv.oi", "--no-model", "-o", "")
    assert code == 1 and "error: -o: the path is empty" in err


def test_show_collect_and_quiet_are_checked(capsys, kv):
    base = ["run", kv / "kv.oi", "--no-model", "--input", f"q={kv / 'q.npy'}"]
    code, _, err = run_cli(capsys, *base, "--quiet", "--show", "t")
    assert code == 2 and "--show and --quiet" in err
    code, _, err = run_cli(capsys, *base, "--show", "k_hsit")
    assert code == 2 and "--show k_hsit: not a variable of the graph (did you mean k_hist?)" in err
    code, _, err = run_cli(capsys, *base, "--collect", "")
    assert code == 2 and "--collect needs one or more variable names" in err
    code, _, err = run_cli(capsys, *base, "--collect", "zero")
    assert code == 1 and "collect: zero is a constant, the same at every step" in err


def test_a_batch_size_of_zero_cannot_chunk_rows(capsys, tmp_path):
    (tmp_path / "g.oi").write_text("dynamic { x: f32[B, 2]; }\nvolatile { y: f32[B, 2]; }\n"
                                   "block entry { op relu(x, alpha=0.0) >> y; return; }\n")
    np.save(tmp_path / "x.npy", np.ones((4, 2), np.float32))
    argv = ["run", tmp_path / "g.oi", "--no-model", "--size", "B=0", "--input", f"x={tmp_path / 'x.npy'}"]
    code, _, err = run_cli(capsys, *argv)  # no chunking chosen for 0 rows: the input's shape is wrong
    assert code == 1 and err == ("error: input x: expected shape [0, 2], got [4, 2] (--input gives the value of "
                                 "every step; one value per step goes in --inputs-per-step FILE.npz)\n"), err
    code, _, err = run_cli(capsys, *argv, "--batch-var", "B")  # asked for: said in the CLI's words
    assert code == 1 and err == "error: --batch-var B: chunks of B=0 rows hold no row (give --size B=N with N >= 1)\n"
    with pytest.raises(OiError, match="run_batched: B=0: inputs of 4 rows cannot run in chunks of 0 rows"):
        oi2jax.compile(tmp_path / "g.oi", sizes={"B": 0}).run_batched({"x": np.ones((4, 2), np.float32)})


def test_values_that_fit_one_by_one_but_not_together_are_refused_before_allocating(tmp_path):
    n = int(0.4 * memory_limit()) // 4  # three f32 values of n elements: 1.2x this machine's memory
    (tmp_path / "g.oi").write_text("dynamic { x: f32[N]; }\nvolatile { y: f32[N]; z: f32[N]; }\n"
                                   "block entry { op relu(x, alpha=0.0) >> y; op relu(y, alpha=0.0) >> z; return; }\n")
    for mode in ("compiled", "interpret"):
        with pytest.raises(OiError, match=f"would need {12 * n} bytes together: too large to allocate") as caught:
            oi2jax.compile(tmp_path / "g.oi", model=False, sizes={"N": n}, mode=mode)
        assert f"the largest: z {4 * n} bytes, y {4 * n} bytes, x {4 * n} bytes" in str(caught.value)


def test_inputs_that_are_not_arrays_and_damaged_state_files_are_named(kv):
    prog = oi2jax.compile(kv / "kv.oi", model=False)
    sess = prog.session()
    for value, shown in (("abc", "text ('abc')"), (None, "Python objects (None)")):
        with pytest.raises(OiError, match=re.escape(f"input q: expected f32[3] values (numbers), got {shown}")):
            sess.step(q=value)
    (kv / "garbage.npz").write_text("not an archive\n")
    with pytest.raises(OiError) as caught:
        prog.session(state=kv / "garbage.npz")
    assert "garbage.npz: not a state file (.npz): not a NumPy file" in str(caught.value)
    assert "pickle" not in str(caught.value)



_TABLE = """
dynamic { x: f32[2]; }
volatile { r: f32[1, 2]; }
persistent {
  t: i32 @init(0);
  H(n): f32[2] @table @fixed(n=3);
}
block entry {
  %s
  return;
}
"""


@pytest.mark.parametrize("body", [
    "cache.write x >> H[t];\n  cache.increment t;",       # an index past the fixed size
    "cache.write x >> H[0];\n  cache.read H[t..1] >> r;\n  cache.increment t;",  # a slice of length 0
    "cache.write x >> H[0];\n  cache.read H[t..3] >> r;\n  cache.increment t;",  # a slice of the wrong length
])
def test_a_runtime_error_is_located_alike_interpreted_and_compiled(body):
    """The interpreter located a cache access's errors at its statement, the compiled step at the
    access (`H[t]`): both now name the same line and column."""
    import oi2jax
    from oi2jax.diagnostics import OiError
    src = _TABLE % body
    where = {}
    for mode in ("interpret", "compiled"):
        prog = oi2jax.compile(src, mode=mode, zero_missing_inputs=True)
        with pytest.raises(OiError) as info:
            prog.run({}, steps=5)
        d = info.value.errors[0]
        where[mode] = (d.message, d.span.line, d.span.col)
    assert where["interpret"] == where["compiled"], where


def test_graph_refuses_to_write_over_its_own_graph(capsys, tmp_path):
    """`graph g.oi -o g.dot` where g.dot links to g.oi replaced the graph with DOT text (compile and
    export refused it; graph did not)."""
    import shutil
    graph = tmp_path / "k.oi"
    shutil.copy(EXAMPLES / "kv_cache_decode.oi", graph)
    (tmp_path / "k.dot").symlink_to("k.oi")
    before = graph.read_bytes()
    code, _, err = run_cli(capsys, "graph", graph, "--no-model", "-o", tmp_path / "k.dot")
    assert code == 1 and "is the graph: writing it would destroy the input" in err
    assert graph.read_bytes() == before


def test_a_write_the_user_may_not_make_is_refused(capsys, tmp_path, monkeypatch):
    """An atomic write replaced a read-only file (a rename needs only the folder's permission), where
    a plain write fails: the file's own permission is asked first."""
    from oi2jax import npz
    target = tmp_path / "g.oi"
    text = (EXAMPLES / "kv_cache_decode.oi").read_text()
    target.write_text(text + "\n\n")  # not formatted: fmt -i would rewrite it
    real = npz.os.access
    monkeypatch.setattr(npz.os, "access", lambda p, mode: False if str(p) == str(target) else real(p, mode))
    code, _, err = run_cli(capsys, "fmt", "-i", target)
    assert code == 1 and "Permission denied (the file is not writable)" in err
    assert target.read_text() == text + "\n\n"


@pytest.mark.parametrize("edit, words", [
    (lambda g: g["vars"]["zero"].__setitem__("init", {"F32": float("nan")}), "NaN cannot be written in the DSL"),
    (lambda g: g["vars"]["zero"].__setitem__("init", {"F32": float("-inf")}), "-inf cannot be written in the DSL"),
    (lambda g: g["vars"]["t"].__setitem__("init", {"I32": float("inf")}), "an @init of a i32 variable must be an integer, got inf"),
    (lambda g: g["vars"]["t"].__setitem__("init", {"I32": 4.5}), "an @init of a i32 variable must be an integer, got 4.5"),
    (lambda g: g["vars"]["t"].__setitem__("init", {"I32": "2"}), "an @init of a i32 variable must be an integer, got '2'"),
    (lambda g: g["vars"]["t"].__setitem__("init", {"I32": True}), "an @init of a i32 variable cannot be True"),
    (lambda g: g["vars"]["K"].__setitem__("fixed", [["i", float("inf")]]), "K: @fixed(i) must be an integer, got inf"),
])
def test_graph_json_values_the_dsl_cannot_hold_are_named_errors(capsys, tmp_path, edit, words):
    """A NaN or infinite @init, an integer @init or a @fixed size from 1e400 in graph JSON were
    internal errors (a traceback's last line); now `FILE: not a ... graph: ...`, exit 1."""
    import json as json_
    code, out, _ = run_cli(capsys, "compile", EXAMPLES / "kv_cache_decode.oi", "--no-model", "--emit", "graph-json")
    assert code == 0
    g = json_.loads(out)
    edit(g)
    path = tmp_path / "g.json"
    path.write_text(json_.dumps(g))
    code, _, err = run_cli(capsys, "check", path, "--no-model")
    assert code == 1 and f"{path}: not a" in err and words in err and "internal error" not in err, err


@pytest.mark.parametrize("edit, words", [
    (lambda g: g["blocks"]["entry"]["nodes"][0].__setitem__("index", None), "a node index must be an integer, got None"),
    (lambda g: g["blocks"]["entry"]["nodes"][0].__setitem__("index", 1.5), "a node index must be an integer, got 1.5"),
    (lambda g: g["vars"]["q"].__setitem__("dims", [""]), "a dimension must be a size"),
    (lambda g: g["vars"]["K"].__setitem__("fixed", [["i", 4.5]]), "K: @fixed(i) must be an integer, got 4.5"),
    (lambda g: g["blocks"]["entry"]["nodes"][2]["kind"]["CacheIncrement"].__setitem__("amount", 2.7),
     "cache.increment amount must be an integer, got 2.7"),
    (lambda g: g["blocks"]["entry"]["nodes"][2]["kind"]["CacheIncrement"].__setitem__("amount", "2"),
     "cache.increment amount must be an integer, got '2'"),
    (lambda g: g["blocks"]["entry"]["nodes"][1]["kind"]["CacheWrite"]["dst"].__setitem__(
        "indices", [{"Single": {"Lit": "t"}}]), "a literal index must be an integer, got 't'"),
    (lambda g: g["blocks"]["entry"]["nodes"][1]["kind"]["CacheWrite"]["dst"].__setitem__(
        "indices", [{"Single": {"Ident": "2"}}]), "an index variable must be a name, got '2'"),
    (lambda g: g["vars"]["K"].__setitem__("fixed", [["i", "4"]]), "K: @fixed(i) must be a name, got '4'"),
])
def test_graph_json_numbers_are_not_silently_made_integers(capsys, tmp_path, edit, words):
    """A @fixed of 4.5 became 4, an amount of 2.7 or "2" became 2, a dims entry "" made a scalar, a
    literal index "t" became the variable t, a node index null was kept: each now an error."""
    import json as json_
    code, out, _ = run_cli(capsys, "compile", EXAMPLES / "kv_cache_decode.oi", "--no-model", "--emit", "graph-json")
    g = json_.loads(out)
    edit(g)
    path = tmp_path / "g.json"
    path.write_text(json_.dumps(g))
    code, _, err = run_cli(capsys, "check", path, "--no-model")
    assert code == 1 and words in err, err


def test_minus_o_dev_stdout_on_a_pipe_is_named_as_a_pipe():
    """`compile -o /dev/stdout` with standard output a pipe said `No such file or directory` (the
    link's target, pipe:[N], is no path); it is now refused as what it is, with the way out."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "oi2jax", "compile", str(EXAMPLES / "mlp_regression.oi"), "-o",
                           "/dev/stdout"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert "error: /dev/stdout: not a regular file (a FIFO); refusing to replace it (leave out -o to print on " \
           "standard output)" in proc.stderr, proc.stderr


FED = "dynamic { token: i32 @init(10); }\nconstant { one: i32 @init(1); }\nvolatile { next: i32; }\n" \
      "block entry { op add(token, one) >> next; return; }\n"


def test_a_state_file_without_a_variables_last_value_is_refused(tmp_path, capsys):
    """A run continued with feedback takes its first input from the state's `next`; a file
    without it resumed from zeros in silence ([1 2] for [14 15]: helper probe)."""
    (tmp_path / "fb.oi").write_text(FED)
    code, _, err = run_cli(capsys, "run", tmp_path / "fb.oi", "--no-model", "--feedback", "token=next",
                           "--steps", 3, "--collect", "next", "--state-out", tmp_path / "s.npz", "--quiet")
    assert code == 0, err
    whole = dict(np.load(tmp_path / "s.npz"))
    np.savez(tmp_path / "nonext.npz", **{k: v for k, v in whole.items() if k != "next"})
    code, _, err = run_cli(capsys, "run", tmp_path / "fb.oi", "--no-model", "--feedback", "token=next",
                           "--steps", 2, "--collect", "next", "--state-in", tmp_path / "nonext.npz", "--out",
                           tmp_path / "o.npz")
    assert code == 1 and "no value for the variable next: a state file holds every variable's last value" in err, err
    code, _, err = run_cli(capsys, "run", tmp_path / "fb.oi", "--no-model", "--feedback", "token=next",
                           "--steps", 2, "--collect", "next", "--state-in", tmp_path / "s.npz", "--out",
                           tmp_path / "o.npz", "--quiet")
    assert code == 0 and np.load(tmp_path / "o.npz")["next"].tolist() == [14, 15], err


def test_run_file_flags_name_the_users_mistake(kv, capsys):
    """(helper probe) an .npy given as --inputs-per-step said the ndarray has no context manager;
    an output path ending in '/' named an internal temporary file (after the whole run);
    --interpret with --inputs-per-step and no --steps was an internal error."""
    code, _, err = run_cli(capsys, "run", kv / "kv.oi", "--no-model", "--inputs-per-step", kv / "q.npy")
    assert code == 1 and "--inputs-per-step " in err and "expected an .npz file of named arrays, got one .npy " \
        "array" in err, err
    for out in ("out.npz/", "newdir/"):
        code, _, err = run_cli(capsys, "run", kv / "kv.oi", "--no-model", "--input", f"q={kv / 'q.npy'}",
                               "--out", f"{kv}/{out}")
        assert code == 1 and f"{out}: ends with '/', which names a directory; give a file name" in err, err
        assert ".oi2jax-" not in err
    np.savez(kv / "q3.npz", q=np.stack([Q, Q, Q]))
    code, out, err = run_cli(capsys, "run", kv / "kv.oi", "--no-model", "--inputs-per-step", kv / "q3.npz",
                             "--interpret", "--out", kv / "fi.npz", "--quiet")
    assert code == 0 and int(np.load(kv / "fi.npz")["t"]) == 3, err


def test_a_failed_runs_trace_is_printed_and_written(kv, capsys):
    """(helper probe) --trace and --trace-json gave nothing when the run failed: the steps before
    the failing one are what one debugs the failure with."""
    code, out, err = run_cli(capsys, "run", kv / "kv.oi", "--no-model", "--input", f"q={kv / 'q.npy'}", "--steps", 6,
                             "--trace", "--trace-json", kv / "t.json", "--quiet")
    assert code == 1 and "(in step 5)" in err
    # steps count from 1 in the trace as in the error: the failing step's call is `step 5`
    assert [line.split(" phase")[0] for line in out.splitlines() if line.startswith("step ")] == \
        [f"step {k}" for k in range(1, 6)]
    import json
    assert len(json.loads((kv / "t.json").read_text())["events"]) == 5


def test_a_state_file_at_other_sizes_is_named_as_the_state_files(tmp_path, capsys):
    """(helper probe) it said `input q: expected shape [8], got [4]`, as if --input were wrong."""
    graph = tmp_path / "g.oi"
    graph.write_text("dynamic { q: f32[D]; }\nvolatile { s: f32[D]; }\npersistent { t: i32 @init(0); }\n"
                     "block entry { op add(q, q) >> s; cache.increment t; return; }\n")
    np.save(tmp_path / "q4.npy", np.ones(4, np.float32))
    np.save(tmp_path / "q8.npy", np.ones(8, np.float32))
    code, _, err = run_cli(capsys, "run", graph, "--size", "D=4", "--input", f"q={tmp_path / 'q4.npy'}",
                           "--state-out", tmp_path / "s4.npz", "--quiet")
    assert code == 0, err
    code, _, err = run_cli(capsys, "run", graph, "--size", "D=8", "--input", f"q={tmp_path / 'q8.npy'}",
                           "--state-in", tmp_path / "s4.npz", "--quiet")
    assert code == 1 and f"error: {tmp_path / 's4.npz'}: the dynamic variable q: expected shape [8], got [4]" in err, err
