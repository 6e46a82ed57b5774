"""Outsider round 37: a docker bound call masks a mandatory deny under a directory whose name
is not UTF-8 at the wrong path. The mask of `<repo>/bad\\xff\\xfe/.env` reaches docker as
`bad\\ufffd\\ufffd/.env` (the API's JSON is UTF-8): runc mounts the mask on a new, root-owned
directory it creates in the user's tree, and the real `.env` stays readable in the container.
proc-bwrap masks the same tree correctly. Through the CLI, real docker.

Now docker refuses such a call (``SANDBOX.CAPABILITY_BLOCKED``, ``refused_by: backend``, the
name shown with ``?`` for the bytes it cannot carry): no container is made, nothing is read,
nothing is created in the user's tree; proc-bwrap, whose mounts take bytes, runs it masked."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
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

READ = ("import os, sys\n"
        "for n in sorted(os.listdir(sys.argv[1])):\n"
        "    try:\n"
        "        print(repr(n), open(os.path.join(sys.argv[1], n, '.env')).read())\n"
        "    except OSError as e:\n"
        "        print(repr(n), 'errno', e.errno)\n")


@pytest.mark.parametrize("backend", ["docker", "proc-bwrap"])
def test_a_secret_under_a_non_utf8_directory_stays_masked(
        tmp_path: Path, place: Path, backend: str) -> None:  # noqa: F811
    repo = _repo(place, OWNER)
    marker = f"ENV_MARKER_{secrets.token_hex(12)}"
    odd = os.path.join(os.fsencode(repo), b"latin1-caf\xe9")
    os.mkdir(odd)
    with open(os.path.join(odd, b".env"), "w") as f:
        f.write(marker)
    os.lchown(odd, *OWNER)
    before = sorted(os.listdir(os.fsencode(repo)))
    args = _bound(tmp_path, repo, "run-once", code=READ, backend=backend)
    ran = _cli("run", *args, "--format", "json")
    assert ran.stdout.startswith("{"), ran.stdout + ran.stderr
    assert marker not in ran.stdout + ran.stderr
    out = json.loads(ran.stdout)
    if backend == "docker":
        _refused(ran.returncode, out)
    else:
        assert out["result"]["ok"] is True, out["result"]
        stdout = str(out["result"]["out"]["stdout"])
        assert "'a.txt'" in stdout, stdout  # the call ran over the tree
    # nothing was created in the user's tree by the masking
    assert sorted(os.listdir(os.fsencode(repo))) == before


def _refused(code: int, out: dict[str, object]) -> None:
    result = out["result"]
    assert isinstance(result, dict)
    assert code == 1, out
    assert result["ok"] is False, result
    assert result["code"] == "SANDBOX.CAPABILITY_BLOCKED", result
    assert "not UTF-8" in json.dumps(out), out


STATE_READ = ("import os, sys\n"
              "key = os.path.join(os.fsencode(sys.argv[1]), b'st\\xe9', b'keys',\n"
              "                   b'evidence-hmac.key')\n"
              "try:\n"
              "    print('key =', open(key).read())\n"
              "except OSError as e:\n"
              "    print('key errno', e.errno)\n"
              "print('a.txt =', open(os.path.join(sys.argv[1], 'a.txt')).read())\n")


@pytest.mark.parametrize("backend", ["docker", "proc-bwrap"])
def test_a_state_dir_with_a_non_utf8_name_stays_hidden_in_a_bound_tree(
        tmp_path: Path, place: Path, backend: str) -> None:  # noqa: F811
    """The engine's state dir inside the project (`--state-dir`, the CLI's `./var` case) under
    a name that is not UTF-8: the container read its evidence key."""
    repo = _repo(place, OWNER)
    state = os.path.join(os.fsencode(repo), b"st\xe9")
    os.makedirs(os.path.join(state, b"keys"))
    marker = f"STATE_MARKER_{secrets.token_hex(24)}"
    with open(os.path.join(state, b"keys", b"evidence-hmac.key"), "w") as f:
        f.write(marker)
    args = _bound(tmp_path, repo, "run-once", code=STATE_READ, backend=backend)
    config = json.loads((tmp_path / "engine.yaml").read_text())
    del config["state_dir"]
    config["options"]["docker"]["workspace_root"] = str(tmp_path / "docker-ws")
    (tmp_path / "engine.yaml").write_text(json.dumps(config))
    argv = ["run", *args, "--state-dir", os.fsdecode(state), "--format", "json"]
    ran = subprocess.run([os.fsencode(a) for a in [sys.executable, "-m", "policy_engine.cli",
                                                   *argv]],
                         capture_output=True, timeout=120, check=False)
    text = ran.stdout.decode(errors="replace")
    assert marker not in text + ran.stderr.decode(errors="replace"), text
    out = json.loads(text)
    if backend == "docker":
        _refused(ran.returncode, out)
    else:
        assert out["result"]["ok"] is True, out["result"]
        assert "a.txt = a" in str(out["result"]["out"]["stdout"]), text  # the call ran
