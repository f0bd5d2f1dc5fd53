"""Model binding: a graph + its model (+ size overrides) -> `BoundGraph`, shared by lowering and interpreter.

`bind(graph, model=None, sizes=None)` resolves every declared shape (§2.1), checks the model
tensors bound to declarations (dtype/shape, `@ref` targets, §2.2; prefix-table members, §2.4)
and raises one `OiError` carrying every problem found (each located at its declaration).
The resulting `BoundGraph` answers questions about the graph with its model: shapes, dtypes,
initial values (§2.2, §2.5), stacked prefix-table families, loop bounds, metadata strings.
Values are in the representation of docs/architecture.md (dtypes.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import dtypes as dt
from .. import ir, messages
from ..check import resize
from ..diagnostics import Diagnostic, OiError, check_sizes, suggest
from ..messages import CHECKED, model_dtype_mismatch
from ..host_numerics import bf16_encode, f8_encode, fill_value
from ..naming import PLACEHOLDER, family_members, int_list_names, member_name, pattern_regex, resolve_alias, \
    setting_size_name
from ..values import convert_input, ints_exact
from .ggml import AFFINE, HALF_KINDS, KeptBlocks
from .quant import affine_parts, dequantize as quant_dequantize
from .reader import MetaValue, Model

__all__ = ["bind", "AttrVar", "BoundGraph"]


def _literal_kind(dtype: str) -> str:
    """The kind of literal (`ir.Literal`) a value of `dtype` is written as: bool, float or int."""
    return "bool" if dtype == "bool" else "float" if dt.get(dtype).is_float else "int"


def _fmt_shape(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


@dataclass(frozen=True)
class AttrVar:
    """An op attribute given as a variable (`BoundGraph.op_attrs`): read when the op runs.
    `static`: its value when it is a constant scalar (known at bind time), else None."""

    name: str
    static: object = None


class BoundGraph:
    """A graph bound to its model and sizes. Read-only: every answer is derived, cached where costly.

    Arrays returned by `initial`, `family`, `const_value` are shared (read-only); copy before mutating.
    """

    __slots__ = ("graph", "checked", "model", "sizes", "_shapes", "_cache", "_families", "zero_missing_inputs",
                 "widen_floats", "fixed")

    def __init__(self, graph: ir.Graph, model: Model | None, sizes: dict[str, int],
                 shapes: dict[str, tuple[int, ...]], checked=None, zero_missing_inputs: bool = False,
                 widen_floats: bool = False, fixed: dict | None = None):
        self.graph = graph
        # dynamic scalars fixed at compile time (`specialized`): name -> Python value
        self.fixed = dict(fixed or {})
        self.checked = checked  # the CheckedGraph this was bound from (None: bound unchecked)
        self.model = model
        # OpenInfer's zero-filled default asked for: inputs and constants without a value read as
        # zeros (else `bind` refuses such constants and a run such inputs)
        self.zero_missing_inputs = bool(zero_missing_inputs)
        # an f32 constant may read a bf16/f16 model tensor, as its exact f32 values (`_widens`)
        self.widen_floats = bool(widen_floats)
        self.sizes = dict(sizes)
        self._shapes = shapes
        self._cache: dict[str, np.ndarray] = {}
        self._families: dict[str, np.ndarray] = {}

    def _checked(self):
        """The CheckedGraph; a TypeError for a graph bound without checking."""
        if self.checked is None:
            raise TypeError("this graph was bound without checking: compiled and interpreted programs start "
                            "from a checked graph (oi2jax.compile, oi2jax.pipeline.bound, or "
                            "bind(oi2jax.check.check_graph(graph, ...)))")
        return self.checked

    def op_sig(self, node: ir.Op):
        """The op's signature as the checker typed it (check.CheckedGraph): the backends never
        re-infer it."""
        return self._checked().op_sig(node)

    def op_attrs(self, node: ir.Op) -> dict:
        """THE values of an op node's attributes, for `ops.apply` (the lowering and the interpreter
        both start from these): a literal's value; an int list with its size names resolved (by
        the checker), and so a static int naming a size (`top_k(x, k=K)`); a variable naming a
        model metadata string: that string; any other variable: an `AttrVar`, read when the op runs
        (its `static` value when it is a constant scalar)."""
        values = {}
        int_lists = self.op_sig(node).int_lists
        for attr in node.attrs:
            lit = attr.value
            if lit.kind == "var" and attr.name in int_lists:  # a static int naming a size: its value
                values[attr.name] = int_lists[attr.name]
            elif lit.kind == "var":
                text = self.metadata_string(lit.value)
                values[attr.name] = text if text is not None else AttrVar(lit.value, self.static_scalar(lit.value))
            elif lit.kind == "int_list":
                assert attr.name in int_lists, CHECKED  # checks/ops.check_op resolved it
                values[attr.name] = int_lists[attr.name]
            else:
                values[attr.name] = lit.value
        return values

    def static_scalar(self, name: str):
        """A Python value for a constant scalar known at bind time, else None."""
        decl = self.graph.var(name)
        if name in self.fixed:
            return self.fixed[name]
        if decl is None or decl.kind != ir.MemKind.CONSTANT:
            return None
        value = self.initial(name)
        if value.size != 1:
            return None
        return value.reshape(()).item()

    def with_shapes(self, sizes: dict, shapes: dict) -> "BoundGraph":
        """The same checked graph and model at other (e.g. symbolic) sizes and shapes."""
        return BoundGraph(self.graph, self.model, sizes, shapes, self.checked, self.zero_missing_inputs,
                          self.widen_floats, self.fixed)

    def rebind(self, sizes: dict) -> "BoundGraph":
        """The same checked graph and model bound at other `sizes` (a chunked run's tail:
        runtime/chunked.py), with this binding's `zero_missing_inputs`: `check.resize` runs only
        the checker's rules that read a size; the rest of the CheckedGraph is kept."""
        sizes = check_sizes(sizes)
        bound = bind(resize(self._checked(), self.model, sizes), self.model, sizes,
                     zero_missing_inputs=self.zero_missing_inputs, widen_floats=self.widen_floats)
        return bound.specialized(self.fixed) if self.fixed else bound

    def specialized(self, values: dict) -> "BoundGraph":
        """The same binding with the dynamic scalars `values` names fixed at compile time (besides
        those fixed already): an op attribute that reads one is then a value known while tracing
        (`op_attrs`: its `static`), as a literal is -- `sample(temperature=temperature)` fixed at
        0 compiles the greedy draw alone -- and its value at step start (`initial`) is the fixed
        one. It stays a dynamic variable of the graph, which a run may not give (runtime
        `Program.validate_inputs`). Each value must convert exactly to the variable's dtype; a
        name that is not a dynamic scalar is an OiError."""
        dynamic = [d.name for d in self.graph.vars_of(ir.MemKind.DYNAMIC)]
        fixed = dict(self.fixed)
        for name, value in values.items():
            decl = self.graph.var(name)
            if decl is None or decl.kind != ir.MemKind.DYNAMIC:
                raise OiError(f"specialized: {name} is not a dynamic variable of {self.graph.path}"
                              f"{suggest(name, dynamic)}")
            if decl.dims:
                raise OiError(f"specialized: {name} is {decl.dtype}{_fmt_shape(self.shape(name))}: only a "
                              f"scalar input can be fixed at compile time")
            if isinstance(value, (bool, np.bool_)) != (decl.dtype == "bool") or \
                    not isinstance(value, (int, float, np.number, np.bool_)):
                raise OiError(f"specialized: {name}: expected a {decl.dtype} number, got {value!r}")
            convert_input(name, np.asarray(value), decl.dtype, ())  # exactly, else OiError
            fixed[name] = {"bool": bool, "float": float, "int": int}[_literal_kind(decl.dtype)](value)
        return BoundGraph(self.graph, self.model, self.sizes, self._shapes, self.checked, self.zero_missing_inputs,
                          self.widen_floats, fixed)

    def __repr__(self) -> str:
        return f"BoundGraph({self.graph.path!r}, model={self.model_path!r}, sizes={self.sizes})"

    @property
    def model_path(self) -> str | None:
        """The model file bound (given, or found beside the graph: pipeline.choose_model); None without one."""
        return getattr(self.model, "path", None)

    # ------------------------------------------------------------ names, shapes, dtypes

    def _decl_or_temp(self, name: str):
        decl = self.graph.var(name)
        if decl is not None:
            return decl
        temp = self.graph.temporaries.get(name)
        if temp is not None:
            return temp
        raise OiError(f"unknown variable {name}")

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every resolved shape by name (declared variables and `assign` temporaries); a copy."""
        return dict(self._shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        """Resolved shape of a declared variable or `assign` temporary (auto_dim / tables: base shape)."""
        if name in self._shapes:
            return self._shapes[name]
        self._decl_or_temp(name)
        raise OiError(f"invalid dims for {name}")  # unreachable: bind resolved every shape

    def dtype(self, name: str) -> str:
        return self._decl_or_temp(name).dtype

    def metadata_string(self, name: str) -> str | None:
        """The model metadata STRING named `name` (None when there is none)."""
        if self.model is None:
            return None
        v = self.model.metadata.get(name)
        return v.value if v is not None and v.type == "string" else None

    def model_name(self, decl: ir.VarDecl) -> str:
        """The model tensor a declaration binds to: its `@ref` name, else its own name (§0 item 2),
        through the model's aliases (`resolve_alias`)."""
        key = decl.ref if decl.ref is not None else decl.name
        return resolve_alias(self.model, key) if self.model is not None else key

    # ------------------------------------------------------------ values

    def initial(self, name: str) -> np.ndarray:
        """The value at step start (§2.2, §2.5, §0 item 4), in the dtype's representation.

        dynamic / volatile / constant: model tensor (`@ref` name, else own name), else metadata of that
        name, else `@init` fill, else zeros; persistent: `@init` fill else zeros; temporaries: zeros."""
        cached = self._cache.get(name)
        if cached is not None:
            return cached
        decl = self._decl_or_temp(name)
        shape = self.shape(name)
        if name in self.fixed:
            value = fill_value(decl.dtype, shape, ir.Literal(_literal_kind(decl.dtype), self.fixed[name]))
        elif isinstance(decl, ir.Assign):
            value = fill_value(decl.dtype, shape, None)
        elif decl.kind == ir.MemKind.PERSISTENT or decl.is_prefix_table or decl.is_table:
            value = fill_value(decl.dtype, shape, decl.init)
        else:
            value = self._model_value(decl, shape)
            if value is None:
                value = fill_value(decl.dtype, shape, decl.init)
        value.flags.writeable = False
        self._cache[name] = value
        return value

    def has_default(self, name: str) -> bool:
        """Whether a dynamic variable has a value of its own when the host gives none: a model
        tensor (or metadata) of its name, or an `@init`. Otherwise its default is zeros."""
        decl = self.graph.var(name)
        if name in self.fixed:  # its fixed value (`specialized`)
            return True
        if decl is None or decl.init is not None:
            return decl is not None
        return self._model_value(decl, self.shape(name)) is not None

    def missing_inputs(self, given) -> list[str]:
        """Dynamic variables a step may read before writing them (phases.read_before_written) that
        are not in `given` and have no default of their own (a model tensor or `@init`): running
        without them would silently compute from zeros."""
        reads = self._checked().read_before_written
        return [v.name for v in self.graph.vars_of(ir.MemKind.DYNAMIC)
                if v.name not in given and v.name in reads and not self.has_default(v.name)]

    def const_value(self, name: str) -> np.ndarray | None:
        """A constant's value (as `initial`); None when `name` is not a declared constant."""
        decl = self.graph.var(name)
        if decl is None or decl.kind != ir.MemKind.CONSTANT or decl.is_prefix_table:
            return None
        return self.initial(name)

    def _model_value(self, decl: ir.VarDecl, shape) -> np.ndarray | None:
        if self.model is None:
            return None
        key = self.model_name(decl)
        info = self.model.tensors.get(key)
        if info is not None:
            if not info.has_data:
                return None
            return _load_as(self.model, key, decl.dtype, self.widen_floats)
        meta = self.model.metadata.get(key)
        if meta is not None:
            return _meta_as_tensor(decl, meta, shape)
        return None

    # ------------------------------------------------------------ prefix tables

    def member_name(self, decl: ir.VarDecl | str, values: tuple[int, ...]) -> str:
        """Model tensor name of member `values` (one per index param, positional) of a prefix table:
        each `{param}` in the pattern is replaced by the value bound to the parameter of that NAME (§2.4)."""
        if isinstance(decl, str):
            decl = self._prefix_decl(decl)
        values = tuple(values)
        if len(values) != len(decl.index_params):
            raise OiError(f"prefix table {decl.name} takes {len(decl.index_params)} indices, got {len(values)}",
                          decl.span)
        for m in PLACEHOLDER.finditer(decl.pattern or ""):
            if m.group(1) not in decl.index_params:
                raise OiError(f"prefix table {decl.name}: pattern placeholder {{{m.group(1)}}} is not one of its "
                              f"parameters ({', '.join(decl.index_params)})", decl.attr_span("pattern"))
        return member_name(decl, values)

    def _prefix_decl(self, name: str) -> ir.VarDecl:
        decl = self.graph.var(name)
        if decl is None or not decl.is_prefix_table:
            raise OiError(f"{name} is not a prefix table")
        return decl

    def family_members(self, name: str) -> dict[tuple[int, ...], str]:
        """Index values -> model tensor name, for every model tensor matching the table's pattern."""
        decl = self._prefix_decl(name)
        if self.model is None:
            return {}
        _, groups = pattern_regex(decl)
        missing = [p for p in decl.index_params if p not in groups]
        if missing:
            raise OiError(f"prefix table {name}: pattern {decl.pattern!r} does not use parameter "
                          f"{missing[0]}", decl.attr_span("pattern"))
        return family_members(decl, self.model.tensors)

    def family_counts(self, name: str) -> tuple[int, ...]:
        """n_j = max index present + 1 among matching model tensors, per index param (0 when none)."""
        members = self.family_members(name)
        decl = self._prefix_decl(name)
        return tuple(max((k[j] for k in members), default=-1) + 1 for j in range(len(decl.index_params)))

    def family(self, name: str) -> np.ndarray:
        """The stacked members of prefix table `name`: shape [n_1, ..., n_k, *shape] in index-param order.

        Every grid position must exist in the model (a hole is an error naming the missing tensor);
        a member stored without data reads as the `@init` fill (else zeros)."""
        cached = self._families.get(name)
        if cached is not None:
            return cached
        decl = self._prefix_decl(name)
        members = self.family_members(name)
        if not members:
            where = f"model {self.model.path}" if self.model is not None else "no model given"
            raise OiError(f"prefix table {name}: no model tensor matches pattern {decl.pattern!r} ({where})",
                          decl.span)
        counts = self.family_counts(name)
        out = np.empty(counts + self.shape(name), dt.get(decl.dtype).np_dtype)
        for idx in np.ndindex(*counts):
            out[idx] = self._member(decl, members, idx)
        out.flags.writeable = False
        self._families[name] = out
        return out

    def family_items(self, name: str, kept: bool = False, half: bool = False):
        """(index, value) of every member of prefix table `name` in index order, each read on
        its own (not stacked, not kept): what `family` stacks, for a program that holds the
        members as separate buffers. `kept`: a member kept as GGML blocks comes as its
        `KeptBlocks` (each member its own type), not its values; `half`: so does a widened
        bf16/f16 matrix (`kept_blocks`)."""
        decl = self._prefix_decl(name)
        members = self.family_members(name)
        if not members:
            self.family(name)  # raises: no model tensor matches the pattern
        for idx in np.ndindex(*self.family_counts(name)):
            yield idx, self._member(decl, members, idx, kept, half)

    def _member(self, decl: ir.VarDecl, members: dict, idx: tuple[int, ...], kept: bool = False,
                half: bool = False):
        """One member's value: its model tensor (checked against the declaration), or the `@init`
        fill for a member stored without data; a hole in the grid is an error naming it. `kept`:
        a member kept as GGML blocks is its `KeptBlocks`."""
        shape = self.shape(decl.name)
        tensor = members.get(idx)
        if tensor is None:
            raise OiError(f"prefix table {decl.name}: model tensor {self.member_name(decl, idx)} not found",
                          decl.span)
        info = self.model.tensors[tensor]
        _check_tensor(decl, info, shape, f"{decl.name}[{', '.join(map(str, idx))}]", self.widen_floats)
        if kept and self._kept_kind(decl, info, half) is not None:
            return self._kept(tensor, info)
        return _load_as(self.model, tensor, decl.dtype, self.widen_floats) if info.has_data else \
            fill_value(decl.dtype, shape, decl.init)

    # ------------------------------------------------------------ weights kept as GGML blocks

    def kept_blocks(self, name: str, half: bool = False) -> KeptBlocks | None:
        """The GGML blocks a constant is bound to (its model tensor kept as blocks: model/ggml.py),
        which a compiled program places packed and never dequantized (docs/models.md); None for
        any other constant. `half` (a program whose kernels are ggml's): a bf16/f16 matrix that
        `widen_floats` lets an f32 declaration read is kept too, as its bytes (`HALF_KINDS`).
        A prefix table: its members' blocks stacked ([n_1, ..., *shape]),
        when every member is kept in one type; None when none is kept; an error when they differ
        (a stacked family holds one type: a family read member by member keeps each member's)."""
        decl = self.graph.var(name)
        if decl is None or decl.kind != ir.MemKind.CONSTANT or self.model is None:
            return None
        if not decl.is_prefix_table:
            key = self.model_name(decl)
            info = self.model.tensors.get(key)
            if info is None or self._kept_kind(decl, info, half) is None:
                return None
            return self._kept(key, info)
        members = self.family_members(name)
        kinds = {self._kept_kind(decl, self.model.tensors[t], half) for t in members.values()}
        if kinds == {None} or not members or kinds == {AFFINE, None}:
            return None  # (members with QuantParams that only some can keep exactly: all read as f32)
        if len(kinds) > 1:
            stored = ", ".join(sorted(k or decl.dtype for k in kinds))
            raise OiError(f"prefix table {name}: its members are stored as {stored}, and a stacked family holds "
                          f"one type; unroll the loop that reads it (--unroll full: each member keeps its own "
                          f"type) or convert the model with --dtype f32", decl.span)
        counts = self.family_counts(name)
        parts = [self._member(decl, members, idx, kept=True, half=half) for idx in np.ndindex(*counts)]
        raw = np.stack([p.raw.reshape(p.shape[:-1] + (-1,)) for p in parts]).reshape(counts + parts[0].shape[:-1]
                                                                                     + (-1,))
        affine = None
        if parts[0].kind == AFFINE:  # each member's own scales and zero points, stacked as its integers are
            affine = tuple(_stacked([p.affine[i] for p in parts], counts) for i in (0, 1))
        return KeptBlocks(parts[0].kind, raw, counts + parts[0].shape, affine)

    def _half(self, decl: ir.VarDecl, info) -> bool:
        """A bf16/f16 matrix widened for this f32 declaration (`kept_blocks`' `half`)."""
        return self.widen_floats and info.has_data and info.widens_to(decl.dtype) and len(info.value_shape) == 2

    def _kept_kind(self, decl: ir.VarDecl, info, half: bool) -> str | None:
        """The GGML type a tensor read by `decl` is kept in (`kept_blocks`), AFFINE for stored
        integers with v2 QuantParams an f32 declaration reads (kept where their values stay
        exact: model/quant `affine_parts`), or None."""
        if info.ggml is not None:
            return info.ggml
        if self._affine(decl, info) is not None:
            return AFFINE
        return HALF_KINDS[info.value_dtype] if half and self._half(decl, info) else None

    @staticmethod
    def _affine(decl: ir.VarDecl, info):
        if info.quant is None or not info.has_data or decl.dtype == info.dtype or not info.binds_as(decl.dtype):
            return None
        return affine_parts(info.quant, tuple(info.shape))

    def _kept(self, tensor: str, info) -> KeptBlocks:
        """A tensor kept as GGML blocks, stored integers with their QuantParams (AFFINE), or a
        widened bf16/f16 matrix as its bytes (`_half`)."""
        if info.ggml is not None:
            return KeptBlocks(info.ggml, self.model.load_packed(tensor), tuple(info.value_shape))
        if info.quant is not None:
            return KeptBlocks(AFFINE, self.model.load(tensor), tuple(info.shape),
                              affine_parts(info.quant, tuple(info.shape)))
        values = self.model.load(tensor)
        return KeptBlocks(HALF_KINDS[info.value_dtype], values.view(np.uint8), tuple(info.value_shape))

    def release_host_values(self) -> None:
        """Drop the host copies of the values read so far, this graph's and the model reader's
        (`Model.drop_cache`): a compiled program holds its constants on the device; whatever is
        asked for later is read again."""
        self._cache.clear()
        self._families.clear()
        if self.model is not None:
            self.model.drop_cache()

    # ------------------------------------------------------------ loop bounds

    def loop_bound(self, value: ir.IndexValue) -> int | None:
        """A loop bound's static value: int literal, sizevar, constant scalar with a known value, or
        model metadata integer scalar; None when it is a runtime (dynamic/volatile/persistent) variable."""
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return int(value)
        name = str(value)
        if name in self.sizes:
            return int(self.sizes[name])
        decl = self.graph.var(name)
        temp = self.graph.temporaries.get(name)
        if decl is not None and decl.kind == ir.MemKind.CONSTANT and not decl.is_prefix_table:
            v = self.initial(name)
            assert v.size == 1, CHECKED  # checks/control.check_loop_bound: a scalar
            return _scalar_int(name, v.reshape(()), decl.dtype, decl.span)
        if decl is not None or temp is not None:
            return None
        if self.model is not None and name in self.model.metadata:
            meta = self.model.metadata[name]
            if meta.type in ("string", "bitset", "ndarray") or not (dt.get(meta.type).is_int or meta.type == "bool"):
                raise OiError(f"loop bound {name}: metadata {name} is {meta.type}, not an integer")
            return int(meta.value)
        raise OiError(f"loop bound {value} is invalid: unknown variable {value}")

    def missing_constants(self) -> list[ir.VarDecl]:
        """Constants that are neither a model tensor, a metadata key nor a prefix-table family (§0 item 11).
        Empty without a model."""
        if self.model is None:
            return []
        out = []
        for decl in self.graph.vars_of(ir.MemKind.CONSTANT):
            if decl.is_prefix_table:
                continue
            key = self.model_name(decl)
            if key not in self.model.tensors and key not in self.model.metadata:
                out.append(decl)
        return out


