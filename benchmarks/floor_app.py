"""The framework floor: a bare FastAPI app that parses a JSON body and answers a small object.

``bench_floor.py`` measures the service's server CPU per request against this app's, in the same
run, on the same uvicorn and listener (``TCP_NODELAY`` on): what HTTP, FastAPI and JSON cost
before the engine does anything. Run as ``python3 benchmarks/floor_app.py`` (prints
``listening on http://127.0.0.1:PORT`` on stderr, serves until killed).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from policy_engine.service.listen import tcp_listener  # noqa: E402


def floor_app() -> FastAPI:
    """One route, ``POST /floor``: the body parsed as a JSON object, a 3-key answer."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.post("/floor")
    async def floor(body: dict[str, Any] = Body()) -> JSONResponse:  # noqa: B008 - FastAPI
        return JSONResponse({"decision": "allow", "code": None, "keys": len(body)})

    return app


def main() -> None:
    sock = tcp_listener("127.0.0.1", 0)
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn.Config(floor_app(), log_level="warning", access_log=False,
                                  lifespan="off")).run(sockets=[sock])


if __name__ == "__main__":
    main()
