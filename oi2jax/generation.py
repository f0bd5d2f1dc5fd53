"""Text in, text out: `oi2jax generate` and `oi2jax.generate(...)` / `Generator` (docs/decode.md).

A `Generator` opens a model file, takes from it what a generation needs (the tokenizer as
`tokenizer.json` text, the chat template, the stop ids and the name of the family's example graph:
`model/tokenizer.py`), compiles the graph once and runs generations on it: the prompt's tokens
teacher-forced, then each drawn token fed back, with temperature / top-k / top-p / min-p drawn on
the device by the nn op `sample` (a runtime value each: no recompile), until a stop id, the token
budget or the cache's capacity. The graph's interface is `llama_decode.oi`'s: a dynamic
`token: i32` in, a volatile `logits: f32[V]` out.

Nothing produced is lost: a runtime error in the middle of a generation (a cache past its
capacity, ...) ends it with what was generated before the failing step and the error, which the
CLI prints after the text (exit 1).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from . import api, ir
from .diagnostics import OiError
from .model.reader import open_model
from .model.tokenizer import META, encode_prompt, render_chat
from .ops.nn.sampling import sample

__all__ = ["Generator", "Generation", "Stats", "generate"]

_REPO = Path(__file__).resolve().parent.parent  # a source checkout: where `examples/` lives


@dataclass(frozen=True)
class Stats:
    """Seconds and token counts of one generation; compiling is counted apart (`Generator.compile_s`)."""

    prompt_tokens: int
    prompt_s: float
    generated_tokens: int
    generate_s: float

    def lines(self) -> list[str]:
        """The two lines `--stats` prints (other tools read these phrases)."""
        def rate(n, s):
            return f"{n / s:.1f}" if s > 0 else "inf"
        return [f"prompt {self.prompt_tokens} tokens in {self.prompt_s:.3f} s ({rate(self.prompt_tokens, self.prompt_s)} tok/s)",
                f"generated {self.generated_tokens} tokens in {self.generate_s:.3f} s "
                f"({rate(self.generated_tokens, self.generate_s)} tok/s)"]


@dataclass(frozen=True)
class Generation:
    """One generation: the generated `ids` (a stop id that ended it is not among them), their
    `text` (None without a tokenizer), why it ended (`"stop"`: a stop id, `"length"`: the token
    budget, `"error"`: `error` holds the runtime error of the failing step)."""

    prompt_ids: list[int]
    ids: list[int]
    text: str | None
    finish: str
    stats: Stats
    stop_id: int | None = None
    error: OiError | None = field(default=None, compare=False)


def _metadata(model) -> dict:
    return {k: v.value for k, v in model.metadata.items()}


def _graph_path(meta: dict, model_path: str, graph) -> str:
    if graph is not None:
        return str(graph)
    name = meta.get(META["graph"])
    if not isinstance(name, str):
        raise OiError(f"{model_path}: the model file names no example graph (metadata {META['graph']}): "
                      f"give the graph to run (--graph G.oi)")
    for candidate in (Path(name), _REPO / name):
        if candidate.is_file():
            return str(candidate)
    raise OiError(f"{model_path}: its example graph {name} is not found here (it lives in oi2jax's source "
                  f"checkout): give the graph to run (--graph G.oi)")


def _tokenizer(meta: dict, model_path: str, tokenizer):
    from tokenizers import Tokenizer  # optional: only text needs it

    try:
        if tokenizer is not None:
            return Tokenizer.from_file(str(tokenizer))
        text = meta.get(META["tokenizer"])
        return Tokenizer.from_str(text) if isinstance(text, str) else None
    except Exception as exc:  # tokenizers raises its own Exception type for a bad file
        where = tokenizer if tokenizer is not None else f"{model_path}: metadata {META['tokenizer']}"
        raise OiError(f"{where}: cannot read the tokenizer: {exc}") from None


class Generator:
    """A model file, its graph compiled once, its tokenizer: `generate(...)` runs a generation.

    `graph`: the `.oi` to run (default: the model's example graph); `tokenizer`: a
    `tokenizer.json` path (default: the model's own); `ops`: op sets (default `["nn"]`)."""

    def __init__(self, model, graph=None, *, tokenizer=None, ops=("nn",), precision: str = "highest"):
        self.model_path = str(model)
        t0 = time.perf_counter()
        with open_model(self.model_path) as m:
            meta = _metadata(m)
        self.tokenizer = _tokenizer(meta, self.model_path, tokenizer)
        self.chat_template = meta.get(META["chat_template"])
        self.bos_id = int(meta[META["bos"]]) if META["bos"] in meta else None
        self.eos_id = int(meta[META["eos"]]) if META["eos"] in meta else None
        stops = meta.get(META["stop"])
        self.stop_ids = [int(i) for i in np.ravel(stops)] if stops is not None else (
            [self.eos_id] if self.eos_id is not None else [])
        self.graph_path = _graph_path(meta, self.model_path, graph)
        self.program = api.compile(self.graph_path, model=self.model_path, ops=list(ops), precision=precision)
        self._check_interface()
        self._sample = jax.jit(_sampler)
        warm = self.program.session()  # compile every step form a generation uses now: counted apart
        for _ in range(3):  # a session's first step, then steps after unchecked ones (the prompt)
            out = warm.step(token=np.int32(0))
        warm.check()
        out = warm.step(token=np.int32(0))  # a step after a checked one (the generated tokens)
        warm.check()
        self._draw(out["logits"], 0.0, 0, 1.0, 0.0, 0, 0)
        warm.close()
        self.compile_s = time.perf_counter() - t0

    def _check_interface(self) -> None:
        g = self.program.graph
        token, logits = g.var("token"), g.var("logits")
        if token is None or token.kind != ir.MemKind.DYNAMIC or token.dtype != "i32" or token.dims:
            raise OiError(f"{self.graph_path}: generate needs a dynamic `token: i32` (the interface of "
                          f"examples/llama_decode.oi)")
        if logits is None or logits.kind != ir.MemKind.VOLATILE or len(logits.dims) != 1:
            raise OiError(f"{self.graph_path}: generate needs a volatile `logits: f32[V]` (the interface of "
                          f"examples/llama_decode.oi)")

    def _draw(self, logits, temperature, top_k, top_p, min_p, seed, position) -> int:
        tok, nan = self._sample(logits, np.float32(temperature), np.int32(top_k), np.float32(top_p),
                                np.float32(min_p), np.uint32(seed), np.int32(position))
        if bool(nan):
            raise OiError(f"sample: the logits of position {position} hold a NaN")
        return int(tok)

    def prompt_ids(self, prompt: str, *, chat: bool = False, system: str | None = None) -> list[int]:
        """The token ids of a text prompt (`chat`: rendered with the model's chat template first)."""
        if self.tokenizer is None:
            raise OiError(f"{self.model_path}: the model file holds no tokenizer: give a tokenizer.json "
                          f"(--tokenizer) or the prompt's token ids (--prompt-ids)")
        if chat:
            if not isinstance(self.chat_template, str):
                raise OiError(f"{self.model_path}: the model file holds no chat template (metadata "
                              f"{META['chat_template']}): leave out --chat")
            messages = ([{"role": "system", "content": system}] if system is not None else []) + [
                {"role": "user", "content": prompt}]
            prompt = render_chat(self.chat_template, messages, add_generation_prompt=True,
                                 bos_token=self._token_text(self.bos_id), eos_token=self._token_text(self.eos_id))
        elif system is not None:
            raise OiError("--system needs --chat (a system message is part of a chat template)")
        return encode_prompt(self.tokenizer, prompt, self.bos_id)

    def _token_text(self, token_id) -> str:
        if token_id is None or self.tokenizer is None:
            return ""
        return self.tokenizer.id_to_token(token_id) or ""

    def decode(self, ids) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def generate(self, prompt: str | None = None, *, prompt_ids=None, chat: bool = False, system: str | None = None,
                 max_tokens: int = 256, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0, seed: int = 0, stop_ids=None, ignore_eos: bool = False,
                 on_text=None) -> Generation:
        """Generate from a text `prompt` (or `prompt_ids`) until a stop id, `max_tokens` or an error.

        `temperature` 0 is greedy (the default); `stop_ids`: more stop ids besides the model's
        (`ignore_eos`: only these). `on_text(piece)` is called with the text as it is produced
        (pieces that end inside a multi-byte character wait for the next token)."""
        if (prompt is None) == (prompt_ids is None):
            raise OiError("give a prompt (text) or prompt_ids, not both")
        ids = self.prompt_ids(prompt, chat=chat, system=system) if prompt is not None else [
            int(i) for i in np.ravel(np.asarray(prompt_ids))]
        if not ids:
            raise OiError("the prompt has no tokens")
        _check_settings(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                        seed=seed)
        stops = set(() if ignore_eos else self.stop_ids) | {int(i) for i in (stop_ids or ())}
        sess = self.program.session()
        t0 = time.perf_counter()
        for tok in ids[:-1]:
            sess.step(token=np.int32(tok))
        logits = sess.step(token=np.int32(ids[-1]))["logits"]
        sess.check()  # the prompt's error, if any, raises here: nothing was generated
        t1 = time.perf_counter()
        out, shown, finish, stop_id, error = [], "", "length", None, None
        position = len(ids)
        try:
            while len(out) < max_tokens:
                tok = self._draw(logits, temperature, top_k, top_p, min_p, seed, position)
                if tok in stops:
                    finish, stop_id = "stop", tok
                    break
                out.append(tok)
                if on_text is not None and self.tokenizer is not None:
                    text = self.decode(out)
                    if not text.endswith("\ufffd") and len(text) > len(shown):
                        on_text(text[len(shown):])
                        shown = text
                if len(out) == max_tokens:
                    break
                logits = sess.step(token=np.int32(tok))["logits"]
                sess.check()  # a failed step's logits are never drawn from (a host read of its flags)
                position += 1
        except OiError as exc:  # the failing step's error; the tokens before it are kept
            finish, error = "error", exc
        t2 = time.perf_counter()
        sess.close()
        text = self.decode(out)
        if on_text is not None and text is not None and len(text) > len(shown):
            on_text(text[len(shown):])
        stats = Stats(prompt_tokens=len(ids), prompt_s=t1 - t0, generated_tokens=len(out), generate_s=t2 - t1)
        return Generation(prompt_ids=ids, ids=out, text=text, finish=finish, stats=stats, stop_id=stop_id, error=error)


class _NanFlag:
    """The sampler's op context outside a graph: records whether the logits held a NaN (the
    settings are checked on the host first, `_check_settings`)."""

    def __init__(self):
        self.nan = jnp.bool_(False)

    def fail_if(self, cond, message, value):
        self.nan = self.nan | cond


def _sampler(logits, temperature, top_k, top_p, min_p, seed, position):
    flag = _NanFlag()
    tok = sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                 position=position, ctx=flag)
    return tok, flag.nan


def _check_settings(*, max_tokens, temperature, top_k, top_p, min_p, seed) -> None:
    def whole(name, value, low, high=None):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low or (
                high is not None and value > high):
            span = f"{low}..{high}" if high is not None else f">= {low}"
            raise OiError(f"{name} must be a whole number {span}, got {value!r}")

    def number(name, value, ok, what):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not np.isfinite(value) \
                or not ok(float(value)):
            raise OiError(f"{name} must be {what}, got {value!r}")

    whole("max_tokens", max_tokens, 0)
    whole("top_k", top_k, 0, 2**31 - 1)
    whole("seed", seed, 0, 2**32 - 1)
    number("temperature", temperature, lambda v: v >= 0, "a number >= 0 (0: greedy)")
    number("top_p", top_p, lambda v: 0 < v <= 1, "in (0, 1] (1: off)")
    number("min_p", min_p, lambda v: 0 <= v <= 1, "in [0, 1] (0: off)")


def generate(model, prompt: str | None = None, *, graph=None, tokenizer=None, ops=("nn",), **options) -> Generation:
    """One generation with a fresh `Generator(model, graph, tokenizer=, ops=)`: see `Generator.generate`."""
    return Generator(model, graph, tokenizer=tokenizer, ops=ops).generate(prompt, **options)
