"""Host callbacks as seen from sandboxed code: ``llm_query("...")`` answered by the client.

Each name the host sent with the cell is a global (with its ``<name>_batched`` twin) that sends
a ``call`` frame and blocks until its ``answer``. Invariants: no other name is installed (the
host checks each call again); the answer is awaited with SIGINT held back, so an interrupt
never tears a frame; a user's own variable of the same name is never overwritten. More:
docs/design/kernel.md, docs/design/host-callbacks.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from ..wire.session_frames import CallAnswer, CallFrame

MAX_CALL_BYTES = 1024 * 1024
MAX_ANSWER_BYTES = 8 * 1024 * 1024  # the host refuses (CallbackError) an answer past this
MARK = "__farm_call__"


class CallbackError(Exception):
    """A host callback failed, was refused, or could not be reached."""


class _Channel(Protocol):
    def request(self, frame: CallFrame) -> CallAnswer | None: ...


def make_call(name: str, channel: _Channel, *, batch: bool = False) -> Callable[..., Any]:
    """The global that sandboxed code calls for ``name`` (``batch``: one call, many items)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        frame: CallFrame = {"type": "call", "name": name, "args": list(args), "kwargs": kwargs}
        if batch:
            if len(args) != 1 or kwargs or isinstance(args[0], (str, bytes, dict)):
                raise TypeError(f"{name}_batched(items) takes one list of inputs")
            frame["args"] = [list(args[0])]
            frame["batch"] = True
        try:
            size = len(json.dumps(frame))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{call.__name__}(): arguments must be JSON data: {exc}") from None
        if size > MAX_CALL_BYTES:
            raise ValueError(f"{call.__name__}(): arguments of {size} bytes exceed 1 MiB")
        answer = channel.request(frame)
        if answer is None:
            raise CallbackError(f"{call.__name__}() can only be called while a cell runs")
        if answer.get("interrupt"):  # the cell timed out while waiting: stop it like Ctrl-C
            raise KeyboardInterrupt
        if not answer.get("ok"):
            error: Mapping[str, object] = answer.get("error") or {}
            raise CallbackError(
                f"{call.__name__}(): {error.get('ename', 'Error')}: {error.get('evalue', '')}"
            )
        return answer.get("value")

    call.__name__ = call.__qualname__ = f"{name}_batched" if batch else name
    call.__doc__ = f"Ask the host's {name!r} callback (runs in the client's process)."
    setattr(call, MARK, True)
    return call


def install(namespace: dict[str, Any], channel: _Channel, names: Iterable[str]) -> None:
    """Bind each name (and ``<name>_batched``) unless the user's code bound it to its own."""
    for name in names:
        for batch in (False, True):
            key = f"{name}_batched" if batch else name
            current = namespace.get(key)
            if current is None or getattr(current, MARK, False):
                namespace[key] = make_call(name, channel, batch=batch)
