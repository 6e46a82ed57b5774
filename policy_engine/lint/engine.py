"""The lint driver: find policy files, compile each policy once, run the rules, apply suppressions.

How files are grouped: a file that no other linted file imports is a *root* and is compiled as
its own policy (with its imports, like ``policy-engine check``); a file imported by others is
linted once, within the first root (in path order) that reaches it, so rules see the defaults
and mandatory denies of the policy it belongs to. The import graph for that grouping comes from
a cheap scan of ``import "..."`` lines; the compile itself follows the parsed imports. Large
inputs are split across a process pool by root; each process parses every file it needs once.
"""

from __future__ import annotations

import multiprocessing
import os
import re
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from policy_engine.documents import DOCUMENT_SUFFIXES, is_document
from policy_engine.dsl.grammar import get_parser
from policy_engine.dsl.parser import MAX_POLICY_BYTES
from policy_engine.errors import Diagnostic, Severity, Span
from policy_engine.inputs.inputfile import read_limited, walk_takes
from policy_engine.lint import docignore, suppress
from policy_engine.lint.compile import Caches, compile_policy
from policy_engine.lint.documents import lint_document
from policy_engine.lint.model import FileView, Finding, LintConfig, LintResult
from policy_engine.lint.rules import CHECKS

SUFFIX = ".sbpolicy"
WALKED = (SUFFIX, *DOCUMENT_SUFFIXES)
"""What a directory is searched for: policies, and JSON/YAML that may be engine documents."""
PARALLEL_MIN_ROOTS = 48
"""Below this many policies a process pool costs more than it saves."""

_IMPORT = re.compile(r'^[ \t]*import[ \t]+"((?:[^"\\\n]|\\.)*)"', re.MULTILINE)


@dataclass(slots=True)
class _Outcome:
    findings: list[Finding] = field(default_factory=list)
    unusable: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)


def _own_suffix(name: str) -> str:
    """The suffix that says what ``name`` is (`.sbtest.yaml` before `.yaml`)."""
    lower = name.lower()
    for suffix in sorted((".sbtest.yaml", ".sbtest.yml", *WALKED), key=len, reverse=True):
        if lower.endswith(suffix):
            return suffix
    return os.path.splitext(lower)[1]


def discover(paths: Sequence[str], walked: set[str] | None = None,
             ) -> tuple[list[tuple[str, str]], list[Finding]]:
    """``(display, real)`` of every file under ``paths`` (directories are searched recursively
    for ``*.sbpolicy``, ``*.json``, ``*.yaml`` and ``*.yml``; files are taken as given), and
    SBP100 findings for paths that do not exist or directories without such files.

    :param walked: receives the display paths found by searching a directory.
    """
    files: list[tuple[str, str]] = []
    seen: set[str] = set()
    problems: list[Finding] = []

    def add(shown: str) -> None:
        real = os.path.realpath(shown)
        if real not in seen:
            seen.add(real)
            files.append((shown, real))

    for path in paths:
        if os.path.isdir(path):
            found = sorted(
                os.path.join(d, n) for d, subdirs, names in os.walk(path)
                for n in names if n.lower().endswith(WALKED) and not _hidden(d, path, subdirs)
                # no FIFO, no device, no link to a file of another kind (a `x.sbtest.yaml`
                # link to a key file would be quoted in the test-file error)
                and walk_takes(os.path.join(d, n), _own_suffix(n))
            )
            if not found:
                problems.append(Finding(Diagnostic.make(
                    "SBP100", f"no `{SUFFIX}`, JSON or YAML files under `{path}`", None,
                    help="pass policy files or a directory that contains some")))
            for shown in found:
                add(os.path.normpath(shown))
                if walked is not None:
                    walked.add(os.path.normpath(shown))
        elif os.path.exists(path):
            add(path)
        else:
            problems.append(Finding(Diagnostic.make(
                "SBP100", f"`{path}` does not exist", None,
                help="check the path; directories are searched for *.sbpolicy files")))
    return files, problems


def _hidden(directory: str, top: str, subdirs: list[str]) -> bool:
    # prune hidden and tooling directories (.git, .venv, node_modules) from the walk in place
    subdirs[:] = [s for s in subdirs if not s.startswith(".") and s != "node_modules"]
    rel = os.path.relpath(directory, top)
    return rel != "." and any(p.startswith(".") for p in rel.split(os.sep))


