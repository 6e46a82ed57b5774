"""The lint rule catalogue: every SBP3xx ID with its metadata; rules register their check here.

The catalogue is the single source for ``docs/lint-rules.md`` (``scripts/gen_lint_rules_doc.py``),
the SARIF ``tool.driver.rules`` array and ``--select``/``--ignore`` validation. Severities and
titles must agree with the SBP3xx entries of :data:`policy_engine.errors.DIAGNOSTICS` (a test
checks it), so ``Diagnostic.make`` gives a finding the catalogue's severity.
"""

from __future__ import annotations

from dataclasses import dataclass

from policy_engine.errors import Severity


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """One lint rule.

    :param name: a stable kebab-case name (SARIF ``name``, used in docs).
    :param category: ``breadth``, ``process``, ``network``, ``limits``, ``logic``, ``hygiene``
        or ``suppression``.
    :param security_severity: the CVSS-like score GitHub code scanning reads from
        ``properties.security-severity`` (9.0+ critical, 7.0+ high, 4.0+ medium, else low).
    :param bad: a policy fragment that triggers the rule; ``good``: the fixed fragment.
    """

    id: str
    name: str
    category: str
    severity: Severity
    title: str
    rationale: str
    fix: str
    bad: str
    good: str
    security_severity: float


_E, _W, _N = Severity.ERROR, Severity.WARNING, Severity.NOTE
_H = 'policy "acme/agents" version "1.0.0"\n'
_SUPPRESSED = (_H + '# sbpolicy: ignore SBP301 reason="public docs crawler"\n'
               'permit net.http hosts ["*"]\n')

