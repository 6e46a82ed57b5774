"""Every `sbpolicy` example in docs/language.md and DESIGN.md-style policies compile cleanly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from policy_engine.compiler import check_files, compile_files

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"```sbpolicy\n(.*?)```", (ROOT / "docs" / "language.md").read_text(),
                    re.DOTALL)

DESIGN_SKETCH = """\
policy "acme/agents" version "1.4.0"

defaults {
  timeout 60s
  network off
  limits { bytes_in 10MiB  bytes_out 1MiB  files 100  depth 3  concurrency 4 }
}

forbid fs.read, fs.write  paths ["~/.ssh/**", "~/.aws/**", "**/.env", "/etc/shadow"]

permit fs.read   paths ["/workspace/**"]
permit fs.write  paths ["/workspace/work/**"]
  when `grant.subject_id.startsWith("agent:") && request.size <= 1048576`

permit net.http  hosts ["api.github.com"] schemes ["https"] ports [443] methods ["GET", "HEAD"]
  mime ["application/json"]

permit proc.exec tool "git" args ["status" | "log" | "diff" | /^--(oneline|stat)$/]
  limits { cpu 1  memory 512MiB  pids 64  timeout 30s }

require consent when `profile.safety == "High" || "Write" in profile.side_effects`

profile "safe-readonly" { network off  fs read-only }
"""


def test_docs_have_examples() -> None:
    assert len(BLOCKS) >= 10


@pytest.mark.parametrize("block", BLOCKS)
def test_docs_example_compiles(tmp_path: Path, block: str) -> None:
    p = tmp_path / "example.sbpolicy"
    p.write_text(block)
    assert check_files([p], home="/home/u") == []


def test_design_sketch_compiles_verbatim(tmp_path: Path) -> None:
    p = tmp_path / "design.sbpolicy"
    p.write_text(DESIGN_SKETCH)
    ps = compile_files([p], home="/home/u")
    assert ps.name == "acme/agents"
    assert len(ps.rules) == 6  # the built-in mandatory deny and the sketch's five rules
