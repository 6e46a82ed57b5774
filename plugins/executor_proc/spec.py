"""The sandbox plan of one proc.exec: binds, masks, Landlock rules, environment, cwd and limits.

Both backends (bwrap and Landlock-only) render the same plan, so they grant the same paths.
Binds have literal-prefix granularity: ``/w/*/out`` grants ``/w`` — the guard checks the fine
glob of fs ops, the sandbox only bounds what a process can reach.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import stat
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from plugins.executor_proc import preview_masks
from policy_engine import ErrorCode, PolicyEngineError
from policy_engine.compiler.builtins import MANDATORY_DENY_PATHS
from policy_engine.errors import BackendRefusal
from policy_engine.guard.binds import beneath, bound_paths, cwd_refusal
from policy_engine.guard.env import profile_env_refusal
from policy_engine.guard.gitfiles import GIT_PINS
from policy_engine.guard.nofollow import UNKNOWN, probe
from policy_engine.guard.paths import normalize_path, resolve_beneath
from policy_engine.model import (
    SYSTEM_DEFAULT_LIMITS,
    CapabilityKind,
    ExecOp,
    FsCapability,
    NetworkMode,
    ProcExecOp,
    Profile,
)
from policy_engine.model import Limits as ModelLimits
from policy_engine.patterns.paths import expand_home
from policy_engine.sandbox import listing_store, plancache
from policy_engine.sandbox.artifacts import ARTIFACTS_ENV, artifacts_dir
from policy_engine.sandbox.masks import (
    DEFAULT_CACHE,
    MAX_PLAN_DIRS,
    RUNTIME_DIRS,
    RUNTIME_GLOBS,
    MaskPlan,
    PlanTooLarge,
    plan_masks,
    under_runtime,
)

SYSTEM_RO = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc")
# never readable in a sandbox, whatever the profile says (seed 003 mandatory list, /etc part);
# /etc/passwd and /etc/group are replaced by synthetic ones under bwrap (SYNTHETIC_ETC), hidden
# under Landlock
BUILTIN_MASKS = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers",
                 "/etc/ssh/ssh_host_*_key", "/etc/passwd", "/etc/group", "/etc/passwd-",
                 "/etc/group-")
BASE_ENV_KEYS = ("PATH", "LANG", "HOME", "TZ", "TMPDIR")


@dataclass(frozen=True, slots=True)
class Limits:
    """Resolved per-exec limits (every value concrete)."""

    timeout_s: float
    cpu_cores: float
    memory_bytes: int
    pids: int
    max_stdout: int
    max_stderr: int
    max_stdin: int
    disk_write: int = 2 << 30  # bytes written to disk by the whole call (writewatch.py)


@dataclass(slots=True)
class Plan:
    """Everything a backend needs to start the process; paths are host paths."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    readable: list[str]
    writable: list[str]
    system: list[str]
    mask_files: list[str] = field(default_factory=list)
    mask_dirs: list[str] = field(default_factory=list)
    # of mask_dirs: other calls' workspaces (the local runner), reported as a count only
    hidden_dirs: list[str] = field(default_factory=list)
    # each readable/writable bind resolved when the plan was made: what the launcher stages
    # through a no-symlink descriptor (a link swapped in later fails the call)
    resolved: dict[str, str] = field(default_factory=dict)
    # existing paths inside writable binds that a forbid of fs.write covers: bound read-only
    readonly: list[str] = field(default_factory=list)
    limits: Limits | None = None
    network: str = "off"
    # the profile's network is off: no socket may be given a name (the local runner keeps the
    # host's network whatever the profile says; seccomp.build_filter's ``deny_bind``)
    no_bind: bool = False
    # trees readable and executable (the local runner's host view), carved around the masks
    open_trees: list[str] = field(default_factory=list)
    # a preview's host-wide mask globs, planned by the run only (preview_masks.py)
    masked_at_run: list[str] = field(default_factory=list)
    # landlock_rules' carving (a directory walk), by carve_masks; a plan is built per call
    _carved: dict[bool, list[tuple[str, str]]] = field(default_factory=dict, repr=False,
                                                       compare=False)

    def landlock_rules(self, extra: Iterable[tuple[str, str]] = (),
                       carve_masks: bool = True) -> list[tuple[str, str]]:
        """Allow-list rules; a tree holding a masked path is carved around it (Landlock cannot
        subtract), its own directory keeping only list/create rights. Under bwrap the masks are
        already mounted over, so carving (hundreds of rules for /etc) is skipped.
        """
        cached = self._carved.get(carve_masks)
        if cached is not None:  # the executor counts them before it starts, then uses them
            return cached + list(extra)
        masked = self.mask_files + self.mask_dirs if carve_masks else []
        rules: list[tuple[str, str]] = []
        for paths, access in ((self.system, "rox"), (self.readable, "rox")):
            for p in paths:
                rules += carve(p, access, masked)
        for p in self.writable:  # a write-forbidden path is carved out and readable only
            rules += carve(p, "rw", masked + (self.readonly if carve_masks else []))
        if carve_masks:
            for p in self.readonly:
                rules += carve(p, "rox", masked)
        for p in self.open_trees:
            rules += carve(p, "host", masked)
        self._carved[carve_masks] = rules
        return rules + list(extra)


