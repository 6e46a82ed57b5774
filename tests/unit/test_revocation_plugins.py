"""`revocation` may name a plugin's list (issue 18): an unknown name stops the engine with a
clear message, a bad value is refused by the config loader, and a plugin's list is used."""

from __future__ import annotations

from pathlib import Path

import pytest

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig
from policy_engine.hookspecs import hookimpl
from policy_engine.model import Grant
from policy_engine.orchestrator import Orchestrator
from policy_engine.plugin_manager import PluginManager

POLICY = 'policy "t/rev" version "1.0.0"\npermit "r" fs.read paths ["/nowhere/**"]\n'


class ListedRevocations:
    """A plugin's revocation list: everything is revoked."""

    def is_revoked(self, grant: Grant) -> bool:
        return True


class Provider:
    @hookimpl
    def policy_engine_revocation_list(self, config: EngineConfig) -> ListedRevocations | None:
        return ListedRevocations() if config.revocation == "listed" else None


class Broken:
    @hookimpl
    def policy_engine_revocation_list(self, config: EngineConfig) -> None:
        raise ValueError("listed: option `url` is required")


def _policy(tmp_path: Path) -> Path:
    path = tmp_path / "p.sbpolicy"
    path.write_text(POLICY)
    return path


def test_a_plugin_list_is_used(tmp_path: Path) -> None:
    pm = PluginManager.default()
    pm.register(Provider(), "provider")
    config = EngineConfig(state_dir=tmp_path, revocation="listed")
    with Orchestrator(compile_files([_policy(tmp_path)]), config=config, plugins=pm) as orch:
        assert isinstance(orch.revocations, ListedRevocations)


def test_a_list_no_plugin_provides_stops_the_engine(tmp_path: Path) -> None:
    config = EngineConfig(state_dir=tmp_path, revocation="nosuch")
    with pytest.raises(ValueError, match=r"revocation list `nosuch` is not provided by any "
                                         r"loaded plugin"):
        Orchestrator(compile_files([_policy(tmp_path)]), config=config)


def test_a_failing_plugin_is_named(tmp_path: Path) -> None:
    pm = PluginManager.default()
    pm.register(Broken(), "broken")
    config = EngineConfig(state_dir=tmp_path, revocation="listed")
    with pytest.raises(ValueError, match=r"revocation list `listed` could not be started: "
                                         r"plugin `broken`: ValueError: listed: option `url`"):
        Orchestrator(compile_files([_policy(tmp_path)]), config=config, plugins=pm)


@pytest.mark.parametrize("value", ["", "Redis!", 3, "x" * 40])
def test_the_loader_refuses_a_bad_name(value: object) -> None:
    with pytest.raises(ValueError, match=r"`revocation` must be `sqlite`, `memory`, `none` or"):
        EngineConfig.from_mapping({"revocation": value})


def test_the_loader_accepts_a_plugin_name() -> None:
    assert EngineConfig.from_mapping({"revocation": "redis"}).revocation == "redis"