CATALOGUE: tuple[RuleSpec, ...] = (
    # ---- breadth: what a permit reaches ------------------------------------------------------
    RuleSpec(
        "SBP300", "permit-covers-mandatory-deny", "breadth", _E,
        "permit is broader than the mandatory denies allow",
        "A permit whose glob contains a whole mandatory-deny glob (`/**`, `~/**`, `/etc/**`) "
        "relies on the mandatory deny alone to keep secrets out; one missing entry in the deny "
        "list and the permit hands it over. Permits should name what they need.",
        "narrow the permit to the directories the tool needs, e.g. `/workspace/**`",
        _H + 'permit fs.read paths ["/**"]\n', _H + 'permit fs.read paths ["/workspace/**"]\n', 8.1,
    ),
    RuleSpec(
        "SBP301", "any-host", "breadth", _W,
        "network permit for any host",
        "`hosts [\"*\"]` (or `0.0.0.0/0`, `::/0`) lets an agent reach every public host: a read "
        "channel to anything on the internet and, through query strings, a way to exfiltrate.",
        "list the hosts the tool needs, or `*.example.com` for one organisation",
        _H + 'permit net.http hosts ["*"]\n', _H + 'permit net.http hosts ["api.github.com"]\n',
        5.3,
    ),
    RuleSpec(
        "SBP302", "public-suffix-wildcard", "breadth", _E,
        "wildcard host at a public suffix",
        "`*.com`, `*.co.uk` or `*.github.io` admit hosts that anyone can register: the "
        "wildcard does not name one organisation. The lint uses the whole Public Suffix List "
        "(the `publicsuffixlist` package, which ships it: no network needed): the ICANN "
        "suffixes and the private ones where anyone can get a subdomain (github.io, r2.dev, "
        "pythonanywhere.com, githubusercontent.com, ...).",
        "name the organisation's domain: `*.example.com`, not `*.com`",
        _H + 'permit net.http hosts ["*.co.uk"]\n', _H + 'permit net.http hosts ["*.bbc.co.uk"]\n',
        7.5,
    ),
    RuleSpec(
        "SBP303", "unprotected-secret-path", "breadth", _W,
        "permit reaches a secret no mandatory deny covers",
        "The built-in mandatory denies cover ~/.ssh, ~/.aws, .env files and more, but not every "
        "credential store: ~/.kube, ~/.docker/config.json, ~/.netrc, ~/.git-credentials, "
        "~/.npmrc, ~/.pypirc, ~/.config/gh, ~/.pgpass, ~/.vault-token, /etc/sudoers. A permit "
        "that reaches one of them should come with a `forbid mandatory` for it.",
        "add a `forbid mandatory` rule for the secret, or narrow the permit",
        _H + 'permit fs.read paths ["~/**"]\n',
        _H + 'permit fs.read paths ["~/**"]\nforbid mandatory fs.read, fs.write, fs.list paths '
             '["~/.kube/**", "~/.docker/config.json", "~/.netrc", "~/.git-credentials",\n'
             '  "~/.npmrc", "~/.pypirc", "~/.config/gh/**", "~/.pgpass", "~/.vault-token"]\n',
        6.5,
    ),
    # ---- process ---------------------------------------------------------------------------
    RuleSpec(
        "SBP310", "shell-tool", "process", _E,
        "proc.exec permit runs a shell",
        "A shell (sh, bash, zsh, dash, ksh, fish, busybox, env, ...) turns an argv allow-list "
        "into a string interpreter: `bash -c '...'` or a script argument runs anything. The "
        "engine never runs shell strings; a permit for a shell undoes that.",
        "permit the program the shell would run, with an argument template",
        _H + 'permit proc.exec tool "bash" args ["-c", /.*/]\n',
        _H + 'permit proc.exec tool "git" args ["status"]\n', 9.1,
    ),
    RuleSpec(
        "SBP311", "interpreter-inline-code", "process", _E,
        "interpreter permit admits inline code",
        "An interpreter (python, node, perl, ruby, php, ...) whose argument template admits an "
        "inline-code flag (`-c`, `-e`, `--eval`, ...) before the script or module, or that has "
        "no template at all, runs whatever code the agent writes.",
        "pin the first arguments: `args [\"-m\", \"pytest\", ...]` or a script path",
        _H + 'permit proc.exec tool "python3" args [/-.*/, /.*/ ...]\n',
        _H + 'permit proc.exec tool "python3" args ["-m", "pytest", /[A-Za-z0-9_.\\/-]+/ ...]\n',
        8.8,
    ),
    RuleSpec(
        "SBP312", "unconstrained-args", "process", _W,
        "proc.exec permit does not constrain the arguments",
        "Without `args` (or with a first slot like `/.*/ ...`) every argument list is "
        "permitted: `git` may `push`, `curl` may upload, `find` may `-delete`.",
        "add an argument template: `args [\"status\" | \"log\", /--oneline/ ...]`",
        _H + 'permit proc.exec tool "git"\n', _H + 'permit proc.exec tool "git" args ["status"]\n',
        5.0,
    ),
    RuleSpec(
        "SBP313", "env-hijack-variable", "process", _W,
        "env allow-list names a hijack variable",
        "A variable such as `LD_PRELOAD`, `PYTHONPATH`, `PATH`, `GIT_CONFIG_PARAMETERS` or "
        "`GIT_SSH_COMMAND` makes the loader, an interpreter or the tool run code of the caller's "
        "choosing. The guard refuses them unless a rule's `env` names them exactly; naming one "
        "lets every call of the rule set it.",
        "drop the variable, or suppress with the reason the tool needs it",
        _H + 'permit proc.exec tool "git" args ["status"] env ["LANG", "GIT_SSH_COMMAND"]\n',
        _H + 'permit proc.exec tool "git" args ["status"] env ["LANG", /^LC_/]\n', 7.0,
    ),
    # ---- network ---------------------------------------------------------------------------
    RuleSpec(
        "SBP320", "plain-http", "network", _W,
        "network permit over plain http",
        "`schemes [\"http\"]` sends requests and responses in clear text: anyone on the path "
        "can read or change them, including what the agent downloads and runs.",
        "use `schemes [\"https\"]`; for a LAN host without TLS, suppress with a reason",
        _H + 'permit net.http hosts ["mirror.example.com"] schemes ["http"]\n',
        _H + 'permit net.http hosts ["mirror.example.com"] schemes ["https"]\n', 5.9,
    ),
    RuleSpec(
        "SBP321", "write-to-any-host", "network", _E,
        "permit sends data to any host",
        "POST, PUT, PATCH or DELETE to `*` is an exfiltration channel to every host on the "
        "internet: whatever the agent can read, it can upload.",
        "restrict write methods to the hosts that need them",
        _H + 'permit net.http hosts ["*"] methods ["POST"]\n',
        _H + 'permit net.http hosts ["api.example.com"] methods ["POST"]\n', 8.6,
    ),
    RuleSpec(
        "SBP322", "network-on-by-default", "network", _W,
        "default network mode is `on`",
        "`network on` gives every sandboxed process unvetted network access, bypassing the "
        "policy proxy; only `restricted` applies the rules to what processes reach.",
        "use `network restricted` (or `off`) in `defaults`",
        _H + "defaults { network on }\n", _H + "defaults { network restricted }\n", 6.1,
    ),
    # ---- limits ----------------------------------------------------------------------------
    RuleSpec(
        "SBP330", "no-timeout", "limits", _W,
        "permit has no timeout (rule or defaults)",
        "A proc.exec, net.http or browser.use permit without `limits { timeout ... }` in a "
        "policy whose `defaults` set no timeout runs until the system default stops it: the "
        "policy does not say how long a call may take.",
        "set `timeout` in `defaults` or `limits { timeout 30s }` on the rule",
        _H + 'permit proc.exec tool "git" args ["status"]\n',
        _H + 'defaults { timeout 60s }\npermit proc.exec tool "git" args ["status"]\n', 3.0,
    ),
    RuleSpec(
        "SBP331", "limit-above-default", "limits", _W,
        "limit above the org default has no effect",
        "Limits only narrow: a call's limits are the minimum of the policy `defaults` (the org "
        "default: the `defaults` blocks of the policy and everything it imports), the rule, "
        "the manifest, the grant and the named profiles. A rule, profile or tool limit above "
        "the org default is silently capped, so the policy says something it does not do.",
        "lower the limit to at most the default, or raise the default deliberately",
        _H + "defaults { timeout 60s }\npermit proc.exec tool \"make\" args [\"test\"]\n"
             "  limits { timeout 120s }\n",
        _H + "defaults { timeout 60s }\npermit proc.exec tool \"make\" args [\"test\"]\n"
             "  limits { timeout 30s }\n", 2.0,
    ),
    RuleSpec(
        "SBP332", "profile-widens-base", "limits", _W,
        "profile redefines a seed profile more loosely",
        "Users pick `safe-readonly` or `high-isolation` by name and expect what the seed "
        "promises. A redefinition that turns on network, allows writes, widens `writable` or "
        "drops or raises a seed limit quietly weakens every grant that names it.",
        "keep every seed setting at least as strict, or give the profile a new name",
        _H + 'profile "safe-readonly" { fs read-write }\n',
        _H + 'profile "my-readwrite" { fs read-write }\n', 6.0,
    ),
    # ---- logic -----------------------------------------------------------------------------
    RuleSpec(
        "SBP335", "condition-always-true", "logic", _W,
        "`when` condition is always true",
        "A condition that reads no request, grant, manifest, profile, tenant, subject or time "
        "and evaluates to true is dead weight, usually a test leftover (`when `true``).",
        "remove the `when` clause or write the condition that was meant",
        _H + 'permit fs.read paths ["/workspace/**"] when `1 < 2`\n',
        _H + 'permit fs.read paths ["/workspace/**"] when `grant.tenant == "acme"`\n', 3.0,
    ),
    RuleSpec(
        "SBP336", "condition-never-true", "logic", _W,
        "`when` condition is never true",
        "A condition that reads nothing from the call and evaluates to false (or fails) makes "
        "a permit grant nothing and a forbid block nothing.",
        "fix the condition or remove the rule",
        _H + 'forbid fs.write paths ["/workspace/release/**"] when `"a" == "b"`\n',
        _H + 'forbid fs.write paths ["/workspace/release/**"]\n', 5.0,
    ),
    RuleSpec(
        "SBP337", "duplicate-rule", "logic", _W,
        "rule duplicates an earlier rule",
        "Two rules with the same effect, capabilities, resources, limits and condition: the "
        "second changes nothing, and a later edit of one of them will not do what it seems to.",
        "delete one of the two rules",
        _H + 'permit fs.read paths ["/workspace/**"]\npermit fs.read paths ["/workspace/**"]\n',
        _H + 'permit fs.read paths ["/workspace/**"]\n', 2.0,
    ),
    RuleSpec(
        "SBP338", "permit-shadowed-by-forbid", "logic", _W,
        "permit is unreachable: a forbid covers it",
        "Deny overrides: a forbid without a condition that covers every resource of a permit "
        "(for each kind the permit names) makes that permit grant nothing.",
        "remove the permit or narrow the forbid",
        _H + 'forbid fs.read paths ["/data/**"]\npermit fs.read paths ["/data/reports/**"]\n',
        _H + 'forbid fs.read paths ["/data/private/**"]\n'
             'permit fs.read paths ["/data/reports/**"]\n',
        4.0,
    ),
    RuleSpec(
        "SBP339", "permit-shadowed-by-permit", "logic", _W,
        "permit is unreachable: an earlier permit wins",
        "A call is allowed by the first permit (in rule order) that admits it; when an earlier "
        "permit without a condition admits everything a later one does, the later permit's "
        "limits and condition never apply.",
        "move the narrower permit first, or merge the two",
        _H + 'permit fs.read paths ["/workspace/**"]\npermit fs.read paths ["/workspace/src/**"]\n'
             '  when `grant.tenant == "acme"`\n',
        _H + 'permit fs.read paths ["/workspace/src/**"] when `grant.tenant == "acme"`\n'
             'permit fs.read paths ["/workspace/**"]\n', 3.0,
    ),
    RuleSpec(
        "SBP342", "shadowing-checks-stopped", "logic", _N,
        "unreachable-permit checks stopped early",
        "SBP338 and SBP339 compare a permit with the rules that could cover it, and SBP337 a rule "
        "with the earlier rules of its shape; when many rules share a path prefix (or are "
        "network rules) that is every pair, and a file of thousands of them would take minutes "
        "or hours. Each check stops after 50,000 comparisons in a file and says where: the "
        "rules from there on were not checked by it.",
        "split the file, or order it so the rules that matter most come first",
        _H + 'permit "r1" fs.read paths ["/workspace/**/d1/**"]\n'
             'permit "r2" fs.read paths ["/workspace/**/d2/**"]\n'
             '# ... 316 more rules under /workspace/** (317 rules in all)\n',
        _H + 'permit "work" fs.read paths ["/workspace/**"]\n', 1.0,
    ),
    # ---- hygiene ---------------------------------------------------------------------------
    RuleSpec(
        "SBP340", "unused-import", "hygiene", _W,
        "import adds nothing",
        "An import of a file that defines no rules, defaults, consent, profiles or tools (or of "
        "a file this file already imports) only slows compilation and misleads readers.",
        "remove the import",
        _H + 'import "empty.sbpolicy"\n', _H, 1.0,
    ),
    RuleSpec(
        "SBP341", "unused-profile", "hygiene", _N,
        "profile is not referenced by any tool block",
        "A named profile no tool block of the policy refers to may still be chosen by grants or "
        "operator settings at run time, so this is a note: check that something uses it.",
        "reference it from a `tool` block (`profile \"name\"`) or remove it",
        _H + 'profile "ci" { network off }\n',
        _H + 'profile "ci" { network off }\ntool "t" version "1" {\n'
             '  permit proc.exec tool "make" args ["test"]\n  profile "ci"\n}\n', 1.0,
    ),
    # ---- suppressions ----------------------------------------------------------------------
    RuleSpec(
        "SBP345", "malformed-suppression", "suppression", _W,
        "malformed suppression comment",
        "A comment starting with `sbpolicy:` that is not `sbpolicy: ignore ID[,ID...] "
        "reason=\"...\"` suppresses nothing; it was meant to.",
        "write `# sbpolicy: ignore SBP301 reason=\"why this is fine\"`",
        _H + '# sbpolicy: ignroe SBP301\npermit net.http hosts ["*"]\n',
        _SUPPRESSED,
        2.0,
    ),
    RuleSpec(
        "SBP346", "suppression-without-reason", "suppression", _W,
        "suppression has no reason",
        "Every suppression must say why the finding is acceptable, for the reviewer and the "
        "audit trail. A suppression without `reason=\"...\"` is not honoured.",
        "add `reason=\"...\"` saying why the finding is acceptable",
        _H + '# sbpolicy: ignore SBP301\npermit net.http hosts ["*"]\n',
        _SUPPRESSED,
        2.0,
    ),
    RuleSpec(
        "SBP347", "unused-suppression", "suppression", _W,
        "suppression suppresses nothing",
        "A suppression for a finding that is no longer reported hides the next real finding of "
        "that ID on the line.",
        "remove the suppression (or the ID that no longer fires)",
        _H + '# sbpolicy: ignore SBP301 reason="old"\npermit net.http hosts ["api.github.com"]\n',
        _H + 'permit net.http hosts ["api.github.com"]\n', 2.0,
    ),
    RuleSpec(
        "SBP348", "unknown-suppression-id", "suppression", _W,
        "suppression names an unknown lint ID",
        "Only lint findings (the IDs in this catalogue) can be suppressed; a typo or a parse or "
        "check diagnostic (SBP1xx/SBP2xx) in a suppression does nothing.",
        "use an ID from docs/lint-rules.md",
        _H + '# sbpolicy: ignore SBP399 reason="typo"\npermit net.http hosts ["*"]\n',
        _SUPPRESSED,
        2.0,
    ),
)

RULES: dict[str, RuleSpec] = {r.id: r for r in CATALOGUE}
"""Every lint rule by ID, in catalogue order."""

SUPPRESSION_IDS = frozenset({"SBP345", "SBP346", "SBP347", "SBP348"})
"""Findings about suppressions themselves; they cannot be suppressed (that would hide misuse)."""

