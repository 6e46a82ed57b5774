"""Docker Engine access: a short-timeout client, the seed 002 §4 flags, and error mapping.

An unreachable engine (socket missing, daemon stopped) fails fast with ``PROVIDER.UNAVAILABLE``;
a missing image says to run ``scripts/build-images.sh``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from plugins.executor_docker.seccomp_profile import profile_json
from policy_engine.errors import BackendRefusal, ErrorCode, PolicyEngineError
from policy_engine.lazy import lazy_module
from policy_engine.model import SYSTEM_DEFAULT_LIMITS, Limits, NetworkMode, Profile

if TYPE_CHECKING:
    import docker
    import docker.errors
    import docker.types
    import requests.exceptions
else:  # the SDK on first use: a start that runs no container does not import it
    docker = lazy_module("docker")
    requests = lazy_module("requests")

DEFAULT_IMAGE = "policy-engine/sandbox:1"
SANDBOX_USER = "1000:1000"
_KEYS = frozenset({"image", "base_url", "client_timeout_s", "workspace_root", "mode",
                   "pool_size", "system_binds", "max_artifacts_bytes", "restricted_network",
                   "pool_launcher", "max_file_bytes", "runtime", "gvisor_runtime",
                   "pool_idle_s"})
MAX_POOL_IDLE_S = 86_400
# dockerd refuses NanoCpus between 1 and 0.01 cores and reads 0 as no limit at all
MIN_NANO_CPUS = 10_000_000
_RUNTIME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
GVISOR_PIDS_BASE, GVISOR_TASKS_PER_PROCESS = 64, 20
"""On runsc the host pids cgroup counts gVisor's own tasks: 42 idle (Sentry, gofer), then about
11 per sandboxed process (its ptrace stub and tracer threads); runsc does not even start under a
limit of 40. The profile's ``pids`` is enforced inside gVisor as ``RLIMIT_NPROC`` (fork answers
EAGAIN, as with runc's cgroup); the cgroup gets ``BASE + pids × PER_PROCESS`` as a backstop,
with headroom: at 12 per process a program forking up to its limit sometimes hit the cgroup and
the whole sandbox died (exit 2, output lost) (docs/docker.md, "gVisor (runsc)")."""


@dataclass(frozen=True, slots=True)
class DockerOptions:
    """Validated ``docker`` plugin options.

    :param workspace_root: host directory holding ``projects/``; default
        ``<state_dir>/docker``, outside ``root_fs`` (``workspace.default_root``).
    :param mode: ``run-once`` (create, start, wait, remove) or ``pool`` (warm containers).
    :param system_binds: host directories bound read-only at the same path for interpreters
        (the image is a minimal root; ``/usr`` comes from the host).
    :param restricted_network: offer ``network restricted`` (the host-side policy proxy,
        ``plugins.executor_docker.network``); ``False`` refuses that mode.
    :param pool_launcher: warm containers run the in-container launcher as PID 1 and commands
        are forked by it (``control.py``); ``False``: ``sleep infinity`` and ``docker exec``.
    :param max_file_bytes: disk quota of a call: no file written grows past this many bytes
        (``RLIMIT_FSIZE`` through ``--ulimit fsize``; the writable ``work`` is a host bind,
        where ``--storage-opt size`` does not apply).
    :param runtime: the OCI runtime registered with dockerd that every container runs on
        (``HostConfig.Runtime``; ``None``: dockerd's default, runc). Checked against
        ``docker info`` when the executor is built.
    :param gvisor_runtime: the registered runtime that is gVisor, used for the calls whose
        profile requires ``isolation gvisor``; ``None``: ``runtime`` when that is gVisor.
    :param pool_idle_s: a warm container held by a session with no call for this many seconds
        is given back (discarded and replaced), so an idle session cannot keep it for good.
    """

    image: str = DEFAULT_IMAGE
    base_url: str = "unix:///var/run/docker.sock"
    client_timeout_s: float = 10.0
    workspace_root: str | None = None
    mode: str = "run-once"
    pool_size: int = 2
    system_binds: tuple[str, ...] = ("/usr",)
    max_artifacts_bytes: int = 50 * 1024 * 1024
    restricted_network: bool = True
    pool_launcher: bool = True
    max_file_bytes: int = 1 << 30
    runtime: str | None = None
    gvisor_runtime: str | None = None
    pool_idle_s: float = 60.0

    @staticmethod
    def parse(raw: Mapping[str, Any] | None) -> DockerOptions:
        opts = dict(raw or {})
        unknown = set(opts) - _KEYS
        if unknown:
            raise ValueError(f"docker: unknown options {sorted(unknown)}")
        mode = opts.get("mode", "run-once")
        if mode not in ("run-once", "pool"):
            raise ValueError("docker: `mode` must be `run-once` or `pool`")
        for key in ("pool_size", "max_artifacts_bytes", "max_file_bytes"):
            v = opts.get(key, 1)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"docker: `{key}` must be a positive integer")
        binds = tuple(opts.get("system_binds", ("/usr",)))
        for b in binds:
            if not isinstance(b, str) or not os.path.isabs(b) or b.startswith("/workspace"):
                raise ValueError(f"docker: system bind `{b}` must be an absolute host path "
                                 "outside /workspace")
        timeout = float(opts.get("client_timeout_s", 10.0))
        if not 0 < timeout <= 120:
            raise ValueError("docker: `client_timeout_s` must be in (0, 120]")
        root = opts.get("workspace_root")
        restricted = opts.get("restricted_network", True)
        launcher = opts.get("pool_launcher", True)
        for key, val in (("restricted_network", restricted), ("pool_launcher", launcher)):
            if not isinstance(val, bool):
                raise ValueError(f"docker: `{key}` must be a boolean")
        idle = opts.get("pool_idle_s", 60.0)
        if isinstance(idle, bool) or not isinstance(idle, int | float) \
                or not 0 < idle <= MAX_POOL_IDLE_S:
            raise ValueError(f"docker: `pool_idle_s` must be a number of seconds in (0, "
                             f"{MAX_POOL_IDLE_S}]")
        names: dict[str, str | None] = {}
        for key in ("runtime", "gvisor_runtime"):
            val = opts.get(key)
            if val is not None and (not isinstance(val, str) or not _RUNTIME_NAME.fullmatch(val)):
                raise ValueError(f"docker: `{key}` must name an OCI runtime registered with "
                                 "dockerd (letters, digits, `.`, `_`, `-`), e.g. `runsc`")
            names[key] = val
        return DockerOptions(
            runtime=names["runtime"], gvisor_runtime=names["gvisor_runtime"],
            image=str(opts.get("image", DEFAULT_IMAGE)),
            base_url=str(opts.get("base_url", "unix:///var/run/docker.sock")),
            client_timeout_s=timeout, workspace_root=str(root) if root else None, mode=mode,
            pool_size=opts.get("pool_size", 2), system_binds=binds,
            max_artifacts_bytes=opts.get("max_artifacts_bytes", 50 * 1024 * 1024),
            restricted_network=restricted, pool_launcher=launcher,
            max_file_bytes=opts.get("max_file_bytes", 1 << 30), pool_idle_s=float(idle),
        )


@dataclass(frozen=True, slots=True)
class Hardening:
    """The container settings derived from a profile (seed 002 §4)."""

    network_mode: str
    pids_limit: int
    mem_limit: int
    nano_cpus: int
    extra_env: dict[str, str] = field(default_factory=dict)
    max_file_bytes: int = 1 << 30
    runtime: str | None = None  # OCI runtime (HostConfig.Runtime); None: dockerd's default
    gvisor: bool = False  # ``runtime`` is gVisor (seccomp_profile.profile_json says why)
    # network off, run-once: no AF_UNIX in the container (the pool's launcher and the
    # restricted bridge speak AF_UNIX to the host; they refuse it per command instead)
    deny_unix: bool = False

    def create_kwargs(self) -> dict[str, Any]:
        ulimit = docker.types.Ulimit
        return {
            **({"runtime": self.runtime} if self.runtime else {}),
            "network_mode": self.network_mode, "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges",
                             f"seccomp={profile_json(self.gvisor, self.deny_unix)}"],
            "ulimits": [ulimit(name="fsize", soft=self.max_file_bytes, hard=self.max_file_bytes),
                        *([ulimit(name="nproc", soft=self.pids_limit, hard=self.pids_limit)]
                          if self.gvisor else [])],
            "pids_limit": self.host_pids_limit(),
            "mem_limit": self.mem_limit, "memswap_limit": self.mem_limit,
            "nano_cpus": self.nano_cpus, "user": SANDBOX_USER,
            "working_dir": "/workspace/work", "log_config": {"type": "none"},
            "ipc_mode": "private", "init": False,
            # the image is never written: only the workspace binds and a private /tmp are
            # (tmpfs pages count against the container's memory limit)
            "read_only": True,
            "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={self.mem_limit},mode=1777"},
        }

    def on_host_of(self, ncpu: int) -> Hardening:
        """These settings on a daemon with ``ncpu`` CPUs: dockerd refuses a ``NanoCpus`` above
        them, and more cores than the host has limit nothing (``0``: unknown, unchanged)."""
        if ncpu <= 0 or self.nano_cpus <= ncpu * 1_000_000_000:
            return self
        return replace(self, nano_cpus=ncpu * 1_000_000_000)

    def host_pids_limit(self) -> int:
        """The container's pids cgroup limit (see ``GVISOR_PIDS_BASE`` for runsc's)."""
        if self.gvisor:
            return GVISOR_PIDS_BASE + self.pids_limit * GVISOR_TASKS_PER_PROCESS
        return self.pids_limit

    def snapshot(self) -> dict[str, Any]:
        return {"network_mode": self.network_mode, "cap_drop": ["ALL"],
                "security_opt": ["no-new-privileges", "seccomp=policy-engine (io_uring, "
                                 "namespaces, setuid modes, preallocation"
                                 + (", AF_UNIX" if self.deny_unix else "") + " refused)"],
                "max_file_bytes": self.max_file_bytes, "pids_limit": self.pids_limit,
                "memory_bytes": self.mem_limit, "nano_cpus": self.nano_cpus,
                "user": SANDBOX_USER, "read_only": True, "tmpfs": ["/tmp"],
                "runtime": self.runtime or "default"}


def _limit(limits: Limits, name: str) -> Any:
    value = getattr(limits, name)
    return value if value is not None else getattr(SYSTEM_DEFAULT_LIMITS, name)


def network_refusal(profile: Profile, options: DockerOptions) -> PolicyEngineError | None:
    """The profile's network mode when this executor does not offer it (``on``; ``restricted``
    turned off), else ``None``."""
    if profile.network is NetworkMode.RESTRICTED and not options.restricted_network:
        return BackendRefusal(ErrorCode.CAPABILITY_BLOCKED,
                              "restricted network is turned off for docker "
                              "(`restricted_network = false`)")
    if profile.network is NetworkMode.ON:
        return BackendRefusal(ErrorCode.CAPABILITY_BLOCKED,
                              "network `on` is not offered by the docker executor")
    return None


def hardening(profile: Profile, options: DockerOptions, limits: Limits | None = None,
              runtime: str | None = None, gvisor: bool = False) -> Hardening:
    """Flags from the call's effective ``limits`` (``ExecContext.limits``; the profile's when
    not given) on the OCI ``runtime`` chosen for the call (``runtimes.for_profile``). The
    container never has a network interface: ``restricted`` is served by the host-side proxy
    through a bridge (``network.py``); ``on`` is refused."""
    lim = limits if limits is not None else profile.limits
    refused = network_refusal(profile, options)
    if refused is not None:
        raise refused
    return Hardening(
        network_mode="none", pids_limit=int(_limit(lim, "pids")),
        mem_limit=int(_limit(lim, "memory_bytes")),
        # second line under `Limits`' own minimum: Docker reads `NanoCpus: 0` as no limit
        nano_cpus=max(MIN_NANO_CPUS, int(float(_limit(lim, "cpu_cores")) * 1e9)),
        max_file_bytes=options.max_file_bytes, runtime=runtime, gvisor=gvisor,
    )


def connect(options: DockerOptions) -> docker.DockerClient:
    """A client with a short timeout, pinged once: ``PROVIDER.UNAVAILABLE`` when unreachable."""
    sock = options.base_url.removeprefix("unix://")
    if options.base_url.startswith("unix://") and not os.path.exists(sock):
        raise PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                f"docker engine socket `{sock}` does not exist; start dockerd "
                                "(scripts/lib/dockerd.sh)")
    try:
        client = docker.DockerClient(base_url=options.base_url,
                                     timeout=options.client_timeout_s)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise unavailable(exc) from None
    return client


def unavailable(exc: BaseException) -> PolicyEngineError:
    return PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, "docker engine is unreachable",
                             audit={"error": str(exc)[:2000]})


def check_image(client: docker.DockerClient, image: str) -> None:
    """``PROVIDER.UNAVAILABLE`` naming the build script when the image is not present."""
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise PolicyEngineError(
            ErrorCode.PROVIDER_UNAVAILABLE,
            f"sandbox image `{image}` is missing; run scripts/build-images.sh") from None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise unavailable(exc) from None


START_ATTEMPTS = 3
"""A container's start, planned again when a masked path vanished meanwhile (``mount_raced``)."""


