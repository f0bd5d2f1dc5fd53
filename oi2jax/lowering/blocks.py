"""Straight-line nodes: op, assign, transfer (their rules register in `rules.RULES`)."""
from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from .. import ir, messages, ops
from ..messages import CHECKED
from ..diagnostics import OiError
from ..model.bind import AttrVar
from ..ops import calls as op_calls
from ..ops.jax_numerics import any_true, np_dtype
from .context import Tracer
from .state import Env
from .rules import rule

# ------------------------------------------------------------------------------ rules


@rule(ir.Assign)
def _assign(node: ir.Assign, env, frame, tr):
    return env  # temporaries are created at step start and keep their value (§3.9)


def _dtype_of(tr: Tracer, name: str) -> str:
    return tr.bound.dtype(name)


def attr_values(node: ir.Op, env: Env, tr: Tracer) -> dict:
    """The op's attributes (`BoundGraph.op_attrs`, the one preparation) with each variable read:
    a constant scalar as its static value, any other as a 0-d array of the trace (a per-row setting as held)."""
    values = tr.bound.op_attrs(node)
    for name, value in values.items():
        if isinstance(value, AttrVar):
            if value.static is not None:
                values[name] = value.static
            else:
                assert value.name in env.values, CHECKED
                values[name] = ops.attr_variable_value(tr.bound.op_sig(node).op, name, env.values[value.name])
    return values


def _guard_site(tr: Tracer, message: str, span: ir.Span, value) -> int:
    """A kernel guard's site. A u64 value travels as the int64 of its bits (`TraceGuards.errval`):
    it is shown as the unsigned value it is (18446744073709551615, not -1), as the interpreter
    shows it."""
    unsigned = np.dtype(getattr(value, "dtype", np.int64)) == np.uint64
    return tr.lowering.site(message, span, (lambda bits: message.format(value=int(bits) % 2**64)) if unsigned else None)


@rule(ir.Op)
def _op(node: ir.Op, env, frame, tr):
    sig = tr.bound.op_sig(node)  # typed by the checker (check.CheckedGraph)
    kept = {i for i, spec in enumerate(sig.op.inputs) if spec.name in sig.op.quantized_inputs}
    inputs, in_dtypes = [], []
    for pos, ref in enumerate(node.inputs):
        if isinstance(ref, ir.LiteralInput):  # a constant of the dtype the checker gave it
            lit = tr.bound.checked.literal(node, pos)
            inputs.append(jnp.asarray(lit.value))
            in_dtypes.append(lit.dtype)
        else:
            env, value = tr.read(ref, env, frame, kept=pos in kept)
            inputs.append(value)
            in_dtypes.append(_dtype_of(tr, ref.name))
    guards: list = []
    attrs = attr_values(node, env, tr)

    def call(attrs, guards=guards):
        return op_calls.apply(tr.lowering.op_calls, sig.op, inputs, attrs, in_dtypes=in_dtypes,
                              out_dtype=sig.out_dtype, mode=sig.mode, guards=guards,
                              out_shape=None if node.output in tr.lowering.shaped else sig.out_shape,
                              precision=tr.lowering.precision, platform=tr.lowering.loop_policy.platform,
                              kernels=tr.lowering.kernels)
    try:
        read = {k: v for k, v in attrs.items() if k in SHAPE_SETTINGS and isinstance(v, jax.Array)}
        if read and sig.op.shape is not None:
            env, out = _over_settings(node, env, tr, sig, [tuple(np.shape(x)) for x in inputs], attrs, read, call)
        else:
            out = call(attrs)
    except ops.OpTypeError as exc:  # an added op's kernel failed or broke its declaration
        raise OiError(exc.message, node.span, source=tr.graph.source) from None
    for cond, message, value in guards:  # the kernel's runtime checks (Ctx.fail_if)
        env = tr.fail_if(env, any_true(cond), _guard_site(tr, message, node.span, value), value)
    if node.output in tr.lowering.shaped:  # runtime-shaped (phases.runtime_shaped)
        return _shaped_op_output(node, env, tr, out)
    want = tr.bound.shape(node.output)
    if tuple(out.shape) != tuple(want):
        # a shape the checker could not type (keepdims= a model scalar): the one message
        raise OiError(messages.op_output_shape(node.op, node.output, want, out.shape), node.span,
                      source=tr.graph.source)
    return env.set(node.output, out)


