"""The GPT-2 row of the architecture table: `gpt2` (GPT2LMHeadModel), with examples/gpt2_decode.oi.

GPT-2's config has its own key names (n_embd, n_layer, n_head, n_positions, n_inner; the
`hidden_size` spellings are read too). Its tensors keep their layouts: the Conv1D weights are
[in, out] (applied as x @ W + b), the attention's q, k and v are one fused `c_attn` [D, 3D],
positions are learned (`wpe`, P = n_positions rows), and every LayerNorm and projection has a
bias. lm_head is the embedding `transformer.wte.weight` (tie_word_embeddings, default true).
Size variables V D L H HD F T P D3 (= 3*D); metadata `layer_norm_eps` and `attn_scale`
(head_dim^-0.5, or 1 when scale_attn_weights is false).

Checkpoints name the tensors with the `transformer.` prefix (current transformers) or without
it (the original GPT-2 files); both convert to the prefixed names. The causal-mask buffers older
files hold (`h.{l}.attn.bias`, `h.{l}.attn.masked_bias`) are derived, not learned: skipped with a
note."""
from __future__ import annotations

import re

from .config import MAX_LAYERS, ConfigReader, fail
from .families import NO_QUANT, Family, Meta, Setting, Size, Tensor, register
from .source import TensorSource

PREFIX = "transformer."
H_ = PREFIX + "h.{l}."
_MASK_BUFFER = re.compile(r"(transformer\.)?h\.\d+\.attn\.(masked_)?bias\Z")


def _sizes(cfg: ConfigReader, sizes: dict, metadata: dict, constants: dict) -> None:
    """HD (= D / H), D3, and T within the P learned positions; attn_scale."""
    if sizes["D"] % sizes["H"]:
        cfg.fail(f"n_embd {sizes['D']} is not a multiple of n_head {sizes['H']}")
    if sizes["T"] > sizes["P"]:
        cfg.fail(f"T = {sizes['T']} is beyond n_positions {sizes['P']}: GPT-2 has no position embedding past "
                 f"position {sizes['P'] - 1} (give --max-positions {sizes['P']} or less)")
    sizes.update(HD=sizes["D"] // sizes["H"], D3=3 * sizes["D"])
    metadata["attn_scale"] = float(sizes["HD"]) ** -0.5 if cfg.flag("scale_attn_weights", True) else 1.0


class PrefixedSource(TensorSource):
    """A GPT-2 checkpoint's tensors under their `transformer.` names, whichever way it spells
    them, without the causal-mask buffers."""

    def __init__(self, source: TensorSource):
        self.inner = source
        self.directory, self.files = source.directory, source.files
        self.notes = list(source.notes)
        self.names: dict[str, str] = {}  # table name -> the checkpoint's
        buffers = []
        for name in source.entries:
            if _MASK_BUFFER.match(name):
                buffers.append(name)
                continue
            table = name if name.startswith((PREFIX, "lm_head.")) else PREFIX + name
            if table in self.names:
                both = " and ".join(sorted((self.names[table], name)))
                fail(str(source.directory), f"tensors {both} are one GPT-2 tensor (with and without the "
                                            f"transformer. prefix): which one?")
            self.names[table] = name
        self.entries = {table: source.entries[name] for table, name in self.names.items()}
        if buffers:
            self.notes.append(f"skipped {len(buffers)} causal-mask buffer(s) ({buffers[0]}...): derived, not learned")

    def read(self, name: str):
        return self.inner.read(self.names[name])


GPT2 = Family(
    "gpt2", ("GPT2LMHeadModel",), "gpt2_decode.oi",
    (Tensor(PREFIX + "wte.weight", ("V", "D")), Tensor(PREFIX + "wpe.weight", ("P", "D")),
     Tensor(H_ + "ln_1.weight", ("D",)), Tensor(H_ + "ln_1.bias", ("D",)),
     Tensor(H_ + "attn.c_attn.weight", ("D", "D3")), Tensor(H_ + "attn.c_attn.bias", ("D3",)),
     Tensor(H_ + "attn.c_proj.weight", ("D", "D")), Tensor(H_ + "attn.c_proj.bias", ("D",)),
     Tensor(H_ + "ln_2.weight", ("D",)), Tensor(H_ + "ln_2.bias", ("D",)),
     Tensor(H_ + "mlp.c_fc.weight", ("D", "F")), Tensor(H_ + "mlp.c_fc.bias", ("F",)),
     Tensor(H_ + "mlp.c_proj.weight", ("F", "D")), Tensor(H_ + "mlp.c_proj.bias", ("D",)),
     Tensor(PREFIX + "ln_f.weight", ("D",)), Tensor(PREFIX + "ln_f.bias", ("D",)),
     Tensor("lm_head.weight", ("V", "D"), when="untied")),
    settings=(NO_QUANT,
              Setting("activation_function", ("gelu_new", "gelu_pytorch_tanh"), "gelu_new",
                      "only the tanh gelu ('gelu_new', 'gelu_pytorch_tanh') is supported"),
              Setting("scale_attn_by_inverse_layer_idx", (False,), False,
                      "attention scaled by 1 / (layer index + 1) is not supported"),
              Setting("add_cross_attention", (False,), False, "a decoder without cross-attention only")),
    metadata=(Meta("layer_norm_eps", "layer_norm_epsilon"),),
    sizes=(Size("V", "vocab_size"), Size("D", ("n_embd", "hidden_size")),
           Size("L", ("n_layer", "num_hidden_layers"), limit=MAX_LAYERS), Size("H", ("n_head", "num_attention_heads")),
           Size("P", ("n_positions", "max_position_embeddings")),
           Size("F", ("n_inner", "intermediate_size"), default=lambda s: 4 * s["D"]),
           Size("T", ("n_positions", "max_position_embeddings"))),
    derive=(_sizes,), tied_default=True, embed=PREFIX + "wte.weight", adapt=PrefixedSource)

register(GPT2)
