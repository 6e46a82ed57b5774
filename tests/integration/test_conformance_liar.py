"""Issue 32 attack H1: an installed executor plugin that declares every claim, runs tools with
plain ``subprocess`` as host root, and refuses (``SANDBOX.CAPABILITY_BLOCKED``) only programs
whose argv looks like an attack must FAIL the conformance kit: a refused probe proves nothing.

The plugin (tests/fixtures/liar_plugin, the outsider's reproducer) is pip-installed with
``--target`` into a test-owned directory and the kit runs in a fresh interpreter whose
``PYTHONPATH`` adds it, exactly as its author would run ``policy-engine conformance``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.integration.test_new_plugin import ROOT, run

pytestmark = pytest.mark.integration
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "liar_plugin"


def test_a_liar_that_refuses_the_probes_fails_the_kit(tmp_path: Path) -> None:
    src = tmp_path / "liar"
    shutil.copytree(FIXTURE, src)
    site = tmp_path / "site"
    pip = run("-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-deps",
              "--no-build-isolation", "--target", str(site), str(src), cwd=tmp_path)
    assert pip.returncode == 0, pip.stderr
    # this checkout's engine (not whichever one the console script points at), the plugin
    # from its own directory. The liar hands a tool its stdin only once the tool has ended, so
    # the markers probe (which reads stdin) hangs until its profile timeout: 5 s instead of the
    # system default's 60 (every other probe ends in well under a second on this executor)
    kit = run("-c", f"import sys; sys.path[:0] = [{str(site)!r}, {str(ROOT)!r}]; "
              "from policy_engine.cli.main import main; main()",
              "conformance", "--executor", "liar-exec", "--format", "json",
              "--probe-timeout-ms", "5000", cwd=tmp_path)
    assert kit.returncode == 1, kit.stdout + kit.stderr
    checks = json.loads(kit.stdout)["checks"]
    failed = {r["id"] for r in checks if r["status"] == "fail"}
    said = {r["id"]: " ".join(r["problems"]) for r in checks}
    assert {"claims.network-off", "claims.writes-confined", "claims.not-host-root",
            "claims.mandatory-denies", "claims.env-filtering", "claims.resource-limits",
            "claims.probes-run"} <= failed, failed
    # what the probes saw once they ran: the liar runs them as host root and hands back the
    # planted secrets
    assert "host uid 0" in said["claims.not-host-root"]
    assert "/root/.env` (its SHA-256 came back through run)" in said["claims.mandatory-denies"]
    assert "reached the tool" in said["claims.env-filtering"]
    assert "did not run the markers probe: it ended with LLM.TIMEOUT" \
        in said["claims.probes-run"]
