"""The fixed parts of a generated macOS profile: what any process needs to start, and the
host secrets and control channels no policy can open.

Followed, not copied: OpenAI Codex's ``codex-rs/core/src/seatbelt_base_policy.sbpl`` and
``codex-rs/sandboxing/src/restricted_read_only_platform_defaults.sbpl`` (themselves derived
from Chromium's ``sandbox/policy/mac/common.sb``): ``(deny default)``, process-exec/fork,
signals and process-info to the same sandbox only, a named list of ``sysctl-read`` and
``mach-lookup`` services instead of a wildcard, ``/usr/bin/sandbox-exec`` by absolute path.
The seed's ``(allow mach-lookup)`` without a filter would reach every launchd service, host
control ones included; it is narrowed here.
"""

from __future__ import annotations

PROCESS_RULES: tuple[str, ...] = (
    "(allow process-exec)",
    "(allow process-fork)",
    "(allow signal (target same-sandbox))",
    "(allow process-info* (target same-sandbox))",
    "(allow user-preference-read)",
    "(allow ipc-posix-sem)",
    "(allow pseudo-tty)",
)
"""Children inherit the profile, so exec and fork are safe to allow wholesale."""

SYSCTLS: tuple[str, ...] = (
    "hw.activecpu", "hw.byteorder", "hw.cachelinesize_compat", "hw.cpufamily", "hw.cputype",
    "hw.logicalcpu", "hw.logicalcpu_max", "hw.machine", "hw.memsize", "hw.model", "hw.ncpu",
    "hw.nperflevels", "hw.pagesize", "hw.pagesize_compat", "hw.physicalcpu",
    "hw.physicalcpu_max", "kern.argmax", "kern.hostname", "kern.maxfilesperproc", "kern.maxproc",
    "kern.osproductversion", "kern.osrelease", "kern.ostype", "kern.osvariant_status",
    "kern.osversion", "kern.secure_kernel", "kern.usrstack64", "kern.version",
    "machdep.cpu.brand_string", "sysctl.proc_cputype", "vm.loadavg",
)
SYSCTL_PREFIXES: tuple[str, ...] = ("hw.optional.", "hw.perflevel", "kern.proc.pid.")
"""What runtimes read at start (CPU count, page size, OS version); nothing is writable."""

MACH_SERVICES: tuple[str, ...] = (
    "com.apple.system.opendirectoryd.libinfo",  # getpwuid(): user and group names
    "com.apple.system.logger",
    "com.apple.logd",
)
"""launchd services any process may look up; every other one (host control daemons) is
refused by ``(deny default)``."""

NETWORK_MACH_SERVICES: tuple[str, ...] = (
    "com.apple.dnssd.service",  # getaddrinfo() through mDNSResponder
    "com.apple.SystemConfiguration.DNSConfiguration",
    "com.apple.SystemConfiguration.configd",
    "com.apple.trustd.agent",  # TLS certificate evaluation
)
"""Looked up only when the profile's network is ``on``."""

DNS_SOCKET = "/private/var/run/mDNSResponder"
"""The resolver's socket: the one unix socket a networked profile may connect to."""

SYSTEM_READ: tuple[str, ...] = (
    "/System/**", "/usr/**", "/bin/**", "/sbin/**", "/Library/Apple/**",
    "/Library/Preferences/**", "/private/var/db/timezone/**", "/private/etc/**",
    "/dev/random", "/dev/urandom", "/dev/zero", "/dev/null", "/dev/fd/**", "/dev/tty",
)
"""Read-only, for the loader, the shells and the runtimes (Linux's ``SYSTEM_RO``); the mandatory
denies below still win for their files (``/private/etc/passwd``…)."""

SYSTEM_VOLUMES_DENY: tuple[str, ...] = ("/System/Volumes/**",)
SYSTEM_VOLUMES_READ: tuple[str, ...] = ("/System/Volumes/Preboot/Cryptexes/**",)
"""``/System/**`` above would include ``/System/Volumes/Data`` — the data volume, where
``/Users``, ``/private``, ``/Applications`` live as firmlinks — and the swap volume (``VM``):
closed again right after (in any letter case, as every deny), except the OS cryptex (the dyld
shared cache on macOS 13+, reached through ``/System/Cryptexes/OS``)."""

DEVICE_WRITE: tuple[str, ...] = ("/dev/null", "/dev/zero", "/dev/fd/**", "/dev/tty")

MACOS_DENY: tuple[str, ...] = (
    "/private/etc/master.passwd", "/private/etc/sudoers", "/private/etc/sudoers.d/**",
    "/private/var/db/sudo/**", "/Library/Keychains/**", "~/Library/Keychains/**",
    "~/.docker/**", "/private/var/run/**", "/private/tmp/com.apple.launchd.*/**",
)
"""Always denied for read and write on macOS, with the policy's mandatory denies: the macOS
counterparts of ``/etc/shadow`` (``master.passwd``), the keychains, Docker Desktop's sockets
and credentials, launchd's per-user sockets (``SSH_AUTH_SOCK``) and ``/var/run``."""

UNIX_SOCKET_DENY = "(deny network-outbound (remote unix-socket))"
"""Host control sockets (docker, launchd listeners, the SSH agent): never connectable, whatever
the network mode; emitted after every allow so it wins."""
