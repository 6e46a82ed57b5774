"""pytest in a child process without the installed plugins its run never uses.

A pytest started here loads every plugin installed beside it (entry points ``pytest11``):
langsmith, pytest-lsp (lsprotocol), schemathesis and hypothesis cost about 5 s of CPU per start,
against under one second without them (2026-11-29). The tests that run pytest in a child (the
conformance kit's pytest plugin, a generated plugin's own tests, the snapshot-drift runs) use
none of them: blocking them (``-p no:NAME``) changes nothing those runs check, and the plugins
they do use (the kit's ``policy_engine_conformance``, syrupy) still load from their entry points,
as on a plugin author's machine.
"""

from __future__ import annotations

UNUSED = ("langsmith_plugin", "pytest-lsp", "schemathesis", "hypothesispytest", "benchmark",
          "xdist", "xdist.looponfail")
"""Entry-point names of installed pytest plugins that no child run of the suite uses."""

WITHOUT_UNUSED = tuple(arg for name in UNUSED for arg in ("-p", f"no:{name}"))
"""pytest arguments that keep ``UNUSED`` from loading."""
