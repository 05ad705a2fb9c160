"""The architecture, executable: one table of who may import whom (docs/ARCHITECTURE.md, Parts), checked on the
source itself with one import parser (ast: top-level and function-level imports, relative ones resolved), the
doc's table checked against it, and the pure packages run from a bare copy with only their pinned dependencies."""

from __future__ import annotations

import ast
import base64
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nacl.signing
import pytest

from tlog import chain, merkle, note

ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------------------------------------ the table

# {package: the first-party packages it may import}, bottom to top: every import points down. A package may
# always import its own modules. `api` is the layer of the signed-write protocol (it may not exist yet).
MAY_IMPORT: dict[str, set[str]] = {
    "tlog": set(),
    "rules": {"tlog"},
    "replay": {"tlog"},
    "ledger": {"tlog"},
    "registry": {"tlog", "rules", "ledger", "api"},
    "api": {"tlog", "rules", "ledger", "registry"},
    "inspections": {"tlog", "rules", "ledger", "registry", "api", "replay"},
    "desk": {"tlog", "rules", "ledger", "registry", "api", "inspections"},
    "scenarios": {"tlog", "rules", "ledger", "registry", "api", "inspections", "desk", "replay"},
    "config": {"tlog", "rules", "ledger", "registry", "api", "inspections", "desk", "replay", "scenarios"},
}
PACKAGES = tuple(MAY_IMPORT)

# The pure packages run outside the server: besides the standard library and the packages above, they may
# import these distributions only (pinned in requirements.txt) — never Django.
PURE_DEPENDENCIES: dict[str, set[str]] = {
    "tlog": {"nacl", "rfc8785", "orjson"},
    "rules": {"rfc8785"},  # a dependency of tlog, so a bare copy of tlog/ + rules/ has it
    # tqdm: the prover's progress bar; triton: the GPU's kernels, optional (imported on a GPU's first use)
    "replay": {"torch", "numpy", "safetensors", "nacl", "tqdm", "triton"},
}
PINNED = {"nacl": "PyNaCl", "rfc8785": "rfc8785", "orjson": "orjson"}  # import name -> distribution

# The outside tools' first `python -m` names, kept for third parties: {compatibility module: the tool it runs}.
COMPATIBILITY_ENTRY_POINTS = {
    "ledger.verify": "tlog.log_verifier",
    "ledger.witness": "tlog.log_witness",
    "inspections.drawaudit": "rules.draw_auditor",
}

LEDGER_TABLES = re.compile(r"\bledger_(entry|treenode|checkpoint|witness|cosignature)\b")

# ------------------------------------------------------------------------------------------------ the parser


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(*packages: str) -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in packages
        if (ROOT / package).is_dir()
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
    }


MODULES = _sources(*PACKAGES)


def imported_names(name: str, path: Path) -> set[str]:
    """Every dotted name a module imports, absolute, at the top or inside functions: ``import a.b`` gives
    ``a.b``; ``from a import b`` gives ``a.b`` (a module or a name in ``a``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def first_party_imports(name: str, path: Path) -> set[str]:
    """The first-party modules ``name`` imports (``from pkg import f``: the module pkg)."""
    found = set()
    for target in imported_names(name, path):
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def outside_imports(name: str, path: Path) -> set[str]:
    """The top-level names of what ``name`` imports from outside the repository's packages."""
    tops = {target.split(".")[0] for target in imported_names(name, path)}
    return {top for top in tops if top not in PACKAGES and top != "__future__"}


def import_graph() -> dict[str, set[str]]:
    return {name: first_party_imports(name, path) for name, path in MODULES.items()}


def _package(module: str) -> str:
    return module.split(".")[0]


# ------------------------------------------------------------------------------------------------ the rules


def upward_imports() -> set[tuple[str, str]]:
    graph = import_graph()
    return {
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if _package(target) != _package(name) and _package(target) not in MAY_IMPORT[_package(name)]
    }


def test_every_import_points_down_the_table():
    assert upward_imports() == set()


def test_the_pure_packages_import_only_the_standard_library_and_their_dependencies():
    offenders = {}
    for name, path in MODULES.items():
        if _package(name) in PURE_DEPENDENCIES:
            allowed = PURE_DEPENDENCIES[_package(name)] | set(sys.stdlib_module_names)
            if extra := outside_imports(name, path) - allowed:
                offenders[name] = sorted(extra)
    assert offenders == {}


def test_the_parser_sees_function_level_and_relative_imports(tmp_path):
    source = tmp_path / "rules" / "x.py"
    source.parent.mkdir()
    source.write_text(
        "from . import y\nfrom .z import f\ndef g():\n    import django.db\n    from tlog.chain import q\n"
    )
    assert imported_names("rules.x", source) == {"rules.y", "rules.z.f", "django.db", "tlog.chain.q"}


