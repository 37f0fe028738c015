"""The ``browser`` global in the browser image: a real Chromium in a real sandbox (``--network
none``) through a local farm, browsing a small site served from inside the sandbox, and a page
of the host through the box's egress proxy."""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from farm.client import Farm, Session
from farm.local.embedded import LocalFarm
from farm.models import ExecResult
from farm.sandbox.variants import ensure_variant_image
from tests.conftest import remove_image_tags
from tests.http_servers import bridge_address, http_server

pytestmark = [pytest.mark.docker, pytest.mark.slow]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# A site on the sandbox's loopback, served by a thread of the session itself: a home page with
# a form and a link, the form's target, an about page, and a page that never answers.
SITE = r"""
import html, http.server, threading, urllib.parse

class Site(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/hang":
            self.server.release.wait(300)
            return
        if url.path == "/":
            title, body = "Home", (
                "<h1>Welcome</h1><form action='/greet'><label for='name'>Name</label>"
                "<input id='name' name='name'><button id='go' type='submit'>Greet</button>"
                "</form><p><a id='about' href='/about'>About us</a></p>"
                "<p><a id='popup' href='/about' target='_blank'>In a new tab</a></p>"
                + "<p>filler</p>" * 300 + "<p id='bottom'>Bottom</p>"
            )
        elif url.path == "/about":
            title, body = "About", "<h1>About farm</h1><p>We run code.</p>"
        elif url.path == "/greet":
            name = urllib.parse.parse_qs(url.query).get("name", ["?"])[0]
            title, body = "Greeting", f"<h1>Hello, {html.escape(name)}!</h1>"
        else:
            self.send_error(404)
            return
        page = f"<html><head><title>{title}</title></head><body>{body}</body></html>".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Site)
site.daemon_threads = True
site.release = threading.Event()
threading.Thread(target=site.serve_forever, daemon=True).start()
home = f"http://127.0.0.1:{site.server_port}/"
"""

CHROMIUM_PIDS = r"""
import os
def pids_of(program):
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if program in f.read().split(b"\0")[0]:
                    pids.append(int(pid))
        except OSError:
            pass
    return pids

def chromium_pids():
    return pids_of(b"chromium")

def kill_all(program):
    killed = 0
    for pid in pids_of(program):
        try:
            os.kill(pid, 9)
            killed += 1
        except ProcessLookupError:  # exited since the scan (a renderer, say)
            pass
    return killed

def own_chromium_pids():  # Chromium processes descending from this session's process
    def ancestors(pid):
        while pid > 1:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                return
            yield pid
    return [p for p in chromium_pids() if os.getpid() in ancestors(p)]
"""


@pytest.fixture(scope="module")
def browser_farm(docker_env: Any) -> Iterator[Farm]:
    ensure_variant_image("browser", docker_env)
    with Farm.local(images={"browser": 1}) as farm:
        yield farm


@pytest.fixture(scope="module")
def web(browser_farm: Farm) -> Iterator[Session]:
    with browser_farm.session(image="browser") as session:
        session.run(SITE).raise_for_error()
        yield session


@contextlib.contextmanager
def _removed_after(docker_env: Any, tag: str) -> Iterator[None]:
    """A test-only image: removed after the test (its layers are the browser image's), with
    the pinned tag its build also got (``images.pinned_tag``)."""
    try:
        yield
    finally:
        remove_image_tags(docker_env, tag)


def observe(session: Session, code: str, timeout_s: float = 60) -> dict[str, Any]:
    """Run ``code`` (ending in a browser action) and return its observation as the client
    gets it: the JSON of the value's MIME bundle, plus the PNG it carries."""
    result: ExecResult = session.run(code, timeout_s=timeout_s)
    assert result.ok, result.error
    assert result.value is not None
    obs: dict[str, Any] = dict(result.value.data["application/json"])
    png = result.value.data.get("image/png")
    obs["png"] = base64.b64decode(png) if png else b""
    return obs


