"""What the `/v1/ops` path remembers between calls (issue 27, docs/benchmarks.md "Thirteenth
pass") answers exactly what it answered without remembering: per profile object and path, per
op's fields and key, and never for another profile, op or key."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from plugins.executor_fs import executor, listing, resolve
from plugins.executor_fs.listing import mandatory_denied
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.evidence import digest
from policy_engine.evidence.digest import digest_json, inputs_digest, redacted_op
from policy_engine.executor import CancelToken, ExecContext
from policy_engine.gateway.outcome import _decision_json
from policy_engine.guard.verdict import _restamp
from policy_engine.ids import envelope_id
from policy_engine.model import (
    CapabilityKind,
    Decision,
    FsCapability,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    Limits,
    NetHttpOp,
    ProfileDeny,
    RuleRef,
)
from policy_engine.pid import current as current_pid
from tests.unit.test_executor_fs import ctx_for, fs, make_profile


def _uncached_denied(profile: object, path: str) -> str | None:
    listing._DENIED.clear()  # noqa: SLF001
    found = mandatory_denied(profile, path)  # type: ignore[arg-type]
    listing._DENIED.clear()  # noqa: SLF001
    return found


def test_a_mandatory_deny_is_remembered_per_denies_and_path(tmp_path: Path) -> None:
    plain = make_profile(tmp_path)
    keys = plain.model_copy(update={"denies": (*plain.denies, ProfileDeny(
        kinds=(CapabilityKind.FS_READ,), capability=FsCapability(kind="fs.read",
                                                                  paths=("**/*.pem",)),
        rule=RuleRef(id="keys", file="system", line=2, column=1), mandatory=True))})
    paths = [f"{tmp_path}/a/.env", f"{tmp_path}/a/id.pem", f"{tmp_path}/a/ok.txt"]
    profiles = (plain, keys)
    want = {(i, path): _uncached_denied(p, path) for i, p in enumerate(profiles)
            for path in paths}
    assert want[(0, paths[0])] == "secrets"
    assert want[(1, paths[1])] == "keys"
    assert want[(0, paths[1])] is None
    assert want[(1, paths[2])] is None
    for _ in range(3):  # first from the patterns, then remembered: the same answers
        for (i, path), answer in want.items():
            assert mandatory_denied(profiles[i], path) == answer


def test_the_remembered_denies_are_bounded(tmp_path: Path) -> None:
    profile = make_profile(tmp_path)
    for i in range(listing._DENIED_MAX + 10):  # noqa: SLF001
        assert mandatory_denied(profile, f"{tmp_path}/f{i}") is None
    assert len(listing._DENIED) <= listing._DENIED_MAX  # noqa: SLF001
    assert mandatory_denied(profile, f"{tmp_path}/x/.env") == "secrets"


@pytest.mark.parametrize("op", [
    FsReadOp(path="/w/a.txt"), FsReadOp(path="/w/a.txt", offset=3),
    FsReadOp(path="/w/a.txt", len=3), FsReadOp(path="/w/a.txt", offset=0, len=0),
    FsReadOp(path="/w/\u00e9.txt"), FsListOp(path="/w"), FsListOp(path="/w", depth=3),
    FsWriteOp(path="/w/a.txt", bytes_b64="eA=="), NetHttpOp(url="https://x.test/?k=1"),
])
def test_an_inputs_digest_is_the_digest_of_the_redacted_op(op: object) -> None:
    for key in (None, b"k" * 32, b"j" * 32):
        want = digest_json(redacted_op(op, key))  # type: ignore[arg-type]
        assert inputs_digest(op, key) == want  # type: ignore[arg-type]
        assert inputs_digest(op, key) == want  # type: ignore[arg-type]  # remembered


def test_ops_that_differ_in_any_field_have_their_own_digest() -> None:
    ops: list[FsReadOp | FsListOp] = [
        FsReadOp(path="/w/a"), FsReadOp(path="/w/b"), FsReadOp(path="/w/a", offset=1),
        FsReadOp(path="/w/a", len=1), FsListOp(path="/w/a"), FsListOp(path="/w/a", depth=2)]
    digests = {inputs_digest(op).b64 for op in ops}
    assert len(digests) == len(ops)
    for i in range(digest._INPUTS_MAX + 5):  # noqa: SLF001
        inputs_digest(FsReadOp(path=f"/w/{i}"))
    assert len(digest._INPUTS) <= digest._INPUTS_MAX  # noqa: SLF001


def test_a_cancel_token_made_lazily_still_wakes_its_waiter() -> None:
    token = CancelToken()
    assert not token.cancelled
    assert token.wait(0) is False
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(token.wait(10)))
    waiter.start()
    time.sleep(0.05)
    token.cancel("timeout")
    waiter.join(5)
    assert woke == [True]
    assert token.cancelled
    assert token.reason == "timeout"


def test_a_token_cancelled_before_anyone_waits_is_cancelled() -> None:
    token = CancelToken()
    token.cancel()
    assert token.cancelled
    assert token.wait(0) is True
    assert token.reason == "cancelled"


def test_threads_racing_to_make_the_event_share_one() -> None:
    for _ in range(50):
        token = CancelToken()
        start = threading.Barrier(9)
        seen: list[bool] = []

        def wait(t: CancelToken = token, b: threading.Barrier = start,
                 out: list[bool] = seen) -> None:
            b.wait()
            out.append(t.wait(10))

        threads = [threading.Thread(target=wait) for _ in range(8)]
        for t in threads:
            t.start()
        start.wait()
        token.cancel()
        for t in threads:
            t.join(10)
        assert seen == [True] * 8


def test_the_kept_pid_is_the_childs_in_a_forked_child() -> None:
    assert current_pid() == os.getpid()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.write(write, b"%d %d" % (current_pid(), os.getpid()))
        os._exit(0)
    os.close(write)
    kept, real = os.read(read, 100).split()
    os.close(read)
    os.waitpid(child, 0)
    assert kept == real
    assert int(kept) == child
    assert current_pid() == os.getpid()


def test_a_read_under_a_real_root_opens_in_one_call(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole path in one ``openat2``: the root is not opened on its own."""
    (tmp_path / "a.txt").write_text("hi")
    opened: list[str] = []

    def counted(root: str) -> int:
        opened.append(root)
        return resolve.open_root(root)

    monkeypatch.setattr(executor, "open_root", counted)
    res = fs(True).execute(ctx_for(tmp_path), FsReadOp(path=str(tmp_path / "a.txt")))
    assert res.out["size"] == 2
    assert opened == []


