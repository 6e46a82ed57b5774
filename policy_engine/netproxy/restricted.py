"""Restricted network mode (seed 004): a per-run policy proxy and the sandbox arguments to reach it.

The child runs in a network namespace with no route out (``bwrap --unshare-net`` or
``docker --network=none``: only loopback). The host-side proxy (``policy_engine.netproxy.proxy``)
listens on a Unix socket in a private runtime directory, which is bind-mounted read-only into the
sandbox together with the bridge script; the bridge, started first inside the namespace, listens
on ``127.0.0.1:PORT`` there and forwards each connection to the socket. Programs honouring
``HTTP_PROXY``/``HTTPS_PROXY`` reach the proxy; anything else reaches nothing.

Use from an executor (the guard is the call's, ``ctx.guard``, when the orchestrator passed one)::

    with RestrictedNetwork(profile, ctx.guard or self.guard).start() as net:
        argv = ["bwrap", "--clearenv", *my_binds, *net.bwrap_args(setenv=True),
                "--", *net.wrap_argv(argv)]
        ... run ...
        ctx.side_effects.extend(net.side_effects())   # refusals included (net.refusals())
"""

from __future__ import annotations

import os
import shutil
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from policy_engine.executor import Decider
from policy_engine.guard.guard import Guard
from policy_engine.model import Limits, Profile, SideEffectRec
from policy_engine.netproxy.resolve import Resolver, system_resolver
from policy_engine.netproxy.wire import Meter

if TYPE_CHECKING:
    from policy_engine.netproxy.proxy import ProxyServer

SANDBOX_DIR = "/run/policy-engine-net"
"""Where the runtime directory (``proxy.sock``, ``bridge.py``) appears inside the sandbox."""

DEFAULT_PORT = 3128
BRIDGE_SOURCE = Path(__file__).with_name("bridge.py")


def default_python() -> str:
    """An interpreter that exists inside a sandbox binding ``/usr``: ``/usr/bin/python3``."""
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


