"""Load one test file: parse it with positions, validate it, check what pydantic cannot.

Parsing is the generic bounded one (:mod:`policy_engine.inputs.bounded`: libyaml's event stream for
positions and bounds, then libyaml builds the values), so a test file is held to the same limits
on size, depth, aliases, integers and duplicate keys as a grant or a request.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from policy_engine.compiler.loaders import PositionLookup, load_document, validate_document
from policy_engine.errors import Diagnostic, DiagnosticsError, ErrorCode, Span
from policy_engine.guard.facts import UNKNOWN_FACTS, FactSource, parse_declared
from policy_engine.inputs.inputfile import DOCUMENT_SUFFIXES, named_like
from policy_engine.policytest.model import PolicyTestCase, PolicyTestFile

_CODES = frozenset(code.value for code in ErrorCode)
POLICY_SUFFIX = ".sbpolicy"
FORMAT_HELP = "see docs/policy-tests.md for the test-file format"
Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class LoadedCase:
    """A validated case with its fixtures resolved to paths (as shown, and real for caching)."""

    spec: PolicyTestCase
    index: int
    span: Span
    manifest: str
    grant: str
    now_ms: int | None
    facts: FactSource = UNKNOWN_FACTS
    """What the case decides on: its declared facts over the file's, the file's fixture;
    unknown where nothing is declared (never this machine's disk)."""


@dataclass(frozen=True, slots=True)
class LoadedTestFile:
    """A test file ready to run: the policy set it names and its cases."""

    path: str
    policies: tuple[str, ...]
    """The policy files as shown (relative to the working directory when given so)."""
    policy_key: tuple[str, ...]
    """The policy files' real paths: test files naming the same set share one compilation."""
    policy_span: Span
    cases: tuple[LoadedCase, ...]


def load_test_file(path: str) -> LoadedTestFile:
    """Load and check the test file at ``path`` (shown as given in every diagnostic).

    :raises DiagnosticsError: SBP100/SBP105 for unreadable or malformed files, SBP401-SBP405
        for problems in the cases; every problem found is reported at once.
    """
    try:
        data, lookup = read_document(path)
        spec = validate_document(PolicyTestFile, data, lookup, "test file")
    except DiagnosticsError as exc:
        raise DiagnosticsError([_with_help(d) for d in exc.diagnostics]) from None
    return _check(path, spec, lookup)


def read_document(path: str) -> tuple[Any, PositionLookup]:
    """The parsed JSON/YAML document and the position of every key and list item."""
    return load_document(path)


def _with_help(d: Diagnostic) -> Diagnostic:
    if d.id != "SBP105":
        return d
    return Diagnostic(d.id, d.message, d.span, d.severity, FORMAT_HELP, d.notes)


def _check(path: str, spec: PolicyTestFile, lookup: PositionLookup) -> LoadedTestFile:
    here = os.path.dirname(path)
    diags: list[Diagnostic] = []
    policies = spec.policies
    if not policies:
        diags.append(Diagnostic.make("SBP402", "`policy` names no file", lookup.span(("policy",))))
    shown: list[str] = []
    for i, rel in enumerate(policies):
        where = lookup.span(("policy", i) if isinstance(spec.policy, list) else ("policy",))
        target = os.path.normpath(os.path.join(here, rel))
        if rel and not named_like(target, POLICY_SUFFIX):  # never opened, never quoted
            diags.append(Diagnostic.make(
                "SBP402", f"`policy` names `{rel}`, which is not a `.sbpolicy` file (by its "
                "name or its link target's); it was not read", where))
        elif not rel or not os.path.isfile(target):
            diags.append(Diagnostic.make(
                "SBP402", f"policy file `{rel}` not found (looked for `{target}`)", where))
        shown.append(target)
    fixture: str | None = None
    if spec.fixture is not None:
        fixture = os.path.normpath(os.path.join(here, spec.fixture))
        if "\x00" in spec.fixture or not os.path.isdir(fixture):
            diags.append(Diagnostic.make(
                "SBP411", f"fixture `{spec.fixture[:200]}` is not a directory (looked for "
                f"`{fixture}`)", lookup.span(("fixture",))))
            fixture = None
    base = _facts(spec.facts or {}, None, fixture, lookup, ("facts",), diags)
    seen: dict[str, int] = {}
    cases: list[LoadedCase] = []
    for i, case in enumerate(spec.cases):
        loaded = _check_case(here, i, case, spec, lookup, seen, diags)
        if loaded is not None and (case.facts or spec.facts or fixture):
            declared = {**(spec.facts or {}), **(case.facts or {})}
            loaded = _with_facts(loaded, _facts(declared, base, fixture, lookup,
                                                ("cases", i, "facts"), diags))
        if loaded is not None:
            cases.append(loaded)
    if diags:
        # a missing file-level fixture is found once per case: report it once
        raise DiagnosticsError(list(dict.fromkeys(diags)))
    return LoadedTestFile(
        path=path, policies=tuple(shown),
        policy_key=tuple(os.path.realpath(p) for p in shown),
        policy_span=lookup.span(("policy",)), cases=tuple(cases),
    )


def _check_case(
    here: str, i: int, case: PolicyTestCase, spec: PolicyTestFile, lookup: PositionLookup,
    seen: dict[str, int], diags: list[Diagnostic],
) -> LoadedCase | None:
    loc: Loc = ("cases", i)
    span = lookup.span(loc)
    count = len(diags)
    if case.name in seen:
        diags.append(Diagnostic.make(
            "SBP401", f"case name `{case.name}` is already used by the case at line "
            f"{seen[case.name]}", lookup.span((*loc, "name"))))
    else:
        seen[case.name] = span.line
    code_span = lookup.span((*loc, "want_code"))
    if case.want_code is not None and case.want_code not in _CODES:
        diags.append(Diagnostic.make(
            "SBP404", f"`{case.want_code}` is not an error code", code_span))
    if case.want_decision == "allow" and case.want_code is not None:
        diags.append(Diagnostic.make(
            "SBP405", f"an allow carries no code, but `want_code` is `{case.want_code}`",
            code_span))
    if case.want_decision == "deny" and case.checks_code and case.want_code is None:
        diags.append(Diagnostic.make(
            "SBP405", "a deny always carries a code, but `want_code` is null", code_span))
    fixtures: list[str] = []
    for what in ("manifest", "grant"):
        rel: str | None = getattr(case, what)
        key: Loc = (*loc, what)
        if rel is None:
            rel, key = getattr(spec, what), (what,)
        if rel is None:
            diags.append(Diagnostic.make(
                "SBP403", f"case `{case.name}` has no {what}: set `{what}` at the top of the "
                "file or in the case", span))
            continue
        target = os.path.normpath(os.path.join(here, rel))
        kinds = DOCUMENT_SUFFIXES + ((POLICY_SUFFIX,) if what == "manifest" else ())
        if not named_like(target, kinds):  # never opened, never quoted in a parse error
            diags.append(Diagnostic.make(
                "SBP403", f"{what} `{rel}` is not a {'/'.join(kinds)} file (by its name or its "
                "link target's); it was not read", lookup.span(key)))
        elif not os.path.isfile(target):
            diags.append(Diagnostic.make(
                "SBP403", f"{what} `{rel}` not found (looked for `{target}`)", lookup.span(key)))
        fixtures.append(target)
    if len(diags) > count:
        return None
    return LoadedCase(
        spec=case, index=i, span=span, manifest=fixtures[0], grant=fixtures[1],
        now_ms=case.now_ms if case.now_ms is not None else spec.now_ms,
    )


def _facts(raw: dict[str, Any], fallback: FactSource | None, fixture: str | None,
           lookup: PositionLookup, loc: Loc, diags: list[Diagnostic]) -> FactSource:
    """The fact source of ``raw`` declarations over ``fixture`` (``fallback`` when malformed:
    the diagnostic stops the run anyway)."""
    label = "declared" if fixture is None else "declared, fixture"
    try:
        return parse_declared(raw, label, fixture)
    except ValueError as exc:
        diags.append(Diagnostic.make("SBP411", str(exc), lookup.span(loc)))
        return fallback or UNKNOWN_FACTS


def _with_facts(case: LoadedCase, facts: FactSource) -> LoadedCase:
    return LoadedCase(case.spec, case.index, case.span, case.manifest, case.grant, case.now_ms,
                      facts)
