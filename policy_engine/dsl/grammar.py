"""Load the `.sbpolicy` grammar once and keep the LALR parser built from it in a cache."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from lark import Lark

GRAMMAR_PACKAGE = "policy_engine.dsl"
GRAMMAR_RESOURCE = "grammar/sbpolicy.lark"

# Human names for terminals, used when a syntax error lists what was expected.
_TERMINAL_NAMES: dict[str, str] = {
    "STRING": "a string",
    "WORD": "a word",
    "QUANTITY": "a number",
    "KIND": "a capability kind (e.g. `fs.read`)",
    "REGEX": "a `/regex/`",
    "CEL": "a `` `CEL` `` condition",
    "RESOURCE": "a resource (`paths`, `hosts`, `ports`, ...)",
    "SCALAR": "`max_bytes` or `class`",
    "PERMIT": "`permit`",
    "FORBID": "`forbid`",
    "MANDATORY": "`mandatory`",
    "TOOL": "`tool`",
    "TOOL_BLOCK": "`tool`",
    "ELLIPSIS": "`...`",
    "$END": "end of file",
}


def grammar_text() -> str:
    """The grammar as shipped in the package (a symlink to ``dsl/sbpolicy.lark`` in a checkout)."""
    return resources.files(GRAMMAR_PACKAGE).joinpath(GRAMMAR_RESOURCE).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def get_parser() -> Lark:
    """The cached parser: LALR(1), contextual lexer, positions propagated onto every tree node.

    The contextual lexer matters: keywords such as ``timeout`` are also limit names, and only the
    parser state tells which one is meant.
    """
    return Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
    )


def describe_terminal(name: str) -> str:
    """A human description of terminal ``name`` for "expected ..." lists."""
    if name in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[name]
    try:
        term = get_parser().get_terminal(name)
    except KeyError:
        return name.lower()
    pattern = term.pattern
    if pattern.type == "str":
        return f"`{pattern.value}`"
    return name.lower()
