"""The real ``farm`` CLI against a local farm of ``farm up --backend process`` (a real
redis-server and a real worker process, no Docker): what ``status`` and ``doctor`` show."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.local.processes import pid_alive
from farm.local.redis_server import free_port

FARM = str(Path(sys.executable).parent / "farm")


def cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FARM, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], dict[str, Any]]]:
    """``farm up`` of one worker over the process backend, recorded in a state file of its own
    (and no FARM_BROKER_URL: commands find it the way a user's do); ``farm down`` at the end."""
    state_file = tmp_path_factory.mktemp("up") / "state.json"
    env = {**os.environ, "FARM_STATE_FILE": str(state_file)}
    env.pop("FARM_BROKER_URL", None)
    started = cli("up", "--workers", "1", "--backend", "process", env=env)
    assert started.returncode == 0, started.stderr
    state = json.loads(state_file.read_text())
    try:
        yield env, state
    finally:
        down = cli("down", env=env)
        assert down.returncode == 0, down.stderr
        assert not pid_alive(state["pid"])


def port_of(url: str) -> int:
    match = re.search(r":(\d+)/", url)
    assert match, url
    return int(match.group(1))


def doctor(env: dict[str, str]) -> str:
    """``farm doctor``'s output, wide enough that no line wraps. Docker is pointed at a socket
    that does not exist: these tests are about the broker, and doctor stops before the image
    and the kernel round trip when Docker does not answer."""
    ran = cli("doctor", env={**env, "COLUMNS": "300", "DOCKER_HOST": "unix:///nonexistent.sock"})
    assert ran.returncode == 1, ran.stdout + ran.stderr  # Docker's check fails, as arranged
    return ran.stdout


def test_doctor_checks_the_farm_that_farm_up_recorded(up: tuple[dict[str, str], Any]) -> None:
    """The broker ``farm run`` uses (tests/test_cli.py runs code through it), not the
    default ``redis://127.0.0.1:6379/0`` that nothing listens on."""
    env, state = up
    port = port_of(state["broker_url"])
    out = doctor(env)
    assert f"ok  broker: redis://:**@127.0.0.1:{port}/0 answers" in out, out
    assert "FAIL  broker" not in out, out


def test_doctor_checks_farm_broker_url_over_the_recorded_farm(
    up: tuple[dict[str, str], Any],
) -> None:
    env, _ = up
    nobody = free_port()
    out = doctor({**env, "FARM_BROKER_URL": f"redis://127.0.0.1:{nobody}/0"})
    assert f"FAIL  broker: cannot reach the broker at redis://127.0.0.1:{nobody}/0" in out, out


def status(env: dict[str, str], columns: int) -> str:
    ran = cli("status", env={**env, "COLUMNS": str(columns)})
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def test_status_in_80_columns_shows_whole_columns_that_fit(up: tuple[dict[str, str], Any]) -> None:
    env, state = up
    out = status(env, 80)
    assert "…" not in out, out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    header = next(line for line in out.splitlines() if "┃ worker " in line)
    for column in ("worker", "image", "ready", "boxes", "waiting", "sessions", "restarts"):
        assert f" {column} " in header, out
    assert f" {state['workers'][0]} " in out, out
    left_out = "not shown at 80 columns: gen, backend, image digest, preload, metrics (see --json)"
    assert left_out in " ".join(out.split()), out  # the note may wrap
    # what a worker holds and what waits for it: boxes in use of all, opens/items waiting
    row = next(line for line in out.splitlines() if f" {state['workers'][0]} " in line)
    assert re.search(r"│ 0/[1-9][0-9]* +│ 0/0 +│ 0/32 ", row), out
    assert "boxes: in use/all a sandbox holds (set by its " in out, out


def test_status_in_a_wide_terminal_shows_every_column(up: tuple[dict[str, str], Any]) -> None:
    env, state = up
    out = status(env, 200)
    header = next(line for line in out.splitlines() if "┃ worker " in line)
    for column in ("worker", "image", "gen", "ready", "boxes", "waiting", "sessions", "backend"):
        assert f" {column} " in header, out
    assert " image digest " in header and " metrics " in header, out
    assert " preload " in header, out  # the process backend's kernel preloads nothing: "-"
    assert "not shown" not in out and "…" not in out, out
    assert f" {state['workers'][0]} " in out, out
