"""`make demo`: compile examples/mlp_regression.oi with its model and run it, then generate
with the DSL Llama decoder from a small random Hugging Face checkpoint, then chat with it.

Builds examples/mlp_regression.oinf first when it is missing (examples/models.py),
runs one step on a fixed input, prints the outputs, then times the compiled step
function (median of several steps after warm-up). Then writes a tiny random Llama checkpoint
directory (examples/llama_checkpoint.py), converts it (`convert_hf`, as `oi2jax convert-hf`),
and runs examples/llama_decode.oi greedily from a prompt inside one fused loop. Last, the same
checkpoint with a tokenizer and chat template (`tokenizer=True`) converted and chatted with
through `oi2jax.Generator`, as `oi2jax generate --chat --stats` does: the text and the stats
lines. The weights are random, so the text is gibberish.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import oi2jax  # noqa: E402
import models  # noqa: E402

NAME = "mlp_regression"


def _block(tree):
    """Wait for every array in a (nested) result; works for JAX arrays and NumPy alike."""
    try:
        import jax
        return jax.block_until_ready(tree)
    except Exception:
        return tree


def main() -> int:
    graph = HERE / f"{NAME}.oi"
    model = HERE / f"{NAME}.oinf"
    if not model.exists():
        models.build(NAME, model)
        print(f"built {model.relative_to(HERE.parent)}")

    t0 = time.perf_counter()
    prog = oi2jax.compile(str(graph), model=str(model))
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    outputs = prog.run({"x": x}, steps=1)
    t_first = time.perf_counter() - t0
    print(f"{graph.relative_to(HERE.parent)} with {model.relative_to(HERE.parent)}")
    np.set_printoptions(precision=4, suppress=True, linewidth=110)
    for name, value in outputs.items():
        print(f"{name}: {value.dtype}{list(value.shape)}")
        print(value)
    print(f"compile + first run: {t_first * 1e3:.1f} ms")

    # Step time: the jitted step function on device-resident state, after warm-up.
    state = prog.init_state()
    for _ in range(3):
        state, out = prog.step(state, x=x)
        _block((state, out))
    times = []
    for _ in range(20):
        t = time.perf_counter()
        state, out = prog.step(state, x=x)
        _block((state, out))
        times.append(time.perf_counter() - t)
    print(f"step time: median {statistics.median(times) * 1e6:.1f} us over {len(times)} steps "
          f"(min {min(times) * 1e6:.1f} us)")
    llama_demo()
    return 0


def llama_demo() -> None:
    import tempfile
    import llama_checkpoint
    from oi2jax.model.convert import convert_hf
    with tempfile.TemporaryDirectory() as tmp:
        ck = llama_checkpoint.write_random_llama(Path(tmp) / "tiny-llama-hf", vocab=320, hidden=64, layers=2,
                                                 heads=4, kv_heads=2, intermediate=128, max_positions=64,
                                                 tokenizer=True)
        model = Path(tmp) / "tiny-llama.oinf"
        summary = convert_hf(ck, model)
        print(f"\nconverted a random Llama checkpoint: "
              f"{' '.join(f'{k}={v}' for k, v in summary.sizevars.items())}")
        t0 = time.perf_counter()
        prog = oi2jax.compile(str(HERE / "llama_decode.oi"), model=str(model), ops=["nn"])
        prompt = np.array([1, 42, 7, 99], np.int32)
        res = prog.session().run({"token": prompt}, steps=24, feedback={"token": "next"}, collect=("next",))
        print(f"examples/llama_decode.oi: prompt {prompt.tolist()} -> greedy tokens {res['next'].tolist()[3:]} "
              f"({(time.perf_counter() - t0) * 1e3:.0f} ms with compilation)")
        chat_demo(model)


def chat_demo(model: Path) -> None:
    """`oi2jax generate MODEL --chat --prompt ... --stats` through the API."""
    question = "What is the capital of France?"
    gen = oi2jax.Generator(model)  # the model's tokenizer, chat template, stop ids and example graph
    res = gen.generate(question, chat=True, max_tokens=24)
    print(f"\nchat (its tokenizer and ChatML template; random weights, so the answer is gibberish):\n"
          f"user: {question}\nassistant: {res.text!r} ({res.finish})")
    print(f"compile {gen.compile_s + res.stats.compile_s:.3f} s ({gen.graph_path}: {gen.mode})")
    for line in res.stats.lines():
        print(line)


if __name__ == "__main__":
    raise SystemExit(main())
