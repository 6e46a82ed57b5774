"""The environment of a proc.exec call: shape bounds, the built-in hijack refusal, allow-lists.

A call may set an environment variable only when the policy rule that permits it lists the name
(``env ["LANG", /^LC_/]``) and every other source of the capability (grant, manifest) admits it
too. Variables that make a loader, an interpreter or a tool run code or read configuration of
the caller's choosing (``LD_PRELOAD``, ``PYTHONPATH``, ``GIT_CONFIG_PARAMETERS``, ``PATH``...) are
refused unless every allow-list names them exactly: a regex never admits one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.model import ArgAlternative, ProcCapability, Profile
from policy_engine.patterns.regex import PolicyRegex, RegexError, compile_policy_regex

MAX_ENV_VARS = 256
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_ENV_TOTAL_BYTES = 256 * 1024
"""Bounds on what a call may pass (far above any real need, far below the kernel's ARG_MAX)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

HIJACK_EXACT: frozenset[str] = frozenset({
    # shells and the dynamic loader's neighbours
    "PATH", "ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS", "CDPATH",
    "ZDOTDIR", "GLOBIGNORE", "HOME", "TMPDIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
    "GCONV_PATH", "LOCPATH", "NLSPATH", "HOSTALIASES", "RESOLV_HOST_CONF", "GLIBC_TUNABLES",
    "MALLOC_CHECK_", "TZDIR",
    # interpreters
    "NODE_OPTIONS", "NODE_PATH", "RUBYOPT", "RUBYLIB", "GEM_HOME", "GEM_PATH", "PERLLIB",
    "PHPRC", "PHP_INI_SCAN_DIR", "CLASSPATH", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS", "TCLLIBPATH", "R_PROFILE", "R_PROFILE_USER", "R_ENVIRON",
    # helpers tools start and trust stores they read
    "PAGER", "EDITOR", "VISUAL", "BROWSER", "SSH_ASKPASS", "SUDO_ASKPASS", "SSL_CERT_FILE",
    "SSL_CERT_DIR", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "CURL_HOME", "WGETRC", "NETRC",
    "LESSOPEN", "LESSCLOSE", "MANPAGER", "SYSTEMD_PAGER",
})
"""Names refused unless every allow-list names them exactly."""

HIJACK_PREFIXES: tuple[str, ...] = (
    "LD_", "DYLD_", "PYTHON", "PERL5", "PERL_", "RUBY", "NODE_", "NPM_CONFIG_", "YARN_",
    "GIT_", "BASH_FUNC_", "LUA_", "JAVA_", "CARGO_", "RUSTC", "RUSTFLAGS", "GOFLAGS", "CC",
    "CXX", "CFLAGS", "LDFLAGS", "PIP_", "UV_", "CONDA", "DOCKER_", "KUBECONFIG", "AWS_",
    "GOOGLE_APPLICATION", "SSH_",
)
"""Prefixes of such names (matched on the upper-cased name: fail closed on odd spellings)."""

_PROXY = re.compile(r"(?i)(.*_)?PROXY")


def is_hijack(name: str) -> bool:
    """Whether ``name`` can make a loader, an interpreter or a tool run something else."""
    up = name.upper()
    return (up in HIJACK_EXACT or up.startswith(HIJACK_PREFIXES)
            or _PROXY.fullmatch(name) is not None)


def check_env_shape(env: object) -> None:
    """Refuse a malformed environment: a name that is not ``[A-Za-z_][A-Za-z0-9_]*``, NUL in a
    value, or more than the bounds (``SCHEMA.VALIDATION_FAILED``)."""
    if not isinstance(env, Mapping):
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED, "env must be an object")
    if len(env) > MAX_ENV_VARS:
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                f"env has {len(env)} variables; at most {MAX_ENV_VARS}")
    total = 0
    for key, value in env.items():
        if not isinstance(key, str) or _NAME.fullmatch(key) is None:
            shown = repr(key)[:80]
            raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                    f"environment variable name {shown} is malformed")
        if not isinstance(value, str) or "\x00" in value:
            raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                    f"the value of environment variable `{key}` is malformed")
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_ENV_VALUE_BYTES:
            raise PolicyEngineError(
                ErrorCode.SCHEMA_VALIDATION_FAILED,
                f"the value of environment variable `{key}` is {size} bytes; at most "
                f"{MAX_ENV_VALUE_BYTES}")
        total += size + len(key) + 2
    if total > MAX_ENV_TOTAL_BYTES:
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                f"env is {total} bytes; at most {MAX_ENV_TOTAL_BYTES}")