def carve(root: str, access: str, masked: list[str]) -> list[tuple[str, str]]:
    """``root`` with ``access``, minus every masked path beneath it."""
    inside = [m for m in masked if beneath(m, root)]
    if not inside:
        return [(root, access)]
    if root in inside or not os.path.isdir(root) or os.path.islink(root):
        return []
    out: list[tuple[str, str]] = [(root, "create" if access == "rw" else "list")]
    with os.scandir(root) as it:
        names = sorted(e.name for e in it if not e.is_symlink())
    # a symlink gets no rule of its own: Landlock would grant the link's *target* (/etc,
    # another tree's .env, anything); opening through the link is checked at the target
    for name in names:
        out += carve(os.path.join(root, name), access, inside)
    return out


_warm_lock = threading.Lock()
_checked = threading.Event()  # the stored walks checked (or walked): the first plan may go
_warmed = threading.Event()  # and every directory watched: any plan may go
_warming: list[threading.Thread] = []
_first: list[bool] = [True]  # no plan has gone yet
# False: the warm-up puts no watches (``prewarm(watch=False)``); a second plan unwatches the
# stored walks and checks their stamps itself (``_await_warmup``)
_watching: list[bool] = [True]


def _warm_again_after_fork() -> None:
    # a forked child has none of the parent's threads: a warm-up begun there never ends here
    # (a call would wait for it forever), and the child's cache starts empty (masks.py)
    global _warm_lock, _checked, _warmed
    _warm_lock, _checked, _warmed = threading.Lock(), threading.Event(), threading.Event()
    _warming.clear()
    _first[0] = True
    _watching[0] = True


os.register_at_fork(after_in_child=_warm_again_after_fork)


@atexit.register
def _finish_warmup() -> None:
    # the warm-up stores its walks after a call may go on (``_warm``): a short run (one CLI
    # call) would end before the store is written, and every start would walk again; a call's
    # plan may have re-walked a changed system directory since
    for t in list(_warming):
        t.join(timeout=30)
    if _warming:
        listing_store.save(DEFAULT_CACHE, system_trees())


def root_stamp() -> tuple[int, int, int, int] | None:
    """What ``/`` says of its own entries: a name added, removed or replaced there (``/lib64``,
    the ``/bin`` link) changes its mtime and ctime; ``None`` when it cannot be read."""
    try:
        st = os.stat("/")
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns


