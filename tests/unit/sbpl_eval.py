"""Reads generated SBPL with a real S-expression parser (sexpdata): a structure check, and an
evaluator of its file and network rules (last matching rule wins, default deny) for the tests.

The evaluator implements the SBPL subset the renderer emits, with Apple's documented
semantics: ``literal`` is one path, ``subpath`` the path and everything beneath it (segment-
bounded), ``regex`` a POSIX ERE on the whole path (ours are anchored ``^…$``), ``require-any``
/ ``require-all`` / ``require-not`` the logic, ``vnode-type`` the file type. ``file-read*``
covers every ``file-read-…`` operation, ``file-write*`` every ``file-write-…``, ``network*``
every ``network-…``.

Paths are matched as the kernel hands them to the sandbox: UTF-8 **bytes** (C strings). A
regex's ``[^/]`` is one byte there, not one character (``ä`` is two), so the evaluator encodes
both sides and matches bytes; a test on ``str`` would hide that difference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import sexpdata
from sexpdata import Symbol

OPERATIONS = frozenset({
    "default", "process-exec", "process-fork", "signal", "process-info*",
    "user-preference-read", "ipc-posix-sem", "pseudo-tty", "sysctl-read", "mach-lookup",
    "file-read*", "file-write*", "file-read-data", "file-read-metadata", "file-write-data",
    "network*", "network-outbound", "network-inbound", "network-bind",
})
FILTERS = frozenset({
    "literal", "subpath", "regex", "require-any", "require-all", "require-not", "vnode-type",
    "target", "sysctl-name", "sysctl-name-prefix", "global-name", "remote", "local",
    "path-literal",
})
VNODE_TYPES = frozenset({"DIRECTORY", "REGULAR-FILE", "CHARACTER-DEVICE"})


def parse(text: str) -> list[Any]:
    """Every top-level form; raises on unbalanced parentheses or an unterminated string."""
    forms = sexpdata.loads("(" + text + "\n)", nil=None, true=None)
    assert isinstance(forms, list)
    return forms


def _name(x: Any) -> str | None:
    return x.value() if isinstance(x, Symbol) else None


def check_filter(f: Any, where: str) -> None:
    assert isinstance(f, list), f"{where}: a filter must be a list, got {f!r}"
    assert f, f"{where}: an empty filter"
    head = _name(f[0])
    assert head in FILTERS, f"{where}: unknown filter {f[0]!r}"
    args = f[1:]
    if head in ("literal", "subpath", "path-literal", "sysctl-name", "sysctl-name-prefix",
                "global-name"):
        assert len(args) == 1, f"{where}: ({head} \"…\") expected"
        assert isinstance(args[0], str), f"{where}: ({head} \"…\") expected"
        assert not any(c in args[0] for c in '"\\\n\r\x00'), f"{where}: unsafe string {args!r}"
        if head in ("literal", "subpath", "path-literal"):
            assert args[0].startswith("/"), f"{where}: path not absolute: {args[0]!r}"
    elif head == "regex":
        assert len(args) == 2, f"{where}: (regex #\"…\") expected, got {f!r}"
        assert _name(args[0]) == "#", f"{where}: (regex #\"…\") expected, got {f!r}"
        assert isinstance(args[1], str), f"{where}: (regex #\"…\") expected, got {f!r}"
        rx = args[1]
        assert rx.startswith("^"), f"{where}: unanchored regex {rx!r}"
        assert rx.endswith("$"), f"{where}: unanchored regex {rx!r}"
        assert not any(c in rx for c in '\n"'), f"{where}: unsafe regex {rx!r}"
        re.compile(rx)
    elif head in ("require-any", "require-all"):
        assert len(args) >= 2, f"{where}: ({head}) of fewer than two filters"
        for a in args:
            check_filter(a, where)
    elif head == "require-not":
        assert len(args) == 1, f"{where}: (require-not) takes one filter"
        check_filter(args[0], where)
    elif head == "vnode-type":
        assert [_name(a) in VNODE_TYPES for a in args] == [True], f"{where}: vnode {args!r}"
    elif head == "target":
        assert [_name(a) for a in args] == ["same-sandbox"], f"{where}: target {args!r}"
    else:  # remote / local: (remote ip "host:port") or (remote unix-socket [filter])
        kind = _name(args[0]) if args else None
        assert kind in ("ip", "unix-socket"), f"{where}: ({head} {args!r})"
        if kind == "ip":
            assert len(args) == 2
            assert isinstance(args[1], str)
            assert ":" in args[1]
        for a in args[1:] if kind == "unix-socket" else ():
            check_filter(a, where)


def check_structure(text: str) -> list[Any]:
    """Parse ``text`` and check every form; returns the forms."""
    forms = parse(text)
    assert forms[:1] == [[Symbol("version"), 1]], "the profile must start (version 1)"
    for i, form in enumerate(forms[1:], start=2):
        where = f"form {i}"
        assert isinstance(form, list), f"{where}: {form!r} is not a list"
        assert form, f"{where}: an empty form"
        action = _name(form[0])
        assert action in ("allow", "deny"), f"{where}: unknown head {form[0]!r}"
        ops = [x for x in form[1:] if isinstance(x, Symbol)]
        rest = form[1 + len(ops):]
        assert ops, f"{where}: no operation"
        assert all(_name(o) in OPERATIONS for o in ops), f"{where}: unknown operation {ops!r}"
        for f in rest:
            check_filter(f, where)
    return forms


@dataclass(frozen=True)
class Access:
    """One operation to decide: ``op`` on ``path`` (a resolved path) or a socket address."""

    op: str
    path: str = ""
    vnode: str = "REGULAR-FILE"
    remote: tuple[str, str] | None = None  # ("ip", "host:port") or ("unix-socket", path)


def _covers(rule_op: str, op: str) -> bool:
    return rule_op == op or (rule_op.endswith("*") and op.startswith(rule_op[:-1]))


def _matches(f: list[Any], acc: Access) -> bool:
    head, args = _name(f[0]), f[1:]
    path = acc.path.encode("utf-8", "surrogateescape")
    if head == "literal":
        return path == args[0].encode()
    if head == "subpath":
        root = args[0].rstrip("/").encode()
        return root == b"" or path == root or path.startswith(root + b"/")
    if head == "regex":  # ERE `$` is the end of the string, never "before a last newline"
        return re.fullmatch(args[1][1:-1].encode(), path) is not None
    if head == "require-any":
        return any(_matches(a, acc) for a in args)
    if head == "require-all":
        return all(_matches(a, acc) for a in args)
    if head == "require-not":
        return not _matches(args[0], acc)
    if head == "vnode-type":
        return acc.vnode == _name(args[0])
    if head in ("remote", "local"):
        if acc.remote is None or _name(args[0]) != acc.remote[0]:
            return False
        if acc.remote[0] == "ip":
            host, port = args[1].rsplit(":", 1)
            got_host, got_port = acc.remote[1].rsplit(":", 1)
            return host in ("*", got_host) and port in ("*", got_port)
        return all(_matches(a, Access(acc.op, acc.remote[1])) for a in args[1:])
    if head == "path-literal":
        return acc.path == args[0]
    return False  # sysctl/mach/target filters never match a file or socket access


def decide(forms: list[Any], acc: Access) -> bool:
    """Whether ``acc`` is allowed: the last rule whose operation and filters match wins."""
    allowed = False
    for form in forms[1:]:
        action = _name(form[0])
        ops = [_name(x) for x in form[1:] if isinstance(x, Symbol)]
        filters = form[1 + len(ops):]
        if "default" in ops:
            allowed = action == "allow"
            continue
        if not any(o is not None and _covers(o, acc.op) for o in ops):
            continue
        if not filters or any(_matches(f, acc) for f in filters):
            allowed = action == "allow"
    return allowed
