"""The `.sbpolicy` compiler: files in, a PolicySet (or every diagnostic) out."""

from policy_engine.compiler.pipeline import STAGES, check_files, compile_files

__all__ = ["STAGES", "check_files", "compile_files"]
