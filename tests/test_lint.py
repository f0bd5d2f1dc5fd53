"""Issue 15 item 5: pyflakes clean (package, tests, examples, benchmarks) and no dead code that
vulture finds at high confidence, as part of `make test`."""
from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_pyflakes_clean():
    result = _run("pyflakes", "oi2jax", "tests", "examples", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_dead_code_at_high_confidence():
    result = _run("vulture", "--min-confidence", "80", "oi2jax")
    assert result.returncode == 0, result.stdout + result.stderr


# the standard library's public names that start with one underscore (documented API, not a module's privates)
STDLIB_PUBLIC = {("os", "_exit")}


def _private_uses(path) -> tuple[set, list]:
    """(the `_names` a module defines, its uses of `x._name` with x not self/cls, its imports of `_name`)."""
    import ast
    tree = ast.parse(path.read_text(), str(path))
    defined, uses = set(), []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            defined.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            defined.add(node.value)  # __slots__ entries, dataclass field names
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            attr = node.attr
            if attr.startswith("_") and not attr.startswith("__"):
                base = node.value
                if not (isinstance(base, ast.Name) and base.id in ("self", "cls")) and attr not in defined \
                        and not (isinstance(base, ast.Name) and (base.id, attr) in STDLIB_PUBLIC):
                    uses.append(f"{path}:{node.lineno}: .{attr}")
        elif isinstance(node, ast.ImportFrom) and node.level and node.module != "_signals":
            uses += [f"{path}:{node.lineno}: import {a.name}" for a in node.names
                     if a.name.startswith("_") and not a.name.startswith("__")]
    return defined, uses


def test_modules_talk_through_public_names():
    """Issue 15 item 5: no module reads another module's `_private` attributes or imports its
    `_private` functions (an object's own module may)."""
    uses = []
    for path in sorted((REPO / "oi2jax").rglob("*.py")):
        uses += _private_uses(path)[1]
    assert not uses, "\n".join(uses)


def test_lowering_never_imports_the_runtime():
    """Data flows one way: lowering/ (IR -> JAX rules) knows nothing of runtime/ (the host side)."""
    import re
    pattern = re.compile(r"^\s*(from\s+(\.\.runtime|oi2jax\.runtime)\b|import\s+oi2jax\.runtime\b)")
    offenders = [f"{p}:{i}" for p in sorted((REPO / "oi2jax" / "lowering").glob("*.py"))
                 for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.match(line)]
    assert not offenders, offenders
