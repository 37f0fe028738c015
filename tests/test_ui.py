"""``farm ui``: the live transcript page, served by the real command against a real farm, and
looked at in a real headless Chromium (Debian's ``chromium``, installed by scripts/bootstrap)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.client import Farm
from farm.local.redis_server import free_port
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FARM = str(Path(sys.executable).parent / "farm")
ARTIFACTS = Path(__file__).parent / "artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHOW = """
import base64
class Chart:
    def _repr_png_(self):
        return base64.b64decode(
            'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=='
        )
class Note:
    def _repr_markdown_(self):
        return '**markdown works**'
class Table:
    def _repr_html_(self):
        return '<table><tr><td>html cell</td></tr></table>'
"""


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture
def ui_url(farm: Farm) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "FARM_BROKER_URL": farm.settings.broker_url}
    proc = subprocess.Popen(
        [FARM, "ui", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def answers() -> bool:
            try:
                get_json(f"{url}/api/workers")
            except OSError:
                return proc.poll() is not None  # it exited: stop waiting, fail below
            return True

        assert wait_for(answers, 30, 0.1) and proc.poll() is None, "farm ui did not start"
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()


def test_the_api_lists_workers_and_sessions_and_streams_a_transcript(
    farm: Farm, ui_url: str
) -> None:
    assert {w["id"] for w in get_json(f"{ui_url}/api/workers")} == {w["id"] for w in farm.workers()}
    with farm.session() as s:
        s.run("print('over sse')")
        assert s.id in {row["id"] for row in get_json(f"{ui_url}/api/sessions")}
        request = urllib.request.Request(f"{ui_url}/api/sessions/{s.id}/events")
        items = []
        with urllib.request.urlopen(request, timeout=10) as response:
            for raw in response:
                line = raw.decode()
                if line.startswith("data: "):
                    items.append(json.loads(line[6:]))
                if items and items[-1]["type"] == "exec_end":
                    break
    assert [i["type"] for i in items] == ["exec_start", "stream", "exec_end"]
    assert items[1]["data"]["text/plain"] == "over sse\n"
    assert "<pre>" in items[1]["html"] and "over sse" in items[1]["html"]


def test_the_page_shows_a_sessions_output_as_it_runs(farm: Farm, ui_url: str) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with farm.session() as s:
        s.run(SHOW)
        with sync_playwright() as p:
            # Playwright gives the browser a fresh temporary profile (--user-data-dir) itself
            browser = p.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS
            )
            try:
                page = browser.new_page(viewport={"width": 1200, "height": 800})
                page.goto(f"{ui_url}/#session={s.id}")
                page.wait_for_selector(f"#workers >> text={s.worker}", timeout=15_000)
                page.wait_for_selector("#transcript .exec_end", timeout=15_000)  # SHOW's cell
                # the page is open: now the code runs, and its output must appear there
                s.run("print('hello from the sandbox')\ndisplay(Chart())\ndisplay(Note())\nTable()")
                page.wait_for_selector("#transcript >> text=hello from the sandbox", timeout=15_000)
                page.wait_for_selector("#transcript img[src^='data:image/png']", timeout=15_000)
                page.wait_for_selector("#transcript strong >> text=markdown works", timeout=15_000)
                frame = page.wait_for_selector("#transcript iframe[sandbox]", timeout=15_000)
                assert "html cell" in (frame.get_attribute("srcdoc") or "")
                page.screenshot(path=str(ARTIFACTS / "ui.png"), full_page=True)
            finally:
                browser.close()
    assert (ARTIFACTS / "ui.png").stat().st_size > 1000
