"""THE wording of each error that more than one stage reports: a runtime error found by a
compiled guard (lowering) and by the interpreter, or an error the checker finds statically when
it can and a backend finds when only the run knows (a value from a model or a loop). One function
per message, imported by every stage that says it; the differential test holds the compiled and
interpreted runs to the same text.
"""
from __future__ import annotations

from .diagnostics import suggest

# An assertion's text where a backend relies on what the checker guarantees (check.CheckedGraph):
# such a state is unreachable from any checked graph, so it is not a user error to word.
CHECKED = "the checker refuses it (check.CheckedGraph)"


def _dims(shape) -> str:
    return str([int(d) for d in shape])


def unknown_size(var: str, size: str, model=None, no_model: str | None = None, known=()) -> str:
    """A declaration's dim names a size that neither the sizes given nor the model define (the
    checker says it when sizes are given, binding otherwise). Why: the model lacks it, or there is
    no model (`no_model`: pipeline.ModelChoice.no_model_reason, where the default was looked for);
    `known`: the sizes there are (a close one is suggested)."""
    path = getattr(model, "path", None)
    why = f" (not a size variable of model {path})" if path is not None else \
        f" ({no_model})" if model is None and no_model else ""
    return f"invalid dims for {var}: unknown size: {size}{suggest(size, known)}{why}"


def unknown_fixed_size(index: str, size: str, var: str, known=()) -> str:
    """`@fixed(i=T)` names a size T that neither the sizes given nor the model define (the checker
    says it when it knows the sizes, binding otherwise)."""
    return f"@fixed({index}={size}) of {var}: unknown size: {size}{suggest(size, known)}"


def op_unknown_size(op: str, setting: str, size: str, known=()) -> str:
    """An op's int-list setting (`reshape(x, shape=[H, HD])`) names an unknown size (the checker
    says it when it knows the sizes, binding otherwise)."""
    return f"op {op} setting {setting}: unknown size {size}{suggest(size, known)}"


def negative_index(table: str, what: str, value) -> str:
    """A cache index (`what`: "index i", "slice start") that is negative when it is used."""
    return f"cache index cannot be negative: {table} {what} is {value}"


def exceeds_fixed(table: str, dim: int, fixed: int, what: str, value) -> str:
    """A table access past a `@fixed` size (`what`: "index" for a single index, "slice end"). The
    dimension is named as such: OpenInfer's "cache table K index 0 exceeds fixed size 4 (index 4)"
    read as if the index were 0."""
    return f"dimension {dim} of {table}: {what} {value} is past its fixed size {fixed}"


def slice_end_underflow(table: str, size) -> str:
    return f"slice end underflow for size {size} in {table}"


def slice_end_before_start(table: str, end) -> str:
    return f"slice end {end} before start in {table}"


def auto_dim_exceeds(table: str, fixed: int, dim: str, value) -> str:
    return f"auto_dim {table} exceeds fixed max {fixed} for {dim} (index {value})"


def loop_bound_not_finite(bound) -> str:
    return f"loop bound {bound} is not finite"


I64_RANGE = (-2**63, 2**63)  # a loop index, a cache or prefix index is an i64: [lo, hi)
OUTSIDE_I64 = "outside an index's range (i64: -2^63 to 2^63-1)"


def loop_bound_out_of_range(bound, value) -> str:
    """A bound read from a u64 or float variable (floats truncated) that no i64 holds."""
    return f"loop bound {bound} is {value}, {OUTSIDE_I64}"


def index_out_of_range(what: str, name: str, value) -> str:
    """A cache or prefix index (`what`) read from a u64 variable that no i64 holds."""
    return f"{what} {name} is {value}, {OUTSIDE_I64}"


def op_output_shape(op: str, out: str, declared, result) -> str:
    """An op whose result shape is not its output's (the checker's when it can type the shape,
    the backends' when it depends on a value, e.g. `keepdims=` a model scalar)."""
    return f"op {op} output shape mismatch for {out}: {out} is {_dims(declared)}, the result is {_dims(result)}"


def write_shape(table: str, want, got) -> str:
    return f"cache.write {table} expects shape {_dims(want)}, got {_dims(got)}"


def write_rows_shape(table: str, entry, got) -> str:
    """A slice write's value: one row per slice position, [S, *entry]."""
    return f"cache.write {table}: a slice write takes S rows of {_dims(entry)} (shape [S] + {_dims(entry)}), got {_dims(got)}"


def write_rows_count(table: str, count, rows: int) -> str:
    """A slice write of more rows than its value holds."""
    return f"cache.write {table}: slice of {count} rows, but the value holds {rows}"


def read_slice_length(table: str, length, dim: int) -> str:
    return f"cache.read {table}: slice of length {length} does not match the destination's dimension {dim}"


def current_shape(what: str, table: str, shape, want) -> str:
    """An `@auto_dim` tensor whose current (grown) shape is not the one its reader declares."""
    return f"{what} {table}: the tensor's current shape {_dims(shape)} does not match the destination's {_dims(want)}"


def prefix_member_missing(table: str, member: str) -> str:
    """A prefix-table access outside the model's family (docs/semantics.md item 1: an error, not
    zeros). A compiled run names the tensor when the index is static (a literal, a loop over a
    static range); a traced index is reported by its value (`lowering/context.read_member`)."""
    return f"prefix table {table}: model tensor {member} not found"


def setting_not_an_input(op: str, name: str) -> str:
    """An op setting (`NAME=value`) given a tensor (the parser: `bias=bq[l]`; op typing: an
    unsupported setting). Settings are literals or a scalar variable's name; a tensor is an input."""
    hint = ("; linear takes a bias as its optional third input: op linear(h, W, b)"
            if (op, name) == ("linear", "bias") else "")
    return (f"op {op} has no setting {name}: settings (NAME=value) are literals or a scalar variable's name, and "
            f"a tensor is given as an input{hint}")


def untyped_literal_input(op: str, text: str, dtype: str, suffix: bool) -> str:
    """An op whose inputs are all literals, none with a suffix (`op add(1, 2)`): nothing gives them
    a dtype. `text`: the first literal as written; `dtype`: the one to suggest; `suffix`: whether a
    suffix can name it."""
    how = f"write its dtype as a suffix (`{text}{dtype}`), or " if suffix else ""
    return (f"op {op}: every input is a literal, so nothing gives {text} a dtype; {how}declare a variable holding "
            f"it, e.g. `c: {dtype} @init({text});` in `volatile {{ ... }}`, and write c in its place")

def model_dtype_mismatch(label: str, info, dtype: str) -> str:
    """A declaration of `dtype` bound to a model tensor (`TensorInfo`) it cannot read; the way out
    when `widen_floats` would let it (a bf16/f16 tensor read by an f32 declaration)."""
    hint = ""
    if info.widens_to(dtype):
        hint = (f" (convert the model with --dtype f32, or read its {info.value_dtype} tensors as their exact "
                f"f32 values with --widen-floats / widen_floats=True)")
    return f"model dtype mismatch for {label}: model {info.value_dtype}, graph {dtype}{hint}"
