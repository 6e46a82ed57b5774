"""macOS ``sandbox-exec`` profiles (SBPL) generated from a compiled Profile (seed 003, macOS).

The profile starts closed (``(deny default)``), opens what a process needs to start
(``sbpl_base``), the system trees read-only, the profile's ``fs.read``/``fs.list`` globs for
reading and its ``fs.write`` globs for reading and writing, and the network as the profile's
mode says. Then come the denies: in SBPL the *last* matching rule wins, so every deny is written
after every allow and a blacklisted path inside a whitelisted tree stays closed (seed 003 test 3).
Denies over-approximate, allows under-approximate the engine's globs (``sbpl_glob``); a deny
is also written under its literal prefix resolved through symlinks on this host (a symlinked
HOME), and ``/System/Volumes`` (the data volume behind the firmlinks) is closed after the
system trees.

Denies: a mandatory forbid, and any forbid of ``fs.read`` (with or without a ``when``: the
sandbox cannot evaluate conditions per file access, as the Linux sandboxes), close read and
write; a forbid of ``fs.write`` alone closes writing; of ``fs.list`` alone, reading directories.
Host control sockets are never connectable (``sbpl_base.UNIX_SOCKET_DENY``).

Network: ``off`` → ``(deny network*)``. ``on`` → IP sockets in and out, DNS through
mDNSResponder. ``restricted`` → only ``localhost:<proxy_port>`` (the policy proxy) when a port is
given, else nothing at all: stricter than asked, never looser.

The output is deterministic (sorted, deduplicated) so golden files stay stable.
"""

from __future__ import annotations

import os
import string
from collections.abc import Callable, Iterable, Sequence

from policy_engine.model import CapabilityKind, FsCapability, NetworkMode, Profile
from policy_engine.patterns.paths import expand_home, literal_prefix, resolved_form
from policy_engine.sandbox import sbpl_base as base
from policy_engine.sandbox.sbpl_glob import (
    SbplPathError,
    all_of,
    any_of,
    check_path,
    glob_to_regex,
    path_filters,
    resolved_forms,
)

__all__ = ["SbplPathError", "render_sbpl"]

Resolver = Callable[[str], str]
READ = "file-read*"
WRITE = "file-write*"


def _form(head: str, filters: Iterable[str]) -> str:
    """``(head f1 f2 …)``, one filter per line, sorted and deduplicated."""
    items = sorted(set(filters))
    if not items:
        return f"; ({head}: none)"
    if len(items) == 1 and len(head) + len(items[0]) < 90:
        return f"({head} {items[0]})"
    return f"({head}\n" + "\n".join(f"  {f}" for f in items) + ")"


def _globs(patterns: Iterable[str], home: str) -> list[str]:
    out: list[str] = []
    for p in patterns:
        out += path_filters(expand_home(p, home))
    return out


def _resolved(pattern: str, resolve: Resolver | None) -> list[str]:
    """``pattern`` and, when its literal prefix runs through a symlink (a symlinked HOME or
    ``~/.config``), the same glob under the resolved prefix: macOS checks resolved paths."""
    form = resolved_form(pattern, resolve) if resolve is not None else None
    return [pattern] if form is None else [pattern, form]


def _deny_globs(patterns: Iterable[str], home: str, resolve: Resolver | None) -> list[str]:
    """Deny filters: each pattern as written and resolved, every spelling of the same files."""
    out: list[str] = []
    for p in patterns:
        for form in _resolved(expand_home(p, home), resolve):
            out += path_filters(form, deny=True)
    return out


def _ancestors(patterns: Iterable[str], home: str) -> list[str]:
    """Strict ancestors of every literal prefix: ``stat`` on them lets a process resolve its
    paths (``getcwd``, ``realpath``) without reading any directory's entries."""
    out: set[str] = set()
    for p in patterns:
        for form in resolved_forms(expand_home(p, home)):
            prefix = literal_prefix(form[:-3] if form.endswith("/**") else form)
            segs = [s for s in prefix.split("/") if s]
            out.update("/" + "/".join(segs[:i]) for i in range(len(segs)))
    for a in out:
        check_path(a)
    return [f'(literal "{a}")' for a in out]


def _beneath(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root + "/")


def _capability_filter(members: Sequence[FsCapability], home: str, root: str) -> str:
    """A conjunction (``all_of``) as ``require-all``, clamped to ``root_fs`` as the Linux
    sandboxes clamp their binds."""
    parts = [any_of(_globs(m.paths, home)) for m in members]
    inside = any(all(_beneath(literal_prefix(expand_home(p, home)), root) for p in m.paths)
                 for m in members)
    if not inside:  # some member reaches outside root_fs: clamp
        parts.append(any_of(path_filters(root.rstrip("/") + "/**")))
    return all_of(parts)


def _allows(profile: Profile, home: str) -> tuple[list[str], list[str], list[str]]:
    """(read filters, read-write filters, patterns whose ancestors need ``stat``)."""
    root = profile.mappings.root_fs.rstrip("/") or "/"
    reads: list[str] = []
    writes: list[str] = []
    seen: list[str] = []
    for pc in profile.capabilities:
        if pc.kind not in (CapabilityKind.FS_READ, CapabilityKind.FS_LIST,
                           CapabilityKind.FS_WRITE):
            continue
        members = [c for c in pc.all_of if isinstance(c, FsCapability)]
        if not members:
            continue
        (writes if pc.kind == CapabilityKind.FS_WRITE else reads).append(
            _capability_filter(members, home, root))
        seen += [p for m in members for p in m.paths]
    return reads, writes, seen


