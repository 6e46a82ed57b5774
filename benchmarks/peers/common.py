"""The benchmark's decision set and the normalization every peer receives before its timed call.

One YAML file (``benchmarks/fixtures/decisions.yaml``) drives every engine. Our guard gets the
raw operation and normalizes inside ``decide``; the peers get :func:`prepare`'s output, built
once outside the timed loop, so their rows never include path or URL parsing.
"""

from __future__ import annotations

import datetime as dt
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
DOMAINS: tuple[str, ...] = ("fs.read", "fs.write", "net.http", "proc.exec", "browser.nav",
                            "tmp.alloc")
VARIANTS: tuple[str, ...] = ("plain", "cel")
"""``plain``: no ``when`` condition; ``cel``: every permit carries one (see decisions.yaml)."""

DEFAULT_PORTS = {"https": 443, "http": 80}
BENCH_DAY = dt.datetime(2025, 1, 15, tzinfo=dt.UTC)
"""Cases run on this day; only the hour varies (it is what the condition reads)."""


@dataclass(frozen=True, slots=True)
class Context:
    """Who asks and when: the condition's inputs (subject from the grant, hour from ``now``)."""

    note: str
    subject: str
    hour: int
    admits: bool

    @property
    def now_ms(self) -> int:
        return int((BENCH_DAY + dt.timedelta(hours=self.hour, minutes=7)).timestamp() * 1000)


PLAIN_CONTEXT = Context("no condition", "agent:bench", 10, True)


@dataclass(frozen=True, slots=True)
class Case:
    """One decision: an operation, under a context, and the answer every engine must give."""

    domain: str
    note: str
    op: Mapping[str, Any]
    want: bool
    ctx: Context

    @property
    def label(self) -> str:
        return f"{self.domain}: {self.note} [{self.ctx.note}]"


def load_cases(variant: str, domains: tuple[str, ...] = DOMAINS) -> list[Case]:
    """The decision set of ``variant``; the ``cel`` variant runs each case under each context."""
    raw = yaml.safe_load((FIXTURES / "decisions.yaml").read_text(encoding="utf-8"))
    if variant == "plain":
        contexts = [PLAIN_CONTEXT]
    else:
        contexts = [Context(c["note"], c["subject"], c["hour"], c["admits"])
                    for c in raw["contexts"]]
    out: list[Case] = []
    for domain in domains:
        for ctx in contexts:
            for item in raw["domains"][domain]:
                want = item["want"] == "allow" and ctx.admits
                out.append(Case(domain, item["note"], {"kind": domain, **item["op"]}, want, ctx))
    return out


def home() -> str:
    """What ``~`` expands to in every fixture policy."""
    return str(yaml.safe_load((FIXTURES / "decisions.yaml").read_text(encoding="utf-8"))["home"])


def normalize_path(path: str) -> str:
    """Lexical normalization for the peers (``//``, ``.``, ``..`` and a trailing ``/`` folded).

    Our guard refuses ``..`` outright; resolving it here instead gives the peers the path it
    would reach, and decisions.yaml only holds traversals whose target is denied either way.
    """
    return posixpath.normpath("/" + path.lstrip("/")) if path.startswith("/") else path


def parse_url(url: str) -> dict[str, Any]:
    """Scheme, canonical host (lowercase, no trailing dot) and effective port of ``url``."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".").lower()
    port = parts.port if parts.port is not None else DEFAULT_PORTS.get(scheme, 0)
    return {"scheme": scheme, "host": host, "port": port}


def prepare(op: Mapping[str, Any]) -> dict[str, Any]:
    """The normalized attributes of ``op`` every peer decides on.

    :returns: ``kind`` plus ``path`` (fs), ``scheme``/``host``/``port``/``method`` (net.http,
        browser.nav), ``tool``/``args`` (proc.exec) or ``size`` (tmp.alloc).
    """
    kind = op["kind"]
    if kind in ("fs.read", "fs.write"):
        return {"kind": kind, "path": normalize_path(op["path"])}
    if kind == "net.http":
        return {"kind": kind, **parse_url(op["url"]), "method": op.get("method", "GET").upper()}
    if kind == "browser.nav":
        return {"kind": kind, **parse_url(op["url"])}
    if kind == "proc.exec":
        return {"kind": kind, "tool": op["tool"], "args": list(op.get("args", ()))}
    if kind == "tmp.alloc":
        return {"kind": kind, "size": int(op["size_bytes"])}
    raise ValueError(f"unknown operation kind `{kind}`")


def condition_attrs(ctx: Context) -> dict[str, Any]:
    """The CEL condition's inputs as peers see them: the subject and the UTC hour of ``now``."""
    return {"subject": ctx.subject, "hour": ctx.hour}
