"""Attack round 32 on the exec artifacts, on both exec stores (SQLite and a real PostgreSQL):
M1, an exec that leaves thousands of files is listed up to ``--max-artifacts`` entries, marked
truncated, and the listing never walks past the cap; L2, a name with a newline (or another
control character) is listed percent-encoded and its listed path downloads. Real `policy-engine
serve` subprocesses on loopback; the execs run in the real sandbox."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.integration.service_server import Service, serving
from tests.integration.shared_servers import (  # noqa: F401  (the *_fixture ones)
    pg_dsn_fixture,
    pg_server_fixture,
)
from tests.integration.test_service_nonutf8_names import _token

pytestmark = pytest.mark.integration

CAP = 100
SERVICE_FILES = {"stdout.txt", "stderr.txt", "manifest.json", "meta.json"}
MANY = ('d="$(ls -d ../artifacts/*/ | head -1)"; mkdir "$d/sub"; '
        'for i in $(seq 1 5000); do : > "$d/f$i"; done; printf deep > "$d/sub/deep.txt"; '
        'printf planted > "$d/manifest.json"; echo done')
NAMES = ('d="$(ls -d ../artifacts/*/ | head -1)"; printf nl > "$d"/$\'nl\\nname\'; '
         'printf tab > "$d"/$\'t\\tx%y\'; printf del > "$d"/$\'d\\x7f\'; '
         'printf plain > "$d/plain%41.txt"')


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Service, str]]:
    extra: list[str] = ["--max-artifacts", str(CAP)]
    config = None
    if request.param == "postgres":
        dsn = request.getfixturevalue("pg_dsn")
        config = tmp_path / "engine.json"
        config.write_text(json.dumps({"state_dir": str(tmp_path / "state"),
                                      "options": {"service_postgres": {"dsn": dsn}}}))
        extra += ["--config", str(config)]
    with serving(tmp_path, *extra) as svc:
        yield svc, _token(svc, config)


def _exec(svc: Service, token: str, script: str) -> tuple[dict[str, Any], dict[str, Any]]:
    with svc.client(token) as c:
        resp = c.post("/sandbox/execs", json={"project_id": "bounds",
                                              "exec": {"kind": "shell", "script": script}})
        assert resp.status_code == 200, resp.text
        rec = resp.json()
        listing = c.get(f"/sandbox/execs/{rec['exec_id']}/artifacts")
        assert listing.status_code == 200, listing.text
        assert len(listing.content) < 64 * 1024  # what is stored is what is listed: bounded
        return rec, listing.json()


def test_thousands_of_files_are_listed_up_to_the_cap(backend: tuple[Service, str]) -> None:
    svc, token = backend
    rec, listing = _exec(svc, token, MANY)
    assert rec["status"] == "ok", rec
    assert rec["artifacts_truncated"] is True
    assert listing["truncated"] is True
    paths = [a["path"] for a in listing["artifacts"]]
    produced = [p for p in paths if p not in SERVICE_FILES]
    assert len(produced) == CAP, len(produced)
    assert set(paths) >= SERVICE_FILES  # the service's own files are always listed
    with svc.client(token) as c:
        base = f"/sandbox/execs/{rec['exec_id']}/artifacts"
        manifest = c.get(f"{base}/manifest.json").json()  # the service's, not the planted one
        assert manifest["truncated"] is True
        assert len(manifest["artifacts"]) == CAP + 2  # stdout.txt and stderr.txt with them
        got = c.get(f"{base}/{quote(produced[0])}")
        assert got.status_code == 200, got.text
        assert c.get(f"{base}/f4999").status_code in (200, 404)  # listed or not, never 500
        assert c.get(f"/sandbox/execs/{rec['exec_id']}").json()["artifacts_truncated"] is True
    # under the cap nothing is marked
    rec, listing = _exec(svc, token, "echo hi")
    assert rec["artifacts_truncated"] is False
    assert listing["truncated"] is False


def test_a_control_character_name_is_listed_escaped_and_downloads(
        backend: tuple[Service, str]) -> None:
    svc, token = backend
    rec, listing = _exec(svc, token, NAMES)
    assert rec["status"] == "ok", rec
    arts = {a["path"]: a for a in listing["artifacts"]}
    assert arts["nl%0Aname"]["not_utf8"] is True  # the listed path has no raw newline
    assert arts["t%09x%25y"]["not_utf8"] is True  # escaped, so `%` is escaped too
    assert arts["d%7F"]["not_utf8"] is True
    assert arts["plain%41.txt"]["not_utf8"] is False  # a plain name is listed as it is
    expected = {"nl%0Aname": b"nl", "t%09x%25y": b"tab", "d%7F": b"del",
                "plain%41.txt": b"plain"}
    with svc.client(token) as c:
        for path, body in expected.items():
            got = c.get(f"/sandbox/execs/{rec['exec_id']}/artifacts/{quote(path)}")
            assert got.status_code == 200, (path, got.text)  # was 404 for the newline
            assert got.content == body


def test_the_scan_stops_at_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from policy_engine.service import workspace

    for i in range(5000):
        (tmp_path / f"f{i}").touch()
    seen = 0
    real = os.scandir

    class Counting:
        def __init__(self, path: Any) -> None:
            self.it = real(path)

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.it.close()

        def __iter__(self) -> Counting:
            return self

        def __next__(self) -> os.DirEntry[str]:
            nonlocal seen
            entry = next(self.it)
            seen += 1
            return entry

    monkeypatch.setattr(os, "scandir", Counting)
    scan = workspace.scan_artifacts(tmp_path, limit=10)
    assert scan.truncated
    assert len(scan.found) == 10
    assert seen <= 11, seen  # not 5,000
