"""IR <-> OpenInfer graph JSON (SPEC §8.1).

`to_json(graph)` gives the runtime graph's serde shape; node uuids are deterministic
(uuid5 of the node index). `from_json(data, path)` rebuilds the IR; its spans name JSON pointers
(`path#/blocks/entry/nodes/1`), so a diagnostic says where in the file.
Round trip .oi -> JSON -> IR equals the parsed IR up to spans, except where JSON has no
room for the distinction: an `@init` written as an int on a bool variable comes back as a
bool; f16/bf16/f8 `@init` values come back as the stored (rounded) value; `cache.increment 1 x`
comes back as `cache.increment x`; a literal op input comes back with its value and dtype, written plainly
(`0x10` as `16`, `2.0f32` as `2.0` with dtype f32). oi2jax extensions: `return a, b;` is
`{"Return": {"vars": [...]}}`; a literal op input is `{"Literal": {"Double": 0.125}, "dtype": null}`.
"""
from __future__ import annotations

import math
import re
import uuid

import numpy as np

from . import dtypes, host_numerics, ir

_NS = uuid.UUID("6f1d2c1e-0b6a-4c1e-9a57-0a1f2e3d4c5b")
_DT_JSON = {"bool": "Bool", "bitset": "Bitset"}
_KIND_JSON = {k: k.value.capitalize() for k in ir.MemKind}


def _dt(name: str) -> str:
    return _DT_JSON.get(name, name.upper())


def _dt_back(name: str) -> str:
    return name.lower()


def node_uuid(index: int) -> str:
    return str(uuid.uuid5(_NS, str(index)))


def _ref(r: ir.VarRef) -> str:
    return r.name if r.indices is None else f"{r.name}[{','.join(str(i) for i in r.indices)}]"


def _input(r) -> str | dict:
    """An op input: a variable reference's text, or (oi2jax extension) a literal input as
    `{"Literal": <setting value>, "dtype": <its suffix's dtype or null>}`."""
    if isinstance(r, ir.LiteralInput):
        return {"Literal": _attr(r.value), "dtype": None if r.dtype is None else _dt(r.dtype)}
    return _ref(r)


def _val(v) -> dict:
    return {"Lit": v} if isinstance(v, int) else {"Ident": v}


def _access(a: ir.CacheAccess) -> dict:
    idx = []
    for e in a.indices:
        if isinstance(e, ir.Single):
            idx.append({"Single": _val(e.value)})
        else:
            idx.append({"Slice": {"start": None if e.start is None else _val(e.start),
                                  "end": None if e.end is None else _val(e.end)}})
    return {"base": a.base, "indices": idx, "bracketed": a.bracketed}


def _attr(lit: ir.Literal) -> dict:
    return {"float": lambda v: {"Double": v}, "int": lambda v: {"Int": v}, "bool": lambda v: {"Bool": v},
            "str": lambda v: {"Str": v}, "int_list": lambda v: {"IntList": list(v)}, "var": lambda v: {"Var": v},
            "dtype": lambda v: {"DType": _dt(v)},  # acc=i32 (1fc5207) stays a DType (D11)
            "dtype_list": lambda v: {"DTypeList": [_dt(d) for d in v]}}[lit.kind](lit.value)


def scalar_to_json(dtype: str, lit: ir.Literal | None):
    if lit is None:
        return None
    v = lit.value
    name = _dt(dtype)
    if dtype in ("f16", "bf16", "f8"):  # OpenInfer stores the rounded bits (a huge literal becomes inf)
        with np.errstate(over="ignore"):
            if dtype == "f16":
                return {name: {"bits": int(np.float16(v).view(np.uint16))}}
            enc = host_numerics.bf16_encode(np.float32(v)) if dtype == "bf16" else host_numerics.f8_encode_bits(np.float32(v))
        return {name: {"bits": int(np.asarray(enc).reshape(-1).view(np.uint16 if dtype == "bf16" else np.uint8)[0])}}
    dt = dtypes.get(dtype)
    if dtype == "t1":  # its storage pattern (SPEC §5): -1 is bit 0, +1 is bit 1 (not two's complement)
        return {name: {"bits": int(int(v) > 0)}}
    if dt.packed or dtype == "bitset":
        return {name: {"bits": int(v) & ((1 << dt.bits) - 1)}}
    if dtype == "bool":
        return {name: bool(v)}
    return {name: float(v) if dt.is_float else int(v)}


