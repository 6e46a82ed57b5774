"""The pinned transport: dial the vetted address, never a name httpx would resolve again.

The request URL handed to httpx carries the vetted IP as its host, so no second lookup can
happen anywhere below; the ``Host`` header carries the name, and for HTTPS the name is sent as
SNI and is what the certificate is verified against (httpcore's ``sni_hostname`` extension).
Connection pools are keyed by address, so HTTPS pools are kept per SNI name: a connection
verified for one name is never reused for another.
"""

from __future__ import annotations

import functools
import ipaddress
import ssl
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from policy_engine.lazy import lazy_module
from policy_engine.netproxy.resolve import IPAddress

if TYPE_CHECKING:
    import httpx
else:  # with httpcore (and trio, when installed) on the first request, not at every start
    httpx = lazy_module("httpx")

DEFAULT_PORTS = {"http": 80, "https": 443}


def host_header(host: str, port: int, scheme: str) -> str:
    """The ``Host`` header for ``host`` (IPv6 literals bracketed), port only when not default."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return shown if DEFAULT_PORTS.get(scheme) == port else f"{shown}:{port}"


class PinnedTransport:
    """Sends requests to vetted addresses over reused connection pools.

    :param verify: TLS verification: ``True`` (system/certifi CAs), an ``ssl.SSLContext`` (e.g. a
        test CA) or ``False`` (never in production).
    :param max_tls_pools: HTTPS pools kept (one per SNI name), least recently used dropped.
    """

    def __init__(self, verify: ssl.SSLContext | bool = True, max_tls_pools: int = 64) -> None:
        # nothing is loaded or opened here: the CA store and the pools come with the first
        # request (an engine that makes none, most CLI runs, never pays for them)
        self._verify = verify
        self._ssl: ssl.SSLContext | None = None
        self._http: httpx.HTTPTransport | None = None
        self._tls: OrderedDict[str, httpx.HTTPTransport] = OrderedDict()
        self._max_tls = max_tls_pools
        self._lock = threading.Lock()

    def _new(self) -> httpx.HTTPTransport:
        if self._ssl is None:
            verify = self._verify
            self._ssl = verify if isinstance(verify, ssl.SSLContext) else _shared_ssl_context(
                verify)
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=16,
                              keepalive_expiry=5.0)
        return httpx.HTTPTransport(verify=self._ssl, trust_env=False, retries=0, limits=limits)

    def _pool(self, scheme: str, sni: str) -> httpx.HTTPTransport:
        with self._lock:
            if scheme != "https":
                if self._http is None:
                    self._http = self._new()
                return self._http
            pool = self._tls.get(sni)
            if pool is None:
                pool = self._tls[sni] = self._new()
                while len(self._tls) > self._max_tls:
                    _, old = self._tls.popitem(last=False)
                    old.close()
            else:
                self._tls.move_to_end(sni)
            return pool

    def open(
        self, method: str, scheme: str, host: str, port: int, target: str,
        addresses: Sequence[IPAddress], headers: list[tuple[str, str]], body: bytes,
        timeout: float,
    ) -> tuple[httpx.Response, IPAddress]:
        """Send the request to the first address that accepts a connection; stream the answer.

        The caller must ``close()`` the response; closing before the body is read to its end
        closes the connection.

        :param target: path and query, already percent-encoded (``/a/b?c=d``).
        :return: the response (body not yet read) and the address it came from.
        :raises httpx.HTTPError: transport failures, mapped to registry codes by the executor.
        """
        pool = self._pool(scheme, host)
        hdrs = [("Host", host_header(host, port, scheme)), *headers]
        t = max(timeout, 0.001)
        ext: dict[str, object] = {"timeout": {"connect": t, "read": t, "write": t, "pool": t}}
        if scheme == "https" and not _is_literal(host):
            ext["sni_hostname"] = host
        last: httpx.ConnectError | None = None
        for address in addresses:
            url = httpx.URL(scheme=scheme, host=str(address), port=port,
                            raw_path=target.encode("ascii"))
            request = httpx.Request(method, url, headers=hdrs, content=body or None,
                                    extensions=ext)
            try:
                return pool.handle_request(request), address
            except httpx.ConnectError as exc:
                last = exc
        assert last is not None  # INVARIANT: pin() never returns an empty address list
        raise last

    def close(self) -> None:
        """Close every pool."""
        with self._lock:
            if self._http is not None:
                self._http.close()
                self._http = None
            for pool in self._tls.values():
                pool.close()
            self._tls.clear()


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=2)
def _shared_ssl_context(verify: bool) -> ssl.SSLContext:
    """One context per verify setting for the whole process: loading the system CA store
    costs ~20 ms, and an SSLContext is safe to share between connections and threads.
    """
    return httpx.create_ssl_context(verify=verify)
