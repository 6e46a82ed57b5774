"""Lazy imports: re-exports for package faces (PEP 562) and third-party modules, on first use."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
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


class LazyModule:
    """A stand-in for the module ``name``, imported the first time one of its attributes is
    read: a plugin's third-party SDK (docker, playwright, redis, psycopg, httpx) costs nothing
    until the plugin serves a call. A submodule the package does not import itself
    (``docker.types``) is imported when named."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            # introspection (`inspect`, pluggy scanning a plugin's names, copy, pickle) asks for
            # dunders: answering it must not import the module
            raise AttributeError(attr)
        module = self._module
        if module is None:  # the import lock makes a racing first use import it once
            module = self._module = importlib.import_module(self._name)
        try:
            return getattr(module, attr)
        except AttributeError:
            pass
        try:
            return importlib.import_module(f"{self._name}.{attr}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{self._name}.{attr}":
                raise
        raise AttributeError(f"module {self._name!r} has no attribute {attr!r}")

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r} ({state})>"


def lazy_module(name: str, *, required: bool = False) -> Any:
    """A :class:`LazyModule` for ``name``. ``required``: raise ``ModuleNotFoundError`` now (its
    ``name`` the missing top-level module) when ``name`` is not installed, as ``import name``
    would, so a plugin whose extra is missing is still reported when it loads
    (plugin_manager's ``not_installed``) without paying for the import."""
    if required:
        top = name.partition(".")[0]
        # `sys.modules[top] = None` blocks an import: it is missing as far as `import` goes
        known = top in sys.modules
        if sys.modules.get(top) is None if known else importlib.util.find_spec(top) is None:
            raise ModuleNotFoundError(f"No module named {top!r}", name=top)
    return LazyModule(name)
