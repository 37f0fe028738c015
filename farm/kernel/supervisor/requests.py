"""``Requests``: what a valid host request is, checked before the kernel acts on it.

Every request from the host is validated here into the plain dict the manager takes: types,
ranges (a timeout in ``(0, MAX_TIMEOUT_S]``, output caps that let a result with both streams
full fit one frame), argv and env a program can be given (no NUL, no ``=`` in a name). A
request that fails gets ``bad_request`` and never reaches a session.
"""

from __future__ import annotations

import base64
import math
from typing import Any, TypedDict, cast

from ..judge import checkers
from ..wire.protocol import DEFAULT_WAIT_S, MAX_WAIT_S, Execute, FileRequest, JudgeSpec
from .links import RequestError
from .session_process import DEFAULT_OUTPUT_BYTES

MAX_TIMEOUT_S = 24 * 3600.0


class CommandCall(TypedDict):
    """A ``command`` request as the manager takes it: stdin decoded, the output cap decided."""

    session_id: str
    exec_id: str
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    stdin: bytes
    stdin_path: str | None
    timeout_s: float
    max_output_bytes: int


class ItemCall(TypedDict):
    """An ``item`` request as ``items.run_item`` takes it: every optional field decided, and
    ``room``, the share of the reply frame each result may take."""

    exec_id: str
    session_id: str | None
    cells: list[str]
    files: dict[str, str]  # workspace path -> base64
    argv: list[str] | None
    judge: JudgeSpec | None
    limits: dict[str, Any]  # checked against the caps when the box opens (check_open)
    tools: bool
    events: bool
    egress: bool
    timeout_s: float
    max_output_bytes: int
    room: int
    wait_s: float  # how long its box may wait for room


class Requests:
    """Validates host requests against this kernel's frame size (``max_frame``)."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame

    def command(self, message: dict[str, Any]) -> CommandCall:
        argv = _argv(message)
        env = message.get("env") or {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and "\0" not in k + v and "=" not in k
            for k, v in env.items()
        ):
            raise RequestError("bad_request", "field 'env' must map names to strings")
        stdin = message.get("stdin")
        try:
            data = base64.b64decode(stdin, validate=True) if stdin is not None else b""
        except (TypeError, ValueError):
            raise RequestError("bad_request", "field 'stdin' must be base64") from None
        return {
            "session_id": field(message, "session_id", str),
            "exec_id": field(message, "exec_id", str),
            "argv": argv,
            "env": env,
            "cwd": _optional(message, "cwd", str),
            "stdin": data,
            "stdin_path": _optional(message, "stdin_path", str),
            "timeout_s": self.timeout(message),
            "max_output_bytes": self.max_output(message),
        }

    def item(self, message: dict[str, Any]) -> ItemCall:
        cells = message.get("cells")
        if not isinstance(cells, list) or not all(isinstance(c, str) for c in cells):
            raise RequestError("bad_request", "field 'cells' must be a list of strings")
        files = message.get("files") or {}
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()
        ):
            raise RequestError("bad_request", "field 'files' must map paths to base64 strings")
        limits = message.get("limits") or {}
        if not isinstance(limits, dict):
            raise RequestError("bad_request", "field 'limits' must be an object")
        tools, events = message.get("tools", True), message.get("events", False)
        egress = message.get("egress", False)
        if not all(isinstance(flag, bool) for flag in (tools, events, egress)):
            raise RequestError("bad_request", "'tools', 'events' and 'egress' must be booleans")
        return {
            "exec_id": field(message, "exec_id", str),
            "session_id": _optional(message, "session_id", str),
            "cells": cells,
            "files": files,
            "argv": _argv(message) if message.get("argv") is not None else None,
            "judge": _judge(message.get("judge")),
            "limits": limits,
            "tools": tools,
            "events": events,
            "egress": egress,
            "timeout_s": self.timeout(message),
            "max_output_bytes": self.max_output(message),
            # each cell's result, each done event and the command's fit in this much of the
            # reply frame (outputs are capped, but many results share one frame)
            "room": self.max_frame // (len(cells) + 2),
            "wait_s": wait(message),
        }

    def timeout(self, message: dict[str, Any]) -> float:
        timeout_s = float(field(message, "timeout_s", (int, float)))
        if not (0 < timeout_s <= MAX_TIMEOUT_S) or math.isnan(timeout_s):
            raise RequestError("bad_request", f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}]")
        return timeout_s

    def max_output(self, message: dict[str, Any]) -> int:
        """Each output stream's cap: a result with both full must fit one frame."""
        max_output = message.get("max_output_bytes") or DEFAULT_OUTPUT_BYTES
        if not isinstance(max_output, int) or not 1024 <= max_output <= self.max_frame // 4:
            raise RequestError(
                "bad_request",
                f"max_output_bytes must be an integer in [1024, {self.max_frame // 4}]",
            )
        return max_output

    def execute(self, message: dict[str, Any]) -> Execute:
        timeout_s = self.timeout(message)
        max_output = self.max_output(message)
        epoch = field(message, "epoch", int)
        events = message.get("events", False)
        if not isinstance(events, bool):
            raise RequestError("bad_request", "field 'events' must be a boolean")
        return {
            "type": "execute",
            "events": events,
            "calls": _calls(message),
            "session_id": field(message, "session_id", str),
            "epoch": epoch,
            "code": field(message, "code", str),
            "timeout_s": timeout_s,
            "exec_id": field(message, "exec_id", str),
            "max_output_bytes": max_output,
        }

    def file(self, message: dict[str, Any]) -> FileRequest:
        """The frame as it came (the session process's ``fileops`` checks the rest)."""
        field(message, "session_id", str)
        if not isinstance(message.get("op"), str) or not isinstance(message.get("path", "."), str):
            raise RequestError("bad_request", "a file request needs 'op' and 'path' strings")
        if message.get("scope", "workspace") not in ("workspace", "box"):
            raise RequestError("bad_request", "field 'scope' must be 'workspace' or 'box'")
        return cast(FileRequest, {**message, "type": "file"})


