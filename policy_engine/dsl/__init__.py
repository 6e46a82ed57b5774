"""The `.sbpolicy` language: grammar, parser, AST, CEL adapter, document loaders, rendering."""

from policy_engine.dsl.parser import parse_file, parse_source, read_source

__all__ = ["parse_file", "parse_source", "read_source"]
