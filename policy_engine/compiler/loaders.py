"""Load manifests, grants and other JSON/YAML documents with positions for every diagnostic.

Every problem is a :class:`DiagnosticsError` (SBP100 unreadable, SBP105 malformed) naming the
file, and the line and column where the parser or the key's position gives one; validation
errors name the field path (``capabilities[0].paths``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from policy_engine.dsl.source import read_source
from policy_engine.errors import Diagnostic, DiagnosticsError, Span
from policy_engine.inputs.bounded import (
    MAX_DOCUMENT_BYTES,
    DocumentError,
    parse_json,
    parse_yaml,
)
from policy_engine.model import Capability, Grant, Manifest
from policy_engine.patterns.regex import regex_problem

Loc = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)
_YAML_SUFFIXES = (".yaml", ".yml")


class PositionLookup:
    """Where each key (or list item) of a loaded document was written."""

    def __init__(self, file: str, positions: dict[Loc, tuple[int, int]] | None = None) -> None:
        self.file = file
        self.positions = positions or {}

    def span(self, loc: Sequence[str | int]) -> Span:
        """The span of ``loc`` or of its longest known prefix (the file's start if none)."""
        key = tuple(loc)
        while key:
            if key in self.positions:
                line, col = self.positions[key]
                return Span(self.file, line, col)
            key = key[:-1]
        return Span(self.file, 1, 1)


def load_document(path: str | os.PathLike[str]) -> tuple[Any, PositionLookup]:
    """Parse a JSON or YAML file (by suffix; otherwise JSON if it looks like JSON), within the
    bounds of :mod:`policy_engine.inputs.bounded` (size, depth, aliases, integer length) and
    refusing duplicate keys.

    :raises DiagnosticsError: SBP100 if unreadable, SBP106 if larger than
        :data:`MAX_DOCUMENT_BYTES`, SBP105 with the position if malformed or out of bounds.
    """
    shown = os.fspath(path)
    text = read_source(path, shown, max_bytes=MAX_DOCUMENT_BYTES)
    if isinstance(text, Diagnostic):
        raise DiagnosticsError([text])
    return parse_document(text, shown)


def parse_document(text: str, shown: str) -> tuple[Any, PositionLookup]:
    """Parse document ``text`` (shown as ``shown``): YAML by suffix, JSON if it looks like it."""
    suffix = Path(shown).suffix.lower()
    is_yaml = suffix in _YAML_SUFFIXES or (
        suffix != ".json" and not text.lstrip().startswith(("{", "[")))
    kind = "YAML" if is_yaml else "JSON"
    try:
        data, positions = parse_yaml(text) if is_yaml else parse_json(text)
    except DocumentError as exc:
        raise _invalid(kind, exc.message, Span(shown, exc.line, exc.column)) from None
    except json.JSONDecodeError as exc:
        raise _invalid(kind, _lower(exc.msg), Span(shown, exc.lineno, exc.colno)) from None
    except Exception as exc:
        # imported here: a JSON document (check of a policy, most requests) needs no PyYAML
        import yaml

        if isinstance(exc, yaml.MarkedYAMLError):
            mark = exc.problem_mark or exc.context_mark
            span = Span(shown, mark.line + 1, mark.column + 1) if mark else Span(shown, 1, 1)
            raise _invalid(kind, exc.problem or exc.context or "cannot parse", span) from None
        if isinstance(exc, (yaml.YAMLError, ValueError, RecursionError)):
            # a reader error (a control character) or what the bounded scan let through
            raise _invalid(kind, _first_line(exc),
                           Span(shown, *_reader_position(exc, text))) from None
        raise
    lookup = PositionLookup(shown, positions)
    bad = sorted(lone_surrogates(data), key=lambda loc: _order(lookup.span(loc)))
    if bad:
        raise DiagnosticsError([Diagnostic.make(
            "SBP105", f"invalid {kind}: the text at `{_pointer(loc)}` is not valid Unicode (a "
            "lone UTF-16 surrogate: a `\\uD800`-`\\uDFFF` escape alone)",
            lookup.span(loc), help="write the character itself, or a high+low surrogate pair")
            for loc in bad])
    return data, lookup


def lone_surrogates(data: Any, limit: int = 10) -> list[tuple[str | int, ...]]:
    """Where strings (keys included) of a parsed document hold a lone surrogate (JSON's
    ``"\\ud800"``): no file, host or hash can carry one, and printing it fails. The loaders
    bound the document's size, so the walk is bounded too."""
    found: list[tuple[str | int, ...]] = []
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack and len(found) < limit:
        value, loc = stack.pop()
        if isinstance(value, str):
            if not _encodes(value):
                found.append(loc)
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and not _encodes(key):
                    found.append((*loc, key))
                stack.append((item, (*loc, key)))
        elif isinstance(value, list):
            stack.extend((item, (*loc, i)) for i, item in enumerate(value))
    return found


def _order(span: Span) -> tuple[int, int]:
    return span.line, span.column


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _pointer(loc: tuple[str | int, ...]) -> str:
    return "/" + "/".join(str(p).encode("utf-8", "backslashreplace").decode() for p in loc)


def _invalid(kind: str, problem: str, span: Span) -> DiagnosticsError:
    return DiagnosticsError([Diagnostic.make("SBP105", f"invalid {kind}: {problem}", span)])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().split("\n", 1)[0] or type(exc).__name__
    return text[:200]


def _reader_position(exc: BaseException, text: str) -> tuple[int, int]:
    """1-based line and column of a PyYAML ReaderError (it has a character offset only)."""
    import yaml

    if isinstance(exc, yaml.reader.ReaderError):
        offset = min(max(exc.position, 0), len(text))
        return text.count("\n", 0, offset) + 1, offset - (text.rfind("\n", 0, offset) + 1) + 1
    return 1, 1


def refuse_session(data: Any, lookup: PositionLookup, *loc: str) -> None:
    """Refuse a document's ``settings.session`` (at ``loc``): it is the engine's own context
    (a policy's ``$SESSION``), and a caller's file naming one would choose the directory the
    policy grants. Raises ``DiagnosticsError`` (SBP105) at the key."""
    node = data
    for key in loc[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    # `null` is the default every serialized Settings carries (model_dump): it names nothing
    if isinstance(node, dict) and node.get(loc[-1]) is not None:
        raise DiagnosticsError([Diagnostic.make(
            "SBP105", "`session` is set by the engine's session runtime, never by a document",
            lookup.span(loc), help="run the call through a session (docs/sessions.md); "
            "outside one, a `$SESSION` path matches nothing")])


def validate_document(model: type[M], data: Any, lookup: PositionLookup, what: str) -> M:
    """Validate ``data`` as ``model``; every error becomes an SBP105 at the field's position."""
    if not isinstance(data, dict):
        raise DiagnosticsError([Diagnostic.make(
            "SBP105", f"a {what} must be a mapping at the top level", lookup.span(()))])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        diags = []
        for err in exc.errors():
            loc = _data_loc(data, err["loc"])
            shown = field_path(loc) or "(top level)"
            diags.append(Diagnostic.make(
                "SBP105", f"invalid {what} field `{shown}`: {_lower(err['msg'])}",
                lookup.span(loc),
                help=f"see the {what} schema (`policy-engine schema {what}`)",
            ))
        raise DiagnosticsError(diags) from None


def field_path(loc: Sequence[str | int]) -> str:
    """``("capabilities", 0, "paths")`` → ``capabilities[0].paths``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _data_loc(data: Any, loc: Sequence[str | int]) -> Loc:
    """Drop the parts of a pydantic ``loc`` that are not in the data (union tags like
    ``fs.read``), keeping the first missing key (a required field that is absent)."""
    out: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_dict or in_list:
            out.append(part)
            node = node[part]
        elif i == len(loc) - 1 and isinstance(node, dict):
            out.append(part)
    return tuple(out)


def _lower(msg: str) -> str:
    return msg[:1].lower() + msg[1:]


def load_grant(path: str | os.PathLike[str]) -> Grant:
    """A Grant from JSON or YAML; :class:`DiagnosticsError` (SBP100/SBP105) if unusable."""
    data, lookup = load_document(path)
    grant = validate_document(Grant, data, lookup, "grant")
    check_patterns(grant.capabilities, "capabilities", lookup, "grant")
    return grant


def load_manifest(path: str | os.PathLike[str], *, home: str | None = None) -> Manifest:
    """A tool Manifest from JSON, YAML, or the single `tool` block of a `.sbpolicy` file.

    :param home: what ``~`` expands to in the paths of a `.sbpolicy` tool block.
    """
    shown = os.fspath(path)
    if Path(shown).suffix.lower() != ".sbpolicy":
        data, lookup = load_document(path)
        manifest = validate_document(Manifest, data, lookup, "manifest")
        check_patterns(manifest.permissions, "permissions", lookup, "manifest")
        return manifest
    return _manifest_from_policy(shown, home if home is not None else os.path.expanduser("~"))


def check_patterns(
    caps: Sequence[Capability], key: str, lookup: PositionLookup, what: str,
) -> None:
    """Refuse host patterns and argument regexes the guard could not use (the policy compiler
    checks its own; a grant or manifest written as JSON/YAML is checked here): SBP207/SBP208 at
    the pattern's position, all at once."""
    from policy_engine.patterns import validate_host_pattern

    diags: list[Diagnostic] = []
    for i, cap in enumerate(caps):
        for j, host in enumerate(getattr(cap, "hosts", ())):
            problem = validate_host_pattern(host)
            if problem is not None:
                diags.append(Diagnostic.make(
                    "SBP207", f"invalid {what} field `{key}[{i}].hosts[{j}]`: {problem}",
                    lookup.span((key, i, "hosts", j))))
        for j, slot in enumerate(getattr(cap, "args", None) or ()):
            for k, alt in enumerate(slot.alternatives):
                problem = None if alt.regex is None else regex_problem(alt.regex)
                if problem is not None:
                    diags.append(Diagnostic.make(
                        "SBP208", f"invalid {what} field "
                        f"`{key}[{i}].args[{j}].alternatives[{k}].regex`: {problem}",
                        lookup.span((key, i, "args", j, "alternatives", k, "regex"))))
        for j, alt in enumerate(getattr(cap, "env", None) or ()):
            problem = None if alt.regex is None else regex_problem(alt.regex)
            if problem is not None:
                diags.append(Diagnostic.make(
                    "SBP208", f"invalid {what} field `{key}[{i}].env[{j}].regex`: {problem}",
                    lookup.span((key, i, "env", j, "regex"))))
    if diags:
        raise DiagnosticsError(diags)


def _manifest_from_policy(shown: str, home: str) -> Manifest:
    # Deferred import: the compiler depends on this package, not the other way round; only
    # this entry point needs the compiler's block checker.
    from policy_engine.compiler.blocks import build_manifest
    from policy_engine.dsl import ast
    from policy_engine.dsl.parser import parse_file  # Lark: only for a manifest in a policy
    from policy_engine.patterns import expand_home

    pf, diags = parse_file(shown)
    if pf is None or diags:
        raise DiagnosticsError(diags)
    tools = [i for i in pf.items if isinstance(i, ast.ToolDef)]
    if len(tools) != 1:
        found = ", ".join(f"`{t.name.value}`" for t in tools) or "none"
        raise DiagnosticsError([Diagnostic.make(
            "SBP105", f"expected exactly one `tool` block, found {found}", Span(shown, 1, 1),
            help="put each tool manifest in its own file",
        )])
    manifest = build_manifest(tools[0], diags)
    if manifest is None or diags:
        raise DiagnosticsError(diags)
    perms = tuple(
        p.model_copy(update={"paths": tuple(expand_home(x, home) for x in p.paths)})
        if hasattr(p, "paths") else p
        for p in manifest.permissions
    )
    return manifest.model_copy(update={"permissions": perms})
