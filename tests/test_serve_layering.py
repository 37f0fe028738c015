"""``farm serve`` is a front over the client: its modules (and the app they build) load no
worker module and no Docker client, so clients reach workers only through the broker."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import farm.serve

SERVE_MODULES = [f"farm.serve.{m.name}" for m in pkgutil.iter_modules(farm.serve.__path__)]
PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
from farm.serve.app import make_app
make_app()
print(json.dumps(sorted(
    m for m in sys.modules
    if m.split(".")[0] == "docker" or m.startswith(("farm.worker", "farm.sandbox"))
)))
"""


def test_the_server_loads_no_worker_sandbox_or_docker_module() -> None:
    assert len(SERVE_MODULES) >= 8
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *SERVE_MODULES, "farm.cli.serve_commands", "farm.cli.main"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
