"""Casbin (pycasbin) on the benchmark policy: one enforcer built once, ``enforce`` timed."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import casbin

from benchmarks.peers.common import FIXTURES, Case, condition_attrs, prepare

NAME = "pycasbin"


def version() -> str:
    from importlib.metadata import version as v

    return v("casbin")


class Engine:
    """``casbin.Enforcer`` over casbin_model.conf and the variant's policy CSV.

    A request is ``(domain, resource, action, context)``; see casbin_model.conf for how each
    operation maps to them. The context always carries the size and the condition's inputs.
    """

    name = NAME

    def __init__(self, variant: str, cases: Sequence[Case]) -> None:
        del cases  # nothing to pre-build per operation
        logging.getLogger("casbin").setLevel(logging.WARNING)
        fname = "casbin_policy.csv" if variant == "plain" else "casbin_policy_cel.csv"
        self.enforcer = casbin.Enforcer(str(FIXTURES / "casbin_model.conf"), str(FIXTURES / fname))

    def prepare(self, case: Case) -> tuple[str, str, str, dict[str, Any]]:
        attrs = prepare(case.op)
        kind = attrs["kind"]
        ctx: dict[str, Any] = {"size": 0, **condition_attrs(case.ctx)}
        if kind in ("fs.read", "fs.write"):
            return kind, attrs["path"], "", ctx
        if kind in ("net.http", "browser.nav"):
            res = f"{attrs['scheme']}://{attrs['host']}:{attrs['port']}"
            return kind, res, attrs.get("method", ""), ctx
        if kind == "proc.exec":
            return kind, attrs["tool"], "\x00".join(attrs["args"]), ctx
        ctx["size"] = attrs["size"]
        return kind, "", "", ctx

    def decide(self, request: tuple[str, str, str, dict[str, Any]]) -> bool:
        return bool(self.enforcer.enforce(*request))

    def timed_call(self, request: tuple[str, str, str, dict[str, Any]]) -> Callable[[], object]:
        return partial(self.enforcer.enforce, *request)
