"""pytest plugin (entry point ``pytest11``): ``pytest --pe-executor NAME`` adds one test item
per conformance check of the installed executor NAME. Inert without ``--pe-executor``.

The suite runs once per executor while pytest collects (the checks share one set of calls
through the orchestrator); each item then reports its own check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from policy_engine.config import load_config
from policy_engine.conformance.harness import SetupError
from policy_engine.conformance.report import CheckResult
from policy_engine.conformance.sinks import run_sink_suite
from policy_engine.conformance.suite import TIMEOUT_MS, run_suite


class ConformanceFailure(Exception):
    """A check failed; its text is the whole failure report (no traceback is useful)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("policy-engine", "policy-engine executor conformance")
    group.addoption("--pe-executor", action="append", default=[], metavar="NAME",
                    help="run the conformance checks against the installed executor NAME "
                         "(repeatable)")
    group.addoption("--pe-timeout-ms", type=int, default=TIMEOUT_MS, metavar="MS",
                    help=f"profile timeout for the timeout check (default {TIMEOUT_MS})")
    group.addoption("--pe-probe-timeout-ms", type=int, default=None, metavar="MS",
                    help="profile timeout of every other probe (default: the system default, "
                         "60 s)")
    group.addoption("--pe-sink", action="append", default=[], metavar="NAME",
                    help="run the evidence-sink checks against the installed sink NAME "
                         "(repeatable)")
    group.addoption("--pe-config", default=None, metavar="FILE",
                    help="engine configuration whose plugin `options` (and `mode`) the "
                         "executor is built with")
    group.addoption("--pe-mode", choices=("strict", "compat"), default=None,
                    help="strict (default) or compat: run probes degraded on a backend lacking "
                         "what their profile needs and check the evidence records it")


class CheckItem(pytest.Item):
    """One conformance check of one executor."""

    def __init__(self, *, check: CheckResult | None, setup_error: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check
        self.setup_error = setup_error
        # no fixtures; present because some plugins' runtest wrappers expect every item to
        # have it (pytest-lsp 1.0 returns without yielding otherwise, failing every check)
        self.funcargs: dict[str, Any] = {}

    def runtest(self) -> None:
        if self.setup_error is not None:
            raise ConformanceFailure(self.setup_error)
        assert self.check is not None  # INVARIANT: set whenever setup_error is not
        if self.check.status == "n/a":
            pytest.skip(f"not applicable: {self.check.note}")
        if self.check.status == "fail":
            raise ConformanceFailure(f"{self.check.id}: {self.check.title}\n"
                                     + "\n".join(f"- {p}" for p in self.check.problems))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str:
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name


def _setup_message(name: str, exc: SetupError) -> str:
    lines = [f"cannot run the conformance suite for `{name}`: {exc}"]
    if exc.executors:
        lines.append("installed executors: " + ", ".join(exc.executors))
    lines.extend(f"plugin `{e.plugin}` failed to {e.stage}: {e.message}"
                 for e in exc.load_errors)
    lines.extend([f"help: {exc.hint}"] if exc.hint else [])
    return "\n".join(lines)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    names: list[str] = config.getoption("pe_executor")
    sinks: list[str] = config.getoption("pe_sink")
    if not names and not sinks:
        return
    options: dict[str, Any] = {}
    mode = config.getoption("pe_mode")
    path = config.getoption("pe_config")
    if path is not None:
        try:
            engine = load_config(Path(path))
        except ValueError as exc:
            raise pytest.UsageError(f"--pe-config {path}: {exc}") from None
        options = dict(engine.options)
        mode = mode or engine.mode
    for name in names:
        try:
            report = run_suite(name, timeout_ms=config.getoption("pe_timeout_ms"),
                               options=options, mode="compat" if mode == "compat" else "strict",
                               probe_timeout_ms=config.getoption("pe_probe_timeout_ms"))
        except SetupError as exc:
            items.append(CheckItem.from_parent(session, name=f"conformance[{name}]::setup",
                                               check=None,
                                               setup_error=_setup_message(name, exc)))
            continue
        for check in report.results:
            items.append(CheckItem.from_parent(session, name=f"conformance[{name}]::{check.id}",
                                               check=check))
    for sink in sinks:
        try:
            sink_report = run_sink_suite(sink, options=options)
        except ValueError as exc:
            items.append(CheckItem.from_parent(session, name=f"conformance[sink:{sink}]::setup",
                                               check=None, setup_error=str(exc)))
            continue
        for check in sink_report.results:
            items.append(CheckItem.from_parent(
                session, name=f"conformance[sink:{sink}]::{check.id}", check=check))
