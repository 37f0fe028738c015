"""The tiers keep their shape: a worker never imports the client, importing any worker module
builds no Celery app (each check in a fresh interpreter, so nothing else loaded it), and no
farm module imports itself back (read from the source: module level, and for type checking).
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import farm
import farm.worker
from tests.import_graph import cycles, import_graph

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


# --- import cycles -------------------------------------------------------------------------

FARM = Path(farm.__file__).parent


def test_no_farm_module_imports_itself_back() -> None:
    """Not at run time, nor for type checking: a part that acts for its owner (a worker's
    calls, a session) sees it through a protocol (``WorkerHost``, ``SessionFarm``)."""
    graph = import_graph(FARM)
    assert len(graph) > 100  # the walk found the package
    assert {"farm.kernel.tools.workspace"} <= graph["farm.kernel.tools.fileops"]  # relative
    assert cycles(graph) == []


# --- the kernel's packages, by the process that runs their code ----------------------------

# Each package imports only the packages after it.
KERNEL_ORDER = ["supervisor", "boxes", "repl", "tools", "judge", "wire"]


def kernel_package(module: str) -> str | None:
    """``supervisor`` for ``farm.kernel.supervisor.server``; None above the packages
    (``farm.kernel`` itself, whose ``KIND_*`` every package may use, and ``__main__``)."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["farm", "kernel"] and len(parts) > 2 else None


def kernel_layer_violations(root: Path = FARM) -> list[str]:
    """Imports (late ones too) from a kernel package to one before it, in the ``farm``
    package at ``root``."""
    bad = []
    for name, targets in sorted(import_graph(root, late=True).items()):
        package = kernel_package(name)
        if package not in KERNEL_ORDER:
            continue
        below = KERNEL_ORDER[KERNEL_ORDER.index(package) :]
        used = {kernel_package(t) for t in targets} & set(KERNEL_ORDER)
        bad += [f"{name} -> {t}" for t in sorted(used) if t not in below]
    return bad


def test_kernel_packages_import_only_downwards() -> None:
    assert len(list((FARM / "kernel").rglob("*.py"))) > 35
    assert kernel_layer_violations() == []


def test_the_kernel_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    """On a made-up ``farm`` package (never by writing into the real one while tests run)."""
    for package in ("supervisor", "wire"):
        (tmp_path / "farm" / "kernel" / package).mkdir(parents=True)
        (tmp_path / "farm" / "kernel" / package / "__init__.py").write_text("")
    (tmp_path / "farm" / "kernel" / "supervisor" / "server.py").write_text(
        "from ..wire import framing\n"  # downwards: allowed
    )
    (tmp_path / "farm" / "kernel" / "wire" / "framing.py").write_text(
        "def late():\n    from ..supervisor import server\n"
    )
    assert kernel_layer_violations(tmp_path / "farm") == ["farm.kernel.wire.framing -> supervisor"]
