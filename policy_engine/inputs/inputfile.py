"""Open and read input files within a byte limit, refusing devices and pipes before they block.

A size check on ``st_size`` is not enough: `/dev/zero` and a named pipe report 0 bytes and then
never end (or never start: opening a FIFO without a writer blocks). Every file an engine command
reads as input (policies, documents, test files, settings, keys, evidence logs) goes through
here: the path is checked with ``stat`` before it is opened, opened with ``O_NONBLOCK`` (a FIFO
swapped in between cannot block the open) and checked again with ``fstat`` on the descriptor
actually read. At most the limit plus one byte is ever read. The limits are in
docs/operations.md, "Input limits".
"""

from __future__ import annotations

import os
import stat

MAX_KEY_BYTES = 64 * 1024
"""A key or secret file (signing key, public key, seal key, webhook secret): bytes, not a log."""
MAX_EVIDENCE_BYTES = 1024 * 1024 * 1024
"""An evidence log read whole (`evidence verify`, `replay`, `diff --evidence`): rotate or split a
larger log. `stats` streams its logs and holds each line to :data:`MAX_EVIDENCE_LINE_BYTES`."""
MAX_EVIDENCE_LINE_BYTES = 1024 * 1024
"""One evidence record is a few hundred bytes; a longer line is unreadable, never held whole."""

REGULAR_ONLY_HELP = "inputs are read from regular files only: pass the file itself, not a " \
    "device, pipe, socket or directory"


class NotRegularFile(OSError):
    """The path names a directory, device, pipe or socket; ``kind`` says which."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(f"it is {kind}, not a regular file")
        self.filename = path
        self.kind = kind

    def __str__(self) -> str:
        return f"it is {self.kind}, not a regular file"


class TooLarge(OSError):
    """The regular file holds more than ``limit`` bytes (only ``limit + 1`` were read)."""

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(f"it is larger than {limit:,} bytes, the limit for this input")
        self.filename = path
        self.limit = limit

    def __str__(self) -> str:
        return f"it is larger than {self.limit:,} bytes, the limit for this input"


def describe(mode: int) -> str:
    """What a non-regular file is, in words (``a named pipe (FIFO)``)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def is_regular(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (symlinks followed) is a regular file; never opens it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


DOCUMENT_SUFFIXES = (".json", ".yaml", ".yml")
"""What a manifest or grant named inside another input (a request, a test file) may be called;
a manifest may also be a `.sbpolicy` tool block."""


def named_like(path: str | os.PathLike[str], suffixes: str | tuple[str, ...]) -> bool:
    """Whether ``path`` and, through links, its real path end in one of ``suffixes`` (any case).

    A file named by another input is read only when it is named like what it should be: an
    input under review must not make a command quote `/etc/shadow` in a parse error."""
    return (os.fspath(path).lower().endswith(suffixes)
            and os.path.realpath(path).lower().endswith(suffixes))


def walk_takes(path: str | os.PathLike[str], suffixes: str | tuple[str, ...]) -> bool:
    """Whether a directory walk reads ``path``: a regular file whose name and, through links,
    real path end in one of ``suffixes``. A FIFO would hang the walk, a device never end, and a
    `x.sbpolicy` link to `/etc/shadow` would have its first line quoted in a parse error."""
    return named_like(path, suffixes) and is_regular(path)


def open_regular(path: str | os.PathLike[str]) -> int:
    """A blocking, read-only descriptor on the regular file ``path``.

    :raises NotRegularFile: ``path`` is a directory, device, pipe or socket.
    :raises OSError: it cannot be opened. ``ValueError``: a NUL byte in the path.
    """
    shown = os.fspath(path)
    before = os.stat(path).st_mode
    if not stat.S_ISREG(before):
        raise NotRegularFile(str(shown), describe(before))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced between the stat and the open
            raise NotRegularFile(str(shown), describe(mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_limited(path: str | os.PathLike[str], limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the regular file ``path`` (more than ``limit`` bytes
    returned means the file is over the limit).

    :raises NotRegularFile, OSError, ValueError: as :func:`open_regular`.
    """
    fd = open_regular(path)
    try:
        return _read_fd(fd, limit)
    finally:
        os.close(fd)


def read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """The whole regular file ``path``, refused when over ``limit`` bytes (by its size before
    anything is read, and by what was read for a file that grows).

    :raises TooLarge: over the limit. :raises NotRegularFile, OSError, ValueError: as
        :func:`open_regular`.
    """
    fd = open_regular(path)
    try:
        if os.fstat(fd).st_size > limit:
            raise TooLarge(os.fspath(path), limit)
        data = _read_fd(fd, limit)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise TooLarge(os.fspath(path), limit)
    return data


def _read_fd(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while total <= limit:
        chunk = os.read(fd, min(limit + 1 - total, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def cannot_read(what: str, path: str | os.PathLike[str], exc: OSError | ValueError) -> str:
    """The one-line CLI refusal for an input that cannot be read: ``SBP100`` (unreadable, not a
    regular file) or ``SBP106`` (too large), the path, the cause and what to do."""
    shown = os.fspath(path).replace("\x00", "\\0")
    if isinstance(exc, TooLarge):
        return (f"error: SBP106 {what} `{shown}` is larger than {exc.limit:,} bytes, the limit "
                "for this input (docs/operations.md, \"Input limits\"); split or rotate it")
    if isinstance(exc, NotRegularFile):
        return (f"error: SBP100 cannot read {what} `{shown}`: it is {exc.kind}, not a regular "
                f"file ({REGULAR_ONLY_HELP})")
    if isinstance(exc, ValueError):
        return f"error: SBP100 cannot read {what} `{shown}`: the path contains a NUL byte"
    return f"error: SBP100 cannot read {what} `{shown}`: {exc.strerror or exc}"
