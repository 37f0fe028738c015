"""A client that is not Python: Node.js's own ``fetch`` against the real ``farm serve`` (over a
real farm) opens a session, runs two cells that share a variable and reads a run's SSE stream
(``tests/node/client.mjs``, the Node example of docs/serve.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.client import Farm
from tests.serving import Server, farm_serve

pytestmark = [pytest.mark.docker, pytest.mark.slow]
NODE = shutil.which("node")
CLIENT = Path(__file__).parent / "node" / "client.mjs"


@pytest.fixture(scope="module")
def server(farm: Farm, tmp_path_factory: Any) -> Iterator[Server]:
    with farm_serve(farm.settings.redis_url, tmp_path_factory.mktemp("serve")) as s:
        yield s


def test_a_node_client_shares_a_variable_and_reads_the_event_stream(
    farm: Farm, server: Server
) -> None:
    assert NODE, "node is missing: scripts/bootstrap installs Debian's nodejs"
    token = server.token("node", "run")
    done = subprocess.run(
        [NODE, str(CLIENT), server.url, token], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert (seen["first"], seen["second"], seen["result"]) == ("ok", "42", "600")
    assert seen["stdout"] == "tick 0\ntick 1\ntick 2\n"
    assert seen["events"][0] == "exec_start" and seen["events"][-2:] == ["exec_end", "done"]
    assert "stream" in seen["events"] and "result" in seen["events"]
    assert farm.registry.session(seen["session"]) is None  # it closed its session