def _stacked(arrays: list, counts: tuple) -> np.ndarray:
    """Members' broadcastable parts (scales, zero points) stacked as a family [*counts, *common]."""
    common = np.broadcast_shapes(*(a.shape for a in arrays))
    return np.stack([np.broadcast_to(a, common) for a in arrays]).reshape(tuple(counts) + common)


def _load_as(model: Model, tensor: str, dtype: str, widen: bool = False) -> np.ndarray:
    """A model tensor's value for a declaration of `dtype` (`TensorInfo.binds_as`
    allowed it, `widen`: `widen_floats`): an i8/u8 tensor with v2 QuantParams read by an `f32` declaration is their affine
    reading (model/quant.dequantize, an oi2jax extension: docs/semantics.md); a widened bf16/f16
    tensor its f32 values (exact); otherwise `Model.load`."""
    info = model.tensors[tensor]
    if info.quant is not None and dtype != info.dtype:
        return quant_dequantize(info.quant, model.load(tensor))
    if widen and info.widens_to(dtype):
        return model.load(tensor).astype(np.float32)
    return model.load(tensor)


def _scalar_int(name: str, v: np.ndarray, dtype: str, span) -> int:
    d = dt.get(dtype)
    if d.is_float:
        f = float(np.asarray(v).astype(np.float64))
        if not np.isfinite(f):
            raise OiError(f"loop bound {name} is not finite", span)
        return int(f)  # truncate toward zero (§3.3)
    assert d.family != dt.TERNARY, CHECKED  # ternary types are packed: checks/control.check_loop_bound
    return int(v)


