"""OpenTelemetry spans for each call (face → decide → consent → execute → evidence), a no-op
without the `otel` extra or a configured tracer provider.

Spans carry what an operator filters on — the decision code, the deciding rule, the backend,
the tenant, the op kind — and never secrets: no argv, paths, URLs, bodies, tokens or grant
contents. A caller's W3C ``traceparent`` (HTTP header, MCP ``_meta``) becomes the parent.

Export is the SDK's batch processor, off the call's thread; an export that fails is counted
(:func:`export_failures`, shown on ``/metrics``) and never fails a call.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from types import ModuleType

# opentelemetry is imported only once something has imported its trace API (an embedder
# setting a provider, configure(), use()): before that no provider can exist, so the ~15 ms
# import is not paid by every command start
_api: ModuleType | None = None


def _otel() -> ModuleType | None:
    global _api
    if _api is None and "opentelemetry.trace" in sys.modules:
        try:
            import opentelemetry.context
            import opentelemetry.propagate
            import opentelemetry.trace
        except ImportError:
            return None
        _api = opentelemetry
    return _api

TRACER_NAME = "policy_engine"
_failures = 0
_failures_lock = threading.Lock()
Attributes = Mapping[str, str | int | float | bool | None]


class _NoSpan:
    """What a span call yields when nothing records: accepts and drops attributes."""

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        pass

    def is_recording(self) -> bool:
        return False


NO_SPAN = _NoSpan()


_provider: Any = None  # set by use(): wins over the global provider


def use(provider: Any) -> None:
    """Record spans with ``provider`` (an SDK ``TracerProvider``) instead of the global one;
    ``None`` goes back to the global. For embedders and tests that must not set the
    process-wide provider (OpenTelemetry allows setting it once)."""
    global _provider
    _provider = provider


_ENV_PROVIDER: list[bool] = []  # whether OTEL_PYTHON_TRACER_PROVIDER was set (read once)


def enabled() -> bool:
    """Whether spans are recorded: an SDK tracer provider was installed (by :func:`configure`,
    :func:`use` or the embedding application); checked per call, cheaply."""
    api = _otel()
    if api is None:
        return False
    if _provider is not None:
        return True
    if not _ENV_PROVIDER:
        _ENV_PROVIDER.append("OTEL_PYTHON_TRACER_PROVIDER" in os.environ)
    # no global provider set and none named by the environment: the proxy, nothing records
    # (``get_tracer_provider`` reads the environment on each call: ≈ 1 µs, five spans an op)
    if getattr(api.trace, "_TRACER_PROVIDER", False) is None and not _ENV_PROVIDER[0]:
        return False
    return not isinstance(api.trace.get_tracer_provider(), api.trace.ProxyTracerProvider)


def _tracer() -> Any:
    api = _otel()
    assert api is not None  # INVARIANT: callers checked enabled()
    return (_provider or api.trace.get_tracer_provider()).get_tracer(TRACER_NAME)


def _clean(attributes: Attributes | None) -> dict[str, Any]:
    return {k: v for k, v in (attributes or {}).items() if v is not None}


class _NotRecording:
    """What :func:`span` returns when nothing records: one shared context manager, no
    generator built per span (an op opens five; issue 27)."""

    __slots__ = ()

    def __enter__(self) -> Any:
        return NO_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


_NOT_RECORDING = _NotRecording()


def span(name: str, attributes: Attributes | None = None) -> AbstractContextManager[Any]:
    """A child span of the current one named ``name`` (``NO_SPAN`` when not recording)."""
    if not enabled():
        return _NOT_RECORDING
    return _recorded_span(name, attributes)


@contextmanager
def _recorded_span(name: str, attributes: Attributes | None) -> Iterator[Any]:
    tracer = _tracer()
    with tracer.start_as_current_span(name, attributes=_clean(attributes)) as current:
        yield current


@contextmanager
def remote_parent(carrier: Mapping[str, Any] | None) -> Iterator[None]:
    """Make the W3C ``traceparent``/``tracestate`` in ``carrier`` the current context (an
    MCP request's ``_meta``, HTTP headers); a malformed one is ignored, as the spec says."""
    if not enabled() or not carrier:
        yield
        return
    fields = {k.lower(): v for k, v in carrier.items()
              if k.lower() in ("traceparent", "tracestate") and isinstance(v, str)
              and len(v) <= 512}
    if not fields:
        yield
        return
    api = _otel()
    assert api is not None  # INVARIANT: enabled() said so
    token = api.context.attach(api.propagate.extract(fields))
    try:
        yield
    finally:
        api.context.detach(token)


@contextmanager
def http_span(method: str, route: str,
              headers: Iterable[Sequence[bytes]]) -> Iterator[Any]:
    """The server span of one HTTP request, its parent the caller's ``traceparent``."""
    if not enabled():
        yield NO_SPAN
        return
    carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers
               if k in (b"traceparent", b"tracestate")}
    with remote_parent(carrier):
        tracer = _tracer()
        with tracer.start_as_current_span(
                f"{method} {route}", kind=_spankind_server(),
                attributes={"http.request.method": method, "http.route": route}) as current:
            yield current


def _spankind_server() -> Any:
    api = _otel()
    assert api is not None
    return api.trace.SpanKind.SERVER


def decision_attributes(decision: Any, profile: Any = None) -> dict[str, Any]:
    """The attributes a decision adds: allowed, code, deciding rule, tenant, tool."""
    rule = getattr(decision, "rule", None)
    return _clean({
        "policy_engine.decision": "allow" if getattr(decision, "allowed", False) else "deny",
        "policy_engine.code": getattr(decision, "code", None),
        "policy_engine.rule": getattr(rule, "id", None),
        "policy_engine.tenant": getattr(profile, "tenant", None),
        "policy_engine.tool": getattr(profile, "tool_name", None),
    })


def export_failures() -> int:
    """Spans the exporter failed to deliver since start (``/metrics`` shows it)."""
    return _failures


def _count_failure(spans: int) -> None:
    global _failures
    with _failures_lock:
        _failures += spans


def configure(environ: Mapping[str, str] | None = None) -> str | None:
    """Install an SDK tracer provider exporting over OTLP/HTTP when the standard variables
    name an endpoint (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``;
    ``OTEL_SERVICE_NAME`` defaults to ``policy-engine``). Returns a problem to print (the
    extra missing) or ``None``; with no endpoint it does nothing.
    """
    env = os.environ if environ is None else environ
    if not (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return None
    try:
        from policy_engine.tracing_sdk import install_otlp
    except ImportError:
        return ("OTEL_EXPORTER_OTLP_ENDPOINT is set but traces need the `otel` extra: "
                "pip install 'policy-engine[otel]'")
    install_otlp(env.get("OTEL_SERVICE_NAME") or "policy-engine", _count_failure)
    return None
