"""Text in, text out: `oi2jax generate` and `oi2jax.generate(...)` / `Generator` (docs/decode.md).

A `Generator` opens a model file, takes from it what a generation needs (the tokenizer as
`tokenizer.json` text, the chat template, the stop ids and the name of the family's example graph:
`model/tokenizer.py`), compiles the family's step graph and runs generations on it:

- **The prompt in steps of S tokens** (the step-graph contract, `examples/<family>_prefill.oi`
  beside the `<family>_decode.oi` the model names): a prompt of m tokens runs in the smallest
  bucket S >= m of the buckets (`runtime/buckets.py`: 1, then powers of two from 16 up to the
  cache capacity T), padded; a longer one in steps of the largest bucket, then the rest. Each bucket is one program
  (`Program.rebound`), compiled on first use and kept: prompts of any length compile no more step
  programs than the buckets they fall in. The last prompt step draws the first token.
- **The decode** is the S=1 program, one fused `Session.run`: each drawn token fed back
  (`feedback={"tokens": "next"}`), the stop ids and the token budget on the device (`stop=`),
  the tokens streamed to the host every `STREAM_EVERY` steps (`on_chunk`).
- **Sampling** on the device through the graph's inputs (`temperature`, `top_k`, `top_p`,
  `min_p`, `seed`: the nn op `sample`; runtime values, no recompile). A greedy generation
  (temperature 0) runs programs with the temperature fixed at 0 (`Program.specialized`, on the
  same placed weights: `greedy_programs`), which compile the greedy draw alone (no filters or
  noise: about 0.6 s less to compile a prompt program of a 16M-weight Llama); the first sampled
  generation compiles the general ones, kept from then on.
- A graph of the token-by-token interface (`llama_decode.oi`: a dynamic `token: i32`, a volatile
  `next: i32`) runs the prompt as a fused run of 1-token steps, then the same decode (`mode`
  says which; `--stats` names it); without sampling inputs it is greedy only (its `next`).

Nothing produced is lost: a runtime error in the middle of a generation (a cache past its
capacity, ...) ends it with what was generated before the failing step and the error, which the
CLI prints after the text (exit 1).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np

from . import api, ir
from ._signals import deferred, raise_pending
from .diagnostics import OiError, check_whole
from .model.reader import open_model
from .npz import regular_input
from .model.chat_template import render_chat
from .model.tokenizer import META, encode_prompt, read_special_tokens, stored_special_ids
from .runtime.buckets import bucket_program, program_buckets, prompt_steps
from .runtime.runargs import call_limit, check_collected, collected_rows
from .runtime.runstats import apart, compile_seconds
from .runtime import tokens
from .runtime.session import compile_run
from .runtime.settings import OFF, SETTINGS, as_input, check_settings

__all__ = ["Generator", "Generation", "Stats", "generate"]

GRAPHS = Path(__file__).resolve().parent / "graphs"  # the families' step graphs, shipped in the package
STREAM_EVERY = 8  # tokens per fused call when the text is streamed (`on_text`)


@dataclass(frozen=True)
class Stats:
    """Seconds and token counts of one generation; compiling is counted apart (`Generator.compile_s`)."""

    prompt_tokens: int
    prompt_s: float
    generated_tokens: int
    generate_s: float
    compile_s: float = 0.0  # compiling during this generation (a bucket's first use, the decode loop's first run)
    # of the generated tokens, those a prompt step drew (a sequence's first: its time is the prompt's)
    from_prompt: int = 1

    @property
    def decoded_tokens(self) -> int:
        """The generated tokens the decode steps drew, in `generate_s`: the decode rate's count."""
        return max(self.generated_tokens - self.from_prompt, 0)

    def lines(self) -> list[str]:
        """The two lines `--stats` prints (other tools read these phrases). The generated rate is
        that of the decode steps: M - 1 tokens in S s for one sequence (its first token is drawn by
        the prompt's last step, in the prompt's time); n/a where no decode step drew one."""
        def rate(n, s):
            return f"{n / s:.1f}" if s > 0 else "inf"
        decoded = self.decoded_tokens
        return [f"prompt {self.prompt_tokens} tokens in {self.prompt_s:.3f} s ({rate(self.prompt_tokens, self.prompt_s)} tok/s)",
                f"generated {self.generated_tokens} tokens in {self.generate_s:.3f} s "
                f"({rate(decoded, self.generate_s) if decoded else 'n/a'} tok/s)"]


