"""Outsider attack round 38, F1: an agent's ``fs.write`` reaches the engine's own cache.

The engine keeps its policy parser's tables as a pickle in ``~/.cache/policy-engine``
(docs/operations.md, "Start-up": "a directory only this user owns and nobody else can write"),
beside the native launcher cache (``bin/``) that a proc sandbox may never write
(``enginedirs.protected_trees``, outsider round 3, F7). An ``fs.write`` op is performed by the
engine itself, as the engine's uid, so the file it leaves passes the "only this user" check:
a call permitted to write the home directory's caches plants a pickle, and the next command
that builds the parser runs it as the engine's uid, outside every sandbox.

Everything lives in a temporary HOME; the payload only writes a marker file there.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


class _Marker:
    """Unpickled, it runs ``id`` into a file (what any code could do there)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"id > {self.path}",))


def _cli(home: Path, cwd: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_CACHE_HOME", "POLICY_ENGINE_STATE", "POLICY_ENGINE_GRAMMAR_CACHE",
                        "POLICY_ENGINE_LISTING_CACHE")}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT), **extra)
    return subprocess.run([sys.executable, "-m", "policy_engine.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def _documents(tmp_path: Path, home: Path, tool: str, args_rule: str) -> list[str]:
    """A policy, manifest and grant letting the agent write the home's caches and run ``tool``;
    the ``run`` arguments naming them."""
    caches = f"{home}/.cache/**"
    (tmp_path / "p.sbpolicy").write_text(
        'policy "t/a38" version "1.0.0"\n'
        "defaults { timeout 30s }\n"
        f'permit "tool-caches" fs.write paths ["{caches}"]\n'
        f'permit "tool" proc.exec tool "{tool}" args {args_rule}\n'
        "require consent when `false`\n")
    perms = [{"kind": "fs.write", "paths": [caches]}, {"kind": "proc.exec", "tool": tool}]
    (tmp_path / "m.json").write_text(json.dumps({
        "name": "w", "version": "1.0.0", "permissions": perms,
        "side_effects": ["Write", "Process"], "safety_class": "Low"}))
    (tmp_path / "g.json").write_text(json.dumps({
        "tenant": "t", "subject_id": "agent:w", "tool_name": "w", "call_id": "c1",
        "capabilities": perms, "expires_at": 4_102_444_800_000}))
    return ["run", "--policy", str(tmp_path / "p.sbpolicy"),
            "--manifest", str(tmp_path / "m.json"), "--grant", str(tmp_path / "g.json"),
            "--state-dir", str(tmp_path / "st"), "--format", "json"]


def test_attack38_fs_write_cannot_plant_the_engines_parser_cache(tmp_path: Path) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    home.mkdir()
    ws.mkdir()
    caches = f"{home}/.cache/**"
    (tmp_path / "p.sbpolicy").write_text(
        'policy "t/a38" version "1.0.0"\n'
        "defaults { timeout 30s }\n"
        f'permit "tool-caches" fs.write paths ["{caches}"]\n'
        "require consent when `false`\n")
    perms = [{"kind": "fs.write", "paths": [caches]}]
    (tmp_path / "m.json").write_text(json.dumps({
        "name": "w", "version": "1.0.0", "permissions": perms, "side_effects": ["Write"],
        "safety_class": "Low"}))
    (tmp_path / "g.json").write_text(json.dumps({
        "tenant": "t", "subject_id": "agent:w", "tool_name": "w", "call_id": "c1",
        "capabilities": perms, "expires_at": 4_102_444_800_000}))
    # a file the fast reader defers to Lark: checking it builds (and caches) the parser
    bad = tmp_path / "bad.sbpolicy"
    bad.write_text('policy "t/bad" version "1.0.0"\npermit "x" fs.read paths [\n')
    first = _cli(home, ws, "check", str(bad))
    assert first.returncode != 0, first.stderr[-2000:]
    assert "Traceback" not in first.stderr, first.stderr[-2000:]
    cache_dir = home / ".cache" / "policy-engine"
    cached = sorted(cache_dir.glob("sbpolicy-grammar-*"))
    assert cached, f"no parser cache was written in {cache_dir}: {os.listdir(cache_dir)}"

    marker = tmp_path / "PWNED"
    payload = b"x\n" + pickle.dumps(_Marker(str(marker)))
    (tmp_path / "req.json").write_text(json.dumps({
        "settings": {"root_fs": str(home)},  # the operator roots the agent at the home dir
        "op": {"kind": "fs.write", "path": str(cached[0]), "overwrite": True,
               "bytes_b64": base64.b64encode(payload).decode()}}))
    wrote = _cli(home, ws, "run", "--policy", str(tmp_path / "p.sbpolicy"),
                 "--manifest", str(tmp_path / "m.json"), "--grant", str(tmp_path / "g.json"),
                 "--request", str(tmp_path / "req.json"), "--state-dir", str(tmp_path / "st"),
                 "--format", "json")
    result = json.loads(wrote.stdout)["result"]

    again = _cli(home, ws, "check", str(bad))
    assert "Traceback" not in again.stderr, again.stderr[-2000:]
    # expected: the engine refuses to write its own trees for an agent (as proc does for a
    # writable bind holding them), or at least never runs what an agent wrote there
    assert not marker.exists(), (
        f"the agent's fs.write (ok={result['ok']}) planted a pickle the engine ran: "
        f"{marker.read_text().strip()}")


def test_attack38_fs_write_cannot_replace_the_native_launcher(tmp_path: Path) -> None:
    """The same write over the cached launcher (a tree a proc sandbox may never write,
    ``enginedirs.protected_trees``): the file it leaves is the engine's and 0644, so
    ``native.verify`` passes it and every later sandboxed call of every engine process on this
    cache fails (``cannot start the sandbox: Permission denied``)."""
    home, ws = tmp_path / "home", tmp_path / "ws"
    home.mkdir()
    ws.mkdir()
    run = _documents(tmp_path, home, "python3", '["-c", /.*/]')
    hello = [*run, "--", "python3", "-c", "print('hello')"]

    before = json.loads(_cli(home, ws, *hello).stdout)["result"]
    assert before["ok"] is True, before
    assert before["out"]["stdout"].strip() == "hello", before
    launcher = next((home / ".cache" / "policy-engine" / "bin").glob("sb_launch-*"))
    (tmp_path / "req.json").write_text(json.dumps({
        "settings": {"root_fs": str(home)},
        "op": {"kind": "fs.write", "path": str(launcher), "overwrite": True,
               "bytes_b64": base64.b64encode(b"#!/bin/sh\nexit 0\n").decode()}}))
    _cli(home, ws, *run, "--request", str(tmp_path / "req.json"))
    after = json.loads(_cli(home, ws, *hello).stdout)["result"]
    # expected: the write refused (as a writable bind there is), the sandbox as before
    assert after["ok"] is True, (
        f"an agent's fs.write replaced the engine's launcher: {after.get('code')}: "
        f"{after.get('message')}")
    assert after["out"]["stdout"].strip() == "hello", after


def test_attack38_fs_write_cannot_forge_the_stored_mask_walk(tmp_path: Path) -> None:
    """The same write over the stored mask walk (``mask-walks-py311.bin``, marshal data the
    next start trusts once each directory's stamp still holds, docs/operations.md "Secrets"):
    a forged copy naming no secret in a system tree whose directories did not change makes the
    next one-call `run` leave a `.env` there unmasked, and a sandboxed `cat` prints it.

    To have a system tree of our own (no system file is touched) the engine runs with
    ``PYTHONHOME`` at a directory in the checkout: its Python prefix is one of the trees every
    sandbox binds and the stored walk covers (not under /tmp: the sandbox's /tmp is its own)."""
    import marshal
    import shutil
    import tempfile
    import time

    home, ws = tmp_path / "home", tmp_path / "ws"
    home.mkdir()
    ws.mkdir()
    prefix = Path(tempfile.mkdtemp(prefix=".attack38-pyhome-", dir=ROOT))
    try:
        (prefix / "lib").mkdir()
        real = Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        (prefix / "lib" / real.name).symlink_to(real)
        (prefix / "share").mkdir()
        secret = prefix / "share" / ".env"
        secret.write_text("API_KEY=planted-in-a-system-tree\n")
        for p, mode in ((prefix, 0o755), (prefix / "share", 0o755), (secret, 0o644)):
            os.chmod(p, mode)
        time.sleep(2.5)  # older than the racy window: a listing made sooner is never trusted
        run = _documents(tmp_path, home, "cat", "[/.*/]")
        extra = {"PYTHONHOME": str(prefix)}

        before = json.loads(_cli(home, ws, *run, "--", "cat", str(secret), **extra).stdout)
        assert before["result"]["ok"] is True, before
        assert str(secret) in before["result"]["out"]["masked"], before  # the walk found it
        assert "planted" not in before["result"]["out"]["stdout"]

        store = next((home / ".cache" / "policy-engine").glob("mask-walks-*.bin"))
        fmt, rows = marshal.loads(store.read_bytes())
        forged = [(key0, blob, stamps, fids, table,
                   tuple((d, h) for d, h in hits if not d.startswith(str(prefix))))
                  for key0, blob, stamps, fids, table, hits in rows
                  if any(r.startswith(str(prefix)) for r, _ in key0)]  # under 1 MiB: ours only
        assert forged, rows
        (tmp_path / "req.json").write_text(json.dumps({
            "settings": {"root_fs": str(home)},
            "op": {"kind": "fs.write", "path": str(store), "overwrite": True,
                   "bytes_b64": base64.b64encode(marshal.dumps((fmt, forged))).decode()}}))
        _cli(home, ws, *run, "--request", str(tmp_path / "req.json"), **extra)

        after = json.loads(_cli(home, ws, *run, "--", "cat", str(secret), **extra).stdout)
        out = after["result"].get("out", {})
        # expected: the write refused, or a stored walk the agent wrote never trusted
        assert "planted" not in out.get("stdout", ""), (
            f"a forged stored walk unmasked {secret}: {out.get('stdout')!r}")
        assert str(secret) in out.get("masked", []), after
    finally:
        shutil.rmtree(prefix, ignore_errors=True)
