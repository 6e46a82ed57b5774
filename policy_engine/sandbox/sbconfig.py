"""The seed 003 `sandbox.json`: where it is, reading it strictly, and merging it with the defaults.

A missing file means the built-in defaults. A file with any problem (bad JSON, a duplicate or
unknown key, a wrong type, an entry that cannot be expanded or would open too much) is ignored
as a whole: the strict defaults apply and every problem is reported as a diagnostic at
``file:line:col`` (seed 003 test 14: "degrade to the default configuration"). Nothing in a file
can lift the default blacklist, the engine's built-in mandatory denies, or turn the sandbox's
network on. Entries are expanded here (``~``, ``$VAR``, ``${VAR}``: ``sbexpand.py``), so the
policy generated from the result (``sbpolicy_gen.py``) holds only absolute paths.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policy_engine.dsl.loaders import PositionLookup, parse_document
from policy_engine.dsl.parser import read_source
from policy_engine.errors import Diagnostic, DiagnosticsError
from policy_engine.sandbox.sbexpand import (
    ExpandError,
    blacklist_entry,
    usable_home,
    whitelist_entry,
)

ENV_CONFIG = "POLICY_ENGINE_SANDBOX_CONFIG"
ENV_ENABLED = "POLICY_ENGINE_SANDBOX_ENABLED"
SEED_ENV = ("SYNAPSE_SANDBOX_CONFIG", "SYNAPSE_SANDBOX_ENABLED")
"""The seed's names: never read (one name per setting), but reported when set."""

MAX_CONFIG_BYTES = 256 * 1024
MAX_ENTRIES = 256
MAX_ENTRY_CHARS = 4096

DEFAULT_BLACKLIST: tuple[str, ...] = (
    "~/.ssh", "~/.aws", "~/.gnupg", "~/.config/gcloud", "~/.azure", "/etc/passwd",
    "/etc/shadow", "**/.env", "**/.envrc", "**/.env.local", "**/credentials.json",
    "**/secrets.json",
)
"""Seed 003 ``DEFAULT_CONFIG.filesystem.blacklist``, as written there; always part of the merge."""
ENGINE_BLACKLIST: tuple[str, ...] = (
    "~/.netrc", "~/.git-credentials", "~/.docker", "~/.kube", "~/.npmrc", "~/.pypirc",
    "~/.config/gh", "~/.password-store", "~/.local/share/keyrings",
    # round-3 attack F15: more stores that hold plain tokens or passwords
    "~/.vault-token", "~/.pgpass", "~/.cargo/credentials", "~/.cargo/credentials.toml",
    "~/.terraform.d", "~/.config/rclone", "~/.s3cfg", "~/.boto",
    "~/.config/containers/auth.json", "~/.gem/credentials", "~/.config/hub",
    "~/.m2/settings.xml", "~/.m2/settings-security.xml", "~/.my.cnf", "~/.mylogin.cnf",
    "~/.config/composer/auth.json", "~/.composer/auth.json", "~/.oci", "~/.config/doctl",
)
"""Credential stores the seed's list misses, added by this engine (only ever stricter): with
``allowReadOutside`` the rest of the home directory is readable, and these hold plain tokens."""

_TOP = {"enabled": bool, "filesystem": dict, "network": dict}
_FILESYSTEM = {"whitelist": list, "blacklist": list, "allowReadOutside": bool}
_NETWORK = {"allowNetwork": bool}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class Entry:
    """One whitelist or blacklist path: as written, as expanded, and where it came from."""

    written: str
    path: str
    origin: str

    def to_json(self) -> dict[str, str]:
        return {"written": self.written, "path": self.path, "origin": self.origin}


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    """The merged configuration (seed 003 ``SandboxConfig``); ``allow_network`` is always
    ``False``: ``network_requested`` keeps what a file asked for, so it can be reported."""

    enabled: bool = True
    whitelist: tuple[Entry, ...] = ()
    blacklist: tuple[Entry, ...] = ()
    allow_read_outside: bool = False
    allow_network: bool = False
    network_requested: bool = False
    enabled_origin: str = "default"


