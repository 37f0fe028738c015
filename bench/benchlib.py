"""What every benchmark here shares: the machine line printed above its table.

Imported as ``benchlib``: ``bench/`` is first on ``sys.path`` when a benchmark runs as a script
(which is also why no file here may be called ``farm.py``: it would shadow the package).
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
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
