"""`isolation gvisor` in a named profile: parsed by both readers, checked, formatted, compiled,
carried into the Profile and its hash, and required of the backend (never degraded)."""

from __future__ import annotations

from pathlib import Path

import pytest
from orchestrator_fixtures import ScriptedExecutor, profile

from policy_engine.compiler import compile_files
from policy_engine.compiler.builtins import BUILTIN_PROFILES
from policy_engine.config import EngineConfig
from policy_engine.dsl import fastparse, parser
from policy_engine.errors import ErrorCode
from policy_engine.fmt.printer import format_ast
from policy_engine.fmt.soundness import fingerprint
from policy_engine.model import (
    Grant,
    Isolation,
    Manifest,
    OpKind,
    ProcCapability,
)
from policy_engine.orchestration import required_capabilities, select
from policy_engine.profile import ProfileBuilder

PROFILE = """policy "t/iso" version "1.0.0"
profile "high-isolation" {
  network off
  fs read-only
  isolation gvisor
  timeout 10s
}
permit "py" proc.exec tool "python3"
"""
FULL = {"resource_limits": True, "env_filtering": True, "bind_mounts": True,
        "readonly_rootfs": True, "mandatory_denies": True}
PROC = frozenset({OpKind.PROC_EXEC})


def _compile(tmp_path: Path, text: str, name: str = "p.sbpolicy") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_both_readers_parse_it_to_the_same_setting(tmp_path: Path) -> None:
    path = _compile(tmp_path, PROFILE)
    fast = fastparse.parse_file(str(path))
    lark = parser.parse_file(str(path))
    assert fast == lark
    settings = fast[0].items[1].settings  # type: ignore[union-attr]
    iso = [s for s in settings if s.key == "isolation"]
    assert len(iso) == 1
    assert iso[0].value.value == "gvisor"
    assert (iso[0].span.line, iso[0].span.column) == (5, 3)


def test_it_compiles_into_the_named_profile_and_the_version_hash(tmp_path: Path) -> None:
    with_iso = compile_files([_compile(tmp_path, PROFILE)])
    assert with_iso.profiles["high-isolation"].isolation is Isolation.GVISOR
    without = compile_files([_compile(tmp_path, PROFILE.replace("  isolation gvisor\n", ""),
                                      "q.sbpolicy")])
    assert without.profiles["high-isolation"].isolation is None
    assert with_iso.version_hash != without.version_hash


def test_the_built_in_high_isolation_requires_nothing_more() -> None:
    """Opt-in (docs/language.md): requiring gVisor by default would refuse every call of the
    profile on proc-bwrap, the default backend, where runsc is not installed."""
    assert all(p.isolation is None for p in BUILTIN_PROFILES.values())


@pytest.mark.parametrize(("text", "message"), [
    ('profile "p" { isolation kata }', "SBP213 unknown isolation `kata`"),
    ('profile "p" { isolation gvisor isolation gvisor }', "SBP201 `isolation` is set twice"),
])
def test_bad_isolation_is_a_diagnostic_at_its_position(tmp_path: Path, text: str,
                                                       message: str) -> None:
    path = _compile(tmp_path, f'policy "t/bad" version "1.0.0"\n{text}\n')
    with pytest.raises(Exception) as err:  # noqa: PT011 -- DiagnosticsError, checked below
        compile_files([path])
    shown = str(err.value)
    assert message in shown
    assert f"{path}:2:" in shown


def test_fmt_keeps_it_and_the_soundness_check_sees_it(tmp_path: Path) -> None:
    messy = PROFILE.replace("  isolation gvisor", "isolation     gvisor")
    pf, diags = parser.parse_source(messy, "p.sbpolicy")
    assert diags == []
    out = format_ast(pf)
    assert "  isolation gvisor  " in out
    assert compile_files([_compile(tmp_path, out, "f.sbpolicy")]).profiles[
        "high-isolation"].isolation is Isolation.GVISOR
    a = compile_files([_compile(tmp_path, PROFILE)])
    b = compile_files([_compile(tmp_path, PROFILE.replace("  isolation gvisor\n", ""),
                                "r.sbpolicy")])
    assert fingerprint(a) != fingerprint(b)  # a formatter dropping it would be refused