def _scan_imports(real: str) -> list[str]:
    try:  # bounded, regular files only: reading a FIFO would block, a device never end
        data = read_limited(real, MAX_POLICY_BYTES)
    except (OSError, ValueError):
        return []
    if len(data) > MAX_POLICY_BYTES:
        return []  # the compile reports it (SBP106)
    text = data.decode("utf-8", errors="replace")
    base = os.path.dirname(real)
    return [os.path.realpath(os.path.join(base, m)) for m in _IMPORT.findall(text)]


def plan(files: list[tuple[str, str]]) -> list[tuple[tuple[str, str], list[tuple[str, str]]]]:
    """Roots in order, each with the linted files it owns (itself first)."""
    by_real = {real: (shown, real) for shown, real in files}
    graph = {real: _scan_imports(real) for _, real in files}
    imported = {t for targets in graph.values() for t in targets if t in by_real}
    owner: dict[str, str] = {}
    roots: list[str] = []

    def claim(root: str) -> None:
        stack = [root]
        while stack:
            node = stack.pop()
            if node in owner:
                continue
            if node in by_real:
                owner[node] = root
            stack.extend(t for t in graph.get(node, ()) if t not in owner)

    for _, real in files:
        if real not in imported:
            roots.append(real)
            claim(real)
    for _, real in files:  # files only reachable through an import cycle
        if real not in owner:
            roots.append(real)
            claim(real)
    owned: dict[str, list[tuple[str, str]]] = {r: [] for r in roots}
    for shown, real in files:
        owned[owner[real]].append((shown, real))
    for root in roots:
        owned[root].sort(key=lambda f: f[1] != root)
    return [(by_real[r], owned[r]) for r in roots]


def _lint_root(root: tuple[str, str], owned: list[tuple[str, str]], cfg: LintConfig,
               caches: Caches, out: _Outcome, *, fallback: bool = True) -> None:
    ctx = compile_policy(root[1], root[0], caches, cfg.home)
    ctx.diagnostics.sort(key=lambda d: (d.span.file, d.span.line, d.span.column) if d.span
                         else ("", 0, 0))
    units = {os.path.realpath(u.file.file): u for u in ctx.units}
    if ctx.has_errors:
        # a file that does not parse has no items, so "no header" would only be noise
        broken = {d.span.file for d in ctx.diagnostics if d.id < "SBP200" and d.span}
        out.findings.extend(Finding(d, d.span.line if d.span else 0) for d in ctx.diagnostics
                            if not (d.id == "SBP200" and d.span and d.span.file in broken))
        out.unusable.append(root[0])
        for shown, real in owned[1:]:
            if fallback and real not in units:
                _lint_root((shown, real), [(shown, real)], cfg, caches, out, fallback=False)
            else:
                out.unusable.append(shown)
        return
    out.findings.extend(Finding(d, d.span.line if d.span else 0) for d in ctx.diagnostics)
    for shown, real in owned:
        unit = units.get(real)
        if unit is None:  # the scan saw an import the parser did not: lint it on its own
            if fallback:
                _lint_root((shown, real), [(shown, real)], cfg, caches, out, fallback=False)
            continue
        view = FileView(unit.file, real, ctx)
        found = [f for check in CHECKS for f in check(view, cfg) if cfg.enabled(f.id)]
        found = [f for f in suppress.apply(unit.file, found, cfg) if cfg.enabled(f.id)]
        out.findings.extend(found)
        out.sources[unit.file.file] = unit.file.source


def _lint_chunk(work: list[tuple[tuple[str, str], list[tuple[str, str]]]],
                cfg: LintConfig) -> _Outcome:
    out, caches = _Outcome(), Caches()
    for root, owned in work:
        _lint_root(root, owned, cfg, caches, out)
    return out


