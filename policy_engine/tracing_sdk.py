"""The OTLP side of tracing (imported only with the `otel` extra): provider, batch export, and
an exporter wrapper that counts failures instead of letting them reach a call."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

log = logging.getLogger(__name__)


class CountingExporter(SpanExporter):
    """``inner`` whose failed or raising exports are counted (``on_failure(n_spans)``)."""

    def __init__(self, inner: SpanExporter, on_failure: Callable[[int], None]) -> None:
        self.inner = inner
        self.on_failure = on_failure

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:
            log.warning("trace export raised; %d spans dropped", len(spans), exc_info=True)
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.on_failure(len(spans))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def install_otlp(service_name: str, on_failure: Callable[[int], None]) -> TracerProvider:
    """A global tracer provider batching spans to the OTLP/HTTP endpoint of the environment
    (the exporter reads ``OTEL_EXPORTER_OTLP_*`` itself: endpoint, headers, timeout)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(CountingExporter(OTLPSpanExporter(),
                                                                    on_failure)))
    trace.set_tracer_provider(provider)
    return provider
