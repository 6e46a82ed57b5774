"""Setters for model instances the engine fills itself, without pydantic's per-field loop.

A per-call profile (``profile.shape``) and a guard's deny or restamped allow are built from
values the engine produced or already validated: ``Cls.__new__`` and a filled ``__dict__``, then
these three slots. The slots' own setters cost less than ``object.__setattr__`` looking each
name up, on every new grant and every decision.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

SET_FIELDS_SET = BaseModel.__dict__["__pydantic_fields_set__"].__set__
SET_EXTRA = BaseModel.__dict__["__pydantic_extra__"].__set__
SET_PRIVATE = BaseModel.__dict__["__pydantic_private__"].__set__
SET_DICT = BaseModel.__dict__["__dict__"].__set__  # the whole ``__dict__`` at once

_M = TypeVar("_M", bound=BaseModel)


def assembled(cls: type[_M], values: dict[str, Any], given: frozenset[str]) -> _M:
    """``cls.model_construct`` of ``values`` (every field, in the model's order) with
    ``given`` as the fields set: what ``cls(**{k: values[k] for k in given})`` builds when
    each value is already of its field's validated type (the caller's to ensure)."""
    obj = cls.__new__(cls)
    SET_DICT(obj, values)
    SET_FIELDS_SET(obj, set(given))
    SET_EXTRA(obj, None)
    SET_PRIVATE(obj, None)
    return obj