def test_navigate_fill_click_and_read_the_result(web: Session) -> None:
    obs = observe(web, "browser.goto(home)")
    assert obs["error"] is None
    assert obs["title"] == "Home"
    assert obs["url"].startswith("http://127.0.0.1:")
    assert "# Welcome" in obs["content"] and "[About us](/about)" in obs["content"]
    assert obs["png"].startswith(PNG_MAGIC) and len(obs["png"]) > 1000
    assert 'textbox "Name"' in obs["ax_tree"] and 'button "Greet"' in obs["ax_tree"]

    assert observe(web, "browser.type('#name', 'Ada Lovelace')")["error"] is None
    obs = observe(web, "browser.click('#go')")
    assert obs["error"] is None
    assert obs["title"] == "Greeting"
    assert "/greet?name=Ada+Lovelace" in obs["url"]
    assert "# Hello, Ada Lovelace!" in obs["content"]

    obs = observe(web, "browser.back()")
    assert obs["title"] == "Home"
    obs = observe(web, "browser.click('text=About us')")
    assert (obs["title"], obs["error"]) == ("About", None)
    assert "We run code." in obs["content"]


def test_a_link_that_opens_a_new_tab_is_followed_there(web: Session) -> None:
    observe(web, "browser.goto(home)")
    obs = observe(web, "browser.click('#popup')")
    assert (obs["title"], obs["error"]) == ("About", None)
    assert "We run code." in obs["content"]


def test_typing_with_submit_sends_the_form(web: Session) -> None:
    observe(web, "browser.goto(home)")
    obs = observe(web, "browser.type('#name', 'Grace', submit=True)")
    assert obs["error"] is None
    assert "# Hello, Grace!" in obs["content"]


def test_an_observation_is_a_dict_with_a_png_mime_bundle_in_the_session(web: Session) -> None:
    result = web.run(
        "obs = browser.goto(home)\n"
        "sorted(obs), sorted(obs['screenshot']), obs['screenshot']['image/png'][:8]"
    )
    assert result.ok, result.error
    assert result.value is not None
    keys, mimes, head = eval(result.value.text)
    assert keys == ["ax_tree", "content", "error", "screenshot", "title", "url"]
    assert mimes == ["image/png"]
    assert base64.b64decode(head + "=" * (-len(head) % 4)).startswith(PNG_MAGIC[:6])


def test_scroll_moves_down_and_up(web: Session) -> None:
    observe(web, "browser.goto(home)")
    assert observe(web, "browser.scroll()")["error"] is None
    down = web.run("browser._page.evaluate('window.scrollY')")
    assert down.value is not None and float(down.value.text) > 0
    observe(web, "browser.scroll('up', pages=10)")
    up = web.run("browser._page.evaluate('window.scrollY')")
    assert up.value is not None and float(up.value.text) == 0


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("browser.click('#no-such-element')", "Timeout"),
        ("browser.type('#missing', 'x')", "Timeout"),
        ("browser.goto('http://example.com/')", "this box has no egress"),
        ("browser.goto('file:///etc/passwd')", "outside the workspace"),
        ("browser.goto('http://127.0.0.1:59999/')", "ERR_CONNECTION_REFUSED"),
        ("browser.scroll('sideways')", "direction must be"),
    ],
    ids=["click-missing", "type-missing", "egress", "file-outside", "refused", "bad-arg"],
)
def test_errors_are_observations_and_the_session_lives_on(
    web: Session, code: str, error: str
) -> None:
    observe(web, "browser.goto(home)")
    obs = observe(
        web,
        f"browser.action_timeout_s = 1\ntry:\n    obs = {code}\nfinally:\n"
        "    browser.action_timeout_s = 5\nobs",
    )
    assert obs["error"] and error in obs["error"], obs["error"]
    assert observe(web, "browser.goto(home)")["error"] is None


def test_a_page_that_never_finishes_loading_hits_the_navigation_timeout(web: Session) -> None:
    started = time.monotonic()
    obs = observe(web, "browser.goto(home + 'hang', timeout_s=2)")
    assert time.monotonic() - started < 20
    assert obs["error"] and "Timeout 2000ms exceeded" in obs["error"]
    obs = observe(web, "browser.goto(home)")
    assert (obs["title"], obs["error"]) == ("Home", None)


