"""The host's check of kernel frames: ``pydantic.TypeAdapter``s over the kernel's own
``TypedDict``s (``farm.kernel.wire.protocol``), so the protocol is written once. A frame with
an unknown key, a missing one or a value of the wrong type is refused (``ValidationError``).
Each ``TypedDict`` is rebuilt, key for key, as a ``typing_extensions.TypedDict`` (pydantic
reads ``typing``'s only from Python 3.12) that refuses extra keys; the kernel stays stdlib.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    NotRequired,
    Required,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

import typing_extensions
from pydantic import ConfigDict, TypeAdapter

from farm.kernel.wire import protocol
from farm.models.judge import JudgeResult
from farm.models.results import CommandResult, ExecResult

STRICT = ConfigDict(extra="forbid", strict=True)  # a drifted peer fails loudly
_TYPED_DICT: Any = typing_extensions.TypedDict  # called with names known at run time


@functools.cache
def _readable(hint: Any) -> Any:
    """``hint`` with each kernel ``TypedDict`` in it as pydantic reads it, extra keys refused."""
    origin, args = get_origin(hint), get_args(hint)
    if is_typeddict(hint):
        fields = {
            key: (Required if key in hint.__required_keys__ else NotRequired)[_readable(value)]
            for key, value in get_type_hints(hint).items()
        }
        readable: Any = _TYPED_DICT(hint.__name__, fields)
        readable.__pydantic_config__ = STRICT
        return readable
    if origin in (Union, types.UnionType):
        return Union[tuple(_readable(arg) for arg in args)]  # noqa: UP007
    if origin in (list, dict):
        return origin[tuple(_readable(arg) for arg in args)]
    return hint  # Literal, Any, str, int...


@functools.cache
def adapter(frame: type) -> TypeAdapter[Any]:
    """The validator of one kernel ``TypedDict`` (built once)."""
    return TypeAdapter(_readable(frame))


def build_all() -> None:
    """Build every frame's validator now (~18 ms for 24), not at its first frame: the worker
    server does, so that the workers it forks meet their first calls with them built."""
    for frame in protocol.HOST_FRAMES.values():
        adapter(frame)


def validate(frame: Any) -> dict[str, Any]:
    """A host <-> supervisor frame checked against its ``TypedDict`` (chosen by its ``type``)."""
    kind = frame.get("type") if isinstance(frame, dict) else None
    if kind not in protocol.HOST_FRAMES:
        raise ValueError(f"not a frame of the kernel protocol: type {kind!r}")
    checked: dict[str, Any] = adapter(protocol.HOST_FRAMES[kind]).validate_python(frame)
    return checked


if TYPE_CHECKING:
    JudgeStep = protocol.JudgeSpec
else:  # a model's field of this type is checked as the kernel's TypedDict
    JudgeStep = _readable(protocol.JudgeSpec)


@dataclass
class ItemResults:
    """What a one-shot box did (the kernel's ``ItemOutcome``), as public results: its cells'
    ``ExecResult``s and the command's ``CommandResult``, with the worker that ran them."""

    session_id: str
    cells: list[ExecResult]
    command: CommandResult | None
    file_error: protocol.FileError | None
    judge: JudgeResult | None

    @classmethod
    def from_kernel(
        cls, outcome: protocol.ItemOutcome, worker: str, timeout_s: float
    ) -> ItemResults:
        """``outcome`` (an ``item_result``'s ``result``, checked as it came off the wire by the
        client's ``check``, ``validate``) as public results, which pydantic checks again."""
        command, judge = outcome["command"], outcome["judge"]
        return cls(
            session_id=outcome["session_id"],
            cells=[ExecResult.model_validate({**c, "worker": worker}) for c in outcome["cells"]],
            command=CommandResult.from_kernel(command, worker, timeout_s)
            if command is not None
            else None,
            file_error=outcome["file_error"],
            judge=JudgeResult.model_validate(judge) if judge is not None else None,
        )


__all__ = ["ItemResults", "JudgeStep", "adapter", "validate"]
