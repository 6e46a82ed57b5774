"""Setters for model instances the engine fills itself, without pydantic's per-field loop.

A per-call profile (``profile.shape``) and a guard's deny or restamped allow are built from
values the engine produced or already validated: ``Cls.__new__`` and a filled ``__dict__``, then
these three slots. The slots' own setters cost less than ``object.__setattr__`` looking each
name up, on every new grant and every decision.
"""

from __future__ import annotations

from pydantic import BaseModel

SET_FIELDS_SET = BaseModel.__dict__["__pydantic_fields_set__"].__set__
SET_EXTRA = BaseModel.__dict__["__pydantic_extra__"].__set__
SET_PRIVATE = BaseModel.__dict__["__pydantic_private__"].__set__
SET_DICT = BaseModel.__dict__["__dict__"].__set__  # the whole ``__dict__`` at once
