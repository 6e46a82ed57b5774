"""The service's OpenAPI 3.1 document, as committed in docs/openapi.json (a test checks drift)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from policy_engine.compiler import compile_files
from policy_engine.config import EngineConfig


def openapi_document() -> dict[str, Any]:
    """The document of the routes; it depends on no configuration value."""
    from policy_engine.service.app import create_app
    from policy_engine.service.config import ServiceConfig

    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "schema.sbpolicy"
        policy.write_text('policy "openapi/schema" version "1.0.0"\n', encoding="utf-8")
        config = ServiceConfig(policyset=compile_files([policy]),
                               engine=EngineConfig(state_dir=Path(tmp)),
                               workspace_root=Path(tmp) / "workspace")
        return create_app(config).openapi()


def render() -> str:
    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"
