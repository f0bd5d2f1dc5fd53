"""Every ```python and ```sh snippet of README.md and docs/*.md runs as printed (issue 41).

The snippets of one document run in order in one fresh directory holding a copy of examples/ (a
later snippet may use what an earlier one wrote, as a reader following the page would; each in a
process of its own, as a reader's session would be), with
`oi2jax` and `python` on PATH meaning this checkout's CLI and interpreter. A snippet that needs
what a test machine does not have runs against a small stand-in, named below with the text
replaced (STAND_INS) or the files and names made first (SETUP): a Hugging Face Llama checkpoint
directory is a random one of the same vocabulary written by examples/llama_checkpoint.py (a chat
model's with its `--tokenizer`), a GGUF file that checkpoint written by examples/gguf_file.py,
another family's checkpoint a random one of tests/gemma_gpt2_checkpoints.py, an absolute /tmp
path is the snippet's directory. A snippet that cannot run at all (a synopsis with
`[--flag]` and `a|b`, a structure drawn with `...`, the reader's own files, more devices than a
CPU test has) is listed in NOT_RUN with the reason; a new snippet must be run or listed."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLES, REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(python|sh)\n(.*?)^```", re.S | re.M)


def _snippets() -> list[tuple[str, str, str]]:
    """(key, language, code) in document order; key: `DOC: first line` (stable under edits
    elsewhere in the page), ` #2`, ` #3`... after it for a later snippet of the page that starts alike."""
    found = []
    for doc in DOCS:
        for m in FENCE.finditer(doc.read_text()):
            code = m.group(2)
            key = f"{doc.relative_to(REPO)}: {code.splitlines()[0].strip()}"
            n = sum(1 for k, _, _ in found if k == key or k.startswith(key + " #"))
            found.append((key + (f" #{n + 1}" if n else ""), m.group(1), code))
    return found


SYNOPSIS = "a synopsis of the command's flags ([--flag], a|b), not a command line"
NOT_RUN = {
    "docs/performance.md: python -m benchmarks.quantized_model --quick   # tiny and mid Llama, kept vs f32 (~5 minutes "
    "loaded)": "benchmark runs (minutes, timings only); tests/test_quantized_model.py holds the values and the bytes",
    "docs/performance.md: python -m benchmarks.quantized_matvec --quick   # 6 layers, decode only (~1 minute)":
        "benchmark runs (one minute and more, timings only); tests/test_quantized.py holds the kernels to "
        "gguf.quants",
    "docs/ecosystem.md: CMAKE_BUILD_PARALLEL_LEVEL=2 nice -n 15 pip install '.[bench]'   # or: pip install "
    "llama-cpp-python": "builds llama.cpp from source (minutes) and runs a benchmark (minutes); its smoke test is "
                        "tests/test_benchmarks_smoke.py",
    "README.md: make demo   # creates .venv, installs, runs examples/mlp_regression.oi, then generates and chats "
    "with the DSL Llama": "creates a virtual environment and runs the whole suite (make demo's steps are each run below)",
    "README.md: from oi2jax.ops import op": "a sketch of a user op (its graph g.oi and my_ops.py are the "
                                            "reader's); docs/ops.md's my_ops.py, run here, is the full form",
    "README.md: oi2jax check graph.oi [--model m.oinf] [--size B=8]          # exit 0 valid, 1 diagnostics": SYNOPSIS,
    "docs/decode.md: StepState(vars={\"t\": ...},                                 # plain persistent variables":
        "the structure of a StepState drawn with `...`, not code",
    "docs/decode.md: oi2jax run g.oi --inputs-per-step toks.npz --collect y --out out.npz   # N steps, y stacked "
    "[N, ...]": "the reader's graph g.oi and its files; the same flags run in README.md's and docs/models.md's recipes",
    "docs/ecosystem.md: oi2jax export GRAPH.oi [--model M.oinf] [--size NAME=INT ...] -o step.jaxexport [--symbolic "
    "B] [--platforms cpu,cuda]": SYNOPSIS,
    "docs/ecosystem.md: oi2jax graph GRAPH.oi              # DOT on stdout": "GRAPH.oi is a placeholder, and .svg "
                                                                             "needs Graphviz (tests/test_cfg.py)",
    "docs/models.md: oi2jax convert-hf DIR -o MODEL.oinf [--dtype f32|bf16|f16] [--max-positions N] [--nonfinite "
    "note|error] [--quiet]": SYNOPSIS,
    "docs/models.md: oi2jax convert-gguf FILE.gguf -o MODEL.oinf [--dtype f32|bf16|f16] [--max-positions N] "
    "[--nonfinite note|error] [--quiet]": SYNOPSIS,
    "docs/models.md: from oi2jax.runtime.sharding import make_mesh": "a mesh of 4 devices (tests/test_llama.py runs "
                                                                      "it on 4 forced host devices)",
    "docs/models.md: oi2jax run examples/llama_decode.oi --model tiny.oinf --ops nn --mesh model=4 \\":
        "ends in `...` and needs 4 devices (tests/test_llama.py)",
    "docs/ops.md: prog = oi2jax.compile(\"attn.oi\", ops=[\"nn\"])                     # the bundled set":
        "the forms `ops=` accepts, on the reader's files and objects (tests/test_user_ops.py loads each form; "
        "tests/test_new_user.py `oi2jax.ops.load` after `import oi2jax`)",
    "docs/ops.md: oi2jax run attn.oi --ops nn --ops my_ops.py ...      # repeatable, on "
    "check/run/compile/export/graph/fmt": "the reader's attn.oi, and ends in `...`",
    "docs/scaling.md: import jax, numpy as np, oi2jax": "a mesh of 8 devices, in a process that already started JAX on 1; the "
                                           "same run from the command line is run below on 8 forced host devices",
    "docs/scaling.md: # two processes on one machine (what tests/test_sharding.py does), 2 CPU devices each":
        "two processes and a coordinator port: tests/test_sharding.py runs exactly this",
}

TINYLLAMA = ("from llama_checkpoint import write_random_llama\n"  # a TinyLlama-sized vocabulary, tiny otherwise
             "write_random_llama('TinyLlama', vocab=32000, hidden=16, layers=1, heads=2, kv_heads=1, "
             "intermediate=32, max_positions=64)\n")
CHAT = ("from llama_checkpoint import write_random_llama\n"  # a random checkpoint with a tokenizer and chat template,
        # room for a prompt and generate's default 256 tokens (random weights may never draw the stop id)
        "write_random_llama('SmolLM2-135M-Instruct', tokenizer=True, layers=1, max_positions=512)\n")
CHAT_GGUF = ("from llama_checkpoint import write_random_llama\nfrom gguf_file import write_gguf\n"  # its Q4_1 file
             "write_gguf(write_random_llama('SmolLM2-gguf-source', tokenizer=True, layers=1, max_positions=512), "
             "'SmolLM2-135M-Instruct-Q4_1.gguf', 'Q4_1')\n")
FAMILIES = ("import sys\nsys.path.insert(0, %r)\n" % str(REPO / "tests")  # tests/gemma_gpt2_checkpoints.py
            + "import numpy as np, gemma_gpt2_checkpoints as ck\n"
            "sizes = dict(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=48, "
            "max_positions=48, sliding_window=8)\n"
            "for name, config in (('gemma-2-2b-it', ck.gemma2_config(**sizes)), "
            "('gemma-3-1b-it', ck.gemma3_text_config(**sizes)), "
            "('gpt2', ck.gpt2_config(vocab=64, hidden=32, layers=2, heads=4, positions=48))):\n"
            "    ck.write_checkpoint(name, config, ck.random_weights(config))\n"
            "np.savez('prompt.npz', token=np.array([1, 15, 29], np.int32))\n")  # the ids of README's prompt.npz: < 64
STAND_INS = {
    "README.md: oi2jax convert-hf ~/models/SmolLM2-135M-Instruct -o smollm.oinf":
        [("~/models/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct")],
    "docs/models.md: python examples/llama_checkpoint.py /tmp/chat --tokenizer     # V=320, + tokenizer and chat "
    "template": [("/tmp/", "./")],
    "docs/models.md: oi2jax convert-hf ~/models/gemma-2-2b-it -o gemma2.oinf --dtype f32      # model_type gemma2":
        [("~/models/", "")],
    "README.md: oi2jax convert-hf ~/models/TinyLlama-1.1B-Chat-v1.0 -o tinyllama.oinf     # or SmolLM, any "
    "Llama-family dir": [("~/models/TinyLlama-1.1B-Chat-v1.0", "TinyLlama")],
    "docs/models.md: oi2jax convert-hf ~/models/TinyLlama-1.1B-Chat-v1.0 -o tinyllama.oinf --dtype bf16":
        [("~/models/TinyLlama-1.1B-Chat-v1.0", "TinyLlama")],
    "docs/models.md: python examples/llama_checkpoint.py                       # examples/tiny-llama-hf: V=64 D=32 "
    "L=2 H=4 KVH=2": [("/tmp/", "./")],
    "docs/models.md: python examples/llama_checkpoint.py /tmp/tiny-hf                  # or a real checkpoint "
    "directory": [("/tmp/", "./")],
}
SETUP = {
    "README.md: oi2jax convert-hf ~/models/SmolLM2-135M-Instruct -o smollm.oinf": CHAT,
    "README.md: oi2jax convert-gguf SmolLM2-135M-Instruct-Q4_1.gguf -o smollm-q4.oinf": CHAT_GGUF,
    "docs/models.md: oi2jax convert-hf ~/models/gemma-2-2b-it -o gemma2.oinf --dtype f32      # model_type gemma2":
        FAMILIES,
    "README.md: oi2jax convert-hf ~/models/TinyLlama-1.1B-Chat-v1.0 -o tinyllama.oinf     # or SmolLM, any "
    "Llama-family dir": TINYLLAMA,
    "docs/models.md: oi2jax convert-hf ~/models/TinyLlama-1.1B-Chat-v1.0 -o tinyllama.oinf --dtype bf16": TINYLLAMA,
    "docs/decode.md: import numpy as np, oi2jax": "import numpy as np\n"
                                                  # K holds 4 steps (@fixed): 2 + 2
                                                  "queries = np.random.rand(2, 16).astype(np.float32)\n"
                                                  "qs = np.random.rand(2, 16).astype(np.float32)\n",
    "docs/ecosystem.md: import json, numpy as np, jax": "import numpy as np\n"
                                                        "from oi2jax.export import write_export\n"
                                                        "write_export('examples/mlp_regression.oi', 'step.jaxexport')\n"
                                                        "my_x = np.ones((4, 16), np.float32)\nsteps = 2\n",
    "docs/scaling.md: oi2jax run examples/mlp_regression.oi --input x=x.npy --mesh data=4,model=2 --shard B=data "
    "--shard H=model": "import numpy as np\nnp.save('x.npy', np.ones((4, 16), np.float32))\n",
}
ENV = {  # the devices a snippet's mesh needs, as forced host (CPU) devices
    "docs/scaling.md: oi2jax run examples/mlp_regression.oi --input x=x.npy --mesh data=4,model=2 --shard B=data "
    "--shard H=model": {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"},
}
SNIPPETS = _snippets()
RUN_DOCS = sorted({key.split(":")[0] for key, _, _ in SNIPPETS if key not in NOT_RUN})


def test_every_snippet_is_run_or_says_why_not():
    keys = [key for key, _, _ in SNIPPETS]
    for table in (NOT_RUN, STAND_INS, SETUP, ENV):
        assert not set(table) - set(keys), f"entries for snippets that no longer exist: {set(table) - set(keys)}"
    assert not set(NOT_RUN) & (set(STAND_INS) | set(SETUP) | set(ENV))
    assert len(keys) - len(NOT_RUN) >= 11  # every recipe a reader would copy runs


def _sandbox(directory: Path, xla_cache: Path) -> dict:
    """examples/ copied into `directory`; `oi2jax` and `python` on PATH; the environment for sh,
    with `xla_cache` as the CLI's persistent XLA cache (one for every doc: the docs run the same
    example programs, compiled once)."""
    shutil.copytree(EXAMPLES, directory / "examples", ignore=shutil.ignore_patterns("tiny-llama-hf", "__pycache__"))
    bin_dir = directory / ".bin"
    bin_dir.mkdir()
    for name, line in (("oi2jax", f'exec "{sys.executable}" -m oi2jax "$@"'), ("python", f'exec "{sys.executable}" "$@"')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{line}\n")
        (bin_dir / name).chmod(0o755)
    path = os.pathsep.join([str(REPO), str(directory / "examples"), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=path,
                OI2JAX_CACHE_DIR=str(xla_cache))


# a python snippet: its setup (stand-ins), then the snippet as printed, in one namespace
RUN_PYTHON = """import sys
key, setup, code = sys.argv[1:]
namespace = {"__name__": "__main__"}
exec(compile(setup, "setup of " + key, "exec"), namespace)
exec(compile(code, key, "exec"), namespace)
"""


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("xla-cache")


@pytest.mark.parametrize("doc", RUN_DOCS)
def test_snippets_run_as_printed(doc, tmp_path, xla_cache):
    env = _sandbox(tmp_path, xla_cache)
    for key, lang, code in SNIPPETS:
        if key.split(":")[0] != doc or key in NOT_RUN:
            continue
        for old, new in STAND_INS.get(key, ()):
            assert old in code, (key, old)
            code = code.replace(old, new)
        setup = SETUP.get(key, "")
        if lang == "python":  # in a process of its own: a snippet may set JAX's global config (x64)
            argv = [sys.executable, "-c", RUN_PYTHON, key, setup, code]
        else:
            if setup:
                subprocess.run([sys.executable, "-c", setup], cwd=tmp_path, env=env, check=True, timeout=600)
            argv = ["bash", "-e", "-o", "pipefail", "-c", code]
        proc = subprocess.run(argv, cwd=tmp_path, env={**env, **ENV.get(key, {})}, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, f"{key}\n{code}\n{proc.stdout}\n{proc.stderr}"
