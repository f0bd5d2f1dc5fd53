"""THE architecture table of `convert-hf`: a family is rows (config key -> size variable,
setting it must have, metadata entry, tensor name and shape) plus its example graph, never an
if-chain. `read_config(config)` finds the family by `model_type` / `architectures`, reads and
bounds every size by its key before anything is built, and returns a `ModelConfig`: the size
variables, metadata, expected tensors and computed tensors (`rope.inv_freq`) of the `.oinf`.

A family that needs a value no row describes adds a hook (`derive`): a function
`(ConfigReader, sizes, metadata, constants) -> None` that reads the keys it needs and fills in
the rest (the attention sizes, the rotary frequencies, a sliding window)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...diagnostics import OiError, suggest
from .config import MAX_LAYERS, MAX_SIZE, ConfigReader
from .rope import rope_inv_freq

# what a size variable is made of, for messages ("expected [32, 64] (vocab_size, hidden_size)")
SIZE_KEYS = {"V": "vocab_size", "D": "hidden_size", "F": "intermediate_size", "L": "num_hidden_layers",
             "H": "num_attention_heads", "KVH": "num_key_value_heads", "HD": "head_dim",
             "T": "max_position_embeddings", "QD": "num_attention_heads*head_dim",
             "KVD": "num_key_value_heads*head_dim", "R": "head_dim/2", "F2": "2*intermediate_size",
             "QKV": "(num_attention_heads+2*num_key_value_heads)*head_dim",
             "P": "n_positions", "D3": "3*n_embd"}  # GPT-2's learned positions, fused c_attn width
INV_FREQ = "rope.inv_freq"  # the computed rotary frequencies, f32[R]


@dataclass(frozen=True)
class Size:
    """Size variable `var` from config key `keys` (a name or (current, older) spellings), bounded
    by `limit` (default MAX_SIZE); when absent `default(sizes so far)` (None: a derive hook
    computes it), or an error when there is no default."""

    var: str
    keys: str | tuple[str, ...]
    default: Callable[[dict], int] | None = None
    limit: int | None = None


@dataclass(frozen=True)
class Setting:
    """Config key `key` must be one of `allowed` (absent: `default`); anything else is refused,
    naming the key and `why`."""

    key: str
    allowed: tuple
    default: object
    why: str


@dataclass(frozen=True)
class Meta:
    """Metadata entry `name` from the number at config key `key` (f32)."""

    name: str
    key: str


@dataclass(frozen=True)
class Tensor:
    """A tensor of the `.oinf`: Hugging Face name (`{l}`: one per layer) and shape (size
    variables). `when`: only for a tied / untied model. `split`: (fused source name, the parts'
    row counts as size variables, which part): the tensor is those rows of the fused one."""

    name: str
    shape: tuple[str, ...]
    when: str | None = None  # "untied"
    split: tuple[str, tuple[str, ...], int] | None = None


@dataclass(frozen=True)
class Family:
    model_type: str
    architectures: tuple[str, ...]
    graph: str  # its example graph, under examples/
    tensors: tuple[Tensor, ...]
    settings: tuple[Setting, ...] = ()
    metadata: tuple[Meta, ...] = ()
    sizes: tuple[Size, ...] = ()
    derive: tuple[Callable, ...] = ()
    tied_default: bool = False  # tie_word_embeddings when the config does not say (transformers' default)
    embed: str = "model.embed_tokens.weight"  # the embedding a tied lm_head.weight is
    # `adapt(source) -> source`: a family whose checkpoints spell tensor names more than one way
    # (GPT-2's with and without `transformer.`) presents them under the table's names
    adapt: Callable | None = None


@dataclass(frozen=True, slots=True)
class TensorPlan:
    """One tensor to write: its source tensor (`split`: rows start:stop of it), shape, and what
    the shape is made of."""

    source: str
    shape: tuple[int, ...]
    made_of: str
    rows: tuple[int, int] | None = None
    source_shape: tuple[int, ...] | None = None  # the fused source's shape when rows is set


@dataclass(frozen=True)
class ModelConfig:
    family: Family
    sizevars: dict[str, int]
    metadata: dict[str, object]
    tensors: dict[str, TensorPlan]  # output name -> plan, lm_head.weight absent when tied
    constants: dict[str, np.ndarray]  # computed tensors (rope.inv_freq)
    tied: bool
    notes: tuple[str, ...] = ()

    @property
    def architecture(self) -> str:
        return str(self.metadata["architecture"])


# ----------------------------------------------------------------------------------- the rows

def _half(sizes: dict, cfg: ConfigReader) -> int:
    if sizes["D"] % sizes["H"]:
        cfg.fail(f"hidden_size {sizes['D']} is not a multiple of num_attention_heads {sizes['H']} "
                 f"(and no head_dim is given)")
    return sizes["D"] // sizes["H"]


def decoder_sizes(head_dim: int | None = None, kv_heads: int | None = None) -> tuple[Size, ...]:
    """A decoder's sizes, with the family's config class's defaults where a key is absent (as
    transformers reads the config): `head_dim` D/H (None: `attention_sizes`) and
    `num_key_value_heads` H (one kv head per query head), unless the family's class says other
    (Gemma2Config: 256 and 4; Qwen3Config: head_dim 128)."""
    return (Size("V", "vocab_size"), Size("D", "hidden_size"), Size("F", "intermediate_size"),
            Size("L", "num_hidden_layers", limit=MAX_LAYERS), Size("H", "num_attention_heads"),
            Size("KVH", "num_key_value_heads", default=lambda s: kv_heads or s["H"]),
            Size("HD", "head_dim", default=lambda _: head_dim), Size("T", "max_position_embeddings"))



def attention_sizes(cfg: ConfigReader, sizes: dict, metadata: dict, constants: dict) -> None:
    """QD, KVD, G (query heads per kv head), R (rotary pairs); head_dim defaults to D/H and need
    not equal it (Qwen3, Gemma); attn_scale = head_dim**-0.5 (transformers' `scaling`)."""
    if sizes.get("HD") is None:
        sizes["HD"] = _half(sizes, cfg)
    if sizes["H"] % sizes["KVH"]:
        cfg.fail(f"num_key_value_heads {sizes['KVH']} does not divide num_attention_heads {sizes['H']}")
    sizes.update(QD=sizes["H"] * sizes["HD"], KVD=sizes["KVH"] * sizes["HD"], G=sizes["H"] // sizes["KVH"],
                 R=sizes["HD"] // 2)
    metadata["attn_scale"] = float(sizes["HD"]) ** -0.5


def rotary(cfg: ConfigReader, sizes: dict, metadata: dict, constants: dict) -> None:
    """rope.inv_freq (every rope type, as transformers computes it) and rope_theta."""
    if sizes["HD"] % 2:
        cfg.fail(f"head_dim {sizes['HD']} is odd: the rotary embedding rotates pairs of dimensions")
    constants[INV_FREQ], metadata["rope_theta"] = rope_inv_freq(cfg, sizes["HD"])


def sliding_window(cfg: ConfigReader, sizes: dict, metadata: dict, constants: dict) -> None:
    """i32 metadata sliding_window W: a query at position q attends to positions q-W+1..q
    (transformers' `kv_idx > q_idx - sliding_window`); null: T, which bounds nothing."""
    window = cfg.size("sliding_window", default=sizes["T"])
    metadata["sliding_window"] = np.int32(min(window, sizes["T"]))


def full_attention(cfg: ConfigReader, sizes: dict, metadata: dict, constants: dict) -> None:
    """Qwen's layers all full attention: `use_sliding_window` false, or true with no
    `sliding_window` or with `max_window_layers` >= the layers (transformers' rule for which layers
    slide; their windows are not implemented), and `layer_types` only full_attention;
    `sliding_window` is then unused, as in transformers."""
    window = cfg.config.get("sliding_window")  # read: unused where every layer is full attention
    if cfg.flag("use_sliding_window") and window is not None:
        # transformers' Qwen2Config / Qwen3Config: layer i slides iff i >= max_window_layers (default 28)
        first = cfg.config.get("max_window_layers", 28)
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            cfg.fail(f"max_window_layers must be a whole number >= 0, got {first!r}"[:200])
        if first < sizes["L"]:
            cfg.fail(f"use_sliding_window is true with sliding_window {window!r} and max_window_layers {first}: "
                     f"layers {first}..{sizes['L'] - 1} attend through a window, which is not supported for "
                     f"{cfg.config.get('model_type')} (only full attention in every layer)"[:300])
    kinds = cfg.config.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != sizes["L"]:
            cfg.fail(f"layer_types must list one entry per layer ({sizes['L']}), got {kinds!r}"[:200])
        other = next((k for k in kinds if k != "full_attention"), None)
        if other is not None:
            cfg.fail(f"layer_types holds {other!r}: only 'full_attention' layers are supported for "
                     f"{cfg.config.get('model_type')}")


NO_QUANT = Setting("quantization_config", (None,), None, "quantized checkpoints are not supported (convert a "
                                                        "floating-point checkpoint)")
SILU = Setting("hidden_act", ("silu",), "silu", "only 'silu' (the SwiGLU MLP) is supported")


def no_bias(key: str, family: str) -> Setting:
    return Setting(key, (False,), False, f"{family} projections have no biases")


EMBED = Tensor("model.embed_tokens.weight", ("V", "D"))
FINAL = (Tensor("model.norm.weight", ("D",)), Tensor("lm_head.weight", ("V", "D"), when="untied"))
P = "model.layers.{l}."
ATTN_NORM = Tensor(P + "input_layernorm.weight", ("D",))
QKV = (Tensor(P + "self_attn.q_proj.weight", ("QD", "D")), Tensor(P + "self_attn.k_proj.weight", ("KVD", "D")),
       Tensor(P + "self_attn.v_proj.weight", ("KVD", "D")))
O_PROJ = Tensor(P + "self_attn.o_proj.weight", ("D", "QD"))
MLP_NORM = Tensor(P + "post_attention_layernorm.weight", ("D",))
SWIGLU = (Tensor(P + "mlp.gate_proj.weight", ("F", "D")), Tensor(P + "mlp.up_proj.weight", ("F", "D")))
DOWN = Tensor(P + "mlp.down_proj.weight", ("D", "F"))
LLAMA_TENSORS = (EMBED, ATTN_NORM, *QKV, O_PROJ, MLP_NORM, *SWIGLU, DOWN, *FINAL)
DECODER = dict(sizes=decoder_sizes(), metadata=(Meta("rms_norm_eps", "rms_norm_eps"),),
               derive=(attention_sizes, rotary))

LLAMA = Family("llama", ("LlamaForCausalLM",), "llama_decode.oi", LLAMA_TENSORS,
               settings=(NO_QUANT, SILU, no_bias("attention_bias", "Llama"), no_bias("mlp_bias", "Llama")),
               **DECODER)

MISTRAL = Family("mistral", ("MistralForCausalLM",), "mistral_decode.oi", LLAMA_TENSORS,
                 settings=(NO_QUANT, SILU, no_bias("attention_bias", "Mistral")),
                 **dict(DECODER, derive=DECODER["derive"] + (sliding_window,)))

QKV_BIAS = (Tensor(P + "self_attn.q_proj.bias", ("QD",)), Tensor(P + "self_attn.k_proj.bias", ("KVD",)),
            Tensor(P + "self_attn.v_proj.bias", ("KVD",)))
QWEN2 = Family("qwen2", ("Qwen2ForCausalLM",), "qwen2_decode.oi", LLAMA_TENSORS + QKV_BIAS,
               settings=(NO_QUANT, SILU), **dict(DECODER, derive=DECODER["derive"] + (full_attention,)))

QK_NORM = (Tensor(P + "self_attn.q_norm.weight", ("HD",)), Tensor(P + "self_attn.k_norm.weight", ("HD",)))
QWEN3 = Family("qwen3", ("Qwen3ForCausalLM",), "qwen3_decode.oi", LLAMA_TENSORS + QK_NORM,
               settings=(NO_QUANT, SILU, no_bias("attention_bias", "Qwen3")),
               **dict(DECODER, sizes=decoder_sizes(head_dim=128), derive=DECODER["derive"] + (full_attention,)))

# Phi-3's fused projections, written as the rows they are: q, k, v of qkv_proj; gate, up of gate_up_proj
_QKV_ROWS, _GATE_UP_ROWS = ("QD", "KVD", "KVD"), ("F", "F")
PHI3_TENSORS = (EMBED, ATTN_NORM,
                *(Tensor(t.name, t.shape, split=(P + "self_attn.qkv_proj.weight", _QKV_ROWS, i))
                  for i, t in enumerate(QKV)),
                O_PROJ, MLP_NORM,
                *(Tensor(t.name, t.shape, split=(P + "mlp.gate_up_proj.weight", _GATE_UP_ROWS, i))
                  for i, t in enumerate(SWIGLU)),
                DOWN, *FINAL)
PHI3 = Family("phi3", ("Phi3ForCausalLM",), "mistral_decode.oi", PHI3_TENSORS,
              settings=(NO_QUANT, SILU, no_bias("attention_bias", "Phi-3")),
              **dict(DECODER, derive=DECODER["derive"] + (sliding_window,)))

FAMILIES: dict[str, Family] = {f.model_type: f for f in (LLAMA, MISTRAL, QWEN2, QWEN3, PHI3)}


def register(family: Family) -> None:
    """Add a family row to the table (the families of this module, and others' modules)."""
    FAMILIES[family.model_type] = family


# ---------------------------------------------------------------------------------- reading

def find_family(cfg: ConfigReader) -> Family:
    model_type = cfg.config.get("model_type")
    archs = cfg.config.get("architectures")
    known = ", ".join(sorted(FAMILIES))
    if model_type is None and archs is None:
        cfg.fail("missing required key model_type (or architectures): cannot tell the architecture")
    if model_type is not None:
        family = FAMILIES.get(model_type)
        if family is None:
            cfg.fail(f"model_type is {model_type!r}{suggest(str(model_type), FAMILIES)}: supported model types "
                     f"are {known}")
    else:
        family = next((f for f in FAMILIES.values() if isinstance(archs, list) and archs
                       and archs[0] in f.architectures), None)
        if family is None:
            cfg.fail(f"architectures is {archs!r} and no model_type is given: supported model types are {known}")
    if archs is not None and (not isinstance(archs, list) or len(archs) != 1 or archs[0] not in family.architectures):
        cfg.fail(f"architectures is {archs!r}: a {family.model_type} checkpoint is "
                 f"{' or '.join(repr([a]) for a in family.architectures)}")
    return family


def read_config(config, where: str = "config.json", max_positions: int | None = None) -> ModelConfig:
    """Validate a Hugging Face config dict against its family's rows; OiError naming the key for
    anything unsupported or out of range. `max_positions` (when given) replaces
    max_position_embeddings as T."""
    cfg = ConfigReader(config, where)
    family = find_family(cfg)
    for s in family.settings:
        value = cfg.config.get(s.key)
        value = s.default if value is None else value
        if value not in s.allowed or isinstance(value, bool) != isinstance(s.allowed[0], bool):
            cfg.fail(f"{s.key} is {'set' if s.allowed == (None,) else _lower(value)}: {s.why}")
    sizes: dict[str, int] = {}
    if max_positions is not None and (isinstance(max_positions, bool) or not isinstance(max_positions, int)
                                      or not 0 < max_positions <= MAX_SIZE):
        raise OiError(f"max_positions (--max-positions) must be an integer in 1..{MAX_SIZE}, got {max_positions!r}")
    for s in family.sizes:
        if s.var == "T" and max_positions is not None:
            trained = cfg.size(s.keys, default=0)
            if trained and max_positions > trained:
                cfg.notes.append(f"T = {max_positions} is beyond max_position_embeddings {trained}: the model "
                                 f"was not trained on positions past {trained}")
            sizes["T"] = max_positions
            continue
        if cfg.key(s.keys) is None and s.default is not None:
            sizes[s.var] = s.default(sizes)  # None: a derive hook computes it
            continue
        sizes[s.var] = cfg.size(s.keys, limit=s.limit or MAX_SIZE)
    metadata: dict[str, object] = {}
    for m in family.metadata:
        metadata[m.name] = cfg.number(m.key, f32=True)  # stored as f32 metadata
    constants: dict[str, np.ndarray] = {}
    for hook in family.derive:
        hook(cfg, sizes, metadata, constants)
    archs = cfg.config.get("architectures")
    metadata["architecture"] = archs[0] if archs else family.architectures[0]
    tied = cfg.flag("tie_word_embeddings", family.tied_default)
    cfg.check_unread()
    return ModelConfig(family, sizes, metadata, _plan(family, sizes, tied), constants, tied, tuple(cfg.notes))



def _lower(value) -> str:
    return "true" if value is True else "false" if value is False else repr(value)


def _plan(family: Family, sizes: dict, tied: bool) -> dict[str, TensorPlan]:
    out: dict[str, TensorPlan] = {}
    for t in family.tensors:
        if t.when == "untied" and tied:
            continue
        shape = tuple(sizes[v] for v in t.shape)
        made_of = ", ".join(SIZE_KEYS.get(v, v) for v in t.shape)
        for i in range(sizes["L"]) if "{l}" in t.name else (None,):
            name = t.name.format(l=i) if i is not None else t.name
            if t.split is None:
                out[name] = TensorPlan(name, shape, made_of)
                continue
            source, parts, which = t.split
            counts = [sizes[p] for p in parts]
            start = sum(counts[:which])
            src = source.format(l=i) if i is not None else source
            out[name] = TensorPlan(src, shape, made_of, (start, start + counts[which]), (sum(counts),) + shape[1:])
    return out
