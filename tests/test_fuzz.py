"""The front door never crashes: whatever the input, `oi2jax check/run/inspect` exits 0, 1 or 2
with diagnostics, never a traceback or an "internal error", in bounded time.

Inputs: random text, random token streams, mutated real graphs (examples/*.oi and the SPEC
§1.5 example) and mutated `.oinf` files (the reference models in shared/openinfer/models).
Most cases call `oi2jax.cli.main` in-process (fast); a few go through `python -m oi2jax`.
"""
from __future__ import annotations

import atexit
import contextlib
import io
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import EXAMPLES, MODELS, REPO

MAX_SECONDS = 30.0  # per case
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TMP = Path(tempfile.mkdtemp(prefix="oi2jax_fuzz_"))  # one per process (each xdist worker imports this)
atexit.register(shutil.rmtree, TMP, ignore_errors=True)  # removed when the process ends

from test_parse import SPEC_15 as SPEC_EXAMPLE  # noqa: E402  (SPEC §1.5, one copy)

TOKENS = ("dynamic volatile constant persistent block assign op branch barrier dep after before loop in "
          "yield await return transfer cache . read write increment decrement reset @ init ref pattern "
          "table fixed auto_dim { } ( ) [ ] ; : , .. = * - >> > x y W K entry a b l t i f32 i8 u4 bool "
          "bf16 f8 t1 bitset 0 1 2 3 -1 1.5 1e-3 true false inf \"s\" \"w.{l}\" add matmul relu fill "
          "sum_axis cast acc= to= axes=[0] // /* */ \n").split(" ")


def _graph_texts() -> list[tuple[str, str | None]]:
    """(text, model path or None) for every real graph we mutate."""
    out = [(SPEC_EXAMPLE, None)]
    for path in sorted(EXAMPLES.glob("*.oi")):
        model = MODELS / (path.stem + ".oinf")
        out.append((path.read_text(), str(model) if model.exists() else None))
    return out


GRAPHS = _graph_texts()
MODEL_FILES = sorted(MODELS.glob("*.oinf")) if MODELS.is_dir() else []


def cli(args: list[str]) -> tuple[int, str]:
    """Run `oi2jax ARGS` in-process; (exit code, stdout+stderr)."""
    from oi2jax.cli import main

    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(args)
        except SystemExit as exc:  # argparse usage errors
            rc = exc.code if isinstance(exc.code, int) else 2
    elapsed = time.monotonic() - start
    text = out.getvalue() + err.getvalue()
    assert elapsed < MAX_SECONDS, f"oi2jax {' '.join(args)} took {elapsed:.1f}s"
    return rc, text


def assert_clean(rc: int, text: str, what: str) -> None:
    assert rc in (0, 1, 2), f"{what}: exit code {rc}\n{text}"
    assert "Traceback" not in text, f"{what}: traceback\n{text}"
    assert "internal error" not in text, f"{what}: internal error\n{text}"


def _write(text: str, suffix=".oi") -> str:
    fd, path = tempfile.mkstemp(suffix=suffix, dir=TMP)
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass") as f:
        f.write(text)
    return path


def _check_text(text: str, model: str | None = None, also_run: bool = False) -> None:
    path = _write(text)
    try:
        args = ["check", path] + (["--model", model] if model else [])
        rc, out = cli(args)
        assert_clean(rc, out, f"check of\n{text}")
        if also_run and rc == 0:
            args = ["run", path, "--interpret", "--quiet", "--steps", "2"] + (["--model", model] if model else [])
            rc, out = cli(args)
            assert_clean(rc, out, f"run --interpret of\n{text}")
    finally:
        os.unlink(path)


# ---------------------------------------------------------------------------------- random text


@FUZZ
@given(st.text(max_size=300))
def test_random_text(text):
    _check_text(text)


@FUZZ
@given(st.lists(st.sampled_from(TOKENS), max_size=80))
def test_random_token_streams(tokens):
    _check_text(" ".join(tokens))


# ----------------------------------------------------------------------------- mutated graphs


def _mutate(text: str, rnd: random.Random, n: int) -> str:
    for _ in range(n):
        kind = rnd.randrange(6)
        if not text:
            return rnd.choice(TOKENS)
        i = rnd.randrange(len(text))
        j = min(len(text), i + rnd.randrange(1, 12))
        if kind == 0:  # delete a span
            text = text[:i] + text[j:]
        elif kind == 1:  # insert a token
            text = text[:i] + " " + rnd.choice(TOKENS) + " " + text[i:]
        elif kind == 2:  # replace a word with a token
            words = text.split(" ")
            k = rnd.randrange(len(words))
            words[k] = rnd.choice(TOKENS)
            text = " ".join(words)
        elif kind == 3:  # duplicate a line
            lines = text.splitlines()
            k = rnd.randrange(len(lines))
            lines.insert(k, lines[k])
            text = "\n".join(lines)
        elif kind == 4:  # swap two lines
            lines = text.splitlines()
            a, b = rnd.randrange(len(lines)), rnd.randrange(len(lines))
            lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
        else:  # change a number
            digits = [k for k, c in enumerate(text) if c.isdigit()]
            if digits:
                k = rnd.choice(digits)
                text = text[:k] + rnd.choice("0123456789") + text[k + 1:]
    return text


