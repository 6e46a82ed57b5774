"""The replay block keeps what a decision needs and no secret: markers in every withheld field."""

from __future__ import annotations

import base64
import json

import pytest

from policy_engine.model import (
    BrowserNavOp,
    BrowserScreenshotOp,
    ExecOp,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    Grant,
    Manifest,
    NetHttpOp,
    ProcExecOp,
)
from policy_engine.recording.record import op_view, replay_block, unseal, url_shape
from policy_engine.replay.engine import Unreplayable, rebuild_op

M = "mk-7c1e9a"  # every withheld value carries it
GRANT = Grant(tenant="acme", subject_id="a", tool_name="t", call_id="c", expires_at=10)
MANIFEST = Manifest(name="t", version="1")
KEY = b"s" * 32


def ops() -> list[ExecOp]:
    payload = base64.b64encode(f"{M}-payload".encode()).decode()
    return [
        FsWriteOp(path="/w/out.txt", bytes_b64=payload),
        NetHttpOp(method="POST", url=f"https://u{M}:p{M}@api.example.com:8443/v1?t={M}#f{M}",
                  headers={"Authorization": f"Bearer {M}"}, body_b64=payload),
        BrowserNavOp(url=f"https://docs.example.com/p?q={M}"),
        BrowserScreenshotOp(url=f"https://docs.example.com/#{M}"),
        ProcExecOp(tool="git", args=("status", f"--token={M}"), env={"TOKEN": M},
                   stdin_b64=payload),
    ]


@pytest.mark.parametrize("op", ops(), ids=lambda o: o.kind)
def test_no_withheld_value_is_in_the_block_and_the_sealed_copy_restores_the_op(
        op: ExecOp) -> None:
    clear = replay_block("env-1", op, GRANT, MANIFEST, None, settings=None, overrides=None,
                         context={"tenant": {"id": M}}, now_ms=5, seal_key=None)
    assert M not in json.dumps(clear)
    assert clear["context_keys"] == ["tenant"]
    sealed = replay_block("env-1", op, GRANT, MANIFEST, None, settings=None, overrides=None,
                          context={"tenant": {"id": M}}, now_ms=5, seal_key=KEY)
    text = json.dumps(sealed)
    assert M not in text
    opened = unseal(KEY, "env-1", sealed["sealed"])
    assert opened["context"] == {"tenant": {"id": M}}
    rebuilt = rebuild_op(sealed["op"], opened)
    # what the guard decides on comes back exactly; payloads come back as same-size stand-ins
    for field in ("kind", "path", "url", "method", "tool", "args"):
        assert getattr(rebuilt, field, None) == getattr(op, field, None), field
    with pytest.raises(ValueError, match="does not open"):
        unseal(KEY, "env-2", sealed["sealed"])


def test_payload_sizes_and_names_survive_for_the_limits() -> None:
    op = ops()[1]
    assert isinstance(op, NetHttpOp)
    block = replay_block("e", op, GRANT, MANIFEST, None, settings=None, overrides=None,
                         context=None, now_ms=5, seal_key=None)
    view = block["op"]
    assert view["headers"] == {"Authorization": "redacted"}
    assert view["body_b64"] == {"size": len(f"{M}-payload")}
    assert view["url"] == "https://redacted@api.example.com:8443/v1?redacted#redacted"
    assert block["withheld"] == ["url"]
    rebuilt = rebuild_op(view, {})
    assert isinstance(rebuilt, NetHttpOp)
    assert len(base64.b64decode(rebuilt.body_b64 or "")) == len(f"{M}-payload")


def test_urls_without_secrets_are_kept_verbatim() -> None:
    assert url_shape("https://Example.COM:443/a/../b") == ("https://Example.COM:443/a/../b",
                                                           False)
    assert url_shape("https://h/p?") == ("https://h/p?redacted", True)


def test_withheld_arguments_are_unreplayable_without_a_sealed_copy() -> None:
    op = ProcExecOp(tool="git", args=("status", f"--token={M}"))
    block = replay_block("e", op, GRANT, MANIFEST, None, settings=None, overrides=None,
                         context=None, now_ms=5, seal_key=None)
    assert block["op"]["args"] == [None, None]  # no profile: no literal is known to be public
    with pytest.raises(Unreplayable, match=r"argument\(s\) 1, 2"):
        rebuild_op(block["op"], {})
    ok = FsWriteOp(path="/w/x", bytes_b64="!!not-base64")
    view = replay_block("e", ok, GRANT, MANIFEST, None, settings=None, overrides=None,
                        context=None, now_ms=5, seal_key=None)["op"]
    assert view["bytes_b64"] == {"invalid_base64": True}
    assert rebuild_op(view, {}).model_dump()["bytes_b64"] == "!"


class _Path(str):
    """A str subclass where a path is expected (a caller's ``model_construct``)."""


@pytest.mark.parametrize("op", [
    FsReadOp(path="/w/a.txt"), FsReadOp(path="/w/é \"q\".txt", offset=3, len=10),
    FsListOp(path="/w"), FsListOp(path="/w", depth=0),
    FsReadOp.model_construct(path=_Path("/w/sub")),  # not the validated type: the long way
    FsReadOp.model_construct(path="/w/b", offset=True),  # a bool is no int here
], ids=["read", "read-all-fields", "list", "list-depth-0", "str-subclass", "bool-offset"])
def test_a_read_or_listing_is_shown_as_its_dump(op: FsReadOp | FsListOp) -> None:
    """The op view of a read or listing is taken from its fields (no dump per call): the same
    value, member order and JSON as ``model_dump(mode="json")``, nothing withheld."""
    view, withheld = op_view(op, ())
    dumped = op.model_dump(mode="json")
    assert view == dumped
    assert list(view) == list(dumped)
    assert withheld == {}
    assert json.dumps(view) == json.dumps(dumped)
    assert all(type(v) is type(dumped[k]) for k, v in view.items())
