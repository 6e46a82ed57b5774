"""Commands loaded when first used: `policy-engine explain` imports explain's module, not lint's.

Each command module pulls in what it needs (the compiler, the guard, an HTTP server, the
authoring tools); importing every one up front cost more than the command itself on short runs.
The group's ``commands`` is a mapping that imports ``policy_engine.cli.<name>`` on first access
(a hyphen in a command name is an underscore in its module: `new-plugin` is ``new_plugin``),
so ``--help`` (which lists them all) still shows every command and its help text.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping, Sequence

import click


class LazyCommands(MutableMapping[str, click.Command]):
    """``name → command``; a listed module is imported the first time its command is read."""

    def __init__(self, modules: Sequence[str], package: str = "policy_engine.cli") -> None:
        self._modules = tuple(modules)
        self._package = package
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        cmd = self._loaded.get(name)
        if cmd is not None:
            return cmd
        if name not in self._modules:
            raise KeyError(name)
        module = importlib.import_module(f"{self._package}.{name.replace('-', '_')}")
        cmd = module.command
        if not isinstance(cmd, click.Command) or cmd.name != name:
            raise RuntimeError(f"{self._package}.{name} must define `command` named {name!r}")
        self._loaded[name] = cmd
        return cmd

    def __setitem__(self, name: str, cmd: click.Command) -> None:
        self._loaded[name] = cmd

    def __delitem__(self, name: str) -> None:
        if name in self._modules:
            self._modules = tuple(m for m in self._modules if m != name)
        self._loaded.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._modules or name in self._loaded

    def __iter__(self) -> Iterator[str]:
        yield from self._modules
        yield from (n for n in self._loaded if n not in self._modules)

    def __len__(self) -> int:
        return len(self._modules) + sum(1 for n in self._loaded if n not in self._modules)