SHAPE_SETTINGS = ("axis", "keepdims")  # the reductions' settings a result's shape depends on


def _over_settings(node: ir.Op, env, tr: Tracer, sig, in_shapes, attrs: dict, read: dict, call):
    """An op whose result's shape depends on a setting read from a variable at run time
    (`argmax_axis(x, axis=a)`, `keepdims=k`: SPEC §6.3), which JAX needs static: the op computed
    for each value giving the output's declared shape, the run's value selecting one. Any other
    value is the runtime error the interpreter raises for it: an axis out of range, or a result
    of another shape than the output's. (env, result)."""
    rank = len(in_shapes[0])
    want = tuple(tr.bound.shape(node.output))
    axis = read.get("axis")
    if axis is not None:  # as an int64; an unsigned value past the rank stays past it
        shown = axis.astype(jnp.int64)
        unsigned = jnp.issubdtype(axis.dtype, jnp.unsignedinteger)
        axis = jnp.minimum(axis, rank).astype(jnp.int64) if unsigned else shown
        message = f"op {node.op} axis {{value}} out of range for rank {rank}"
        code = tr.lowering.site(message, node.span, render=(lambda bits: message.format(value=int(bits) % 2**64))
                                if unsigned else None)
        env = tr.fail_if(env, (axis < -rank) | (axis >= rank), code, shown)
    choices = {"axis": range(-rank, rank), "keepdims": (False, True)}
    names = sorted(read)
    fits = []  # (picked, result)
    for values in itertools.product(*(choices[k] for k in names)):
        static = dict(attrs, **dict(zip(names, values)))
        picked = jnp.bool_(True)
        for name, value in zip(names, values):
            picked = picked & ((axis == value) if name == "axis" else ((read[name] != 0) == value))
        shape = tuple(sig.op.shape(in_shapes, static))
        if shape != want:
            code = tr.lowering.site(messages.op_output_shape(node.op, node.output, want, shape), node.span)
            env = tr.fail_if(env, picked, code, 0)
            continue
        guards: list = []
        result = call(static, guards)
        for cond, message, value in guards:  # the kernel's checks, of the picked value only
            env = tr.fail_if(env, picked & any_true(cond), _guard_site(tr, message, node.span, value), value)
        fits.append((picked, result))
    if not fits:  # every value is an error (recorded above): a value of the output's shape
        return env, jnp.zeros(want, np_dtype(sig.out_dtype))
    out = fits[-1][1]
    for picked, result in reversed(fits[:-1]):
        out = jnp.where(picked, result, out)
    return env, out


def _shaped_op_output(node: ir.Op, env, tr, out):
    """An op on runtime-shaped operands: computed over the capacity arrays (the padding is masked
    when written back to a tensor and trimmed from outputs); the result takes their logical shape,
    which must agree between operands."""
    moving = [r.name for r in node.refs if r.indices is None and r.name in tr.lowering.shaped]
    if not moving:  # e.g. a fill of a fixed-shape input: a value of its own shape
        return tr.embed(env, node.output, out)
    logical = env.shapes[moving[0]]
    for other in moving[1:]:
        code = tr.lowering.site(f"op {node.op}: {moving[0]} and {other} have different current shapes "
                                f"(dimension {{value}} differs)", node.span)
        differ = env.shapes[other] != logical
        env = tr.fail_if(env, jnp.any(differ), code, jnp.argmax(differ))
    if tuple(out.shape) != tuple(tr.capacity_shape(node.output)):
        raise OiError(f"op {node.op} output shape {list(out.shape)} cannot hold {node.output}", node.span,
                      source=tr.graph.source)
    return tr.embed(env, node.output, out, logical)


@rule(ir.Transfer)
def _transfer(node: ir.Transfer, env, frame, tr):
    env, value = tr.read(node.src, env, frame)
    assert tuple(value.shape) == tuple(tr.bound.shape(node.dst.name)), CHECKED  # checks/ops.check_transfer
    return env.set(node.dst.name, value)


def numel(shape) -> int:
    return math.prod(shape)
