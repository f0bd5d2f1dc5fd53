"""`.oinf` models: lazy mmap reader, byte-exact writer, inspect table, and graph binding.

    from oi2jax.model import open_model, save, Tensor, Meta
    m = open_model("examples/mlp_regression.oinf")
    m.sizevars, m.metadata, m.tensors; m.load("w1"); m.load_packed("x")
    save("out.oinf", sizevars={"N": 2}, metadata={"k": 7}, tensors={"v": np.zeros(2, np.float32)})

`bind` (model/bind.py) is imported lazily: `from oi2jax.model.bind import bind, BoundGraph`.
"""
from .reader import Meta, MetaValue, Model, ModelError, TensorInfo, open_model
from .writer import Tensor, save

__all__ = ["open_model", "save", "Model", "ModelError", "MetaValue", "Meta", "TensorInfo", "Tensor", "bind",
           "BoundGraph"]


def __getattr__(name):
    if name in ("bind", "BoundGraph"):
        from . import bind as _bind  # deferred: bind imports the checker and JAX; the reader and writer do not
        return getattr(_bind, name)
    raise AttributeError(name)
