"""Parse JSON and YAML documents within fixed bounds, with the position of every key and item.

Manifests, grants, requests, settings and policy-test files come from people and tools that may
be careless or hostile. Before any value is built, one streaming pass over the document (a regex
tokenizer for JSON, libyaml's event stream for YAML; neither recurses) refuses what would make
the engine loop, exhaust memory or crash:

- nesting deeper than :data:`MAX_DEPTH` (libyaml's composer recurses in C and segfaults on
  ~25,000 nested `[`);
- an alias that refers to a node containing it (a cycle), or aliases that together expand the
  document by more than :data:`MAX_ALIAS_NODES` nodes (the "billion laughs");
- more than :data:`MAX_NODES` values written in one document (memory grows with the values,
  not the bytes: a 4 MB list of `1` is two million of them);
- integers longer than :data:`MAX_INT_DIGITS` digits (Python refuses over 4,300, and no field
  needs more than 64 bits);
- scalars a YAML tag promises but cannot deliver (`!!int abc`, a timestamp `2001-13-45`);
- a key written twice in one mapping (JSON and YAML keep the last one silently).

The same pass records where each key and list item was written, so no caller ever walks the
composed graph (which, with aliases, is not a tree).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import yaml

MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_ALIAS_NODES = 100_000
MAX_NODES = 100_000
"""Values (keys, scalars, lists, mappings) written in one document: a 4 MB list of small
integers is two million of them, over a gigabyte once built."""
MAX_INT_DIGITS = 20

Loc = tuple[str | int, ...]
Positions = dict[Loc, tuple[int, int]]

# PyYAML is imported on first use (a YAML document): policies, JSON and `check` never need it


@lru_cache(maxsize=1)
def _loader() -> type[yaml.SafeLoader]:
    import yaml

    loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return loader


_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_PLAIN = frozenset({_STR, "tag:yaml.org,2002:null", "tag:yaml.org,2002:bool",
                    "tag:yaml.org,2002:merge"})


class DocumentError(Exception):
    """The document is refused; ``line`` and ``column`` are 1-based."""

    def __init__(self, message: str, line: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


@dataclass(slots=True)
class _Frame:
    """One open mapping or sequence while scanning."""

    loc: Loc
    mapping: bool
    anchor: str | None = None
    nodes: int = 1
    index: int = 0
    expect_key: bool = True
    key: str = ""
    keys: dict[object, tuple[int, int]] = field(default_factory=dict)


class _Scan:
    """The bookkeeping shared by the JSON and YAML scans: depth, positions, duplicate keys."""

    def __init__(self) -> None:
        self.stack: list[_Frame] = []
        self.positions: Positions = {}
        self.count = 0

    def counted(self, line: int, col: int) -> None:
        """One more value written; refused past :data:`MAX_NODES`."""
        self.count += 1
        if self.count > MAX_NODES:
            raise DocumentError(f"more than {MAX_NODES:,} values in one document; split it",
                                line, col)

    def child_loc(self, line: int, col: int) -> Loc | None:
        """Where the node starting at ``line:col`` sits (``None`` for a mapping key)."""
        if not self.stack:
            return ()
        top = self.stack[-1]
        if top.mapping:
            return None if top.expect_key else (*top.loc, top.key)
        loc = (*top.loc, top.index)
        self.positions[loc] = (line, col)
        return loc

    def open(self, mapping: bool, line: int, col: int, anchor: str | None = None) -> None:
        if len(self.stack) >= MAX_DEPTH:
            raise DocumentError(f"nested more than {MAX_DEPTH} levels deep", line, col)
        loc = self.child_loc(line, col)
        self.stack.append(_Frame(loc if loc is not None else (), mapping, anchor))

    def key(self, identity: object, shown: str, line: int, col: int) -> None:
        """A scalar key of the innermost mapping; refuses one already written there."""
        top = self.stack[-1]
        first = top.keys.get(identity)
        if first is not None:
            raise DocumentError(
                f"duplicate key `{shown[:80]}` (first written at line {first[0]}, column "
                f"{first[1]}); a key may appear once in a mapping", line, col)
        top.keys[identity] = (line, col)
        top.key = shown
        self.positions[(*top.loc, shown)] = (line, col)

    def done(self, nodes: int) -> None:
        """A node of ``nodes`` nodes (aliases expanded) is complete in the innermost frame."""
        if not self.stack:
            return
        top = self.stack[-1]
        top.nodes += nodes
        if top.mapping:
            top.expect_key = not top.expect_key
        else:
            top.index += 1


# ---- JSON ---------------------------------------------------------------------------------------

_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[{}\[\]:,]|-?[0-9][0-9.eE+-]*|[A-Za-z]+', re.DOTALL)


def parse_json(text: str) -> tuple[Any, Positions]:
    """Parse JSON text within the bounds; :class:`DocumentError` or ``ValueError`` (the JSON
    parser's own, with ``lineno``/``colno``) when refused."""
    positions = _scan_json(text)
    return json.loads(text), positions


def _scan_json(text: str) -> Positions:
    scan = _Scan()
    line, line_start, last = 1, 0, 0
    for m in _JSON_TOKEN.finditer(text):
        pos = m.start()
        newlines = text.count("\n", last, pos)
        if newlines:
            line += newlines
            line_start = text.rindex("\n", last, pos) + 1
        last = pos
        col = pos - line_start + 1
        tok = m.group()
        first = tok[0]
        top = scan.stack[-1] if scan.stack else None
        if first not in "}]:,":
            scan.counted(line, col)
        if first in "{[":
            scan.open(first == "{", line, col)
        elif first in "}]":
            if top is None or top.mapping != (first == "}"):
                break  # malformed: json.loads says where
            done = scan.stack.pop()
            scan.done(done.nodes)
        elif first == ",":
            if top is not None and top.mapping:
                top.expect_key = True
        elif first == ":":
            continue
        elif top is not None and top.mapping and top.expect_key:
            try:
                key = json.loads(tok)
            except ValueError:
                break
            scan.key(key, str(key), line, col)
            top.expect_key = False
        else:
            scan.child_loc(line, col)
            if first in "-0123456789" and not any(c in tok for c in ".eE"):
                _check_int(tok, line, col)
            if top is not None and not top.mapping:
                top.index += 1
            elif top is not None:
                top.nodes += 1
    return scan.positions


def _check_int(text: str, line: int, col: int) -> None:
    digits = sum(c.isdigit() for c in text)
    if digits > MAX_INT_DIGITS:
        raise DocumentError(
            f"integer with {digits} digits; integers have at most {MAX_INT_DIGITS}", line, col)


# ---- YAML ---------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _resolver() -> Any:
    import yaml

    return yaml.resolver.Resolver()


def parse_yaml(text: str) -> tuple[Any, Positions]:
    """Parse one YAML document within the bounds; :class:`DocumentError` or ``yaml.YAMLError``
    (with its marks) when refused."""
    positions = _scan_yaml(text)
    loader = _loader()(text)
    try:
        return loader.get_single_data(), positions
    finally:
        loader.dispose()


def _scan_yaml(text: str) -> Positions:
    import yaml

    scan = _Scan()
    anchors: dict[str, int] = {}
    aliased = 0
    documents = 0
    for event in yaml.parse(text, Loader=_loader()):  # a generator: disposes the parser
        mark = event.start_mark
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        if isinstance(event, yaml.NodeEvent):
            scan.counted(line, col)
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise DocumentError("a file holds one YAML document; remove the second "
                                    "`---` and what follows", line, col)
        elif isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            scan.open(isinstance(event, yaml.MappingStartEvent), line, col, event.anchor)
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            done = scan.stack.pop()
            if done.anchor is not None:
                anchors[done.anchor] = done.nodes
            scan.done(done.nodes)
        elif isinstance(event, yaml.AliasEvent):
            name = event.anchor or ""
            if any(f.anchor == name for f in scan.stack):
                raise DocumentError(f"alias `*{name}` refers to a node that contains it",
                                    line, col)
            if name not in anchors:
                raise DocumentError(f"alias `*{name}` names no anchor defined before it",
                                    line, col)
            aliased += anchors[name]
            if aliased > MAX_ALIAS_NODES:
                raise DocumentError(
                    f"aliases expand the document by more than {MAX_ALIAS_NODES} nodes",
                    line, col)
            _scalar_or_alias(scan, line, col)
            scan.done(anchors[name])
        elif isinstance(event, yaml.ScalarEvent):
            tag = _tag(event)
            if tag not in _PLAIN:
                _check_scalar(event, tag, line, col)
            top = scan.stack[-1] if scan.stack else None
            if top is not None and top.mapping and top.expect_key:
                scan.key((tag, event.value), str(event.value), line, col)
            else:
                scan.child_loc(line, col)
            if event.anchor is not None:
                anchors[event.anchor] = 1
            scan.done(1)
    return scan.positions


def _scalar_or_alias(scan: _Scan, line: int, col: int) -> None:
    top = scan.stack[-1] if scan.stack else None
    if top is None or not (top.mapping and top.expect_key):
        scan.child_loc(line, col)


def _tag(event: yaml.ScalarEvent) -> str:
    if event.tag and event.tag != "!":
        return str(event.tag)
    if event.tag == "!" or not event.implicit[0]:
        return _STR
    import yaml

    resolved = _resolver().resolve(
        yaml.ScalarNode, event.value, event.implicit)
    return str(resolved)


def _check_scalar(event: yaml.ScalarEvent, tag: str, line: int, col: int) -> None:
    import yaml

    """Build the scalar once on its own: a tag that cannot hold its value is refused here,
    with its position, instead of as an exception out of the constructor."""
    if tag == _INT:
        _check_int(event.value, line, col)
    node = yaml.ScalarNode(tag, event.value)
    try:
        yaml.constructor.SafeConstructor().construct_object(node)
    except yaml.MarkedYAMLError as exc:  # an unknown tag: the constructor's own words
        raise DocumentError(str(exc.problem or exc.context or exc), line, col) from None
    except (yaml.YAMLError, ValueError, TypeError, AttributeError, KeyError,
            OverflowError) as exc:
        short = tag.rsplit(":", 1)[-1]
        raise DocumentError(f"`{event.value[:40]}` is not a valid `!!{short}` "
                            f"({_first_line(exc)})", line, col) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().split("\n", 1)[0] or type(exc).__name__)[:120]
