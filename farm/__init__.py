"""farm: a distributed, sandboxed Python execution farm.

Heavy parts (the client and its dependencies) load lazily, so that ``python3 -m farm.kernel``
inside a sandbox imports nothing but the standard library.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Farm": "farm.client",
    "Session": "farm.client",
    "AsyncFarm": "farm.client",
    "AsyncSession": "farm.client",
    "ExecResult": "farm.models",
    "BatchItem": "farm.models.batch",
    "BatchRecord": "farm.models.batch",
    "BoxLimits": "farm.models",
    "replay": "farm.client",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'farm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
