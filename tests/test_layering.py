"""The tiers keep their shape: a worker never imports the client, importing any worker module
builds no Celery app (each check in a fresh interpreter, so nothing else loaded it), and no
farm module imports itself back (read from the source: module level, and for type checking).
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import farm
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


# --- import cycles -------------------------------------------------------------------------

FARM = Path(farm.__file__).parent
# Cycles that only type checking sees, and why they stay: a Session holds its Farm (public:
# ``session.farm``), and a worker's parts (its calls, its batches) act for the Worker they
# belong to. Any other cycle, or one of these at run time, fails.
TYPING_CYCLES = [
    {"farm.client.farm", "farm.client.session"},
    {
        "farm.worker.worker_state",
        "farm.worker.session_calls",
        "farm.worker.batch_runner",
        "farm.worker.opens",
    },
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(FARM.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, typing: bool) -> set[str]:
    """The farm modules ``path`` imports at module level (and under ``TYPE_CHECKING`` when
    ``typing``); an import inside a function is a deliberate late one, not a cycle."""
    names: set[str] = set()
    body = list(ast.parse(path.read_text()).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            body.extend(node.body if typing else node.orelse)
        elif isinstance(node, (ast.If, ast.Try)):
            body.extend(node.body + node.orelse)
            body.extend(getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                body.extend(handler.body)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def import_graph(typing: bool) -> dict[str, set[str]]:
    modules = {module_name(p): p for p in FARM.rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    return {
        name: {m for m in map(resolve, imports(path, typing)) if m and m != name}
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while (w := stack.pop()) != v:
                component.add(w)
            if component:
                found.append(component | {v})

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_farm_module_imports_itself_back_at_run_time() -> None:
    assert len(import_graph(typing=False)) > 100  # the walk found the package
    assert cycles(import_graph(typing=False)) == []


def test_helpers_are_typed_against_narrow_protocols_not_their_owners() -> None:
    """``MapRun`` sees its farm as ``MapHost``; a session's files, stream and restore see it
    as ``FileChannel``/``Caller``: none of them imports ``Farm`` or ``Session``, not even for
    type checking, so the only typing cycles are the two ``TYPING_CYCLES`` name."""
    found = cycles(import_graph(typing=True))
    assert sorted(map(sorted, found)) == sorted(map(sorted, TYPING_CYCLES))


def test_the_cycle_check_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


# --- the kernel's packages, by the process that runs their code ----------------------------

# Each package imports only the packages after it.
KERNEL_ORDER = ["supervisor", "boxes", "repl", "tools", "judge", "wire"]


def kernel_imports(path: Path) -> set[str]:
    """The kernel packages ``path`` imports from (relative imports, anywhere in the file)."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            target = [*base, *(node.module.split(".") if node.module else [])]
            names = [target] if node.module else [[*target, a.name] for a in node.names]
            found.update(n[2] for n in names if n[:2] == ["farm", "kernel"] and len(n) > 2)
    return found & set(KERNEL_ORDER)  # names of farm.kernel itself (KIND_*) are the base


def kernel_layer_violations() -> list[str]:
    bad = []
    for path in sorted((FARM / "kernel").rglob("*.py")):
        package = path.relative_to(FARM / "kernel").parts[0]
        if package not in KERNEL_ORDER:  # __init__, __main__: above every package
            continue
        below = KERNEL_ORDER[KERNEL_ORDER.index(package) :]
        bad += [f"{module_name(path)} -> {t}" for t in kernel_imports(path) if t not in below]
    return bad


def test_kernel_packages_import_only_downwards() -> None:
    assert len(list((FARM / "kernel").rglob("*.py"))) > 35
    assert kernel_layer_violations() == []


def test_the_kernel_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    upward = FARM / "kernel" / "wire" / "_upward_probe.py"
    upward.write_text("from ..supervisor import server\n")
    try:
        assert kernel_layer_violations() == ["farm.kernel.wire._upward_probe -> supervisor"]
    finally:
        upward.unlink()