def _denies(profile: Profile, home: str,
            resolve: Resolver | None) -> tuple[list[str], list[str], list[str]]:
    """(read-and-write, write-only, directory-listing) deny filters; conditions are ignored:
    a deny the sandbox cannot evaluate per access applies always."""
    # the profile's deny-list summary too: it only ever repeats or narrows the forbids
    both = _deny_globs([*base.MACOS_DENY, *profile.deny.paths], home, resolve)
    write_only: list[str] = []
    listing: list[str] = []
    for deny in profile.denies:
        cap = deny.capability
        if not isinstance(cap, FsCapability):
            continue
        filters = _deny_globs(cap.paths, home, resolve)
        if deny.mandatory or CapabilityKind.FS_READ in deny.kinds:
            both += filters
        elif CapabilityKind.FS_WRITE in deny.kinds:
            write_only += filters
        elif CapabilityKind.FS_LIST in deny.kinds:
            listing += filters
    return both, write_only, listing


def _network(profile: Profile, proxy_port: int | None) -> list[str]:
    mode = profile.network
    if mode == NetworkMode.ON:
        return ["; network on: IP sockets in and out, DNS through the resolver",
                '(allow network-outbound (remote ip "*:*"))',
                '(allow network-inbound (local ip "*:*"))',
                '(allow network-bind (local ip "*:*"))',
                _form("allow mach-lookup",
                      (f'(global-name "{s}")' for s in base.NETWORK_MACH_SERVICES))]
    if mode == NetworkMode.RESTRICTED and proxy_port is not None:
        if isinstance(proxy_port, bool) or not isinstance(proxy_port, int) \
                or not 0 < proxy_port < 65536:
            raise ValueError(f"proxy_port must be a TCP port (1-65535), not {proxy_port!r}")
        return ["; restricted: the policy proxy on loopback, nothing else",
                f'(allow network-outbound (remote ip "localhost:{proxy_port}"))']
    why = ("; restricted without a proxy port: no network at all (stricter, never looser)"
           if mode == NetworkMode.RESTRICTED else "; network off")
    return [why, "(deny network*)"]


def _safe_comment(text: str) -> str:
    """Only hex digits reach a comment: a newline there would start a new form."""
    return "".join(c for c in text if c in string.hexdigits)


def render_sbpl(profile: Profile, *, tmpdir: str | None = None, extra_read: Sequence[str] = (),
                proxy_port: int | None = None,
                resolve: Resolver | None = os.path.realpath) -> str:
    """The SBPL text enforcing ``profile`` under ``sandbox-exec -p``.

    :param tmpdir: a private scratch directory the process may read and write (``TMPDIR``).
    :param extra_read: more trees to expose read-only (e.g. ``/opt/homebrew/**``).
    :param proxy_port: with network ``restricted``, the loopback port of the policy proxy.
    :param resolve: how a deny's literal prefix is resolved through symlinks on this host
        (``os.path.realpath``); ``None`` renders the text alone, the same on every host (goldens).
    :raises SbplPathError: a path holds a quote, backslash or control character (``SBPL001``).
    """
    home = profile.mappings.home
    check_path(expand_home("~", home))
    reads, writes, seen = _allows(profile, home)
    scratch = [tmpdir.rstrip("/") + "/**"] if tmpdir else []
    both, write_only, listing = _denies(profile, home, resolve)
    system = [*base.SYSTEM_READ, *extra_read]
    out = [
        "(version 1)",
        f"; policy-engine: generated from profile {_safe_comment(profile.profile_hash)[:64]}"
        .rstrip(),
        "; last matching rule wins: every deny below follows every allow",
        "(deny default)",
        "",
        "; processes (children inherit this profile)",
        *base.PROCESS_RULES,
        _form("allow sysctl-read", [*(f'(sysctl-name "{n}")' for n in base.SYSCTLS),
                                    *(f'(sysctl-name-prefix "{n}")'
                                      for n in base.SYSCTL_PREFIXES)]),
        _form("allow mach-lookup", (f'(global-name "{s}")' for s in base.MACH_SERVICES)),
        "",
        "; system trees, read-only",
        _form(f"allow {READ}", _globs(system, home)),
        "; /System/Volumes holds the data volume (every user's files), swap and update volumes",
        _form(f"deny {READ} {WRITE}", (f'(regex #"{glob_to_regex(p, deny=True)}")'
                                       for p in base.SYSTEM_VOLUMES_DENY)),
        _form(f"allow {READ}", _globs(base.SYSTEM_VOLUMES_READ, home)),
        _form("allow file-write-data", _globs(base.DEVICE_WRITE, home)),
        _form("allow file-read-metadata",
              _ancestors([*seen, *scratch, *system, *base.SYSTEM_VOLUMES_READ], home)),
        "",
        "; the profile's fs.read and fs.list",
        _form(f"allow {READ}", reads),
        "; the profile's fs.write",
        _form(f"allow {READ} {WRITE}", writes),
        "; private scratch directory",
        _form(f"allow {READ} {WRITE}", _globs(scratch, home)),
        "",
        *_network(profile, proxy_port),
        "",
        "; denies: forbids of fs.write",
        _form(f"deny {WRITE}", write_only),
        "; denies: forbids of fs.list",
        _form("deny file-read-data", (f"(require-all (vnode-type DIRECTORY) {f})"
                                      for f in listing)),
        "; denies: mandatory (seed 003 blacklist, macOS secrets) and forbids of fs.read",
        _form(f"deny {READ} {WRITE}", both),
        base.UNIX_SOCKET_DENY,
    ]
    if profile.network == NetworkMode.ON:
        out += ["; the resolver's socket, the one exception (network on)",
                f'(allow network-outbound (remote unix-socket (path-literal "{base.DNS_SOCKET}")))']
    return "\n".join(out) + "\n"
