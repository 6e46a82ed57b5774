"""`GET /skills` and `POST /skills/{skill_id}/invoke`: skills over HTTP (seed 002 §7)."""

# no `from __future__ import annotations`: FastAPI reads the dependency types handed to
# `register` from the route signatures, which must be real objects, not strings

import copy
import re
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Path
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from policy_engine.errors import PolicyEngineError
from policy_engine.gateway import skills as skill_calls
from policy_engine.gateway.session_skills import SessionSkills
from policy_engine.refusal import PolicyRefusal
from policy_engine.service.errors import ServiceError, from_engine, service_error
from policy_engine.service.models import ErrorBody, ErrorDetail, RefusalBody
from policy_engine.service.session_routes import SESSION_ID
from policy_engine.skills.invoke import InputError, InvokeResult, SkillInvoker
from policy_engine.skills.model import Skill

SKILL_ID = r"^[a-z0-9]+(\.[a-z0-9]+)+$"


class InvokeBody(BaseModel):
    """The skill's inputs, checked against its `interface.inputs` JSON Schema."""

    model_config = ConfigDict(extra="forbid")

    inputs: dict[str, Any] = Field(default_factory=dict)


class SkillInfo(BaseModel):
    id: str
    tool: str = Field(description="the MCP tool name, `skill.<id>`")
    name: str
    version: str
    description: str
    runtime: str
    side_effects: list[str]
    annotations: dict[str, bool]
    inputs: dict[str, Any]
    outputs: dict[str, Any]


class SkillList(BaseModel):
    skills: list[SkillInfo]


def skill_info(skill: Skill) -> SkillInfo:
    return SkillInfo(id=skill.id, tool=skill.tool_name, name=str(skill.doc["name"]),
                     version=str(skill.doc["version"]),
                     description=str(skill.doc["description"]), runtime=skill.kind,
                     side_effects=[str(e) for e in skill.side_effects()],
                     annotations=skill.annotations(), inputs=skill.inputs_schema,
                     outputs=skill.outputs_schema)


class SkillRefused(BaseModel):
    """A skill invocation the engine refused after its op existed: the result document with
    ``ok: false``, its ``error`` and the one ``refusal``, answered with the code's status."""

    model_config = ConfigDict(extra="forbid")

    skill: str
    ok: bool
    output: dict[str, Any]
    envelope_id: str | None
    error: ErrorDetail
    refusal: RefusalBody | None = None


# a refusal answers either document: the service's error body (before the op: unknown skill,
# bad inputs) or the refused result (schemathesis ST108, fuzz round 2: the `skill`, `ok` and
# `output` of a 403/422 result broke ErrorBody's `additionalProperties: false`)
_REFUSALS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody | SkillRefused}
    for status in (400, 403, 404, 409, 413, 422, 429, 500, 503, 504)}

_RESULT = {"content": {"application/json": {"schema": {"type": "object"}}},
           "description": "`{skill, ok, output, envelope_id}`; a refusal adds `error` and "
           "`refusal` (the one refusal document) and answers its code's HTTP status"}


_TEMPLATE = "/skills/{skill_id}/invoke"


def document_skills(doc: dict[str, Any], skills: dict[str, Skill]) -> dict[str, Any]:
    """The served OpenAPI document with one ``POST /skills/<id>/invoke`` per served skill,
    its body's ``inputs`` being that skill's own input schema (required), in place of the
    generic template. The template's body cannot say which inputs a skill requires, so a
    body it called valid (``{}`` to ``docs.browse``) was refused with 422 (schemathesis
    ST202, fuzz round 2); ids not served are 404 and left out. The committed document
    (docs/openapi.json, no skills) keeps the template."""
    paths = doc.get("paths", {})
    template = paths.get(_TEMPLATE)
    if not skills or not isinstance(template, dict) or "post" not in template:
        return doc
    out = dict(paths)
    del out[_TEMPLATE]
    for skill_id in sorted(skills):
        skill = skills[skill_id]
        op = copy.deepcopy(template["post"])
        op["parameters"] = [p for p in op.get("parameters", []) if p.get("name") != "skill_id"]
        op["operationId"] = f"invoke_skill_{re.sub(r'[^a-z0-9]', '_', skill_id)}"
        op["summary"] = f"Invoke {skill_id}"
        inputs = copy.deepcopy(skill.inputs_schema)
        body: dict[str, Any] = {"type": "object", "additionalProperties": False,
                                "properties": {"inputs": inputs},
                                "title": f"InvokeBody {skill_id}"}
        if inputs.get("required"):  # an absent `inputs` is `{}`, which lacks them
            body["required"] = ["inputs"]
        op["requestBody"] = {"required": True,
                             "content": {"application/json": {"schema": body}}}
        out[f"/skills/{skill_id}/invoke"] = {"post": op}
    return {**doc, "paths": out}


