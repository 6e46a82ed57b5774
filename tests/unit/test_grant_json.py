"""A grant rendered once per call (``model/grant_json.py``): the replay block's grant parsed
from the JSON the profile cache keyed its call level by is the grant's ``model_dump`` to the
value, type, member order and rendered byte, for every field a grant can hold."""

from __future__ import annotations

import random
from typing import Any

import pytest

from policy_engine.model import Grant
from policy_engine.model.evidence import _free
from policy_engine.model.grant_json import grant_dump, grant_json

NAMES = ["c-1", 'quo"te\\back', "tab\there\nnew", "é ü 名前 🙂", "ctl\x01\x1f\x7f", "\u2028"]
FLOATS = [0.01, 0.1, 1 / 3, 1.0, 2.5, 123456.789, 1e15, 1e16, 1e300, 0.30000000000000004]


def grant_of(rng: random.Random) -> Grant:
    data: dict[str, Any] = {
        "tenant": rng.choice(NAMES), "subject_id": rng.choice(NAMES),
        "tool_name": rng.choice(NAMES), "call_id": rng.choice(NAMES),
        "expires_at": rng.choice([0, 4102444800000, 2**62]),
        "capabilities": [{"kind": "fs.read", "paths": [f"/w/{rng.choice(NAMES)}/**"]},
                         {"kind": "net.http", "methods": ["GET"],
                          "hosts": ["example.com"]}][:rng.randint(0, 2)],
        "decision_key_fingerprint": rng.choice(["", "fp-1"]),
    }
    if rng.random() < 0.5:
        data["budget"] = {"calls": rng.choice([0, 3, 2**62]), "bytes_in": 10}
    if rng.random() < 0.7:
        data["limits"] = {"cpu_cores": rng.choice(FLOATS), "timeout_ms": 1000,
                          "max_bytes_in": rng.choice([1, 2**40])}
    if rng.random() < 0.3:
        data["consent"] = {"granted_by": rng.choice(NAMES), "granted_at": 1, "expires_at": 2,
                           "scope": rng.choice([None, "op"])}
    return Grant.model_validate(data)


@pytest.mark.parametrize("seed", range(40))
def test_the_parsed_json_is_the_dump(seed: int) -> None:
    grant = grant_of(random.Random(seed))
    dumped = grant.model_dump(mode="json", exclude_none=True)
    assert grant_dump(grant) == dumped  # never rendered yet: dumped
    assert grant_json(grant) == grant.__pydantic_serializer__.to_json(grant, exclude_none=True)
    parsed = grant_dump(grant)  # rendered now: parsed from the kept text
    assert parsed == dumped
    assert list(parsed) == list(dumped)

    def types(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: types(v) for k, v in value.items()}
        if isinstance(value, list):
            return [types(v) for v in value]
        return type(value)

    assert types(parsed) == types(dumped)
    assert _free({"grant": parsed}) == _free({"grant": dumped})


def test_a_kept_text_answers_only_for_its_own_grant() -> None:
    first = grant_of(random.Random(1))
    text = grant_json(first)
    other = first.model_copy(update={"call_id": "another"})
    assert grant_json(other) != text
    assert grant_dump(other)["call_id"] == "another"
    assert grant_json(first) is text  # rendered once per object


def test_a_kept_text_keeps_no_grant_alive() -> None:
    import gc
    import weakref

    grant = grant_of(random.Random(2))
    grant_json(grant)
    ref = weakref.ref(grant)
    del grant
    gc.collect()
    assert ref() is None
