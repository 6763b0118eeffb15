"""The first-party import graph, read statically from the sources (every ``import``, also inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

PACKAGES = ("engine", "studio", "webui")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def imported_names(path: Path, name: str) -> set[str]:
    """Every absolute module name ``path`` imports (relative imports resolved against ``name``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def graph() -> dict[str, set[str]]:
    """First-party module -> the first-party modules it imports."""
    mods = modules()
    return {name: {m for m in imported_names(path, name) if m in mods and m != name} for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One import cycle as a list of modules (first == last), or [] when the graph is acyclic."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []
