"""The one error registry: stable runtime error codes and the policy-file diagnostic family."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Stable error codes returned for every refusal or failure (DESIGN.md §4, seed 000 §9).

    The string values are a public contract: never rename one, only add.
    """

    PERMISSION_DENY = "SANDBOX.PERMISSION_DENY"
    DENY_TOOL = "POLICY.DENY_TOOL"
    CAPABILITY_BLOCKED = "SANDBOX.CAPABILITY_BLOCKED"
    PROVIDER_UNAVAILABLE = "PROVIDER.UNAVAILABLE"
    TIMEOUT = "LLM.TIMEOUT"
    BUDGET_EXCEEDED = "QUOTA.BUDGET_EXCEEDED"
    SCHEMA_VALIDATION_FAILED = "SCHEMA.VALIDATION_FAILED"
    EXECUTION_FAILED = "TOOL.EXECUTION_FAILED"
    NOT_FOUND = "TOOL.NOT_FOUND"
    UNKNOWN_INTERNAL = "UNKNOWN.INTERNAL"


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """Everything the registry knows about one code.

    :param http_status: status a service front-end answers with.
    :param retryable: whether the same call may succeed if simply retried later.
    :param public_message: template for the public (redacted) view; ``{reason}`` is filled with
        the already-redacted reason.
    :param audit_detail: what the audit view records beyond the public message.
    :param when: one line on when this code is used.
    """

    code: ErrorCode
    http_status: int
    retryable: bool
    public_message: str
    audit_detail: str
    when: str


REGISTRY: dict[ErrorCode, ErrorSpec] = {
    spec.code: spec
    for spec in (
        ErrorSpec(
            ErrorCode.PERMISSION_DENY, 403, False,
            "permission denied: {reason}",
            "grant, subject, tenant, the capability asked for and why it was not granted",
            "capability not granted; grant missing, expired or revoked; no rule permits it",
        ),
        ErrorSpec(
            ErrorCode.DENY_TOOL, 403, False,
            "tool call refused: {reason}",
            "tool, manifest version, the argv or operation and the template it failed",
            "operation inconsistent with the tool manifest; illegal command template or arguments",
        ),
        ErrorSpec(
            ErrorCode.CAPABILITY_BLOCKED, 403, False,
            "blocked by sandbox policy: {reason}",
            "the blocking rule (id, file, line, column), the resolved resource and limit",
            "a policy rule blocks it: deny-list, size, path, method, traversal, symlink, "
            "out-of-root write; an env variable the rule's `env` list does not admit (or a "
            "hijack variable it does not name exactly); a `Host`, hop-by-hop or "
            "`Content-Length` request header",
        ),
        ErrorSpec(
            ErrorCode.PROVIDER_UNAVAILABLE, 503, True,
            "provider unavailable: {reason}",
            "backend name, endpoint and the transport error (a state store: its path and error)",
            "outbound network, execution backend or a state store (budget, revocations) "
            "unavailable",
        ),
        ErrorSpec(
            ErrorCode.TIMEOUT, 504, True,
            "timed out: {reason}",
            "the timeout that fired, elapsed time and what was killed",
            "the operation timed out",
        ),
        ErrorSpec(
            ErrorCode.BUDGET_EXCEEDED, 429, False,
            "budget exceeded: {reason}",
            "budget kind, limit, already used and the amount asked for",
            "budget or quota exceeded",
        ),
        ErrorSpec(
            ErrorCode.SCHEMA_VALIDATION_FAILED, 422, False,
            "invalid input: {reason}",
            "the validation errors with their locations",
            "malformed JSON or input structure; a malformed env name or value, header name "
            "or value (CR, LF, NUL, control or non-ASCII), method or stdin",
        ),
        ErrorSpec(
            ErrorCode.EXECUTION_FAILED, 500, True,
            "tool execution failed: {reason}",
            "executor name, exception type and message",
            "executor internal failure",
        ),
        ErrorSpec(
            # the caller's mistake, not the executor's: retrying the same call cannot help
            # (before it was TOOL.EXECUTION_FAILED, retryable; outsider attack 15, F5)
            ErrorCode.NOT_FOUND, 404, False,
            "not found: {reason}",
            "the path as the executor resolved it and the errno",
            "the op's target does not exist: a file to read or a directory to list is missing, "
            "or a component of its path is not a directory",
        ),
        ErrorSpec(
            ErrorCode.UNKNOWN_INTERNAL, 500, False,
            "internal error",
            "exception type, message and stack (audit view only)",
            "anything unclassified (target at most 0.1 % of calls)",
        ),
    )
}