def _meta_as_tensor(decl: ir.VarDecl, meta: MetaValue, shape) -> np.ndarray:
    """A metadata entry read as a variable (§2.5): value checked against the declaration."""
    name = decl.name
    if meta.type == "string":
        raise OiError(f"metadata {name} is a string and cannot be read as a tensor "
                      f"(use it as an op attribute value)", decl.span)
    if meta.type == "bitset":
        bits = np.asarray(meta.value, bool).reshape(-1)
        if bits.size > 8:
            raise OiError(f"metadata {name}: bitset of {bits.size} bits cannot be read as a scalar "
                          f"(at most 8)", decl.span)
        value = np.asarray(sum(1 << i for i, b in enumerate(bits) if b), np.uint8)
        mtype = "bitset"
    elif meta.type == "ndarray":
        value, mtype = np.asarray(meta.value), meta.elem
    else:
        value, mtype = np.asarray(meta.value), meta.type
    if tuple(value.shape) != tuple(shape):
        raise OiError(f"model shape mismatch for {name}: model {_fmt_shape(value.shape)} (metadata), "
                      f"graph {_fmt_shape(shape)}", decl.span)
    if mtype == decl.dtype:
        return value.copy()
    # a value-preserving conversion (e.g. integer metadata written as u8 for an i32 constant)
    target = dt.get(decl.dtype)
    try:
        converted = _convert_exact(value, mtype, decl.dtype)
    except (ValueError, OverflowError, TypeError):
        converted = None
    if converted is None:
        raise OiError(f"model dtype mismatch for {name}: model {mtype} (metadata), graph {decl.dtype}", decl.span)
    return converted.astype(target.np_dtype)


