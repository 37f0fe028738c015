"""What every benchmark here shares: the machine line, percentiles and the command line.

Imported as ``benchlib``: ``bench/`` is first on ``sys.path`` when a benchmark runs as a script
(which is also why no file here may be called ``farm.py``: it would shadow the package).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> dict[str, Any]:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "python": platform.python_version(),
    }


@dataclass
class Latency:
    name: str
    samples_ns: list[int] = field(default_factory=list)

    def p(self, q: float) -> float:
        """Nearest-rank percentile in nanoseconds (``nan`` when nothing was sampled)."""
        if not self.samples_ns:
            return float("nan")
        ordered = sorted(self.samples_ns)
        rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100)
        return float(ordered[int(rank) - 1])


def parse_args(doc: str, argv: list[str] | None = None) -> argparse.Namespace:
    """``--quick`` and ``--json``, the options every benchmark takes; sets up warning logs."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="also print the results as JSON on stdout (the table then goes to stderr)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return args


def write_json(path: Path | None, data: dict[str, Any]) -> None:
    """Write every figure of a run to ``path`` (a benchmark's ``--json FILE``), if one is given."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, default=str))


def emit(table: str, data: dict[str, Any], *, as_json: bool) -> int:
    """The table on stdout; with ``--json`` the table on stderr and ``data`` as JSON on
    stdout (for scripts). Returns the exit status."""
    if as_json:
        print(table, file=sys.stderr)
        print(json.dumps(data, indent=2, default=str))
    else:
        print(table)
    return 0


@contextmanager
def environments(specs: dict[str, tuple[list[str], list[str]]]) -> Iterator[None]:
    """Environments ``name: (pip, preload)`` built as farm images (``farm-sandbox:NAME``, the
    wheels downloaded once by the host); removed, with their build directories, on exit."""
    from farm.sandbox.catalog import build_image
    from farm.sandbox.environments import CONTEXT_DIR, WHEELS_DIR
    from farm.sandbox.envspec import make_spec
    from farm.sandbox.images import default_repo_root, docker_client

    root = default_repo_root()
    try:
        for name, (pip, preload) in specs.items():
            t0 = time.perf_counter()
            build_image(name, make_spec(name=name, pip=pip, preload=preload))
            print(f"built farm-sandbox:{name} in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
        yield
    finally:
        with docker_client(None) as client:
            for image in client.images.list(name="farm-sandbox"):
                for ref in image.tags:
                    if any(ref.startswith(f"farm-sandbox:{name}") for name in specs):
                        client.images.remove(ref)
        for name in specs:
            shutil.rmtree(root / WHEELS_DIR / name, ignore_errors=True)
            shutil.rmtree(root / CONTEXT_DIR / name, ignore_errors=True)
            (root / CONTEXT_DIR / f"{name}.lock").unlink(missing_ok=True)
