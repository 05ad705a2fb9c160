"""The house rules of DESIGN §2 that a machine can check: who imports whom, and no import circles."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("config", "desk", "inspections", "ledger", "registry", "replay", "scenarios")
# The regulator's server. `scenarios` is not on it: it plays the chips and provers (the outside world), so it
# drives the replay recorder and the chip simulator as a prover would.
DJANGO_SIDE = ("config", "desk", "inspections", "ledger", "registry")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in FIRST_PARTY
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
    }


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """First-party modules that ``name`` imports, at the top or inside functions."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]  # a module, else a name in base
        else:
            continue
        for target in targets:
            while target and target not in known:  # `from pkg import name`: the module pkg.name, else pkg
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, or None (a package importing its own submodules is not one: the edge is kept)."""
    state, stack = {}, []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_first_party_import_graph_has_no_cycle():
    assert _cycle(import_graph()) is None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_only_inspections_verification_imports_replay_on_the_django_side():
    graph = import_graph()
    django_side = [name for name in graph if name.split(".")[0] in DJANGO_SIDE]
    importers = sorted(name for name in django_side if any(t.split(".")[0] == "replay" for t in graph[name]))
    assert importers == ["inspections.verification"]


def test_replay_never_imports_a_django_side_module():
    graph = import_graph()
    for name, targets in graph.items():
        if name.split(".")[0] == "replay":
            assert all(t.split(".")[0] == "replay" for t in targets), name