def test_workspace_files_open_by_path(web: Session) -> None:
    web.files.write("pages/local.html", "<title>Local</title><h2>From the workspace</h2>")
    obs = observe(web, "browser.goto('pages/local.html')")
    assert (obs["title"], obs["error"]) == ("Local", None)
    workspace = web.run("import os; os.getcwd()").value.text.strip("'")  # type: ignore[union-attr]
    assert workspace == "/workspace"  # the session's own box's
    assert obs["url"] == f"file://{workspace}/pages/local.html"
    assert "## From the workspace" in obs["content"]


def test_a_sibling_boxs_files_are_out_of_reach(browser_farm: Farm, web: Session) -> None:
    """Two sessions on the one browser worker share its sandbox, not their files: the
    sibling's page at ``file:///workspace/secret.html`` is its own, and the same URL in the
    other session (by ``goto`` and by a link in a page of its own) finds no such file; a file
    outside the workspace is refused as before."""
    with browser_farm.session(image="browser") as sibling:
        assert sibling.worker == web.worker
        sibling.files.write("secret.html", "<title>Secret</title><h2>the sibling's secret</h2>")
        url = "file:///workspace/secret.html"
        assert observe(sibling, f"browser.goto({url!r})")["title"] == "Secret"
        obs = observe(web, f"browser.goto({url!r})")
        assert obs["title"] != "Secret" and "the sibling's secret" not in obs["content"], obs
        web.files.write("to-sibling.html", f"<title>Mine</title><a id='go' href='{url}'>go</a>")
        assert observe(web, "browser.goto('to-sibling.html')")["title"] == "Mine"
        obs = observe(web, "browser.click('#go')")
        assert obs["title"] != "Secret" and "the sibling's secret" not in obs["content"], obs
        obs = observe(web, "browser.goto('file:///etc/hostname')")
        assert obs["error"] and "outside the workspace" in obs["error"], obs["error"]


@pytest.mark.parametrize("program", [b"chromium", b"playwright/driver/node"])
def test_a_killed_browser_is_started_again(web: Session, program: bytes) -> None:
    web.run(CHROMIUM_PIDS).raise_for_error()
    observe(web, "browser.goto(home)")
    killed = web.run(f"kill_all({program!r})")
    assert killed.value is not None and int(killed.value.text) > 0, killed
    observations = [observe(web, "browser.goto(home)") for _ in range(2)]
    assert observations[-1]["error"] is None, observations
    assert observations[-1]["title"] == "Home"


def test_the_browser_lives_as_long_as_the_session(browser_farm: Farm) -> None:
    with browser_farm.session(image="browser") as first:
        first.run(CHROMIUM_PIDS).raise_for_error()
        assert first.run("own_chromium_pids()").value.text == "[]"  # type: ignore[union-attr]
        first.files.write("a.html", "<title>A</title>")
        assert observe(first, "browser.goto('a.html')")["title"] == "A"
        running = first.run("own_chromium_pids()")
        assert running.value is not None
        pids = eval(running.value.text)
        assert pids
    with browser_farm.session(image="browser") as second:
        # the first session's Chromium exits when its driver's pipe closes: wait for that
        left = second.run(
            f"import os, time\npids = {pids!r}\ndeadline = time.monotonic() + 20\n"
            "alive = lambda: [p for p in pids if os.path.exists(f'/proc/{p}')]\n"
            "while alive() and time.monotonic() < deadline:\n"
            "    time.sleep(0.1)  # poll interval of the deadline-bounded wait\n"
            "alive()",
            timeout_s=40,
        )
        assert left.value is not None and left.value.text == "[]"


def test_the_browser_image_has_its_own_limits(web: Session, docker_env: Any) -> None:
    (container,) = docker_env.containers.list(
        ignore_removed=True, filters={"label": f"farm.owner={web.worker}"}
    )
    host = container.attrs["HostConfig"]
    # IMAGE_LIMITS["browser"], and the boxes' disks (tmpfs) beside it
    assert host["Memory"] == (2048 + 6144) * 1024 * 1024
    assert host["PidsLimit"] == 4096
    assert host["NetworkMode"] == "none"


