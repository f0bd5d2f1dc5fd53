import jax.numpy as jnp

from oi2jax.ops import op


@op(inputs={"x": "float"}, elementwise=True)
def scaled_tanh(x):
    return jnp.tanh(x)
