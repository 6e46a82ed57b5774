"""Skills invoked in a session: the skill's one op runs in the session's directory, with the
policy's ``$SESSION`` resolved to the session's workspace and any process on the session's
backend, through the gateway like every other call of the session (docs/sessions.md).

A skill's ``work/`` is the session's workspace (the directory its run_code, execs and files
API see; ``work/artifacts/`` its artifacts), as ``/workspace/work`` is a container skill's
outside a session. The session's other directories (``inputs/``, ``artifacts/`` beside
``work/``) hold nothing and a policy granting ``$SESSION/**`` does not reach them. A container
skill (runtime ``docker``) runs only in a docker session, in the session's own container; a
proc-bwrap session refuses it (``refused_by: backend``): it never runs elsewhere than the
container it declares.
"""

from __future__ import annotations

from typing import Any

from policy_engine.errors import BackendRefusal, PolicyEngineError
from policy_engine.executor import CancelToken
from policy_engine.gateway.call import Call
from policy_engine.gateway.session_runtime import Sessions
from policy_engine.refusal import PolicyRefusal, code_refusal, engine_refusal
from policy_engine.skills.invoke import InvokeResult, SessionScope, SkillInvoker


class SessionSkills:
    """The skills of one engine (``invoker``), invoked in the sessions of ``sessions``."""

    def __init__(self, sessions: Sessions, invoker: SkillInvoker) -> None:
        self.sessions = sessions
        self.invoker = invoker

    def invoke(self, tenant: str, subject: str, session_id: str, skill_id: str, inputs: Any,
               *, cancel: CancelToken | None = None) -> InvokeResult:
        """Run skill ``skill_id`` in the caller's session: one guarded op (its own decision,
        consent, limits and evidence begin/end, annotated with the session and the skill).

        :raises PolicyRefusal: ``404`` for an unknown, ended or foreign session or an unknown
            skill (the one refusal shape); a skill no op could be built for (``manifest``, or
            ``backend`` for a container skill in a session without a container).
        :raises InputError: the inputs break the skill's ``interface.inputs`` (recorded).
        """
        info = self.sessions.get(tenant, subject, session_id)
        skill = self.invoker.skills.get(skill_id)
        if skill is None:
            raise PolicyRefusal(code_refusal("SERVICE.NOT_FOUND", 404,
                                             f"not found: no skill `{skill_id[:64]}`",
                                             "service", location="skill_id"))
        scope = SessionScope(info.session_id, str(self.sessions.workspace(info)), info.backend)
        try:
            prepared = self.invoker.prepare(skill, inputs, tenant=tenant, subject=subject,
                                            scope=scope)
        except PolicyEngineError as exc:  # no op to decide (recorded by prepare)
            raise PolicyRefusal(engine_refusal(
                exc, "backend" if isinstance(exc, BackendRefusal) else "manifest",
                envelope_id=getattr(exc, "envelope_id", None))) from None
        token = cancel or CancelToken()
        with self.sessions.tracked(info, token):  # a session's end cancels it
            called = self.sessions.gateway.run(
                Call(prepared.grant, prepared.manifest, prepared.op,
                     settings=prepared.settings, identity=(tenant, subject), cancel=token,
                     annotations={"session": info.session_id, "skill": skill.id}),
                # a process runs in the session's own container: the docker executor holding
                # it is the session runtime's (a file read or a fetch: the invoker's choice)
                orchestrator=self.sessions.pool.get(info.backend) if skill.kind == "docker"
                else prepared.orchestrator)
        return self.invoker.answer(skill, called.outcome,
                                   called.refusal.to_json() if called.refusal else None)
