"""How pytest-xdist spreads the suite over workers: one file's tests stay on one worker, in order.

``scripts/test.sh`` runs ``pytest -n N --dist loadgroup --no-loadscope-reorder``. Without a
mark of its own, every test joins the group of its file, so a file keeps what a serial run gave
it: its module- and class-scoped fixtures (servers, pools, built images) are made once, and its
tests run in the order they are written. Files that must not run beside each other share one
``pytest.mark.xdist_group(name=...)`` mark (they then run one after the other on one worker).
The queue is the integration files, then conformance/, then the quick unit files.
Without ``-n`` (a single file, a plain ``pytest``) this does nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from plugins.executor_proc.executor import ProcExecutor


@pytest.hookimpl(tryfirst=True)  # before xdist's worker suffixes each node id with its group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(name=item.nodeid.split("::", 1)[0]))
    # the long files first, the quick ones fill the end: conformance/ (its snapshot-drift runs
    # take a minute) used to be collected last, after the unit files, and ran alone at the end
    items.sort(key=_queue_rank)  # stable: each file keeps its order


def _queue_rank(item: pytest.Item) -> int:
    top = item.nodeid.split("/", 2)
    return {"integration": 0}.get(top[1], 2) if top[0] == "tests" else 1


# --- no mount left behind -------------------------------------------------------------------
# An id-mapped bind of a workspace (plugins/executor_proc/idmap.py) and the masks bound inside
# it are mounts in the host's mount namespace. One that outlives its engine stays until reboot:
# the tree cannot be removed ("Device or resource busy" from pytest's rm_rf of an old run, a
# session's workspace_removed false) and root keeps a writable view of it. Each file's mounts of
# its own temporary paths must be gone once its tests and fixtures end.

def _mounts_under(base: str) -> set[str]:
    """``mount point <- source`` of every mount in this namespace over or of a path in ``base``."""
    found = set()
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) > 4 and (fields[3].startswith(base) or fields[4].startswith(base)):
                found.add(f"{fields[4]} <- {fields[3]}")
    return found


_LEAK_WAIT_S = 15.0  # detaches run in a thread (idmap.IdMapped.close_later), servers exit
_module_mounts: dict[str, set[str]] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> object:
    path = str(item.path)
    if path not in _module_mounts:  # the file's first test: what was there before it
        base = str(item.config._tmp_path_factory.getbasetemp()) + "/"  # type: ignore[attr-defined]
        _module_mounts[path] = _mounts_under(base)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    result = yield  # the module's fixtures end here when ``nextitem`` is in another file
    if nextitem is not None and nextitem.path == item.path:
        return result
    before = _module_mounts.pop(str(item.path), set())
    base = str(item.config._tmp_path_factory.getbasetemp()) + "/"  # type: ignore[attr-defined]
    deadline = time.monotonic() + _LEAK_WAIT_S
    left = _mounts_under(base) - before
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _mounts_under(base) - before
    if left:
        raise AssertionError(
            f"{item.path.name} left {len(left)} mount(s) of its temporary paths in the host's "
            "mount namespace (an id-mapped bind or a mask never detached):\n"
            + "\n".join(sorted(left)[:20]))
    return result


@pytest.fixture(scope="module")
def bwrap_proc() -> Iterator[ProcExecutor]:
    """A default proc-bwrap executor for a module's calls, closed after it (the real sandbox:
    bwrap, the native launcher, per-exec cgroups)."""
    from plugins.executor_proc.executor import ProcExecutor, ProcOptions

    ex = ProcExecutor("bwrap", ProcOptions())
    assert ex.available() is True, ex.unavailable_reason
    yield ex
    ex.close()
