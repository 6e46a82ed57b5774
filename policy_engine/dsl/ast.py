"""AST of a `.sbpolicy` file: plain dataclasses, every node carrying its source span.

The transformer (:mod:`policy_engine.dsl.transform`) builds these from the Lark tree; the checker
and the compiler read them. Values are kept as written (``10MiB`` stays the text ``10MiB`` in a
:class:`Quantity`) so that the checker can point at the exact token when a unit is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from policy_engine.errors import Span


@dataclass(frozen=True, slots=True)
class Str:
    """A double-quoted string literal, already unescaped."""

    value: str
    span: Span


@dataclass(frozen=True, slots=True)
class Word:
    """A bare word: an enum value (``off``, ``read-only``, ``High``) or a limit/scope name."""

    value: str
    span: Span


@dataclass(frozen=True, slots=True)
class Quantity:
    """A number with an optional unit as written: ``443``, ``0.5``, ``10MiB``, ``1920x1080``."""

    text: str
    span: Span


Value = Str | Word | Quantity


@dataclass(frozen=True, slots=True)
class Header:
    name: Str
    version: Str
    span: Span


@dataclass(frozen=True, slots=True)
class Import:
    path: Str
    span: Span


@dataclass(frozen=True, slots=True)
class Limit:
    """One ``name value`` entry of a ``limits { ... }`` block."""

    name: Word
    value: Quantity
    span: Span


@dataclass(frozen=True, slots=True)
class LimitsBlock:
    items: tuple[Limit, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Setting:
    """A one-value statement of a block: ``timeout 60s``, ``network off``, ``safety High``,
    ``fs read-only``, ``description "..."``, ``profile "name"`` (inside a tool block)."""

    key: str
    value: Value
    span: Span


@dataclass(frozen=True, slots=True)
class ListSetting:
    """A list statement of a block: ``writable [...]``, ``side_effects [...]``."""

    key: str
    values: tuple[Value, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Defaults:
    settings: tuple[Setting, ...]
    limits: tuple[LimitsBlock, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Resource:
    """``paths [...]``, ``hosts [...]``, ``ports [...]``, ``schemes``, ``methods``, ``mime``,
    ``scopes``: a resource list of a rule."""

    name: str
    values: tuple[Value, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class ArgAlt:
    """One alternative of an argument slot: a literal, or a regex stored without slashes."""

    literal: str | None
    regex: str | None
    span: Span


@dataclass(frozen=True, slots=True)
class ArgSlotNode:
    alternatives: tuple[ArgAlt, ...]
    repeat: bool
    span: Span


@dataclass(frozen=True, slots=True)
class ToolClause:
    """``tool "git" args [ ... ]`` of a proc.exec rule; ``args`` is ``None`` when omitted."""

    tool: Str
    args: tuple[ArgSlotNode, ...] | None
    span: Span


@dataclass(frozen=True, slots=True)
class EnvClause:
    """``env ["LANG", /^LC_/]`` of a proc.exec rule: the variables a call may set (a literal is
    an exact name, a regex is searched in the name)."""

    names: tuple[ArgAlt, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Scalar:
    """``max_bytes 64MiB`` (tmp.use) or ``class "a100"`` (sys.gpu)."""

    name: str
    value: Value
    span: Span


@dataclass(frozen=True, slots=True)
class Cel:
    """A backtick-quoted CEL condition.

    :param span: position of the opening backtick; the CEL text starts one column after it.
    """

    source: str
    span: Span


Clause = Resource | ToolClause | EnvClause | Scalar | LimitsBlock | Cel


@dataclass(frozen=True, slots=True)
class Rule:
    """A ``permit`` or ``forbid`` rule (top level, or a ``permit`` inside a tool block)."""

    effect: Literal["permit", "forbid"]
    mandatory: bool
    name: Str | None
    kinds: tuple[Word, ...]
    clauses: tuple[Clause, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Consent:
    """``require consent`` (always) or ``require consent when `cel```."""

    condition: Cel | None
    span: Span


@dataclass(frozen=True, slots=True)
class ProfileDef:
    name: Str
    settings: tuple[Setting | ListSetting, ...]
    limits: tuple[LimitsBlock, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class ToolDef:
    """A ``tool "name" version "x" { ... }`` block: the source of a tool Manifest."""

    name: Str
    version: Str
    permits: tuple[Rule, ...]
    settings: tuple[Setting | ListSetting, ...]
    limits: tuple[LimitsBlock, ...]
    span: Span


Item = Header | Import | Defaults | Rule | Consent | ProfileDef | ToolDef


@dataclass(frozen=True, slots=True)
class Comment:
    """A ``# ...`` or ``// ...`` comment as written (marker included), with its span."""

    text: str
    span: Span


@dataclass(slots=True)
class PolicyFile:
    """One parsed file.

    :param file: the display path used in spans and rule ids (relative paths stay relative).
    :param source: the decoded text, kept for diagnostics and the version hash.
    :param comments: every comment in source order (empty when the file has a syntax error).
    """

    file: str
    source: str
    items: list[Item] = field(default_factory=list)
    comments: list[Comment] = field(default_factory=list)

    @property
    def headers(self) -> list[Header]:
        return [i for i in self.items if isinstance(i, Header)]

    @property
    def imports(self) -> list[Import]:
        return [i for i in self.items if isinstance(i, Import)]
