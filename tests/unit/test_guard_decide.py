"""Guard.decide: every step of the decision order and the code it answers with."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest

from policy_engine.errors import REGISTRY, ErrorCode
from policy_engine.guard import Guard
from policy_engine.model import (
    ArgAlternative,
    ArgSlot,
    BrowserCapability,
    BrowserNavOp,
    BrowserScope,
    BrowserScreenshotOp,
    Decision,
    DenyLists,
    FsListOp,
    FsReadOp,
    FsWriteOp,
    Limits,
    NetHttpCapability,
    NetHttpOp,
    NetworkMode,
    ProcCapability,
    ProcExecOp,
    SafetyClass,
    SideEffect,
    TmpAllocOp,
    TmpCapability,
)
from tests.unit.guard_fixtures import (
    NOW,
    PyCondition,
    consent_rule,
    forbid,
    fs,
    make_policyset,
    make_profile,
    permit,
    valid_consent,
)

BLOCKED, PERM, TOOL, SCHEMA = (ErrorCode.CAPABILITY_BLOCKED.value, ErrorCode.PERMISSION_DENY.value,
                               ErrorCode.DENY_TOOL.value, ErrorCode.SCHEMA_VALIDATION_FAILED.value)


def decide(profile: Any, op: Any, guard: Guard | None = None, **kw: Any) -> Decision:
    d = (guard or Guard()).decide(profile, op, now_ms=kw.pop("now_ms", NOW), **kw)
    if d.code is not None:  # every deny: registry status, public lowercase reason
        assert d.http_status == REGISTRY[ErrorCode(d.code)].http_status
        assert d.reason
        assert d.reason[0].islower()
        assert not d.reason.endswith(".")
    else:
        assert d.http_status == 200
    return d


def read_profile(**kw: Any) -> Any:
    return make_profile(capabilities=(permit("fs.read", fs("fs.read", "/workspace/**")),), **kw)


def test_allow_names_the_permit() -> None:
    d = decide(read_profile(profile_hash="h"), FsReadOp(path="/workspace/src/a.py"))
    assert d.allowed
    assert d.rule is not None
    assert d.rule.id == "permit-1"
    assert d.profile_hash == "h"
    assert d.trace is None


@pytest.mark.parametrize("path", ["/workspace-evil/x", "/workspacex", "/work", "/etc/passwd"])
def test_segment_boundary_never_admits_sibling(path: str) -> None:
    d = decide(read_profile(), FsReadOp(path=path))
    assert d.code == PERM
    assert "capability not granted" in d.reason


# --- step 0 -----------------------------------------------------------------------------------

def test_mapping_op_is_validated() -> None:
    assert decide(read_profile(), {"kind": "fs.read", "path": "/workspace/a"}).allowed
    assert decide(read_profile(), {"kind": "fs.read"}).code == SCHEMA
    assert decide(read_profile(), {"kind": "fs.chmod", "path": "/x"}).code == SCHEMA
    assert decide(read_profile(), object()).code == SCHEMA


# --- step 1 -----------------------------------------------------------------------------------

def test_expired_grant() -> None:
    d = decide(read_profile(expires_at=NOW), FsReadOp(path="/workspace/a"))
    assert (d.code, d.reason) == (PERM, "grant expired")


# --- step 2 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/workspace/../etc/passwd", "/workspace/a\x00b", "workspace/a",
                                  "../x", "/workspace/a/.."])
def test_traversal_is_blocked(path: str) -> None:
    d = decide(read_profile(), FsReadOp(path=path))
    assert d.code == BLOCKED
    assert "path traversal" in d.reason
    assert d.rule is None


def test_symlink_out_of_tmp_root_is_blocked(tmp_path: Path) -> None:
    root = tmp_path / "tmp-root"
    root.mkdir()
    (tmp_path / "secret").write_text("s")
    os.symlink(tmp_path / "secret", root / "link")
    os.symlink("link", root / "chain")
    prof = make_profile(capabilities=(permit("fs.read", fs("fs.read", f"{root}/**")),),
                        tmp_dir=str(root))
    for name in ("link", "chain"):
        d = decide(prof, FsReadOp(path=f"{root}/{name}"))
        assert d.code == BLOCKED
        assert "leaves the root" in d.reason
    lax = Guard(resolve_symlinks=False)  # the option really skips resolution
    assert lax.decide(prof, FsReadOp(path=f"{root}/link"), now_ms=NOW).code != BLOCKED


def test_symlink_resolved_path_is_what_forbids_see(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "conf").mkdir(parents=True)
    (root / "conf" / ".env").write_text("K=V")
    os.symlink("conf/.env", root / "innocent.txt")
    prof = make_profile(
        capabilities=(permit("fs.read", fs("fs.read", f"{root}/**")),), root_fs=str(root),
        denies=(forbid(("fs.read",), fs("fs.read", "**/.env"), mandatory=True),))
    d = decide(prof, FsReadOp(path=f"{root}/innocent.txt"))
    assert d.code == BLOCKED
    assert d.rule is not None
    assert d.rule.id == "forbid-1"


def test_write_outside_root_and_tmp_is_blocked() -> None:
    prof = make_profile(capabilities=(permit("fs.write", fs("fs.write", "/**")),))
    d = decide(prof, FsWriteOp(path="/etc/cron.d/x", bytes_b64=""))
    assert d.code == BLOCKED
    assert "outside the fs root" in d.reason
    assert decide(prof, FsWriteOp(path="/tmp/policy-engine/x")).allowed


def test_malformed_base64_is_schema_failure() -> None:
    prof = make_profile(capabilities=(permit("fs.write", fs("fs.write", "/workspace/**")),))
    assert decide(prof, FsWriteOp(path="/workspace/a", bytes_b64="!!notb64")).code == SCHEMA


def test_urls_blocked_or_invalid() -> None:
    prof = make_profile(capabilities=(permit("net.http", NetHttpCapability(hosts=("*",))),))
    assert decide(prof, NetHttpOp(url="https://u:p@good.com/")).code == BLOCKED
    assert decide(prof, NetHttpOp(url="https://evil.com\\@good.com/")).code == BLOCKED
    assert decide(prof, NetHttpOp(url="https://good.com\\evil.com")).code == BLOCKED
    assert decide(prof, NetHttpOp(url="not a url")).code == BLOCKED  # whitespace
    assert decide(prof, NetHttpOp(url="/relative")).code == SCHEMA
    assert decide(prof, NetHttpOp(url="https://good.com/", method="G E T")).code == SCHEMA


@pytest.mark.parametrize("tool", ["git status", "git;rm -rf /", "$(id)", "a|b", "../bin/sh",
                                  "/usr/../bin/sh"])
def test_shell_strings_are_refused(tool: str) -> None:
    prof = make_profile(capabilities=(permit("proc.exec", ProcCapability(tool="git")),))
    d = decide(prof, ProcExecOp(tool=tool))
    assert d.code == TOOL


# --- step 3 -----------------------------------------------------------------------------------

def test_mandatory_forbid_first_and_deny_overrides() -> None:
    prof = read_profile(denies=(
        forbid(("fs.read",), fs("fs.read", "/workspace/**"), rule="plain"),
        forbid(("fs.read", "fs.write"), fs("fs.read", "~/.ssh/**", "**/.env"), rule="secrets",
               mandatory=True),
    ))
    d = decide(prof, FsReadOp(path="/workspace/app/.env"))
    assert d.code == BLOCKED
    assert d.rule is not None
    assert d.rule.id == "secrets"
    assert "`secrets`" in d.reason
    d = decide(prof, FsReadOp(path="/workspace/app/main.py"))
    assert d.rule is not None
    assert d.rule.id == "plain"
    assert decide(prof, FsReadOp(path="/home/agent/.ssh/id_rsa")).rule.id == "secrets"  # type: ignore[union-attr]


def test_forbid_condition_false_and_error() -> None:
    off = PyCondition("request.path == '/nope'", lambda c: c["request"]["path"] == "/nope")
    boom = PyCondition("1/0 == 1", lambda c: 1 / 0 == 1)
    guard = Guard(make_policyset(("f-off", off), ("f-boom", boom)))
    prof = read_profile(denies=(forbid(("fs.read",), fs("fs.read", "/workspace/**"),
                                       rule="f-off", condition=off.source),))
    assert decide(prof, FsReadOp(path="/workspace/a"), guard).allowed
    prof = read_profile(denies=(forbid(("fs.read",), fs("fs.read", "/workspace/**"),
                                       rule="f-boom", condition=boom.source),))
    d = decide(prof, FsReadOp(path="/workspace/a"), guard)
    assert d.code == BLOCKED
    assert d.rule is not None
    assert d.rule.id == "f-boom"


def test_deny_lists() -> None:
    prof = make_profile(
        capabilities=(permit("fs.read", fs("fs.read", "/workspace/**")),
                      permit("net.http", NetHttpCapability(hosts=("*",)), rule="net"),
                      permit("proc.exec", ProcCapability(tool="curl"), rule="proc")),
        deny=DenyLists(paths=("/workspace/private/**",), domains=("*.evil.com",),
                       tools=("curl",)))
    assert decide(prof, FsReadOp(path="/workspace/private/a")).code == BLOCKED
    assert decide(prof, NetHttpOp(url="https://x.evil.com/")).code == BLOCKED
    assert decide(prof, ProcExecOp(tool="curl")).code == BLOCKED
    assert decide(prof, FsReadOp(path="/workspace/public/a")).allowed


# --- step 4 -----------------------------------------------------------------------------------

def test_network_off() -> None:
    prof = make_profile(network=NetworkMode.OFF, capabilities=(
        permit("net.http", NetHttpCapability(hosts=("api.github.com",))),
        permit("browser.use", BrowserCapability(hosts=("example.com",)), rule="b")))
    for op in (NetHttpOp(url="https://api.github.com/"), BrowserNavOp(url="https://example.com/")):
        d = decide(prof, op)
        assert (d.code, d.reason) == (BLOCKED, "network is off for this profile")


# --- step 5 -----------------------------------------------------------------------------------

def test_not_granted_then_not_declared_then_default_deny() -> None:
    # the meet never admits more than the grant or the manifest: no capability here, and the
    # guard names the first layer that refused
    cap = fs("fs.read", "/workspace/**")
    d = decide(make_profile(granted=(fs("fs.read", "/data/**"),), declared=(cap,)),
               FsReadOp(path="/workspace/a"))
    assert d.code == PERM
    assert d.reason.startswith("capability not granted")
    d = decide(make_profile(granted=(cap,), declared=(fs("fs.read", "/data/**"),)),
               FsReadOp(path="/workspace/a"))
    assert d.code == TOOL
    assert "not declared" in d.reason
    d = decide(make_profile(capabilities=(), granted=(cap,), declared=(cap,)),
               FsReadOp(path="/workspace/a"))
    assert (d.code, d.rule) == (PERM, None)
    assert d.reason.startswith("no rule permits")


def test_permit_condition_false_names_rule_and_sees_request() -> None:
    small = PyCondition("request.size <= 4", lambda c: c["request"]["size"] <= 4)
    guard = Guard(make_policyset(("w", small)))
    prof = make_profile(capabilities=(permit("fs.write", fs("fs.write", "/workspace/**"),
                                             rule="w", condition=small.source),))
    ok = FsWriteOp(path="/workspace/a", bytes_b64=base64.b64encode(b"1234").decode())
    big = FsWriteOp(path="/workspace/a", bytes_b64=base64.b64encode(b"12345").decode())
    assert decide(prof, ok, guard).allowed
    d = decide(prof, big, guard)
    assert d.code == PERM
    assert d.rule is not None
    assert d.rule.id == "w"
    assert "`w`" in d.reason


def test_condition_without_policyset_never_allows() -> None:
    prof = make_profile(capabilities=(permit("fs.read", fs("fs.read", "/workspace/**"),
                                             condition="true"),))
    d = decide(prof, FsReadOp(path="/workspace/a"))
    assert d.code == PERM
    assert "could not be evaluated" in d.reason


def test_condition_context_has_profile_now_and_caller_vars() -> None:
    seen: dict[str, Any] = {}
    cond = PyCondition("ctx", lambda c: bool(seen.update(c)) or True)
    prof = make_profile(capabilities=(permit("net.http", NetHttpCapability(hosts=("a.com",)),
                                             condition="ctx"),))
    assert decide(prof, NetHttpOp(url="https://a.com:443/p?q=1"), Guard(make_policyset(
        ("permit-1", cond))), context={"tenant": {"id": "acme"}, "request": "spoof"}).allowed
    assert seen["tenant"] == {"id": "acme"}
    assert seen["profile"]["tool_name"] == "tool"
    req = seen["request"]
    assert (req["scheme"], req["host"], req["port"], req["path"], req["method"]) == (
        "https", "a.com", 443, "/p", "GET")
    assert seen["now"].timestamp() * 1000 == NOW


def test_all_of_is_a_conjunction() -> None:
    prof = make_profile(capabilities=(permit("fs.read", fs("fs.read", "/workspace/**"),
                                             fs("fs.read", "/**/src/**")),))
    assert decide(prof, FsReadOp(path="/workspace/src/a.py")).allowed
    assert not decide(prof, FsReadOp(path="/workspace/docs/a.md")).allowed


def test_tilde_in_grant_pattern_uses_home() -> None:
    cap = fs("fs.read", "~/notes/**")
    prof = make_profile(capabilities=(permit("fs.read", cap),), home="/home/agent")
    assert decide(prof, FsReadOp(path="/home/agent/notes/a.md")).allowed
    assert not decide(prof, FsReadOp(path="/root/notes/a.md")).allowed


def net_profile(**cap: Any) -> Any:
    return make_profile(capabilities=(permit("net.http", NetHttpCapability(**cap)),))


def test_net_scheme_port_method_defaults() -> None:
    prof = net_profile(hosts=("api.github.com",))
    assert decide(prof, NetHttpOp(url="https://api.github.com/repos")).allowed
    assert decide(prof, NetHttpOp(url="https://api.github.com/", method="head")).allowed
    for op in (NetHttpOp(url="http://api.github.com/"),
               NetHttpOp(url="https://api.github.com:8443/"),
               NetHttpOp(url="https://api.github.com/", method="POST"),
               NetHttpOp(url="https://evil.github.com/")):
        assert decide(prof, op).code == PERM, op


def test_net_explicit_scheme_port_method() -> None:
    prof = net_profile(hosts=("*.example.com",), schemes=("http",), ports=(8080,),
                       methods=("POST",))
    assert decide(prof, NetHttpOp(url="http://a.example.com:8080/", method="POST")).allowed
    assert not decide(prof, NetHttpOp(url="http://example.com:8080/", method="POST")).allowed
    assert not decide(prof, NetHttpOp(url="http://a.example.com/", method="POST")).allowed


def test_browser_scopes() -> None:
    prof = make_profile(capabilities=(permit("browser.use", BrowserCapability(
        hosts=("example.com",), scopes=(BrowserScope.OPEN,))),))
    assert decide(prof, BrowserNavOp(url="https://example.com/", extract="none")).allowed
    assert decide(prof, BrowserNavOp(url="https://example.com/")).code == PERM
    assert decide(prof, BrowserScreenshotOp(url="https://example.com/")).code == PERM


ARGS = (ArgSlot(alternatives=(ArgAlternative(literal="push"), ArgAlternative(literal="status"))),
        ArgSlot(alternatives=(ArgAlternative(regex=r"origin|upstream"),), repeat=True))


def test_argv_template() -> None:
    cap = ProcCapability(tool="git", args=ARGS)
    prof = make_profile(capabilities=(permit("proc.exec", cap),), granted=(
        ProcCapability(tool="git"),))
    assert decide(prof, ProcExecOp(tool="git", args=("push", "origin"))).allowed
    d = decide(prof, ProcExecOp(tool="git", args=("push", "--force")))
    assert (d.code, d.reason) == (TOOL,
                                  "argument 2 (7 characters) is not allowed by the template")
    d = decide(prof, ProcExecOp(tool="git", args=("rebase",)))
    assert d.code == TOOL
    assert "argument 1 (6 characters)" in d.reason
    d = decide(prof, ProcExecOp(tool="rm", args=("-rf", "/")))
    assert d.code == PERM  # not granted comes before the manifest


def test_tool_not_declared() -> None:
    prof = make_profile(capabilities=(), granted=(ProcCapability(tool="curl"),),
                        declared=(ProcCapability(tool="git"),))
    d = decide(prof, ProcExecOp(tool="curl"))
    assert d.code == TOOL
    assert "`curl` is not declared" in d.reason


# --- step 6 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/", "http://2130706433:8080/",
                                 "http://[::ffff:127.0.0.1]:8080/", "http://0x7f.1:8080/"])
def test_private_literal_needs_explicit_name(url: str) -> None:
    wide = net_profile(hosts=("*",), schemes=("http",), ports=(8080,))
    d = decide(wide, NetHttpOp(url=url))
    assert d.code == BLOCKED
    assert "loopback address" in d.reason
    if "::ffff" in url:
        return  # an IPv4 pattern does not admit the IPv6 form: named or not, it stays refused
    named = make_profile(capabilities=(
        permit("net.http", NetHttpCapability(hosts=("*",), schemes=("http",), ports=(8080,))),
        permit("net.http", NetHttpCapability(hosts=("127.0.0.1",), schemes=("http",),
                                             ports=(8080,)), rule="local")))
    d = decide(named, NetHttpOp(url=url))
    assert d.allowed
    assert d.rule is not None
    assert d.rule.id == "local"


def test_metadata_literal_refused() -> None:
    prof = net_profile(hosts=("*",), schemes=("http",))
    for url in ("http://169.254.169.254/latest/meta-data/", "http://0xa9fea9fe/",
                "http://[fd00:ec2::254]/"):
        d = decide(prof, NetHttpOp(url=url))
        assert d.code == BLOCKED
        assert "metadata" in d.reason


# --- step 7 -----------------------------------------------------------------------------------

def test_limits() -> None:
    lim = Limits(max_bytes_in=10, max_bytes_out=4, max_depth=2, timeout_ms=1000,
                 max_screenshot_width=800, max_screenshot_height=600)
    prof = make_profile(limits=lim, capabilities=(
        permit("fs.read", fs("fs.read", "/workspace/**")),
        permit("fs.write", fs("fs.write", "/workspace/**"), rule="w",
               limits=Limits(max_bytes_out=2)),
        permit("fs.list", fs("fs.list", "/workspace/**")),
        permit("net.http", NetHttpCapability(hosts=("a.com",), methods=("POST",))),
        permit("browser.use", BrowserCapability(hosts=("a.com",), scopes=(
            BrowserScope.SCREENSHOT,))),
        permit("proc.exec", ProcCapability(tool="git")),
        permit("tmp.use", TmpCapability(max_bytes=100))))
    b64 = base64.b64encode
    cases = [
        (FsReadOp(path="/workspace/a", len=11), FsReadOp(path="/workspace/a", len=10)),
        (FsWriteOp(path="/workspace/a", bytes_b64=b64(b"abc").decode()),
         FsWriteOp(path="/workspace/a", bytes_b64=b64(b"ab").decode())),
        (FsListOp(path="/workspace", depth=3), FsListOp(path="/workspace", depth=2)),
        (NetHttpOp(url="https://a.com/", method="POST", body_b64=b64(b"12345").decode()),
         NetHttpOp(url="https://a.com/", method="POST", body_b64=b64(b"1234").decode())),
        (BrowserScreenshotOp(url="https://a.com/", width=801),
         BrowserScreenshotOp(url="https://a.com/", width=800, height=600)),
        (BrowserScreenshotOp(width=800, height=601), BrowserScreenshotOp(width=800, height=600)),
        (ProcExecOp(tool="git", timeout_ms=1001), ProcExecOp(tool="git", timeout_ms=1000)),
        # tmp space is bounded by the tmp.use capability (100), not by bytes_out (4)
        (TmpAllocOp(size_bytes=101), TmpAllocOp(size_bytes=100)),
    ]
    for over, within in cases:
        d = decide(prof, over)
        assert d.code == BLOCKED, over
        assert "exceeds the limit" in d.reason, over
        assert decide(prof, within).allowed, within


# --- step 8 -----------------------------------------------------------------------------------

def test_consent() -> None:
    base: dict[str, Any] = {"capabilities": (permit("fs.read", fs("fs.read", "/workspace/**")),)}
    op = FsReadOp(path="/workspace/a")
    d = decide(make_profile(consent_required=True, **base), op)
    assert (d.code, d.reason) == (PERM, "consent required by the profile (`consent_required`)")
    stale = valid_consent().model_copy(update={"expires_at": NOW})
    d = decide(make_profile(consent_required=True, consent=stale, **base), op)
    assert d.code == PERM
    assert "expired" in d.reason
    assert decide(make_profile(consent_required=True, consent=valid_consent(), **base),
                  op).allowed


def test_consent_rules_from_policyset() -> None:
    base: dict[str, Any] = {"capabilities": (permit("fs.read", fs("fs.read", "/workspace/**")),)}
    op = FsReadOp(path="/workspace/a")
    cel = PyCondition("request.path.endsWith('a')", lambda c: c["request"]["path"].endswith("a"))
    guard = Guard(make_policyset(consent_rules=(consent_rule(cel),)))
    assert decide(make_profile(**base), op, guard).code == PERM
    assert decide(make_profile(**base), FsReadOp(path="/workspace/b"), guard).allowed
    builtin = Guard(make_policyset(consent_rules=(consent_rule(None),)))
    high = make_profile(safety=SafetyClass.HIGH, **base)
    assert decide(high, op, builtin).code == PERM
    writes = make_profile(side_effects=(SideEffect.WRITE,), **base)
    assert decide(writes, op, builtin).code == PERM
    assert decide(make_profile(**base), op, builtin).allowed


# --- trace and caching ------------------------------------------------------------------------

def test_trace_lists_visited_nodes_in_order() -> None:
    prof = read_profile(denies=(forbid(("fs.read",), fs("fs.read", "**/.env")),))
    d = decide(prof, FsReadOp(path="/workspace/a"), trace=True)
    assert d.trace is not None
    # the fs facts last, naming their source (issue 26: facts have a source, and it is named)
    assert [s.node for s in d.trace] == ["kind", "resolve", "forbid", "permit", "limits",
                                         "consent", "fact", "decision"]
    assert "host view" in (d.trace[-2].detail or "")
    assert d.trace[-1].outcome == "allow"
    d = decide(make_profile(capabilities=(), granted=(fs("fs.read", "/**"),),
                            declared=(fs("fs.read", "/**"),)),
               FsReadOp(path="/x"), trace=True)
    assert d.trace is not None
    assert [s.node for s in d.trace] == [
        "kind", "resolve", "grant", "manifest", "default-deny", "layer:policy", "layer:manifest",
        "layer:grant", "layer:consent", "decision"]


def test_no_tracer_is_built_without_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    class Exploding:
        def __init__(self) -> None:
            raise AssertionError("tracer built on the fast path")

    monkeypatch.setattr("policy_engine.guard.guard.Tracer", Exploding)
    d = decide(read_profile(), FsReadOp(path="/workspace/a"))
    assert d.allowed
    assert d.trace is None


def test_profile_compiled_once_per_hash() -> None:
    guard = Guard(cache_size=2)
    prof = read_profile(profile_hash="abc")
    assert guard.compiled(prof) is guard.compiled(prof)
    unhashed = read_profile()
    assert guard.compiled(unhashed) is guard.compiled(unhashed)
    assert guard.compiled(read_profile()) is not guard.compiled(unhashed)


def test_fast_deny_equals_the_validated_model() -> None:
    for trace in (False, True):
        d = decide(read_profile(profile_hash="h"), FsReadOp(path="/etc/passwd"), trace=trace)
        v = Decision.model_validate(d.model_dump())
        assert type(d) is Decision
        assert d == v
        assert d.model_dump_json() == v.model_dump_json()
        assert d.model_fields_set == v.model_fields_set
        assert d.__pydantic_extra__ is None
        assert d.__pydantic_private__ is None
        with pytest.raises(Exception, match="frozen"):
            d.reason = "changed"  # type: ignore[misc]
        assert d.model_copy(update={"reason": "x"}).reason == "x"
        assert d.reason.startswith("capability not granted")
        # denies share one fields-set: copying one with an update changes no other
        other = decide(read_profile(profile_hash="h"), FsReadOp(path="/etc/passwd"))
        d.model_copy(update={"extra_field_name_never_set": 1})
        assert other.model_fields_set == v.model_fields_set
        assert d.model_fields_set == v.model_fields_set


# --- CEL views without a caller context ---------------------------------------------------------

def _grant_policy_guard(tmp_path: Path, condition: str) -> tuple[Guard, Any]:
    from policy_engine.compiler import compile_files
    from policy_engine.model import FsCapability, Grant, Manifest
    from policy_engine.profile import ProfileBuilder

    src = tmp_path / "p.sbpolicy"
    src.write_text('policy "acme/agents" version "1.0.0"\n\n'
                   'permit "agents-read" fs.read paths ["/workspace/**"]\n'
                   f"  when `{condition}`\n", encoding="utf-8")
    ps = compile_files([src], home="/home/agent")
    cap = FsCapability(kind="fs.read", paths=("/workspace/**",))
    manifest = Manifest(name="reader", version="2.0.0", permissions=(cap,))
    builder = ProfileBuilder(ps)

    def profile(subject: str) -> Any:
        return builder.build(Grant(tenant="acme", subject_id=subject, tool_name="reader",
                                   call_id="c-1", capabilities=(cap,), expires_at=NOW + 60_000),
                             manifest)

    return Guard(ps), profile


def test_grant_is_visible_to_cel_without_a_context(tmp_path: Path) -> None:
    guard, profile = _grant_policy_guard(tmp_path, 'grant.subject_id.startsWith("agent:")')
    op = FsReadOp(path="/workspace/a.txt")
    assert decide(profile("agent:x"), op, guard).allowed
    d = decide(profile("user:y"), op, guard)
    assert (d.code, d.reason) == (PERM, "the condition of rule `agents-read` is false")
    assert d.rule is not None
    assert d.rule.id == "agents-read"
    # the caller's own grant still wins over the profile's view
    assert not decide(profile("agent:x"), op, guard,
                      context={"grant": {"subject_id": "user:z"}}).allowed


def test_manifest_tenant_and_subject_views(tmp_path: Path) -> None:
    guard, profile = _grant_policy_guard(
        tmp_path, 'manifest.name == "reader" && manifest.version == "2.0.0" && '
                  'tenant.id == "acme" && subject.id == grant.subject_id && '
                  'grant.capabilities[0].kind == "fs.read" && grant.consent == null && '
                  'size(manifest.permissions) == 1')
    assert decide(profile("agent:x"), FsReadOp(path="/workspace/a.txt"), guard).allowed


def test_a_checked_tool_name_never_vouches_for_a_lookalike() -> None:
    """Tool names that passed the argv checks are remembered; a ``str`` subclass that compares
    equal to one (its text a shell string) is still checked for what it spells."""

    class Posing(str):
        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return hash("git")

    profile = make_profile(capabilities=(permit("proc.exec", ProcCapability(tool="git")),))
    assert decide(profile, ProcExecOp(tool="git", args=["status"])).allowed  # remembered
    op = ProcExecOp.model_construct(kind="proc.exec", tool=Posing("git; rm -rf /"),
                                    args=["status"], env=None, cwd=None, stdin_b64=None,
                                    timeout_ms=None)
    d = decide(profile, op)
    assert (d.decision, d.code) == ("deny", TOOL)
