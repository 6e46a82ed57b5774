"""The ``net.http`` executor plugin: httpx with pinned DNS and per-hop checks."""

from plugins.executor_http.executor import HttpExecutor
from policy_engine.netproxy.headers import clean_request_headers, redacted_url
from policy_engine.netproxy.resolve import PinnedTarget, Resolver, Vetted, pin, system_resolver, vet

__all__ = [
    "HttpExecutor", "PinnedTarget", "Resolver", "Vetted", "clean_request_headers", "pin",
    "redacted_url", "system_resolver", "vet",
]
