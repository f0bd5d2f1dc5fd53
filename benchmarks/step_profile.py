"""The oi2jax side of benchmarks/llamacpp.py's profile: where one decode step's time goes.

`profile_worker` (run in its own process) compiles a model's example graph as `oi2jax generate`
does, runs the prompt, traces a few decode steps with `jax.profiler` and attributes XLA's per-op
events through the optimized HLO to the DSL ops that made them (oi2jax names a scope
`<node>:<op>` per node; a dot XLA rewrote without metadata by the weight it reads);
`cost_worker`: XLA's cost analysis of the compiled step. `profile_table` / `gap`: the report's
sections.
"""
from __future__ import annotations

import gzip
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def profile_worker(oinf: str, graph: str, ids_path: str, steps: int = 5, kernels: str = "jax", kv_dtype=None) -> dict:
    """In a subprocess: compile `oinf`'s example graph as generate does, run the prompt, then trace
    `steps` decode steps; ms per step per DSL op (via the HLO's op_name) and XLA's cost analysis."""
    import jax

    from oi2jax.generation import Generator

    gen = Generator(oinf, graph or None, kernels=kernels, kv_dtype=kv_dtype)
    prog = gen.program(1)  # the decode step (S=1 of a step graph, or the one-token graph)
    ids = [int(i) for i in np.load(ids_path)]
    sess = prog.session()
    for tok in ids:
        out = sess.step(**_token(gen, tok))
    sess.check()
    t0 = time.perf_counter()
    compiled = prog.lower(**_token(gen, 0)).compile()
    cost_compile_s = time.perf_counter() - t0
    ca = compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, list) else ca
    scope_of = hlo_scopes(compiled.as_text(), int(np.shape(out["logits"])[0]))
    tok = int(np.argmax(np.asarray(out["logits"])))
    for _ in range(2):
        out = sess.step(**_token(gen, tok))
        sess.check()
    trace = Path(tempfile.mkdtemp(prefix="oi2jax-profile-"))
    t0 = time.perf_counter()
    jax.profiler.start_trace(str(trace), create_perfetto_trace=True)
    for _ in range(steps):
        out = sess.step(**_token(gen, tok))
        sess.check()
    jax.profiler.stop_trace()
    traced_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        out = sess.step(**_token(gen, tok))
        sess.check()
    untraced_ms = (time.perf_counter() - t0) / steps * 1e3
    names = set(re.findall(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=", compiled.as_text(), re.M))
    names = {n for n in names if not re.match(r"(while|conditional|call)\b", n)}  # containers: their ops count
    try:
        events = [(n, d) for n, d in thunk_events(next(trace.rglob("perfetto_trace.json.gz"))) if n in names]
    finally:
        shutil.rmtree(trace, ignore_errors=True)  # the trace is read; nothing left in the temp folder
    parts: dict[str, float] = {}
    for name, dur_us in events:
        part = scope_of.get(name, "(unattributed: " + re.sub(r"[.\d]+$", "", name) + ")")
        parts[part] = parts.get(part, 0.0) + dur_us / 1e3 / steps
    return {"parts": parts, "step_ms_untraced": untraced_ms, "step_ms_traced": traced_s / steps * 1e3,
            "bytes_accessed": float(ca.get("bytes accessed", float("nan"))), "flops": float(ca.get("flops", float("nan"))),
            "cost_compile_s": cost_compile_s, "position": len(ids) + 2}


_SCOPE = re.compile(r"(\d+):(\w+)")


def hlo_scopes(hlo: str, vocab: int) -> dict[str, str]:
    """{HLO instruction name: the DSL op it computes}, from the op_name metadata's innermost
    `<node>:<op>` scope; a `linear` that touches a vocabulary-sized array is "linear (lm_head)".
    A fusion or call without metadata takes its computation's most frequent label."""
    out, comp_labels, current = {}, {}, None
    lines = hlo.splitlines()
    for line in lines:
        head = re.match(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s+[({]", line)
        if head and " = " not in line:
            current = head.group(1)
            continue
        m = re.match(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=", line)
        op = re.search(r'op_name="([^"]*)"', line)
        if not m or not op:
            continue
        scopes = _SCOPE.findall(op.group(1))
        if not scopes:
            continue
        label = scopes[-1][1]
        if label == "linear" and re.search(rf"\[{vocab}\b|\b{vocab}\]", line):
            label = "linear (lm_head)"
        out[m.group(1)] = label
        comp_labels.setdefault(current, []).append(label)
    for line in lines:  # no metadata (XLA's rewritten dots): the weight it reads, or its computation's label
        m = re.match(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=", line)
        if not m or m.group(1) in out:
            continue
        weight = re.search(r"%consts__([A-Za-z]+(?:_[A-Za-z]+)*)_", line)
        call = re.search(r"\b(?:calls|to_apply|body)=%?([\w.\-]+)", line)
        if weight and re.search(r"\b(?:dot|convolution|fusion)\(", line):
            out[m.group(1)] = "linear (lm_head)" if weight.group(1) in ("lm_head", "embed") else f"linear ({weight.group(1)})"
        elif call and comp_labels.get(call.group(1)):
            labels = comp_labels[call.group(1)]
            out[m.group(1)] = max(set(labels), key=labels.count)
    return out


MATVECS, LM_HEAD = "layers' linear (matvecs)", "lm_head (final linear)"


def part_group(label: str) -> str:
    """The coarse part of a DSL-op label: the layers' matrix-vector products, the lm_head, attention."""
    if label == "linear (lm_head)":
        return LM_HEAD
    if label.startswith("linear"):
        return MATVECS
    if label == "attention":
        return "attention"
    if label.startswith("cache"):
        return "cache reads / writes"
    if label.startswith("("):
        return "unattributed XLA ops"
    return "the rest (norms, rope, elementwise, embedding, argmax)"


def thunk_events(path: Path) -> list[tuple[str, float]]:
    """(name, µs) of every complete event in a perfetto trace."""
    trace = json.load(gzip.open(path))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [(e["name"], float(e.get("dur", 0.0))) for e in events if e.get("ph") == "X" and "name" in e]



def _token(gen, tok: int) -> dict:
    """One decode step's token input: `tokens: i32[1]` of a step graph, `token: i32` of a one-token graph."""
    value = np.int32(tok)
    if len(gen.program(1).bound.shape(gen.token_input)) == 1:
        value = np.asarray([tok], np.int32)
    return {gen.token_input: value}


def cost_worker(oinf: str, graph: str, kernels: str = "jax", kv_dtype=None) -> dict:
    """In a subprocess: XLA's cost analysis of the compiled step of `oinf`'s example graph."""
    from oi2jax.generation import Generator
    gen = Generator(oinf, graph or None, kernels=kernels, kv_dtype=kv_dtype)
    t0 = time.perf_counter()
    ca = gen.program(1).lower(**_token(gen, 0)).compile().cost_analysis()
    ca = ca[0] if isinstance(ca, list) else ca
    return {"bytes_accessed": float(ca.get("bytes accessed", float("nan"))), "flops": float(ca.get("flops", float("nan"))),
            "cost_compile_s": time.perf_counter() - t0}



def gap(r: dict, rate: float) -> list[str]:
    """The profiled type's decode gap in numbers: bytes, the rate they are read at, the parts."""
    p = r["profile"]
    if "error" in p or "oi_ms" not in r:
        return []
    total = sum(p["parts"].values())
    groups: dict[str, float] = {}
    for name, ms in p["parts"].items():
        groups[part_group(name)] = groups.get(part_group(name), 0.0) + ms
    read = r.get("oi_bytes") or p["bytes_accessed"]  # XLA's count (+ what jax.ffi calls read: --kernels ggml)
    out = [f"In numbers ({r['kind']}): oi2jax's step reads {read / 1e6:.0f} MB (XLA's count, with the weights "
           f"jax.ffi calls read) where the GGUF's weights are {r['tensor_bytes'] / 1e6:.0f} MB "
           f"({read / r['tensor_bytes']:.1f}x); at {r['oi_ms']:.1f} ms per generated token that is "
           f"{read / r['oi_ms'] / 1e6:.1f} GB/s against a copy rate of {rate / 1e9:.1f} GB/s."]
    if "lcp_ms" in r:
        out[0] += (f" llama.cpp: {r['lcp_ms']:.2f} ms per token, {r['lcp_bytes'] / 1e6:.0f} MB "
                   f"({r['lcp_gbs']:.1f} GB/s); oi2jax takes {r['oi_ms'] / r['lcp_ms']:.1f}x as long.")
    out += ["", f"The profiled step takes {p['step_ms_untraced']:.1f} ms (Session.step + check, untraced, in the "
                f"profile's own process); its XLA ops' events sum to {total:.1f} ms: the layers' linear "
                f"{groups.get(MATVECS, 0.0):.1f}, the lm_head {groups.get(LM_HEAD, 0.0):.1f}, attention "
                f"{groups.get('attention', 0.0):.1f} (an op XLA splits over threads can count more than its wall time)."]
    return out


def profile_table(r: dict) -> list[str]:
    p = r["profile"]
    head = f"## Where oi2jax's decode step goes ({r['kind']}"
    if "error" in p:
        return [head + ")", "", f"profile failed: {p['error']}"]
    total = sum(p["parts"].values())
    groups: dict[str, float] = {}
    for name, ms in p["parts"].items():
        groups[part_group(name)] = groups.get(part_group(name), 0.0) + ms
    out = [head + f", at position {p['position']})", "",
           f"`jax.profiler` trace of {r['kind']}'s compiled step as `generate` runs it (XLA CPU per-op events, each "
           f"attributed through the optimized HLO to the DSL op that made it: op_name scopes `<node>:<op>`, or the "
           f"weight a rewritten dot reads); step {p['step_ms_untraced']:.1f} ms untraced (Session.step + check), "
           f"{p['step_ms_traced']:.1f} ms traced; the XLA ops' events sum to {total:.1f} ms; XLA cost analysis "
           f"of the step: {p['bytes_accessed'] / 1e6:.0f} MB accessed, {p['flops'] / 1e6:.0f} MFLOP.", "",
           "| part | ms per step | share of the XLA ops |", "|---|---|---|"]
    out += [f"| {g} | {ms:.2f} | {100 * ms / total:.0f}% |" for g, ms in sorted(groups.items(), key=lambda t: -t[1])]
    out += ["", "| DSL op (weight) | ms per step | share |", "|---|---|---|"]
    for name, ms in sorted(p["parts"].items(), key=lambda t: -t[1]):
        if ms >= 0.005 * total:
            out.append(f"| {name} | {ms:.2f} | {100 * ms / total:.0f}% |")
    return out
