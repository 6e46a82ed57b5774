"""OPA's Rego through regopy (the rego-cpp interpreter): a compiled bundle, one query timed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.peers.common import FIXTURES, Case, condition_attrs, prepare

NAME = "regopy"
QUERY = "allow := data.bench.allow"
"""Bound to a variable: a bare ``data.bench.allow`` query reports a false rule as ``undefined``."""


def version() -> str:
    from importlib.metadata import version as v

    return v("regopy")


def import_error() -> str | None:
    """Why regopy cannot be used here, or ``None`` when it imports."""
    try:
        import regopy  # noqa: F401 - only checking that the extension module loads
    except Exception as exc:  # noqa: BLE001 - any failure to load is reported, whatever it is
        return f"{type(exc).__name__}: {exc}"
    return None


class Engine:
    """bench.rego (or bench_cel.rego) compiled once into a bundle; each input converted once.

    The timed call is ``set_input`` of the pre-converted input plus ``query_bundle``: rego-cpp has
    no single "evaluate with this input" entry point.
    """

    name = NAME

    def __init__(self, variant: str, cases: Sequence[Case]) -> None:
        del cases
        import regopy

        self._regopy = regopy
        fname = "bench.rego" if variant == "plain" else "bench_cel.rego"
        self.rego = regopy.Interpreter()
        self.rego.add_module("bench", (FIXTURES / fname).read_text("utf-8"))
        self.bundle = self.rego.build(QUERY)
        self.variant = variant

    def prepare(self, case: Case) -> Any:
        doc: dict[str, Any] = prepare(case.op)
        if self.variant == "cel":
            doc.update(condition_attrs(case.ctx))
        return self._regopy.Input(doc)

    def _query(self, value: Any) -> Any:
        self.rego.set_input(value)
        return self.rego.query_bundle(self.bundle)

    def decide(self, value: Any) -> bool:
        out = self._query(value)
        if not out.ok():
            raise RuntimeError(f"rego evaluation error: {out}")
        return out.results[0].bindings["allow"] is True

    def timed_call(self, value: Any) -> Callable[[], object]:
        rego, bundle = self.rego, self.bundle
        set_input, query_bundle = rego.set_input, rego.query_bundle

        def call() -> object:
            set_input(value)
            return query_bundle(bundle)

        return call
