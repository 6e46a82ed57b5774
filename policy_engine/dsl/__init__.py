"""The `.sbpolicy` language: grammar, parser, AST, CEL adapter, document loaders, rendering."""

from __future__ import annotations

from typing import Any

__all__ = ["parse_file", "parse_source", "read_source"]


def __getattr__(name: str) -> Any:
    # lazy (PEP 562): `from policy_engine.dsl import ast` must not import the Lark parser
    if name in __all__:
        from policy_engine.dsl import parser

        return getattr(parser, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