@FUZZ
@given(st.integers(0, len(GRAPHS) - 1), st.integers(0, 2**32 - 1), st.integers(1, 4))
def test_mutated_graphs_check(which, seed, n):
    text, model = GRAPHS[which]
    _check_text(_mutate(text, random.Random(seed), n), model)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(GRAPHS) - 1), st.integers(0, 2**32 - 1))
def test_mutated_graphs_run_interpreted(which, seed):
    """Mutations that still check must also run (interpreted) without crashing."""
    text, model = GRAPHS[which]
    _check_text(_mutate(text, random.Random(seed), 1), model, also_run=True)


def test_unmutated_graphs_check_clean():
    for text, model in GRAPHS:
        _check_text(text, model)


# ------------------------------------------------------------------------------ mutated .oinf


def _mutate_bytes(data: bytes, rnd: random.Random) -> bytes:
    b = bytearray(data)
    kind = rnd.randrange(5)
    if kind == 0:  # truncate
        return bytes(b[: rnd.randrange(len(b) + 1)])
    if kind == 1:  # flip bytes in the header (offsets, counts)
        for _ in range(rnd.randrange(1, 4)):
            i = rnd.randrange(min(len(b), 72))
            b[i] = rnd.randrange(256)
        return bytes(b)
    if kind == 2:  # flip bytes anywhere
        for _ in range(rnd.randrange(1, 8)):
            i = rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
        return bytes(b)
    if kind == 3:  # big numbers in the tables
        i = rnd.randrange(len(b))
        b[i:i + 8] = rnd.choice([b"\xff" * 8, b"\x00" * 8, b"\x7f\xff\xff\xff\xff\xff\xff\xff"])[: len(b) - i]
        return bytes(b)
    return bytes(b) + bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 64)))  # trailing junk


@FUZZ
@given(st.integers(0, max(len(MODEL_FILES) - 1, 0)), st.integers(0, 2**32 - 1))
def test_mutated_models(which, seed):
    src = MODEL_FILES[which]
    data = _mutate_bytes(src.read_bytes(), random.Random(seed))
    fd, path = tempfile.mkstemp(suffix=".oinf", dir=TMP)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    try:
        rc, out = cli(["inspect", path])
        assert_clean(rc, out, f"inspect of mutated {src.name}")
        graph = EXAMPLES / (src.stem + ".oi")
        if graph.exists():
            rc, out = cli(["check", str(graph), "--model", path])
            assert_clean(rc, out, f"check {graph.name} with mutated {src.name}")
            if rc == 0:
                rc, out = cli(["run", str(graph), "--model", path, "--interpret", "--quiet"])
                assert_clean(rc, out, f"run {graph.name} with mutated {src.name}")
    finally:
        os.unlink(path)


# ---------------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("array", [np.zeros((3, 3), np.float32), np.array(["a"]), np.array([1e40]),
                                   np.zeros((4, 16), np.complex64)])
def test_bad_run_inputs(array):
    graph = EXAMPLES / "mlp_regression.oi"
    model = MODELS / "mlp_regression.oinf"
    assert graph.exists() and model.exists(), "example not found"
    npy = TMP / "x.npy"
    np.save(npy, array)
    for extra in (["--interpret"], []):
        rc, out = cli(["run", str(graph), "--model", str(model), "--input", f"x={npy}", "--quiet"] + extra)
        assert_clean(rc, out, f"run with bad input {array.dtype}{list(array.shape)}")
        assert rc == 1


# ------------------------------------------------------------------------------ real processes


@pytest.mark.parametrize("args", [
    ["check", "{garbage}"],
    ["check", "/nonexistent/graph.oi"],
    ["inspect", "{badmodel}"],
    ["run", "{garbage}", "--steps", "-1"],
    ["frobnicate"],
    ["check", "{spec}", "--size", "B=x"],
])
def test_subprocess_front_door(args):
    garbage = _write("block entry { op ??? }")
    spec = _write(SPEC_EXAMPLE)
    bad = TMP / "bad.oinf"
    bad.write_bytes(b"OINF" + bytes(range(200)))
    argv = [a.format(garbage=garbage, badmodel=bad, spec=spec) for a in args]
    proc = subprocess.run([sys.executable, "-m", "oi2jax", *argv], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    text = proc.stdout + proc.stderr
    assert_clean(proc.returncode, text, " ".join(argv))
    assert proc.returncode != 0


@pytest.mark.parametrize("mode", [["--interpret"], []])
def test_huge_sizevar_is_a_clean_error(mode):
    """A model whose sizevar is absurd (D = 2**56 - 1) must give a diagnostic, not an internal error."""
    from oi2jax.model import open_model, save
    src = MODELS / "cache_window_slice.oinf"
    graph = EXAMPLES / "cache_window_slice.oi"
    assert src.exists() and graph.exists(), "reference model not found"
    m = open_model(str(src))
    path = TMP / "huge.oinf"
    save(str(path), sizevars={"D": 2**56 - 1}, tensors={n: m.load(n) for n in m.tensors})
    rc, out = cli(["run", str(graph), "--model", str(path), "--quiet", *mode])
    assert_clean(rc, out, "run with D = 2**56 - 1")
    assert rc == 1
