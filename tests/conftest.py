"""How pytest-xdist spreads the suite over workers: one file's tests stay on one worker, in order.

``scripts/test.sh`` runs ``pytest -n N --dist loadgroup --no-loadscope-reorder``. Without a
mark of its own, every test joins the group of its file, so a file keeps what a serial run gave
it: its module- and class-scoped fixtures (servers, pools, built images) are made once, and its
tests run in the order they are written. Files that must not run beside each other share one
``pytest.mark.xdist_group(name=...)`` mark (they then run one after the other on one worker).
The queue keeps collection order (integration files first, the quick unit files fill the end).
Without ``-n`` (a single file, a plain ``pytest``) this does nothing.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)  # before xdist's worker suffixes each node id with its group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(name=item.nodeid.split("::", 1)[0]))
