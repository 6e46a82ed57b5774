"""Registers the `http` executor (net.http) through the public hook, as a third party would."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from plugins.executor_http.executor import DEFAULT_HEAD_BYTES, HttpExecutor
from policy_engine.config import EngineConfig
from policy_engine.executor import Executor
from policy_engine.hookspecs import hookimpl


@dataclass(frozen=True, slots=True)
class HttpOptions:
    """``[plugins.http]`` options.

    :param head_bytes: leading body bytes a result carries (base64), default 4 KiB.
    :param ca_file: PEM bundle to verify servers against instead of the default CAs.
    """

    head_bytes: int = DEFAULT_HEAD_BYTES
    ca_file: str | None = None

    @staticmethod
    def parse(raw: Mapping[str, Any]) -> HttpOptions:
        """Validate before anything is constructed; raise ``ValueError`` naming the field."""
        unknown = set(raw) - {"head_bytes", "ca_file"}
        if unknown:
            raise ValueError(f"unknown http executor option `{sorted(unknown)[0]}`")
        head = raw.get("head_bytes", DEFAULT_HEAD_BYTES)
        if not isinstance(head, int) or isinstance(head, bool) or not 0 <= head <= 1 << 20:
            raise ValueError("`head_bytes` must be an integer between 0 and 1048576")
        ca = raw.get("ca_file")
        if ca is not None and not isinstance(ca, str):
            raise ValueError("`ca_file` must be a path")
        return HttpOptions(head_bytes=head, ca_file=ca)


@hookimpl
def policy_engine_executors(config: EngineConfig) -> list[Executor]:
    """Validate ``config.plugin_options("http")`` first, then construct the executor."""
    options = HttpOptions.parse(config.plugin_options("http"))
    verify: ssl.SSLContext | bool = True
    if options.ca_file is not None:
        verify = ssl.create_default_context(cafile=options.ca_file)
    return [HttpExecutor(verify=verify, head_bytes=options.head_bytes)]