class _ToJson(ir.NodeVisitor):
    """A node's serde `kind` (its variant is named after the IR node type: `_FROM_JSON` reads it)."""

    def visit_Barrier(self, n):
        return "Barrier"

    def visit_Return(self, n: ir.Return):
        return {"Return": {"vars": list(n.vars)}} if n.vars else "Return"

    def visit_Assign(self, n: ir.Assign):
        return {"Assign": {"name": n.name, "dtype": _dt(n.dtype), "dims": [str(d) for d in n.dims]}}

    def visit_Op(self, n: ir.Op):
        return {"Op": {"op": n.op, "attrs": {"items": [{"name": a.name, "value": _attr(a.value)} for a in n.attrs]},
                       "inputs": [_input(r) for r in n.inputs], "output": n.output}}

    def visit_Branch(self, n: ir.Branch):
        return {"Branch": {"cond": n.cond, "then_block": n.then_block, "else_block": n.else_block}}

    def visit_Dep(self, n: ir.Dep):
        return {"Dep": {"after": n.after, "before": n.before}}

    def visit_Transfer(self, n: ir.Transfer):
        return {"Transfer": {"src": _ref(n.src), "dst": _ref(n.dst)}}

    def visit_CacheRead(self, n: ir.CacheRead):
        return {"CacheRead": {"src": _access(n.src), "dst": _ref(n.dst)}}

    def visit_CacheWrite(self, n: ir.CacheWrite):
        return {"CacheWrite": {"src": _ref(n.src), "dst": _access(n.dst)}}

    def visit_CacheIncrement(self, n):
        return {type(n).__name__: {"target": n.target, "amount": n.amount}}

    visit_CacheDecrement = visit_CacheIncrement

    def visit_CacheReset(self, n: ir.CacheReset):
        return {"CacheReset": {"target": _access(n.target)}}

    def visit_Yield(self, n):
        return {type(n).__name__: {"vars": list(n.vars)}}

    visit_Await = visit_Yield

    def visit_Loop(self, n: ir.Loop):
        return {"Loop": {"name": n.name, "index": n.var, "start": str(n.start), "end": str(n.end),
                         "body": [_node(b) for b in n.body]}}


_TO_JSON = _ToJson()


def _node(n: ir.Node) -> dict:
    return {"index": n.index, "uuid": node_uuid(n.index), "kind": _TO_JSON.visit(n)}


def to_json(graph: ir.Graph) -> dict:
    blocks: dict = {}
    count = 0
    for b in graph.blocks:
        entry = blocks.setdefault(b.name, {"name": b.name, "nodes": []})
        entry["nodes"] += [_node(n) for n in b.nodes]
        count += sum(1 for _ in b.walk())
    vars_ = {}
    for d in graph.vars:
        vars_[d.name] = {"name": d.name, "ref_name": d.ref, "pattern": d.pattern,
                         "table_indices": list(d.index_params), "table": d.table, "auto_dim": list(d.auto_dim),
                         "fixed": [[k, v] for k, v in d.fixed], "dtype": _dt(d.dtype),
                         "dims": [str(x) for x in d.dims], "kind": _KIND_JSON[d.kind],
                         "init": scalar_to_json(d.dtype, d.init)}
    return {"blocks": blocks, "next_index": count, "vars": vars_}


# ---------------------------------------------------------------- JSON -> IR

