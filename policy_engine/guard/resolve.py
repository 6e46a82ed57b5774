"""Decision steps 0 and 2: an operation checked for shape and its resource resolved.

Everything the later steps match on is the resolved value: the normalized, symlink-free path,
the parsed URL, the argv. The CEL ``request`` is built from the same values, lazily, only when a
condition is evaluated.
"""

from __future__ import annotations

import binascii
import datetime as _dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError

from policy_engine.dsl.cel import to_cel_value
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.guard.argv import check_argv_shape
from policy_engine.guard.compiled import CompiledProfile
from policy_engine.guard.env import check_env_shape
from policy_engine.guard.fields import GOOD_METHODS, check_headers, check_method, check_selector
from policy_engine.guard.nofollow import MISSING, NO_LINK, Stat, probe, real_path
from policy_engine.guard.paths import (
    is_beneath,
    normalize_path,
    path_blocked,
    quote,
    resolve_within,
)
from policy_engine.guard.urls import ParsedUrl, parse_url
from policy_engine.model import OP_CAPABILITY, ExecOp

OP_KIND: dict[str, str] = {str(k): str(v) for k, v in OP_CAPABILITY.items()}
"""Op kind → capability kind, as plain strings for the hot path."""


@cache
def _op_adapter() -> TypeAdapter[Any]:
    # built on first use: a caller passing model ops (explain, the orchestrator) never needs it
    return TypeAdapter(ExecOp)


def coerce_op(op: object) -> Any:
    """Step 0: a model op passes; a mapping is validated; anything else is malformed."""
    if isinstance(op, Mapping):
        try:
            return _op_adapter().validate_python(op)
        except ValidationError as exc:
            raise PolicyEngineError(
                ErrorCode.SCHEMA_VALIDATION_FAILED,
                f"operation is malformed: {exc.error_count()} validation error(s)",
                audit={"errors": exc.errors(include_url=False)},
            ) from None
    raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                            "operation kind does not map to a capability")


def decoded_size(b64: str | None, what: str) -> int:
    """Length of base64 content, refusing malformed input (it is what the executor decodes)."""
    if not b64:
        return 0
    try:
        return len(binascii.a2b_base64(b64, strict_mode=True))
    except (binascii.Error, ValueError):
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                f"{what} is not valid base64") from None


def resolve_path(cp: CompiledProfile, raw: str, follow: bool) -> str:
    """Normalize, then resolve symlinks beneath the root that contains the path.

    Paths under neither the fs root nor the tmp dir are resolved against ``/`` so that a link is
    still judged by its real target (a forbid on ``/etc/shadow`` sees through ``/data/x``).
    """
    return resolve_fs(cp, raw, follow, False)[0]


ABSENT: Final = "absent"
"""``resolve_fs``: the probe found a component missing (nothing to ``lstat``)."""
Facts = Stat | str | None
"""What ``resolve_fs`` learnt of the file: its mode and size (``nofollow.Stat``), :data:`ABSENT`,
or ``None`` (nothing: ``fsfacts.fs_refusal`` asks the disk itself)."""


def resolve_fs(cp: CompiledProfile, raw: str, follow: bool,
               facts: bool) -> tuple[str, Facts, bool, str | None]:
    """:func:`resolve_path`, what its one ``openat2`` probe saw of the file (with ``facts``:
    the guard's fs facts need no second walk of the path), whether the resolved path lies
    beneath the fs root or the tmp dir (where an fs.write may go), and the path as written
    (normalized) when resolving its links changed it, else ``None``.

    A path resolved beneath the root or tmp dir stays beneath it (a link leaving it is
    refused), so only a path resolved against ``/`` is tested again. The root itself is
    trusted only while it is its own real path: a root given through a symlink (or re-pointed
    into one later) refuses every path beneath it, as the fs executor refuses to open it
    (outsider rounds 10 and 11: its real name is what the forbids must see, and a link can be
    re-pointed between any two reads of it).
    """
    return resolve_normal(cp, normalize_path(raw), follow, facts)


def resolve_normal(cp: CompiledProfile, path: str, follow: bool,
                   facts: bool) -> tuple[str, Facts, bool, str | None]:
    """:func:`resolve_fs` of a path already normalized (``normalize_path``): the guard's fs
    step normalizes it itself, with ``normalize_path``'s fast path spelt out."""
    # ``is_beneath`` spelt out (a call less per root tested): this runs on every fs decision
    root = cp.root_fs
    inside = True
    if root != "/" and path != root and not (path.startswith(root) and path[len(root)] == "/"):
        root = cp.tmp_dir
        if root != "/" and path != root and not (path.startswith(root) and
                                                 path[len(root)] == "/"):
            root, inside = "/", False
    if not follow:
        return path, None, inside, None
    # one openat2 answers for every component, the root's own too, when none is a link
    found, st = probe(path, facts)
    if found == NO_LINK:
        return path, st, inside, None
    if found == MISSING:
        return path, ABSENT, inside, None
    if root != "/":
        what = f"the {'fs root' if root == cp.root_fs else 'tmp dir'} {quote(root)}"
        try:
            real = real_path(root)
        except OSError:  # changed while realpath read it (a link swapped for a directory)
            raise path_blocked(f"{what} changed while it was being resolved", path) from None
        if real != root:
            raise path_blocked(f"{what} has a symlink on its path (it is {quote(real)}): "
                                "configure its real path", path)
    resolved = resolve_within(root, path, probed=True)
    return (resolved, None,
            inside or is_beneath(cp.root_fs, resolved) or is_beneath(cp.tmp_dir, resolved),
            path if resolved != path else None)


