"""`oi2jax convert-hf`: a Hugging Face checkpoint directory -> an `.oinf` model (issues #31, #39).

    convert_hf("~/models/Qwen2.5-0.5B-Instruct", "qwen.oinf", dtype="bf16")

`convert_hf` reads `config.json` and the safetensors weights (`hf/source.py`) and hands them to
`convert_checkpoint`, the converter proper, which any `TensorSource` (a GGUF file) can feed.
The architecture table (`hf/families.py`) says what a family's config keys, size variables,
metadata and tensors are; everything it does not describe is an OiError naming the config key or
tensor, never a silently different model.

The output is laid out from the headers, then each tensor is read, converted and written in
turn (the writer's `LazyTensor`), so peak memory is about one tensor. It keeps the checkpoint's
tensor names, layouts and dtypes, unless `dtype` asks for another: widening is exact, narrowing
rounds to nearest even, and a finite value that would overflow is an error naming the file and
tensor. A fused tensor (Phi-3's `qkv_proj`, `gate_up_proj`) is written as the unfused tensors its
rows are (`q_proj`, `k_proj`, `v_proj`; `gate_proj`, `up_proj`), bit for bit. Computed tensors:
`rope.inv_freq`. A tied `lm_head.weight` is not written: the metadata string
`alias.lm_head.weight = "model.embed_tokens.weight"` names the one copy (resolved at bind).
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

from ..diagnostics import OiError
from ..naming import ALIAS_PREFIX
from .hf.config import fail as _fail, read_json
from .hf.families import FAMILIES, ModelConfig, read_config
from .ggml import QUANTIZE_TYPES, block_layout, ggml_stored_shape, meta_key, nonfinite_counts as ggml_nonfinite, \
    quantize as ggml_quantize
from .hf.source import SOURCE_DTYPES, SafetensorsSource, SourceEntry, TensorSource, np_dtype
from .reader import NAME_RE
from .tokenizer import HF_TOKENIZER_FILES, META, check_token_ids, config_token_ids, hf_tokenizer_metadata
from .writer import LazyTensor, overflow, save

__all__ = ["convert_hf", "convert_checkpoint", "TensorSource", "SafetensorsSource", "SourceEntry", "read_config",
           "ConvertSummary", "ModelConfig", "FAMILIES", "DTYPES", "ALIAS_PREFIX"]

DTYPES = ("f32", "bf16", "f16")  # what --dtype can ask for
_MIB = 1 << 20
_CHUNK = 1 << 14  # elements per step of the NaN/Inf count
# tensors a checkpoint may hold that are derived, not learned: transformers recomputes them
_DERIVED_SUFFIX = "rotary_emb.inv_freq"


def convert_values(name: str, values: np.ndarray, target: str, where: str = "") -> np.ndarray:
    """`values` (f32/f16/bf16/f64) as `target`: exact when it widens, rounded to nearest even when
    it narrows (one rounding: bf16 <-> f16 goes through f32, which holds both exactly). OiError
    naming `where` (the file) and the tensor when a finite value overflows the target."""
    want = np_dtype(target)
    if values.dtype == want:
        return values
    src = values.astype(np.float32) if values.dtype.itemsize < 4 else values  # exact
    with np.errstate(over="ignore"):  # an overflow is reported below, by tensor name
        out = src.astype(want)
    if ml_dtypes.finfo(want).max < ml_dtypes.finfo(values.dtype).max:  # a narrower range: may overflow
        lost = overflow(src, out, target)
        if lost:
            raise OiError(f"{where + ': ' if where else ''}tensor {name}: {lost}; convert to a wider dtype instead")
    return out


@dataclass(frozen=True)
class ConvertSummary:
    """What `convert_hf` wrote."""

    path: str
    sizevars: dict[str, int]
    metadata: dict[str, object]
    tensors: dict[str, str]  # name -> stored dtype
    nbytes: int  # tensor data bytes written
    source_files: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())
    model_type: str = "llama"
    graph: str = "llama_decode.oi"  # the family's example graph, under examples/


class _Progress:
    """Counts the MiB written; `bar(done)` is called before each tensor is read and at the end."""

    def __init__(self, factory, total_bytes: int):
        self.total = max(1, -(-total_bytes // _MIB))
        self.bar = factory(self.total) if factory is not None else None
        self.done_bytes = 0

    def tick(self, nbytes: int = 0) -> None:
        if self.bar is not None:
            self.bar(min(self.total, self.done_bytes // _MIB))
        self.done_bytes += nbytes

    def finish(self) -> None:
        if self.bar is not None:
            self.bar(self.total)

    def close(self) -> None:
        close = getattr(self.bar, "close", None)
        if close is not None:
            close()


def _same_file(a, b) -> bool:
    try:
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    except OSError:
        return False


def convert_hf(src_dir, out_path, dtype: str | None = None, max_positions: int | None = None,
               progress=None, nonfinite: str = "note", quantize: str | None = None) -> ConvertSummary:
    """Convert the Hugging Face checkpoint directory `src_dir` to the `.oinf` file `out_path`.

    `dtype`: None keeps every tensor's dtype; "f32", "bf16" or "f16" converts all of them (exact
    when widening, round to nearest even when narrowing). `max_positions`: T (default: the
    config's max_position_embeddings). `progress`: None, or `factory(total_mib)` returning a
    callable `bar(done_mib)` (with an optional `close()`), e.g. `oi2jax.progress.progress_for`.
    `nonfinite`: "note" (NaN/Inf weights are converted and listed in the notes) or "error".
    `quantize`: a GGML block type (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k: `ggml.QUANTIZE_TYPES`)
    for every 2-D weight, as llama.cpp's converter does; the 1-D tensors (norms, biases) keep
    `dtype`. They are stored as convert-gguf keeps GGUF blocks (model/ggml.py). A matrix whose rows
    are not a whole number of blocks keeps `dtype`, with a note naming it.
    The output is written atomically (a temporary file renamed over `out_path`): a failing
    conversion leaves no partial file and an existing one untouched. OiError on anything
    unsupported, naming the file and the config key or tensor."""
    if dtype is not None and dtype not in DTYPES:
        raise OiError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    directory = Path(os.path.expanduser(os.fspath(src_dir)))
    if not directory.is_dir():
        _fail(str(directory), "not a directory (give the checkpoint directory holding config.json)")
    config_path = directory / "config.json"
    try:
        raw_config = read_json(config_path, "the config")
    except FileNotFoundError:
        _fail(str(directory), "no config.json: not a Hugging Face checkpoint directory")
    cfg = read_config(raw_config, str(config_path), max_positions)  # refuse a bad config before any shard
    with contextlib.ExitStack() as stack:
        source = SafetensorsSource(directory, stack)
        return convert_checkpoint(raw_config, source, out_path, dtype=dtype, max_positions=max_positions,
                                  progress=progress, config_where=str(config_path), quantize=quantize,
                                  inputs=("config.json", "model.safetensors.index.json", *HF_TOKENIZER_FILES),
                                  nonfinite=nonfinite,
                                  extra_metadata=hf_tokenizer_metadata(directory, raw_config), _cfg=cfg)


def convert_checkpoint(raw_config: dict, source: TensorSource, out_path, *, dtype: str | None = None,
                       max_positions: int | None = None, progress=None, config_where: str = "config.json",
                       inputs: tuple[str, ...] = (), extra_metadata: dict | None = None,
                       nonfinite: str = "note", quantize: str | None = None,
                       _cfg: ModelConfig | None = None) -> ConvertSummary:
    """The converter proper: a Hugging Face `config.json` dict and the tensors of `source` (Hugging
    Face names and layouts) -> the `.oinf` at `out_path`. `inputs`: more files of
    `source.directory` that the output must not overwrite; `extra_metadata`: more metadata entries
    to store (tokenizer, chat template, ...). See `convert_hf` for the rest."""
    if dtype is not None and dtype not in DTYPES:
        raise OiError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if nonfinite not in ("note", "error"):
        raise OiError(f"nonfinite must be 'note' or 'error', got {nonfinite!r}")
    if quantize is not None and str(quantize).upper() not in QUANTIZE_TYPES:
        raise OiError(f"quantize must be one of {', '.join(t.lower() for t in QUANTIZE_TYPES)}, got {quantize!r}")
    quantize = None if quantize is None else str(quantize).upper()
    cfg = _cfg if _cfg is not None else read_config(raw_config, config_where, max_positions)
    notes = list(cfg.notes)
    out_s = os.fspath(out_path)
    directory = source.directory
    whole = source.where or str(directory)  # (a GGUF source: its file, not the directory holding it)
    config_name = source.config_name
    if cfg.family.adapt is not None:
        source = cfg.family.adapt(source)
    notes += source.notes
    for file in [*inputs, *source.files]:
        if _same_file(out_s, directory / file):
            raise OiError(f"{out_s} is the checkpoint's {file}: writing it would destroy the input; "
                          f"choose another path")
    plan = cfg.tensors
    wanted = {p.source for p in plan.values()}
    derived = []
    for name in sorted(source.entries):
        if name in wanted:
            continue
        if name == "lm_head.weight" and cfg.tied:
            notes.append("lm_head.weight in the checkpoint is ignored: tie_word_embeddings is true, so "
                         "lm_head is the embedding (as transformers does)")
        elif name.endswith(_DERIVED_SUFFIX):
            derived.append(name)
        else:
            _fail(str(directory / source.entries[name].file),
                  f"unexpected tensor {name}{source.origin(name)}: not part of a {cfg.architecture} with this config (a bias? "
                  f"another architecture?)")
    if derived:
        notes.append(f"skipped {len(derived)} derived tensor(s) ({derived[0]}...): the rotary "
                     f"frequencies are computed from the config (rope.inv_freq)")
    missing = [p.source for p in plan.values() if p.source not in source.entries]
    if missing:
        missing = list(dict.fromkeys(missing))
        why = " (tie_word_embeddings is false)" if missing[0] == "lm_head.weight" else ""
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        _fail(whole, f"missing tensor {missing[0]}{why}{more}")
    stored, total, blocks = {}, 0, {}  # blocks: out name -> the GGML type --quantize stores it as
    for out_name, p in plan.items():
        entry = source.entries[p.source]
        where = str(directory / entry.file)
        shape = p.source_shape or p.shape
        if entry.shape != shape:
            fused = f" (fused: {out_name} is rows {p.rows[0]}:{p.rows[1]})" if p.rows else ""
            _fail(where, f"tensor {p.source}{source.origin(p.source)} has shape {list(entry.shape)}, expected {list(shape)} ({p.made_of})"
                         f"{fused} from {config_name}")
        if not NAME_RE.match(out_name):  # every Hugging Face name of the table does; never rename silently
            _fail(whole, f"tensor name {out_name!r} is not a valid .oinf name ([A-Za-z0-9._-]+)")
        if entry.ggml is not None:  # kept GGML blocks: their raw rows, stored as u8 (model/ggml.py)
            if dtype is not None:
                raise OiError(f"tensor {p.source}{source.origin(p.source)}: {entry.ggml} blocks cannot be kept when dtype {dtype} is asked for")
            stored[out_name] = "u8"
            total += math.prod(ggml_stored_shape(entry.ggml, p.shape))
            continue
        if entry.dtype not in SOURCE_DTYPES:
            _fail(where, f"tensor {p.source}{source.origin(p.source)} has dtype {entry.dtype}: only floating-point checkpoints (F32, BF16, "
                         f"F16, F64) are supported")
        target = dtype or SOURCE_DTYPES[entry.dtype]
        if quantize is not None and len(p.shape) == 2:
            per = block_layout(quantize)[0]
            if p.shape[-1] % per == 0:
                blocks[out_name] = quantize
                stored[out_name] = "u8"
                total += math.prod(ggml_stored_shape(quantize, p.shape))
                continue
            notes.append(f"tensor {out_name} is kept as {target}: its rows of {p.shape[-1]} values are not whole "
                         f"{quantize} blocks of {per}")
        stored[out_name] = target
        total += math.prod(p.shape) * np_dtype(target).itemsize
    bar = _Progress(progress, total)
    nonfinite_found: list[str] = []

    def lazy(out_name: str) -> LazyTensor:
        p, target = plan[out_name], stored[out_name]
        where = str(directory / source.entries[p.source].file)
        kept = source.entries[p.source].ggml
        if kept is not None:  # whole rows of blocks: a fused tensor's row range is a range of block rows
            shape = ggml_stored_shape(kept, p.shape)

            def raw():
                bar.tick(math.prod(shape))
                values = source.read(p.source)
                values = values[p.rows[0]:p.rows[1]] if p.rows is not None else values
                _report_nonfinite(*ggml_nonfinite(kept, values), out_name + source.origin(p.source), where, nonfinite,
                                  nonfinite_found)  # stored as they are, their scales read
                return values
            return LazyTensor("u8", shape, raw)

        def load():
            bar.tick(math.prod(ggml_stored_shape(blocks[out_name], p.shape)) if out_name in blocks
                     else math.prod(p.shape) * np_dtype(target).itemsize)
            values = source.read(p.source)
            if p.rows is not None:
                values = values[p.rows[0]:p.rows[1]]
            _count_nonfinite(values, out_name + source.origin(p.source), where, nonfinite, nonfinite_found)
            if out_name in blocks:  # --quantize: the f32 values' blocks
                return ggml_quantize(blocks[out_name], convert_values(p.source, values, "f32", where))
            return convert_values(p.source, values, target, where)
        if out_name in blocks:
            return LazyTensor("u8", ggml_stored_shape(blocks[out_name], p.shape), load)
        return LazyTensor(target, p.shape, load)

    tensors: dict[str, object] = {name: lazy(name) for name in plan}
    for name, value in cfg.constants.items():
        tensors[name] = value
        stored[name] = "i32" if value.dtype == np.int32 else "f32"
        total += value.nbytes
    metadata = {**cfg.metadata, META["graph"]: f"examples/{cfg.family.graph}", **config_token_ids(raw_config, config_where),
                **(extra_metadata or {}),
                **{meta_key(out): source.entries[p.source].ggml for out, p in plan.items()
                   if source.entries[p.source].ggml is not None},
                **{meta_key(out): kind for out, kind in blocks.items()}}
    if cfg.tied:
        metadata[ALIAS_PREFIX + "lm_head.weight"] = cfg.family.embed
    check_token_ids(metadata, int(cfg.sizevars["V"]), config_where)
    try:
        save(out_s, sizevars=cfg.sizevars, metadata=metadata, tensors=tensors)
        bar.finish()
    finally:
        bar.close()
    notes += nonfinite_found
    return ConvertSummary(path=out_s, sizevars=cfg.sizevars, metadata=metadata,
                          tensors=dict(sorted(stored.items())), nbytes=total, source_files=tuple(source.files),
                          notes=tuple(notes), model_type=cfg.family.model_type, graph=cfg.family.graph)


def _count_nonfinite(values: np.ndarray, name: str, where: str, mode: str, found: list[str]) -> None:
    """A note (or, mode "error", an OiError) naming a tensor that holds NaN or Inf, with the counts."""
    with np.errstate(all="ignore"):  # a sum allocates no mask: finite means no NaN/Inf (else count)
        if np.isfinite(np.sum(values, dtype=np.float32 if values.dtype.itemsize < 4 else None)):
            return
    flat, nan, inf = values.reshape(-1), 0, 0
    for i in range(0, flat.size, _CHUNK):  # in chunks: the check holds no tensor-sized mask
        part = flat[i:i + _CHUNK]
        part = part.astype(np.float32) if part.dtype.itemsize < 4 else part
        nan += int(np.count_nonzero(np.isnan(part)))
        inf += int(np.count_nonzero(np.isinf(part)))
    _report_nonfinite(nan, inf, name, where, mode, found)


def _report_nonfinite(nan: int, inf: int, name: str, where: str, mode: str, found: list[str]) -> None:
    if not nan and not inf:
        return
    text = f"tensor {name} holds {nan} NaN and {inf} infinite value(s)"
    if mode == "error":
        raise OiError(f"{where}: {text} (refused: --nonfinite error)")
    found.append(f"{where}: {text}")