@dataclass(slots=True)
class RootView:
    """What ``/`` holds of the top-level names asked (``/usr``, the ``/bin`` link…), kept while
    ``/``'s stamp holds (``root_stamp``): a name added, removed or replaced there changes it.
    Shared by the plan (which system trees exist) and the bwrap argv (which are links)."""

    stamp: tuple[int, int, int, int] | None
    found: dict[str, str | None] = field(default_factory=dict)  # name -> link target or None
    asked: set[str] = field(default_factory=set)

    def entry(self, name: str) -> tuple[bool, str | None]:
        """(whether ``/`` holds ``name``, its link target or ``None`` when not a link)."""
        if name not in self.asked:
            with contextlib.suppress(OSError):
                st = os.lstat(name)
                self.found[name] = os.readlink(name) if stat.S_ISLNK(st.st_mode) else None
            self.asked.add(name)
        return name in self.found, self.found.get(name)


_ROOT: list[RootView] = []


def root_view() -> RootView:
    """The kept view of ``/`` while its stamp holds; ``/`` unreadable: a fresh one each time."""
    stamp = root_stamp()
    kept = _ROOT[0] if _ROOT else None
    if kept is not None and stamp is not None and kept.stamp == stamp:
        return kept
    view = RootView(stamp)
    if stamp is not None:
        _ROOT[:] = [view]
    return view


def system_trees(extra_ro: Iterable[str] = ()) -> list[str]:
    """The system binds every sandbox gets: ``SYSTEM_RO``, the interpreter's prefix, extras.

    Which names ``/`` holds, and which of them are links, comes from ``root_view`` (looked up
    again only when ``/`` changed: every plan asked it, 11 ``stat`` calls and their Python,
    ≈ 0.1 ms a call with cold caches after a sandbox ran, issue 27 item 4). A link's target
    lies below ``/`` and may appear or go without ``/`` changing (``/lib64 -> usr/lib64``:
    outsider round 39, F02), so whether a link leads anywhere, the interpreter's prefix and
    the extras are asked on every call (one ``stat`` each)."""
    view = root_view()
    system = [p for p in SYSTEM_RO
              if (e := view.entry(p))[0] and (e[1] is None or os.path.exists(p))]
    interp = realpath(sys.base_prefix)  # one openat2 probe while no link is on it
    return system + [p for p in (interp, *extra_ro)
                     if os.path.exists(p) and not any(beneath(p, s) for s in SYSTEM_RO)]


def _warm(watch: bool = True) -> None:
    trees: list[str] = []
    try:
        patterns = [*BUILTIN_MASKS, *(f"{d}/**" for d in RUNTIME_DIRS), *RUNTIME_GLOBS,
                    *MANDATORY_DENY_PATHS]
        trees = system_trees()
        # the last run's walks, each directory's stamp checked: only the directories changed
        # since are listed (listing_store); the watches come after the first plan's turn
        listing_store.load(DEFAULT_CACHE, watch=False)
        with contextlib.suppress(PlanTooLarge):  # the call's own plan says so, cleanly
            plan_masks([], trees, patterns, "/nonexistent")
    finally:
        _checked.set()
    if not watch:  # the first plan trusts the check just made; a second one unwatches
        if trees:
            listing_store.save(DEFAULT_CACHE, trees)
        return
    try:
        listing_store.watch_loaded(DEFAULT_CACHE)
    finally:
        _warmed.set()
    if trees:  # after the set: no call waits for it; written only when a walk changed
        listing_store.save(DEFAULT_CACHE, trees)


