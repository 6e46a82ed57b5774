"""net.http under a real compiled policy: the call's guard (``ExecContext.guard``) decides hops.

Profiles here are built the production way (``compile_files`` → ``ProfileBuilder`` → ``Guard``),
so conditions and the policy-rule naming of loopback are in force; a ``Guard()`` without the
policy set cannot evaluate them and must fail closed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.executor_http import HttpExecutor
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.executor import ExecContext
from policy_engine.guard import Guard
from policy_engine.model import NetHttpCapability, NetHttpOp, Profile
from tests.integration.servers import LoopbackServer, compiled_profile, redirect, send

pytestmark = pytest.mark.integration

ROUTES = {
    "/ok/page": lambda h: send(h, 200, "text/plain", b"allowed page"),
    "/ok/jump": redirect("/nope"),
    "/ok/hop": redirect("/ok/page"),
    "/nope": lambda h: send(h, 200, "text/plain", b"must never be served"),
}


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer(ROUTES) as srv:
        yield srv


@pytest.fixture
def executor() -> Iterator[HttpExecutor]:
    ex = HttpExecutor()
    yield ex
    ex.close()


def ok_paths_policy(tmp: Path, port: int) -> tuple[Profile, Guard]:
    """Loopback named by the policy rule; only paths under ``/ok`` by its condition."""
    rules = (f'permit "ok-paths" net.http hosts ["127.0.0.1"] schemes ["http"] ports [{port}]\n'
             '  methods ["GET"] when `request.path.startsWith("/ok")`')
    cap = NetHttpCapability(hosts=("127.0.0.1",), schemes=("http",), ports=(port,),
                            methods=("GET",))
    return compiled_profile(tmp, rules, (cap,))


def ctx_for(profile: Profile, guard: Guard | None) -> ExecContext:
    return ExecContext(profile=profile, deadline=time.monotonic() + 60, guard=guard)


def paths(server: LoopbackServer) -> list[str]:
    return [p for _m, p, _h in server.seen.requests]


def test_ctx_guard_allows_what_the_condition_admits_and_follows_an_allowed_hop(
    tmp_path: Path, server: LoopbackServer, executor: HttpExecutor
) -> None:
    profile, guard = ok_paths_policy(tmp_path, server.port)
    result = executor.execute(ctx_for(profile, guard), NetHttpOp(url=server.url("/ok/page")))
    assert result.out["status"] == 200
    hopped = executor.execute(ctx_for(profile, guard), NetHttpOp(url=server.url("/ok/hop")))
    assert (hopped.out["status"], hopped.out["redirects"]) == (200, 1)
    assert paths(server) == ["/ok/page", "/ok/hop", "/ok/page"]


def test_redirect_to_a_path_the_condition_refuses_is_never_sent(
    tmp_path: Path, server: LoopbackServer, executor: HttpExecutor
) -> None:
    profile, guard = ok_paths_policy(tmp_path, server.port)
    ctx = ctx_for(profile, guard)
    with pytest.raises(PolicyEngineError) as info:
        executor.execute(ctx, NetHttpOp(url=server.url("/ok/jump")))
    expected = guard.decide(profile, NetHttpOp(url=server.url("/nope")))
    assert not expected.allowed
    assert info.value.code.value == expected.code
    assert info.value.code in (ErrorCode.PERMISSION_DENY, ErrorCode.CAPABILITY_BLOCKED)
    assert "redirect to `http://127.0.0.1:" in info.value.reason
    assert paths(server) == ["/ok/jump"]  # the server never saw /nope
    first, refused = ctx.side_effects
    assert first.meta["status"] == 302
    assert refused.meta["hop"] == 1
    assert refused.meta["refused"] == expected.code
    assert refused.meta["url"] == f"http://127.0.0.1:{server.port}/nope"


def test_ctx_guard_wins_over_the_executors_own_guard(
    tmp_path: Path, server: LoopbackServer, executor: HttpExecutor
) -> None:
    profile, guard = ok_paths_policy(tmp_path, server.port)
    # the executor's own guard is a Guard() without the policy set: it cannot evaluate the
    # rule's condition, so without ctx.guard the call fails closed and nothing is sent
    with pytest.raises(PolicyEngineError) as info:
        executor.execute(ctx_for(profile, None), NetHttpOp(url=server.url("/ok/page")))
    assert info.value.code is ErrorCode.PERMISSION_DENY
    assert paths(server) == []
    executor.execute(ctx_for(profile, guard), NetHttpOp(url=server.url("/ok/page")))
    assert paths(server) == ["/ok/page"]


def test_constructor_guard_is_the_fallback_when_ctx_has_none(
    tmp_path: Path, server: LoopbackServer
) -> None:
    profile, guard = ok_paths_policy(tmp_path, server.port)
    ex = HttpExecutor(guard)
    try:
        ok = ex.execute(ctx_for(profile, None), NetHttpOp(url=server.url("/ok/page")))
        assert ok.out["status"] == 200
        with pytest.raises(PolicyEngineError):
            ex.execute(ctx_for(profile, None), NetHttpOp(url=server.url("/ok/jump")))
    finally:
        ex.close()
    assert paths(server) == ["/ok/page", "/ok/jump"]


def test_loopback_needs_a_policy_rule_naming_it_not_a_grant_literal(
    tmp_path: Path, server: LoopbackServer, executor: HttpExecutor
) -> None:
    rules = 'permit "any-http" net.http hosts ["*"] schemes ["http"] methods ["GET"]'
    cap = NetHttpCapability(hosts=("127.0.0.1",), schemes=("http",), ports=(server.port,),
                            methods=("GET",))
    profile, guard = compiled_profile(tmp_path, rules, (cap,))
    op = NetHttpOp(url=server.url("/ok/page"))
    with pytest.raises(PolicyEngineError) as info:
        executor.execute(ctx_for(profile, guard), op)
    assert info.value.code.value == guard.decide(profile, op).code
    assert info.value.code in (ErrorCode.PERMISSION_DENY, ErrorCode.CAPABILITY_BLOCKED)
    assert paths(server) == []