def test_only_the_ledger_reads_its_models_and_tables():
    offenders = []
    for name, path in MODULES.items():
        if _package(name) != "ledger" and (
            "ledger.models" in first_party_imports(name, path) or LEDGER_TABLES.search(path.read_text())
        ):
            offenders.append(name)
    assert offenders == []


def test_only_inspections_verification_imports_replay_on_the_server():
    server = ("ledger", "registry", "api", "inspections", "desk", "config")
    graph = import_graph()
    importers = sorted(
        name for name in graph if _package(name) in server and any(_package(t) == "replay" for t in graph[name])
    )
    assert importers == ["inspections.verification"]


def test_no_private_name_crosses_modules():
    offenders = []
    for name, path in MODULES.items():
        text = path.read_text()
        aliases = _module_aliases(text)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and any(
                alias.name.startswith("_") and not alias.name.startswith("__") for alias in node.names
            ):
                offenders.append(f"{name}:{node.lineno}")
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
            ):
                offenders.append(f"{name}:{node.lineno} {node.value.id}.{node.attr}")
    assert offenders == []


def _module_aliases(text: str) -> set[str]:
    """Names bound to first-party modules by `import x` / `from pkg import module`."""
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names.update(
                (alias.asname or alias.name).split(".")[0]
                for alias in node.names
                if alias.name.split(".")[0] in PACKAGES
            )
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in PACKAGES):
            names.update(alias.asname or alias.name for alias in node.names if alias.name.islower())
    return names


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


def test_the_pure_modules_have_names_no_other_module_has():
    """A name says what a module holds, once in the repository (the compatibility entry points aside: they
    carry the old command names on purpose). The apps' own repeated names are h17b's part of issue #17."""
    compatibility = set(COMPATIBILITY_ENTRY_POINTS)
    pure = {name.rpartition(".")[2] for name in MODULES if _package(name) in ("tlog", "rules") and "." in name}
    clashes = sorted(
        name
        for name in MODULES
        if name.rpartition(".")[2] in pure and _package(name) not in ("tlog", "rules") and name not in compatibility
    )
    assert clashes == []


def test_the_compatibility_entry_points_only_run_the_tools():
    """The old `python -m` names stay for third parties, as a few lines calling the pure tool's main."""
    for name, tool in COMPATIBILITY_ENTRY_POINTS.items():
        path = MODULES[name]
        assert imported_names(name, path) == {"sys", f"{tool}.main"}, name
        assert len(path.read_text().splitlines()) <= 15, name
        assert f'main(prog="python -m {name}")' in path.read_text(), name


# ------------------------------------------------------------------------------------------------ the doc


