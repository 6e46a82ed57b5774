"""The compiler reads policies through the fast reader (dsl/fastparse.py); the Lark parser stays
the definition. Every policy in the repository, generated policies and broken inputs compile to
the same result with the same diagnostics either way."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

from policy_engine.compiler.context import CompileContext
from policy_engine.compiler.pipeline import STAGES, run_stages
from policy_engine.dsl import parser

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(p for p in ROOT.rglob("*.sbpolicy") if ".git" not in p.parts)


def _run(paths: list[str], reader: Any) -> CompileContext:
    """``run_stages`` with the file reader given (the stages themselves unchanged)."""
    if reader is None:
        return run_stages(paths, home="/home/agent")
    ctx = CompileContext(paths=tuple(paths), home="/home/agent", read_policy=reader)
    for _name, stage, needs_clean in STAGES:
        if needs_clean and ctx.has_errors:
            break
        stage(ctx)
    ctx.diagnostics.sort(key=lambda d: (d.span.file, d.span.line, d.span.column)
                         if d.span is not None else ("", 0, 0))
    return ctx


def _projection(paths: list[str], reader: Any = None) -> tuple[Any, ...]:
    ctx = _run(paths, reader)
    diags = list(ctx.diagnostics)
    ps = ctx.result
    if ps is None:
        return (None, diags)
    rules = [(r.id, r.effect, dict(r.capabilities), r.ref, r.span, r.limits, r.mandatory,
              r.condition.source if r.condition is not None else None) for r in ps.rules]
    return (ps.name, ps.version, ps.version_hash, ps.defaults, ps.network, ps.home,
            sorted(ps.profiles.items()), rules, diags,
            [(c.ref, c.condition.source if c.condition else None) for c in ps.consent_rules])


def _same(paths: list[str]) -> None:
    fast = _projection(paths)
    lark = _projection(paths, parser.parse_file)
    assert fast == lark


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_every_repository_policy_compiles_the_same(path: Path) -> None:
    _same([str(path)])


def test_generated_and_broken_policies_compile_the_same(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.scale_policy import scale_policy

    base = scale_policy(60).sbpolicy
    rng = random.Random(7)
    variants = [base, base.replace('"', "'", 1), base + "permit {\n", base.replace("]", "", 3),
                base + "\x00", base + 'permit "é" fs.read paths ["/ü/**"]\n',
                base.replace("fs.read", "fs.reed", 2), "", "policy", "# only a comment\n"]
    for _ in range(20):  # random truncations and deletions
        cut = rng.randrange(len(base))
        variants.append(base[:cut])
        variants.append(base[:cut] + base[cut + rng.randint(1, 40):])
    for i, text in enumerate(variants):
        path = tmp_path / f"v{i}.sbpolicy"
        path.write_text(text, encoding="utf-8")
        _same([str(path)])
