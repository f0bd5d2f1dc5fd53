from oi2jax.ops import op


@op(inputs={"a": "float", "b": "same"})
def add(a, b):
    return a + b
