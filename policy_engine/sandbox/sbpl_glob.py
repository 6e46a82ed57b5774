"""Path globs to SBPL filters: allows admitting at most, denies at least, the paths
``policy_engine.patterns.paths`` matches, as the macOS kernel matches them (UTF-8 bytes, a case-
and normalization-insensitive volume, ``/private`` symlinks, the ``/System/Volumes/Data`` mount).

Allows (docs/macos.md):

- ``/a/b`` (no wildcard) → ``(literal "/a/b")``: the engine matches that one path;
- ``/a/**`` (literal prefix, ``**`` last) → ``(subpath "/a")``: ``/a`` and everything beneath,
  segment-bounded (never ``/a-evil``), as the engine's ``(?:/.*)?``;
- anything else → ``(regex #"^…$")`` built segment by segment as ``glob_regex`` does: ``*`` →
  ``[^/]*``, ``?`` → ``[^/]``, a middle ``**`` → ``(/[^/]+)*``, a last ``**`` → ``(/[^/]*)*``
  (any suffix beginning with ``/``: the engine's ``(?:/.*)?`` without relying on whether the
  sandbox's ``.`` matches a newline). Every other character is literal: ERE metacharacters are
  escaped with a backslash (inside ``#"…"`` a backslash reaches the regex engine untouched, as in
  Codex's ``seatbelt.rs``).

Denies are always such a regex, widened: every character in each case and in its composed and
decomposed (NFC/NFD) spellings, ``?`` as one character of any byte length (:data:`ONE_CHAR_DENY`),
everything beneath (:data:`BENEATH`), each form also under ``/System/Volumes/Data``
(:func:`deny_spellings`).

A path holding ``"``, ``\\`` or a control character (a newline…) is refused, never escaped: SBPL
string and regex escaping differ, and a refusal cannot widen a profile.

macOS checks a file access against the *resolved* path: ``/etc``, ``/tmp`` and ``/var`` are
symlinks into ``/private``, so ``/etc/passwd`` is seen as ``/private/etc/passwd``. A glob whose
first segment is (or can match) one of those three gets the ``/private`` form as well.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

from policy_engine.patterns.paths import PathGlob, validate_glob

PRIVATE_LINKS = ("etc", "tmp", "var")
"""The top-level symlinks macOS resolves into ``/private`` before the sandbox checks a path."""
DATA_VOLUME = "/System/Volumes/Data"
"""Where macOS 10.15+ mounts the data volume: the same files as ``/Users``, ``/private``…"""
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


ONE_CHAR_DENY = "[^/][^ -~]*"
"""``?`` in a deny: one byte other than ``/``, then any bytes outside printable ASCII. The kernel
matches a path's UTF-8 bytes, where one character is 1-4 bytes (all >= 0x80 when more than one),
and a decomposed (NFD) character is a base followed by combining marks (non-ASCII): this admits
every spelling of one character whether the regex engine counts bytes or characters (and a
little more, which a deny may)."""

BENEATH = "(/[^/]*)*"
"""A suffix a deny regex always admits: ``file/..namedfork/data`` is the file's content."""


def segment_regex(seg: str, *, deny: bool = False) -> str:
    """One segment: ``*``/``?`` stay inside it, every other character is literal.

    ``*`` is ``[^/]*`` either way: UTF-8 never uses the byte ``/`` inside a character, so
    "bytes other than ``/``" and "characters other than ``/``" are the same names. ``?`` in an
    allow is ``[^/]``: one character, or one byte (then an ASCII character) when the kernel
    counts bytes: never more than the engine admits."""
    out = []
    for ch in seg:
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append(ONE_CHAR_DENY if deny else "[^/]")
        elif ch in _ERE_META:
            out.append("\\" + ch)
        else:
            out.append(_any_case(ch) if deny else ch)
    return "".join(out)


_FOLDS_TO_ASCII = {"s": "\u017f", "k": "\u212a"}
"""The non-ASCII characters Unicode case folding maps to an ASCII letter (long s, Kelvin sign):
on a case-insensitive volume ``.aw\u017f`` is ``.aws`` (the unit tests recompute this set)."""


def _simple_fold(c: str) -> str:
    """One character's one-character folding: ``casefold`` (``ς`` → ``σ``), else ``lower``
    (``ẞ`` → ``ß``, whose full folding ``ss`` is two characters), else itself."""
    return next((f for f in (c.casefold(), c.lower()) if len(f) == 1), c)


@lru_cache(maxsize=1)
def _fold_classes() -> dict[str, frozenset[str]]:
    """Every character by its one-character folding: ``σ`` → ``{Σ, ς}``. Built once,
    only when a deny names a non-ASCII character (about 0.3 s)."""
    out: dict[str, set[str]] = {}
    for cp in range(0x110000):
        c = chr(cp)
        f = _simple_fold(c)
        if f != c:
            out.setdefault(f, set()).add(c)
    return {k: frozenset(v) for k, v in out.items()}