def _judge(spec: Any) -> JudgeSpec | None:
    """An item's judge step (``protocol.JudgeSpec``), checked enough that the runner can
    trust its shape: names and numbers of the right types, tests as objects."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise RequestError("bad_request", "field 'judge' must be an object")
    for name, kind in (("language", str), ("source", str), ("checker", str)):
        field(spec, name, kind)
    for name in ("time_s", "memory_mb", "output_mb"):
        value = field(spec, name, (int, float))
        if not 0 < value < MAX_TIMEOUT_S:
            raise RequestError("bad_request", f"judge field {name!r} must be positive")
    tests = spec.get("tests")
    if not isinstance(tests, list) or not all(isinstance(t, dict) for t in tests):
        raise RequestError("bad_request", "judge field 'tests' must be a list of objects")
    for role in ("checker_program", "interactor"):  # a problem's programs (checking.py)
        program = spec.get(role)
        if program is None:
            continue
        if not isinstance(program, dict) or program.get("protocol") not in ("testlib", "kattis"):
            raise RequestError("bad_request", f"judge field {role!r}: protocol testlib or kattis")
        for name, kind in (("language", str), ("source", str)):
            field(program, name, kind)
    if (spec["checker"] == "program") != (spec.get("checker_program") is not None):
        raise RequestError("bad_request", "checker 'program' needs 'checker_program'")
    try:
        if spec["checker"] not in ("special", "program"):
            checkers.parse(spec["checker"])
    except checkers.CheckerError as exc:
        raise RequestError("bad_request", str(exc)) from None
    return cast(JudgeSpec, spec)


def _calls(message: dict[str, Any]) -> list[str]:
    """The names of the host callbacks a cell may call (``farm.kernel.calls``)."""
    calls = message.get("calls", [])
    if not isinstance(calls, list) or not all(
        isinstance(n, str) and n.isidentifier() and not n.startswith("_") for n in calls
    ):
        raise RequestError("bad_request", "field 'calls' must be a list of public identifiers")
    return calls


def _argv(message: dict[str, Any]) -> list[str]:
    argv = message.get("argv")
    if (
        not isinstance(argv, list)
        or not argv
        or not all(isinstance(a, str) and "\0" not in a for a in argv)
    ):
        raise RequestError("bad_request", "field 'argv' must be a non-empty list of strings")
    return argv


def _optional(message: dict[str, Any], name: str, kind: type) -> Any:
    value = message.get(name)
    if value is not None and not isinstance(value, kind):
        raise RequestError("bad_request", f"field {name!r} has the wrong type")
    return value


def field(message: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = message.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise RequestError("bad_request", f"field {name!r} is missing or has the wrong type")
    return value


def wait(message: dict[str, Any]) -> float:
    """A request's ``wait_s``: how long its box may wait for room (``admission``)."""
    wait_s = message.get("wait_s", DEFAULT_WAIT_S)
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)):
        raise RequestError("bad_request", "field 'wait_s' must be a number")
    if not 0 <= wait_s <= MAX_WAIT_S or math.isnan(wait_s):
        raise RequestError("bad_request", f"wait_s must be in [0, {MAX_WAIT_S:g}]")
    return float(wait_s)
