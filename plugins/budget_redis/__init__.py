"""Redis budget meter, concurrency slots and revocation list (``budget_meter: redis``,
``revocation: redis``): state shared by every replica talking to one Redis, each check-and-change
one atomic Lua script (scripts.py).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from plugins.budget_redis import scripts
from plugins.budget_sqlite.leases import process_start
from policy_engine.budget import BudgetMeter, check_amount, exceeded, new_lease, too_many
from policy_engine.config import EngineConfig
from policy_engine.errors import PolicyEngineError
from policy_engine.hookspecs import hookimpl
from policy_engine.lazy import lazy_module
from policy_engine.model import Grant
from policy_engine.orchestration.revocation import RevocationWatcher, revocation_keys
from policy_engine.orchestration.store_errors import STORE_UNAVAILABLE

if TYPE_CHECKING:
    import redis
else:  # imported when a store is first made: a start that uses no Redis does not pay for it
    redis = lazy_module("redis", required=True)  # missing: this plugin is "not installed"

log = logging.getLogger(__name__)

PLUGIN = "budget_redis"
_OPTIONS = {"url", "prefix", "timeout_s", "key_ttl_s"}


def display_url(url: str) -> str:
    """``redis://host:port/db`` (``unix:///path``) without user or password: what messages and
    evidence show."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or "?"
    host = f"[{host}]" if ":" in host else host
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def unavailable(what: str, where: str, exc: BaseException) -> PolicyEngineError:
    """``PROVIDER.UNAVAILABLE`` naming the store and the cause, as the SQLite stores do."""
    cause = str(exc) or type(exc).__name__
    return PolicyEngineError(STORE_UNAVAILABLE, f"{what} `{where}` cannot be used: {cause}",
                             audit={"store": what, "path": where,
                                    "exception": type(exc).__name__})


class RedisStore:
    """One client (a thread-safe, fork-aware connection pool) and the key prefix."""

    def __init__(self, url: str, *, prefix: str = "policy-engine:", timeout_s: float = 2.0,
                 key_ttl_s: int = 0) -> None:
        self.url = display_url(url)
        self.prefix = prefix
        self.key_ttl_ms = key_ttl_s * 1000
        # short timeouts: a Redis that does not answer denies the call quickly (fail closed)
        # instead of holding an agent's request for the OS's TCP timeout
        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                           socket_connect_timeout=timeout_s)

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def close(self) -> None:
        self.client.close()


class RedisBudgetMeter:
    """``BudgetMeter`` and ``ConcurrencyMeter`` over Redis.

    A charge is one ``EVALSHA`` of ``scripts.CHARGE``: the read, the check and the add happen
    inside Redis with no other command in between, so concurrent charges from any number of
    processes and hosts never over-spend a limit. A Redis that cannot be reached (down, timing
    out, refusing) denies every charge and every slot with ``PROVIDER.UNAVAILABLE`` naming the
    URL (without credentials) and the cause; nothing is charged or granted meanwhile, and the
    next call retries.

    Durability is Redis's: without AOF (``appendonly yes``) a Redis restart forgets what was
    spent, so a production Redis for budgets runs with AOF (docs/operations.md).
    """

    name = "redis"

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._charge = store.client.register_script(scripts.CHARGE)
        self._acquire = store.client.register_script(scripts.ACQUIRE)
        self._host = socket.gethostname()
        try:
            store.client.ping()
        except redis.RedisError as exc:
            log.error("budget store `%s` cannot be used: %s; calls that charge it are denied "
                      "(%s) until it answers", store.url, exc, STORE_UNAVAILABLE.value)

    def _failed(self, exc: BaseException) -> PolicyEngineError:
        return unavailable("budget store", self.store.url, exc)

    def check_and_consume(self, grant_key: str, kind: str, amount: int, limit: int | None) -> int:
        check_amount(kind, amount)
        try:
            ok, value = self._charge(keys=[self.store.key("budget", grant_key)],
                                     args=[kind, amount, "" if limit is None else limit,
                                           self.store.key_ttl_ms])
        except redis.RedisError as exc:
            raise self._failed(exc) from exc
        if int(ok) == 1:
            return int(value)
        assert limit is not None  # INVARIANT: the script refuses only against a limit
        raise exceeded(grant_key, kind, limit, int(value), amount)

    def used(self, grant_key: str) -> dict[str, int]:
        try:
            raw: Mapping[Any, Any] = self.store.client.hgetall(
                self.store.key("budget", grant_key))
        except redis.RedisError as exc:
            raise self._failed(exc) from exc
        return {_text(k): int(v) for k, v in raw.items()}

    # concurrency slots: a sorted set of leases per grant, scored by expiry (scripts.ACQUIRE)
    def acquire(self, grant_key: str, limit: int, *, hold_s: float) -> str:
        # the lease names its process, so a killed engine's slots on this host are found and
        # freed at once (other hosts' when their lease expires)
        pid = os.getpid()
        lease = f"{new_lease()}|{self._host}|{pid}|{process_start(pid) or '?'}"
        key = self.store.key("slots", grant_key)
        hold_ms = max(1, int(hold_s * 1000))
        try:
            ok, held = self._acquire(keys=[key], args=[lease, limit, hold_ms])
            if int(ok) != 1 and self._drop_dead(key):
                ok, held = self._acquire(keys=[key], args=[lease, limit, hold_ms])
        except redis.RedisError as exc:
            raise self._failed(exc) from exc
        if int(ok) != 1:
            raise too_many(grant_key, limit, int(held))
        return lease

    def _drop_dead(self, key: str) -> bool:
        """Remove this host's leases whose process is gone; ``True`` when any was."""
        dead = []
        for raw in self.store.client.zrange(key, 0, -1):
            member = _text(raw)
            parts = member.split("|")
            if len(parts) == 4 and parts[1] == self._host and parts[2].isdigit() \
                    and process_start(int(parts[2])) != parts[3]:
                dead.append(member)
        if dead:
            self.store.client.zrem(key, *dead)
        return bool(dead)

    def release(self, grant_key: str, lease: str) -> None:
        try:
            self.store.client.zrem(self.store.key("slots", grant_key), lease)
        except redis.RedisError as exc:  # the lease expires on its own (hold_s)
            log.error("cannot release a concurrency slot in `%s`: %s (it expires by itself)",
                      self.store.url, exc)

    def close(self) -> None:
        self.store.close()