def _convert_exact(value: np.ndarray, src: str, dst: str) -> np.ndarray | None:
    s, d = dt.get(src), dt.get(dst)
    if d.is_float:
        wide = value.astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):  # a value out of range is refused below, not warned
            if d.name == "f8":
                out = f8_encode(wide.astype(np.float32))
            elif d.name == "bf16":
                out = bf16_encode(wide.astype(np.float32))
            else:
                out = wide.astype(d.np_dtype)
        back = out.astype(np.float64)  # exact: every float dtype's values are f64 values
        if not s.is_float:  # integers compared exactly, never after rounding both sides through f64
            ints = value.astype(np.int64) if value.dtype != np.uint64 else value  # (i64 2^53 + 1: no f64)
            return out if np.all(ints_exact(ints, back) & (back == ints.astype(np.float64))) else None
        same = (back == wide) | (np.isnan(back) & np.isnan(wide))
        return out if np.all(same) else None
    if s.is_float:
        return None
    ints = value.astype(np.int64) if value.dtype != np.uint64 else value
    if d.name == "bool":
        return ints.astype(bool) if np.all((ints == 0) | (ints == 1)) else None
    if d.name == "t1":
        return ints.astype(np.int8) if np.all((ints == -1) | (ints == 1)) else None
    if value.size and (int(ints.min()) < d.min or int(ints.max()) > d.max):
        return None
    return ints.astype(d.np_dtype)


