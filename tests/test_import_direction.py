"""Issue 33: the layers flow one way, text -> IR -> checked -> bound -> lowered -> runtime, and the
import statements say so. Every import of an oi2jax module (at module level, inside a function,
under TYPE_CHECKING: all of them, read with `ast`) goes to a layer at or below the importer's,
and never to a sibling the table below rules out. docs/architecture.md draws the same picture.

Layers, lowest first (a module may import its own layer and every lower one):

    0 ir           ir.py: the frozen IR, imports nothing of oi2jax
    1 foundation   diagnostics, dtypes, host_numerics, messages, naming, phases (IR analyses), limits,
                   values, run_rules, npz, progress, protocol (CompileOptions, the Program protocol),
                   xla_cache, _signals
    2 text         grammar/ (text <-> IR), graph_json, trace, cfg
    3 ops          ops/: the op registry every stage shares (typing, kernels, references); quantized/:
                   the kernels over GGML-quantized weights
    4 checked      check.py, checks/ -> CheckedGraph
    5 bound        model/: the .oinf reader/writer and bind.py (CheckedGraph + model -> BoundGraph)
    6 front end    pipeline.py: load -> check -> bind, the loaders, the default-model rule
    7 backends     lowering/ (BoundGraph -> JAX), interpret.py + interpret_caches.py (the oracle)
    8 runtime      runtime/: the host side of a compiled program
    9 facade       api.py, export.py, cli.py, oi2jax/__init__.py, __main__.py
"""
from __future__ import annotations

import ast
import functools
import re

from conftest import REPO

PKG = REPO / "oi2jax"

LAYERS = [
    ("ir", {"ir"}),
    ("foundation", {"diagnostics", "dtypes", "host_numerics", "messages", "naming", "phases", "limits", "values", "run_rules", "npz",
                    "progress", "protocol", "xla_cache", "_signals"}),
    ("text", {"grammar/", "graph_json", "trace", "cfg", "tables"}),
    ("ops", {"ops/", "quantized/"}),
    ("checked", {"check", "checks/"}),
    ("bound", {"model/"}),
    ("front end", {"pipeline"}),
    ("backends", {"lowering/", "interpret", "interpret_caches"}),
    ("runtime", {"runtime/"}),
    ("facade", {"api", "export", "cli", "cli_models", "cli_run_io", "oi2jax", "__main__", "generation", "batch_generate"}),
]
RANK = {group: rank for rank, (_, groups) in enumerate(LAYERS) for group in groups}

# imports the layer order alone would allow, ruled out: (importer group, imported group) -> why
NEVER = {
    ("interpret", "lowering/"): "the interpreter shares no execution code with the compiler",
    ("interpret_caches", "lowering/"): "the interpreter shares no execution code with the compiler",
    ("lowering/", "interpret"): "the compiler does not execute through the oracle",
    ("lowering/", "interpret_caches"): "the compiler does not execute through the oracle",
    ("lowering/", "pipeline"): "a backend starts from a BoundGraph, never calls the front end",
    ("interpret", "pipeline"): "a backend starts from a BoundGraph, never calls the front end",
    ("interpret_caches", "pipeline"): "a backend starts from a BoundGraph, never calls the front end",
    ("runtime/", "pipeline"): "a program rebinds itself (BoundGraph.rebind), never calls the front end",
    ("runtime/", "interpret"): "the compiled runtime does not run the oracle",
    ("runtime/", "interpret_caches"): "the compiled runtime does not run the oracle",
    ("runtime/", "check"): "the runtime reads the checker's results through the BoundGraph",
    ("runtime/", "checks/"): "the runtime reads the checker's results through the BoundGraph",
    ("lowering/", "check"): "the lowering reads the checker's results through the BoundGraph",
    ("lowering/", "checks/"): "the lowering reads the checker's results through the BoundGraph",
    ("lowering/", "grammar/"): "the lowering starts from the IR, never from text",
    ("runtime/", "grammar/"): "the runtime starts from the IR, never from text",
    ("ops/", "grammar/"): "ops are typed from IR literals, not text",
    ("model/", "ops/"): "binding reads op signatures from the CheckedGraph",
    ("model/", "grammar/"): "binding starts from the IR",
    ("api", "cli"): "the facade below the command line",
    ("export", "cli"): "the facade below the command line",
}

def _module(path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(PKG.rglob("*.py"))}