def spec_of(code: ErrorCode) -> ErrorSpec:
    """Return the registry entry of ``code``."""
    return REGISTRY[code]


class PolicyEngineError(Exception):
    """A refusal or failure carrying a stable code.

    :param code: the registry code.
    :param reason: public, redacted reason (lowercase start, no trailing period).
    :param audit: audit-only detail; never shown in a public view.
    """

    def __init__(self, code: ErrorCode, reason: str, *, audit: dict[str, Any] | None = None):
        super().__init__(f"{code.value}: {reason}")
        self.code = code
        self.reason = reason
        self.audit: dict[str, Any] = dict(audit or {})

    @property
    def spec(self) -> ErrorSpec:
        return REGISTRY[self.code]

    @property
    def http_status(self) -> int:
        return self.spec.http_status

    @property
    def retryable(self) -> bool:
        return self.spec.retryable

    def public_message(self) -> str:
        """The public view: the registry template filled with the redacted reason."""
        return self.spec.public_message.format(reason=self.reason)

    def public_view(self) -> dict[str, Any]:
        return {
            "code": self.code.value,
            "http_status": self.http_status,
            "retryable": self.retryable,
            "message": self.public_message(),
        }


class BackendRefusal(PolicyEngineError):
    """A refusal an executor makes for what its backend cannot offer (a live interpreter
    outside a session's container, more masked paths than its launcher takes, strict mode
    without an id-mapped bind), as opposed to a second-line re-check of the policy: the guard
    allowed the call and no rule can change the answer, so the refusal says
    ``refused_by: backend``, names no rule, and the evidence records ``sandbox_error_kind:
    capability`` like a refused backend selection (policy_engine/gateway/outcome.py)."""


# ---------------------------------------------------------------------------------------------
# Diagnostics about policy files: SBP1xx parse, SBP2xx check, SBP3xx lint, SBP40x-41x policy
# tests, SBP42x fmt
# ---------------------------------------------------------------------------------------------


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True, slots=True)
class Span:
    """A position in a source file (1-based line and column), optionally with an end."""

    file: str
    line: int
    column: int
    end_line: int | None = None
    end_column: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True, slots=True)
class DiagnosticSpec:
    """A diagnostic ID with its default severity, a title and the help shown to users."""

    id: str
    severity: Severity
    title: str
    help: str


