"""One folder, one floor: no import runs upward and no two folders import each other in a loop.

The floors are DESIGN.md §7's, as docs/architecture.md lists them folder by folder. Every import
counts, the ones at load time and the deferred ones inside functions (``import`` statements
anywhere in a module, ``TYPE_CHECKING`` blocks included: a type names a dependency too).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "policy_engine"

FLOORS: dict[str, int] = {}
"""Unit (a folder of ``policy_engine/`` or a top-level module) → floor, 0 the lowest."""

_TABLE = {
    0: ("model", "errors", "lazy", "refusal", "ids", "pid"),  # ground
    1: ("inputs",),  # facts: readers of untrusted files
    2: ("dsl", "patterns"),  # language
    3: ("sandbox",),  # backend facts: masks, runtime dirs, engine dirs, hard links, SBPL
    4: ("guard", "profile", "compiler", "graph", "config", "sandbox_config"),  # decide
    5: ("orchestrator", "orchestration", "evidence", "budget", "plugin_manager", "hookspecs",
        "executor", "observe", "capture", "recording", "pgschema", "rollout", "netproxy",
        "tokens", "serving", "tracing", "tracing_sdk"),  # runtime
    6: ("explain", "lint", "fmt", "policytest", "replay", "conformance", "documents", "stats",
        "analysis"),  # authoring
    7: ("skills", "runcode", "confirm"),  # agents
    8: ("gateway",),  # the one call path under every face
    9: ("cli", "service", "mcp", "lsp", "sandbox_runner", "console", "templates", "client",
        "__init__"),  # faces (``__init__``: the package face, `from policy_engine import …`)
}
for _floor, _units in _TABLE.items():
    for _unit in _units:
        FLOORS[_unit] = _floor
NAMES = {0: "ground", 1: "facts (inputs)", 2: "language", 3: "backend facts", 4: "decide",
         5: "runtime", 6: "authoring", 7: "agents", 8: "gateway", 9: "faces"}


def _unit_of_module(dotted: str) -> str | None:
    parts = dotted.split(".")
    if parts[0] != "policy_engine":
        return None
    if len(parts) == 1:
        return "__init__"
    head = parts[1]
    if (PACKAGE / head).is_dir() or (PACKAGE / f"{head}.py").is_file():
        return head
    return "__init__"  # `from policy_engine import __version__`: a name of the package face


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted target) of every import in ``path``, relative ones resolved."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module != "policy_engine":
                out.append((node.lineno, module))
                continue
            # `from policy_engine import sandbox` names a folder, not the package face; the
            # version constant is the one plain value the face defines without importing
            for alias in node.names:
                if _is_unit(alias.name):
                    out.append((node.lineno, f"{module}.{alias.name}"))
                elif alias.name != "__version__":
                    out.append((node.lineno, module))
    return out


def _is_unit(name: str) -> bool:
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()


def _unit_of_file(path: Path) -> str:
    rel = path.relative_to(PACKAGE).parts
    return "__init__" if rel == ("__init__.py",) else rel[0].removesuffix(".py")


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _edges() -> dict[tuple[str, str], list[str]]:
    """(from unit, to unit) → where (``file:line``) for every import between two units."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in _sources():
        me = _unit_of_file(path)
        for line, target in _imports(path):
            if target == "policy_engine" and me != "__init__":
                # `from policy_engine import X` with X a name of the face: upward
                edges[(me, "__init__")].append(f"{path.relative_to(ROOT)}:{line}")
                continue
            unit = _unit_of_module(target)
            if unit is not None and unit != me:
                edges[(me, unit)].append(f"{path.relative_to(ROOT)}:{line}")
    return edges


def test_every_unit_has_a_floor() -> None:
    units = {_unit_of_file(p) for p in _sources()}
    missing = sorted(u for u in units if u not in FLOORS)
    assert not missing, f"give these a floor in docs/architecture.md and FLOORS: {missing}"


def test_no_import_runs_upward() -> None:
    upward = [
        f"{a} ({NAMES[FLOORS[a]]}) → {b} ({NAMES[FLOORS[b]]}) at {', '.join(where[:3])}"
        for (a, b), where in sorted(_edges().items())
        if a in FLOORS and b in FLOORS and FLOORS[b] > FLOORS[a]
    ]
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_no_two_folders_import_each_other() -> None:
    edges = _edges()
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    cycles = _cycles(graph)
    shown = [", ".join(f"{a} → {b} ({edges[(a, b)][0]})" for a in c for b in c
                       if (a, b) in edges) for c in cycles]
    assert not cycles, "folders importing each other in a loop:\n" + "\n".join(shown)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one unit (Tarjan), each as a list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_library_never_imports_plugins() -> None:
    offenders = [f"{p.relative_to(ROOT)}:{line} imports {t}" for p in _sources()
                 for line, t in _imports(p) if t == "plugins" or t.startswith("plugins.")]
    assert not offenders, "\n".join(offenders)


PLUGIN_MAY_IMPORT = 5
"""First-party plugins import what a third party could: the runtime floor and below (the
executor and sink APIs, hookspecs, the shared network proxy, guard helpers), never an
authoring tool, an agent, the gateway or a face."""


def test_plugins_import_nothing_above_the_runtime() -> None:
    offenders = []
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        for line, target in _imports(path):
            unit = _unit_of_module(target)
            if unit is None or unit == "__init__":
                continue  # the package face's re-exported names are the public API
            if FLOORS.get(unit, 99) > PLUGIN_MAY_IMPORT:
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("unit", sorted(u for u in FLOORS if u == "__init__" or _is_unit(u)))
def test_architecture_doc_names_every_floor(unit: str) -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    wanted = "the package face" if unit == "__init__" else f"`{unit}"
    assert wanted in doc, f"docs/architecture.md does not name {wanted}"
