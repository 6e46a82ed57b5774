"""Find test files: under directories (recursively), as given, or by the policy they name."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from policy_engine.errors import Diagnostic
from policy_engine.inputs.bounded import MAX_DOCUMENT_BYTES
from policy_engine.inputs.inputfile import describe, is_regular, read_limited, walk_takes

TEST_SUFFIXES = (".sbtest.yaml", ".sbtest.yml", ".sbtest.json")
POLICY_SUFFIX = ".sbpolicy"
# never searched: version control, caches, virtual environments, dependencies
_SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv",
                        ".tox", ".mypy_cache", ".ruff_cache", ".pytest_cache"})


def is_test_file(path: str) -> bool:
    return path.lower().endswith(TEST_SUFFIXES)


@dataclass(slots=True)
class Discovery:
    """The test files to run, in a stable order, and which policy arguments selected them."""

    files: list[str] = field(default_factory=list)
    needs_policy: dict[str, set[str]] = field(default_factory=dict)
    """A test file found only through `.sbpolicy` arguments → their real paths; it runs only
    if it names one of them."""
    policies: dict[str, str] = field(default_factory=dict)
    """Real path → the `.sbpolicy` argument as given."""
    diagnostics: list[Diagnostic] = field(default_factory=list)


def discover(paths: tuple[str, ...]) -> Discovery:
    """Resolve the command-line paths (default ``.``) to test files.

    A directory is searched recursively (hidden and tool directories skipped); a test file is
    taken as is; a ``.sbpolicy`` file selects the test files of its directory tree that mention
    its name (the runner keeps those that name it in `policy`). Duplicates are dropped, order kept.
    """
    out = Discovery()
    seen: dict[str, str] = {}
    unconditional: set[str] = set()

    def add(path: str, policy: str | None) -> None:
        real = os.path.realpath(path)
        if real not in seen:
            seen[real] = path
            out.files.append(path)
        first = seen[real]
        if policy is None:
            unconditional.add(first)
            out.needs_policy.pop(first, None)
        elif first not in unconditional:
            out.needs_policy.setdefault(first, set()).add(policy)

    for raw in paths or (".",):
        path = os.path.normpath(raw)
        if os.path.isdir(path):
            for found in _walk(path):
                add(found, None)
        elif os.path.isfile(path) and is_test_file(path):
            add(path, None)
        elif os.path.isfile(path) and path.lower().endswith(POLICY_SUFFIX):
            real = os.path.realpath(path)
            out.policies[real] = raw
            for found in _walk(os.path.dirname(path) or "."):
                if _mentions(found, path):
                    add(found, real)
        elif os.path.exists(path) and not os.path.isdir(path) and not is_regular(path):
            out.diagnostics.append(Diagnostic.make(
                "SBP406", f"`{raw}` is {describe(os.stat(path).st_mode)}, not a regular file",
                None, help="test files are read from regular files only"))
        elif os.path.exists(path):
            out.diagnostics.append(Diagnostic.make(
                "SBP406", f"`{raw}` is neither a test file, a directory nor a .sbpolicy file",
                None))
        else:
            out.diagnostics.append(Diagnostic.make("SBP406", f"`{raw}` does not exist", None))
    return out


def _walk(top: str) -> list[str]:
    found: list[str] = []
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        found.extend(os.path.join(root, f) for f in sorted(files)
                     if is_test_file(f) and walk_takes(os.path.join(root, f), TEST_SUFFIXES))
    return [os.path.normpath(f) for f in found]


def _mentions(test_file: str, policy: str) -> bool:
    """A cheap pre-filter: the test file's text contains the policy's file name."""
    try:  # bounded, regular files only (the walk already skipped pipes and devices)
        data = read_limited(test_file, MAX_DOCUMENT_BYTES)
    except (OSError, ValueError):
        return False
    return os.path.basename(policy).encode("utf-8", "surrogateescape") in data