_DIAGNOSTICS: tuple[DiagnosticSpec, ...] = (
    # --- parse (SBP1xx) ---
    DiagnosticSpec("SBP100", Severity.ERROR, "file cannot be read",
                   "check the path exists, is a regular file and is UTF-8 text"),
    DiagnosticSpec("SBP101", Severity.ERROR, "unexpected token",
                   "check the statement against the language reference (docs/language.md)"),
    DiagnosticSpec("SBP102", Severity.ERROR, "unexpected character",
                   "remove the character or quote it inside a string literal"),
    DiagnosticSpec("SBP103", Severity.ERROR, "unexpected end of file",
                   "a block or list is not closed: add the missing `}` or `]`"),
    DiagnosticSpec("SBP104", Severity.ERROR, "invalid string or regex literal",
                   "close the literal and escape embedded quotes with a backslash"),
    DiagnosticSpec("SBP105", Severity.ERROR, "malformed manifest or grant document",
                   "fix the JSON/YAML structure; `policy-engine schema` prints the expected shape"),
    DiagnosticSpec("SBP106", Severity.ERROR, "input file too large",
                   "policy files are at most 1 MiB and JSON/YAML documents at most 4 MiB "
                   "(docs/operations.md, \"Input limits\"); split the file"),
    # --- check (SBP2xx) ---
    DiagnosticSpec("SBP200", Severity.ERROR, "missing policy header",
                   "start the file with `policy \"name\" version \"x.y.z\"`"),
    DiagnosticSpec("SBP201", Severity.ERROR, "duplicate definition",
                   "rename one of the definitions; names must be unique across imports"),
    DiagnosticSpec("SBP202", Severity.ERROR, "unresolved name",
                   "define the name or import the file that defines it"),
    DiagnosticSpec("SBP203", Severity.ERROR, "import cycle",
                   "remove one of the imports that closes the cycle"),
    DiagnosticSpec("SBP204", Severity.ERROR, "import not found",
                   "import paths are relative to the importing file"),
    DiagnosticSpec("SBP205", Severity.ERROR, "invalid unit",
                   "sizes take B, KB, KiB, MB, MiB, GB, GiB; durations take ms, s, m, h"),
    DiagnosticSpec("SBP206", Severity.ERROR, "invalid path glob",
                   "paths are absolute (or start with `~/`, `**/` or, in a permit, `$SESSION`); "
                   "`**` is a whole segment"),
    DiagnosticSpec("SBP207", Severity.ERROR, "invalid host pattern",
                   "use an exact host, `*.suffix`, an IP literal or a CIDR block"),
    DiagnosticSpec("SBP208", Severity.ERROR, "invalid regular expression",
                   "fix the pattern; regexes use RE2 syntax (no backreferences or lookaround) "
                   "and are anchored"),
    DiagnosticSpec("SBP209", Severity.ERROR, "CEL syntax error",
                   "fix the condition; see https://github.com/google/cel-spec"),
    DiagnosticSpec("SBP210", Severity.ERROR, "CEL type error",
                   "conditions see request, grant, manifest, profile, tenant, subject and now"),
    DiagnosticSpec("SBP211", Severity.ERROR, "CEL condition is not boolean",
                   "a `when` condition must evaluate to a bool"),
    DiagnosticSpec("SBP212", Severity.ERROR, "resource not valid for this capability",
                   "each capability takes only its own resources; see docs/language.md"),
    DiagnosticSpec("SBP213", Severity.ERROR, "invalid value",
                   "check the allowed values in docs/language.md"),
    DiagnosticSpec("SBP214", Severity.ERROR, "unknown capability",
                   "capabilities: fs.read fs.write fs.list net.http browser.use proc.exec "
                   "tmp.use sys.gpu"),
    DiagnosticSpec("SBP215", Severity.ERROR, "conflicting policy headers",
                   "a file declares its policy name and version once"),
    DiagnosticSpec("SBP216", Severity.WARNING, "rule can never match",
                   "the rule's resources are empty or fully shadowed by a mandatory deny"),
    DiagnosticSpec("SBP217", Severity.ERROR, "import of a file that is not a policy",
                   "import only `.sbpolicy` files (the name and, through links, the target); "
                   "other files are never read"),
    # --- lint (SBP300-SBP349; rationale and examples in policy_engine/lint/registry.py) ---
    DiagnosticSpec("SBP300", Severity.ERROR, "permit is broader than the mandatory denies allow",
                   "narrow the permit to the directories the tool needs, e.g. `/workspace/**`"),
    DiagnosticSpec("SBP301", Severity.WARNING, "network permit for any host",
                   "list the hosts the tool needs, or `*.example.com` for one organisation"),
    DiagnosticSpec("SBP302", Severity.ERROR, "wildcard host at a public suffix",
                   "name the organisation's domain: `*.example.com`, not `*.com`"),
    DiagnosticSpec("SBP303", Severity.WARNING, "permit reaches a secret no mandatory deny covers",
                   "add a `forbid mandatory` rule for the secret, or narrow the permit"),
    DiagnosticSpec("SBP310", Severity.ERROR, "proc.exec permit runs a shell",
                   "permit the program the shell would run, with an argument template"),
    DiagnosticSpec("SBP311", Severity.ERROR, "interpreter permit admits inline code",
                   "pin the first arguments: `args [\"-m\", \"pytest\", ...]` or a script path"),
    DiagnosticSpec("SBP312", Severity.WARNING, "proc.exec permit does not constrain the arguments",
                   "add an argument template: `args [\"status\" | \"log\", /--oneline/ ...]`"),
    DiagnosticSpec("SBP313", Severity.WARNING, "env allow-list names a hijack variable",
                   "drop the variable, or suppress with the reason the tool needs it"),
    DiagnosticSpec("SBP320", Severity.WARNING, "network permit over plain http",
                   "use `schemes [\"https\"]`; for a LAN host without TLS, suppress with a reason"),
    DiagnosticSpec("SBP321", Severity.ERROR, "permit sends data to any host",
                   "restrict write methods to the hosts that need them"),
    DiagnosticSpec("SBP322", Severity.WARNING, "default network mode is `on`",
                   "use `network restricted` (or `off`) in `defaults`"),
    DiagnosticSpec("SBP330", Severity.WARNING, "permit has no timeout (rule or defaults)",
                   "set `timeout` in `defaults` or `limits { timeout 30s }` on the rule"),
    DiagnosticSpec("SBP331", Severity.WARNING, "limit above the org default has no effect",
                   "lower the limit to at most the default, or raise the default deliberately"),
    DiagnosticSpec("SBP332", Severity.WARNING, "profile redefines a seed profile more loosely",
                   "keep every seed setting at least as strict, or give the profile a new name"),
    DiagnosticSpec("SBP335", Severity.WARNING, "`when` condition is always true",
                   "remove the `when` clause or write the condition that was meant"),
    DiagnosticSpec("SBP336", Severity.WARNING, "`when` condition is never true",
                   "fix the condition or remove the rule"),
    DiagnosticSpec("SBP337", Severity.WARNING, "rule duplicates an earlier rule",
                   "delete one of the two rules"),
    DiagnosticSpec("SBP338", Severity.WARNING, "permit is unreachable: a forbid covers it",
                   "remove the permit or narrow the forbid"),
    DiagnosticSpec("SBP339", Severity.WARNING, "permit is unreachable: an earlier permit wins",
                   "move the narrower permit first, or merge the two"),
    DiagnosticSpec("SBP340", Severity.WARNING, "import adds nothing",
                   "remove the import"),
    DiagnosticSpec("SBP341", Severity.NOTE, "profile is not referenced by any tool block",
                   "reference it from a `tool` block (`profile \"name\"`) or remove it"),
    DiagnosticSpec("SBP342", Severity.NOTE, "unreachable-permit checks stopped early",
                   "split the file, or order it so the rules that matter most come first"),
    DiagnosticSpec("SBP345", Severity.WARNING, "malformed suppression comment",
                   "write `# sbpolicy: ignore SBP301 reason=\"why this is fine\"`"),
    DiagnosticSpec("SBP346", Severity.WARNING, "suppression has no reason",
                   "add `reason=\"...\"` saying why the finding is acceptable"),
    DiagnosticSpec("SBP347", Severity.WARNING, "suppression suppresses nothing",
                   "remove the suppression (or the ID that no longer fires)"),
    DiagnosticSpec("SBP348", Severity.WARNING, "suppression names an unknown lint ID",
                   "use an ID from docs/lint-rules.md"),
    # --- policy tests (SBP400-SBP419): `policy-engine test` and its test files ---
    DiagnosticSpec("SBP400", Severity.ERROR, "no test files found",
                   "test files are named `*.sbtest.yaml`, `*.sbtest.yml` or `*.sbtest.json` "
                   "(docs/policy-tests.md)"),
    DiagnosticSpec("SBP401", Severity.ERROR, "duplicate test case name",
                   "give every case of a test file its own name; `-k` and reports use it"),
    DiagnosticSpec("SBP402", Severity.ERROR, "tested policy file not found",
                   "`policy` paths are relative to the test file"),
    DiagnosticSpec("SBP403", Severity.ERROR, "manifest or grant not found",
                   "`manifest` and `grant` are paths relative to the test file; set them at the "
                   "top of the file or in the case"),
    DiagnosticSpec("SBP404", Severity.ERROR, "unknown error code",
                   "`want_code` takes a code listed in docs/error-codes.md, such as "
                   "SANDBOX.PERMISSION_DENY"),
    DiagnosticSpec("SBP405", Severity.ERROR, "contradictory expectation",
                   "an allow carries no code and a deny always carries one: fix `want_code` or "
                   "`want_decision`"),
    DiagnosticSpec("SBP406", Severity.ERROR, "test path does not exist",
                   "pass test files, directories to search, or .sbpolicy files"),
    DiagnosticSpec("SBP407", Severity.ERROR, "no test case matches the filter",
                   "`-k` is a case-insensitive substring of case names"),
    DiagnosticSpec("SBP408", Severity.ERROR, "no test file names this policy",
                   "add `<name>.sbtest.yaml` next to the policy with `policy: <name>.sbpolicy`"),
    DiagnosticSpec("SBP409", Severity.ERROR, "tested policy does not compile",
                   "fix the policy diagnostics shown with it (`policy-engine check` shows them "
                   "too)"),
    DiagnosticSpec("SBP410", Severity.ERROR, "unknown rule id in `want_rule`",
                   "`want_rule` is the id of a permit or forbid rule of the tested policy set"),
    DiagnosticSpec("SBP411", Severity.ERROR, "malformed `facts` or `fixture`",
                   "`facts` maps absolute paths to file, dir, symlink (with `target`), absent, "
                   "other or unreadable; `fixture` names a directory relative to the test file "
                   "(docs/policy-tests.md, \"Facts\")"),
    # --- formatter (SBP420-SBP429): `policy-engine fmt` ---
    DiagnosticSpec("SBP420", Severity.ERROR, "formatter would change the policy (internal error)",
                   "the file was left as it is; this is a bug in `policy-engine fmt`: please "
                   "report it with the file attached"),
    DiagnosticSpec("SBP421", Severity.ERROR, "formatted file cannot be written",
                   "check the permissions of the file and its directory; the original file is "
                   "unchanged"),
    DiagnosticSpec("SBP422", Severity.NOTE, "policy with check errors formatted by its syntax "
                   "tree only", "run `policy-engine check` on the file and fix its errors"),
    # --- skills (SBP430-SBP439): `policy-engine skills check` (docs/skills.md) ---
    DiagnosticSpec("SBP430", Severity.ERROR, "skill manifest is not valid JSON",
                   "fix the JSON syntax at the position shown (a skill manifest is one JSON "
                   "object, no comments, no duplicate keys)"),
    DiagnosticSpec("SBP431", Severity.ERROR, "skill manifest does not match the schema",
                   "see skills/_schema/manifest.schema.json and docs/skills.md for the five "
                   "groups: identity, interface, runtime, permissions, limits"),
    DiagnosticSpec("SBP432", Severity.ERROR, "skill id differs from its directory name",
                   "rename the directory or the `id`: skills/<id>/manifest.json"),
    DiagnosticSpec("SBP433", Severity.ERROR, "skill runtime does not fit its interface",
                   "every `{name}` argument and every `runtime.op` value must name a string "
                   "input declared in `interface.inputs.properties`"),
    DiagnosticSpec("SBP434", Severity.ERROR, "no skill manifest found",
                   "give the directory that holds `<id>/manifest.json` folders (e.g. `skills`)"),
    DiagnosticSpec("SBP435", Severity.ERROR, "skill interface is not a valid JSON Schema",
                   "`interface.inputs` and `interface.outputs` are JSON Schema 2020-12 objects"),
)