@pytest.mark.parametrize("how", ["link-root", "link-above", "dotdot"])
def test_a_root_the_one_call_cannot_open_is_refused_the_long_way(tmp_path: Path, how: str
                                                                  ) -> None:
    """A symlink on the root's path, or ``..`` in it: the same refusal as before the one
    call (``open_root``'s), for a read, a listing and a write."""
    real = tmp_path / "real" / "ws"
    real.mkdir(parents=True)
    (real / "a.txt").write_text("hi")
    if how == "link-root":
        root = tmp_path / "ws-link"
        root.symlink_to(real)
    elif how == "link-above":
        (tmp_path / "up").symlink_to(tmp_path / "real")
        root = tmp_path / "up" / "ws"
    else:
        root = tmp_path / "real" / "x" / ".." / "ws"
        (tmp_path / "real" / "x").mkdir()
    ctx = ExecContext(profile=make_profile(tmp_path), deadline=time.monotonic() + 30)
    ctx = ExecContext(profile=ctx.profile.model_copy(update={"mappings": ctx.profile.mappings
                      .model_copy(update={"root_fs": str(root)})}), deadline=ctx.deadline)
    for op in (FsReadOp(path=f"{root}/a.txt"), FsListOp(path=str(root)),
               FsWriteOp(path=f"{root}/b.txt", bytes_b64="eA==")):
        with pytest.raises(PolicyEngineError) as exc:
            fs(True).execute(ctx, op)
        assert exc.value.code == ErrorCode.CAPABILITY_BLOCKED
        assert "symlink on its path" in exc.value.reason or ".." in exc.value.reason, \
            exc.value.reason


