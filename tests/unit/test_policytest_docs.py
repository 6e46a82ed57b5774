"""Every YAML example in docs/policy-tests.md is a valid test file whose cases pass."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from policy_engine.policytest import load_test_file, run_tests

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "policy-tests.md"
BLOCKS = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_doc_has_yaml_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_yaml_block_loads_and_passes(index: int, tmp_path: Path) -> None:
    # the examples' paths are relative to examples/policies, where org.sbtest.yaml lives
    shutil.copytree(ROOT / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("workspace", "run", "*.sbtest.*"))
    path = tmp_path / "examples" / "policies" / f"doc-{index}.sbtest.yaml"
    path.write_text(BLOCKS[index])
    tf = load_test_file(str(path))
    assert tf.cases
    run = run_tests([str(path)], jobs=1)
    failed = [(c.name, c.status, c.actual) for f in run.files for c in f.cases
              if c.status != "passed"]
    assert failed == []
    assert not run.all_diagnostics
