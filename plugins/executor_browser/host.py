"""One headless Chromium shared by all sessions, owned by one thread; relaunched after a crash.

Playwright's sync objects belong to the thread that created them, so a single worker thread owns
the Playwright driver, the browser and every session's context; callers hand it jobs and wait.
The browser is launched lazily under a lock, checked before every job and relaunched when it
has died (the job that saw the crash fails with ``TOOL.EXECUTION_FAILED``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from plugins.executor_browser.lockdown import WEBRTC_ARGS
from plugins.executor_browser.sink import SINK_HOST
from policy_engine.errors import ErrorCode, PolicyEngineError

T = TypeVar("T")

# Chromium's own network stack is dead-ended: every request is served by the route handler
# (which vets it first), so anything Chromium would fetch by itself (preconnect, DNS prefetch,
# a WebSocket from a worker) goes to the proxy given to BrowserHost (the executor's refusing
# sink, loopback not bypassed) and resolves nothing. WebRTC is held to proxied connections.
CHROMIUM_ARGS: tuple[str, ...] = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--disable-default-apps", "--mute-audio", "--no-pings",
    "--dns-prefetch-disable", "--proxy-bypass-list=<-loopback>",
    f"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE {SINK_HOST}", *WEBRTC_ARGS,
)


@dataclass(slots=True)
class Session:
    """A fresh browser context (its own cookies, cache, storage) and its one page."""

    context: BrowserContext
    page: Page
    generation: int
    last_used: float = field(default_factory=time.monotonic)
    slot: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class _Job(Generic[T]):
    fn: Callable[[BrowserHost], T]
    done: threading.Event = field(default_factory=threading.Event)
    result: T | None = None
    error: BaseException | None = None


class BrowserHost:
    """The single browser instance; ``run`` executes a job on the owning thread.

    :param executable: the Chromium binary (Debian ``chromium``).
    :param session_idle_s: sessions unused for this long are closed.
    :param proxy_server: every connection Chromium opens itself goes there (a refusing sink).
    """

    def __init__(self, executable: str, session_idle_s: float = 300.0,
                 launch_timeout_s: float = 60.0, *, proxy_server: str) -> None:
        self.executable = executable
        self.proxy_server = proxy_server
        self.session_idle_s = session_idle_s
        self.launch_timeout_s = launch_timeout_s
        self.generation = 0
        self.launches = 0
        self.sessions: dict[str, Session] = {}
        self._jobs: queue.Queue[_Job[Any] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pw: Playwright | None = None
        self._browser: Browser | None = None

    # --- caller side -------------------------------------------------------------------------

    def run(self, fn: Callable[[BrowserHost], T], timeout_s: float) -> T:
        """Run ``fn`` on the browser thread; ``LLM.TIMEOUT`` if it has not ended in time."""
        with self._lock:  # INVARIANT: at most one owning thread, started once
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="policy-engine-browser", daemon=True)
                self._thread.start()
        job: _Job[T] = _Job(fn)
        self._jobs.put(job)
        if not job.done.wait(max(timeout_s, 0.0)):
            raise PolicyEngineError(ErrorCode.TIMEOUT, "browser operation exceeded its deadline")
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]  # set whenever error is None

    def close(self) -> None:
        """Close every session and the browser, and stop the owning thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive():
            self._jobs.put(None)
            thread.join(timeout=30)

    # --- browser thread ----------------------------------------------------------------------

    def browser(self) -> Browser:
        """The live browser, launched (or relaunched after a crash) on first use."""
        if self._browser is not None and self._browser.is_connected():
            return self._browser
        if self._browser is not None:  # it died: its contexts are gone with it
            self.sessions.clear()
        if not os.access(self.executable, os.X_OK):
            raise PolicyEngineError(
                ErrorCode.PROVIDER_UNAVAILABLE,
                f"chromium not found at `{self.executable}`; install the Debian package "
                "`chromium`",
            )
        if self._pw is None:
            self._pw = sync_playwright().start()
        try:
            self._browser = self._pw.chromium.launch(
                executable_path=self.executable,
                args=[*CHROMIUM_ARGS, f"--proxy-server={self.proxy_server}"], headless=True,
                timeout=self.launch_timeout_s * 1000, chromium_sandbox=False,
            )
        except PlaywrightError as exc:
            self._browser = None
            raise PolicyEngineError(
                ErrorCode.PROVIDER_UNAVAILABLE, "chromium failed to start",
                audit={"error": str(exc)[:2000]},
            ) from None
        self.generation += 1
        self.launches += 1
        return self._browser

    def alive(self) -> bool:
        """Whether the browser answers: a context can still be opened and closed."""
        if self._browser is None or not self._browser.is_connected():
            return False
        try:
            self._browser.new_context().close()
        except PlaywrightError:
            return False
        return True

    def session(self, key: str,
                make: Callable[[Browser, dict[str, Any]], BrowserContext]) -> Session:
        """The session ``key``: reused while its browser lives, else a fresh context.

        :param make: builds the context; its handlers read the per-op state from the slot.
        """
        self._expire_idle()
        browser = self.browser()
        current = self.sessions.get(key)
        if current is not None and current.generation == self.generation \
                and not current.page.is_closed():
            current.last_used = time.monotonic()
            return current
        if current is not None:
            self.drop_session(key)
        slot: dict[str, Any] = {}
        context = make(browser, slot)
        created = Session(context=context, page=context.new_page(), generation=self.generation,
                          slot=slot)
        self.sessions[key] = created
        return created

    def drop_session(self, key: str) -> None:
        """Close one session's context (a no-op when it is gone or its browser died)."""
        sess = self.sessions.pop(key, None)
        if sess is not None and sess.generation == self.generation and self.alive():
            with contextlib.suppress(PlaywrightError):
                sess.context.close()

    def kill_browser(self) -> None:
        """Forget the browser after a crash or a stuck job so the next job relaunches it."""
        browser, self._browser = self._browser, None
        self.sessions.clear()
        if browser is not None:
            with contextlib.suppress(PlaywrightError):
                browser.close()

    def _expire_idle(self) -> None:
        now = time.monotonic()
        for key in [k for k, s in self.sessions.items()
                    if now - s.last_used > self.session_idle_s]:
            self.drop_session(key)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                break
            try:
                job.result = job.fn(self)
            except BaseException as exc:  # noqa: BLE001 -- handed back to the waiting caller
                job.error = exc
            finally:
                job.done.set()
        for key in list(self.sessions):
            self.drop_session(key)
        self.kill_browser()
        if self._pw is not None:
            self._pw.stop()
            self._pw = None