def mount_raced(err: PolicyEngineError) -> bool:
    """Whether a container's init failed to mount one of its mounts ("error mounting ... to
    rootfs"): a masked host path that vanished after the plan (runc cannot create its mount
    point in a read-only bind). Nothing of the call ran: planning again is safe."""
    return (err.code is ErrorCode.EXECUTION_FAILED
            and "error mounting" in str((err.audit or {}).get("error", "")))


def map_error(exc: BaseException) -> PolicyEngineError:
    """A registry code for whatever the SDK raised."""
    if isinstance(exc, PolicyEngineError):
        return exc
    if isinstance(exc, requests.exceptions.ConnectionError | ConnectionError | FileNotFoundError):
        return unavailable(exc)
    if isinstance(exc, requests.exceptions.ReadTimeout | TimeoutError):
        return PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE, "docker engine did not answer "
                                 "in time", audit={"error": str(exc)[:2000]})
    if isinstance(exc, docker.errors.ImageNotFound):
        return PolicyEngineError(ErrorCode.PROVIDER_UNAVAILABLE,
                                 "sandbox image is missing; run scripts/build-images.sh")
    return PolicyEngineError(ErrorCode.EXECUTION_FAILED, "docker execution failed",
                             audit={"error": f"{type(exc).__name__}: {exc}"[:2000]})
