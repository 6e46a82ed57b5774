"""The console in a real browser: Debian's Chromium driven by Playwright against `serve --console`.

One server for the module (`serve --console --confirmation console`), real calls through
`/v1/ops` to fill the evidence, tokens of three roles and two tenants. Every page is driven as a
person would (sign in, filter, open a call, approve one request and deny another, compare a
candidate policy), its headers and accessibility checked (axe-core), and agent-controlled text
(paths with markup and script) checked to arrive escaped. Set ``PE_CONSOLE_SCREENSHOTS=DIR`` to
keep a screenshot of each page there (docs/console/ holds the committed ones).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Browser, Page, sync_playwright

from tests.integration.service_server import Service, cli, grant, start

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MARKUP = '<script>window.__pwned=1</script>"><img src=x id=pwned onerror="window.__pwned=2">'


def _token(state: Path, tenant: str, subject: str, role: str) -> str:
    done = cli("tokens", "add", "--tenant", tenant, "--subject", subject, "--role", role,
               state=state)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("console")
    svc = start(root, "--console", "--confirmation", "console", "--approver-timeout", "60")
    state = svc.state
    tokens = {
        "agent": _token(state, "acme", "agent:alice", "agent"),
        "other_agent": _token(state, "globex", "agent:gary", "agent"),
        "viewer": _token(state, "acme", "vera@acme.example", "viewer"),
        "approver": _token(state, "acme", "alex@acme.example", "approver"),
        "admin": _token(state, "ops", "root@ops.example", "admin"),
    }
    envelopes: dict[str, str] = {}
    with svc.client(tokens["agent"]) as c:
        ok = c.post("/v1/ops", json={"op": {"kind": "fs.read", "path": f"{root}/data/hello.txt"},
                                     "grant": grant("acme", "agent:alice", root),
                                     "manifest": "reader"})
        envelopes["allowed"] = ok.json()["envelope_id"]
        denied = c.post("/v1/ops", json={
            "op": {"kind": "fs.read", "path": f"{root}/data/secret/key.txt"},
            "grant": grant("acme", "agent:alice", root), "manifest": "reader"})
        envelopes["denied"] = denied.json()["envelope_id"]
        marked = c.post("/v1/ops", json={
            "op": {"kind": "fs.read", "path": f"{root}/data/{MARKUP}"},
            "grant": grant("acme", "agent:alice", root), "manifest": "reader"})
        envelopes["markup"] = marked.json()["envelope_id"]
    with svc.client(tokens["other_agent"]) as c:
        other = c.post("/v1/ops", json={"op": {"kind": "fs.read",
                                               "path": f"{root}/data/hello.txt"},
                                        "grant": grant("globex", "agent:gary", root),
                                        "manifest": "reader"})
        envelopes["other_tenant"] = other.json()["envelope_id"]
    assert all(envelopes.values()), envelopes
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True,
                                     chromium_sandbox=False)
        try:
            yield {"svc": svc, "tokens": tokens, "env": envelopes, "browser": browser,
                   "root": root}
        finally:
            browser.close()
            log = svc.stop()
    assert "Traceback" not in log, log


def _signed_in(browser: Browser, svc: Service, token: str) -> Page:
    for context in browser.contexts:  # one person at a time: earlier pages close their streams
        context.close()
    page = browser.new_context().new_page()
    page.on("dialog", lambda d: pytest.fail(f"a dialog opened: {d.message}"))
    page.goto(f"{svc.url}/console/login")
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/console/calls")
    return page


def _shot(page: Page, name: str) -> None:
    where = os.environ.get("PE_CONSOLE_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(where) / f"{name}.png"), full_page=True)


def _accessible(page: Page) -> None:
    results = Axe().run(page)
    assert results.violations_count == 0, results.generate_report()


def test_sign_in_filter_and_open_a_call(world: dict[str, Any]) -> None:
    svc, env = world["svc"], world["env"]
    page = _signed_in(world["browser"], svc, world["tokens"]["viewer"])
    _accessible(page)
    rows = page.locator("tbody tr")
    assert rows.count() >= 3  # the viewer's tenant: three calls
    assert env["other_tenant"] not in page.content()  # another tenant's call is not listed
    _shot(page, "calls")
    page.get_by_label("Decision").select_option("deny")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**decision=deny**")
    assert page.locator("tbody tr").count() >= 1
    assert all(cell == "deny" for cell in page.locator("tbody td:nth-child(6)").all_inner_texts())
    page.get_by_label("Code").fill("SANDBOX.CAPABILITY_BLOCKED")
    page.get_by_role("button", name="Filter").click()
    page.locator(f"a[href$='{env['denied']}']").click()
    page.wait_for_url(f"**/calls/{env['denied']}")
    text = page.inner_text("main")
    assert "no-secret" in text  # the deciding rule ...
    assert 'forbid "no-secret"' in page.inner_text("pre.source")  # ... and its source line
    assert "Evidence chain: intact" in text or "Evidence chain: unchecked" in text
    _accessible(page)
    _shot(page, "call")


def test_every_page_has_a_strict_csp_and_safe_cookies(world: dict[str, Any]) -> None:
    svc = world["svc"]
    with httpx.Client(base_url=svc.url) as c:
        login = c.get("/console/login")
        csp = login.headers["content-security-policy"]
        assert "default-src 'none'" in csp
        assert "script-src 'self'" in csp
        assert "unsafe-inline" not in csp
        assert login.headers["x-frame-options"] == "DENY"
        assert "<script>" not in login.text.replace('<script src="/console/static/console.js" '
                                                    'defer></script>', "")
        cookie = login.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        csrf = login.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        signed = c.post("/console/login", data={"csrf": csrf,
                                                "token": world["tokens"]["viewer"]})
        assert signed.status_code == 303
        session = signed.headers["set-cookie"].lower()
        assert session.startswith("pe_console=")
        assert "httponly" in session
        assert "samesite=strict" in session
        # a form posted without the session's CSRF token is refused
        no_csrf = c.post("/console/logout", data={})
        assert no_csrf.status_code == 403
        assert no_csrf.json()["code"] == "SANDBOX.PERMISSION_DENY"
        assert no_csrf.json()["location"] == "csrf"
    # a pre-session token the console never made is refused at sign-in (login CSRF: another
    # site on this host could plant its own, cookies ignore ports)
    with httpx.Client(base_url=svc.url, cookies={"pe_console_pre": "Z" * 43}) as c:
        planted = c.post("/console/login", data={"csrf": "Z" * 43,
                                                 "token": world["tokens"]["viewer"]})
        assert planted.status_code == 403


def test_one_tenant_cannot_reach_another(world: dict[str, Any]) -> None:
    svc, env = world["svc"], world["env"]
    page = _signed_in(world["browser"], svc, world["tokens"]["viewer"])
    answer = page.goto(f"{svc.url}/console/calls/{env['other_tenant']}")
    assert answer is not None
    assert answer.status == 404
    assert "SERVICE.NOT_FOUND" in page.inner_text("main")
    # naming another tenant is refused on every page, however it is spelt
    for url in ("calls?tenant=globex", "charts?tenant=globex",
                "calls?tenant=acme&tenant=globex"):
        answer = page.goto(f"{svc.url}/console/{url}")
        assert answer is not None
        assert answer.status == 422, url
    # an admin sees every tenant
    admin = _signed_in(world["browser"], svc, world["tokens"]["admin"])
    answer = admin.goto(f"{svc.url}/console/calls/{env['other_tenant']}")
    assert answer is not None
    assert answer.status == 200


def test_agent_text_is_escaped_everywhere(world: dict[str, Any]) -> None:
    svc, env = world["svc"], world["env"]
    page = _signed_in(world["browser"], svc, world["tokens"]["viewer"])
    for url in (f"{svc.url}/console/calls", f"{svc.url}/console/calls/{env['markup']}"):
        page.goto(url)
        assert page.evaluate("window.__pwned") is None
        assert page.locator("#pwned").count() == 0
        assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page.content()
    # an agent-controlled query value comes back escaped on the error page too
    page.goto(f"{svc.url}/console/calls?size=<b>x</b>")
    assert page.locator("main b").count() == 0


def test_bad_input_is_a_422_in_the_refusal_shape(world: dict[str, Any]) -> None:
    svc = world["svc"]
    page = _signed_in(world["browser"], svc, world["tokens"]["viewer"])
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    with httpx.Client(base_url=svc.url, cookies=cookies) as c:
        for query in ("size=5", "since=2026-13-45", "decision=maybe", "cursor=%3Cx%3E",
                      "bogus=1"):
            got = c.get(f"/console/calls?{query}")
            assert got.status_code == 422, (query, got.text)
            body = got.json()
            assert body["code"] == "SCHEMA.VALIDATION_FAILED"
            assert set(body) >= {"code", "http_status", "retryable", "message", "refused_by",
                                 "rule", "consent", "envelope_id"}
            assert "Traceback" not in got.text


def _consent_call(svc: Service, token: str, root: Path, out: list[httpx.Response],
                  name: str = "hello.txt", subject: str = "agent:alice") -> None:
    with svc.client(token) as c:
        out.append(c.post("/v1/ops", json={
            "op": {"kind": "fs.read", "path": f"{root}/data/{name}"},
            "grant": {**grant("acme", subject, root), "tool_name": "reader-high"},
            "manifest": "reader-high"}))


def _code(response: httpx.Response) -> str:
    body = response.json()
    refusal = body.get("refusal") or body.get("error") or body
    return str(refusal["code"])


def _answer_next(page: Page, svc: Service, action: str, reason: str) -> None:
    page.goto(f"{svc.url}/console/approvals")
    link = page.locator("tr.s-pending a").first
    link.wait_for(timeout=30_000)
    link.click()
    page.get_by_label("Reason (kept in the evidence)").fill(reason)
    page.get_by_role("button", name=action).click()
    page.wait_for_load_state()


def test_an_approver_approves_one_call_and_denies_another(world: dict[str, Any]) -> None:
    svc, root = world["svc"], world["root"]
    page = _signed_in(world["browser"], svc, world["tokens"]["approver"])
    page.goto(f"{svc.url}/console/approvals")
    got: list[httpx.Response] = []
    waiting = threading.Thread(target=_consent_call, args=(svc, world["tokens"]["agent"], root,
                                                           got))
    waiting.start()
    # the list updates itself (SSE): the request appears without a reload
    page.locator("tr.s-pending").first.wait_for(timeout=30_000)
    page.locator("#pending-badge").filter(has_text="1").wait_for(timeout=10_000)
    _shot(page, "approvals")
    page.locator("tr.s-pending a").first.click()
    review = page.inner_text("pre.review")
    assert "fs.read" in review
    assert "hello.txt" in review
    _accessible(page)
    _shot(page, "approval")
    page.get_by_label("Reason (kept in the evidence)").fill("ticket OPS-1: reading the greeting")
    page.get_by_role("button", name="Approve").click()
    waiting.join(timeout=30)
    assert got, "the consent-needing call never answered"
    assert got[0].status_code == 200, got[0].text
    assert "approved" in page.inner_text("p.status")

    got.clear()
    waiting = threading.Thread(target=_consent_call, args=(svc, world["tokens"]["agent"], root,
                                                           got))
    waiting.start()
    _answer_next(page, svc, "Deny", "not during the freeze")
    waiting.join(timeout=30)
    assert got, "the consent-needing call never answered"
    assert got[0].status_code == 403, got[0].text
    assert _code(got[0]) == "SANDBOX.PERMISSION_DENY"
    refusal = got[0].json()["refusal"]  # the one refusal shape says a person said no
    assert refusal["refused_by"] == "consent"
    assert refusal["consent"]["asked"] is True
    assert refusal["consent"]["answer"] == "refused"
    assert refusal["consent"]["by"].startswith("console:alex@acme.example")
    # both answers are in the evidence of their calls
    evidence = "\n".join(p.read_text() for p in svc.state.rglob("*.jsonl"))
    assert "ticket OPS-1: reading the greeting" in evidence
    assert "not during the freeze" in evidence


def test_a_viewer_may_look_but_not_answer(world: dict[str, Any]) -> None:
    svc = world["svc"]
    page = _signed_in(world["browser"], svc, world["tokens"]["viewer"])
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    with httpx.Client(base_url=svc.url, cookies=cookies) as c:
        got = c.post("/console/approvals/0123456789abcdef0123456789abcdef",
                     data={"csrf": csrf or "", "action": "approve", "reason": "x"})
    assert got.status_code == 403
    assert got.json()["code"] == "SANDBOX.PERMISSION_DENY"
    assert "`approver` role" in got.json()["message"]


def test_an_admin_compares_a_candidate_policy(world: dict[str, Any]) -> None:
    svc, root = world["svc"], world["root"]
    page = _signed_in(world["browser"], svc, world["tokens"]["admin"])
    page.goto(f"{svc.url}/console/policy")
    assert "svc/test" in page.inner_text("main")
    current = (root / "svc.sbpolicy").read_text()
    # the candidate drops the forbid on the secret directory: a widening
    candidate = "\n".join(line for line in current.splitlines() if "no-secret" not in line)
    page.get_by_label("Candidate policy (.sbpolicy text)").fill(candidate)
    page.get_by_role("button", name="Compare").click()
    page.wait_for_url("**/console/policy/candidate")
    main = page.inner_text("main")
    assert "Decision changes" in main
    assert "Recent calls under the candidate" in main
    assert "changed" in main  # the denied secret read now replays as allowed
    assert "widening" in page.inner_text("section[aria-labelledby=diff-h]")  # the exact diff
    _accessible(page)
    _shot(page, "policy")
    # a candidate that does not compile says where
    page.get_by_label("Candidate policy (.sbpolicy text)").fill("policy \"x\" version")
    page.get_by_role("button", name="Compare").click()
    assert "line 1" in page.inner_text("div.error")


def test_charts_render_without_script(world: dict[str, Any]) -> None:
    svc = world["svc"]
    page = _signed_in(world["browser"], svc, world["tokens"]["viewer"])
    page.goto(f"{svc.url}/console/charts")
    assert page.locator("svg.chart").count() >= 3
    assert "SANDBOX.CAPABILITY_BLOCKED" in page.inner_text("main")
    _accessible(page)
    _shot(page, "charts")


def test_markup_in_a_consent_request_and_an_answer_is_shown_as_text(
        world: dict[str, Any]) -> None:
    svc, root = world["svc"], world["root"]
    page = _signed_in(world["browser"], svc, world["tokens"]["approver"])
    got: list[httpx.Response] = []
    waiting = threading.Thread(target=_consent_call, args=(svc, world["tokens"]["agent"], root,
                                                           got, MARKUP))
    waiting.start()
    _answer_next(page, svc, "Deny", f"no: {MARKUP}")
    waiting.join(timeout=30)
    assert got, "the consent-needing call never answered"
    for url in (page.url, f"{svc.url}/console/approvals"):
        page.goto(url)
        assert page.evaluate("window.__pwned") is None
        assert page.locator("#pwned").count() == 0
        assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page.content()


def test_an_approver_cannot_approve_their_own_call(world: dict[str, Any]) -> None:
    svc, root = world["svc"], world["root"]
    page = _signed_in(world["browser"], svc, world["tokens"]["approver"])
    got: list[httpx.Response] = []
    # the approver's token calls the API as its own subject, and the call needs consent
    waiting = threading.Thread(target=_consent_call, args=(
        svc, world["tokens"]["approver"], root, got, "hello.txt", "alex@acme.example"))
    waiting.start()
    page.goto(f"{svc.url}/console/approvals")
    link = page.locator("tr.s-pending a").first
    link.wait_for(timeout=30_000)
    link.click()
    rid = page.url.rsplit("/", 1)[1]
    page.get_by_label("Reason (kept in the evidence)").fill("looks fine to me")
    page.get_by_role("button", name="Approve").click()
    assert "another approver must answer" in page.inner_text("main")
    # a second person answers it
    admin = _signed_in(world["browser"], svc, world["tokens"]["admin"])
    admin.goto(f"{svc.url}/console/approvals/{rid}")
    admin.get_by_label("Reason (kept in the evidence)").fill("no self-service approvals")
    admin.get_by_role("button", name="Deny").click()
    waiting.join(timeout=30)
    assert got, "the consent-needing call never answered"
    assert got[0].status_code == 403
    assert got[0].json()["refusal"]["consent"]["by"].startswith("console:root@ops.example")


def test_invisible_characters_are_shown_not_obeyed(world: dict[str, Any]) -> None:
    svc, root = world["svc"], world["root"]
    page = _signed_in(world["browser"], svc, world["tokens"]["approver"])
    got: list[httpx.Response] = []
    trojan = "report\u202e\u2066txt.exe\u2069\u202c.md"  # reads as report.md reversed
    waiting = threading.Thread(target=_consent_call, args=(svc, world["tokens"]["agent"], root,
                                                           got, trojan))
    waiting.start()
    _answer_next(page, svc, "Deny", "bidi characters in the path")
    waiting.join(timeout=30)
    assert got, "the consent-needing call never answered"
    text = page.inner_text("main")
    assert "\u202e" not in text  # never the character itself
    assert "report\\u202e\\u2066txt.exe" in text  # its name, where it was


def test_a_candidate_that_imports_a_file_is_refused(world: dict[str, Any]) -> None:
    svc, root = world["svc"], world["root"]
    secret = root / "private.sbpolicy"
    secret.write_text("SECRET-CANDIDATE-MARKER\n")
    page = _signed_in(world["browser"], svc, world["tokens"]["admin"])
    page.goto(f"{svc.url}/console/policy")
    page.get_by_label("Candidate policy (.sbpolicy text)").fill(
        f'policy "x" version "1.0.0"\nimport "{secret}"\n')
    page.get_by_role("button", name="Compare").click()
    problems = page.inner_text("div.error")
    assert "imports are not followed" in problems
    assert "SECRET-CANDIDATE-MARKER" not in page.content()
