"""`/metrics` for `serve`: the engine's registries and the service's own, on a port of its own.

Why a port of its own and not a token role: the engine's metrics carry every tenant's labels
(``sandbox_exec_total{tenant}``), so on the API port they would need a cross-tenant role the
token store does not have; a separate listener (loopback unless told otherwise) is what a
Prometheus scrape config and a firewall rule expect, keeps the scrape path out of the API's
admission, rate limits and body checks, and a slow or failing scrape cannot take an API worker.

Nothing here fails a call: the middleware records after the response is sent and swallows its
own errors (counted in ``policy_engine_metrics_errors_total``), and a collector that raises
during a scrape is counted and left out of that scrape. Route labels are route templates
(``/sandbox/execs/{exec_id}``), never raw paths, argv, tokens or bodies.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from policy_engine import tracing
from policy_engine.confirm.services import ConfirmationService, ConsentAnswer, ConsentRequest
from policy_engine.observe import Metrics
from policy_engine.service.listen import set_nodelay

log = logging.getLogger(__name__)

_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
            30, 60, 120)
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
SESSION_IDLE_S = 900  # a run_code session touched within 15 minutes counts as live
_MAX_SESSIONS_SCANNED = 10_000  # bounds the scrape's directory walk


class ServiceMetrics:
    """The service's metrics, plus the engines whose registries ``/metrics`` merges in."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("policy_engine_http_requests", "HTTP requests answered",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("policy_engine_http_request_duration_seconds",
                                 "time from request to the last response byte",
                                 ["route", "method"], buckets=_SECONDS, registry=r)
        self.in_flight = Gauge("policy_engine_http_requests_in_flight",
                               "requests being answered", registry=r)
        self.approvals = Counter("policy_engine_consent_answers",
                                 "consent questions answered by the confirmation service",
                                 ["answer", "mode"], registry=r)
        self.errors = Counter("policy_engine_metrics_errors",
                              "metrics or trace work that failed (never the call)",
                              ["stage"], registry=r)
        self.sessions_live = Gauge("policy_engine_sessions_live",
                                   "sessions live (/v1/sessions) plus run_code sessions used in "
                                   f"the last {SESSION_IDLE_S} s", registry=r)
        self._sources: list[Callable[[], Iterable[Metrics]]] = []
        self._workspace: Path | None = None
        self._sessions: Any = None
        self.sessions_live.set_function(self._count_sessions)

    # -- what is measured -------------------------------------------------------------------

    def track(self, engine: Any) -> None:
        """Merge ``engine``'s orchestrators' registries into the scrape and count its consent
        answers (``engine`` is a service ``Engine``; typed loosely to keep app.py's imports
        out of this module)."""
        self._workspace = Path(engine.config.workspace_root)
        self._sessions = getattr(engine, "sessions", None)  # the session runtime, when served
        self._sources.append(lambda: [engine.orch.metrics,
                                      *(o.metrics for o in engine.pool.orchestrators())])
        broker = engine.gateway.broker  # every face's consent goes through the gateway's
        broker.service = CountedConfirmation(broker.service, self)

    def _count_sessions(self) -> float:
        """Live sessions: those with a lifecycle (``/v1/sessions``, exact) and the run_code
        session directories used lately (``/v1/run_code`` names a session per call)."""
        lifecycle = 0.0
        if self._sessions is not None:
            try:
                lifecycle = float(self._sessions.store.live_count(int(time.time() * 1000)))
            except Exception:  # noqa: BLE001 - a scrape never fails a call; counted
                self.errors.labels(stage="sessions").inc()
        return lifecycle + self._count_run_code_sessions()

    def _count_run_code_sessions(self) -> float:
        root = self._workspace
        if root is None:
            return 0.0
        cutoff, live, seen = time.time() - SESSION_IDLE_S, 0, 0
        try:
            for tenant in os.scandir(root / "tenants"):
                sessions = Path(tenant.path) / "sessions"
                if not sessions.is_dir():
                    continue
                for entry in os.scandir(sessions):
                    seen += 1
                    if seen > _MAX_SESSIONS_SCANNED:
                        return float(live)
                    work = Path(entry.path) / "work"
                    stamps = [entry.stat(follow_symlinks=False).st_mtime]
                    if work.is_dir():
                        stamps.append(work.stat().st_mtime)
                    live += max(stamps) >= cutoff
        except OSError:
            pass  # no workspace yet, or one vanishing under the scan: count what was seen
        return float(live)

    # -- the scrape ----------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """Every family once: the service's, then the engines' with equal samples summed (one
        engine per proc.exec backend keeps its own registry)."""
        yield from self.registry.collect()
        yield CounterMetricFamily("policy_engine_trace_export_failures",
                                  "spans the OTLP exporter failed to deliver",
                                  value=tracing.export_failures())
        merged: dict[str, Metric] = {}
        sums: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        try:
            registries = [m.registry for source in self._sources for m in source()]
        except Exception:
            self.errors.labels(stage="scrape").inc()
            log.exception("listing the engines for /metrics failed")
            registries = []
        for registry in registries:
            try:
                families = list(registry.collect())
            except Exception:
                self.errors.labels(stage="scrape").inc()
                log.exception("a metrics collector failed during a scrape")
                continue
            for family in families:
                into = merged.setdefault(family.name, Metric(family.name, family.documentation,
                                                             family.type, family.unit))
                for s in family.samples:
                    key = (s.name, tuple(sorted(s.labels.items())))
                    at = sums.get(key)
                    if at is None:
                        sums[key] = len(into.samples)
                        into.samples.append(s)
                    elif not s.name.endswith("_created"):  # a creation time is not summed
                        old = into.samples[at]
                        into.samples[at] = old._replace(value=old.value + s.value)
        yield from merged.values()

    def serve(self, host: str, port: int) -> int:
        """Start the ``/metrics`` listener in a daemon thread; the port it bound."""
        view = CollectorRegistry(auto_describe=False)
        view.register(_View(self))
        server, _thread = start_http_server(port, addr=host, registry=view)
        # Linux copies the listener's TCP_NODELAY to every connection it accepts: a scrape's
        # answer never waits for the scraper's delayed ACK (issue 27 item 1)
        set_nodelay(server.socket)
        return int(server.server_port)


def instrument(app: ASGIApp, routed: Any, metrics: ServiceMetrics | None) -> ASGIApp:
    """``app`` counted by ``metrics`` and traced when a tracer provider is installed; as it
    is when neither (no per-request cost). ``routed`` is the FastAPI app whose routes'
    templates label the requests."""
    if metrics is None and not tracing.enabled():
        return app
    return _Middleware(app, metrics, lambda: routed.routes)


class _View(Collector):
    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return list(self.metrics.collect())


class CountedConfirmation:
    """A confirmation service whose answers are counted by answer and mode."""

    def __init__(self, inner: ConfirmationService, metrics: ServiceMetrics) -> None:
        self.inner = inner
        self.mode = inner.mode
        self._metrics = metrics

    def confirm(self, request: ConsentRequest) -> ConsentAnswer:
        try:
            answer = self.inner.confirm(request)
        except Exception:
            self._count("error")
            raise  # the broker turns it into a no (broker.py), as without metrics
        self._count("approved" if answer.approved else "denied")
        return answer

    def _count(self, answer: str) -> None:
        try:
            self._metrics.approvals.labels(answer=answer, mode=self.mode).inc()
        except Exception:  # a metric never decides a consent
            log.exception("counting a consent answer failed")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _Middleware:
    """Counts, times and traces each HTTP request; never changes what the app answers."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics | None,
                 routes: Callable[[], Iterable[Any]]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes
        self._lock = threading.Lock()

    def _route(self, path: str) -> str:
        # INVARIANT: only a template of a registered route or "other" becomes a label (bounded
        # cardinality; an exec id or artifact name in the path never does)
        for route in self.routes():
            regex = getattr(route, "path_regex", None)
            if regex is not None and regex.match(path):
                return str(route.path)
        return "other"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500
        method = str(scope.get("method", "GET"))
        method = method if method in _METHODS else "other"  # a client picks the method
        try:
            route = self._route(str(scope.get("path", "")))
        except Exception:
            route = "other"

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        m = self.metrics
        if m is not None:
            m.in_flight.inc()
        try:
            with tracing.http_span(method, route, scope.get("headers") or ()) as span:
                await self.app(scope, receive, sending)
                span.set_attribute("http.response.status_code", status)
        finally:
            if m is not None:
                m.in_flight.dec()
                try:
                    m.requests.labels(route=route, method=method, status=str(status)).inc()
                    m.latency.labels(route=route, method=method).observe(
                        time.perf_counter() - start)
                except Exception:
                    m.errors.labels(stage="record").inc()
