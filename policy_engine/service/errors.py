"""The service's JSON errors: the registry's codes plus the few only an HTTP front-end raises."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.refusal import PolicyRefusal, Refusal, RefusedBy, code_refusal

# the name the handler in app.py logged under before the decide fast path shared it
log = logging.getLogger("policy_engine.service.app")

# Transport-level refusals that never reach the library (no decision was asked for): they have
# their own stable codes, documented in docs/service.md; every decision or execution outcome keeps
# its registry code (policy_engine/errors.py).
SERVICE_CODES: dict[str, tuple[int, str]] = {
    "AUTH.UNAUTHENTICATED": (401, "authentication required: {reason}"),
    "SERVICE.NOT_FOUND": (404, "not found: {reason}"),
    "SERVICE.BAD_REQUEST": (400, "bad request: {reason}"),
    "SERVICE.CONFLICT": (409, "conflict: {reason}"),
    "SERVICE.PAYLOAD_TOO_LARGE": (413, "payload too large: {reason}"),
    "SERVICE.METHOD_NOT_ALLOWED": (405, "method not allowed: {reason}"),
}


class ServiceError(Exception):
    """A refusal with a stable code, an HTTP status and a public (redacted) message; its body
    carries ``error`` (the short form clients already read) and ``refusal`` (the one refusal
    document of every face, policy_engine/refusal.py).

    :param refused_by: who refused (``service`` for the front-end's own checks).
    :param location: where malformed input broke (a field path or JSON pointer).
    """

    def __init__(self, code: str, http_status: int, message: str,
                 retryable: bool = False, *, refused_by: RefusedBy = "service",
                 location: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.http_status = http_status
        self.message = message
        self.retryable = retryable
        self.refused_by: RefusedBy = refused_by
        self.location = location

    def refusal(self) -> Refusal:
        return code_refusal(self.code, self.http_status, self.message, self.refused_by,
                            retryable=self.retryable, location=self.location)

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "http_status": self.http_status,
                          "retryable": self.retryable, "message": self.message},
                "refusal": self.refusal().to_json()}


def service_error(code: str, reason: str) -> ServiceError:
    """The error of service code ``code`` with ``reason`` filled into its public template."""
    status, template = SERVICE_CODES[code]
    return ServiceError(code, status, template.format(reason=reason))


def from_engine(err: PolicyEngineError, refused_by: RefusedBy = "service") -> ServiceError:
    """An engine refusal as a service error: its registry code, status and public view only."""
    view = err.public_view()
    return ServiceError(view["code"], view["http_status"], view["message"], view["retryable"],
                        refused_by=refused_by)


def error_response(err: ServiceError, headers: Mapping[str, str] | None = None
                   ) -> JSONResponse:
    """The JSON error document of ``err`` with its HTTP status."""
    return JSONResponse(err.body(), status_code=err.http_status, headers=headers)


def refused_response(exc: PolicyRefusal) -> JSONResponse:
    """A ``PolicyRefusal`` raised by a route: its public error and the refusal document."""
    r = exc.refusal
    return JSONResponse({"error": {"code": r.code, "http_status": r.http_status,
                                   "retryable": r.retryable, "message": r.message},
                         "refusal": r.to_json()}, status_code=r.http_status)


def crash_response(exc: BaseException) -> JSONResponse:
    """The 500 of an unexpected exception: its stack goes to the log only, never the client."""
    log.error("unhandled error in the service", exc_info=exc)
    view = PolicyEngineError(ErrorCode.UNKNOWN_INTERNAL, type(exc).__name__).public_view()
    return error_response(ServiceError(view["code"], view["http_status"], view["message"],
                                       view["retryable"]))
