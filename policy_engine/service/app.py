"""The ASGI application: every route parses, authenticates, calls the library and renders."""


import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path as FsPath  # fastapi's `Path` declares path parameters
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp

from policy_engine import __version__
from policy_engine.confirm.broker import ConsentBroker
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.explain import ExplainRequest
from policy_engine.gateway.call import Call, Gateway
from policy_engine.gateway.session_runtime import Sessions
from policy_engine.gateway.sessions import SandboxManager
from policy_engine.model import Manifest, OpKind
from policy_engine.orchestrator import Orchestrator
from policy_engine.refusal import PolicyRefusal
from policy_engine.rollout.reload import PolicyReloader
from policy_engine.runcode.manager import OrchestratorPool
from policy_engine.service.config import ServiceConfig
from policy_engine.service.decide_answer import View, answer
from policy_engine.service.errors import (
    ServiceError,
    crash_response,
    error_response,
    refused_response,
    service_error,
)
from policy_engine.service.execs import ExecRunner
from policy_engine.service.execstore import ExecStore
from policy_engine.service.fastpath import FastPath, FastRoutes
from policy_engine.service.guards import (
    ADMITTED,
    AdmitFirst,
    BodyLimit,
    ExactRequest,
    authenticate,
    charge_rate,
)
from policy_engine.service.health import health_report
from policy_engine.service.metrics import ServiceMetrics, instrument
from policy_engine.service.models import (
    EXEC_ID,
    ArtifactList,
    CallBody,
    DecideBody,
    ErrorBody,
    ExecBody,
    ExecList,
    ExecRecord,
    Health,
    RunCodeBody,
    RunCodeResponse,
)
from policy_engine.service.outcome_models import DECIDE_RESPONSES, OP_RESPONSES
from policy_engine.service.pg_sessions import open_session_store
from policy_engine.service.pg_stores import open_exec_store, open_token_store, service_dsn
from policy_engine.service.session_routes import register as register_session_routes
from policy_engine.service.skill_routes import document_skills
from policy_engine.service.skill_routes import register as register_skill_routes
from policy_engine.service.workspace import open_artifact
from policy_engine.skills.invoke import SkillInvoker
from policy_engine.tokens import Principal, TokenStore

# context keys the guard takes from the caller over its own views: the service sets them
_RESERVED_CONTEXT = ("grant", "manifest", "tenant", "subject")
_UNREADABLE = ("body: not JSON this service reads (UTF-8 text, at most ~1000 levels of "
               "nesting, integers of at most 4300 digits)")
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody} for status in (400, 401, 403, 404, 409, 413, 422, 429, 500, 503)}


@dataclass
class Engine:
    """What the routes share: the library objects and the service's stores."""

    config: ServiceConfig
    orch: Orchestrator
    tokens: TokenStore
    execs: ExecStore
    runner: ExecRunner
    gateway: Gateway
    pool: OrchestratorPool
    skills: SkillInvoker | None = None
    reloader: PolicyReloader | None = None
    sessions: Sessions | None = None

    def close(self) -> None:
        if self.reloader is not None:
            self.reloader.stop()
        if self.sessions is not None:
            self.sessions.close()
        self.pool.close()
        self.execs.close()
        self.tokens.close()
        self.orch.close()


def open_engine(config: ServiceConfig) -> Engine:
    state = config.engine.state_dir
    orch = Orchestrator(config.policyset, config=config.engine)
    # PostgreSQL when `options.service_postgres.dsn` is set (replicas share them), else SQLite
    tokens, execs = open_token_store(config.engine), open_exec_store(config.engine)
    gateway = Gateway(orch, ConsentBroker(config.confirmation, state / "consent.jsonl"))
    # the pinned orchestrators (run_code, docker skills) share the engine's policy holder: one
    # swap of `orch` (the reloader's) reloads every orchestrator
    pool = OrchestratorPool(config.policyset, config.engine, holder=orch.holder)
    fs_root = (config.op_settings.root_fs if config.op_settings else None) or "/workspace"
    skills = SkillInvoker(config.skills, config.policyset, config.engine, fs_root=fs_root,
                          orchestrator=orch, pool=pool) if config.skills else None
    eng = Engine(config, orch, tokens, execs, ExecRunner(config, gateway, execs), gateway,
                 pool, skills, sessions=Sessions(pool, gateway, config=config.engine,
                                                 workspace_root=config.workspace_root,
                                                 default_mode=config.security_mode,
                                                 store=open_session_store(config.engine)))
    if config.reload_interval_s > 0 and config.policy_files:
        eng.reloader = PolicyReloader(orch, config.policy_files)
        eng.reloader.start(config.reload_interval_s)
    return eng