def prewarm(*, wait: bool = False, watch: bool = True) -> None:
    """Walk the system trees for the mandatory denies once, off the call path (issue 27 item
    4: the first call walked /usr/lib, the Python prefix and /usr/share, 25k directories, in
    about a second): the per-root walk records and inotify watches it leaves make a call's
    plan of those trees a reuse. Started by the executor; ``wait``: until it is done.
    ``watch=False`` (a one-call command's first plan, ``warm_ahead=False``): the stored walks
    are checked for that plan and no watch is put on each of ~26,000 directories (≈ 0.2 s of
    CPU) for calls that never come; a second plan unwatches them
    (``listing_store.unwatch_loaded``) and checks every stamp itself (``_await_warmup``).
    The first caller's ``watch`` holds for the process."""
    with _warm_lock:
        if not _warming:
            _watching[0] = watch
            t = threading.Thread(target=_warm, args=(watch,), name="pe-mask-prewarm",
                                 daemon=True)
            _warming.append(t)
            t.start()
    if wait:  # unwatched: until checked (the watched state comes only with a second plan)
        (_warmed if _watching[0] else _checked).wait()


def _await_warmup() -> None:
    """Wait for the warm-up: the first plan once the stored walks are checked (it plans on a
    check just made), any later one until their directories are watched too (a check grows
    stale; a watch reports every change after it)."""
    with _warm_lock:
        first, _first[0] = _first[0], False
    if first or _watching[0]:
        (_checked if first else _warmed).wait()
        return
    # not watched (one call was expected): the stored walks no longer stand on the check made
    # at load; this plan checks their stamps itself (and watches them then)
    _checked.wait()
    with _warm_lock:
        if not _warmed.is_set():
            listing_store.unwatch_loaded(DEFAULT_CACHE)
            _warmed.set()


def realpath(path: str) -> str:
    """``os.path.realpath``, answered by one ``openat2`` probe when the path holds no link (a
    plan resolves ~50 paths: the binds, each pattern's fixed prefix, each masked path)."""
    if path.startswith("/") and not path.startswith("//") and os.path.normpath(path) == path \
            and probe(path)[0] != UNKNOWN:
        return path  # every component exists and none is a link, or one is missing first
    return os.path.realpath(path)


def bounded_plan(bound: Sequence[str], system: Sequence[str], patterns: Sequence[str], home: str,
                 *, foreign_owner: int | None = None, keep: Sequence[str] = (),
                 resolve: Callable[[str], str] | None = None,
                 deps: tuple[list[str], list[str]] | None = None) -> MaskPlan:
    """``plan_masks``, its directory budget exceeded refused with ``CAPABILITY_BLOCKED``: a
    bind of a whole host (``allowReadOutside``) walked it all for ``**/.env`` on every cold
    plan (issue 32 item 11: 3 s, 266 MB). ``resolve`` and ``deps``: ``plancache``'s recording
    ``realpath`` and the literal trees' directories, when the plan is to be kept."""
    try:
        return plan_masks(bound, system, patterns, home, foreign_owner=foreign_owner, keep=keep,
                          realpath=resolve or realpath, deps=deps)
    except PlanTooLarge as exc:
        raise BackendRefusal(
            ErrorCode.CAPABILITY_BLOCKED,
            f"{exc} (more than {MAX_PLAN_DIRS:,} directories beneath {', '.join(bound[:3])}"
            f"{'…' if len(bound) > 3 else ''}): narrow the fs rules, or keep a broad read "
            "out of the mandatory denies' reach") from None


def _mask_patterns(profile: Profile) -> tuple[str, ...]:
    """The globs a proc sandbox masks for ``profile`` (its own, once per profile object: a
    frozen profile's denies cannot change): the built-ins, the host runtime directories, and
    every mandatory deny or forbid of fs.read (with or without a `when`: the sandbox cannot
    evaluate conditions per file access, so it applies them always)."""
    kept = _PATTERNS.get(id(profile))
    if kept is not None and kept[0]() is profile:
        return kept[1]
    home = profile.mappings.home
    patterns = [*BUILTIN_MASKS, *(f"{d}/**" for d in RUNTIME_DIRS), *RUNTIME_GLOBS]
    for deny in profile.denies:
        reads = deny.mandatory or CapabilityKind.FS_READ in deny.kinds
        if reads and isinstance(deny.capability, FsCapability):
            patterns += [expand_home(p, home) for p in deny.capability.paths]
    found = tuple(patterns)
    if len(_PATTERNS) >= 256:  # profiles come and go per call; keep the recent ones
        _PATTERNS.clear()
    # returned from here, never read back: another thread's call may clear the memo between
    # the two (outsider round 39, F01: a bare KeyError failed that call)
    _PATTERNS[id(profile)] = (weakref.ref(profile), found)
    return found


