"""Path globs to SBPL filters (`literal`, `subpath`, anchored `regex`) matching exactly the paths
``policy_engine.patterns.paths`` matches, with the paths macOS resolves through /private.

The mapping (docs/macos.md):

- ``/a/b`` (no wildcard) → ``(literal "/a/b")``: the engine matches that one path;
- ``/a/**`` (literal prefix, ``**`` last) → ``(subpath "/a")``: ``/a`` and everything beneath,
  segment-bounded (never ``/a-evil``), as the engine's ``(?:/.*)?``;
- anything else → ``(regex #"^…$")`` built segment by segment as ``glob_regex`` does: ``*`` →
  ``[^/]*``, ``?`` → ``[^/]``, a middle ``**`` → ``(/[^/]+)*``, a last ``**`` → ``(/[^/]*)*``
  (any suffix beginning with ``/``: the engine's ``(?:/.*)?`` without relying on whether the
  sandbox's ``.`` matches a newline). Every other character is literal: ERE metacharacters are
  escaped with a backslash (inside ``#"…"`` a backslash reaches the regex engine untouched, as in
  Codex's ``seatbelt.rs``).

A path holding ``"``, ``\\`` or a control character (a newline…) is refused, never escaped: SBPL
string and regex escaping differ, and a refusal cannot widen a profile.

macOS checks a file access against the *resolved* path: ``/etc``, ``/tmp`` and ``/var`` are
symlinks into ``/private``, so ``/etc/passwd`` is seen as ``/private/etc/passwd``. A glob whose
first segment is (or can match) one of those three gets the ``/private`` form as well.
"""

from __future__ import annotations

from policy_engine.patterns.paths import PathGlob, validate_glob

PRIVATE_LINKS = ("etc", "tmp", "var")
"""The top-level symlinks macOS resolves into ``/private`` before the sandbox checks a path."""
_ERE_META = frozenset(".[]()*+?{}|^$")


class SbplPathError(ValueError):
    """A path the SBPL renderer refuses (diagnostic ``SBPL001``): it cannot be written safely."""

    code = "SBPL001"


def check_path(pattern: str) -> None:
    """Refuse what cannot be put inside an SBPL string or regex literal without escaping."""
    for ch in pattern:
        if ch in ('"', "\\") or ord(ch) < 0x20 or ord(ch) == 0x7F:
            raise SbplPathError(
                f"SBPL001: path `{pattern!r}` holds {ch!r}, which the macOS profile refuses to "
                "escape (a quote, backslash or control character could widen the profile); "
                "rename the path or drop the rule")
    why = validate_glob(pattern)
    if why is not None or not pattern.startswith("/"):
        raise SbplPathError(f"SBPL001: `{pattern}` is not an absolute path glob: "
                            f"{why or 'expand `~` first'}")


def _string(text: str) -> str:
    return f'"{text}"'  # INVARIANT: check_path refused `"`, `\` and control characters


def segment_regex(seg: str) -> str:
    """One segment: ``*``/``?`` stay inside it, every other character is literal."""
    out = []
    for ch in seg:
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch in _ERE_META:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def glob_to_regex(pattern: str) -> str:
    """The anchored SBPL regex of an absolute glob (the engine's ``glob_regex``, in ERE)."""
    segs = [s for s in pattern.split("/") if s]
    if not segs:
        return "^/$"
    parts: list[str] = []
    for i, seg in enumerate(segs):
        if seg == "**":
            parts.append("(/[^/]*)*" if i == len(segs) - 1 else "(/[^/]+)*")
        else:
            parts.append("/" + segment_regex(seg))
    return "^" + "".join(parts) + "$"


def _wild(seg: str) -> bool:
    return "*" in seg or "?" in seg


def _one_filter(pattern: str) -> str:
    segs = [s for s in pattern.split("/") if s]
    if not any(_wild(s) for s in segs):
        return f"(literal {_string('/' + '/'.join(segs))})"
    if segs[-1] == "**" and not any(_wild(s) for s in segs[:-1]):
        return f"(subpath {_string('/' + '/'.join(segs[:-1]))})"
    return f'(regex #"{glob_to_regex(pattern)}")'


def resolved_forms(pattern: str) -> list[str]:
    """``pattern`` plus its ``/private`` forms: one per firmlinked top directory its first
    segment matches (``/e*/x`` → ``/private/etc/x``). ``**`` first already matches them."""
    segs = [s for s in pattern.split("/") if s]
    out = [pattern]
    if not segs or segs[0] == "**":
        return out
    first = PathGlob.of("/" + segs[0])
    rest = "/".join(segs[1:])
    for link in PRIVATE_LINKS:
        if first.matches("/" + link):
            out.append(f"/private/{link}" + (f"/{rest}" if rest else ""))
    return out


def path_filters(pattern: str) -> list[str]:
    """Every SBPL filter needed for an absolute, home-expanded glob (sorted, deduplicated)."""
    check_path(pattern)
    return sorted({_one_filter(form) for form in resolved_forms(pattern)})


def any_of(filters: list[str]) -> str:
    """One filter admitting what any of ``filters`` admits (deduplicated, sorted)."""
    uniq = sorted(set(filters))
    return uniq[0] if len(uniq) == 1 else "(require-any " + " ".join(uniq) + ")"


def all_of(filters: list[str]) -> str:
    """One filter admitting what every one of ``filters`` admits (deduplicated, sorted)."""
    uniq = sorted(set(filters))
    return uniq[0] if len(uniq) == 1 else "(require-all " + " ".join(uniq) + ")"