def _check_tensor(decl: ir.VarDecl, info, shape, label: str | None = None, widen: bool = False) -> None:
    label = label or decl.name  # GGML blocks bind as their f32 value, QuantParams' integers as f32 too
    if not info.binds_as(decl.dtype, widen):  # the checker's rule (checks/decls.check_bound), for a graph bound unchecked
        raise OiError(model_dtype_mismatch(label, info, decl.dtype), decl.span)
    if tuple(info.value_shape) != tuple(shape):
        raise OiError(f"model shape mismatch for {label}: model {_fmt_shape(info.value_shape)}, graph "
                      f"{_fmt_shape(shape)}", decl.span)


def bind(graph, model: Model | None = None, sizes: dict | None = None, *, zero_missing_inputs: bool = False,
         no_model: str | None = None, widen_floats: bool = False) -> BoundGraph:
    """Bind `graph` (a `check.CheckedGraph`, or a bare `ir.Graph` for the model-binding queries
    alone: programs need the checked one) to `model` with size overrides; OiError listing every
    binding problem, each located at its declaration. Without a model, a constant with no `@init`
    has no value: an error naming it unless `zero_missing_inputs` asks for OpenInfer's zeros.
    `no_model` says why there is no model (pipeline.ModelChoice: where the default was looked for),
    in the messages that need one."""
    checked = None
    if not isinstance(graph, ir.Graph):
        checked, graph = graph, graph.graph
    all_sizes: dict[str, int] = dict(model.sizevars) if model is not None else {}
    for k, v in (sizes or {}).items():
        all_sizes[k] = int(v)
    problems: list[Diagnostic] = []
    shapes: dict[str, tuple[int, ...]] = {}

    def resolve(name, dims, span):
        try:
            shapes[name] = tuple(d.resolve(all_sizes) for d in dims)
        except KeyError as exc:
            problems.append(Diagnostic(messages.unknown_size(name, exc.args[0], model, no_model, all_sizes),
                                       span))

    for decl in graph.vars:
        resolve(decl.name, decl.dims, decl.span)
        for index, size in decl.fixed:
            if isinstance(size, str) and size not in all_sizes:
                problems.append(Diagnostic(messages.unknown_fixed_size(index, size, decl.name, all_sizes),
                                           decl.attr_span("fixed")))
    for block in graph.blocks:
        for node in block.walk():
            if isinstance(node, ir.Op):
                sig = checked.op_sigs.get(node.index) if checked is not None else None
                spec = getattr(sig, "op", None)
                for attr in node.attrs:
                    names = list(int_list_names(attr))
                    a = spec.attrs.get(spec.aliases.get(attr.name, attr.name)) if spec is not None else None
                    if setting_size_name(graph, a, attr) is not None:
                        names.append(attr.value.value)  # `top_k(x, k=K)`: a size name
                    for size in names:
                        if size not in all_sizes:
                            problems.append(Diagnostic(messages.op_unknown_size(node.op, attr.name, size, all_sizes),
                                                       attr.span))
    for name, node in graph.temporaries.items():
        if name not in shapes and graph.var(name) is None:
            resolve(name, node.dims, node.span)

    if model is not None:
        for decl in graph.vars:
            if decl.name not in shapes:
                continue
            try:
                _bind_decl(decl, model, shapes[decl.name], widen_floats)
            except OiError as exc:
                problems.extend(exc.diagnostics)
    elif not zero_missing_inputs:
        problems.extend(_valueless_constants(graph, shapes, no_model or "no model given"))
    if problems:
        raise OiError(sorted(problems, key=lambda d: (d.span.line, d.span.col) if d.span else (0, 0)),
                      source=graph.source or None)
    return BoundGraph(graph, model, all_sizes, shapes, checked, zero_missing_inputs, widen_floats)