@dataclass(frozen=True, slots=True)
class LoadedSandboxConfig:
    """What loading found: the configuration in force and how it came to be.

    :param path: the file looked for (``None`` only when no location could be formed).
    :param located_by: ``--config``, the environment variable, or the default location.
    :param fallback: the file exists but was refused: the strict defaults are in force.
    :param problems: why it was refused (errors, each at ``file:line:col``).
    :param notes: warnings that changed nothing unsafe (``allowNetwork`` ignored, ...).
    """

    config: SandboxConfig
    path: str | None
    located_by: str
    found: bool
    digest: str | None = None
    fallback: bool = False
    problems: tuple[Diagnostic, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {
            "file": self.path, "located_by": self.located_by, "found": self.found,
            "sha256": self.digest, "fallback_to_defaults": self.fallback,
            "problems": [d.to_json() for d in self.problems], "notes": list(self.notes),
            "enabled": c.enabled, "enabled_from": c.enabled_origin,
            "filesystem": {"whitelist": [e.to_json() for e in c.whitelist],
                           "blacklist": [e.to_json() for e in c.blacklist],
                           "allowReadOutside": c.allow_read_outside},
            "network": {"allowNetwork": c.allow_network, "requested": c.network_requested},
        }


def config_location(env: Mapping[str, str]) -> tuple[str | None, str]:
    """The file to read and what located it: ``$POLICY_ENGINE_SANDBOX_CONFIG``, else
    ``$XDG_CONFIG_HOME/policy-engine/sandbox.json``, else ``~/.config/policy-engine/…``."""
    named = env.get(ENV_CONFIG)
    if named:
        return named, f"${ENV_CONFIG}"
    xdg = env.get("XDG_CONFIG_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative value is invalid, ignore it
        return os.path.join(xdg, "policy-engine", "sandbox.json"), "$XDG_CONFIG_HOME"
    home = env.get("HOME")
    if home and os.path.isabs(home):
        return os.path.join(home, ".config", "policy-engine", "sandbox.json"), "default location"
    return None, "default location"


def defaults(home: str) -> SandboxConfig:
    """The strict defaults: the seed's blacklist and the engine's additions, nothing
    whitelisted (the cwd is added per run), no reading outside, no network."""
    blacklist = tuple(Entry(w, blacklist_entry(w, {"HOME": home}), origin)
                      for entries, origin in ((DEFAULT_BLACKLIST, "default (seed 003)"),
                                              (ENGINE_BLACKLIST, "default (policy-engine)"))
                      for w in entries)
    return SandboxConfig(blacklist=blacklist)


def load_sandbox_config(path: str | os.PathLike[str] | None = None, *,
                        env: Mapping[str, str] | None = None) -> LoadedSandboxConfig:
    """Locate, read, validate and merge the sandbox configuration; never raises for bad input.

    :param path: an explicit file (``--config``); otherwise :func:`config_location`.
    :param env: the environment to read variables from (default ``os.environ``): the location,
        ``POLICY_ENGINE_SANDBOX_ENABLED``, ``HOME`` for ``~`` and every ``$VAR`` of an entry.
    """
    env = dict(os.environ if env is None else env)
    home, bad_home = usable_home(env)
    env["HOME"] = home
    notes = [f"`{name}` is set but not read: this engine reads `{ours}`"
             for name, ours in zip(SEED_ENV, (ENV_CONFIG, ENV_ENABLED), strict=True)
             if env.get(name) is not None]
    notes += [bad_home] if bad_home else []
    if path is not None:
        shown, located_by = os.fspath(path), "--config"
    else:
        located, located_by = config_location(env)
        if located is None:
            return _finish(defaults(home), None, located_by, False, None, [], notes, env)
        shown = located
    if not os.path.lexists(shown):
        return _finish(defaults(home), shown, located_by, False, None, [], notes, env)
    text = read_source(shown, shown, max_bytes=MAX_CONFIG_BYTES)
    if isinstance(text, Diagnostic):
        return _finish(defaults(home), shown, located_by, True, None, [text], notes, env)
    digest = hashlib.sha256(text.encode()).hexdigest()
    try:
        merged, more = parse_sandbox_text(text, shown, env)
    except DiagnosticsError as exc:
        return _finish(defaults(home), shown, located_by, True, digest, exc.diagnostics, notes,
                       env)
    return _finish(merged, shown, located_by, True, digest, [], notes + more, env)


def _finish(config: SandboxConfig, path: str | None, located_by: str, found: bool,
            digest: str | None, problems: Sequence[Diagnostic], notes: list[str],
            env: Mapping[str, str]) -> LoadedSandboxConfig:
    """Apply ``POLICY_ENGINE_SANDBOX_ENABLED`` last: the environment outranks the file."""
    raw = env.get(ENV_ENABLED)
    if raw is not None:
        value = raw.strip().lower()
        if value in _TRUE or value in _FALSE:
            config = _replace_enabled(config, value in _TRUE, f"${ENV_ENABLED}")
        else:  # an unreadable switch keeps the sandbox on
            notes.append(f"`{ENV_ENABLED}={raw}` is not a boolean (use 1/0, true/false); the "
                         "sandbox stays enabled")
    if config.network_requested:
        notes.append("`network.allowNetwork: true` is ignored: the sandbox never has network "
                     "(use the engine's `net.http` operation or an MCP tool outside it)")
    return LoadedSandboxConfig(config, path, located_by, found, digest,
                               fallback=bool(problems), problems=tuple(problems),
                               notes=tuple(notes))


def _replace_enabled(config: SandboxConfig, enabled: bool, origin: str) -> SandboxConfig:
    return SandboxConfig(enabled, config.whitelist, config.blacklist, config.allow_read_outside,
                         False, config.network_requested, origin)


def parse_sandbox_text(text: str, shown: str,
                       env: Mapping[str, str]) -> tuple[SandboxConfig, list[str]]:
    """Validate one file's text and merge it with the defaults.

    :raises DiagnosticsError: every problem found (not just the first), each with its span.
    """
    data, lookup = parse_document(text, shown)
    home = env.get("HOME", "")
    problems: list[Diagnostic] = []
    notes: list[str] = []
    if not isinstance(data, dict):
        raise DiagnosticsError([_diag("the sandbox config must be a JSON object", lookup, ())])
    _check_keys(data, _TOP, (), lookup, problems)
    fs_raw, net_raw = data.get("filesystem"), data.get("network")
    fs: dict[str, Any] = fs_raw if isinstance(fs_raw, dict) else {}
    net: dict[str, Any] = net_raw if isinstance(net_raw, dict) else {}
    _check_keys(fs, _FILESYSTEM, ("filesystem",), lookup, problems)
    _check_keys(net, _NETWORK, ("network",), lookup, problems)
    base = defaults(home)
    white = _entries(fs.get("whitelist"), "whitelist", whitelist_entry, env, lookup, problems)
    black = _entries(fs.get("blacklist"), "blacklist", blacklist_entry, env, lookup, problems)
    if problems:  # in file order, as `check` prints them
        problems.sort(key=lambda d: (d.span.line, d.span.column) if d.span else (0, 0))
        raise DiagnosticsError(problems)
    enabled = data.get("enabled")
    read_out = fs.get("allowReadOutside")
    requested = net.get("allowNetwork") is True
    known = {e.path for e in base.blacklist}
    merged = SandboxConfig(
        enabled=True if enabled is None else bool(enabled),
        whitelist=tuple(dict((e.path, e) for e in white).values()),
        blacklist=base.blacklist + tuple(e for e in black if e.path not in known),
        allow_read_outside=bool(read_out), allow_network=False, network_requested=requested,
        enabled_origin="default" if enabled is None else str(lookup.span(("enabled",))),
    )
    return merged, notes


def _diag(message: str, lookup: PositionLookup, loc: tuple[str | int, ...],
          help: str | None = None) -> Diagnostic:
    return Diagnostic.make("SBP105", message, lookup.span(loc), help=help or (
        "see docs/sandbox-config.md; until the file is fixed the strict defaults apply"))


def _check_keys(data: Mapping[str, Any], schema: Mapping[str, type],
                where: tuple[str, ...], lookup: PositionLookup,
                problems: list[Diagnostic]) -> None:
    """Unknown keys (with a did-you-mean) and values of the wrong JSON type."""
    prefix = ".".join(where) + "." if where else ""
    for key, value in data.items():
        if key not in schema:
            close = difflib.get_close_matches(str(key), list(schema), n=1)
            problems.append(_diag(
                f"unknown key `{prefix}{key}`", lookup, (*where, key),
                help=(f"did you mean `{close[0]}`? " if close else "")
                + f"the keys here are {', '.join(f'`{k}`' for k in schema)}"))
            continue
        want = schema[key]
        ok = isinstance(value, want) and not (want is not bool and isinstance(value, bool))
        if not ok:
            problems.append(_diag(
                f"`{prefix}{key}` must be {_TYPE_NAMES[want]}, not {_json_type(value)}",
                lookup, (*where, key)))


_TYPE_NAMES: Mapping[type, str] = {bool: "true or false", dict: "an object",
                                   list: "a list of path strings"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _entries(value: Any, name: str, expand: Callable[[str, Mapping[str, str]], str],
             env: Mapping[str, str],
             lookup: PositionLookup, problems: list[Diagnostic]) -> list[Entry]:
    """Expand each entry of ``filesystem.<name>``; each bad one is a problem at its place."""
    if not isinstance(value, list):
        return []
    if len(value) > MAX_ENTRIES:
        problems.append(_diag(f"`filesystem.{name}` has {len(value)} entries, at most "
                              f"{MAX_ENTRIES} are read", lookup, ("filesystem", name),
                              help="list parent directories instead of every file"))
        return []
    out: list[Entry] = []
    for i, item in enumerate(value):
        loc = ("filesystem", name, i)
        if not isinstance(item, str):
            problems.append(_diag(f"`filesystem.{name}[{i}]` must be a path string, not "
                                  f"{_json_type(item)}", lookup, loc))
            continue
        if len(item) > MAX_ENTRY_CHARS:
            problems.append(_diag(f"`filesystem.{name}[{i}]` is {len(item)} characters long, "
                                  f"at most {MAX_ENTRY_CHARS}", lookup, loc))
            continue
        try:
            out.append(Entry(item, expand(item, env), str(lookup.span(loc))))
        except ExpandError as exc:
            problems.append(_diag(f"`filesystem.{name}[{i}]` {exc.message}", lookup, loc,
                                  help=exc.help))
    return out


def check_sandbox_file(path: str, env: Mapping[str, str] | None = None) -> list[Diagnostic]:
    """The diagnostics of one sandbox config file (``policy-engine sandbox check``)."""
    loaded = load_sandbox_config(path, env=env)
    if not loaded.found:
        return [Diagnostic.make("SBP100", f"`{path}` does not exist", None)]
    return list(loaded.problems)


def describe_problem(d: Diagnostic) -> str:
    """One line for stderr and logs: ``file:line:col: SBP105 message (help)``."""
    where = f"{d.span}: " if d.span is not None else ""
    return f"{where}{d.id} {d.message}" + (f" ({d.help})" if d.help else "")