@dataclass(frozen=True)
class Generation:
    """One generation: the generated `ids` (a stop id that ended it is not among them), their
    `text` (None without a tokenizer), why it ended (`"stop"`: a stop id, `"length"`: the token
    budget, `"error"`: `error` holds the runtime error of the failing step; `"interrupted"`: the
    `partial` of a KeyboardInterrupt, Ctrl-C during `generate`)."""

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
    # a converter names its family's graph as `examples/<name>`: the copy shipped in the package
    # (examples/ links to it). Only such a name: a model file (downloaded, say) never chooses which
    # local file is read (`/etc/passwd` was parsed and its first line shown in the error)
    shipped = GRAPHS / Path(name).name
    if name == f"examples/{shipped.name}" and shipped.suffix == ".oi" and shipped.is_file():
        return str(shipped)
    known = ", ".join(sorted(f"examples/{p.name}" for p in GRAPHS.glob("*_decode.oi")))
    raise OiError(f"{model_path}: its example graph {name!r} is not a graph shipped with oi2jax ({known}): "
                  f"give the graph to run (--graph G.oi)")


def _tokenizer(meta: dict, model_path: str, tokenizer):
    from tokenizers import Tokenizer  # optional: only text needs it

    try:
        if tokenizer is not None:
            regular_input(tokenizer, "the tokenizer")
            return Tokenizer.from_file(str(tokenizer))
        text = meta.get(META["tokenizer"])
        return Tokenizer.from_str(text) if isinstance(text, str) else None
    except OiError:
        raise
    except Exception as exc:  # tokenizers raises its own Exception type for a bad file
        where = tokenizer if tokenizer is not None else f"{model_path}: metadata {META['tokenizer']}"
        raise OiError(f"{where}: cannot read the tokenizer: {exc}") from None


