"""farm: a distributed, sandboxed Python execution farm.

Heavy parts (the client and its dependencies) load lazily, so that ``python3 -m farm.kernel``
inside a sandbox imports nothing but the standard library. Type checkers and IDEs see the real
names through the ``TYPE_CHECKING`` imports below (the package ships ``py.typed``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from farm.client import AsyncFarm, AsyncSession, Farm, Session, replay
    from farm.errors import FarmError
    from farm.judge.packages import read_package
    from farm.judge.problems import Problem
    from farm.models import BoxLimits, ExecResult
    from farm.models.batch import BatchItem, BatchRecord

__version__ = "0.1.0"

__all__ = [
    "AsyncFarm",
    "AsyncSession",
    "BatchItem",
    "BatchRecord",
    "BoxLimits",
    "ExecResult",
    "Farm",
    "FarmError",
    "Problem",
    "Session",
    "__version__",
    "read_package",
    "replay",
]

_LAZY = {
    "Farm": "farm.client",
    "Session": "farm.client",
    "AsyncFarm": "farm.client",
    "AsyncSession": "farm.client",
    "ExecResult": "farm.models",
    "BatchItem": "farm.models.batch",
    "BatchRecord": "farm.models.batch",
    "BoxLimits": "farm.models",
    "FarmError": "farm.errors",
    "replay": "farm.client",
    "Problem": "farm.judge.problems",
    "read_package": "farm.judge.packages",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'farm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
