"""Load the `.sbpolicy` grammar once and keep the LALR parser built from it in a cache."""

from __future__ import annotations

from contextvars import ContextVar
from functools import lru_cache
from importlib import resources
from typing import Any

from lark import Lark, Token
from lark import __version__ as lark_version

from policy_engine.dsl.grammar_cache import cache_file, publish

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


# Where the lexer puts the comments of the parse under way (None: nobody is collecting).
# A context variable, because the parser is one shared object and parses may run on many threads.
comment_sink: ContextVar[list[Token] | None] = ContextVar("sbpolicy_comment_sink", default=None)


def _collect_comment(token: Token) -> Token:
    sink = comment_sink.get()
    if sink is not None:
        sink.append(token)
    return token


@lru_cache(maxsize=1)
def get_parser() -> Lark:
    """The cached parser: LALR(1), contextual lexer, every token kept for the AST builder.

    The contextual lexer matters: keywords such as ``timeout`` are also limit names, and only the
    parser state tells which one is meant. Comments are ignored by the grammar but handed to
    :data:`comment_sink` so that ``fmt`` can keep them and ``lint`` can read suppressions.
    """
    text = grammar_text()
    options: dict[str, Any] = {
        "parser": "lalr",
        "lexer": "contextual",
        # positions and keyword tokens are handled by the AST builder in one pass (faster)
        "propagate_positions": False,
        "keep_all_tokens": True,
        "maybe_placeholders": False,
    }
    cached = cache_file(text, repr(sorted(options.items())), lark_version)
    if cached is None:
        return Lark(text, lexer_callbacks={"COMMENT": _collect_comment}, **options)
    target, fresh = cached
    parser = Lark(text, lexer_callbacks={"COMMENT": _collect_comment}, cache=str(fresh),
                  **options)
    publish(target, fresh)
    return parser


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
