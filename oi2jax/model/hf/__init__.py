"""Hugging Face checkpoints: the families table (`families`), config reading (`config`), the
rotary frequencies (`rope`) and the safetensors source (`safetensors`) of `model.convert`."""