def register(app: FastAPI, who: Any, invoker_of: Any, gateway_of: Any,
             sessions_of: Any) -> None:
    """Add the skill routes; ``who`` is the authenticated-principal dependency type,
    ``invoker_of`` the one giving the engine's ``SkillInvoker`` (or None), ``gateway_of``
    the engine's gateway (every invocation runs through it) and ``sessions_of`` its
    session runtime (a skill invoked in a session)."""

    @app.get("/skills", tags=["skills"], response_model=SkillList)
    def list_skills(_: who, invoker: invoker_of) -> SkillList:
        """The skills this service offers (the same as the MCP server's `skill.<id>` tools)."""
        skills = invoker.skills.values() if invoker is not None else ()
        return SkillList(skills=[skill_info(s) for s in skills])

    @app.post("/skills/{skill_id}/invoke", tags=["skills"],
              responses={200: _RESULT, **_REFUSALS})
    def invoke_skill(skill_id: Annotated[str, Path(pattern=SKILL_ID, max_length=64)],
                     body: InvokeBody, principal: who,
                     invoker: invoker_of, gateway: gateway_of) -> JSONResponse:
        """Invoke a skill: its inputs are checked against its schema (`422` with the JSON
        pointer of the first problem), then it runs as one guarded op with evidence."""
        skill = invoker.skills.get(skill_id) if invoker is not None else None
        if skill is None:
            raise service_error("SERVICE.NOT_FOUND", f"no skill `{skill_id}`")
        run: SkillInvoker = invoker
        return _answer(lambda: skill_calls.invoke_skill(
            gateway, run, skill, body.inputs, tenant=principal.tenant,
            subject=principal.subject))

    @app.post("/v1/sessions/{session_id}/skills/{skill_id}/invoke", tags=["sessions"],
              responses={200: _RESULT, **_REFUSALS})
    def invoke_session_skill(
            session_id: Annotated[str, Path(pattern=SESSION_ID)],
            skill_id: Annotated[str, Path(pattern=SKILL_ID, max_length=64)],
            body: InvokeBody, principal: who, invoker: invoker_of,
            sessions: sessions_of) -> JSONResponse:
        """Invoke a skill in the session (docs/sessions.md "Skills in a session"): its `work/`
        is the session's workspace, the policy's `$SESSION` resolves as for the session's
        other calls, a container skill runs in a docker session's own container; one
        guarded op with its own decision and evidence. `404` for an unknown or another
        owner's session and for an unknown skill."""
        if invoker is None:
            raise service_error("SERVICE.NOT_FOUND", f"no skill `{skill_id}`")
        in_session = SessionSkills(sessions, invoker)
        return _answer(lambda: in_session.invoke(principal.tenant, principal.subject,
                                                 session_id, skill_id, body.inputs))


def _answer(invoke: Callable[[], InvokeResult]) -> JSONResponse:
    """Run one invocation and render it: the result (its code's status when refused), a
    `422` naming the input's JSON pointer, or the one refusal shape."""
    try:
        result = invoke()
    except InputError as exc:
        pointer = f"/inputs{exc.pointer}"
        err = ServiceError("SCHEMA.VALIDATION_FAILED", 422,
                           f"invalid input at `{pointer}`: {exc.message}", location=pointer)
        data = err.body()
        data["error"]["pointer"] = pointer
        data["envelope_id"] = data["refusal"]["envelope_id"] = exc.envelope_id
        return JSONResponse(data, status_code=422)
    except PolicyRefusal:
        raise  # the app's handler renders it
    except PolicyEngineError as exc:  # refused before an op existed (e.g. its image)
        raise from_engine(exc, "manifest") from None
    return JSONResponse(result.to_json(), status_code=result.http_status)
