"""`policy-engine fmt`: the canonical layout of `.sbpolicy` files, comments kept, checked sound."""

from __future__ import annotations

from policy_engine.fmt.printer import format_ast

__all__ = ["format_ast"]
