"""Runtime-shaped values (SPEC.md §0 item 12, revised): reads of `@auto_dim` tensors.

`cache.read M[...] >> dst` gives `dst` M's current shape, and an op on such a value gives its
output that shape too (`phases.runtime_shaped`, the one definition). These rules refuse, with a
location naming the op (or node) and the variable, every use that cannot take a shape known only
at run time."""
from __future__ import annotations

from .. import ir
from ..ir import MemKind
from ..phases import node_reads, runtime_shaped


class RuntimeShapeRules:
    def check_runtime_shapes(self):
        shaped = self.shaped = runtime_shaped(self.g)  # computed once: the CheckedGraph carries it
        if not shaped:
            return
        first_write: dict[str, ir.Node] = {}
        sources: dict[str, set] = {}  # every @auto_dim tensor a variable's shape comes from
        for b in self.g.blocks:
            for node in b.walk():
                if isinstance(node, ir.CacheRead) and node.dst.name in shaped:
                    first_write.setdefault(node.dst.name, node)
                    decl = self.decls.get(node.src.base)
                    if decl is not None and decl.is_auto_dim:
                        sources.setdefault(node.dst.name, set()).add(decl.name)
                elif isinstance(node, ir.Op) and node.output in shaped:
                    first_write.setdefault(node.output, node)
                    sources.setdefault(node.output, set()).update(
                        shaped[r.name] for r in node.refs if r.indices is None and r.name in shaped)
        for v, src in shaped.items():
            node = first_write.get(v)
            span = node.span if node is not None else None
            what = f"{v} takes the current shape of @auto_dim tensor {src}"
            decl = self.decls.get(v)
            if decl is not None and decl.kind != MemKind.VOLATILE:
                self.error(f"{what}: it must be a volatile variable or a temporary ({v} is {decl.kind.value})", span)
                continue
            dims = decl.dims if decl is not None else self.temps[v].dims if v in self.temps else None
            base = self.decls[src].dims if src in self.decls else None
            if dims is not None and base is not None and len(dims) != len(base):
                self.error(f"{what}: it needs {len(base)} dimensions, like {src} (it is declared with "
                           f"{len(dims)})", span)
            for other in sorted(sources.get(v, set()) - {src}):
                self.error(f"{v} takes the current shapes of two @auto_dim tensors ({src} and {other}); "
                           f"use one variable per tensor", span)
        for b in self.g.blocks:
            for node in b.walk():
                self._runtime_shape_uses(node, shaped)

    def _runtime_shape_uses(self, node, shaped: dict[str, str]):
        def named(v):
            return f"{v} has the current shape of @auto_dim tensor {shaped[v]}"

        if isinstance(node, ir.Op):
            moving = [r.name for r in node.refs if r.indices is None and r.name in shaped]
            for attr in node.attrs:
                if attr.value.kind == "var" and attr.value.value in shaped:
                    self.error(f"op {node.op}: setting {attr.name} must be a scalar; {named(attr.value.value)}",
                               attr.span)
            if not moving:
                return
            spec = self.registry.get(node.op)
            if spec is None or not spec.elementwise:
                self.error(f"op {node.op} cannot take a runtime-shaped operand: {named(moving[0])}", node.span)
                return
            for r in node.refs:
                if r.name in shaped or r.name in moving:
                    continue
                dims = self.decls[r.name].dims if r.name in self.decls else \
                    self.temps[r.name].dims if r.name in self.temps else None
                if dims:  # a fixed-shape tensor beside a runtime-shaped one
                    self.error(f"op {node.op}: {r.name} has the fixed shape [{', '.join(map(str, dims))}] but "
                               f"{named(moving[0])}; only scalars can be combined with it", r.span)
            return
        if isinstance(node, ir.CacheWrite) and node.src.name in shaped:
            target = self.decls.get(node.dst.base)
            if target is None or not target.is_auto_dim:
                self.error(f"cache.write {node.src.name} >> {node.dst.base}: {named(node.src.name)}; only an "
                           f"@auto_dim tensor can take it", node.span)
            bad = (node_reads(node) - {node.src.name}) & shaped.keys()
        elif isinstance(node, ir.Return):
            return
        else:
            bad = node_reads(node) & shaped.keys()
        for v in sorted(bad):
            word = type(node).__name__.lower().replace("cache", "cache.")
            self.error(f"{v} cannot be used in {word}: {named(v)} (only shape-preserving ops, cache.write to an "
                       f"@auto_dim tensor and return take it)", node.span)
