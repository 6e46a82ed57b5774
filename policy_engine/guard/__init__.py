"""The guard: every concrete operation decided on resolved values (DESIGN.md §3).

Executors reuse the same resolution helpers, so what is vetted is what is opened or dialed:
``paths.normalize_path`` / ``paths.resolve_beneath``, ``urls.parse_url``, ``ipaddr.classify`` /
``ipaddr.is_address_allowed`` / ``ipaddr.check_address``.
"""

from policy_engine.guard.guard import Guard
from policy_engine.guard.ipaddr import check_address, classify, is_address_allowed
from policy_engine.guard.paths import normalize_path, resolve_beneath
from policy_engine.guard.tracer import Tracer
from policy_engine.guard.urls import ParsedUrl, mime_allowed, parse_url

__all__ = [
    "Guard", "ParsedUrl", "Tracer", "check_address", "classify", "is_address_allowed",
    "mime_allowed", "normalize_path", "parse_url", "resolve_beneath",
]
