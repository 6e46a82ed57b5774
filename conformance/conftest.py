"""Conformance fixtures: a real temporary workspace and a loopback HTTP server for executed cases.

The workspace holds the files, secrets and symlinks the cases name (``@WORKSPACE@``); the
server (``@HTTP@``/``@PORT@``) answers plain pages, redirects to forbidden addresses, an endless
body and a slow page, so executed cases exercise the real executors end to end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.json import JSONSnapshotExtension

from tests.integration.servers import Handler, LoopbackServer, endless, redirect, send

sys.path.insert(0, str(Path(__file__).resolve().parent))

from casekit import Env  # noqa: E402  (the conformance directory is not a package)


def _slow(h: Handler) -> None:
    time.sleep(3)  # longer than any executed case's timeout: the client must give up first
    send(h, 200, "text/plain", b"too late")


ROUTES = {
    "/ok": lambda h: send(h, 200, "text/plain", b"hello from the loopback server\n"),
    "/ok/page": lambda h: send(h, 200, "text/plain", b"an allowed page\n"),
    "/json": lambda h: send(h, 200, "application/json", b'{"ok": true}'),
    "/secret": lambda h: send(h, 200, "text/plain", b"must never be served\n"),
    "/redirect/same-host": redirect("/ok"),
    "/redirect/metadata": redirect("http://169.254.169.254/latest/meta-data/"),
    "/redirect/private": redirect("http://10.0.0.1/admin"),
    "/redirect/loopback-other-port": redirect("http://127.0.0.1:2/"),
    "/redirect/outside-prefix": redirect("/secret"),
    "/big": endless(),
    "/slow": _slow,
}


def build_workspace(root: Path) -> None:
    """The tree every executed case sees: plain files, secrets, and symlinks out of it."""
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('hello')\n")
    (root / "README.md").write_text("# demo workspace\n")
    (root / "docs").mkdir()
    (root / "docs" / "guide.md").write_text("guide\n")
    (root / "work" / "release").mkdir(parents=True)
    (root / "work" / "existing.txt").write_text("keep me\n")
    (root / ".env").write_text("API_TOKEN=conformance-fake-secret\n")
    (root / "escape").symlink_to("/etc")
    (root / "shadow-link").symlink_to("/etc/shadow")
    (root / "passwd-link").symlink_to("../../../../../../../../etc/passwd")
    (root / "inner-link").symlink_to("src/app.py")
    (root / "dotenv-link").symlink_to(".env")
    (root.parent / "tmp").mkdir()


@pytest.fixture(scope="session")
def case_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("conformance")
    workspace = base / "workspace"
    build_workspace(workspace)
    with LoopbackServer(ROUTES) as server:
        yield Env(workspace=workspace, http_base=f"http://127.0.0.1:{server.port}",
                  port=server.port, python=sys.executable, tmp_dir=base / "tmp")


@pytest.fixture
def snapshot_json(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    return snapshot.use_extension(JSONSnapshotExtension)