def _atom(s: str):
    return int(s) if s.lstrip("-").isdigit() else s


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _name(x, what: str) -> str:
    """A name where the DSL has one (a size, an index variable): `"4"` is not read as one."""
    if not isinstance(x, str) or not _NAME.fullmatch(x):
        raise ValueError(f"{what} must be a name, got {x!r}")
    return x


def _whole(x, what: str) -> int:
    """A JSON integer, as it is: 4.5 or "2" or true is not silently made one."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise ValueError(f"{what} must be an integer, got {x!r}")
    return x


def _dim(s: str) -> ir.Dim:
    if not isinstance(s, str) or not s.strip():
        raise ValueError(f"a dimension must be a size (an integer or a size name, as text), got {s!r}")
    return ir.Dim(tuple(_atom(a.strip()) for a in s.split("*")))


_MEMBER_REF = re.compile(r"([^\[\]]*)\[([^\[\]]*)\]")  # `W[l]`, `QKV[i, j]`: a prefix-table member


def _ref_back(s: str, span) -> ir.VarRef:
    if "[" not in s:
        return ir.VarRef(s, span)
    m = _MEMBER_REF.fullmatch(s)
    if m is None:
        raise ValueError(f"variable reference {s!r}: expected NAME or NAME[INDEX, ...]")
    return ir.VarRef(m[1], span, tuple(_atom(x.strip()) for x in m[2].split(",") if x.strip()))


def _input_back(x, span):
    if not isinstance(x, dict):
        return _ref_back(x, span)
    lit = _attr_back(x["Literal"])
    if lit.kind not in ("float", "int", "bool"):
        raise ValueError(f"literal op input {x['Literal']!r}: expected a Double, Int or Bool value")
    dtype = None if x.get("dtype") is None else _dt_back(x["dtype"])
    if dtype is not None and not dtypes.is_dtype(dtype):
        raise ValueError(f"literal op input dtype {x['dtype']!r} is not a dtype")
    if dtype is not None:  # what the DSL's suffixes write: a float's suffix on a float, an integer's on an integer
        floating = dtypes.get(dtype).is_float
        if not ((lit.kind == "float" and floating and math.isfinite(lit.value)) or
                (lit.kind == "int" and not floating and dtype != "bool")):
            raise ValueError(f"literal op input {x['Literal']!r} cannot have dtype {x['dtype']!r} (a suffix "
                             f"writes a finite float with a float dtype, an integer with an integer dtype)")
    return ir.LiteralInput(lit, span, dtype)


def _val_back(v):
    if v is None:
        return None
    if "Lit" in v:
        return _whole(v["Lit"], "a literal index")
    return _name(v["Ident"], "an index variable")


def _access_back(a: dict, span) -> ir.CacheAccess:
    idx = []
    for e in a["indices"]:
        if "Single" in e:
            idx.append(ir.Single(_val_back(e["Single"])))
        else:
            idx.append(ir.Slice(_val_back(e["Slice"]["start"]), _val_back(e["Slice"]["end"])))
    return ir.CacheAccess(a["base"], span, tuple(idx), a["bracketed"])


def _attr_back(v: dict) -> ir.Literal:
    (k, x), = v.items()
    kind = {"Float": "float", "Double": "float", "Int": "int", "UInt": "int", "Bool": "bool", "Str": "str",
            "IntList": "int_list", "Var": "var", "DType": "dtype", "DTypeList": "dtype_list"}[k]
    if kind == "int_list":
        if not isinstance(x, list):
            raise ValueError(f"an IntList setting must be a list of integers, got {x!r}")
        x = tuple(_name(i, "an IntList item") if isinstance(i, str) else _whole(i, "an IntList item")
                  for i in x)  # an integer or a size's name
    elif kind == "dtype_list":
        if not isinstance(x, list) or not all(isinstance(d, str) for d in x):
            raise ValueError(f"a DTypeList setting must be a list of dtype names, got {x!r}")
        x = tuple(_dt_back(d) for d in x)
    elif kind == "dtype":
        if not isinstance(x, str):
            raise ValueError(f"a DType setting must be a dtype name, got {x!r}")
        x = _dt_back(x)
    elif kind == "float":
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ValueError(f"a {k} value must be a number, got {x!r}")
        x = float(x)
    elif kind == "int":
        x = _whole(x, f"an {k} value")
    elif kind == "bool" and not isinstance(x, bool):
        raise ValueError(f"a Bool value must be true or false, got {x!r}")
    elif kind == "str" and not isinstance(x, str):
        raise ValueError(f"a Str value must be a string, got {x!r}")
    elif kind == "var":
        x = _name(x, "a Var setting")
    return ir.Literal(kind, x)


def scalar_from_json(dtype: str, v) -> ir.Literal | None:
    if v is None:
        return None
    (_, x), = v.items()
    dt = dtypes.get(dtype)
    if isinstance(x, dict):
        bits = _whole(x["bits"], f"the bits of a {dtype} value")
        if not 0 <= bits < 1 << dt.bits:
            raise ValueError(f"the bits of a {dtype} value must be 0..{(1 << dt.bits) - 1}, got {bits}")
        if dtype == "f16":
            return ir.Literal("float", float(np.uint16(bits).view(np.float16)))
        if dtype in ("bf16", "f8"):
            arr = np.array([bits], np.uint16 if dtype == "bf16" else np.uint8).view(dt.np_dtype)
            return ir.Literal("float", float(arr[0]))
        if dtype == "t1":
            return ir.Literal("int", 1 if bits else -1)
        if dt.is_signed and bits >= 1 << (dt.bits - 1):
            bits -= 1 << dt.bits
        return ir.Literal("int", bits)
    if dtype == "bool" or isinstance(x, bool):  # as scalar_to_json writes them: a bool for a bool
        if dtype != "bool" or not isinstance(x, bool):
            raise ValueError(f"an @init of a {dtype} variable cannot be {x!r}")
        return ir.Literal("bool", x)
    if dt.is_float:
        if not isinstance(x, (int, float)):
            raise ValueError(f"an @init of a {dtype} variable must be a number, got {x!r}")
        return ir.Literal("float", float(x))
    return ir.Literal("int", _whole(x, f"an @init of a {dtype} variable"))


def _step_word(cls) -> str:
    return {"CacheIncrement": "cache.increment", "CacheDecrement": "cache.decrement"}.get(cls.__name__, cls.__name__)


def _amount(cls):
    def back(i, span, v):
        amount = _whole(v["amount"], f"{_step_word(cls)} amount")
        return cls(index=i, span=span, target=v["target"], amount=amount, explicit_amount=amount != 1)
    return back


_FROM_JSON = {  # serde variant (= the IR node type's name) -> (index, span, fields) -> node
    "Barrier": lambda i, span, v: ir.Barrier(index=i, span=span),
    "Return": lambda i, span, v: ir.Return(index=i, span=span, vars=tuple(v["vars"]) if v else ()),
    "Assign": lambda i, span, v: ir.Assign(index=i, span=span, name=v["name"], dtype=_dt_back(v["dtype"]),
                                           dims=tuple(_dim(x) for x in v["dims"])),
    "Op": lambda i, span, v: ir.Op(
        index=i, span=span, op=_name(v["op"], "an op name"), inputs=tuple(_input_back(x, span) for x in v["inputs"]),
        attrs=tuple(ir.Attr(_name(a["name"], "a setting's name"), _attr_back(a["value"]), span)
                    for a in v["attrs"]["items"]),
        output=v["output"], output_span=span),
    "Branch": lambda i, span, v: ir.Branch(index=i, span=span, cond=v["cond"], then_block=v["then_block"],
                                           else_block=v["else_block"]),
    "Dep": lambda i, span, v: ir.Dep(index=i, span=span, after=v["after"], before=v["before"]),
    "Transfer": lambda i, span, v: ir.Transfer(index=i, span=span, src=_ref_back(v["src"], span),
                                               dst=_ref_back(v["dst"], span)),
    "CacheRead": lambda i, span, v: ir.CacheRead(index=i, span=span, src=_access_back(v["src"], span),
                                                 dst=_ref_back(v["dst"], span)),
    "CacheWrite": lambda i, span, v: ir.CacheWrite(index=i, span=span, src=_ref_back(v["src"], span),
                                                   dst=_access_back(v["dst"], span)),
    "CacheIncrement": _amount(ir.CacheIncrement),
    "CacheDecrement": _amount(ir.CacheDecrement),
    "CacheReset": lambda i, span, v: ir.CacheReset(index=i, span=span, target=_access_back(v["target"], span)),
    "Yield": lambda i, span, v: ir.Yield(index=i, span=span, vars=tuple(v["vars"])),
    "Await": lambda i, span, v: ir.Await(index=i, span=span, vars=tuple(v["vars"])),
    "Loop": lambda i, span, v: ir.Loop(index=i, span=span, name=v["name"], var=v["index"], start=_atom(v["start"]),
                                       end=_atom(v["end"]), body=tuple(_node_back(b, _at(span, f"/kind/Loop/body/{j}"))
                                                                      for j, b in enumerate(v["body"]))),
}


def _at(span: ir.Span, *parts: str) -> ir.Span:
    """`span` with its JSON pointer extended (each part a "/"-separated path of JSON keys; a
    name's own "~" and "/" are escaped as RFC 6901 says, by `_key`)."""
    return ir.Span(span.path, 0, 0, span.pointer + "".join(parts))


def _key(name) -> str:
    return "/" + str(name).replace("~", "~0").replace("/", "~1")


def _node_back(d: dict, span) -> ir.Node:
    kind = d["kind"]
    if kind in ("Barrier", "Return"):  # the unit variants
        k, v = kind, None
    else:
        (k, v), = kind.items()
    back = _FROM_JSON.get(k)
    if back is None:
        raise ValueError(f"unknown node kind {k}")
    return back(_whole(d["index"], "a node index"), span, v)


def from_json(data: dict, path: str = "<json>") -> ir.Graph:
    root = ir.Span(path, 0, 0)
    vars_ = []
    for key, v in data["vars"].items():
        span = _at(root, "/vars", _key(key))
        dtype = _dt_back(v["dtype"])
        vars_.append(ir.VarDecl(
            name=v["name"], kind=ir.MemKind(v["kind"].lower()), dtype=dtype, dims=tuple(_dim(x) for x in v["dims"]),
            span=span, init=scalar_from_json(dtype, v.get("init")), ref=v.get("ref_name"), pattern=v.get("pattern"),
            index_params=tuple(v.get("table_indices", ())), table=bool(v.get("table")),
            auto_dim=tuple(v.get("auto_dim", ())), fixed=tuple((k, _name(n, f"{v['name']}: @fixed({k})") if isinstance(n, str) else _whole(n, f"{v['name']}: @fixed({k})"))
                         for k, n in v.get("fixed", ()))))
    blocks = [ir.Block(b["name"], tuple(_node_back(n, _at(root, "/blocks", _key(key), f"/nodes/{j}"))
                                        for j, n in enumerate(b["nodes"])), _at(root, "/blocks", _key(key)))
              for key, b in data["blocks"].items()]
    seen: set[int] = set()
    for block in blocks:
        for node in block.walk():
            if node.index in seen:  # the node's id (ir.Node.index): one per graph
                raise ValueError(f"node index {node.index} appears twice")
            seen.add(node.index)
    return ir.Graph(tuple(vars_), tuple(blocks), path=path)