def _valueless_constants(graph: ir.Graph, shapes, no_model: str) -> list[Diagnostic]:
    """Without a model, each constant that has no `@init` (and a known shape) has no value:
    OpenInfer would read it as zeros without a word; oi2jax says so, at its declaration, unless
    zeros are asked for (docs/semantics.md). With a model, a constant it lacks is the checker's
    error (§0 item 11)."""
    return [Diagnostic(f"constant {decl.name} has no value ({no_model}, and no @init); give a model, or ask "
                       f"for OpenInfer's zeros with --zero-missing-inputs (zero_missing_inputs=True)", decl.span)
            for decl in graph.vars_of(ir.MemKind.CONSTANT)
            if not decl.is_prefix_table and decl.init is None and decl.name in shapes]


def _bind_decl(decl: ir.VarDecl, model: Model, shape, widen: bool = False) -> None:
    if decl.is_prefix_table:
        regex, _ = pattern_regex(decl)
        for tensor, info in model.tensors.items():
            m = regex.match(tensor)
            if m:
                idx = ", ".join(m.group(p) for p in decl.index_params if p in regex.groupindex)
                _check_tensor(decl, info, shape, f"{decl.name}[{idx}] ({tensor})", widen)
        return
    key = resolve_alias(model, decl.ref if decl.ref is not None else decl.name)
    if decl.ref is not None and key not in model.tensors:
        raise OiError(f"model variable not found: {key}", decl.attr_span("ref"))
    if decl.is_table:
        return
    info = model.tensors.get(key)
    if info is not None:
        _check_tensor(decl, info, shape, widen=widen)
        return
    meta = model.metadata.get(key)
    if meta is not None and decl.kind in (ir.MemKind.CONSTANT, ir.MemKind.VOLATILE):
        _meta_as_tensor(decl, meta, shape)  # raises on strings, too-wide bitsets, shape/dtype mismatch