def _build(tmp_path: Path, text: str) -> tuple[str, object]:
    ps = compile_files([_compile(tmp_path, text, f"{abs(hash(text))}.sbpolicy")])
    perms = (ProcCapability(kind="proc.exec", tool="python3"),)
    manifest = Manifest(name="py", version="1.0", permissions=perms, profile="high-isolation")
    grant = Grant(tenant="t", subject_id="a", tool_name="py", call_id="c",
                       capabilities=perms, expires_at=4102444800000)
    prof = ProfileBuilder(ps).build(grant, manifest)
    return prof.profile_hash, prof


def test_the_profile_carries_it_and_its_hash_depends_on_it(tmp_path: Path) -> None:
    h_iso, p_iso = _build(tmp_path, PROFILE)
    h_none, p_none = _build(tmp_path, PROFILE.replace("  isolation gvisor\n", ""))
    assert p_iso.isolation is Isolation.GVISOR  # type: ignore[attr-defined]
    assert p_iso.model_dump(mode="json")["isolation"] == "gvisor"  # type: ignore[attr-defined]
    # unset, the field is left out of the JSON: profiles that require nothing hash as before
    assert "isolation" not in p_none.model_dump(mode="json")  # type: ignore[attr-defined]
    assert h_iso != h_none


def test_a_backend_without_it_is_refused_in_strict_and_compat(tmp_path: Path) -> None:
    need = profile(name="high-isolation").model_copy(update={"isolation": Isolation.GVISOR})
    reqs = [r.capability for r in required_capabilities(need, OpKind.PROC_EXEC)]
    assert reqs[-1] == "isolation:gvisor"
    assert "isolation:gvisor" not in [
        r.capability for r in required_capabilities(need, OpKind.TMP_ALLOC)]
    plain = ScriptedExecutor("plain", kinds=PROC, caps=FULL)
    for mode in ("strict", "compat"):
        cfg = EngineConfig(state_dir=tmp_path, mode=mode,  # type: ignore[arg-type]
                           backends={OpKind.PROC_EXEC: "plain"})
        sel = select({"plain": plain}, cfg, need, OpKind.PROC_EXEC)
        assert sel.error is not None
        assert sel.error.code is ErrorCode.CAPABILITY_BLOCKED
        assert "cannot provide `isolation:gvisor`" in sel.error.reason
        assert "`high-isolation`" in sel.error.reason
        assert sel.error.audit["missing"] == ["isolation:gvisor"]  # type: ignore[index]
    # a local fallback is no way around it either
    local = ScriptedExecutor("local", kinds=PROC, caps=FULL, local=True)
    cfg = EngineConfig(state_dir=tmp_path, mode="compat", fallback_to_local=True)
    assert select({"local": local}, cfg, need, OpKind.PROC_EXEC).error is not None
    gv = ScriptedExecutor("gv", kinds=PROC, caps={**FULL, "isolation": frozenset(Isolation)})
    sel = select({"gv": gv}, EngineConfig(state_dir=tmp_path, backends={OpKind.PROC_EXEC: "gv"}),
                 need, OpKind.PROC_EXEC)
    assert (sel.error, sel.executor, sel.degraded) == (None, gv, ())
    assert gv.capabilities.to_json()["isolation"] == ["gvisor"]
    # ops that start no process are not concerned
    assert select({"t": ScriptedExecutor("t", kinds=frozenset({OpKind.TMP_ALLOC}))},
                  EngineConfig(state_dir=tmp_path, backends={OpKind.TMP_ALLOC: "t"}), need,
                  OpKind.TMP_ALLOC).error is None