def test_profiles_sharing_their_denies_share_the_answers_but_not_another_home(
        tmp_path: Path) -> None:
    """Every profile of a builder carries the policy's denies tuple: a grant's new call id
    (a new profile) finds the answer kept; a profile with another home does not."""
    first = make_profile(tmp_path)
    second = first.model_copy(update={"call_id": "c2"})
    assert second.denies is first.denies
    home_deny = ProfileDeny(kinds=(CapabilityKind.FS_READ,), capability=FsCapability(
        kind="fs.read", paths=("~/.ssh/**",)), rule=RuleRef(id="ssh", file="system", line=3,
                                                           column=1), mandatory=True)
    at_a = first.model_copy(update={"denies": (home_deny,), "mappings": first.mappings
                                    .model_copy(update={"home": f"{tmp_path}/a"})})
    at_b = at_a.model_copy(update={"mappings": at_a.mappings.model_copy(
        update={"home": f"{tmp_path}/b"})})
    assert mandatory_denied(first, f"{tmp_path}/x/.env") == "secrets"
    assert mandatory_denied(second, f"{tmp_path}/x/.env") == "secrets"
    assert mandatory_denied(at_a, f"{tmp_path}/a/.ssh/id") == "ssh"
    assert mandatory_denied(at_b, f"{tmp_path}/a/.ssh/id") is None
    assert mandatory_denied(at_b, f"{tmp_path}/b/.ssh/id") == "ssh"


def test_envelope_ids_are_uuid4_hex_and_never_repeat() -> None:
    ids = [envelope_id() for _ in range(3000)]  # past one pool of 256
    assert len(set(ids)) == len(ids)
    for value in ids[:600]:
        parsed = uuid.UUID(hex=value)
        assert parsed.hex == value
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_a_forked_child_hands_out_other_ids_than_its_parent() -> None:
    envelope_id()  # a pool with ids left in it
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.write(write, " ".join(envelope_id() for _ in range(5)).encode())
        os._exit(0)
    os.close(write)
    theirs = set(os.read(read, 1000).decode().split())
    os.close(read)
    os.waitpid(child, 0)
    ours = {envelope_id() for _ in range(5)}
    assert len(theirs) == 5
    assert not theirs & ours


def test_a_restamped_allows_answer_is_its_own_rendering() -> None:
    """Grants of one shape share a compiled profile whose prebuilt allow each call restamps
    with its own profile's hash: the run document shows each call's decision as pydantic
    renders it, whichever rendering was kept."""
    limits = Limits(max_bytes_in=10, timeout_ms=5)
    rule = RuleRef(id="read", file="p.sbpolicy", line=2, column=1)
    first = Decision(decision="allow", http_status=200, rule=rule, profile_hash="a" * 64,
                     limits=limits, limit_layers={"max_bytes_in": "rule"})
    marked = first.model_copy(update={"reason": "0pe0mark0 in a reason"})
    calls = [_restamp(first, f"{i:064x}") for i in range(6)] + [
        _restamp(first, ""), first, _restamp(marked, "b" * 64), _restamp(marked, "c" * 64),
        _restamp(marked, "d" * 64),
        Decision(decision="deny", code="SANDBOX.PERMISSION_DENY", http_status=403,
                 profile_hash="e" * 64, reason="no")]
    for decision in calls * 2:
        assert _decision_json(decision) == \
            decision.model_dump_json(exclude_none=True).encode()
    other = _restamp(first.model_copy(update={"limits": Limits(max_bytes_in=11)}), "f" * 64)
    assert b'"max_bytes_in":11' in _decision_json(other)