class RestrictedHandle:
    """A running proxy for one sandboxed run; close it (or use ``with``) when the run ends."""

    def __init__(self, runtime_dir: Path, server: ProxyServer, thread: threading.Thread,
                 effects: list[SideEffectRec], lock: threading.Lock, port: int,
                 python: str, sandbox_dir: str) -> None:
        self.runtime_dir = runtime_dir
        self.socket_path = runtime_dir / "proxy.sock"
        self.port = port
        self.python = python
        self.sandbox_dir = sandbox_dir
        self._server, self._thread = server, thread
        self._effects, self._lock = effects, lock
        self._closed = False

    @property
    def proxy_url(self) -> str:
        """The proxy URL as seen inside the sandbox."""
        return f"http://127.0.0.1:{self.port}"

    def bwrap_args(self, *, setenv: bool = False) -> list[str]:
        """bubblewrap arguments: a fresh network namespace and the read-only runtime directory.

        Put them after the root and ``/run`` arguments (bwrap creates the mount point, so the
        parent of ``SANDBOX_DIR`` must be on bwrap's own tmpfs or a ``--tmpfs``).

        :param setenv: also pass ``env()`` as ``--setenv`` pairs (for ``--clearenv`` sandboxes).
        """
        args = ["--unshare-net", "--ro-bind", str(self.runtime_dir), self.sandbox_dir]
        if setenv:
            for key, value in sorted(self.env().items()):
                args += ["--setenv", key, value]
        return args

    def network_hook(self) -> Callable[[object], list[str]]:
        """``bwrap_args(setenv=True)`` as a hook of the proc executor's ``NetworkHook`` shape
        (the plan is not needed); the executor must still run ``wrap_argv(inner)``."""
        return lambda _plan: self.bwrap_args(setenv=True)

    def docker_options(self) -> dict[str, Any]:
        """Keyword arguments for ``docker.containers.run``/``create``: no network, the runtime
        directory mounted read-only, the proxy environment."""
        return {
            "network_mode": "none",
            "volumes": {str(self.runtime_dir): {"bind": self.sandbox_dir, "mode": "ro"}},
            "environment": self.env(),
        }

    def env(self) -> dict[str, str]:
        """Proxy variables, upper and lower case (curl reads only ``http_proxy`` lower case)."""
        url = self.proxy_url
        out: dict[str, str] = {}
        for name in ("http_proxy", "https_proxy", "all_proxy"):
            out[name] = out[name.upper()] = url
        out["no_proxy"] = out["NO_PROXY"] = ""
        return out

    def wrap_argv(self, argv: list[str], *, pass_fds: tuple[int, ...] = ()) -> list[str]:
        """Prefix ``argv`` with the bridge, which listens first, then runs ``argv``.

        :param pass_fds: descriptors the bridge inherits and hands to ``argv`` (closing its own
            copies), e.g. a status pipe the launcher before the tool reports to.
        """
        extra = ["--pass-fd", ",".join(map(str, pass_fds))] if pass_fds else []
        return [self.python, "-I", "-S", f"{self.sandbox_dir}/bridge.py",
                "--listen", f"127.0.0.1:{self.port}",
                "--unix", f"{self.sandbox_dir}/proxy.sock", *extra, "--", *argv]

    def side_effects(self, settle: float = 5.0) -> list[SideEffectRec]:
        """Everything the proxy did or refused, as evidence (metadata only, no query strings).

        Call it after the sandboxed process ended: it first waits up to ``settle`` seconds for
        connections still being handled, so their records are in.
        """
        if not self._closed:
            self._server.quiesce(settle)
        with self._lock:
            return list(self._effects)

    def traffic(self) -> tuple[int, int]:
        """``(bytes_in, bytes_out)`` the proxy let through so far, tunnels included."""
        meter = self._server.policy.meter
        return meter.bytes_in, meter.bytes_out

    def refusals(self, settle: float = 5.0) -> list[SideEffectRec]:
        """The refused requests and tunnels only (see ``side_effects``)."""
        return [e for e in self.side_effects(settle) if "refused" in e.meta]

    def close(self) -> None:
        """Stop the proxy and remove the runtime directory; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        self._server.policy.transport.close()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)

    def __enter__(self) -> RestrictedHandle:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class RestrictedNetwork:
    """Builds the per-run proxy enforcing ``profile``'s ``net.http`` rules.

    :param guard: the same guard that decides tool calls (``ExecContext.guard``: it holds the
        policy set whose conditions the profile carries and whose rules name private addresses);
        each proxied request is a ``NetHttpOp`` it decides. ``None`` means ``Guard()`` with no
        policy set: conditional rules never allow and no private address is reachable.
    :param resolver: name resolution, once per request (tests inject a stand-in for DNS).
    :param verify: TLS verification for ``http://`` requests the proxy makes itself; CONNECT
        tunnels are end-to-end between the child and the server.
    :param deadline: ``time.monotonic()`` value after which transfers are cut (default 1 h).
    :param port: the bridge's port inside the namespace.
    :param consume: the call's budget charge (``ExecContext.consume``): every byte through the
        proxy is charged as ``bytes_in``/``bytes_out`` when it passes.
    :param python: the interpreter that runs the bridge inside the sandbox.
    :param sandbox_dir: where the runtime directory appears inside the sandbox.
    :param runtime_parent: host directory the runtime directory is created in (default the
        system temp directory).
    :param parent_mounted: ``runtime_parent`` is already mounted at ``sandbox_dir`` (a warm
        container, whose mounts are fixed at creation): the runtime directory then appears at
        ``sandbox_dir/<its name>`` and the handle's paths say so.
    :param limits: the call's effective limits (``ExecContext.limits``); the byte caps of each
        proxied request are the tighter of these and the request's own rule's. Default: the
        profile's.
    """

    def __init__(
        self, profile: Profile, guard: Decider | None = None, *,
        resolver: Resolver = system_resolver, verify: ssl.SSLContext | bool = True,
        deadline: float | None = None, port: int = DEFAULT_PORT, python: str | None = None,
        sandbox_dir: str = SANDBOX_DIR, runtime_parent: str | None = None,
        parent_mounted: bool = False, consume: Callable[[str, int], None] | None = None,
        limits: Limits | None = None,
    ) -> None:
        if parent_mounted and runtime_parent is None:
            raise ValueError("parent_mounted needs runtime_parent")
        self.profile = profile
        self.guard: Decider = guard if guard is not None else Guard()
        self.resolver = resolver
        self.verify = verify
        self.deadline = deadline if deadline is not None else time.monotonic() + 3600
        self.port = port
        self.python = python or default_python()
        self.sandbox_dir = sandbox_dir
        self.runtime_parent = runtime_parent
        self.parent_mounted = parent_mounted
        self.consume = consume
        self.limits = limits

    def start(self) -> RestrictedHandle:
        """Create the runtime directory, copy the bridge, listen on the socket, serve."""
        # httpx with them: imported by the first restricted call, not by every executor's start
        from policy_engine.netproxy.proxy import ProxyPolicy, ProxyServer, serve_in_thread
        from policy_engine.netproxy.transport import PinnedTransport

        runtime = Path(tempfile.mkdtemp(prefix="pe-net-", dir=self.runtime_parent))
        try:
            runtime.chmod(0o755)  # INVARIANT: only the socket and the bridge live here
            shutil.copyfile(BRIDGE_SOURCE, runtime / "bridge.py")
            (runtime / "bridge.py").chmod(0o644)
            effects: list[SideEffectRec] = []
            lock = threading.Lock()

            def record(rec: SideEffectRec) -> None:
                with lock:
                    effects.append(rec)

            policy = ProxyPolicy(profile=self.profile, guard=self.guard, resolver=self.resolver,
                                 transport=PinnedTransport(verify=self.verify), record=record,
                                 deadline=self.deadline, meter=Meter(self.consume),
                                 limits=self.limits)
            server = ProxyServer(str(runtime / "proxy.sock"), policy)
            (runtime / "proxy.sock").chmod(0o666)  # a container's uid 1000 must connect
        except BaseException:
            shutil.rmtree(runtime, ignore_errors=True)
            raise
        thread = serve_in_thread(server)
        inside = f"{self.sandbox_dir}/{runtime.name}" if self.parent_mounted else self.sandbox_dir
        return RestrictedHandle(runtime, server, thread, effects, lock, self.port, self.python,
                                inside)
