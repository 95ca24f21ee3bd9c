"""The import rules of issue 26, read from the source (no import runs).

- A guard package (idempotency, locks, circuit, ratelimit, retry, deadline, pause, cancel)
  imports no other guard package, nor a service (outbox, batches, dead letters, workflows,
  schedules): what a guard needs from outside itself it gets from the core or its call.
- `resilience.admission` (the tier bulkhead, the broker's depth and the breaker's enqueue
  admission: the enqueue pipeline's admission stage) sits below the guards with the core:
  guards may use it, and it imports no guard package.
- No import cycle among the modules of `resilience/` and `jobs/`, counting every import,
  function-local ones included (a function-local import hides a cycle; it does not break it).
- A function-local import of a `resilience` or `jobs` module says why with a `# lazy:`
  comment on its line or the line above (a heavy or optional dependency behind it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("resilience", "jobs")
GUARDS = frozenset({"idempotency", "locks", "circuit", "ratelimit", "retry", "deadline",
                    "pause", "cancel"})
FORBIDDEN = GUARDS | {"outbox", "batches", "deadletter", "workflows", "schedules"}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _resolve(module: str, node: ast.ImportFrom, package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _local_nodes(tree: ast.AST) -> set[int]:
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inside.update(id(child) for child in ast.walk(node) if child is not node)
    return inside


def _imports(modules: dict[str, Path]) -> Iterator[tuple[str, str, bool, bool]]:
    """(importer, imported module, function-local, marked lazy) for every internal import."""
    for module, path in modules.items():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        local = _local_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, node, path.name == "__init__.py")
                targets = [f"{base}.{alias.name}" for alias in node.names]
                targets = [target if target in modules else base for target in targets]
            else:
                continue
            window = " ".join(lines[max(0, node.lineno - 2): node.end_lineno or node.lineno])
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    yield module, target, id(node) in local, "# lazy:" in window


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "resilience" and len(parts) > 1 else None


def _cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in edges.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in list(edges):
        if node not in index:
            visit(node)
    return found


def violations() -> set[str]:
    """Every broken rule, one line each."""
    modules = _modules()
    edges: dict[str, set[str]] = {}
    broken = set()
    for importer, target, local, lazy in _imports(modules):
        edges.setdefault(importer, set()).add(target)
        mine, theirs = _package(importer), _package(target)
        if mine in GUARDS and theirs in FORBIDDEN and theirs != mine:
            broken.add(f"guard {importer} -> {target}")
        if mine == "admission" and theirs in FORBIDDEN:
            broken.add(f"admission {importer} -> {target}")
        if local and not lazy:
            broken.add(f"local {importer} -> {target}")
    for component in _cycles(edges):
        for importer in sorted(component):
            for target in sorted(edges[importer] & component):
                broken.add(f"cycle {importer} -> {target}")
    return broken


def test_layers() -> None:
    broken = sorted(violations())
    assert not broken, "import rules broken (see tests/test_layers.py):\n" + "\n".join(broken)


def test_rules_see_the_tree() -> None:
    """The rules read real modules: every guard package exists, and a planted violation in
    the parser's input would be found (the check cannot pass by reading nothing)."""
    packages = {_package(module) for module in _modules()}
    assert GUARDS | {"admission", "outbox", "batches", "deadletter", "workflows",
                     "schedules"} <= packages
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [{"a", "b", "c"}]
