"""The artifacts directory the engine names to every process it runs (``PE_ARTIFACTS_DIR``).

The engine's own variable, like ``PATH`` and ``HOME``: set by the executor after the caller's
environment (a caller's value is replaced), derived only from decided fields of the op, shown
by the dry run (``plugins/executor_proc/spec.artifacts_note``). It names a directory and grants
nothing: the sandbox's binds still decide what the process can write there. Docker's project
calls get their per-exec directory (``/workspace/artifacts``, collected into the result's
manifest); every other call, a session's included, gets ``<cwd>/artifacts``: in a session that
is ``artifacts/`` of its workspace, which the files API lists and downloads
(docs/sessions.md). The engine does not create it there: the code that writes artifacts makes
it (``os.makedirs(os.environ["PE_ARTIFACTS_DIR"], exist_ok=True)``).
"""

from __future__ import annotations

import posixpath

ARTIFACTS_ENV = "PE_ARTIFACTS_DIR"


def artifacts_dir(cwd: str) -> str:
    """A call's artifacts directory beneath its (normalized, absolute) working directory."""
    return posixpath.join(posixpath.normpath(cwd), "artifacts")