class Generator:
    """A model file, its step graph compiled once per prompt bucket, its tokenizer: `generate(...)`
    runs a generation (see the module doc).

    `graph`: the `.oi` to run (default: the model's family's step graph `<family>_prefill.oi`
    beside the `<family>_decode.oi` the model names, else that decode graph token by token);
    `tokenizer`: a `tokenizer.json` path (default: the model's own); `ops`: op sets (default
    `["nn"]`); `kernels`: as `oi2jax.compile`'s ("ggml": llama.cpp's kernels for weights kept in
    GGML blocks); `kv_dtype` ("f16" | "bf16" | "f32"; default: as the graph declares them): the
    graph's cache tables, its K/V caches, stored in that dtype, as `oi2jax.compile`'s `table_dtype`
    (llama.cpp's KV cache is f16). `compile_ahead`: a generation's fused decode loop, the first
    time one of its length and stop ids is needed, is compiled in a second thread while the
    prompt's program compiles, not after the prompt (XLA compiles on one core); default: where
    JAX's persistent compilation cache is off (where it is on, as `oi2jax generate` turns it on,
    a later process reads the loop from it, and compiling beside the prompt's run slowed the
    prompt; docs/performance.md "Compile time"). `specialize_greedy` (default True): greedy
    generations run programs with the temperature fixed at 0, which compile no sampler (a
    faster first token); the first sampled generation then compiles the general programs, once.
    False: every generation runs the general programs (no compile when the settings change).
    `mode`: "prompt steps" or "token by token"; `programs`: the compiled step programs by S (1:
    the decode step); `greedy_programs`: the same with the temperature fixed at 0 (greedy
    generations run these; empty where the graph has no dynamic temperature, or with
    `specialize_greedy=False`)."""

    def __init__(self, model, graph=None, *, tokenizer=None, ops=("nn",), precision: str = "highest",
                 kernels: str = "jax", kv_dtype: str | None = None, compile_ahead: bool | None = None,
                 specialize_greedy: bool = True):
        self.model_path = str(model)
        self.compile_ahead = compile_ahead
        self._ahead: set = set()  # the decode loops compiled ahead (or being compiled)
        t0 = time.perf_counter()
        with open_model(self.model_path) as m:
            meta = _metadata(m)
        self.tokenizer = _tokenizer(meta, self.model_path, tokenizer)
        self.chat_template = meta.get(META["chat_template"])
        # the special tokens a chat template receives (transformers' special_tokens_map), by name
        self.special_tokens = read_special_tokens(meta.get(META["special"]), self.model_path)
        # (a damaged entry -- a string, a float, an array for one id -- is an error naming the key)
        self.bos_id, self.eos_id, stops = stored_special_ids(meta, self.model_path)
        self.stop_ids = stops if stops is not None else ([self.eos_id] if self.eos_id is not None else [])
        self.graph_path = _graph_path(meta, self.model_path, graph)
        if graph is None:  # the family's step graph beside the decode graph the model names, if it has one
            prefill = Path(self.graph_path).with_name(Path(self.graph_path).name.replace("_decode.oi", "_prefill.oi"))
            if prefill != Path(self.graph_path) and prefill.is_file() and \
                    _interface(str(prefill), api.load_graph(prefill), strict=False) == PROMPT_STEPS:
                self.graph_path = str(prefill)
        self.mode = _interface(self.graph_path, api.load_graph(self.graph_path))
        sizes = {"S": 1} if self.mode == PROMPT_STEPS else None
        # widen_floats: a bf16/f16 conversion (a checkpoint's own dtype, kept by convert-hf) runs the
        # family's f32 graph on its exact f32 values, as a --dtype f32 conversion would
        decode = api.compile(self.graph_path, model=self.model_path, ops=ops, precision=precision, sizes=sizes,
                             widen_floats=True, kernels=kernels, table_dtype=kv_dtype)
        self.programs = {1: decode}
        self.settings = {k for k in SETTINGS if decode.graph.var(k) is not None and
                         decode.graph.var(k).kind == ir.MemKind.DYNAMIC}
        # greedy generations: the temperature fixed at 0 (the same weights; its programs compile on first use)
        if not isinstance(specialize_greedy, bool):
            raise OiError(f"specialize_greedy: expected True or False, got {specialize_greedy!r}")
        self.greedy_programs = {1: decode.specialized({"temperature": 0.0})} \
            if specialize_greedy and "temperature" in self.settings else {}
        self.buckets = program_buckets(decode) if self.mode == PROMPT_STEPS else (1,)
        self.vocab = tokens.vocabulary(decode)  # prompt and stop ids are checked against it
        outside = [i for i in self.stop_ids if self.vocab is not None and i >= self.vocab]
        if outside:  # a stop id the model can never draw: the generation would silently never stop on it
            key = META["stop"] if stops is not None else META["eos"]
            raise OiError(f"{self.model_path}: metadata {key}: id {outside[0]} is outside the vocabulary of "
                          f"{self.graph_path} (0..{self.vocab - 1}): it can never be generated")
        self.capacity = tokens.capacity(decode)  # the cache's positions (the step-graph contract's T)
        # compiling is counted apart: what compiles during a generation (a bucket's first use, the
        # fused decode loop's first run) is measured there and left out of its rates
        self.compile_s = time.perf_counter() - t0  # reading the model file and compiling the S=1 program

    @property
    def compiles(self) -> int:
        """Traces of step kernels over every program compiled so far (the recompile counter)."""
        return sum(p.compiles for p in (*self.programs.values(), *self.greedy_programs.values()))

    def memory(self) -> dict:
        """Bytes the device holds for generating (`Program.memory`): the weights, which every step
        program shares, and one sequence's state (the KV cache), as the decode program has it."""
        return self.programs[1].memory()

    def programs_for(self, settings: dict) -> dict:
        """The step programs by S a generation with these sampling settings runs: the greedy ones
        at temperature 0 (where the graph has them), else the general ones."""
        return self.greedy_programs if self.greedy_programs and not settings.get("temperature") else self.programs

    def program(self, size: int, programs: dict | None = None):
        """The step program of S = `size` (a bucket) of `programs` (default: the general ones),
        compiled on first use and kept."""
        programs = self.programs if programs is None else programs
        return bucket_program(programs, programs[1], size)

    def _inputs(self, settings: dict) -> dict:
        """The sampling settings as the graph's inputs (its dtypes); one the graph lacks must be off.
        A greedy generation's programs take no temperature (fixed at 0 there)."""
        out = {}
        fixed = self.programs_for(settings) is self.greedy_programs
        for name, value in settings.items():
            if name == "temperature" and fixed:
                continue
            if name in self.settings:
                out[name] = as_input(name, value)
            elif value != OFF[name]:
                raise OiError(f"{self.graph_path}: {name}={value}: the graph has no dynamic `{name}` (it samples "
                              f"greedily through its `next`); run a graph with sampling inputs (the step-graph "
                              f"contract, examples/llama_prefill.oi)")
        return out

    def prompt_step(self, ids, **settings) -> "PromptResult":
        """Run the prompt `ids`: the session after it (its state goes on in the S=1 program), the
        first drawn token and the last prompt token's logits (f32[V], host)."""
        ids = np.asarray(ids, np.int32)
        settings = {**OFF, **settings}
        given, programs = self._inputs(settings), self.programs_for(settings)
        if self.mode != PROMPT_STEPS:  # token by token: one step per prompt token (a fused run would compile per length)
            sess = programs[1].session()
            for tok in ids:
                out = sess.step(token=tok, **given)
            sess.check()  # the prompt's error, if any, raises here
            return PromptResult(sess, int(out["next"]), np.asarray(out["logits"]))
        state, start = programs[1].init_state(), 0  # every prompt step: one kernel form (from a state)
        done = 0  # the sequence's steps so far: an error names its step among them, prompt steps included
        for size, n in prompt_steps(len(ids), self.buckets):
            sess = self.program(size, programs).session(state=state)
            sess.steps = done
            tokens = np.zeros(size, np.int32)
            tokens[:n] = ids[start:start + n]
            out = sess.step(tokens=tokens, n=np.int32(n), **given)
            state, start, done = sess.state, start + n, done + 1  # `state` raises the step's error, if any
            raise_pending()  # Ctrl-C (`generate`'s `deferred`): between two prompt steps
        sess = programs[1].session(state=state)
        sess.steps = done  # the decode goes on counting (as a batch's slot and a token-by-token prompt do)
        return PromptResult(sess, int(np.asarray(out["next"])[0]), np.asarray(out["logits"]))

    def prompt_ids(self, prompt: str, *, chat: bool = False, system: str | None = None) -> list[int]:
        """The token ids of a text prompt (`chat`: rendered with the model's chat template, then encoded
        with no special tokens added, as transformers' apply_chat_template: the template decides BOS/EOS)."""
        if self.tokenizer is None:
            raise OiError(f"{self.model_path}: the model file holds no tokenizer: give a tokenizer.json "
                          f"(--tokenizer) or the prompt's token ids (--prompt-ids)")
        if chat:
            if not isinstance(self.chat_template, str):
                raise OiError(f"{self.model_path}: the model file holds no chat template (metadata "
                              f"{META['chat_template']}): leave out --chat")
            messages = ([{"role": "system", "content": system}] if system is not None else []) + [
                {"role": "user", "content": prompt}]
            # transformers passes its special_tokens_map: tokenizer_config.json's texts where the
            # model file holds them, else the texts of the BOS and EOS ids
            special = {"bos_token": self._token_text(self.bos_id), "eos_token": self._token_text(self.eos_id),
                       **self.special_tokens}
            prompt = render_chat(self.chat_template, messages, add_generation_prompt=True, **special)
        elif system is not None:
            raise OiError("--system needs --chat (a system message is part of a chat template)")
        return encode_prompt(self.tokenizer, prompt, self.bos_id, chat=chat)

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
        (`ignore_eos`: only these). `on_text(piece)` is called with the text as it is produced,
        every `STREAM_EVERY` tokens (pieces that end inside a multi-byte character wait).
        Ctrl-C: KeyboardInterrupt after the call in flight, its `partial` the `Generation` so far
        (`finish="interrupted"`)."""
        if (prompt is None) == (prompt_ids is None):
            raise OiError("give a prompt (text) or prompt_ids, not both")
        if prompt is not None and not isinstance(prompt, str):
            raise OiError(f"prompt: expected text (a str), got {type(prompt).__name__} (token ids go in prompt_ids)")
        if prompt_ids is not None and (chat or system is not None):  # else silently not applied
            raise OiError(f"{'chat' if chat else 'system'}: the chat template renders a text prompt; prompt_ids are "
                          f"the model's input as they are (render the chat yourself, or give the text)")
        if on_text is not None and not callable(on_text):  # it failed after the prompt had run
            raise OiError(f"on_text: expected a function of the text piece, got {type(on_text).__name__}")
        ids = self.prompt_ids(prompt, chat=chat, system=system) if prompt is not None else prompt_ids
        if np.size(ids) == 0:
            raise OiError("the prompt has no tokens")
        # checked before anything compiles or runs (a 1-D integer vector, every id in the
        # vocabulary, no longer than the cache): the prompt's step would fail only after its compile
        ids = tokens.prompt_ids(ids, self.vocab, "prompt_ids" if prompt is None else
                                "the prompt's token ids (from the tokenizer)").tolist()
        tokens.fits(len(ids), self.capacity)
        # a number: None (Batch.insert's "no budget") failed as a TypeError at `max_tokens - 1`
        check_whole("max_tokens", max_tokens, 0)
        check_settings(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                        seed=seed, vocab=self.vocab)
        settings = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "seed": seed}
        stops = sorted(set(() if ignore_eos else self.stop_ids) |
                       set(tokens.stop_ids(() if stop_ids is None else stop_ids, self.vocab)))
        b0 = time.perf_counter()
        if self.mode == PROMPT_STEPS:  # each bucket's program built (rebound, lowered) before the clock starts
            for size, _ in prompt_steps(len(ids), self.buckets):
                self.program(size, self.programs_for(settings))
        build_s = time.perf_counter() - b0  # compiling too: counted with it, not as prompt time
        run = dict(steps=max_tokens - 1, feedback={self.token_input: "next"}, collect="next",
                   stop={"next": _stop_slots(stops)})
        if max_tokens > 1:  # before the prompt runs: its tokens are held on the device for the whole decode
            check_collected(self.programs_for(settings)[1], max_tokens - 1, ("next",), what=f"max_tokens {max_tokens}",
                            fix="ask for fewer tokens (the cache holds at most the model's positions)")
        every = STREAM_EVERY if on_text is not None else None  # the run's calls (their stacks: runargs.call_limit)
        ahead = self._compile_decode_ahead(settings, run, every) if max_tokens > 1 else None
        waited = 0.0  # waiting for that compile: compiling, not generating
        c0, t0 = compile_seconds(), time.perf_counter()
        c1 = t1 = None
        out, finish, stop_id, error = [], "length", None, None
        try:
            with deferred():  # Ctrl-C: raised after the call in flight, with what was generated (`partial`)
                try:
                    first = self.prompt_step(ids, **settings)  # the prompt's error, if any, raises here: nothing generated
                    c1, t1 = compile_seconds(), time.perf_counter()
                    stream = _Stream(self, on_text, stops)
                    if max_tokens > 0:
                        out.append(first.next)
                        stream.add(out)
                    raise_pending()
                    if out and out[-1] in stops:
                        finish, stop_id = "stop", out.pop()
                    elif 0 < len(out) < max_tokens:
                        sess = first.session
                        token = np.asarray([first.next] if self.mode == PROMPT_STEPS else first.next, np.int32)
                        waited = _joined(ahead)
                        raise_pending()
                        try:
                            rows = sess.run({self.token_input: token, **self._inputs(settings)}, **run,
                                            on_chunk=None if on_text is None else lambda chunk, _: stream.add(out, chunk["next"]),
                                            every=every)["next"]
                        except OiError as exc:  # a step's error: the tokens before it are kept
                            if getattr(exc, "partial", None) is None:
                                raise
                            rows, finish, error = exc.partial["next"], "error", exc
                        except KeyboardInterrupt as exc:
                            if getattr(exc, "partial", None) is not None:
                                out[1:] = [int(i) for i in np.ravel(exc.partial["next"])]
                            raise
                        out[1:] = [int(i) for i in np.ravel(rows)]
                        if error is None and sess.last_run.stopped:  # the stop id is the last row
                            finish, stop_id = "stop", out.pop()
                    raise_pending()  # one that came after the run's last point: with the generation too
                except KeyboardInterrupt as exc:
                    c2, t2 = compile_seconds(), time.perf_counter()
                    if t1 is None:  # in the prompt: nothing generated
                        c1, t1 = c2, t2
                    if out and out[-1] in stops:  # the run's last row: the stop id that ended it
                        out.pop()
                    exc.partial = Generation(
                        prompt_ids=ids, ids=list(out), text=self.decode(out), finish="interrupted",
                        stats=Stats(prompt_tokens=len(ids), prompt_s=(t1 - t0) - (c1 - c0), generated_tokens=len(out),
                                    generate_s=max(0.0, (t2 - t1) - (c2 - c1) - waited), compile_s=build_s + c2 - c0 + waited))
                    raise
        except BaseException:  # an error or Ctrl-C: no compile left running behind it either (a daemon
            _joined(ahead)  # thread still in XLA when the interpreter exits aborts the process)
            raise
        c2, t2 = compile_seconds(), time.perf_counter()
        # no compile left running behind a generation that returns (nor one that raises: above)
        late = _joined(ahead)
        first.session.close()
        text = self.decode(out)
        stream.finish(text)
        stats = Stats(prompt_tokens=len(ids), prompt_s=(t1 - t0) - (c1 - c0), generated_tokens=len(out),
                      generate_s=(t2 - t1) - (c2 - c1) - waited, compile_s=build_s + c2 - c0 + waited + late)
        return Generation(prompt_ids=ids, ids=out, text=text, finish=finish, stats=stats, stop_id=stop_id, error=error)

    def _compile_decode_ahead(self, settings: dict, run: dict, every: int | None):
        """Compile the fused decode loop of `run` in a second thread, while this one runs the
        prompt (its program's compile takes one core: the other idles), once per loop a
        generation needs (`runtime/session.compile_run`); the thread, or None. Its compiling is
        counted apart (`runstats.apart`); a generation that waits for it counts the wait as
        compiling. A failure there only leaves the loop to be compiled by the run, as before."""
        key = (collected_rows(call_limit(run["steps"], False, every), run["collect"]), len(run["stop"]["next"]),
               self.programs_for(settings) is self.greedy_programs)  # the greedy programs' loop or the general one's
        ahead = self.compile_ahead
        if ahead is None:  # where JAX keeps compiled programs on disk, a later process reads the loop
            ahead = not jax.config.jax_compilation_cache_dir  # there, and compiling beside the prompt's run only slows it
        if not ahead or key in self._ahead:
            return None
        self._ahead.add(key)
        token = np.zeros([1] if self.mode == PROMPT_STEPS else [], np.int32)
        inputs = {self.token_input: token, **self._inputs(settings)}

        def compile_loop():
            with apart():
                try:
                    compile_run(self.programs_for(settings)[1], inputs, **run, every=every)
                except Exception:  # the run compiles (and reports) it itself
                    self._ahead.discard(key)

        thread = threading.Thread(target=compile_loop, name="oi2jax-compile-decode", daemon=True)
        thread.start()
        return thread

    @property
    def token_input(self) -> str:
        """The input a drawn token is fed back into: `tokens` (the step graph) or `token`."""
        return "tokens" if self.mode == PROMPT_STEPS else "token"


def _joined(thread) -> float:
    """Wait for `thread` (None: nothing); the seconds waited."""
    if thread is None or not thread.is_alive():
        return 0.0
    start = time.perf_counter()
    thread.join()
    return time.perf_counter() - start


PROMPT_STEPS, TOKEN_BY_TOKEN = "prompt steps", "token by token"
STOP_SLOTS = 8  # the decode loop takes its stop ids in slots of 8 (one compiled loop whatever the ids)


def _stop_slots(stops: list[int]) -> list[int]:
    """The stop ids filling a multiple of STOP_SLOTS (repeated; -1, never a token id, for none): the
    same set for `run_rules.stop_hits`, one shape, so the decode loop compiles once."""
    ids = list(stops) or [-1]
    return ids + [ids[0]] * (-len(ids) % STOP_SLOTS)


def _interface(path: str, graph, strict: bool = True) -> str | None:
    """Which interface the graph has: the step-graph contract (`tokens: i32[S]`, `n`, a volatile
    `next: i32[1]` and `logits: f32[V]`) or the token-by-token one (`token: i32`, `next: i32`);
    neither: an OiError (`strict`) or None."""
    def var(name, kind):
        decl = graph.var(name)
        return decl if decl is not None and decl.kind == kind else None

    tokens, token, n = var("tokens", ir.MemKind.DYNAMIC), var("token", ir.MemKind.DYNAMIC), var("n", ir.MemKind.DYNAMIC)
    nxt, logits = var("next", ir.MemKind.VOLATILE), var("logits", ir.MemKind.VOLATILE)
    if nxt is not None and logits is not None and nxt.dtype == "i32" and len(logits.dims) == 1:
        if tokens is not None and n is not None and tokens.dtype == "i32" and len(tokens.dims) == 1 and \
                len(nxt.dims) == 1:
            return PROMPT_STEPS
        if token is not None and token.dtype == "i32" and not token.dims and not nxt.dims:
            return TOKEN_BY_TOKEN
    if not strict:
        return None
    raise OiError(f"{path}: generate needs the step-graph interface (dynamic `tokens: i32[S]` and `n: i32`, "
                  f"volatile `next: i32[1]` and `logits: f32[V]`: examples/llama_prefill.oi) or the token-by-token "
                  f"one (dynamic `token: i32`, volatile `next: i32` and `logits: f32[V]`: examples/llama_decode.oi)")


@dataclass(frozen=True)
class PromptResult:
    """After the prompt: the session whose state goes on in the S=1 program, the first drawn
    token, the last prompt token's logits."""

    session: object
    next: int
    logits: np.ndarray


class _Stream:
    """The text of the generated tokens handed to `on_text` as it grows (a piece that ends inside a
    multi-byte character waits for the next token)."""

    def __init__(self, gen: Generator, on_text, stops):
        self.gen, self.on_text, self.stops, self.shown, self.seen = gen, on_text, set(stops), "", []

    def add(self, out: list, rows=()) -> None:
        """`out`: the tokens so far (the first token), or `rows`: the next ones (a chunk)."""
        if self.on_text is None or self.gen.tokenizer is None:
            return
        self.seen = list(out) if not len(rows) else self.seen + [int(i) for i in np.ravel(rows)]
        cut = next((i for i, t in enumerate(self.seen) if t in self.stops), len(self.seen))  # never the stop id
        text = self.gen.decode(self.seen[:cut])
        if not text.endswith("\ufffd") and len(text) > len(self.shown):
            self.on_text(text[len(self.shown):])
            self.shown = text

    def finish(self, text: str | None) -> None:
        if self.on_text is not None and text is not None and len(text) > len(self.shown):
            self.on_text(text[len(self.shown):])


def generate(model, prompt: str | None = None, *, graph=None, tokenizer=None, ops=("nn",), kernels: str = "jax",
             kv_dtype: str | None = None, **options) -> Generation:
    """One generation with a fresh `Generator(model, graph, tokenizer=, ops=, kernels=, kv_dtype=)`:
    see `Generator.generate`."""
    return Generator(model, graph, tokenizer=tokenizer, ops=ops, kernels=kernels, kv_dtype=kv_dtype).generate(
        prompt, **options)
