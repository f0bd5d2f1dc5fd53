"""The graph's names that the checker and the binder both match, defined once below both: the
size names a graph may use (`unknown_sizes`: a typo such as `b=8` for `B`) and the model names of
a prefix table's members (`pattern_regex`: the checker's canonical-index rule and `bind`'s lookup),
and the words that are never names (`RUST_KEYWORDS`: the parser's and the op registry's rule)."""
from __future__ import annotations

import re

from . import ir
from .diagnostics import suggest

# Rust keywords (strict + reserved): never identifiers (SPEC §1.2); `_` is not one either. One
# definition: the parser refuses them as names (grammar/build.py), the op registry as op names.
RUST_KEYWORDS = frozenset("""
as break const continue crate else enum extern false fn for if impl in let loop match mod move mut pub
ref return self Self static struct super trait true type unsafe use where while async await dyn
abstract become box do final macro override priv typeof unsized virtual yield try _
""".split())

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")  # `{l}` in a prefix table's @pattern


def pattern_regex(decl: ir.VarDecl) -> tuple[re.Pattern, list[str]]:
    """A regex matching the model names of a prefix table's members, and the parameter of each group."""
    parts, groups, pos = [], [], 0
    seen: dict[str, int] = {}
    for m in PLACEHOLDER.finditer(decl.pattern or ""):
        parts.append(re.escape(decl.pattern[pos:m.start()]))
        name = m.group(1)
        if name in seen:
            parts.append(f"(?P={name})")
        else:
            seen[name] = len(groups)
            groups.append(name)
            parts.append(f"(?P<{name}>0|[1-9][0-9]*)")
        pos = m.end()
    parts.append(re.escape((decl.pattern or "")[pos:]))
    return re.compile("".join(parts) + r"\Z"), groups


def member_name(decl: ir.VarDecl, values) -> str:
    """The model tensor name of a prefix table's member `values` (one per index parameter): each
    `{param}` of the pattern replaced by the value of the parameter of that NAME (SPEC §2.4)."""
    bound = {p: str(int(v)) for p, v in zip(decl.index_params, values)}
    return PLACEHOLDER.sub(lambda m: bound.get(m.group(1), m.group(0)), decl.pattern or "")


def family_members(decl: ir.VarDecl, tensor_names) -> dict[tuple[int, ...], str]:
    """Index values (one per index parameter, in declaration order) -> model tensor name, for
    every name matching the prefix table's pattern (the checker's and bind's one lookup)."""
    regex, groups = pattern_regex(decl)
    members = {}
    if not all(p in groups for p in decl.index_params):
        return members  # a parameter the pattern does not use: the checker's error, bind's too
    for tensor in tensor_names:
        m = regex.match(tensor)
        if m:
            members[tuple(int(m.group(p)) for p in decl.index_params)] = tensor
    return members


def family_hole(members: dict[tuple[int, ...], str]) -> tuple[int, ...] | None:
    """The first grid position, in index order, that a family's members leave empty (the grid:
    0 .. the largest index present, per parameter), or None. Looks at no more positions than
    there are members, plus one: a grid larger than its members has a hole among those."""
    if not members:
        return None
    rank = len(next(iter(members)))
    counts = [max(k[j] for k in members) + 1 for j in range(rank)]
    idx = [0] * rank
    for _ in range(len(members) + 1):
        if tuple(idx) not in members:
            return tuple(idx)
        for j in reversed(range(rank)):  # the next position in index order (the last index fastest)
            idx[j] += 1
            if idx[j] < counts[j]:
                break
            idx[j] = 0
        else:
            return None  # the whole grid seen: no hole
    return None