DIAGNOSTICS: dict[str, DiagnosticSpec] = {d.id: d for d in _DIAGNOSTICS}


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One finding about a policy, manifest or grant file."""

    id: str
    message: str
    span: Span | None
    severity: Severity = Severity.ERROR
    help: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @staticmethod
    def make(
        diag_id: str, message: str, span: Span | None, *, help: str | None = None,
        severity: Severity | None = None,
    ) -> Diagnostic:
        """Build a diagnostic, taking severity and help from the registry unless given."""
        spec = DIAGNOSTICS[diag_id]
        return Diagnostic(
            id=diag_id, message=message, span=span,
            severity=severity or spec.severity, help=help or spec.help,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity.value,
            "message": self.message,
            "help": self.help,
            "file": self.span.file if self.span else None,
            "line": self.span.line if self.span else None,
            "column": self.span.column if self.span else None,
            "end_line": self.span.end_line if self.span else None,
            "end_column": self.span.end_column if self.span else None,
        }


class DiagnosticsError(Exception):
    """Raised when a policy, manifest or grant cannot be used; carries every diagnostic found."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = diagnostics
        first = diagnostics[0] if diagnostics else None
        super().__init__(
            f"{first.span}: {first.id} {first.message}" if first and first.span
            else (f"{first.id} {first.message}" if first else "invalid input")
        )
