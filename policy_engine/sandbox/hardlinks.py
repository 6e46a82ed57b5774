"""Hard links to masked files: masks are per path, the kernel opens inodes (attack round 3, F1).

A file in an exposed tree with more than one link whose ``(st_dev, st_ino)`` is a masked file's,
or a file's below a literal deny tree (``~/.ssh/id_rsa`` linked as ``proj/notes.txt``), is masked
as well. Known gap: a file listed with one link that later gains a name under a deny tree keeps
its cached "one link" until its directory changes (its content was exposed already).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Sequence

Linked = tuple[tuple[str, tuple[int, int]], ...]
"""A directory's regular files with more than one link, with their ``(st_dev, st_ino)``."""


def beneath(path: str, root: str) -> bool:
    """Segment-wise containment."""
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


MAX_SECRET_ENTRIES = 20_000
"""Entries looked at below one literal deny tree (``~/.ssh``) for hard-linked files."""


def linked_secrets(seen: Iterable[str], bound: Sequence[str], found: set[str],
                   literal: Sequence[str], linked: Callable[[str], Linked],
                   skip: Sequence[str], *, walked: list[str] | None = None) -> set[str]:
    """Files in the bound trees that are hard links to a masked file or to a file below a
    literal deny tree (``~/.ssh/id_rsa`` linked as ``proj/notes.txt``): masks are per path, the
    kernel opens inodes (outsider attack round 3, F1). Only files with more than one link
    are compared, so a tree without hard links costs one ``lstat`` per file once (cached with
    the directory's listing). ``walked`` gets the directories looked at below the literal
    deny trees."""
    secret: set[tuple[int, int]] = set()
    for p in found:
        _add_inode(p, secret)
    for top in literal:
        if top == "/" or any(beneath(top, n) for n in skip):
            continue
        budget = MAX_SECRET_ENTRIES
        for d, subdirs, names in os.walk(top):
            if walked is not None:
                walked.append(d)
            for n in names:
                _add_inode(os.path.join(d, n), secret)
            budget -= len(names) + len(subdirs)
            if budget <= 0:
                break
        _add_inode(top, secret)
    if not secret:
        return set()
    out: set[str] = set()
    for d in seen:
        if d in found or not any(beneath(d, b) for b in bound):
            continue  # a directory masked whole hides its files already
        for name, key in linked(d):
            if key in secret:
                out.add(f"{d.rstrip('/')}/{name}")
    return out


def _add_inode(path: str, into: set[tuple[int, int]]) -> None:
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        into.add((st.st_dev, st.st_ino))