def _doc_table() -> dict[str, str]:
    """docs/ARCHITECTURE.md, section 2: {package: its "may import" cell}."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## 2.", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and (match := re.fullmatch(r"`(\w+)/`", cells[0])):
            rows[match[1]] = cells[2]
    return rows


def test_the_docs_table_is_this_table():
    """Each row names the same first-party packages (in backticks) and, for a pure package, the same
    dependencies (plain words) as MAY_IMPORT and PURE_DEPENDENCIES."""
    rows, present = _doc_table(), [package for package in PACKAGES if (ROOT / package).is_dir()]
    assert list(rows) == present
    for package, cell in rows.items():
        named = {_package(token.strip("/")) for token in re.findall(r"`([\w./]+)`", cell)} - {package}
        assert named & set(present) == MAY_IMPORT[package] & set(present), package
        if package in PURE_DEPENDENCIES:
            words = set(re.findall(r"(?<![`\w])(\w+)(?![`\w])", re.sub(r"`[^`]*`", "", cell)))
            known = {"nacl", "rfc8785", "orjson", "torch", "numpy", "safetensors", "tqdm", "triton"}
            assert words & known == PURE_DEPENDENCIES[package], package


# ------------------------------------------------------------------------------------------------ bare copies


def test_tlog_rules_and_replay_load_no_django():
    modules = sorted(n for n in MODULES if _package(n) in ("tlog", "rules", "replay") and not n.endswith("__main__"))
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework')], sorted(sys.modules)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def _bare_site(tmp_path: Path) -> Path:
    """A copy of tlog/ and rules/ alone, beside the files of the pinned distributions they need (and what
    those need in turn), nothing else: Django is not there to import by accident."""
    pins = dict(
        line.split("#")[0].strip().split("==")
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if "==" in line
    )
    site = tmp_path / "site"
    site.mkdir()
    for package in ("tlog", "rules"):
        shutil.copytree(ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    todo, done = [PINNED[name] for name in sorted(PURE_DEPENDENCIES["tlog"] | PURE_DEPENDENCIES["rules"])], set()
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        if dist.name.lower() in done:
            continue
        done.add(dist.name.lower())
        if dist.name in pins:
            assert dist.version == pins[dist.name], f"{dist.name} {dist.version} is not the pinned {pins[dist.name]}"
        for file in dist.files or ():
            top = Path(file.parts[0])
            source = Path(dist.locate_file(top))
            if ".dist-info" in top.name or (site / top).exists() or not source.exists():
                continue
            (site / top).symlink_to(source)
        for requirement in dist.requires or ():
            if "extra ==" not in requirement:
                todo.append(re.match(r"[A-Za-z0-9_.-]+", requirement)[0])
    return site


class _TinyLog(BaseHTTPRequestHandler):
    """A three-entry log served the way chipledger serves it, made with tlog alone."""

    origin = "tiny.example/log"
    key = nacl.signing.SigningKey(bytes(range(32)))
    leaves = []
    for seq, (kind, payload) in enumerate([("ledger.opened", {"n": 1}), ("org.note", {"n": 2}), ("org.note", {})]):
        prev = merkle.leaf_hash(leaves[-1]).hex() if leaves else chain.GENESIS_PREV
        leaves.append(chain.canonical_leaf(seq, f"2026-01-01T00:00:0{seq}.000000Z", kind, "system", payload, prev))
    hashes = [merkle.leaf_hash(leaf) for leaf in leaves]
    root = merkle.root_from_leaf_hashes(hashes)
    checkpoint = note.sign_note(note.checkpoint_body(origin, len(leaves), root), origin, key)
    vkey = note.verifier_key(origin, bytes(key.verify_key))

    def _proof(self, ranges) -> list[str]:
        return [base64.b64encode(merkle.root_from_leaf_hashes(self.hashes[b:e])).decode() for b, e in ranges]

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        q = {k: int(v) for k, v in urllib.parse.parse_qsl(url.query)}
        if url.path == "/api/ledger/key":
            body = self.vkey.encode()
        elif url.path in ("/api/ledger/checkpoint", "/tlog/checkpoint"):
            body = self.checkpoint.encode()
        elif url.path == "/tlog/tile/0/000.p/3":  # C2SP tlog-tiles: the verifiers read entries as tiles
            body = b"".join(self.hashes)
        elif url.path == "/tlog/tile/entries/000.p/3":
            body = b"".join(len(leaf).to_bytes(2, "big") + leaf for leaf in self.leaves)
        elif url.path == "/api/ledger/entries":
            body = json.dumps(
                {
                    "entries": [
                        {"seq": s, "leaf": base64.b64encode(self.leaves[s]).decode(), "hash": self.hashes[s].hex()}
                        for s in range(q["start"], min(q["end"], len(self.leaves)))
                    ]
                }
            ).encode()
        elif url.path == "/api/ledger/proof/inclusion":
            body = json.dumps({**q, "hashes": self._proof(merkle.inclusion_ranges(q["index"], q["size"]))}).encode()
        elif url.path == "/api/ledger/proof/consistency":
            body = json.dumps({**q, "hashes": self._proof(merkle.consistency_ranges(q["first"], q["second"]))}).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def tiny_log():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _TinyLog)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_outside_verifiers_run_from_a_bare_copy_with_their_pinned_dependencies(tmp_path, tiny_log):
    """`python -S` (no site-packages) with only tlog/, rules/ and PyNaCl, rfc8785, orjson (and what they
    need) on the path: the log verifier checks a served log and the draw audit reads it to the end."""
    site = _bare_site(tmp_path)
    run = lambda *args: subprocess.run(
        [sys.executable, "-S", "-m", *args],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    django = subprocess.run([sys.executable, "-S", "-c", "import django"], env={"PYTHONPATH": str(site)})
    assert django.returncode != 0  # the bare copy really has no Django

    verified = run("tlog.log_verifier", "--url", tiny_log, "--key", _TinyLog.vkey)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout == f"OK entries=3 root={_TinyLog.root.hex()}\n"

    audited = run("rules.draw_auditor", "--url", tiny_log, "--campaign", "nope", "--period", "0")
    assert audited.returncode == 3, audited.stderr
    assert audited.stderr.startswith("NO SUCH")

    for tool in ("tlog.log_verifier", "tlog.log_witness", "rules.draw_auditor"):
        helped = run(tool, "--help")
        assert helped.returncode == 0 and helped.stdout.startswith(f"usage: python -m {tool} "), helped.stderr


# a lock whose transaction deletes the row needs the full FOR UPDATE
FULL_ROW_LOCKS = {("registry.services.organisations", "Member.objects.select_for_update(")}


def test_every_row_lock_lets_rows_naming_it_be_inserted():
    """docs/ARCHITECTURE.md §3, the order of locks: a row lock is FOR NO KEY UPDATE (``no_key=True``), so a writer
    that already holds the ledger can insert a row with a foreign key to the locked one (a plain FOR UPDATE made
    that a deadlock)."""
    plain = []
    for name, path in MODULES.items():
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            if "select_for_update(" not in line or "no_key=True" in line:
                continue
            if not any(name == module and snippet in line for module, snippet in FULL_ROW_LOCKS):
                plain.append(f"{name}:{line_no}")
    assert plain == []
