"""Plugin manager: entry-point loading, validation by name, failure isolation, the CLI listing."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from policy_engine.cli.plugins import command
from policy_engine.config import EngineConfig
from policy_engine.hookspecs import hookimpl
from policy_engine.plugin_manager import PluginManager, describe


class Misnamed:
    @hookimpl
    def policy_engine_executor(self, config: EngineConfig) -> list[object]:  # singular: no spec
        return []


class WrongArgs:
    @hookimpl
    def policy_engine_executors(self, config: EngineConfig, extra: int) -> list[object]:
        return []


class RaisingFactory:
    @hookimpl
    def policy_engine_evidence_sinks(self, config: EngineConfig) -> list[object]:
        raise ValueError("option `path` must be absolute")


def test_first_party_plugins_load_through_entry_points() -> None:
    pm = PluginManager.default()
    for name in ("evidence_jsonl", "evidence_sqlite", "budget_memory", "budget_sqlite"):
        assert pm.sources[name].distribution == "policy-engine"
    assert pm.sources["evidence_jsonl"].module == "plugins.evidence_jsonl"


def test_misnamed_hook_and_bad_signature_are_refused_by_name() -> None:
    pm = PluginManager()
    assert pm.register(Misnamed(), "misnamed") is False
    assert pm.register(WrongArgs(), "wrong-args") is False
    assert [(e.plugin, e.stage) for e in pm.load_errors] == [
        ("misnamed", "validate"), ("wrong-args", "validate")]
    assert "unknown hook 'policy_engine_executor'" in pm.load_errors[0].message
    assert "extra" in pm.load_errors[1].message
    assert not pm.pm.has_plugin("misnamed")  # unregistered: the rest of the hooks stay usable
    pm.pm.check_pending()


def test_a_raising_factory_is_reported_and_the_others_still_contribute(tmp_path: Path) -> None:
    pm = PluginManager.default()
    pm.register(RaisingFactory(), "raising")
    comps = pm.components(EngineConfig(state_dir=tmp_path))
    assert "jsonl" in comps.sinks
    assert comps.meter is not None
    assert comps.meter.name == "sqlite"
    assert [(e.plugin, e.stage) for e in pm.load_errors] == [("raising", "evidence_sinks")]
    comps.close()


def test_describe_lists_every_sink_and_meter_without_touching_the_state_dir(
        tmp_path: Path) -> None:
    info = describe(PluginManager.default(), EngineConfig(state_dir=tmp_path / "state"))
    by_name = {p["name"]: p for p in info["plugins"]}
    assert by_name["evidence_sqlite"]["sinks"] == ["sqlite"]
    assert by_name["budget_memory"]["meters"] == ["memory"]
    assert by_name["budget_memory"]["hooks"] == ["policy_engine_budget_meter"]
    assert not (tmp_path / "state").exists()


def test_plugins_command_text_and_json() -> None:
    runner = CliRunner()
    text = runner.invoke(command, [])
    assert text.exit_code == 0
    assert "evidence_jsonl  (policy-engine 0.1.0)" in text.output
    assert "  sink jsonl" in text.output
    as_json = runner.invoke(command, ["--format", "json"])
    assert as_json.exit_code == 0
    names = [p["name"] for p in json.loads(as_json.output)["plugins"]]
    assert "budget_sqlite" in names
    bad = runner.invoke(command, ["--config", "/nonexistent/engine.yaml"])
    assert bad.exit_code == 2
    assert "cannot read config" in bad.output