_PATTERNS: dict[int, tuple[weakref.ref[Profile], tuple[str, ...]]] = {}


def _masks(profile: Profile, bound: list[str], system: list[str], *,
           foreign_owner: int | None = None, keep: Sequence[str] = (),
           deferred: list[str] | None = None) -> tuple[list[str], list[str], list[str]]:
    """Existing paths under mandatory denies, the built-ins and the host runtime directories
    that a bind would expose (one pruned, cached walk: ``policy_engine.sandbox.masks``).
    What other host users may not read (``/etc/docker/key.json``) needs no mask: the sandbox
    runs as an unprivileged uid (``plugins/executor_proc/uid.py``).

    ``**/x`` globs are searched in the profile's binds only; system trees are searched only for
    a glob whose literal prefix lies inside them (``/etc/ssh/ssh_host_*_key``).
    """
    home = profile.mappings.home
    patterns = _mask_patterns(profile)
    # the local runner's foreign-owner masks and a preview are planned afresh every time
    reuse = plancache.cache() if deferred is None and foreign_owner is None else None
    watcher = DEFAULT_CACHE.watcher
    key = (tuple(bound), tuple(system), patterns, home, tuple(keep))
    if reuse is not None:
        kept = reuse.get(key, watcher)
        if kept is not None:
            files, dirs = kept
            return list(files), list(dirs), []
    token = reuse.token(watcher) if reuse is not None else None
    resolve = plancache.Recorder(realpath) if token is not None else realpath
    literal: list[str] = []
    trees: list[str] = []
    if deferred is None:
        plan = bounded_plan(bound, system, patterns, home, foreign_owner=foreign_owner,
                            keep=keep, resolve=resolve, deps=(literal, trees))
    else:  # a preview: host-wide globs named, not searched (preview_masks.py)
        plan, later = preview_masks.plan(bound, system, patterns, lambda b, s, p: bounded_plan(
            b, s, p, home, foreign_owner=foreign_owner, keep=keep))
        deferred += later
    # /var/run -> /run: the link's target is masked itself, and a file bind would follow it
    files = [p for p in plan.files if not (os.path.islink(p) and under_runtime(p))]
    # a file inside a masked directory is hidden already; binding over it as well fails when
    # its path runs through a symlink (`/var/run/docker.sock` under a bound `/`: bwrap cannot
    # create the mount point), which made every `fs.read "/**"` sandbox fail while dockerd ran
    files = [p for p in files if not any(beneath(resolve(p), d) for d in plan.dirs)]
    if reuse is not None and isinstance(resolve, plancache.Recorder) and plan.vouched:
        # every path looked at outside the walks: resolved ones, the binds, the masked ones
        reuse.put(key, token, (tuple(files), plan.dirs),
                  [*resolve.paths, *literal, *bound, *system, *plan.files, *plan.dirs], trees,
                  files=bound, walked=plan.walked)  # files: a file bind's link count
    return files, list(plan.dirs), list(plan.foreign)


def system_masks(profile: Profile, system: Sequence[str]) -> tuple[list[str], list[str]]:
    """The masks (files, directories) a proc sandbox plans for the host trees ``system`` bound
    read-only, from the same warm walk (``prewarm``): the docker executor binds host trees too
    (``system_binds``), and a mandatory deny never degrades there (attack 35, docker).

    :raises BackendRefusal: the plan is past its directory budget (``bounded_plan``).
    """
    prewarm()
    if not _warmed.is_set():
        _await_warmup()  # one walk of the system trees, not two racing
    files, dirs, _ = _masks(profile, [], list(system))
    return files, dirs


