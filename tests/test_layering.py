"""The tiers keep their shape: a worker never imports the client, and importing any worker
module builds no Celery app (each check in a fresh interpreter, so nothing else loaded it)."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import farm.worker

WORKER_MODULES = sorted(
    f"farm.worker.{m.name}" for m in pkgutil.iter_modules(farm.worker.__path__)
) + ["farm.worker"]

PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
from celery import _state
print(json.dumps({
    "client": sorted(m for m in sys.modules if m == "farm.client" or m.startswith("farm.client.")),
    "apps": len(list(_state._get_active_apps())),
}))
"""


def probe(*modules: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_no_worker_module_imports_the_client_or_builds_a_celery_app() -> None:
    assert len(WORKER_MODULES) > 5  # the listing found the package's modules
    assert probe(*WORKER_MODULES) == {"client": [], "apps": 0}


def test_the_probe_sees_a_client_import_and_an_app() -> None:
    """The check itself can fail: importing the client, and building the worker's app, show."""
    assert probe("farm.client")["client"] != []
    built = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE.replace(
                "from celery", "import farm.worker.tasks as t; t.make_worker_app()\nfrom celery"
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    assert json.loads(built.stdout)["apps"] >= 1