def _require_discriminators(doc: dict[str, Any]) -> dict[str, Any]:
    """Mark each discriminated union's tag as required in its member schemas: the engine's
    models give ``kind`` a default, but a body without it cannot be told apart (422)."""
    schemas = doc.get("components", {}).get("schemas", {})

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            disc = node.get("discriminator")
            if isinstance(disc, dict):
                for ref in disc.get("mapping", {}).values():
                    target = schemas.get(str(ref).rsplit("/", 1)[-1])
                    if target is not None:
                        required = target.setdefault("required", [])
                        if disc["propertyName"] not in required:
                            required.insert(0, disc["propertyName"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    return doc


_EXPLAIN = ("`compact` (default): decision, code, reason, rule, effective limits and the "
            "envelope; `full`: the whole `explain --format json` document (trace, profile)")


def create_app(config: ServiceConfig, opened: Engine | None = None) -> FastAPI:
    """The service over ``config``; stores and the orchestrator open at start-up (or were
    opened by the caller, ``opened``, so a bad configuration is refused before listening)."""
    engine_box: list[Engine] = []

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine_box.append(opened if opened is not None else open_engine(config))
        try:
            yield
        finally:
            engine_box.pop().close()

    # no /docs or /redoc: they load scripts from a CDN; /openapi.json is served (no token).
    # No slash redirects: `/v1/decide/` is an unknown endpoint (404), not a 307 to the
    # client's own `Host` header (outsider round 4 F05)
    app = FastAPI(title="policy-engine service", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, redirect_slashes=False,
                  description="Decide and run AI agents' tool calls under policy "
                  "(docs/service.md).", responses=_ERRORS)
    bearer = HTTPBearer(auto_error=False, description="a token from `policy-engine tokens add`")
    if config.console:
        from policy_engine.service.console_mount import mount_console

        mount_console(app, config, lambda: engine_box[0])

    # dependencies and the decide route are coroutines: each is a few SQLite reads or a pure
    # decision (well under a millisecond), cheaper inline than through the thread pool
    async def engine() -> Engine:
        return engine_box[0]

    async def principal(request: Request,
                  _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
                  ) -> Principal:
        admitted = request.scope.get(ADMITTED)
        if isinstance(admitted, Principal):  # the decide fast path admitted and charged it
            return admitted
        return await admission(request.headers.get("authorization"))

    async def admission(header: str | None) -> Principal:
        if networked:  # a network round trip (or its timeout) must not stall the event loop
            return await run_in_threadpool(admit, engine_box[0], header)
        return admit(engine_box[0], header)

    def admit(eng: Engine, header: str | None) -> Principal:
        who = authenticate(eng.tokens, header)
        charge_rate(eng.orch.meter, who.tenant, config.rate_per_minute)
        return who

    # tokens in PostgreSQL or a meter over the network (Redis): admission leaves the loop
    networked = service_dsn(config.engine) is not None or config.engine.budget_meter not in (
        "sqlite", "memory")

    Who = Annotated[Principal, Depends(principal)]
    Eng = Annotated[Engine, Depends(engine)]
    ExecId = Annotated[str, Path(pattern=EXEC_ID, description="32 hex digits")]

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(PolicyRefusal)
    async def _refused(_: Request, exc: PolicyRefusal) -> JSONResponse:
        return refused_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # locations and messages only: pydantic's `input` would echo the body (secrets too)
        where = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
                          for e in exc.errors()[:5])
        err = PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED, where[:1000])
        view = err.public_view()
        first = exc.errors()[0].get("loc", ()) if exc.errors() else ()
        location = "/".join(str(p) for p in first) or None
        # a bad path parameter is a bad request (400), not a bad body
        if all(e.get("loc", ("",))[0] in ("path", "query") for e in exc.errors()):
            bad = service_error("SERVICE.BAD_REQUEST", where[:1000])
            bad.location = location
            return error_response(bad)
        return error_response(ServiceError(view["code"], view["http_status"],
                                           view["message"], location=location))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 405:  # `Allow`: every method of every route of this path
            allowed: set[str] = set()
            for route in app.routes:
                if isinstance(route, APIRoute) and route.path_regex.match(request.url.path):
                    allowed |= route.methods or set()
            return error_response(service_error(
                "SERVICE.METHOD_NOT_ALLOWED", "see /openapi.json"),
                {"Allow": ", ".join(sorted(allowed))})
        if exc.status_code == 400:  # FastAPI: a body json.loads refused but not for syntax
            err = PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED, _UNREADABLE)
            view = err.public_view()
            return error_response(ServiceError(view["code"], view["http_status"],
                                               view["message"], location="body"))
        if exc.status_code != 404:  # no other is raised today; never "no such endpoint"
            return error_response(service_error("SERVICE.BAD_REQUEST", str(exc.detail)[:200]))
        return error_response(service_error("SERVICE.NOT_FOUND", "no such endpoint"))

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> JSONResponse:
        return crash_response(exc)  # the stack goes to the log only

    def manifest_of(body: CallBody) -> Manifest:
        if isinstance(body.manifest, Manifest):
            if not config.allow_inline_manifests:
                raise ServiceError("SANDBOX.PERMISSION_DENY", 403, "permission denied: this "
                                   "service takes manifests by name only (`--manifest`); "
                                   "inline manifests need `--allow-inline-manifests`",
                                   refused_by="manifest", location="manifest")
            return body.manifest
        found = config.manifests.get(body.manifest)
        if found is None:
            missing = service_error("SERVICE.NOT_FOUND", f"no manifest named `{body.manifest}`")
            missing.location = "manifest"
            raise missing
        return found

    def check_call(who: Principal, body: CallBody) -> dict[str, Any]:
        if (body.grant.tenant, body.grant.subject_id) != (who.tenant, who.subject):
            raise ServiceError("SANDBOX.PERMISSION_DENY", 403, "permission denied: the grant "
                               "is for another tenant or subject than the token",
                               refused_by="grant", location="grant")
        if body.grant.consent is not None:  # consent comes from a human, never the caller
            raise ServiceError("SANDBOX.PERMISSION_DENY", 403, "permission denied: a grant "
                               "sent to the service cannot carry consent; the confirmation "
                               "service asks for it", refused_by="grant",
                               location="grant/consent")
        reserved = [k for k in _RESERVED_CONTEXT if k in body.context]
        if reserved:
            raise ServiceError("SCHEMA.VALIDATION_FAILED", 422, f"invalid input: context."
                               f"{reserved[0]} is set by the service from the token",
                               location=f"context/{reserved[0]}")
        return dict(body.context)

    def decision(body: DecideBody, who: Principal, view: View = "compact") -> dict[str, Any]:
        context = check_call(who, body)
        request = ExplainRequest(op=body.op, now_ms=body.now_ms, overrides=body.overrides,
                                 settings=config.op_settings, context=context,
                                 budget_used=body.budget_used)
        # the gateway's dry run: the running engine's own builder and guard, and the backend
        # step `/v1/ops` makes, so it answers a backend's refusal too (outsider round 5 F08);
        # traced only for the full explain document
        return answer(engine_box[0].gateway.decide(manifest_of(body), body.grant, request,
                                                   trace=view == "full"), view)

    @app.post("/v1/decide", tags=["decisions"], responses=DECIDE_RESPONSES)
    async def decide(body: DecideBody, who: Who,
                     explain: Annotated[View, Query(description=_EXPLAIN)] = "compact"
                     ) -> JSONResponse:
        """Decide one op without running it: the compact answer, or with `explain=full` the
        `explain --format json` document (docs/service.md, "Decide")."""
        # rendered directly: FastAPI's generic encoder costs ~8x the decision itself
        return JSONResponse(decision(body, who, explain))

    def run_call(body: CallBody, who: Principal, on_caller: str | None = None) -> Response:
        context = check_call(who, body)
        called = engine_box[0].gateway.run(Call(
            body.grant, manifest_of(body), body.op, settings=config.op_settings,
            overrides=body.overrides, context=context, identity=(who.tenant, who.subject),
            on_caller=on_caller))
        r = called.refusal
        if r is None:
            return Response(called.to_json_bytes(), media_type="application/json")
        return Response(called.to_json_bytes(error={
            "code": r.code, "http_status": r.http_status, "retryable": r.retryable,
            "message": r.message}), status_code=r.http_status, media_type="application/json")

    root_fs = config.op_settings.root_fs if config.op_settings else None

    def on_loop(body: CallBody) -> bool:
        # a network round trip (tokens, meter) or a call that could wait (consent, a backend
        # without its own deadline, a remote file system) goes to the thread pool
        return root_fs is not None and not networked and \
            engine_box[0].gateway.runs_on_caller(OpKind(body.op.kind), root_fs, body.op)

    def run_on_loop(body: CallBody, who: Principal) -> Response:
        # ``on_loop`` said yes just now: the run does not ask the mount table again
        return run_call(body, who, root_fs)

    # the ordinary decide and ops calls skip FastAPI's per-request machinery (fastpath.py)
    app.state.fast_routes = FastRoutes(admit=admission, decide=decision, run=run_call,
                                       on_loop=on_loop, run_on_loop=run_on_loop)

    @app.post("/v1/ops", tags=["decisions"], responses=OP_RESPONSES)
    def run_op(body: CallBody, who: Who) -> Response:
        """Run one op through the orchestrator (with begin/end evidence). A refusal or failure
        answers its code's HTTP status with `error` beside the outcome."""
        return run_call(body, who)

    @app.post("/v1/run_code", tags=["decisions"], response_model=RunCodeResponse)
    def run_code(body: RunCodeBody, who: Who, eng: Eng) -> RunCodeResponse:
        """Run code for a session (seed 001 run_code): the risk hint and the security mode
        choose bubblewrap or a container; the policy decides the run. `200` with `success`
        false and `error_code` when it was refused or failed."""
        manager = SandboxManager(body.session_id, policyset=eng.orch.policyset,
                                 config=config.engine, security_mode=config.security_mode,
                                 tenant=who.tenant, subject=who.subject,
                                 workspace_root=config.workspace_root, pool=eng.pool,
                                 gateway=eng.gateway)
        with eng.runner.slots.hold():  # the same cap as execs (--max-concurrent-execs)
            result = manager.run_code(body.code, body.language, timeout=body.timeout_s)
        return RunCodeResponse.model_validate(result.to_json())

    @app.post("/sandbox/execs", tags=["sandbox"], response_model=ExecRecord)
    def create_exec(body: ExecBody, who: Who, eng: Eng) -> ExecRecord:
        """Run a shell or python exec in the caller's project workspace (seed 002 §5)."""
        return eng.runner.run(who, body)

    @app.get("/sandbox/execs", tags=["sandbox"], response_model=ExecList)
    def list_execs(who: Who, eng: Eng,
                   task_id: Annotated[str | None, Query(max_length=128)] = None) -> ExecList:
        """The caller's tenant's execs, newest first (at most 200)."""
        return ExecList(execs=eng.execs.list(who.tenant, task_id))

    @app.get("/sandbox/execs/{exec_id}", tags=["sandbox"], response_model=ExecRecord)
    def get_exec(exec_id: ExecId, who: Who, eng: Eng) -> ExecRecord:
        record = eng.execs.get(who.tenant, exec_id)
        if record is None:
            raise service_error("SERVICE.NOT_FOUND", "no such exec")
        return record

    @app.get("/sandbox/execs/{exec_id}/artifacts", tags=["sandbox"],
             response_model=ArtifactList)
    def list_artifacts(exec_id: ExecId, who: Who, eng: Eng) -> ArtifactList:
        record = eng.execs.get(who.tenant, exec_id)
        found = eng.execs.artifacts(who.tenant, exec_id)
        if record is None or found is None:
            raise service_error("SERVICE.NOT_FOUND", "no such exec")
        return ArtifactList(exec_id=exec_id, artifacts=found,
                            truncated=record.artifacts_truncated)

    @app.get("/sandbox/execs/{exec_id}/artifacts/{name:path}", tags=["sandbox"],
             response_class=StreamingResponse,
             responses={200: {"content": {"application/octet-stream": {}}}})
    def get_artifact(exec_id: ExecId, name: Annotated[str, Path(max_length=1024)],
                     who: Who, eng: Eng) -> Response:
        """One artifact's bytes; only files listed in the exec's manifest are served."""
        record = eng.execs.get(who.tenant, exec_id)
        listed = eng.execs.artifacts(who.tenant, exec_id) or []
        if record is None or name not in {a.path for a in listed}:
            raise service_error("SERVICE.NOT_FOUND", "no such artifact")
        fd = open_artifact(FsPath(record.artifacts_path), name)
        return StreamingResponse(_chunks(fd), media_type="application/octet-stream")

    async def skill_invoker(eng: Eng) -> SkillInvoker | None:
        return eng.skills

    async def gateway(eng: Eng) -> Gateway:
        return eng.gateway

    async def sessions(eng: Eng) -> Sessions:
        assert eng.sessions is not None
        return eng.sessions

    register_skill_routes(app, Who, Annotated[SkillInvoker | None, Depends(skill_invoker)],
                          Annotated[Gateway, Depends(gateway)],
                          Annotated[Sessions, Depends(sessions)])
    register_session_routes(app, Who, Annotated[Sessions, Depends(sessions)])

    @app.get("/sandbox/health", tags=["sandbox"], response_model=Health)
    def health(eng: Eng) -> Health:
        """Runtime mode, workspace root and writability, docker CLI and version (no token)."""
        return health_report(eng.config, eng.orch, eng.reloader)

    plain_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            # the skills this server serves, each with its own input schema
            app.openapi_schema = document_skills(_require_discriminators(plain_openapi()),
                                                 config.skills)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    # the token before the body, for every route that takes one (added last: every route is
    # registered by now)
    guarded = [route.path_regex for route in app.routes
               if isinstance(route, APIRoute) and _depends_on(route.dependant, principal)]
    app.add_middleware(AdmitFirst, guarded=guarded, admit=admission)
    return app


def _depends_on(dependant: Dependant, call: Any) -> bool:
    """Whether ``call`` is among the (transitive) dependencies of a route."""
    return any(dep.call is call or _depends_on(dep, call) for dep in dependant.dependencies)


def _chunks(fd: int) -> Iterator[bytes]:
    with os.fdopen(fd, "rb") as fh:
        yield from iter(lambda: fh.read(1 << 16), b"")


def asgi_app(config: ServiceConfig, opened: Engine | None = None, *,
             fast_decide: bool = True, metrics: ServiceMetrics | None = None) -> ASGIApp:
    """The application wrapped in the body-size limit behind the exact-request check (and,
    unless ``fast_decide`` is off, the fast path of `/v1/decide` and `/v1/ops` in front of
    both), counted and traced (metrics.py) outermost: what uvicorn serves."""
    app = create_app(config, opened)
    checked: ASGIApp = ExactRequest(BodyLimit(app, config.max_body_bytes))
    if fast_decide:  # outermost but the metrics: it makes the two checks itself (fastpath.py)
        checked = FastPath(checked, app.state.fast_routes, config.max_body_bytes)
    return instrument(checked, app, metrics)
