"""Run test files: compile each policy set once, decide every case with `explain`, compare.

Compiling dominates the cost, so a :class:`Session` caches policy sets by the real paths of
their files (with the profile builder and guard, whose own caches then serve every case), and
manifests and grants by real path. Many test files are spread over worker processes (forked
after the grammar is loaded): each takes contiguous runs of files, which keeps the test files of
one directory, which usually share their policies, in one session.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from policy_engine.compiler import compile_files
from policy_engine.compiler.loaders import load_grant, load_manifest
from policy_engine.errors import Diagnostic, DiagnosticsError, Span
from policy_engine.explain import ExplainRequest, explain
from policy_engine.explain.render_text import render_text
from policy_engine.graph import PolicySet
from policy_engine.guard import Guard
from policy_engine.guard.facts import UNKNOWN_FACTS
from policy_engine.policytest import coverage
from policy_engine.policytest.coverage import CoverageData, SiteKey
from policy_engine.policytest.loader import LoadedCase, LoadedTestFile, load_test_file
from policy_engine.policytest.results import CaseResult, FileResult, Outcome, RunResult, Status
from policy_engine.profile import ProfileBuilder

# below this many test files a worker pool costs more than it saves
_MIN_FILES_PER_WORKER = 16
_CHUNKS_PER_WORKER = 4
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Compiled:
    policyset: PolicySet
    builder: ProfileBuilder
    guard: Guard
    rule_ids: frozenset[str]
    sites: dict[tuple[str, int, int], SiteKey]


class Session:
    """Caches shared by every test file run in one process."""

    def __init__(self) -> None:
        self._sets: dict[tuple[str, ...], _Compiled | DiagnosticsError] = {}
        self._fixtures: dict[str, object] = {}
        self.coverage = CoverageData()

    def compiled(self, tf: LoadedTestFile) -> _Compiled:
        """The policy set ``tf`` names, compiled on first use. :raises DiagnosticsError:"""
        got = self._sets.get(tf.policy_key)
        if got is None:
            try:
                ps = compile_files(list(tf.policies))
                sites = coverage.rule_sites(ps)
                # hermetic: facts are the case's declarations, else unknown (never this disk)
                got = _Compiled(ps, ProfileBuilder(ps), Guard(ps).with_facts(UNKNOWN_FACTS),
                                frozenset(r.id for r in ps.rules), sites)
                coverage.register(self.coverage, ps, sites)
            except DiagnosticsError as exc:
                got = exc
            self._sets[tf.policy_key] = got
        if isinstance(got, DiagnosticsError):
            raise got
        return got

    def fixture(self, path: str, loader: Callable[[str], T]) -> T:
        """A manifest or grant, loaded once per real path. :raises DiagnosticsError:"""
        key = os.path.realpath(path)
        got = self._fixtures.get(key)
        if got is None:
            try:
                got = loader(path)
            except DiagnosticsError as exc:
                got = exc
            self._fixtures[key] = got
        if isinstance(got, DiagnosticsError):
            raise got
        return cast(T, got)

    def run_path(self, path: str, keyword: str | None,
                 needs_policy: frozenset[str] | None = None) -> FileResult | None:
        """Load and run one test file; ``None`` when it does not name a required policy."""
        start = time.perf_counter()
        try:
            tf = load_test_file(path)
        except DiagnosticsError as exc:
            return FileResult(path, diagnostics=list(exc.diagnostics),
                              duration_s=time.perf_counter() - start)
        if needs_policy is not None and not needs_policy & set(tf.policy_key):
            return None
        result = self.run_file(tf, keyword)
        result.duration_s = time.perf_counter() - start
        return result

    def run_file(self, tf: LoadedTestFile, keyword: str | None) -> FileResult:
        """Run the cases of ``tf`` that match ``keyword`` (case-insensitive substring)."""
        result = FileResult(tf.path, tf.policies, names_policies=frozenset(tf.policy_key))
        wanted = keyword.casefold() if keyword else None
        cases = [c for c in tf.cases if wanted is None or wanted in c.spec.name.casefold()]
        result.deselected = len(tf.cases) - len(cases)
        if not cases:
            return result
        try:
            comp = self.compiled(tf)
        except DiagnosticsError as exc:
            result.diagnostics.extend(exc.diagnostics)
            result.diagnostics.append(Diagnostic.make(
                "SBP409", f"the policy set {', '.join(f'`{p}`' for p in tf.policies)} does not "
                f"compile ({len(exc.diagnostics)} error(s) above); its cases were not run",
                tf.policy_span))
            return result
        for case in cases:
            result.cases.append(self._run_case(tf, case, comp, result.diagnostics))
        return result

    def _run_case(self, tf: LoadedTestFile, case: LoadedCase, comp: _Compiled,
                  diags: list[Diagnostic]) -> CaseResult:
        spec = case.spec
        expected: dict[str, str | None] = {"decision": spec.want_decision}
        if spec.checks_code:
            expected["code"] = spec.want_code
        if spec.checks_rule:
            expected["rule"] = spec.want_rule

        def verdict(status: Status, actual: Outcome | None, **extra: Any) -> CaseResult:
            return CaseResult(name=spec.name, file=tf.path, line=case.span.line,
                              column=case.span.column, status=status, expected=expected,
                              actual=actual, **extra)

        if spec.want_rule is not None and spec.want_rule not in comp.rule_ids:
            diags.append(Diagnostic.make(
                "SBP410", f"`{spec.want_rule}` is not a rule of the policy set "
                f"{', '.join(f'`{p}`' for p in tf.policies)}",
                Span(tf.path, case.span.line, case.span.column)))
            return verdict("error", None, error=f"unknown rule `{spec.want_rule}`")
        try:
            manifest = self.fixture(case.manifest, load_manifest)
            grant = self.fixture(case.grant, load_grant)
        except DiagnosticsError as exc:
            note = f"needed by case `{spec.name}` at {tf.path}:{case.span.line}"
            diags.extend(Diagnostic(d.id, d.message, d.span, d.severity, d.help,
                                    (*d.notes, note)) for d in exc.diagnostics)
            return verdict("error", None, error="its manifest or grant cannot be loaded")
        request = ExplainRequest.model_construct(
            op=spec.op, now_ms=case.now_ms, overrides=spec.overrides, settings=spec.settings,
            context=spec.context, budget_used=spec.budget_used,
        )
        start = time.perf_counter()
        guard = comp.guard if case.facts is UNKNOWN_FACTS else comp.guard.with_facts(case.facts)
        exp = explain(comp.policyset, manifest, grant, request, builder=comp.builder,
                      guard=guard)
        elapsed = time.perf_counter() - start
        d = exp.decision
        self.coverage.fired |= coverage.fired(d, comp.sites)
        actual = Outcome(d.decision, d.code, d.rule.id if d.rule else None)
        got = {"decision": actual.decision, "code": actual.code, "rule": actual.rule}
        mismatches = tuple(k for k, v in expected.items() if got[k] != v)
        if not mismatches:
            return verdict("passed", actual, reason=d.reason, duration_s=elapsed)
        return verdict(
            "failed", actual, mismatches=mismatches, reason=d.reason, duration_s=elapsed,
            explain_text=render_text(exp),
            trace=tuple(step.model_dump(mode="json") for step in d.trace or ()),
        )


# ---- running many files ------------------------------------------------------------------------

_worker_session: Session | None = None


def _run_chunk(
    args: tuple[list[str], str | None, dict[str, frozenset[str]]],
) -> tuple[list[tuple[str, FileResult | None]], CoverageData]:
    global _worker_session
    if _worker_session is None:
        _worker_session = Session()
    session = _worker_session
    paths, keyword, needs = args
    before = CoverageData(dict(session.coverage.sites), set(session.coverage.fired))
    out = [(p, session.run_path(p, keyword, needs.get(p))) for p in paths]
    # send only what this chunk added; the parent merges
    delta = CoverageData({k: v for k, v in session.coverage.sites.items()
                          if k not in before.sites}, session.coverage.fired - before.fired)
    return out, delta


def default_jobs() -> int:
    """Worker processes to use: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def run_tests(
    paths: Sequence[str], *, keyword: str | None = None,
    needs_policy: dict[str, set[str]] | None = None, jobs: int | None = None,
) -> RunResult:
    """Run the test files ``paths`` (in that order in the result).

    :param needs_policy: test files that run only if they name one of these real policy paths.
    :param jobs: worker processes (default: the usable CPUs; 1 runs everything in this one).
    """
    start = time.perf_counter()
    needs = {p: frozenset(v) for p, v in (needs_policy or {}).items()}
    jobs = jobs or default_jobs()
    jobs = min(jobs, len(paths) // _MIN_FILES_PER_WORKER) if jobs > 1 else 1
    run = RunResult()
    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        session = Session()
        results = [(p, session.run_path(p, keyword, needs.get(p))) for p in paths]
        run.coverage = session.coverage
    else:
        results = _run_pool(list(paths), keyword, needs, jobs, run.coverage)
    run.files = [r for _, r in results if r is not None]
    run.duration_s = time.perf_counter() - start
    return run


def _run_pool(paths: list[str], keyword: str | None, needs: dict[str, frozenset[str]], jobs: int,
              cov: CoverageData) -> list[tuple[str, FileResult | None]]:
    from policy_engine.dsl.grammar import get_parser

    get_parser()  # build the LALR tables once, before forking, so every worker inherits them
    size = max(1, -(-len(paths) // (jobs * _CHUNKS_PER_WORKER)))
    chunks = [paths[i:i + size] for i in range(0, len(paths), size)]
    out: list[tuple[str, FileResult | None]] = []
    # fork: workers inherit the loaded modules and parser, so they start in milliseconds
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for results, delta in pool.imap(
                _run_chunk, [(c, keyword, {p: needs[p] for p in c if p in needs})
                             for c in chunks]):
            out.extend(results)
            cov.merge(delta)
    return out
