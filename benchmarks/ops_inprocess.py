"""`/v1/ops` fs.read driven in-process: server CPU per call without the socket, for profiling.

Usage::

    python3 benchmarks/ops_inprocess.py                  # CPU per call: median, min, q1 chunk
    python3 benchmarks/ops_inprocess.py --profile 60     # cProfile, the 60 costliest (tottime)
    py-spy record -r 1000 -f raw -o ops.txt -- python3 benchmarks/ops_inprocess.py --calls 10000
    BENCH_ENGINE_PATH=/other/checkout python3 benchmarks/ops_inprocess.py   # "before"

``policy-engine serve`` starts as ``bench_floor.py`` starts it (the same policy, manifests,
state directory, four grants and rate limit), through the CLI's own code, with uvicorn's server
swapped for a loop that runs the lifespan and calls the built ASGI app: admission, the fast
path, ``Gateway.run``, the answer, no socket and no HTTP parsing (those are the floor's too).
CPU is the event-loop thread's (``time.thread_time``) over chunks of 250 calls after 300 to
warm up; the median chunk moves less with the machine's other work than the mean.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(os.environ.get("BENCH_ENGINE_PATH") or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(REPO))
os.chdir(REPO)

import uvicorn  # noqa: E402
from uvicorn.lifespan.on import LifespanOn  # noqa: E402

from tests.integration.service_server import POLICY, add_token, grant, manifest  # noqa: E402

CHUNK, WARM = 250, 300


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="cProfile the calls and print the N costliest functions")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pe-ops-"))
    state = root / "state"
    (root / "data" / "secret").mkdir(parents=True)
    (root / "data" / "hello.txt").write_text("hello\n")
    (root / "svc.sbpolicy").write_text(POLICY.format(root=root, ws=state / "workspace"))
    tools: list[str] = []
    for name, fields in (("reader", {}), ("reader-high", {"safety_class": "High"})):
        path = root / f"{name}.json"
        path.write_text(json.dumps({**manifest(root), "name": name, **fields}))
        tools += ["--manifest", str(path)]

    async def drive(server: uvicorn.Server, sockets: Any = None) -> None:
        config = server.config
        config.load()
        lifespan = LifespanOn(config)
        await lifespan.startup()
        app = config.loaded_app
        token = add_token(state, "bench", "agent:bench")
        bodies = [json.dumps({"op": {"kind": "fs.read", "path": f"{root}/data/hello.txt"},
                              "grant": grant("bench", "agent:bench", root,
                                             call_id=f"bench-{i}"),
                              "manifest": "reader"}).encode() for i in range(4)]

        async def one(i: int) -> None:
            body = bodies[i % 4]
            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                     "method": "POST", "scheme": "http", "path": "/v1/ops",
                     "raw_path": b"/v1/ops", "query_string": b"", "root_path": "",
                     "headers": [(b"host", b"127.0.0.1"),
                                 (b"authorization", f"Bearer {token}".encode()),
                                 (b"content-type", b"application/json"),
                                 (b"content-length", str(len(body)).encode())],
                     "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80), "state": {}}
            sent: list[dict[str, Any]] = []

            async def receive() -> dict[str, Any]:
                if not sent:
                    sent.append({})
                    return {"type": "http.request", "body": body, "more_body": False}
                await asyncio.sleep(3600)  # never: the app reads one message
                return {"type": "http.disconnect"}

            out: list[dict[str, Any]] = []

            async def send(message: dict[str, Any]) -> None:
                out.append(message)

            await app(scope, receive, send)
            assert out[0]["status"] == 200, out

        for i in range(WARM):
            await one(i)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for i in range(args.calls):
                await one(i)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
        else:
            chunks = []
            for c in range(max(1, args.calls // CHUNK)):
                t0 = time.thread_time()
                for i in range(CHUNK):
                    await one(c * CHUNK + i)
                chunks.append((time.thread_time() - t0) / CHUNK * 1e6)
            chunks.sort()
            print(f"load {os.getloadavg()[0]:.2f}; {len(chunks)} chunks of {CHUNK} calls; "
                  f"CPU per call µs: median {chunks[len(chunks) // 2]:.1f}, "
                  f"q1 {chunks[len(chunks) // 4]:.1f}, min {chunks[0]:.1f}")
        await lifespan.shutdown()
        shutil.rmtree(root, ignore_errors=True)
        os._exit(0)  # the engine's threads and the server's loop: nothing else to wait for

    uvicorn.Server.serve = drive  # type: ignore[method-assign, assignment]
    from policy_engine.cli.main import main as cli

    sys.argv = ["policy-engine", "serve", "--policy", str(root / "svc.sbpolicy"),
                "--state-dir", str(state), "--root-fs", str(root), "--port", "0", *tools,
                "--rate-per-minute", "100000000"]
    cli()


if __name__ == "__main__":
    main()