def _write_forbidden(profile: Profile, writable: list[str], masked: list[str]) -> list[str]:
    """Existing paths inside the writable binds that a forbid of fs.write covers (applied
    whatever its `when` says, as for reads): the sandbox gets them read-only, so a permitted
    process cannot do what the policy refuses an fs.write (outsider attack round 2, F1)."""
    home = profile.mappings.home
    writes = [d for d in profile.denies if CapabilityKind.FS_WRITE in d.kinds
              and CapabilityKind.FS_READ not in d.kinds and isinstance(d.capability, FsCapability)]
    patterns = [expand_home(p, home) for d in writes
                for p in d.capability.paths]  # type: ignore[union-attr]
    if not patterns or not writable:
        return []
    plan = bounded_plan(writable, [], patterns, home)
    found = sorted({*plan.files, *plan.dirs} - set(masked))
    # nothing beneath a read-only directory needs its own bind
    return [p for p in found if not any(q != p and beneath(p, q) for q in found)]


def resolve_limits(profile: Profile, op: ProcExecOp, limits: ModelLimits | None = None) -> Limits:
    """The exec's limits: the call's effective ``limits`` (``ExecContext.limits``: the
    permitting rule's included) when given, else the profile's; the op's timeout narrows."""
    lim, dflt = limits or profile.limits, SYSTEM_DEFAULT_LIMITS

    def pick(name: str) -> int:
        v = getattr(lim, name)
        return int(v if v is not None else getattr(dflt, name))

    # the effective limits already hold profile.timeout_ms (or a rule's value replacing it)
    own = (lim.timeout_ms,) if limits is not None else (profile.timeout_ms, lim.timeout_ms)
    timeouts = [t for t in (op.timeout_ms, *own) if t]
    return Limits(
        timeout_s=min(timeouts or [pick("timeout_ms")]) / 1000,
        cpu_cores=float(lim.cpu_cores or dflt.cpu_cores or 1.0),
        memory_bytes=pick("memory_bytes"), pids=pick("pids"),
        max_stdout=pick("max_stdout_bytes"), max_stderr=pick("max_stderr_bytes"),
        max_stdin=pick("max_bytes_in"), disk_write=pick("disk_write_bytes"),
    )


def build_env(profile: Profile, op: ProcExecOp, allowed: Iterable[str], base: Mapping[str, str],
              tmpdir: str) -> dict[str, str]:
    """Never inherited: fixed base keys, plus op-supplied values for allow-listed keys only.

    ``GIT_PINS``: git never runs a program named by a file the sandbox can write (repository
    config, hooks, ``~/.gitconfig``, a bare repository in the working directory).
    """
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC",
           **base, "HOME": profile.mappings.home, "TMPDIR": tmpdir, **GIT_PINS}
    allowed_set = set(allowed)
    for key, value in op.env.items():
        if "\x00" in key or "\x00" in value or "=" in key:
            raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                    f"environment variable `{key}` is malformed")
        # second line: the guard decided the env against the policy's allow-lists; the
        # profile's capabilities carry those lists (the operator's env_allow adds keys)
        if key not in allowed_set:
            why = profile_env_refusal(profile, op.tool, {key: value})
            if why is not None:
                raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, why)
        env[key] = value
    return env


def resolve_trusted_links(path: str) -> str:
    """``path`` with the symlinks that only root can change resolved (a link in a directory
    owned by root and writable by no one else: ``/home/u -> /data/u``); from the first link in
    a directory anyone else may write, the rest is kept as written, so the launcher's
    no-symlink open refuses it (a link there may be a swap since the glob was expanded:
    outsider round 7, F01)."""
    parts = [p for p in path.split("/") if p]
    cur = "/"
    for i, name in enumerate(parts):
        nxt = os.path.join(cur, name)
        try:
            if not stat.S_ISLNK(os.lstat(nxt).st_mode):
                cur = nxt
                continue
            parent = os.stat(cur)
        except OSError:
            return os.path.join(cur, *parts[i:])
        if parent.st_uid != 0 or parent.st_mode & 0o022:
            return os.path.join(cur, *parts[i:])
        cur = os.path.realpath(nxt)
    return cur