@dataclass(slots=True, init=False)
class Resolved:
    """Step 2's output for the kinds other than the fs fast path; built by the resolvers below
    as ``Resolved()`` then slot by slot (no ``__init__``: its frame, on every decision of these
    kinds, cost more than the rest of building it; benchmarks/bench_guard_ab.py).

    :attr label: what the public description starts with (the method or browser action; the
        tool of a proc.exec); the description itself is built only for a deny or a trace.
    """

    kind: str
    res: object
    url: ParsedUrl | None = None
    size: int | None = None
    label: str = ""

    def describe(self) -> str:
        """The public text of the resource (a URL's query is left out: it often carries
        tokens)."""
        if self.url is not None:
            u = self.url
            return quote(f"{self.label} {u.scheme}://{u.netloc}{u.path}")
        if self.kind == "proc.exec":
            return quote(self.label)
        if self.kind == "tmp.alloc":
            return f"{self.size} bytes"
        return f"`{self.label}`"


_OPEN = frozenset({"open"})
_OPEN_EXTRACT = frozenset({"open", "extract"})
_SCREENSHOT = frozenset({"screenshot"})


def resolve_other(kind: str, op: Any) -> Resolved:
    """Resolve a net, browser, proc or tmp operation."""
    resolver = RESOLVERS.get(kind)
    if resolver is None:
        raise PolicyEngineError(ErrorCode.SCHEMA_VALIDATION_FAILED,
                                f"operation kind {quote(kind)} does not map to a capability")
    return resolver(op)




def _net_http(op: Any) -> Resolved:
    raw = op.method
    # a method checked before, without the call (a subclass of str is never a key there)
    method = GOOD_METHODS.get(raw) if type(raw) is str else None
    if method is None:
        method = check_method(raw)
    url = parse_url(op.url)
    if op.headers:
        check_headers(op.headers)
    body = op.body_b64
    rv = Resolved()
    rv.kind = "net.http"
    rv.res = (url, method)
    rv.url = url
    rv.label = method
    rv.size = decoded_size(body, "body") if body else 0
    return rv


def _browser_nav(op: Any) -> Resolved:
    url = parse_url(op.url)
    rv = Resolved()
    rv.kind = "browser.nav"
    rv.url = url
    rv.size = None
    rv.label = "open"
    rv.res = (url, _OPEN_EXTRACT if op.extract != "none" else _OPEN)
    return rv


def _browser_screenshot(op: Any) -> Resolved:
    check_selector(op.selector)
    shot_url = parse_url(op.url) if op.url else None
    rv = Resolved()
    rv.kind = "browser.screenshot"
    rv.res = (shot_url, _SCREENSHOT)
    rv.url = shot_url
    rv.size = None
    rv.label = "screenshot"
    return rv


def _proc_exec(op: Any) -> Resolved:
    tool = op.tool  # each field read once (an op is frozen)
    args = op.args
    check_argv_shape(tool, args)
    env = op.env
    if env:
        check_env_shape(env)
    stdin = op.stdin_b64
    if stdin:
        decoded_size(stdin, "stdin_b64")
    rv = Resolved()
    rv.kind = "proc.exec"
    rv.res = (tool, tuple(args))
    rv.url = rv.size = None
    rv.label = tool
    return rv


def _tmp_alloc(op: Any) -> Resolved:
    size = op.size_bytes
    rv = Resolved()
    rv.kind = "tmp.alloc"
    rv.res = rv.size = size
    rv.url = None
    rv.label = ""
    return rv


RESOLVERS: dict[str, Callable[[Any], Resolved]] = {
    "net.http": _net_http, "browser.nav": _browser_nav, "browser.screenshot": _browser_screenshot,
    "proc.exec": _proc_exec, "tmp.alloc": _tmp_alloc,
}
"""Per op kind other than the fs ones, its resolver (``resolve_other``)."""


def build_context(
    cp: CompiledProfile, op: Any, kind: str, path: str | None, rv: Resolved | None,
    now_ms: int, extra: Mapping[str, object] | None,
) -> dict[str, object]:
    """The CEL context, only the variables the profile's conditions read (``cp.needs``).

    The caller's ``grant``, ``manifest``, ``tenant`` and ``subject`` win over the per-profile
    views; ``request``, ``profile`` and ``now`` are always the guard's. Every value is plain
    (JSON-like, ``now`` a ``datetime``), as ``CelCondition.evaluate_plain`` reads it.
    """
    needs = cp.needs
    ctx: dict[str, object]
    if extra:
        ctx = {}
        for key, value in extra.items():
            if needs is None or key in needs:
                ctx[key] = to_cel_value(value)
        for key, view in cp.context_views:
            if key == "profile" or key not in ctx:
                ctx[key] = view
    else:
        ctx = dict(cp.context_views)
    if needs is None or "request" in needs:
        ctx["request"] = _request(op, kind, path, rv)
    if needs is None or "now" in needs:
        ctx["now"] = _dt.datetime.fromtimestamp(now_ms / 1000, tz=_dt.UTC)
    return ctx


def _request(op: Any, kind: str, path: str | None, rv: Resolved | None) -> dict[str, object]:
    request: dict[str, object] = op.model_dump(mode="json")
    request["kind"] = kind
    if path is not None:
        request["path"] = path
        if kind == "fs.write":
            request["size"] = decoded_size(op.bytes_b64, "content")
    if rv is not None:
        if rv.url is not None:
            u = rv.url
            request.update(scheme=u.scheme, host=u.host, port=u.port, path=u.path,
                           query=u.query or "")
        if kind == "net.http":
            request["method"] = rv.label
            request["size"] = rv.size or 0
        if kind == "proc.exec":
            request["tool"] = op.tool
            request["args"] = list(op.args)
        if kind == "tmp.alloc":
            request["size"] = op.size_bytes
    return request
