"""A docker bound call never shows the engine's state directory (attack 36 #1, docker side).

A bound call (cwd outside the container's ``/workspace``) binds the user's tree at its own
path. With the engine's state dir inside that tree (``./var`` of the project, the CLI's
default) and the docker workspace configured elsewhere (``workspace_root``), the container read
``var/keys/evidence-hmac.key``: the guard refuses ops *on* the state dir, and proc sandboxes mask
it inside their binds (``guard.binds.state_masks``), but docker masked only the mandatory
denies. Now a container's binds get the same state masks as bubblewrap's, run-once and warm
pool alike; the session workspaces under it stay, and a file beside the state dir stays
readable."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from tests.integration.test_backend_refusal_decision import _cli
from tests.integration.test_docker_write_identity import _bound
from tests.integration.test_write_identity import (  # noqa: F401 (fixture)
    OWNER,
    _repo,
    place,
)

pytestmark = pytest.mark.integration

READ = ("import pathlib, sys; r = pathlib.Path(sys.argv[1])\n"
        "for rel in ('var/keys/evidence-hmac.key', 'var/planted.txt', 'a.txt'):\n"
        "    try:\n"
        "        print(rel, '=', (r / rel).read_text().strip())\n"
        "    except OSError as e:\n"
        "        print(rel, 'errno', e.errno)\n")


@pytest.mark.parametrize("mode", ["run-once", "pool"])
def test_a_docker_bound_call_does_not_see_the_state_dir_in_its_tree(
        tmp_path: Path, place: Path, mode: str) -> None:  # noqa: F811
    repo = _repo(place, OWNER)
    marker = f"STATE_MARKER_{secrets.token_hex(24)}"  # a usable key: 32 bytes or more
    state = repo / "var"
    (state / "keys").mkdir(parents=True)
    (state / "keys" / "evidence-hmac.key").write_text(marker)
    (state / "planted.txt").write_text(marker)
    args = _bound(tmp_path, repo, mode, code=READ)
    config = json.loads((tmp_path / "engine.yaml").read_text())
    config["state_dir"] = str(state)
    config["options"]["docker"]["workspace_root"] = str(tmp_path / "docker-ws")
    (tmp_path / "engine.yaml").write_text(json.dumps(config))
    ran = _cli("run", *args, "--format", "json")
    assert ran.stdout.startswith("{"), ran.stdout + ran.stderr
    out = json.loads(ran.stdout)
    assert out["result"]["ok"] is True, out["result"]
    stdout = str(out["result"]["out"]["stdout"])
    assert marker not in stdout, stdout
    assert "a.txt = a" in stdout, stdout  # the rest of the tree is there
    assert marker not in ran.stdout + ran.stderr