def build_plan(profile: Profile, op: ProcExecOp, *, env_allow: Iterable[str] = (),
               env_base: Mapping[str, str] | None = None, extra_ro: Iterable[str] = (),
               tmpdir: str = "/tmp", host_roots: Sequence[str] = (),
               foreign_owner: int | None = None, preview: bool = False) -> Plan:
    """Compute the plan; refuses a cwd outside root_fs or outside every bound path.

    ``host_roots`` (the local runner): these trees readable and executable besides the
    profile's paths (what the process's uid may do there; writes stay the profile's), minus
    every existing path under a mandatory deny or a forbid of fs.read and the host runtime
    directories, searched over all of them as binds; the host's network. ``foreign_owner``
    (the sandbox uid, with ``host_roots``): its directories outside the profile's paths are
    masked too (other calls' workspaces, ``policy_engine.sandbox.masks``). ``preview``
    (`sandbox profile`): a whole-host bind is not searched for host-wide globs; they are
    listed in ``Plan.masked_at_run`` (preview_masks.py).
    """
    if any("\x00" in a for a in (op.tool, *op.args)):
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED, "argv contains a NUL byte")
    root = profile.mappings.root_fs.rstrip("/") or "/"
    readable, writable = bound_paths(profile)
    system = system_trees(extra_ro)
    if _warming and not _warmed.is_set():
        _await_warmup()  # one walk of the system trees, not two racing
    bound = readable + writable
    resolved = {p: resolve_trusted_links(p) for p in bound}
    cwd = op.cwd or (root if any(beneath(root, b) for b in bound) else tmpdir)
    named = normalize_path(op.cwd) if op.cwd is not None else cwd  # as decided, unresolved
    if op.cwd is not None:
        cwd = normalize_path(op.cwd)  # what the guard decided on (`//w` is `/w`: round 6, F04)
        # the guard's own check (guard/binds.py); the directory entered is the resolved one
        why = cwd_refusal(profile, cwd, bound)
        if why is not None:
            raise PolicyEngineError(ErrorCode.CAPABILITY_BLOCKED, why)
        cwd = resolve_beneath(root, cwd)
    later: list[str] | None = [] if preview else None
    files, dirs, hidden = _masks(profile, [*host_roots, *bound], system,
                                 foreign_owner=foreign_owner, keep=bound, deferred=later)
    return Plan(
        argv=[op.tool, *op.args], cwd=cwd, readable=readable, writable=writable, system=system,
        env={**build_env(profile, op, env_allow, env_base or {}, tmpdir),
             ARTIFACTS_ENV: artifacts_dir(named)}, mask_files=files,
        mask_dirs=dirs, hidden_dirs=hidden, resolved=resolved,
        readonly=_write_forbidden(profile, writable, files + dirs),
        limits=resolve_limits(profile, op),
        network="on" if host_roots else profile.network.value,
        no_bind=profile.network is NetworkMode.OFF,
        open_trees=list(host_roots), masked_at_run=later or [],
    )


def artifacts_note(op: ExecOp) -> str:
    """The dry run's words for the variable a proc.exec gets (with its cwd's ``fact_notes``);
    the cwd normalized as the plan normalizes it."""
    cwd = op.cwd if isinstance(op, ProcExecOp) else None
    where = f"`{artifacts_dir(normalize_path(cwd))}`" if cwd else "`<cwd>/artifacts`"
    return f"the engine sets {ARTIFACTS_ENV}={where}"
