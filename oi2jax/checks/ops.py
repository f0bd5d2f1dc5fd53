"""Op, transfer and variable-use rules: inputs, outputs, attributes and op typing via `oi2jax.ops.infer`."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import dtypes as D
from .. import ir
from .. import messages
from .. import ops
from ..diagnostics import suggest
from ..grammar.build import INT_SUFFIX_RANGES, SUFFIX_DTYPES
from ..grammar.fmt import format_ref
from ..host_numerics import init_scalar
from ..ops.loading import bundled_set_of
from ..ir import MemKind
from ..naming import setting_size_name
from . import shape_text
from .decls import init_error


class LiteralValue(NamedTuple):
    """A literal op input as the checker typed it (`CheckedGraph.literal`): its dtype and its value,
    a 0-d array in that dtype's representation (dtypes.py)."""

    dtype: str
    value: np.ndarray


class OpRules:
    """Per-node rules for `op` and `transfer` and the variable uses (refs) they read."""

    # ---- ops
    def check_ref(self, ref: ir.VarRef, loops, unknown_msg: str) -> bool:
        """A variable use (op input, transfer source); False when it cannot be typed."""
        if ref.name in loops and ref.indices is None:
            self.loop_index_error(ref.name, ref.span, use="c (`op embedding(xs, c) >> x;` picks row c of xs)")
            return False
        if not self.known(ref.name):
            self.error(f"{unknown_msg} {ref.name}{self.near(ref.name)}", ref.span)
            return False
        if ref.indices is None:
            d = self.decls.get(ref.name)
            if d is not None and d.is_prefix_table:  # the member's shape is typed, the family is read: refuse it
                params = ", ".join(d.index_params)
                n = len(d.index_params)
                self.error(f"prefix table {ref.name} expects {n} ind{'ex' if n == 1 else 'ices'}, got none: "
                           f"name one member ({ref.name}[{params}])", ref.span)
                return False
        if ref.indices is not None:
            d = self.decls.get(ref.name)
            if d is None or not d.is_prefix_table:
                self.error(f"{ref.name} is not a prefix table and cannot be indexed", ref.span)
                return False
            if len(ref.indices) != len(d.index_params):
                self.error(f"prefix table {ref.name} expects {len(d.index_params)} indices, got {len(ref.indices)}",
                           ref.span)
                return False
            for ix in ref.indices:
                if isinstance(ix, str) and ix not in loops and ix not in self.sizes and self.strict:
                    self.error(f"unknown prefix table index {ix} (expected a loop index or size variable)",
                               ref.span)
        return True

    def warn_suffix_ranges(self, node: ir.Op):
        """SPEC-2026-03 D1 (c): a setting's literal that does not fit its own suffix type
        (`value=300u8`) is accepted as upstream does (the suffix is ignored), with a warning."""
        for attr in node.attrs:
            values = attr.value.value if attr.value.kind == "int_list" else (attr.value.value,) \
                if attr.value.kind == "int" else ()
            for v in values:
                text = ir.literal_text(v)
                if not text:
                    continue
                hexa = text.lstrip("-").startswith("0x")  # hex digits may look like an f32 suffix
                suffix = next((s for s in sorted(INT_SUFFIX_RANGES, key=len, reverse=True)
                               if s and text.endswith(s) and not (hexa and s.startswith("f"))), "")
                lo_hi = INT_SUFFIX_RANGES.get(suffix)
                if lo_hi is not None and not lo_hi[0] <= int(v) <= lo_hi[1]:
                    self.warning(f"setting {attr.name}={text}: {int(v)} does not fit its suffix type {suffix} "
                                 f"({lo_hi[0]}..{lo_hi[1]}); OpenInfer ignores the suffix and uses {int(v)}",
                                 attr.span)

    def check_op(self, node: ir.Op, loops):
        name_span = self.name_span(node.span, "op")
        if node.op not in self.registry:
            hint = self.ops_hint(node.op)  # the op of a bundled set not loaded: that, not a close built-in
            self.error(f"unsupported op {node.op}{hint or suggest(node.op, self.registry)}",
                       name_span)
            return
        spec = self.registry[node.op]
        ok = True
        for ref in node.refs:
            if not self.check_source(ref, loops, "unknown input variable"):
                ok = False
        arity = ops.typing.arity_error(spec, len(node.inputs), node.op)
        if arity is not None:  # before the literals are typed: `silu(g, 2)` is one input too many
            self.error(arity, name_span)
            ok = False
        if ok and not self.type_literal_inputs(node):
            ok = False
        out = node.output
        out_ok = True
        if not self.known(out):
            self.error(f"unknown output variable {out}{self.near(out)}", node.output_span)
            out_ok = False
        elif self.kind(out) == MemKind.CONSTANT:
            self.error(f"cannot write to constant memory: {out}", node.output_span)
            out_ok = False
        elif self.kind(out) == MemKind.PERSISTENT:
            self.error(f"persistent cache {out} must be written via cache.write", node.output_span)
            out_ok = False
        self.warn_suffix_ranges(node)
        # size names in int lists (`shape=[H, HD]`): a variable there is a mistake, not a size
        for attr in node.attrs:
            if attr.value.kind == "int_list":
                for v in attr.value.value:
                    if isinstance(v, str) and self.known(v.lstrip("-")):
                        self.error(f"op {node.op} setting {attr.name}: {v.lstrip('-')} is a variable; a list takes "
                                   f"integers and size names", attr.span)
                        ok = False
        # variable-valued attributes
        for attr in node.attrs:
            aname = spec.aliases.get(attr.name, attr.name)
            aspec = spec.attrs.get(aname)
            if attr.value.kind != "var" or aspec is None:
                continue
            var = attr.value.value
            if var in loops and not self.known(var):  # `top_k(x, k=l)` in a loop: not a size, not a variable
                if aspec.static:
                    self.error(f"op {node.op} setting {attr.name} must be a literal or a size name (it fixes the "
                               f"output's shape), not the loop index {var}", attr.span)
                else:
                    self.loop_index_error(var, attr.span, f"op {node.op} setting {attr.name}: ",
                                          use=f"c ({attr.name}=c)")
                ok = False
            elif aspec.kind == "string":
                if self.model is not None:
                    meta = (self.model.metadata or {}).get(var)
                    if meta is None or getattr(meta, "type", None) != "string":
                        self.error(f"unknown attribute string: {var}", attr.span)
                    elif aname == "rounding_mode":
                        try:
                            ops.typing.check_rounding_mode(meta.value, f", the model's metadata string {var}")
                        except ops.OpTypeError as exc:
                            self.error(exc.message, attr.span)
                            ok = False
            elif setting_size_name(self.g, aspec, attr) is not None:
                continue  # a size name (`top_k(x, k=K)`): ops.infer resolves it, or says it is unknown
            elif aspec.static:
                self.error(f"op {node.op} setting {attr.name} must be a literal (it fixes the output's shape), "
                           f"not the variable {var}", attr.span)
                ok = False
            elif aspec.kind in ("scalar", "float", "int", "bool"):
                if self.model is not None and getattr((self.model.metadata or {}).get(var), "type", None) == "string":
                    continue
                if not self.known(var):
                    self.error(f"unknown attribute variable {var}{self.near(var)}", attr.span)
                elif not self.is_scalar(var) and not aspec.rows:
                    self.error(f"attribute {var} must be scalar", attr.span)
                elif not _VAR_KIND_OK[aspec.kind](self.dtype(var)):
                    self.error(f"op {node.op} setting {attr.name} is {_KIND_WORD[aspec.kind]}, but {var} is "
                               f"{self.dtype(var)}", attr.span)
        if not ok:
            return
        in_dtypes = [self.input_dtype(node, i) for i in range(len(node.inputs))]
        in_shapes = [() if isinstance(r, ir.LiteralInput) else self.shape(r.name) for r in node.inputs]
        in_names = [format_ref(r) for r in node.inputs]
        try:
            attr_shapes = {spec.aliases.get(a.name, a.name): self.shape(a.value.value) for a in node.attrs
                           if a.value.kind == "var" and self.known(a.value.value)}
            sig = ops.infer(node.op, in_dtypes, in_shapes, node.attr_map, out_name=out, in_names=in_names,
                            registry=self.registry, sizes=self.size_scope(), attr_shapes=attr_shapes)
        except ops.OpTypeError as exc:
            span = name_span
            if exc.attr is not None:
                for a in node.attrs:
                    if a.name == exc.attr or spec.aliases.get(a.name) == exc.attr:
                        span = a.span
            elif exc.input is not None and 0 <= exc.input < len(node.inputs):
                span = node.inputs[exc.input].span
            self.error(exc.message, span)
            return
        self.op_sigs[node.index] = sig  # the CheckedGraph's signature: the backends do not re-infer it
        self.check_integer_settings(node, spec, in_dtypes[0])
        for attr in node.attrs:  # SPEC-2026-03 D3: the 1fc5207 form 0/1 of a bool setting
            if ops.typing.bool_only(spec, attr.name) and attr.value.kind == "int":
                self.warning(f"{attr.name}={attr.value.value}: current OpenInfer accepts only true/false here; "
                             f"read as {'true' if attr.value.value else 'false'}", attr.span)
        if not out_ok:
            return
        declared = self.dtype(out)
        if declared != sig.out_dtype:
            self.error(f"op {node.op} output dtype mismatch for {out}: expected {declared}, got {sig.out_dtype}",
                       node.output_span)
            return
        out_shape = self.shape(out)
        if sig.out_shape is not None and out_shape is not None and tuple(sig.out_shape) != out_shape:
            self.error(messages.op_output_shape(node.op, out, out_shape, sig.out_shape), node.output_span)


    def check_integer_settings(self, node: ir.Op, spec, first: str | None) -> None:
        """SPEC §6.3: an "integer" consumer (shl/shr bits, an argmax axis, and for integer inputs
        div's mask, relu's alpha and clamp_max, clamp's bounds, fill's value) rejects a float
        value; given as a variable, its dtype says so before the run (the SPEC: SHOULD at compile
        time), where OpenInfer fails at run time. A float truncated in silence would be a value
        the user never wrote."""
        for attr in node.attrs:
            aspec = spec.attrs.get(spec.aliases.get(attr.name, attr.name))
            if attr.value.kind != "var" or aspec is None or aspec.value_rule not in ("int", "dtype"):
                continue
            var = attr.value.value
            if not self.known(var) or self.kind(var) is None or not D.get(self.dtype(var)).is_float:
                continue
            if aspec.value_rule == "int":
                self.error(f"op {node.op} setting {attr.name} must be an integer, but {var} is {self.dtype(var)}",
                           attr.span)
            elif first is not None and not D.get(first).is_float:
                self.error(f"op {node.op} setting {attr.name} must be an integer for {first} inputs, but {var} is "
                           f"{self.dtype(var)}", attr.span)

    def input_dtype(self, node: ir.Op, pos: int) -> str | None:
        """The dtype of an op's input: its variable's, or a literal's as `type_literal_inputs` typed it."""
        ref = node.inputs[pos]
        if isinstance(ref, ir.LiteralInput):
            return self.literals[(node.index, pos)].dtype
        return self.dtype(ref.name)

    def type_literal_inputs(self, node: ir.Op) -> bool:
        """Type each literal input (docs/semantics.md): its suffix's dtype, else that of the op's
        first input that has one (a variable, or a literal with a suffix); its value must fit that
        dtype as an `@init` literal must (SPEC §2.3: no narrowing, no int for a float). Records the
        value in that dtype (`CheckedGraph.literal`); False after an error."""
        typed = [r.dtype if isinstance(r, ir.LiteralInput) else self.dtype(r.name) for r in node.inputs]
        first = next((i for i, d in enumerate(typed) if d is not None), None)
        ok = True
        for pos, ref in enumerate(node.inputs):
            if not isinstance(ref, ir.LiteralInput):
                continue
            text = format_ref(ref)
            if first is None:  # suggest the output's dtype where the literal fits it
                out = self.dtype(node.output)
                hint = out if out is not None and init_error(out, ref.value) is None else \
                    {"float": "f32", "int": "i32"}.get(ref.value.kind, "bool")
                self.error(messages.untyped_literal_input(node.op, text, hint, hint in SUFFIX_DTYPES), ref.span)
                return False
            dtype = typed[pos] or typed[first]
            problem = init_error(dtype, ref.value, "literal")
            if problem is not None:
                source = "its suffix" if ref.dtype else f"the dtype of {format_ref(node.inputs[first])}"
                self.error(f"op {node.op} input {pos}: the literal {text} takes {dtype} ({source}): {problem}",
                           ref.span)
                ok = False
                continue
            self.literals[(node.index, pos)] = LiteralValue(dtype, init_scalar(dtype, ref.value))
        return ok

    def size_scope(self):
        """The sizes an op's int-list attribute may name; unknown names are errors only when the
        sizes are known (a model or --size given), as for declarations."""
        return _Sizes(self.sizes, strict=self.strict)

    def ops_hint(self, name: str) -> str:
        """`; it is in the bundled op set nn (--ops nn)` for a known op of a set not loaded."""
        found = bundled_set_of(name)
        if found is None or found in self.registry.sets:
            return ""
        return f"; it is in the bundled op set {found} (--ops {found}, or ops=[\"{found}\"])"

    def check_source(self, ref: ir.VarRef, loops, unknown_msg: str) -> bool:
        """A value read by an op, transfer or cache.write: known, and not persistent (§2.2)."""
        if not self.check_ref(ref, loops, unknown_msg):
            return False
        if ref.indices is None and self.kind(ref.name) == MemKind.PERSISTENT:
            self.error(f"persistent cache {ref.name} must be read via cache.read", ref.span)
            return False
        return True

    def check_transfer(self, node: ir.Transfer, loops):
        src_ok = self.check_source(node.src, loops, "unknown transfer source")
        dst = node.dst
        if not self.known(dst.name):
            self.error(f"unknown transfer destination {dst.name}{self.near(dst.name)}", dst.span)
            return
        if dst.indices is not None or self.kind(dst.name) in (MemKind.CONSTANT, MemKind.PERSISTENT):
            self.error(f"cannot transfer into {dst}", dst.span)
            return
        if not src_ok:
            return
        if self.dtype(node.src.name) != self.dtype(dst.name):
            self.error(f"transfer dtype mismatch: {node.src} is {self.dtype(node.src.name)}, {dst.name} is "
                       f"{self.dtype(dst.name)}", dst.span)
            return
        a, b = self.shape(node.src.name), self.shape(dst.name)
        if a is not None and b is not None and a != b:
            self.error(f"transfer shape mismatch: {node.src} is {shape_text(a)}, {dst.name} is {shape_text(b)}",
                       dst.span)


# the dtypes a scalar variable may have when it gives an added op's typed attribute
_VAR_KIND_OK = {
    "scalar": lambda d: True,
    "float": lambda d: d is not None and (D.get(d).is_float or D.get(d).family in (D.SIGNED, D.UNSIGNED)),
    "int": lambda d: d is not None and D.get(d).family in (D.SIGNED, D.UNSIGNED),
    "bool": lambda d: d == "bool",
}
_KIND_WORD = {"float": "a number", "int": "an integer", "bool": "a bool"}


class _Sizes(dict):
    """Size variables for `ops.infer`, with whether an unknown name is an error."""

    def __init__(self, sizes, strict: bool):
        super().__init__(sizes)
        self.strict = strict