def _same_name(ch: str) -> set[str]:
    """The characters a case-insensitive volume compares equal to ``ch``."""
    base = {v for v in (ch, ch.lower(), ch.upper(), ch.casefold()) if len(v) == 1}
    if ch.isascii():
        return base | ({_FOLDS_TO_ASCII[ch.lower()]} if ch.lower() in _FOLDS_TO_ASCII else set())
    folded = {_simple_fold(v) for v in base}
    return base | folded | {c for f in folded for c in _fold_classes().get(f, ())}


def _any_case(ch: str) -> str:
    """``ch`` in every spelling a case- and normalization-insensitive volume (APFS's default)
    treats as the same name: ``[sS]`` (and ``\u017f``), ``(E\u0301|e\u0301|É|é)``;
    characters without case or decomposition stay as they are."""
    variants = {s for v in _same_name(ch) for s in (v, unicodedata.normalize("NFD", v))}
    if variants == {ch}:
        return ch
    if all(len(v) == 1 and v.isascii() for v in variants):
        return "[" + "".join(sorted(variants)) + "]"
    ascii_letters = sorted(v for v in variants if len(v) == 1 and v.isascii())
    rest = sorted(v for v in variants if not (len(v) == 1 and v.isascii()))
    return "(" + "|".join(([f"[{''.join(ascii_letters)}]"] if ascii_letters else []) + rest) + ")"


def glob_to_regex(pattern: str, *, deny: bool = False) -> str:
    """The anchored SBPL regex of an absolute glob (the engine's ``glob_regex``, in ERE); a
    deny's also admits everything beneath (:data:`BENEATH`)."""
    segs = [s for s in pattern.split("/") if s]
    if not segs:
        return "^/$"
    parts: list[str] = []
    for i, seg in enumerate(segs):
        if seg == "**":
            parts.append(BENEATH if i == len(segs) - 1 else "(/[^/]+)*")
        else:
            parts.append("/" + segment_regex(seg, deny=deny))
    if deny and parts[-1] != BENEATH:
        parts.append(BENEATH)
    return "^" + "".join(parts) + "$"


def _wild(seg: str) -> bool:
    return "*" in seg or "?" in seg


def _one_filter(pattern: str, deny: bool) -> str:
    segs = [s for s in pattern.split("/") if s]
    if deny:  # a regex: any case, and everything beneath (a literal's named forks)
        return f'(regex #"{glob_to_regex(pattern, deny=True)}")'
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


def deny_spellings(pattern: str) -> list[str]:
    """The names a deny must cover for the same files: the pattern (in NFC: its regex admits
    every NFC/NFD/case spelling character by character), its ``/private`` forms, and each of
    those under ``/System/Volumes/Data`` (the data volume's mount point: ``/Users``,
    ``/private``… are firmlinks into it)."""
    nfc = unicodedata.normalize("NFC", pattern)
    # `/ETC/x` is /private/etc/x too on a case-insensitive volume
    head, sep, rest = nfc[1:].partition("/")
    forms = set(resolved_forms(nfc)) | set(resolved_forms("/" + head.lower() + sep + rest))
    # /etc, /tmp, /var are symlinks on the system volume: their /private forms carry the mirror
    forms |= {DATA_VOLUME + f.rstrip("/") for f in forms
              if not f.startswith(("/**", *(f"/{link}/" for link in PRIVATE_LINKS)))
              and f.rstrip("/") and not _beneath(f, DATA_VOLUME)}
    return sorted(forms)


def _beneath(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def path_filters(pattern: str, *, deny: bool = False) -> list[str]:
    """Every SBPL filter needed for an absolute, home-expanded glob (sorted, deduplicated).

    An allow admits at most what the engine's glob admits; a deny (``deny=True``) at least,
    when the kernel matches UTF-8 bytes, NFD spellings, the data-volume or named-fork paths."""
    check_path(pattern)
    forms = deny_spellings(pattern) if deny else resolved_forms(pattern)
    for form in forms:
        check_path(form)
    return sorted({_one_filter(form, deny) for form in forms})


def any_of(filters: list[str]) -> str:
    """One filter admitting what any of ``filters`` admits (deduplicated, sorted)."""
    uniq = sorted(set(filters))
    return uniq[0] if len(uniq) == 1 else "(require-any " + " ".join(uniq) + ")"


def all_of(filters: list[str]) -> str:
    """One filter admitting what every one of ``filters`` admits (deduplicated, sorted)."""
    uniq = sorted(set(filters))
    return uniq[0] if len(uniq) == 1 else "(require-all " + " ".join(uniq) + ")"
