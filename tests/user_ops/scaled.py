"""A user's op file for tests/test_user_ops.py (loaded with --ops / ops=[...])."""
import jax.numpy as jnp
import numpy as np

from oi2jax.ops import Attr, op


@op(inputs={"x": "float"}, attrs={"scale": 1.0}, elementwise=True,
    reference=lambda x, scale: np.tanh(np.asarray(x, np.float64)) * scale)
def scaled_tanh(x, *, scale):
    """tanh(x) * scale."""
    return (jnp.tanh(x.astype(jnp.float32)) * scale).astype(x.dtype)


@op(inputs={"a": "float", "b": "same"}, attrs={"flip": Attr("bool", False)})
def outer(a, b, *, flip):
    """The outer product a b^T of two vectors (its shape comes from the kernel)."""
    r = a[:, None] * b[None, :]
    return r.T if flip else r
