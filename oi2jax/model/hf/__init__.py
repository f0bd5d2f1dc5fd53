"""Hugging Face checkpoints: the families table (`families`), config reading (`config`), the
rotary frequencies (`rope`) and the safetensors source (`safetensors`) of `model.convert`."""
from . import gemma, gpt2  # noqa: F401  (their rows register in the table: gemma2, gemma3_text, gpt2)
