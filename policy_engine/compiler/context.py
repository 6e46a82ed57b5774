"""State threaded through the compiler stages: parsed units, drafts, diagnostics, the result."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from policy_engine.dsl import ast
from policy_engine.dsl.cel import CelCondition, compile_condition
from policy_engine.dsl.fastparse import parse_file
from policy_engine.errors import Diagnostic, Severity, Span
from policy_engine.graph import NamedProfile, PolicySet
from policy_engine.model import Capability, CapabilityKind, Limits, Manifest, NetworkMode


@dataclass(slots=True)
class Unit:
    """One parsed file, in rule order (imports before the importing file).

    :param rel: path relative to the first root file's directory, POSIX separators; used in the
        version hash so it does not depend on where the checkout lives.
    :param root: given to the compiler directly (not reached only through an import).
    """

    file: ast.PolicyFile
    rel: str
    root: bool


@dataclass(slots=True)
class RuleDraft:
    """A rule between checking and indexing: capabilities still carry unexpanded ``~``."""

    node: ast.Rule
    id: str
    unit: Unit
    capabilities: dict[CapabilityKind, Capability] = field(default_factory=dict)
    limits: Limits | None = None
    condition: CelCondition | None = None


@dataclass(slots=True)
class ConsentDraft:
    node: ast.Consent
    id: str
    unit: Unit
    condition: CelCondition | None = None


@dataclass(slots=True)
class CompileContext:
    """Everything the stages read and write; each stage documents what it fills in."""

    paths: tuple[str | os.PathLike[str], ...]
    home: str
    require_header: bool = True
    # How ResolveImports reads a file (real path, display path) and CompileConditions compiles a
    # condition (source, span). `lint` passes cached equivalents; the stages stay the same.
    # The default reads through the fast reader, which builds the Lark parser's AST and defers
    # to it on anything it does not fully understand (so diagnostics are the parser's).
    read_policy: Callable[[str, str], tuple[ast.PolicyFile | None, list[Diagnostic]]] = (
        parse_file)
    compile_cel: Callable[[str, Span], CelCondition | list[Diagnostic]] = compile_condition
    units: list[Unit] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    name: str = ""
    version: str = ""
    defaults: Limits = field(default_factory=Limits)
    network: NetworkMode = NetworkMode.OFF
    rules: list[RuleDraft] = field(default_factory=list)
    consents: list[ConsentDraft] = field(default_factory=list)
    profiles: dict[str, NamedProfile] = field(default_factory=dict)
    tools: dict[str, Manifest] = field(default_factory=dict)
    builtin_rules: list[RuleDraft] = field(default_factory=list)
    version_hash: str = ""
    result: PolicySet | None = None

    def report(self, diag_id: str, message: str, span: Span | None, *,
               help: str | None = None) -> None:
        """Record a diagnostic (severity and default help come from the registry)."""
        self.diagnostics.append(Diagnostic.make(diag_id, message, span, help=help))

    @property
    def has_errors(self) -> bool:
        return any(d.severity is Severity.ERROR for d in self.diagnostics)

    def all_rule_nodes(self) -> list[tuple[Unit, ast.Rule]]:
        """Top-level rules of every unit, in rule order."""
        return [(u, i) for u in self.units for i in u.file.items if isinstance(i, ast.Rule)]
