"""Benchmark cases: each SPEC §9 example scaled through its size variables (and, for the two
`@fixed` tables, through the `.oi` text), with a deterministic model written by
`oi2jax.model.save` and deterministic inputs."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


@dataclass
class Case:
    name: str                      # unique label, e.g. "mlp_regression B=64 W=1024"
    example: str                   # examples/<example>.oi, benchmarks/handwritten/<example>.py
    sizes: dict                    # the model's sizevars
    static: dict = field(default_factory=dict)   # handwritten.make(..., **static) (from .oi text)
    steps: int = 1_000_000         # most steps one timed run may take from a fresh state
    looped: bool = False           # a `loop` in the graph (interpreter target: >= 10x)
    chart: str | None = None       # series this case belongs to (x = `size`)
    size: int = 0                  # x of the chart
    yield_mode: str = "fused"
    seed: int = 0
    ops: tuple = ()                # op sets the graph needs (oi2jax.compile(..., ops=))

    def source(self) -> str:
        text = (EXAMPLES / f"{self.example}.oi").read_text()
        if self.example == "kv_cache_decode":
            rows = self.static["rows"]
            text = text.replace("@fixed(i=4)", f"@fixed(i={rows})").replace("k_hist: f32[4, D]", f"k_hist: f32[{rows}, D]")
        elif self.example == "cache_window_slice":
            rows, width = self.static["rows"], self.static["width"]
            text = (text.replace("@fixed(i=6)", f"@fixed(i={rows})")
                    .replace("window: f32[3, D]", f"window: f32[{width}, D]")
                    .replace("end: i32 @init(3)", f"end: i32 @init({width})"))
        return text

    def tensors(self) -> dict:
        rng = np.random.default_rng(self.seed)
        return TENSORS[self.example](rng, self.sizes, self.static)

    def inputs(self) -> dict:
        rng = np.random.default_rng(self.seed + 1)
        s = self.sizes
        f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
        return {
            "attention_decode": lambda: {"x": f32(s["D"])},
            "cache_window_slice": lambda: {"x": f32(s["D"])},
            "kv_cache_decode": lambda: {"q": f32(s["D"])},
            "linear_attention": lambda: {"x": f32(s["B"], s["D"])},
            "mlp_regression": lambda: {"x": f32(s["B"], s["D"])},
            "moe_routing": lambda: {"x": f32(s["B"], s["D"]), "route": np.bool_(True)},
            "online_weight_update": lambda: {"x": f32(s["B"], s["D"]), "delta": 1e-3 * f32(s["D"], s["O"])},
            "quantized_linear": lambda: {},
            "residual_mlp_stack": lambda: {"x": f32(s["B"], s["D"])},
            "stability_guard": lambda: {"x": f32(s["B"], s["D"])},
            "streaming_pipeline": lambda: {"x": f32(s["B"], s["D"])},
        }[self.example]()

    def params(self) -> int:
        """Number of model parameters (elements of all tensors)."""
        return int(sum(np.size(getattr(t, "data", t)) for t in self.tensors().values()))


def _dense(rng, fan_in, fan_out):
    return (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)


def _bias(rng, n):
    return (0.05 * rng.standard_normal(n)).astype(np.float32)


def _quantized(rng, s, st):
    from oi2jax.model import Tensor
    return {"x": Tensor("i4", rng.integers(-8, 8, size=(s["B"], s["D"])).astype(np.int8)),
            "w": Tensor("i4", rng.integers(-8, 8, size=(s["D"], s["O"])).astype(np.int8))}


TENSORS = {
    "attention_decode": lambda rng, s, st: {
        "norm_w": (1 + 0.1 * rng.standard_normal(s["D"])).astype(np.float32),
        **{n: _dense(rng, s["D"], s["D"]) for n in ("Wq", "Wk", "Wv", "Wo")},
        "scale": np.float32(1 / np.sqrt(s["D"]))},
    "cache_window_slice": lambda rng, s, st: {"limit": np.array(st["rows"], np.int32), "zero": np.array(0, np.int32)},
    "kv_cache_decode": lambda rng, s, st: {"zero": np.zeros(s["D"], np.float32)},
    "linear_attention": lambda rng, s, st: {
        **{f"attn.{k}.{h}": _dense(rng, s["D"], s["D"]) for h in range(s["num_heads"]) for k in ("wq", "wk", "wv")},
        "w_out": _dense(rng, s["D"], s["D"])},
    "mlp_regression": lambda rng, s, st: {"w1": _dense(rng, s["D"], s["H"]), "b1": _bias(rng, s["H"]),
                                          "w2": _dense(rng, s["H"], s["O"]), "b2": _bias(rng, s["O"])},
    "moe_routing": lambda rng, s, st: {"w_gate": _dense(rng, s["D"], 2), "w0": _dense(rng, s["D"], s["O"]),
                                       "b0": _bias(rng, s["O"]), "w1": _dense(rng, s["D"], s["O"]),
                                       "b1": _bias(rng, s["O"])},
    "online_weight_update": lambda rng, s, st: {"zero": np.zeros((s["D"], s["O"]), np.float32)},
    "quantized_linear": _quantized,
    "residual_mlp_stack": lambda rng, s, st: {
        "bias0": np.zeros(s["D"], np.float32),
        **{k: v for l in range(s["num_layers"])
           for k, v in ((f"res.mlp.w.{l}", _dense(rng, s["D"], s["D"])), (f"res.mlp.b.{l}", _bias(rng, s["D"])))}},
    "stability_guard": lambda rng, s, st: {"bias": _bias(rng, s["D"])},
    "streaming_pipeline": lambda rng, s, st: {"w": _dense(rng, s["D"], s["D"]), "bias": _bias(rng, s["D"])},
}


def mlp_case(b, w, chart=None):
    return Case(f"mlp_regression B={b} W={w}", "mlp_regression", {"B": b, "D": w, "H": w, "O": w},
                chart=chart, size=w)


def cases(profile: str) -> list[Case]:
    """profile: 'full' (<= ~15 min on 2 CPU cores), 'quick' (<= ~2 min), 'tiny' (the smoke test)."""
    if profile == "tiny":
        return [
            mlp_case(2, 8, chart="mlp"), mlp_case(2, 16, chart="mlp"),
            Case("residual_mlp_stack L=3", "residual_mlp_stack", {"B": 2, "D": 8, "num_layers": 3}, looped=True),
            Case("linear_attention", "linear_attention", {"B": 2, "D": 8, "num_heads": 2}, looped=True),
            Case("moe_routing", "moe_routing", {"B": 2, "D": 8, "O": 4}),
            Case("online_weight_update", "online_weight_update", {"B": 2, "D": 8, "O": 4}),
            Case("quantized_linear", "quantized_linear", {"B": 2, "D": 8, "O": 4}),
            Case("stability_guard", "stability_guard", {"B": 2, "D": 8}),
            Case("streaming_pipeline", "streaming_pipeline", {"B": 2, "D": 8}),
            Case("kv_cache_decode T=8", "kv_cache_decode", {"D": 4}, static={"rows": 8}, steps=8),
            Case("cache_window_slice", "cache_window_slice", {"D": 4}, static={"rows": 8, "width": 2}, steps=6),
            Case("attention_decode T=8", "attention_decode", {"D": 8, "T": 8}, steps=8, ops=("nn",)),
        ]
    quick = profile == "quick"
    widths = (64, 256, 1024) if quick else (64, 256, 1024, 2048, 4096)
    out = [mlp_case(64, w, chart="mlp") for w in widths]
    out += [mlp_case(1, 1024), mlp_case(256, 1024)] if not quick else [mlp_case(1, 256), mlp_case(256, 256)]
    d, big = (256, 1024) if quick else (512, 2048)
    layers = (1, 12) if quick else (1, 12, 48)
    out += [Case(f"residual_mlp_stack B=32 D={d} L={n}", "residual_mlp_stack",
                 {"B": 32, "D": d, "num_layers": n}, looped=True) for n in layers]
    out += [
        Case(f"linear_attention B=16 D={d} heads=8", "linear_attention", {"B": 16, "D": d, "num_heads": 8}, looped=True),
        Case(f"moe_routing B=128 D={big}", "moe_routing", {"B": 128, "D": big, "O": big}),
        Case(f"online_weight_update B=64 D={big // 2}", "online_weight_update", {"B": 64, "D": big // 2, "O": big // 2}),
        Case(f"quantized_linear B=256 D={big}", "quantized_linear", {"B": 256, "D": big, "O": big}),
        Case(f"stability_guard B=256 D={big * 2}", "stability_guard", {"B": 256, "D": big * 2}),
        Case(f"streaming_pipeline B=64 D={big // 2}", "streaming_pipeline", {"B": 64, "D": big // 2}),
    ]
    rows = 1024 if quick else 2048
    out += [
        Case(f"kv_cache_decode T={rows} D=128", "kv_cache_decode", {"D": 128}, static={"rows": rows}, steps=rows),
        Case(f"cache_window_slice rows={rows * 2} W=64 D=256", "cache_window_slice", {"D": 256},
             static={"rows": rows * 2, "width": 64}, steps=rows),
        Case(f"attention_decode T={rows} D=256 (nn ops)", "attention_decode", {"D": 256, "T": rows}, steps=rows,
             ops=("nn",)),
    ]
    return out


GROWTH_SOURCE = """\
// growable_table: an unfixed @table written at an incrementing index (auto-grown)
dynamic { x: f32[D]; }
persistent {
    t: i32 @init(0);
    A(i): f32[D] @table;
}
block entry {
    cache.write x >> A[t];
    cache.increment t;
    return;
}
"""