def size_names(graph: ir.Graph) -> set[str]:
    """Every name the graph may use as a size: identifiers in declared dims, `@fixed` sizes, loop
    bounds, op int-list attributes, op settings naming no variable (`k=K`) and cache indices (a
    superset: some of those are variables)."""
    names: set[str] = set()
    for decl in graph.vars:
        for d in decl.dims:
            names.update(d.names)
        names.update(v for _, v in decl.fixed if isinstance(v, str))
    for block in graph.blocks:
        for node in block.walk():
            if isinstance(node, ir.Loop):
                names.update(v for v in (node.start, node.end) if isinstance(v, str))
            elif isinstance(node, ir.Op):
                names.update(int_list_names(node))
                # a shape-fixing int setting naming a size (`top_k(x, k=K)`); a variable's name is not one
                # (a superset: every setting naming no variable; `setting_size_name` needs the op's declaration)
                names.update(a.value.value for a in node.attrs if a.value.kind == "var"
                             and not is_variable(graph, a.value.value))
            for ref in _refs(node):  # prefix-table indices (`W[L]`) and cache indices (`K[T]`, `K[0..T]`)
                for pos in ref.indices or ():
                    parts = (pos.start, pos.end) if isinstance(pos, ir.Slice) else \
                        (pos.value,) if isinstance(pos, ir.Single) else (pos,)
                    names.update(v for v in parts if isinstance(v, str))
    return names


def _refs(node):
    """The indexed references of a node: op inputs, transfer ends, cache accesses."""
    if isinstance(node, ir.Op):
        return node.refs
    if isinstance(node, ir.Transfer):
        return [node.src, node.dst]
    if isinstance(node, ir.CacheRead):
        return [node.src]
    if isinstance(node, ir.CacheWrite):
        return [node.dst]
    if isinstance(node, ir.CacheReset):
        return [node.target]
    return []


def int_list_names(where: "ir.Op | ir.Attr"):
    """The size names in an op's int-list attributes, or in one attribute (`perm=[0, -T]`: T)."""
    for attr in (where.attrs if isinstance(where, ir.Op) else (where,)):
        if attr.value.kind == "int_list":
            yield from (v.lstrip("-") for v in attr.value.value if isinstance(v, str))


def is_variable(graph: ir.Graph, name: str) -> bool:
    """Whether `name` is a variable of the graph (declared, or a block's `assign` temporary)."""
    return graph.var(name) is not None or name in graph.temporaries


def setting_size_name(graph: ir.Graph, aspec, attr: "ir.Attr") -> str | None:
    """THE rule for a size named by a shape-fixing int setting (`top_k(x, k=K)`): the name, when
    the setting (`aspec`, its op's declaration) is a static int given as a name that is no variable
    of the graph; else None (a literal, a variable, another kind of setting)."""
    if aspec is None or not (aspec.static and aspec.kind == "int") or attr.value.kind != "var":
        return None
    return None if is_variable(graph, attr.value.value) else attr.value.value


def unknown_sizes(graph: ir.Graph, model, sizes: dict | None) -> list[str]:
    """A message for each given size name that neither the graph nor the model knows (a typo
    such as `b=8` for `B` would otherwise be silently ignored)."""
    known = size_names(graph) | set(getattr(model, "sizevars", {}) or {})
    out = []
    for name in sorted(set(sizes or {}) - known):
        listing = ", ".join(sorted(known)) or "(none)"
        out.append(f"unknown size {name}{suggest(name, known)}: the graph and model sizes are {listing}")
    return out


ALIAS_PREFIX = "alias."


def resolve_alias(model, key: str) -> str:
    """`key`, or the tensor it is an alias of: a model without tensor `key` but with the string
    metadata `alias.KEY` = "TENSOR" (TENSOR one of its tensors) stores one copy of a tensor read
    under two names (convert-hf's tied `lm_head.weight`, docs/models.md). Both names then load
    the same host array, which the runtime places once. The checker and bind both resolve here."""
    if key in model.tensors:
        return key
    alias = model.metadata.get(ALIAS_PREFIX + key)
    if alias is not None and alias.type == "string" and alias.value in model.tensors:
        return alias.value
    return key