def _lint_documents(docs: list[tuple[str, str]], walked: set[str], cfg: LintConfig,
                    kind: str | None) -> tuple[_Outcome, set[str]]:
    """Documents checked and linted in this process (cheap next to policies), and the walked
    files that are no engine document (left out of the result)."""
    out, skipped = _Outcome(), set()
    for shown, _real in docs:
        linted = lint_document(shown, cfg, kind, walked=shown in walked)
        if linted is None:
            skipped.add(shown)
            continue
        report, found = linted
        out.findings.extend(Finding(d, d.span.line if d.span else 0) for d in report.diagnostics)
        if any(is_unusable(d) for d in report.diagnostics):
            out.unusable.append(shown)
        out.findings.extend(found)
        if report.text is not None:
            out.sources[shown] = report.text
    # JSON has no comments: a .sbpolicy-ignore.yaml beside the documents suppresses
    out.findings = docignore.apply(out.findings, [d for d, _ in docs if d not in skipped], cfg)
    return out, skipped


def lint_paths(paths: Sequence[str], config: LintConfig | None = None, *,
               jobs: int | None = None, kind: str | None = None) -> LintResult:
    """Lint every policy and engine document under ``paths``; never raises for bad input (it
    becomes findings).

    :param jobs: worker processes (default: the CPUs available; 1 = in this process).
    :param kind: what the JSON/YAML documents are (default: told by their keys).
    """
    cfg = config or LintConfig()
    walked: set[str] = set()
    found, problems = discover(paths, walked)
    docs = [f for f in found if is_document(f[0])]
    files = [f for f in found if not is_document(f[0])]
    doc_outcome, skipped = _lint_documents(docs, walked, cfg, kind)
    result = LintResult(files=[shown for shown, _ in found if shown not in skipped],
                        findings=list(problems))
    result.unusable.extend("" for _ in problems)
    if found and len(skipped) == len(found):
        result.findings.append(Finding(Diagnostic.make(
            "SBP100", f"no policies or engine documents under `{', '.join(paths)}`", None,
            help="pass policy files or a directory that contains some")))
        result.unusable.append("<input>")
    work = plan(files)
    workers = jobs if jobs is not None else len(os.sched_getaffinity(0))
    outcomes: list[_Outcome] = []
    if workers > 1 and len(work) >= PARALLEL_MIN_ROOTS:
        get_parser()  # build once here so forked workers inherit it
        n = min(workers * 4, len(work))
        chunks = [work[i::n] for i in range(n)]
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method)) as pool:
            outcomes = list(pool.map(_lint_chunk, chunks, [cfg] * n))
    else:
        outcomes = [_lint_chunk(work, cfg)]
    outcomes.append(doc_outcome)
    seen: set[tuple[str, Span | None, str]] = set()
    for out in outcomes:
        for f in out.findings:
            key = (f.id, f.span, f.diagnostic.message)
            if key not in seen:
                seen.add(key)
                result.findings.append(f)
        result.unusable.extend(out.unusable)
        result.sources.update(out.sources)
    order = {shown: i for i, shown in enumerate(result.files)}
    result.findings.sort(key=lambda f: (order.get(f.span.file, len(order)) if f.span else -1,
                                        *f.sort_key()))
    result.unusable = sorted({u for u in result.unusable if u} | (
        {"<input>"} if problems or "<input>" in result.unusable else set()),
        key=lambda u: order.get(u, -1))
    return result


def is_unusable(d: Diagnostic) -> bool:
    """Parse and check errors (SBP1xx/SBP2xx) make input unusable; lint findings never do."""
    return d.id < "SBP300" and d.severity is Severity.ERROR


def lint_text(text: str, path: str, config: LintConfig | None = None) -> list[Finding]:
    """Check and lint an unsaved buffer ``text`` as the policy file ``path`` (its imports read
    from disk): what `check` and `lint` would report once it is saved (the language server)."""
    from policy_engine.dsl.fastparse import parse
    from policy_engine.lint.compile import Parsed

    cfg, caches, out = config or LintConfig(), Caches(), _Outcome()
    real = os.path.realpath(path)
    pf, diags = parse(text, path)
    caches.parses[real] = Parsed(pf, diags)
    _lint_root((path, real), [(path, real)], cfg, caches, out, fallback=False)
    seen: set[tuple[str, Span | None, str]] = set()
    found = []
    for f in out.findings:
        key = (f.id, f.span, f.diagnostic.message)
        if key not in seen:
            seen.add(key)
            found.append(f)
    return found
