"""The import rules of docs/ARCHITECTURE.md, checked on the source itself (ast, no imports run)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("ledger", "registry", "inspections", "replay", "config", "desk", "scenarios")
LEDGER_TABLES = re.compile(r"\bledger_(entry|treenode|checkpoint|witness|cosignature)\b")


def _sources(*packages: str):
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path, path.read_text()


def _imported_modules(tree: ast.AST, module: str) -> set[str]:
    """Every first-party module a file imports, at any depth (function-level imports too)."""
    package = module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_only_the_ledger_reads_its_models_and_tables():
    offenders = []
    for path, text in _sources("registry", "inspections", "replay", "config", "desk", "scenarios"):
        imported = _imported_modules(ast.parse(text), _module_name(path))
        if "ledger.models" in imported or LEDGER_TABLES.search(text):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_no_private_name_crosses_modules():
    offenders = []
    for path, text in _sources(*APPS):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and any(
                alias.name.startswith("_") and not alias.name.startswith("__") for alias in node.names
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in _module_aliases(text)
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}")
    assert offenders == []


def _module_aliases(text: str) -> set[str]:
    """Names bound to first-party modules by `import x` / `from pkg import module`."""
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names.update(
                (alias.asname or alias.name).split(".")[0] for alias in node.names if alias.name.split(".")[0] in APPS
            )
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in APPS):
            names.update(alias.asname or alias.name for alias in node.names if alias.name.islower())
    return names
