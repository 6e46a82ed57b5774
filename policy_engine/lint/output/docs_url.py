"""Where SARIF help links point: the docs of the policy-engine that is installed, never a guess.

`docs/lint-rules.md` and `docs/error-codes.md` are part of the project's source. A help link
must reach the copy matching the installed version, so the base comes from, in order:

1. ``POLICY_ENGINE_DOCS_URL`` (e.g. ``https://git.example.com/sec/policy-engine/blob/v0.1.0/docs/``
   or an internal docs site serving `docs/`);
2. the repository and commit pip recorded when the engine was installed from a git URL
   (PEP 610 ``direct_url.json``: ``pip install "policy-engine @ git+https://HOST/ORG/REPO@TAG"``),
   as ``https://HOST/ORG/REPO/blob/COMMIT/docs/`` (``/-/blob/`` on GitLab);
3. nothing: the SARIF then carries no ``helpUri`` (each rule's full help text is embedded, so
   code scanning still shows the rationale, the fix and an example).
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from urllib.parse import urlsplit

ENV_DOCS_URL = "POLICY_ENGINE_DOCS_URL"
DISTRIBUTION = "policy-engine"


def docs_base() -> str | None:
    """The URL of the installed version's `docs/` directory (ending in ``/``), if known."""
    explicit = os.environ.get(ENV_DOCS_URL, "").strip()
    if explicit:
        return explicit.rstrip("/") + "/"
    try:
        recorded = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    return from_direct_url(recorded) if recorded else None


def from_direct_url(text: str) -> str | None:
    """The docs base of a PEP 610 record of a git install over https, else ``None``."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    vcs = data.get("vcs_info") if isinstance(data, dict) else None
    url = data.get("url") if isinstance(data, dict) else None
    if not isinstance(vcs, dict) or vcs.get("vcs") != "git" or not isinstance(url, str):
        return None
    parts = urlsplit(url)
    commit = vcs.get("commit_id") or vcs.get("requested_revision")
    if parts.scheme != "https" or not parts.netloc or not isinstance(commit, str):
        return None
    repo = f"https://{parts.hostname}{parts.path}".removesuffix("/").removesuffix(".git")
    blob = "/-/blob/" if "gitlab" in (parts.hostname or "") else "/blob/"
    return f"{repo}{blob}{commit}/docs/"


def doc_link(page: str, anchor: str | None = None) -> str | None:
    """``page`` (``lint-rules.md``) under the docs base, with ``#anchor``; ``None`` if unknown."""
    base = docs_base()
    if base is None:
        return None
    return base + page + (f"#{anchor}" if anchor else "")
