"""Lazy re-exports for package faces (PEP 562): a name is imported from its module on first use."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(package: str, where: Mapping[str, str], names: Iterable[str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, whose name ``n`` lives in
    ``package.<where[n]>``; a name, once imported, becomes a plain attribute."""
    namespace = sys.modules[package].__dict__
    listed = frozenset(names)

    def get(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def listing() -> list[str]:
        return sorted({*namespace, *listed})

    return get, listing
