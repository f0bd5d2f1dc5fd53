"""Kernels that break their declarations (tests/test_user_ops.py)."""
import jax.numpy as jnp

from oi2jax.ops import op


@op(inputs={"x": "float"})
def raises(x):
    raise ValueError("boom")


@op(inputs={"x": "float"})
def wrong_dtype(x):
    return x.astype(jnp.int32)


@op(inputs={"x": "float"}, shape="same")
def wrong_shape(x):
    return jnp.concatenate([x, x])