def _group(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "oi2jax"
    return parts[1] + "/" if (PKG / parts[1]).is_dir() else parts[1]


def _targets(module: str, path, node) -> list[str]:
    """The oi2jax modules an import statement names (a package's submodule when it names one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "oi2jax"]
    if node.level == 0:
        base = node.module or ""
        if base.split(".")[0] != "oi2jax":
            return []
    else:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


@functools.lru_cache(maxsize=None)
def _imports() -> tuple:
    """(importer module, its path, line, imported module) for every import statement."""
    out = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out += [(module, path, node.lineno, target) for target in _targets(module, path, node)]
    return tuple(out)


def test_every_module_has_a_layer():
    missing = sorted({_group(m) for m in MODULES} - set(RANK))
    assert not missing, f"place these in LAYERS (tests/test_import_direction.py, docs/architecture.md): {missing}"


def test_imports_flow_one_way():
    offenders = []
    for module, path, line, target in _imports():
        src, dst = _group(module), _group(target)
        if src == dst:
            continue
        where = f"{path.relative_to(REPO)}:{line}: {module} imports {target}"
        if RANK[dst] > RANK[src]:
            offenders.append(f"{where} ({LAYERS[RANK[src]][0]} -> {LAYERS[RANK[dst]][0]}: upward)")
        elif (src, dst) in NEVER:
            offenders.append(f"{where} ({NEVER[src, dst]})")
    assert not offenders, "\n".join(offenders)


def test_the_named_rules_hold():
    """The rules as issue 33 words them, each checked by itself (the table above implies them)."""
    def imports_of(groups):
        return {_group(t) for m, _, _, t in _imports() if _group(m) in groups}

    assert imports_of({"ir"}) <= {"ir"}
    assert not imports_of({"grammar/", "ir"}) & {"check", "checks/", "model/", "lowering/", "runtime/", "api", "cli"}
    assert not imports_of({"check", "checks/"}) & {"model/", "lowering/", "runtime/", "api", "cli", "pipeline"}
    assert not imports_of({"model/"}) & {"lowering/", "runtime/", "api", "cli", "pipeline"}
    assert not imports_of({"lowering/"}) & {"runtime/", "api", "cli", "pipeline"}
    assert not imports_of({"runtime/"}) & {"api", "cli", "pipeline"}
    assert not imports_of({"interpret", "interpret_caches"}) & {"lowering/", "runtime/"}
    assert not imports_of({"ops/"}) & {"lowering/", "runtime/", "api", "cli", "pipeline", "check", "model/"}
    assert not imports_of({"pipeline"}) & {"lowering/", "runtime/", "interpret", "api", "cli"}


_WHY = re.compile(r"#\s*(cycle|optional|deferred)\b")


def test_imports_inside_functions_say_why():
    """An import inside a function hides a dependency: allowed for a real import cycle, an optional
    dependency, or a deferral with a reason (JAX kept out of `oi2jax inspect`, an interrupt handler
    installed first), each saying so in a comment on its line or the line above."""
    offenders = []
    for module, path in MODULES.items():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        type_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                     and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
        functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for function in functions:
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in type_only:
                    text = lines[node.lineno - 1] + " " + (lines[node.lineno - 2] if node.lineno > 1 else "")
                    if not _WHY.search(text):
                        offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    # oi2jax/__init__.py and ops/__init__.py: PEP 562 lazy attributes, said once above the function
    offenders = [o for o in offenders if not re.match(r"oi2jax/(ops/)?__init__\.py:", o)]
    assert not offenders, "move to module level, or say why not (# cycle / # optional / # deferred):\n" + \
        "\n".join(offenders)


# Inside runtime/, lowest first (a module imports its own layer and lower ones only): the parts an
# executable is made of, the `Executable` (one generation of a compiled program), its clients (each
# uses the executable's surface and never `Program`), the `Program` (the user's handle: compiles,
# keeps the current executable, delegates), and what builds programs.
RUNTIME_LAYERS = [
    ("parts", {"placement", "cache_state", "runargs", "runstats", "executor", "state_file", "faults", "buckets",
               "tokens", "settings"}),
    ("kernels", {"kernels"}),
    ("executable", {"executable"}),
    ("clients", {"session", "driver", "chunked", "emit", "batch"}),
    ("program", {"program"}),
    ("builders", {"sharding", "runtime"}),
]
RUNTIME_RANK = {m: rank for rank, (_, mods) in enumerate(RUNTIME_LAYERS) for m in mods}
# the executable's clients are independent of each other
RUNTIME_NEVER = {(a, b) for a in RUNTIME_LAYERS[3][1] for b in RUNTIME_LAYERS[3][1] if a != b}


def _runtime_name(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["oi2jax", "runtime"]:
        return None
    return parts[2] if len(parts) > 2 else "runtime"


def test_runtime_layers_flow_one_way():
    """Executable below Session, Driver, chunked and emit; those below Program; export (the
    facade) a client of the executable too. Every runtime module is placed."""
    runtime = {_runtime_name(m) for m in MODULES} - {None}
    assert runtime <= set(RUNTIME_RANK), f"place in RUNTIME_LAYERS: {sorted(runtime - set(RUNTIME_RANK))}"
    offenders = []
    for module, path, line, target in _imports():
        src, dst = _runtime_name(module), _runtime_name(target)
        if src is None or dst is None or src == dst:
            continue
        where = f"{path.relative_to(REPO)}:{line}: {module} imports {target}"
        if RUNTIME_RANK[dst] > RUNTIME_RANK[src]:
            offenders.append(f"{where} ({RUNTIME_LAYERS[RUNTIME_RANK[src]][0]} -> "
                             f"{RUNTIME_LAYERS[RUNTIME_RANK[dst]][0]}: upward)")
        elif (src, dst) in RUNTIME_NEVER:
            offenders.append(f"{where} (the executable's clients are independent)")
    assert not offenders, "\n".join(offenders)