def test_an_exec_timeout_during_an_action_leaves_a_working_browser(web: Session) -> None:
    result = web.run("browser.goto(home + 'hang', timeout_s=120)", timeout_s=3)
    assert result.error is not None and result.error.kind == "timeout"
    observations = [observe(web, "browser.goto(home)") for _ in range(2)]
    assert observations[-1]["error"] is None, observations
    assert observations[-1]["title"] == "Home"


def test_a_directory_served_by_python_m_http_server(web: Session) -> None:
    web.files.write("served/index.html", "<title>Served</title><p>from http.server</p>")
    started = web.run(
        "import socket, time\n"
        "pid = int(bash('python3 -m http.server 8123 --bind 127.0.0.1 --directory served "
        ">/dev/null 2>&1 & echo $!').split()[0])\n"
        "deadline = time.monotonic() + 20\n"
        "while True:\n"
        "    try:\n"
        "        socket.create_connection(('127.0.0.1', 8123), timeout=1).close()\n"
        "        break\n"
        "    except OSError:\n"
        "        if time.monotonic() > deadline:\n"
        "            raise\n"
        "        time.sleep(0.05)  # poll interval of the deadline-bounded readiness check\n",
        timeout_s=40,
    )
    assert started.ok, started.error
    try:
        obs = observe(web, "browser.goto('http://localhost:8123/')")
        assert (obs["title"], obs["error"]) == ("Served", None)
        assert "from http.server" in obs["content"]
    finally:
        web.run("import os, signal\nos.kill(pid, signal.SIGTERM)").raise_for_error()


def test_the_hosts_address_on_the_bridge_needs_no_gateway_from_docker(docker_env: Any) -> None:
    """A newer dockerd's bridge network names no gateway in its IPAM config: the address the
    egress test serves on comes from the bridge's interface, on this host and not loopback."""
    attrs = docker_env.networks.get("bridge").attrs
    configs = [{k: v for k, v in c.items() if k != "Gateway"} for c in attrs["IPAM"]["Config"]]
    address = ipaddress.ip_address(
        bridge_address({**attrs, "IPAM": {**attrs["IPAM"], "Config": configs}})
    )
    assert any(address in ipaddress.ip_network(c["Subnet"]) for c in configs), (address, configs)
    assert not address.is_loopback and not address.is_link_local
    with socket.socket() as server:
        server.bind((str(address), 0))  # this host's own


def test_the_browser_goes_out_only_through_its_boxs_egress_policy(docker_env: Any) -> None:
    """One way out for the browser too: in a box with egress, Chromium uses the box's proxy
    and the worker's policy decides (an allowed host is served, another refused, each one
    recorded); without egress it requests loopback and workspace files only."""
    address = bridge_address(docker_env.networks.get("bridge").attrs)
    page = b"<html><head><title>Outside</title></head><body>a page of the host</body></html>"
    with http_server(lambda _: page, address, "text/html") as port:
        allowed = f"{address}:{port}"
        env = {"FARM_EGRESS_ALLOW": f"{allowed},example.org", "FARM_EGRESS_ALLOW_PRIVATE": address}
        local = LocalFarm({"browser": 1}, env=env).start()
        with (
            Farm(local.settings(), owned=local) as farm,
            farm.session(image="browser", egress=[allowed]) as out,
        ):
            seen = observe(out, f"browser.goto('http://{allowed}/')")
            assert (seen["title"], seen["error"]) == ("Outside", None)
            other = observe(out, "browser.goto('http://example.org/')")
            assert "not in this box's egress policy" in f"{other['content']} {other['error']}"
            hosts = [(e.host, e.allowed) for e in farm.replay(out.id) if e.type == "egress"]
            assert (address, True) in hosts and ("example.org", False) in hosts
            with farm.session(image="browser") as closed:
                shut = observe(closed, f"browser.goto('http://{allowed}/')")
            assert "this box has no egress" in str(shut["error"])