@dataclass(frozen=True, slots=True)
class EnvList:
    """One allow-list: exact names and searched regexes."""

    names: frozenset[str]
    regexes: tuple[PolicyRegex, ...]  # RE2: linear in the (agent's) name

    @classmethod
    def of(cls, alts: Iterable[ArgAlternative]) -> EnvList:
        names: set[str] = set()
        regexes: list[PolicyRegex] = []
        for a in alts:
            if a.literal is not None:
                names.add(a.literal)
            elif a.regex is not None:
                try:
                    regexes.append(compile_policy_regex(a.regex))
                except RegexError:
                    continue  # a pattern that does not compile admits nothing
        return cls(frozenset(names), tuple(regexes))

    def admits(self, name: str, hijack: bool) -> bool:
        if name in self.names:
            return True
        return not hijack and any(rx.search(name) for rx in self.regexes)


@dataclass(frozen=True, slots=True)
class EnvAllow:
    """The conjunction of a capability's allow-lists; empty ``lists`` admits nothing."""

    lists: tuple[EnvList, ...]
    source: str  # names the allow-list in a refusal ("rule `x`", "the capability")

    def refusal(self, env: Mapping[str, str]) -> str | None:
        """Why ``env`` is refused (the first variable not admitted), or ``None``."""
        for name in env:
            why = self.why_not(name)
            if why is not None:
                return why
        return None

    def why_not(self, name: str) -> str | None:
        hijack = is_hijack(name)
        if not self.lists:
            return (f"environment variable `{name}` is not allowed: {self.source} has no `env` "
                    "allow-list")
        if all(lst.admits(name, hijack) for lst in self.lists):
            return None
        if hijack:
            return (f"environment variable `{name}` can hijack the loader, an interpreter or "
                    f"the tool; it is refused unless {self.source} names it exactly in `env`")
        return f"environment variable `{name}` is not in the `env` allow-list of {self.source}"


def env_allow(rule_env: tuple[ArgAlternative, ...] | None, has_policy: bool,
              members: Iterable[tuple[ArgAlternative, ...] | None], source: str) -> EnvAllow:
    """The allow-list of one profile capability.

    :param rule_env: the env list of the policy rule that permits the capability.
    :param has_policy: whether the rule is known; without a policy set (a hand-built profile)
        the capability's own lists decide, and none at all admits nothing.
    :param members: the env lists of the capability's conjunction (policy ∧ grant ∧ manifest).
    """
    lists = [EnvList.of(m) for m in members if m is not None]
    if has_policy and rule_env is None:
        lists = []
    elif has_policy and rule_env is not None:
        lists.append(EnvList.of(rule_env))
    return EnvAllow(tuple(lists), source)


def profile_env_refusal(profile: Profile, tool: str, env: Mapping[str, str]) -> str | None:
    """Why ``profile`` lets no proc.exec capability of ``tool`` set ``env``, or ``None``.

    For executors, as a second line after the guard: only the capabilities' own allow-lists
    are read (the policy rule's list is one of them after the meet), none admits nothing.
    """
    first: str | None = None
    for pc in profile.capabilities:
        procs = [c for c in pc.all_of if isinstance(c, ProcCapability)]
        if str(pc.kind) != "proc.exec" or not procs or any(c.tool != tool for c in procs):
            continue
        why = env_allow(None, False, (c.env for c in procs), "the profile").refusal(env)
        if why is None:
            return None
        first = first or why
    return first or f"no proc.exec capability of `{tool}` allows environment variables"
