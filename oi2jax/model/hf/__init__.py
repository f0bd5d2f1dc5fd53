"""Hugging Face checkpoints: the families table (`families`), config reading (`config`), the
rotary frequencies (`rope`) and the safetensors source (`safetensors`) of `model.convert`."""
# importing a family module registers its rows in the table
from .gemma import GEMMA2, GEMMA3_TEXT
from .gpt2 import GPT2

__all__ = ["GEMMA2", "GEMMA3_TEXT", "GPT2"]
