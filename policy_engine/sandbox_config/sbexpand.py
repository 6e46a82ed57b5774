"""Expanding and vetting one `sandbox.json` path entry: `~`, `$VAR`/`${VAR}`, then the checks.

Both lists fail closed: an undefined or empty variable, a `~user`, a relative or `..` path makes
the entry (and so the whole file) invalid rather than silently shorter or broader. A whitelist
entry is a literal directory the sandbox may write; it may not be `/`, a system tree, the home
directory or one of its ancestors (a writable home lets a command rewrite `~/.bashrc`, run at
the next login), nor reach a secret through a symlink. A blacklist entry is a glob and only
ever adds a deny: a leading `!` (gitignore's negation) is refused, not read as a path.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Mapping

from policy_engine.compiler.builtins import MANDATORY_DENY_PATHS
from policy_engine.patterns.paths import expand_home, literal_prefix, validate_glob
from policy_engine.sandbox.enginedirs import protected_trees, shared_root_refusal, tree_refusal
from policy_engine.sandbox.masks import beneath

_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

SYSTEM_TREES: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
                                 "/etc", "/boot", "/proc", "/sys", "/dev", "/run", "/var/run",
                                 "/var/lib", "/var/log", "/var/spool", "/var/mail", "/snap")
"""Trees a whitelist entry may neither be, lie beneath, nor contain (``/`` and ``/var`` contain
several): the host's programs, its configuration and the kernel's filesystems."""
MAX_PATH_CHARS = 4096  # PATH_MAX: a longer path names nothing the kernel would open
_SECRETS = tuple(p for p in MANDATORY_DENY_PATHS if not p.startswith("**"))


def usable_home(env: Mapping[str, str]) -> tuple[str, str | None]:
    """``$HOME`` when it is an absolute path, else the account's home directory and a note:
    ``~`` and the ``~/.ssh``-style denies must expand to a real place, never fail or go
    relative."""
    home = env.get("HOME", "")
    if home and os.path.isabs(home) and not _CONTROL.search(home):
        return _normalize(home), None
    try:
        account = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        account = "/"
    return account, (f"`HOME={home}` is not an absolute path; `~` is `{account}` "
                     "(the account's home directory)")


class ExpandError(Exception):
    """Why an entry was refused; ``message`` continues "`filesystem.whitelist[0]` ..."."""

    def __init__(self, message: str, help: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.help = help


def expand(written: str, env: Mapping[str, str]) -> str:
    """``~`` (alone or before ``/``) to ``$HOME``, then ``$VAR``/``${VAR}`` from ``env``.

    A variable's value is inserted as it is (never expanded again); a ``$`` that starts no
    variable name is refused, as is a variable that is unset or empty (``$PROJECT/build`` with
    an empty ``PROJECT`` would be ``/build``).
    """
    if _CONTROL.search(written):
        raise ExpandError("contains a control character (NUL, newline, ...)")
    text = written
    if text == "~" or text.startswith("~/"):
        home = env.get("HOME", "")
        if not home or not os.path.isabs(home):
            raise ExpandError("starts with `~` but `HOME` is unset or not absolute")
        text = home.rstrip("/") + text[1:] if text != "~" else home
    elif text.startswith("~"):
        raise ExpandError(f"uses `{text.split('/')[0]}`: only `~` (your own home) is expanded",
                          help="write the absolute path of the other user's directory")
    out: list[str] = []
    pos = 0
    for m in _VAR.finditer(text):
        if "$" in text[pos:m.start()]:
            break
        name = m.group(1) or m.group(2)
        value = env.get(name)
        if value is None:
            raise ExpandError(f"uses `${name}`, which is not set",
                              help=f"set `{name}` or write the path out; an unset variable "
                                   "never silently shortens a path")
        if value == "":
            raise ExpandError(f"uses `${name}`, which is empty",
                              help=f"set `{name}` to a directory or write the path out")
        out += [text[pos:m.start()], value]
        pos = m.end()
    rest = text[pos:]
    if "$" in rest:
        raise ExpandError("has a `$` that starts no variable",
                          help="write `$NAME` or `${NAME}` (letters, digits, `_`); a literal "
                               "`$` in a path is not supported")
    result = "".join(out) + rest
    if len(result) > MAX_PATH_CHARS:
        raise ExpandError(f"expands to {len(result)} characters, at most {MAX_PATH_CHARS}")
    if _CONTROL.search(result):
        raise ExpandError("expands to a path with a control character (from a variable)")
    return result


def _normalize(path: str) -> str:
    while "//" in path:
        path = path.replace("//", "/")
    return path.rstrip("/") or "/"


def _shown(written: str, path: str) -> str:
    """How a message names the entry: the expanded path, or — when a variable was expanded —
    what was written (a variable may hold a secret; stderr and the evidence never show it)."""
    return f"`{written}` (its variables expanded)" if "$" in written else f"`{path}`"


def whitelist_entry(written: str, env: Mapping[str, str]) -> str:
    """The directory ``written`` names, symlinks resolved; raises :class:`ExpandError`."""
    path = expand(written, env)
    shown = _shown(written, path)
    if not path.startswith("/"):
        raise ExpandError(f"{shown} is not an absolute path",
                          help="write `/abs/path`, `~/dir` or `$VAR/dir`")
    if any(c in path for c in "*?[]"):  # also keeps the generated policy's globs literal
        raise ExpandError(f"{shown} has a wildcard: whitelist entries are directories",
                          help="list the directory itself; its whole tree is whitelisted")
    path = _normalize(path)
    if any(seg in (".", "..") for seg in path.split("/")):
        raise ExpandError(f"{shown} has a `.` or `..` segment",
                          help="write the path without `.`/`..`")
    real = os.path.realpath(path)
    home = _normalize(env.get("HOME", "") or "/")
    refusal = whitelist_refusal(path, home, shown)
    if refusal is None and real != path:
        target = f"the symlink target of {shown}" if "$" in written else \
            f"`{real}` (`{path}` is a symlink to it)"
        refusal = whitelist_refusal(real, home, target)
    if refusal is None:  # the engine's own trees and login hooks (attack round 3, F7/F8)
        refusal = tree_refusal(real, protected_trees(env), shown)
    if refusal is not None:
        raise ExpandError(refusal, help="whitelist a project directory instead")
    return real


def whitelist_refusal(path: str, home: str, shown: str | None = None) -> str | None:
    """Why ``path`` (absolute, normalized) may not be made writable, or ``None``.

    Also used for the working directory the runner adds to the whitelist.

    :param shown: how to name the path in the answer (default: the path itself).
    """
    name = shown or f"`{path}`"
    if path == "/":
        return f"{name} would make the whole file system writable"
    for tree in SYSTEM_TREES:
        if beneath(path, tree) or beneath(tree, path):
            return f"{name} is or holds the system tree `{tree}`"
    shared = shared_root_refusal(path, name)
    if shared is not None and not beneath(home, path):
        return shared
    if home != "/" and beneath(home, path):
        return (f"{name} is your home directory or holds it: a command could rewrite "
                "`~/.bashrc` or `~/.profile`, which run at your next login")
    for secret in _SECRETS:
        prefix = literal_prefix(expand_home(secret, home))
        if prefix != "/" and beneath(path, prefix):
            return f"{name} lies under the mandatory deny `{secret}`"
    if any(c in path for c in '"\\'):
        return f"{name} has a `\"` or `\\`, which paths given to the sandbox may not hold"
    return None


def blacklist_entry(written: str, env: Mapping[str, str]) -> str:
    """The glob ``written`` denies, expanded and normalized; raises :class:`ExpandError`."""
    if written.startswith("!"):
        raise ExpandError("starts with `!`: the blacklist only adds denies, nothing can be "
                          "negated or lifted", help="remove the entry; the defaults always apply")
    path = expand(written, env)
    shown = _shown(written, path)
    if not path.startswith("/") and not path.startswith("**"):
        raise ExpandError(f"{shown} is neither absolute nor `**/...`",
                          help="write `/abs/path`, `~/dir`, `$VAR/dir` or `**/name`")
    path = _normalize(path) if path.startswith("/") else path.rstrip("/")
    problem = validate_glob(path)
    if problem is not None:
        detail = f": {problem}" if "$" not in written else ""
        raise ExpandError(f"{shown} is not a valid path glob{detail}",
                          help="no `.`/`..` segments; `**` only as a whole segment")
    if any(c in path for c in '[]"\\'):
        raise ExpandError(f"{shown} has a character path globs do not take (`[`, `]`, `\"`, "
                          "`\\`)")
    return path
