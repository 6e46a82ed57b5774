"""Regenerate docs/openapi.json from the service (tests/unit/test_service_openapi.py checks it)."""

from __future__ import annotations

from pathlib import Path

from policy_engine.service.openapi import render

if __name__ == "__main__":
    out = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"
    out.write_text(render(), encoding="utf-8")
    print(f"wrote {out}")
