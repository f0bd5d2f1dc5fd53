"""The prompt in one step (issue 40, Must show): a P-token prompt through examples/llama_prefill.oi
compiled at S = P, against benchmarks/handwritten/llama.py's `prefill` (the same math as one
jitted causal step, cache donated) and against today's token-by-token prompt (examples/
llama_decode.oi, one fused `Session.run` of P steps). Ratios measured in ONE process, medians of
interleaved runs; time to first token (compile, the prompt step, the first token on the host) in
fresh processes per side, alternating. oi2jax's prompt program is the one a greedy `generate`
runs: the temperature fixed at 0 (`Program.specialized`), as the hand-written side draws with
`jnp.argmax`. Before timing, the two prompt steps' last-row logits are
asserted within 1e-4 of the largest |logit|.

    python -m benchmarks.llama_prompt [--profile full|quick|tiny] [--repeats 5] [--fresh 3]

writes benchmarks/results/llama-prompt[-PROFILE].md (or --out FILE), with the load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import jax
import numpy as np

import oi2jax
from oi2jax.npz import write_text_atomic
from oi2jax.runtime.buckets import bucket_program
from benchmarks.handwritten.llama import LlamaJax
from benchmarks.llama import REPO, LlamaCase, block, case_list, make_model, prompt_tokens, rel

EXAMPLES = REPO / "examples"
TARGETS = {"prompt/hand": 1.15, "tokens/prompt": 20.0, "ttft": 1.5}


def _prompt_program(case: LlamaCase, model: Path):
    """The prompt step's program as a greedy `generate` runs it: the step graph at S = 1 with the
    temperature fixed at 0 (`Program.specialized`; the hand-written side draws with `jnp.argmax`),
    at S = P by the Generator's rule (runtime/buckets.py `bucket_program`: on a CPU its loops
    rolled, on the decode program's weights)."""
    decode = oi2jax.compile(str(EXAMPLES / "llama_prefill.oi"), model=str(model), ops=["nn"], sizes={"S": 1})
    greedy = decode.specialized({"temperature": 0.0})
    return bucket_program({1: greedy}, greedy, case.prompt)


def measure(case: LlamaCase, model: Path, repeats: int) -> dict:
    prompt = prompt_tokens(case)
    hand = LlamaJax.from_model(model, layers="unrolled")
    tokens, n = jax.device_put(prompt), jax.device_put(np.int32(case.prompt))
    t0 = time.perf_counter()  # oi2jax's front end alone (parse, check, model load, bind)
    prog = _prompt_program(case, model)
    # where the compile time goes: each side lowered and compiled once more, stage by stage
    t1 = time.perf_counter()
    lowered = prog.lower(tokens=tokens, n=n)
    t2 = time.perf_counter()
    compiled = lowered.compile(prog.compile_options)  # as a session compiles it
    t3 = time.perf_counter()
    hand_lowered = hand.prefill.lower(hand.params, hand.init_cache(), tokens)
    t4 = time.perf_counter()
    hand_lowered.compile()
    stages = dict(front_s=t1 - t0, lower_s=t2 - t1, xla_s=t3 - t2, hand_lower_s=t4 - t3,
                  hand_xla_s=time.perf_counter() - t4)

    def ours():
        out = prog.session().step(tokens=tokens, n=n)
        return block(out["logits"])

    def theirs():
        _, logits, _ = hand.prefill(hand.params, hand.init_cache(), tokens)
        return block(logits)

    err = rel(ours(), theirs())
    assert err <= 1e-4, f"prompt-step logits differ from the hand-written prefill: {err:.2e}"
    times = {"ours": [], "theirs": []}
    for _ in range(repeats):
        for name, fn in (("ours", ours), ("theirs", theirs)):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    decode = oi2jax.compile(str(EXAMPLES / "llama_decode.oi"), model=str(model), ops=["nn"])
    by_token = []
    for _ in range(2):  # the first compiles
        t = time.perf_counter()
        res = decode.session().run({"token": prompt})
        by_token.append(time.perf_counter() - t)
    assert rel(res["logits"], theirs()) <= 1e-4
    ma = compiled.memory_analysis()
    return dict(prompt_s=statistics.median(times["ours"]), hand_s=statistics.median(times["theirs"]),
                by_token_s=by_token[-1], rel_err=err, temp_bytes=getattr(ma, "temp_size_in_bytes", None),
                **stages)


