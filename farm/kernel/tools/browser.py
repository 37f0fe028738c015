"""The ``browser`` global of sessions in the ``browser`` image: Debian's Chromium via Playwright.

Each action returns an :class:`Observation`; a failure is one with ``error`` set, never an
exception or a dead session. Invariants: Chromium starts on first use and lives as long as the
session; the kernel stays stdlib-only (Playwright is imported on first use: ``AVAILABLE``);
requests go only to loopback and the workspace's files, or through the box's egress proxy.
More: docs/design/kernel.md.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from .workspace import Workspace

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
NO_PROXY = ",".join(sorted(LOOPBACK_HOSTS))  # the box's own loopback, as in its NO_PROXY
NAVIGATION_TIMEOUT_S = 20.0
ACTION_TIMEOUT_S = 5.0
OBSERVE_TIMEOUT_S = 5.0
VIEWPORT = {"width": 1280, "height": 800}
CONTENT_CHARS = 20_000
AX_TREE_CHARS = 20_000

# Decided once, when the zygote imports the kernel, without importing Playwright.
AVAILABLE = importlib.util.find_spec("playwright") is not None and os.path.exists(CHROMIUM)

# One page per session: links and forms with a target, and window.open, navigate the page
# itself instead of opening a tab the observations would never show.
SINGLE_TAB_JS = """
document.addEventListener("click", (e) => {
  const a = e.target && e.target.closest ? e.target.closest("a[target]") : null;
  if (a) a.removeAttribute("target");
}, true);
document.addEventListener("submit", (e) => {
  if (e.target && e.target.removeAttribute) e.target.removeAttribute("target");
}, true);
window.open = (url) => { if (url) window.location.href = url; return window; };
"""

# The page's text without scripts and styles, for markdownify.
BODY_HTML_JS = """() => {
  const body = document.body ? document.body.cloneNode(true) : null;
  if (!body) return "";
  body.querySelectorAll("script,style,noscript,template").forEach((e) => e.remove());
  return body.outerHTML;
}"""


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} chars cut ...]"


class Observation(dict[str, Any]):
    """What the browser shows after an action; a dict, rendered as markdown + PNG + JSON."""

    @property
    def ok(self) -> bool:
        return not self.get("error")

    def _repr_png_(self) -> bytes | None:
        data = self.get("screenshot", {}).get("image/png")
        return base64.b64decode(data) if data else None

    def _repr_json_(self) -> dict[str, Any]:
        return {k: v for k, v in self.items() if k != "screenshot"}

    def _repr_markdown_(self) -> str:
        head = f"**{self.get('title') or '(untitled)'}** <{self.get('url')}>"
        if self.get("error"):
            head += f"\n\nerror: {self['error']}"
        return f"{head}\n\n{_clip(str(self.get('content', '')), 2000)}"

    def __repr__(self) -> str:
        error = f" error={self['error']!r}" if self.get("error") else ""
        return f"<Observation url={self.get('url')!r} title={self.get('title')!r}{error}>"


class Browser:
    """One Chromium page per session, started on first use (see docs/design/kernel.md, tools).

    Links and forms that would open a new tab (``target``, ``window.open``) open in that one
    page, so every observation shows where an action led."""

    def __init__(self, workspace: Workspace, proxy: str | None = None) -> None:
        self.workspace = workspace
        # the box's proxy endpoint when it has egress (egress.proxy_env), else no way out
        self.proxy = proxy if proxy is not None else os.environ.get("HTTPS_PROXY")
        self.timeout_s = NAVIGATION_TIMEOUT_S
        self.action_timeout_s = ACTION_TIMEOUT_S
        self._playwright: Any = None
        self._browser: Any = None
        self._page: Any = None

    # --- actions ------------------------------------------------------------------------

    def goto(self, url: str, timeout_s: float | None = None) -> Observation:
        """Open ``url``: http(s) on loopback (or, with egress, its policy's hosts), a workspace file
        (``file:///workspace/x.html`` or just ``x.html``)."""
        return self._act(lambda page: self._goto(page, url, timeout_s))

    def click(self, selector: str) -> Observation:
        """Click the element ``selector`` names and wait for a navigation it starts."""

        def click(page: Any) -> None:
            page.click(selector, timeout=self.action_timeout_s * 1000)
            self._settle(page)

        return self._act(click)

    def type(self, selector: str, text: str, submit: bool = False) -> Observation:
        """Fill the field ``selector`` names with ``text``; press Enter after when ``submit``."""

        def fill(page: Any) -> None:
            page.fill(selector, text, timeout=self.action_timeout_s * 1000)
            if submit:
                page.press(selector, "Enter", timeout=self.action_timeout_s * 1000)
                self._settle(page)

        return self._act(fill)

    def scroll(self, direction: str = "down", pages: float = 1.0) -> Observation:
        """Scroll by ``pages`` viewport heights, ``down`` or ``up``."""
        if direction not in ("down", "up"):
            return self._act(lambda page: self._fail("direction must be 'down' or 'up'"))
        sign = 1 if direction == "down" else -1
        script = f"() => window.scrollBy(0, {sign * pages:f} * window.innerHeight)"
        return self._act(lambda page: page.evaluate(script))

    def back(self) -> Observation:
        """Go back one page in the history."""

        def back(page: Any) -> None:
            if page.go_back(wait_until="load", timeout=self.timeout_s * 1000) is None:
                self._fail("there is no previous page")

        return self._act(back)

    def observe(self) -> Observation:
        """The current page, without acting."""
        return self._act(lambda page: None)

    def close(self) -> None:
        """Stop Chromium and the driver now (the session's end does it anyway)."""
        playwright, self._playwright = self._playwright, None
        browser, self._browser, self._page = self._browser, None, None
        for stop in (browser.close if browser else None, playwright.stop if playwright else None):
            if stop is not None:
                with contextlib.suppress(Exception):  # already gone: nothing left to stop
                    stop()

    def __repr__(self) -> str:
        state = "running" if self._browser is not None else "not started"
        return f"<browser: Chromium ({state}); goto, click, type, scroll, back, observe>"

    # --- machinery ----------------------------------------------------------------------

    def _fail(self, message: str) -> None:
        raise BrowserActionError(message)

    def _act(self, action: Callable[[Any], Any]) -> Observation:
        error: str | None = None
        try:
            page = self._ensure_page()
            action(page)
        except Exception as exc:  # every failure is an observation, never a dead session
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
            if self._gone(exc):
                # Chromium or the driver died: forget them (they cannot be asked anything),
                # so the next call starts a new browser instead of failing forever.
                self.close()
                error += " (the browser is gone; the next call starts a new one)"
        return self._observe(error)

    def _gone(self, exc: Exception) -> bool:
        if type(exc).__name__ == "TargetClosedError" or "connection closed" in str(exc).lower():
            return True
        return self._browser is not None and not self._browser.is_connected()

    def _ensure_page(self) -> Any:
        if self._browser is not None and not self._browser.is_connected():
            self.close()  # crashed or killed: start a new one
        if self._page is not None and not self._page.is_closed():
            return self._page
        if self._browser is None:
            from playwright.sync_api import sync_playwright

            _ignore_sigpipe()

            self._playwright = sync_playwright().start()
            proxy = {"server": self.proxy, "bypass": NO_PROXY} if self.proxy else None
            self._browser = self._playwright.chromium.launch(
                executable_path=CHROMIUM,
                args=CHROMIUM_FLAGS,
                headless=True,
                timeout=30_000,
                proxy=proxy,
            )
        context = self._browser.new_context(viewport=VIEWPORT, service_workers="block")
        context.route("**/*", self._filter)
        context.add_init_script(SINGLE_TAB_JS)
        self._page = context.new_page()
        return self._page

    def _allowed(self, url: str) -> bool:
        parts = urlsplit(url)
        if parts.scheme in ("data", "blob", "about"):
            return True
        if parts.scheme == "file":  # a page, link or resource: only inside the workspace
            try:
                self.workspace.confine(unquote(parts.path))
            except PermissionError:
                return False
            return True
        if parts.scheme not in ("http", "https", "ws", "wss"):
            return False
        host = (parts.hostname or "").lower()
        return host in LOOPBACK_HOSTS or host.startswith("127.") or bool(self.proxy)

    def _filter(self, route: Any, request: Any) -> None:
        if self._allowed(request.url):
            route.continue_()
        else:
            route.abort("blockedbyclient")

    def _goto(self, page: Any, url: str, timeout_s: float | None) -> None:
        parts = urlsplit(url)
        if parts.scheme == "file" or not parts.scheme:
            # A workspace file: confined like every tool's path.
            url = self.workspace.confine(unquote(parts.path) if parts.scheme else url).as_uri()
        elif not self._allowed(url):
            self._fail(
                f"{parts.hostname!r} is not reachable: this box has no egress (loopback and "
                "workspace files only; farm.session(egress=[...]) opens hosts)"
            )
        try:
            page.goto(url, wait_until="load", timeout=(timeout_s or self.timeout_s) * 1000)
        except Exception:
            self._stop_loading()
            raise

    def _settle(self, page: Any) -> None:
        """Wait for a navigation an action started to load (at most the navigation timeout)."""
        try:
            page.wait_for_load_state("load", timeout=self.timeout_s * 1000)
        except Exception:
            self._stop_loading()
            raise

    def _stop_loading(self) -> None:
        """Stop a navigation that timed out, so the page can be observed as it is."""
        with contextlib.suppress(Exception):  # the page is gone; the observation says so
            self._page.context.new_cdp_session(self._page).send("Page.stopLoading")

    def _observe(self, error: str | None) -> Observation:
        obs = Observation(url="", title="", content="", screenshot={}, ax_tree="", error=error)
        page = self._page
        if page is None or page.is_closed():
            return obs
        problems: list[str] = []

        def part(name: str, get: Callable[[], Any]) -> None:
            try:
                obs[name] = get()
            except Exception as exc:  # one broken part must not hide the others
                problems.append(f"{name}: {type(exc).__name__}")

        timeout_ms = OBSERVE_TIMEOUT_S * 1000
        part("url", lambda: page.url)
        part("title", lambda: page.title())
        part("content", lambda: _clip(self._markdown(page.evaluate(BODY_HTML_JS)), CONTENT_CHARS))
        part(
            "screenshot",
            lambda: {
                "image/png": base64.b64encode(
                    page.screenshot(type="png", timeout=timeout_ms)
                ).decode("ascii")
            },
        )
        part(
            "ax_tree",
            lambda: _clip(page.locator("body").aria_snapshot(timeout=timeout_ms), AX_TREE_CHARS),
        )
        if problems and not error:
            obs["error"] = "could not observe " + ", ".join(problems)
        return obs

    @staticmethod
    def _markdown(html: str) -> str:
        from markdownify import markdownify

        text: str = markdownify(html, heading_style="ATX")
        lines = [line.rstrip() for line in text.splitlines()]
        # markdownify leaves runs of blank lines where block elements were.
        out: list[str] = []
        for line in lines:
            if line or (out and out[-1]):
                out.append(line)
        return "\n".join(out).strip()


def _ignore_sigpipe() -> None:
    """A write to a dead driver's pipe must fail with EPIPE, not kill the session.

    Session processes give user code the default SIGPIPE (terminate); Python itself ignores
    it, and so does a session from its first browser start on (the driver's pipe may break at
    any write, even after the browser is forgotten).
    """
    with contextlib.suppress(ValueError):  # not the main thread: cannot change it, keep going
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)


class BrowserActionError(RuntimeError):
    """An action the browser refused before trying it (bad argument, host not allowed)."""
