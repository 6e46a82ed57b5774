"""The engine's own trees (launcher cache, sandbox config, login hooks) a sandbox may never write.

Whoever can replace the native launcher runs code as the engine's uid (root, when the engine
runs as root) at the next command; whoever can rewrite the sandbox config widens every later
sandbox; whoever can write an autostart entry or a systemd user unit runs code at the next
login. So a writable entry (whitelist, working directory, ``$TMPDIR``, an fs.write bind) may
neither be, hold, nor lie inside one of these trees (outsider attack round 3, F7 and F8).
Pure standard library: ``policy_engine/sandbox`` and ``plugins/executor_proc`` both use it.
"""

from __future__ import annotations

import contextlib
import os
import site
import sys
from collections.abc import Callable, Iterable, Mapping


def launcher_cache_dir(env: Mapping[str, str]) -> str:
    """``$POLICY_ENGINE_STATE/bin``, else ``$XDG_CACHE_HOME/policy-engine/bin`` (``~/.cache``):
    where the native launcher is built and cached (``plugins/executor_proc/native.py``)."""
    state = env.get("POLICY_ENGINE_STATE")
    if state:
        return os.path.abspath(os.path.join(os.path.expanduser(state), "bin"))
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(_home(env), ".cache")
    return os.path.abspath(os.path.join(xdg, "policy-engine", "bin"))


def engine_cache_dir(env: Mapping[str, str]) -> str:
    """``$POLICY_ENGINE_STATE/cache``, else ``$XDG_CACHE_HOME/policy-engine`` (``~/.cache``):
    the parser's tables (a pickle, ``dsl/grammar_cache.py``) and the stored mask walks
    (``sandbox/listing_store.py``); without ``$POLICY_ENGINE_STATE`` it holds the launcher
    cache too. Both modules spell the same place (a test keeps the three equal)."""
    state = env.get("POLICY_ENGINE_STATE")
    if state:
        return os.path.abspath(os.path.join(os.path.expanduser(state), "cache"))
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(_home(env), ".cache")
    return os.path.abspath(os.path.join(xdg, "policy-engine"))


def config_home(env: Mapping[str, str]) -> str:
    """``$XDG_CONFIG_HOME`` when absolute, else ``~/.config``."""
    xdg = env.get("XDG_CONFIG_HOME")
    return xdg if xdg and os.path.isabs(xdg) else os.path.join(_home(env), ".config")


LOGIN_HOOKS: tuple[str, ...] = ("autostart", "systemd", "environment.d", "fish", "git")
"""Below the config home: programs run at the next login or shell (desktop autostart entries,
systemd user units and their environment, fish's config; bash's rc files lie in the home
directory itself, which is never whitelisted)."""
HOME_HOOKS: tuple[str, ...] = (".local/share/systemd", ".local/bin", "bin", ".ipython",
                               ".oh-my-zsh", ".vscode")
"""Below the home directory: systemd user units, the user's programs on ``PATH``, startup
scripts of IPython, zsh and the editor (attack round 3, F8 note)."""


def engine_code() -> list[str]:
    """The engine's packages and the Python it runs from (its prefix, its environment, the
    user site-packages): a command that edits them runs as the engine next time (round 3, F13).
    """
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # policy_engine/
    out = [here, os.path.join(os.path.dirname(here), "plugins"), sys.prefix, sys.base_prefix,
           sys.exec_prefix]
    with contextlib.suppress(AttributeError):  # a site module without it (embedded Pythons)
        out.append(site.getusersitepackages())
    return [p for p in out if p and p != "/" and os.path.exists(p)]


SHARED_ROOTS: tuple[str, ...] = ("/opt", "/srv", "/home", "/mnt", "/media", "/var", "/var/www",
                                 "/var/opt", "/var/backups", "/var/tmp", "/usr/local", "/root")
"""Trees holding other users' or installed software's files: a writable entry may not be or hold
one (``/opt/myproject`` is fine). An engine running as root lets the sandbox uid write what root
owns in a writable bind (an id-mapped bind, ``plugins/executor_proc/owner.py``), which would make
every root-owned file beneath ``/opt`` or ``/home`` writable (outsider attack round 3, F7 note)."""


def shared_root_refusal(path: str, shown: str | None = None) -> str | None:
    """Why ``path`` (resolved) may not be writable: it is or holds a shared root, or it is a
    directory every user may write (a sticky ``/var/tmp``-like one: as its owner, the sandbox
    uid could delete or swap every user's files in it; attack round 3, F14)."""
    for tree in SHARED_ROOTS:
        if _beneath(tree, path):
            return (f"{shown or f'`{path}`'} is or holds `{tree}`, which holds other users' and "
                    "installed software's files")
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if mode & 0o002:
        return (f"{shown or f'`{path}`'} is a directory every user may write (shared, like "
                "`/var/tmp`)")
    return None


def protected_trees(env: Mapping[str, str], extra: Iterable[tuple[str, str]] = (), *,
                    realpath: Callable[[str], str] = os.path.realpath) -> list[tuple[str, str]]:
    """``(path, what)`` for every engine tree a writable entry may not touch (paths resolved).

    A sandbox config named elsewhere (``$POLICY_ENGINE_SANDBOX_CONFIG``) is not one of them:
    its directory may hold the project; the generated policy blacklists the file instead.
    ``realpath``: ``os.path.realpath`` or one answering alike (the proc executor's single
    ``openat2`` probe per path on its call path)."""
    conf = config_home(env)
    out = [(launcher_cache_dir(env), "the engine's native launcher cache"),
           (engine_cache_dir(env), "the engine's cache (parser tables, stored mask walks)"),
           (os.path.join(conf, "policy-engine"), "the engine's configuration directory")]
    hooks = [os.path.join(conf, h) for h in LOGIN_HOOKS]
    hooks += [os.path.join(_home(env), h) for h in HOME_HOOKS]
    out += [(h, "a login hook directory (runs programs at your next login)") for h in hooks]
    out += [(p, "the engine's code or the Python it runs from") for p in engine_code()]
    out += list(extra)
    return [(realpath(p), what) for p, what in out]


def tree_refusal(path: str, trees: Iterable[tuple[str, str]],
                 shown: str | None = None) -> str | None:
    """Why ``path`` (resolved) may not be writable: it is, holds or lies inside a tree."""
    name = shown or f"`{path}`"
    for tree, what in trees:
        if _beneath(path, tree) or _beneath(tree, path):
            return (f"{name} is, holds or lies inside `{tree}`, {what}: a command could replace "
                    "what the engine or your next login runs")
    return None


def _home(env: Mapping[str, str]) -> str:
    home = env.get("HOME", "")
    return home if os.path.isabs(home) else os.path.expanduser("~")


def _beneath(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")