def worker(side: str, case: LlamaCase, model: Path) -> dict:
    """Time to first token in a fresh process: compile, the prompt step, its `next` on the host."""
    # warm JAX and oi2jax on a trivial program, as benchmarks/llama.py's worker does: neither side
    # pays for importing its modules or the libraries' first use (the hand-written side's module is
    # imported with this one)
    warm = oi2jax.compile(str(EXAMPLES / "mlp_regression.oi"), model=str(EXAMPLES / "mlp_regression.oinf"),
                          ops=["nn"])  # the nn op set's modules imported too
    warm.session().run(dict(warm.defaults), steps=1)
    block(jax.jit(lambda v: v + 1)(np.ones(4, np.float32)))
    del warm
    prompt = prompt_tokens(case)
    t0 = time.perf_counter()
    if side == "oi2jax":
        prog = _prompt_program(case, model)
        first = int(np.asarray(prog.session().step(tokens=prompt, n=np.int32(case.prompt))["next"])[0])
    else:
        hand = LlamaJax.from_model(model, layers="unrolled")
        _, _, nxt = hand.prefill(hand.params, hand.init_cache(), prompt)
        first = int(nxt)
    return dict(ttft_s=time.perf_counter() - t0, first=first)


def ttft(case: LlamaCase, model: Path, repeats: int) -> dict:
    runs = {"oi2jax": [], "hand": []}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    for _ in range(repeats):
        for side in runs:
            cmd = [sys.executable, "-m", "benchmarks.llama_prompt", "--worker", side, "--model", str(model),
                   "--case", json.dumps(asdict(case))]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=1800)
            if proc.returncode != 0:
                raise RuntimeError(f"{side} worker failed:\n{proc.stderr[-3000:]}")
            runs[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert len({r["first"] for rs in runs.values() for r in rs}) == 1, runs
    return {f"ttft_{side}_s": statistics.median(r["ttft_s"] for r in rs) for side, rs in runs.items()}


def _fmt(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.2f} s"


def _mark(ok: bool, text: str) -> str:
    return text if ok else f"**{text}**"


def report(case: LlamaCase, r: dict, loads: tuple[str, str]) -> str:
    a, b = r["prompt_s"] / r["hand_s"], r["by_token_s"] / r["prompt_s"]
    c = r["ttft_oi2jax_s"] / r["ttft_hand_s"]
    return "\n".join([
        "# The prompt in one step (issue 40)", "",
        f"Machine: {os.uname().machine} ({os.cpu_count()} cpus); device: {jax.devices()[0].device_kind}; "
        f"JAX {jax.__version__}; load average {loads[0]} "
        f"before, {loads[1]} after. Case {case.name} ({case.sizes()}), a {case.prompt}-token prompt.",
        "examples/llama_prefill.oi at S = P (`Session.step`, a fresh session each run) against "
        "benchmarks/handwritten/llama.py `prefill` (one jitted causal step, cache donated); token by token: "
        "examples/llama_decode.oi as one fused `Session.run` of P steps. Medians of interleaved runs in one "
        "process; TTFT (compile + the prompt step + the first token on the host) in fresh processes. "
        f"Targets: prompt step <= {TARGETS['prompt/hand']}x hand-written, >= {TARGETS['tokens/prompt']:.0f}x "
        f"faster than token by token, TTFT <= {TARGETS['ttft']}x.", "",
        "| prompt step | hand-written | ratio | token by token | speed-up | TTFT oi2jax | TTFT hand | ratio | "
        "XLA temp bytes |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {_fmt(r['prompt_s'])} | {_fmt(r['hand_s'])} | {_mark(a <= TARGETS['prompt/hand'], f'{a:.2f}')} | "
        f"{_fmt(r['by_token_s'])} | {_mark(b >= TARGETS['tokens/prompt'], f'{b:.1f}x')} | "
        f"{_fmt(r['ttft_oi2jax_s'])} | {_fmt(r['ttft_hand_s'])} | {_mark(c <= TARGETS['ttft'], f'{c:.2f}')} | "
        f"{r['temp_bytes'] / 2**20:.1f} MiB |", "",
        f"Bold: outside its target. Checked before timing: last-row logits within 1e-4 ({r['rel_err']:.0e}).", "",
        f"Compile stages (in the measuring process): oi2jax front end (parse, check, model load) "
        f"{_fmt(r['front_s'])} + lowering (trace to StableHLO) {_fmt(r['lower_s'])} + XLA {_fmt(r['xla_s'])}; "
        f"hand-written trace {_fmt(r['hand_lower_s'])} + XLA {_fmt(r['hand_xla_s'])}.", ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.llama_prompt")
    ap.add_argument("--profile", default="full", choices=["full", "quick", "tiny"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fresh", type=int, default=3)
    ap.add_argument("--worker")
    ap.add_argument("--model")
    ap.add_argument("--case")
    ap.add_argument("--out", help="the results file (default benchmarks/results/llama-prompt[-PROFILE].md)")
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, LlamaCase(**json.loads(args.case)), Path(args.model))))
        return 0
    case = case_list(args.profile, gpu=False)[0]
    loads = [f"{os.getloadavg()[0]:.1f}"]
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(case, Path(tmp))
        r = measure(case, model, args.repeats)
        r.update(ttft(case, model, args.fresh))
    loads.append(f"{os.getloadavg()[0]:.1f}")
    text = report(case, r, tuple(loads))
    suffix = "" if args.profile == "full" else f"-{args.profile}"
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / f"llama-prompt{suffix}.md"
    write_text_atomic(out, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
