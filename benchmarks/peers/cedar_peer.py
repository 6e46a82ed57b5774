"""Cedar (cedarpy) on the benchmark policy: pre-parsed policy set and entities, one call timed."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import cedarpy

from benchmarks.peers.common import FIXTURES, Case, condition_attrs, prepare

NAME = "cedarpy"
RESOURCE_TYPE = {"fs.read": "File", "fs.write": "File", "net.http": "Url", "browser.nav": "Url",
                 "proc.exec": "Command", "tmp.alloc": "Tmp"}


def version() -> str:
    from importlib.metadata import version as v

    return v("cedarpy")


def _resource(attrs: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """The resource's uid and its Cedar attributes (proc.exec: first argument and the rest)."""
    kind = attrs["kind"]
    cedar_attrs = {k: v for k, v in attrs.items() if k != "kind"}
    if kind == "proc.exec":
        args = cedar_attrs.pop("args")
        cedar_attrs["arg0"] = args[0] if args else ""
        cedar_attrs["rest"] = args[1:]
        cedar_attrs["argc"] = len(args)
    uid = {"type": RESOURCE_TYPE[kind], "id": json.dumps(attrs, sort_keys=True)}
    return uid, cedar_attrs


class Engine:
    """Policies parsed once into a ``cedarpy.PolicySet``; every resource entity built once.

    Each operation's attributes live on its resource entity (what ``like`` patterns test); the
    condition's inputs (subject, hour) are request context, as a Cedar user would pass them.
    """

    name = NAME

    def __init__(self, variant: str, cases: Sequence[Case]) -> None:
        fname = "bench.cedar" if variant == "plain" else "bench_cel.cedar"
        self.variant = variant
        self.policies = cedarpy.PolicySet.from_str((FIXTURES / fname).read_text("utf-8"))
        entities: dict[str, dict[str, Any]] = {
            "agent": {"uid": {"type": "Agent", "id": "bench"}, "attrs": {}, "parents": []},
        }
        for case in cases:
            uid, attrs = _resource(prepare(case.op))
            entities[uid["id"]] = {"uid": uid, "attrs": attrs, "parents": []}
        self.entities = cedarpy.Entities.from_json_str(json.dumps(list(entities.values())))

    def prepare(self, case: Case) -> dict[str, Any]:
        uid, _ = _resource(prepare(case.op))
        request: dict[str, Any] = {
            "principal": {"type": "Agent", "id": "bench"},
            "action": {"type": "Action", "id": case.op["kind"]},
            "resource": uid,
        }
        if self.variant == "cel":
            request["context"] = condition_attrs(case.ctx)
        return request

    def decide(self, request: dict[str, Any]) -> bool:
        result = cedarpy.is_authorized(request, self.policies, self.entities)
        if result.diagnostics.errors:
            raise RuntimeError(f"cedar evaluation errors: {result.diagnostics.errors}")
        return bool(result.decision == cedarpy.Decision.Allow)

    def timed_call(self, request: dict[str, Any]) -> Callable[[], object]:
        return partial(cedarpy.is_authorized, request, self.policies, self.entities)

    def decide_batch(self, requests: list[dict[str, Any]]) -> list[bool]:
        results = cedarpy.is_authorized_batch(requests, self.policies, self.entities)
        return [r.decision == cedarpy.Decision.Allow for r in results]

    def batch_call(self, requests: list[dict[str, Any]]) -> Callable[[], object]:
        """All of a row's requests in one ``is_authorized_batch`` call (timed per decision)."""
        return partial(cedarpy.is_authorized_batch, requests, self.policies, self.entities)