class RedisRevocationList:
    """Revocations in one Redis set: every replica sees a revocation as soon as ``revoke``
    returns. A Redis that cannot be read denies the call (``PROVIDER.UNAVAILABLE``): an
    unreadable list never means "not revoked".
    """

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._key = store.key("revoked")

    def revoke(self, key: str) -> None:
        if not key:
            raise ValueError("revocation key must not be empty")
        try:
            self.store.client.sadd(self._key, key)
        except redis.RedisError as exc:
            raise unavailable("revocation list", self.store.url, exc) from exc

    def is_revoked(self, grant: Grant) -> bool:
        try:
            found = self.store.client.smismember(self._key, list(revocation_keys(grant)))
        except redis.RedisError as exc:
            raise unavailable("revocation list", self.store.url, exc) from exc
        return any(bool(x) for x in found)

    def close(self) -> None:
        self.store.close()


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def store_from(config: EngineConfig) -> RedisStore:
    """Validate ``options.budget_redis`` (``url`` required; ``prefix``, ``timeout_s``,
    ``key_ttl_s``)."""
    options = config.plugin_options(PLUGIN)
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise ValueError(f"{PLUGIN}: unknown option `{unknown[0]}`")
    url = options.get("url")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"{PLUGIN}: option `url` is required, e.g. redis://127.0.0.1:6379/0")
    prefix = options.get("prefix", "policy-engine:")
    if not isinstance(prefix, str):
        raise ValueError(f"{PLUGIN}: `prefix` must be a string")
    timeout = options.get("timeout_s", 2.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 60:
        raise ValueError(f"{PLUGIN}: `timeout_s` must be a number of seconds in (0, 60]")
    # a grant's budget hash expires this long after its first charge (0: never). Budgets of
    # grants that live longer than this would start again from zero: set it above the longest
    # grant lifetime (and above a minute, for the service's per-minute rate windows)
    ttl = options.get("key_ttl_s", 0)
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 0:
        raise ValueError(f"{PLUGIN}: `key_ttl_s` must be a whole number of seconds >= 0")
    return RedisStore(url, prefix=prefix, timeout_s=float(timeout), key_ttl_s=ttl)


@hookimpl
def policy_engine_budget_meter(config: EngineConfig) -> BudgetMeter | None:
    if not config.wants_meter(RedisBudgetMeter.name) or config.budget_meter == "*" and \
            PLUGIN not in config.options:
        return None
    return RedisBudgetMeter(store_from(config))


@hookimpl
def policy_engine_revocation_list(config: EngineConfig) -> RevocationWatcher | None:
    if config.revocation != "redis":
        return None
    return RedisRevocationList(store_from(config))
