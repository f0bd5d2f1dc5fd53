import jax.numpy as jnp


def leaky_softplus(x, *, slope):
    y = x.astype(jnp.float32)
    return (jnp.logaddexp(y, 0.0) + slope * jnp.minimum(y, 0.0)).astype(x.dtype)
