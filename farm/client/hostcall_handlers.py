"""Host callbacks: functions of the client's process that sandboxed code may call.

``farm.session(callbacks={"llm_query": fn})`` gives the session's code ``llm_query(...)`` and
``llm_query_batched(items)``; a callback may open a child session, one level deeper (depth
follows the call through a context variable). Invariant: every bound (``max_depth``,
``max_calls``, ``timeout_s``) is answered in the sandbox as a ``CallbackError``, never a dead
session. The path of a call: docs/design/host-callbacks.md.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from farm.errors import InvalidRequest
from farm.events.run_events import HostCall
from farm.models import CallAnswer

_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("farm_callback_depth", default=0)


def current_depth() -> int:
    """0 outside any callback; n inside a callback answering a session of depth n - 1."""
    return _DEPTH.get()


class _Timeout(Exception):
    pass


@dataclass
class Callbacks:
    """The callbacks of one session and their bounds; ``depth`` is the session's own."""

    functions: Mapping[str, Callable[..., Any]]
    max_depth: int = 2
    max_calls: int = 32
    timeout_s: float = 60.0
    depth: int = field(default_factory=current_depth)

    def __post_init__(self) -> None:
        for name, fn in self.functions.items():
            if not (isinstance(name, str) and name.isidentifier() and not name.startswith("_")):
                raise InvalidRequest(f"callback name {name!r} must be a public Python identifier")
            if name.endswith("_batched"):
                raise InvalidRequest(f"callback name {name!r}: the _batched twin is made for you")
            if not callable(fn):
                raise TypeError(f"callback {name!r} is not callable")
        if self.max_depth < 1 or self.max_calls < 1 or self.timeout_s <= 0:
            raise InvalidRequest("max_depth and max_calls must be >= 1 and timeout_s > 0")

    @property
    def names(self) -> list[str]:
        return sorted(self.functions)

    def answer(self, call: HostCall, made: int) -> CallAnswer:
        """Run the callback ``call`` asks for, within the bounds (``made``: calls of this run
        so far), and say what the sandbox gets."""
        depth = self.depth + 1
        fn = self.functions.get(call.name)
        if fn is None:
            return _refuse(f"no callback named {call.name!r} is registered", depth)
        if depth > self.max_depth:
            return _refuse(f"callbacks nest at most {self.max_depth} deep (this is {depth})", depth)
        if made + call.items > self.max_calls:
            return _refuse(f"a run may make at most {self.max_calls} callback calls", depth)
        deadline = time.monotonic() + self.timeout_s
        try:
            if call.batch:
                runs = [_Run(fn, (item,), {}, depth) for item in call.args[0]]
                value: Any = [run.result(deadline) for run in runs]
            else:
                value = _Run(fn, tuple(call.args), call.kwargs, depth).result(deadline)
        except _Timeout:
            why = f"{call.name} did not answer within {self.timeout_s:g}s"
            return _refuse(why, depth, "TimeoutError")
        except Exception as exc:
            return _refuse(str(exc), depth, type(exc).__name__)
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            return _refuse(f"{call.name} returned data that is not JSON: {exc}", depth)
        return CallAnswer(ok=True, value=value, depth=depth)


class _Run:
    """One callback call in a daemon thread, in a context one level deeper."""

    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], depth: int
    ) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        context = contextvars.copy_context()
        context.run(_DEPTH.set, depth)
        self.thread = threading.Thread(
            target=context.run, args=(self._call, fn, args, kwargs), daemon=True
        )
        self.thread.start()

    def _call(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            value = fn(*args, **kwargs)
            self.value = asyncio.run(value) if inspect.iscoroutine(value) else value
        except BaseException as exc:
            self.error = exc

    def result(self, deadline: float) -> Any:
        self.thread.join(max(deadline - time.monotonic(), 0))
        if self.thread.is_alive():
            raise _Timeout
        if self.error is not None:
            raise self.error
        return self.value


def _refuse(why: str, depth: int, ename: str = "CallbackError") -> CallAnswer:
    return CallAnswer(ok=False, error={"ename": ename, "evalue": why}, depth=depth)
