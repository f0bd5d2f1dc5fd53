"""An op node's kernel, traced once per call signature.

An unrolled layer loop calls the same kernels with the same shapes in every layer: run inline,
each layer ran the kernel's Python again and JAX traced its equations again (a 30-layer decode
step: 2.3-4.2 s of tracing and lowering, most of it that). Each op call whose operands include
traced values goes through a `jax.jit(kernel, inline=INLINE)`, cached per program by everything the
kernel's trace depends on (the op, the traced operands' shapes and dtypes, the values of the
others, the settings `ops.apply` takes): a later call with the same signature reuses the traced
equations, which JAX copies into the step at the call while tracing (`INLINE`). The step's jaxpr, its
named scopes (`entry/45:attention/...`, per call site) and the compiled program are the inline
form's; only the kernel's Python runs once (the 30-layer step: 1.2-2.0 s).

The kernel's runtime checks (`Ctx.fail_if`) leave the jitted function as outputs; their messages,
and any condition or value known while tracing, are recorded when it is traced and returned with
every call. A call whose operands are all known while tracing, or whose known operands are not
small scalars and tuples of them, runs inline as before.

The interpreter runs an added op without a NumPy reference through the same function, naming
what is traced (`traced_inputs`, `traced_attrs`: every input but a literal, every setting read
from a variable): its kernel is then traced as the compiled step traces it (a kernel that branches
in Python on a traced value fails with the same error) and computes what the compiled op
computes."""
from __future__ import annotations

import jax
import numpy as np

from . import dispatch

# inlined while tracing: `jax.Inline.JAX_EARLY` (jax >= 0.11), where jax 0.11.2 reads `inline=True`
# as JAX_LATE (the call kept in the jaxpr, a `jit(kernel)` scope in the HLO's names); before 0.11, True
INLINE = getattr(getattr(jax, "Inline", None), "JAX_EARLY", True)
_KEYED_ELEMENTS = 64  # a known array operand up to this size is part of the key, by value


class _Inline(Exception):
    """This call runs inline: an operand cannot be keyed."""


def _traced(x) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


def _known_key(value):
    """A hashable key for a value known while tracing (it becomes a constant of the jitted
    function, as it was a constant of the inline trace)."""
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        a = np.asarray(value)
        if a.size > _KEYED_ELEMENTS:
            raise _Inline
        return ("array", a.dtype.str, a.shape, a.tobytes())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(_known_key(v) for v in value)
    if isinstance(value, float):  # by its bits: -0.0 is not 0.0, a NaN equals itself
        return ("float", value.hex())
    if value is None or isinstance(value, (bool, int, str)):
        return (type(value).__name__, value)
    raise _Inline


def _traced_key(value):
    leaves, tree = jax.tree_util.tree_flatten(value)
    return (tree,) + tuple((leaf.shape, str(leaf.dtype), getattr(getattr(leaf, "aval", None), "weak_type", False))
                           for leaf in leaves)


def apply(cache: dict, op, inputs: list, attrs: dict, *, guards: list, traced_inputs=None,
          traced_attrs=None, **settings):
    """`ops.apply(op, inputs, attrs, guards=guards, **settings)`, through the cached jitted
    kernel of `cache` (`Lowering.op_calls`: one per program, shared by its traces; the
    interpreter's, one per interpreter). `traced_inputs` (positions) and `traced_attrs` (names):
    what the kernel takes as traced arguments, by default the operands that are tracers."""
    traced_in = {i: v for i, v in enumerate(inputs)
                 if (i in traced_inputs if traced_inputs is not None else _traced(v))}
    traced_at = {k: v for k, v in attrs.items() if (k in traced_attrs if traced_attrs is not None else _traced(v))}
    if not traced_in and not traced_at:
        return dispatch.apply(op, inputs, attrs, guards=guards, **settings)
    try:
        key = (id(op), tuple(sorted((k, _traced_key(v)) for k, v in traced_at.items())),
               tuple((i, _traced_key(v)) for i, v in traced_in.items()),
               tuple(("known", i, _known_key(v)) for i, v in enumerate(inputs) if i not in traced_in),
               tuple(sorted((k, _known_key(v)) for k, v in attrs.items() if k not in traced_at)),
               tuple(sorted((k, _known_key(v)) for k, v in settings.items())))
        hash(key)
    except (_Inline, TypeError):  # TypeError: a pytree whose static part does not hash
        return dispatch.apply(op, inputs, attrs, guards=guards, **settings)
    entry = cache.get(key)
    if entry is None or entry[2] is not op:  # (an id is only reused once its op is gone)
        entry = cache[key] = _staged(op, inputs, attrs, traced_in, traced_at, settings) + (op,)
    fn, record, _ = entry
    out, conds, values = fn(traced_in, traced_at)
    conds, values = iter(conds), iter(values)
    for message, cond, value in record[0]:  # None: the traced output in the guard's order
        guards.append((next(conds) if cond is None else cond, message, next(values) if value is None else value))
    return out


def _staged(op, inputs, attrs, traced_in, traced_attrs, settings):
    """The jitted kernel of one call signature and the record of its guards (filled when traced)."""
    known_in = {i: v for i, v in enumerate(inputs) if i not in traced_in}
    known_attrs = {k: v for k, v in attrs.items() if k not in traced_attrs}
    record: list = [()]  # [the guards' (message, known cond or None, known value or None)]

    def kernel(traced_in, traced_attrs):
        merged = {**known_in, **traced_in}
        guards: list = []
        out = dispatch.apply(op, [merged[i] for i in range(len(merged))], {**known_attrs, **traced_attrs},
                             guards=guards, **settings)
        conds, values = [], []
        for cond, message, value in guards:
            if _traced(cond):
                conds.append(cond)
            if _traced(value):
                values.append(value)
        # replaced whole when traced: a trace in another thread leaves the same record
        record[0] = tuple((message, None if _traced(cond) else cond, None if _traced(value) else value)
                          for cond, message, value in guards)
        return out, conds, values

    kernel.__name__ = kernel.__qualname__ = getattr(op, "name", str(op))
    return jax.jit(kernel, inline=INLINE), record
