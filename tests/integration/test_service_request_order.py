"""Outsider round 4 F02 and F05 against `policy-engine serve` (one worker and two), over raw
sockets: the token is checked before the body is read as JSON (401 for any body without one),
a body that is not UTF-8, nested 100 000 deep or holding a 5000-digit number is the documented
`422 SCHEMA.VALIDATION_FAILED` (it was `404 SERVICE.NOT_FOUND "no such endpoint"`), and a
trailing slash is the JSON 404 of an unknown endpoint, not a `307` to the client's own `Host`."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.service_server import Service, add_token, grant, serving

pytestmark = pytest.mark.integration

Answer = tuple[int, dict[str, str], bytes]


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-worker", "two-workers"])
def svc(request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with serving(tmp_path_factory.mktemp("order"), "--workers", request.param,
                 "--rate-per-minute", "1000") as service:
        yield service


@pytest.fixture(scope="module")
def token(svc: Service) -> str:
    return add_token(svc.state, "acme", "agent:alice")


def _send(svc: Service, method: str, target: str, body: bytes = b"",
          token: str | None = None, ctype: str | None = "application/json",
          host: str = "attacker.example") -> Answer:
    """One request on its own connection, exactly as written (no client normalizes it)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close",
             f"Content-Length: {len(body)}"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    if ctype is not None:
        lines.append(f"Content-Type: {ctype}")
    address = svc.url.removeprefix("http://").split(":")
    with socket.create_connection((address[0], int(address[1])), timeout=60) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, payload = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, payload


def _error(answer: Answer, status: int, code: str) -> dict[str, object]:
    got, headers, payload = answer
    assert got == status, (got, payload[:300])
    assert headers.get("content-type") == "application/json", headers
    assert "location" not in headers, headers
    err = json.loads(payload)["error"]
    assert err["code"] == code, err
    assert err["http_status"] == status, err
    assert b"Traceback" not in payload
    return dict(err)


def _valid(root: Path) -> dict[str, object]:
    return {"op": {"kind": "fs.read", "path": f"{root}/data/hello.txt"},
            "grant": grant("acme", "agent:alice", root), "manifest": "reader"}


def _unparsable(root: Path) -> dict[str, bytes]:
    """Bodies json.loads refuses for reasons other than a syntax error."""
    ok = json.dumps(_valid(root)).encode()
    return {
        "not UTF-8": b'{"op":"\xff\xfe"}',
        "not UTF-8 in a valid call": ok.replace(b"hello.txt", b"hello\xff.txt"),
        "100000 deep": b'{"op":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "5000-digit now_ms": ok[:-1] + b', "now_ms": ' + b"9" * 5000 + b"}",
    }


@pytest.mark.parametrize("path", ["/v1/decide", "/v1/ops"])
def test_an_unparsable_body_is_422_not_404(svc: Service, token: str, path: str) -> None:
    for name, body in _unparsable(svc.root).items():
        err = _error(_send(svc, "POST", path, body, token=token), 422,
                     "SCHEMA.VALIDATION_FAILED")
        assert "no such endpoint" not in str(err["message"]), name
        assert "9999999999" not in str(err["message"])  # the input is never echoed


AUTHENTICATED = [("POST", "/v1/decide"), ("POST", "/v1/ops"), ("POST", "/v1/run_code"),
                 ("POST", "/sandbox/execs"), ("GET", "/sandbox/execs"),
                 ("GET", "/sandbox/execs/" + "a" * 32),
                 ("GET", "/sandbox/execs/" + "a" * 32 + "/artifacts"),
                 ("GET", "/sandbox/execs/" + "a" * 32 + "/artifacts/stdout.txt"),
                 ("GET", "/skills"), ("POST", "/skills/x.y/invoke")]


@pytest.mark.parametrize(("method", "path"), AUTHENTICATED)
def test_without_a_token_every_body_is_401_before_it_is_parsed(svc: Service, method: str,
                                                                  path: str) -> None:
    bodies = {**_unparsable(svc.root), "broken JSON": b'{"op":', "not an object": b"[1]",
              "empty": b"", "fails validation": b'{"op": 1}',
              "valid": json.dumps(_valid(svc.root)).encode()}
    for name, body in bodies.items():
        for ctype in ("application/json", "text/plain", None):
            for token in (None, "pet_0123456789abcdef." + "A" * 43):
                answer = _send(svc, method, path, body, token=token, ctype=ctype)
                assert answer[0] == 401, (name, ctype, answer[0], answer[2][:200])
                _error(answer, 401, "AUTH.UNAUTHENTICATED")


@pytest.mark.parametrize("target", ["/v1/decide/", "/v1/decide%2f", "/v1/decide%2F",
                                    "/v1/ops/", "/sandbox/execs/", "/sandbox/health/",
                                    "/openapi.json/", "/skills/"])
def test_a_trailing_slash_is_the_json_404_not_a_redirect(svc: Service, token: str,
                                                          target: str) -> None:
    body = json.dumps(_valid(svc.root)).encode()
    for auth in (None, token):
        for method in ("POST", "GET"):
            answer = _send(svc, method, target, body, token=auth)
            err = _error(answer, 404, "SERVICE.NOT_FOUND")
            assert "attacker.example" not in json.dumps(err)


def test_the_valid_call_still_answers(svc: Service, token: str) -> None:
    """The control: the same connection code, a well-formed call, a decision."""
    status, _, payload = _send(svc, "POST", "/v1/decide",
                               json.dumps(_valid(svc.root)).encode(), token=token)
    assert status == 200, payload
    assert json.loads(payload)["decision"] == "allow"


@pytest.mark.parametrize("target", ["/v1%2fops", "/v1%2Fdecide", "/sandbox%2fexecs",
                                    "/v1%5cops"])
def test_an_encoded_slash_is_no_endpoint(svc: Service, token: str, target: str) -> None:
    """Outsider round 5, F05: `/v1%2fops` was routed to `/v1/ops` (a path rule in a proxy in
    front of the service would not match it); it is the JSON 404, with or without a token."""
    body = json.dumps(_valid(svc.root)).encode()
    for auth in (None, token):
        _error(_send(svc, "POST", target, body, token=auth), 404, "SERVICE.NOT_FOUND")


def test_two_authorization_headers_are_refused(svc: Service, token: str) -> None:
    """Outsider round 5, F05: with two `Authorization` headers the first decided (good then
    bad was admitted); a proxy keeping the last would authenticate someone else."""
    body = json.dumps(_valid(svc.root)).encode()
    address = svc.url.removeprefix("http://").split(":")
    for first, second in ((token, "x"), ("x", token), (token, token)):
        head = (f"POST /v1/decide HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"Authorization: Bearer {first}\r\nAuthorization: Bearer {second}\r\n\r\n")
        with socket.create_connection((address[0], int(address[1])), timeout=60) as sock:
            sock.sendall(head.encode() + body)
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        status_line, _, rest = raw.partition(b"\r\n")
        assert int(status_line.split()[1]) == 400, raw[:300]
        err = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
        assert err["code"] == "SERVICE.BAD_REQUEST", err
