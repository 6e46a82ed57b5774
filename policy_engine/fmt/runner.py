"""Format sources and files: find `*.sbpolicy` files, check soundness, write atomically, diff."""

from __future__ import annotations

import contextlib
import difflib
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from policy_engine.dsl import ast, fastparse
from policy_engine.dsl.parser import read_source
from policy_engine.errors import Diagnostic, Severity, Span
from policy_engine.fmt import soundness
from policy_engine.fmt.printer import format_ast
from policy_engine.inputs.inputfile import walk_takes

SUFFIX = ".sbpolicy"

Renderer = Callable[[ast.PolicyFile], str]


@dataclass(slots=True)
class Result:
    """One formatted input.

    :param formatted: the canonical text; ``None`` when the input is unusable (see
        ``diagnostics``: a parse error, an unreadable file, a failed soundness check).
    """

    file: str
    source: str | None
    formatted: str | None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.formatted is not None and self.formatted != self.source


def format_source(text: str, file: str, *, real_path: str | None = None,
                  render: Renderer = format_ast) -> Result:
    """Format ``text`` (shown as ``file``) and prove the result sound before returning it.

    :param real_path: the file on disk, whose directory its imports are relative to.
    :param render: the printer; a parameter so that tests can give a broken one and see the
        soundness check refuse its output.
    """
    pf, diags = fastparse.parse(text, file)
    if diags:
        return Result(file, text, None, diags)
    out = render(pf)
    if out != text:  # identical output is trivially sound: skip the reparse and recompile
        problem = soundness.check(pf, out, real_path)
        if problem is not None and problem.severity is Severity.NOTE:
            return Result(file, text, out, [problem])  # sound, with what was not provable
        if problem is not None:
            return Result(file, text, None, [problem])
    return Result(file, text, out)


def format_path(path: str, *, render: Renderer = format_ast) -> Result:
    """Read and format one file (nothing is written)."""
    text = read_source(path)
    if isinstance(text, Diagnostic):
        return Result(path, None, None, [text])
    return format_source(text, path, real_path=path, render=render)


def find_files(paths: Iterable[str]) -> Iterator[str | Diagnostic]:
    """Each path given, or the ``*.sbpolicy`` files under a directory (sorted, recursively,
    skipping hidden directories); a missing path is an SBP100 diagnostic."""
    for path in paths:
        if os.path.isdir(path):
            found: list[str] = []
            for root, dirs, files in os.walk(path):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                found.extend(os.path.normpath(os.path.join(root, f)) for f in files
                             if f.endswith(SUFFIX) and walk_takes(os.path.join(root, f), SUFFIX))
            yield from sorted(found)
        elif os.path.exists(path):
            yield path
        else:
            yield Diagnostic.make("SBP100", f"`{path}` does not exist", None,
                                  help="pass .sbpolicy files, directories to search, or `-`")


def write_atomic(path: str, text: str) -> Diagnostic | None:
    """Replace ``path`` by ``text``: a temporary file in the same directory, then a rename, so
    the file is either the old or the new one, never half-written; its mode is kept."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".fmt",
                                   dir=directory)
    except OSError as exc:
        return _write_error(path, exc)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):  # already renamed or gone: nothing to clean up
            os.unlink(tmp)
        return _write_error(path, exc)
    return None


def _write_error(path: str, exc: OSError) -> Diagnostic:
    return Diagnostic.make("SBP421", f"cannot write `{path}`: {exc.strerror or exc}",
                           Span(path, 0, 0))


def unified_diff(result: Result) -> str:
    """The change as a unified diff (``--- file (original)`` / ``+++ file (formatted)``)."""
    before = (result.source or "").splitlines(keepends=True)
    after = (result.formatted or "").splitlines(keepends=True)
    lines = difflib.unified_diff(before, after, f"{result.file} (original)",
                                 f"{result.file} (formatted)")
    out: list[str] = []
    for line in lines:
        if line.endswith("\n"):
            out.append(line)
        else:  # the original's last line had no newline: say so, as diff(1) does
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)
