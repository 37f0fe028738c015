"""Inspect's sandbox contract in farm's terms: a ``CommandResult`` becomes Inspect's
``ExecResult`` or the exception Inspect documents for it, a ``FileOperationError`` the
``OSError`` subclass Inspect's tools and conformance checks expect, and Inspect's limits are
read when each call is made (they are context variables a task may override).

Why one module: the farm client reports facts (an exit status, a timeout, an errno and a path);
Inspect wants particular exception classes and messages, which its tool loop turns into typed
tool errors the model sees (``timeout``, ``permission``, ``file_not_found``, ``limit``...).
Inspect's own conformance suite (run by ``tests/test_inspect.py``) checks this mapping.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence

from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
)

from farm.errors import FileOperationError
from farm.kernel.wire.framing import DEFAULT_MAX_FRAME
from farm.models import CommandResult, ErrorKind

# The output caps per stream farm's kernel accepts (farm/kernel/supervisor/server.py: a frame
# holds both streams and more); Inspect's default, 10 MiB, fits.
FARM_MAX_OUTPUT = DEFAULT_MAX_FRAME // 4
FARM_MAX_OUTPUT_STR = f"{FARM_MAX_OUTPUT // (1024 * 1024)} MiB"
FARM_MIN_OUTPUT = 1024
# What farm's kernel writes when execve refuses a program as not executable (EACCES), with exit
# status 126 (farm/kernel/boxes/command_keeper.py, exec_in_box); Inspect wants a PermissionError.
EXEC_DENIED = "farm: {}: Permission denied\n"


class CommandTimeout(TimeoutError):
    """A command ran past its timeout and farm killed its whole process group.
    ``truncated_output`` is what it wrote until then: Inspect passes it on to the model."""

    def __init__(self, message: str, truncated_output: str | None) -> None:
        super().__init__(message)
        self.truncated_output = truncated_output


def output_cap() -> tuple[int, str]:
    """The per-stream output cap to ask farm for, and how to name it: Inspect's limit now, or
    farm's own when Inspect's is larger than farm allows."""
    limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
    if limit > FARM_MAX_OUTPUT:
        return FARM_MAX_OUTPUT, FARM_MAX_OUTPUT_STR
    return max(limit, FARM_MIN_OUTPUT), SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR


def check_command(cmd: Sequence[str], env: Mapping[str, str]) -> None:
    """Refuse what ``execve`` cannot take, as Python's subprocess does (``ValueError``, which
    Inspect's tool loop shows the model as a parsing error) instead of a farm round trip."""
    if not cmd:
        raise ValueError("an empty command")
    if any("\0" in part for part in [*cmd, *env, *env.values()]):
        raise ValueError("embedded null byte")


def exec_result(cmd: Sequence[str], result: CommandResult, limit_str: str) -> ExecResult[str]:
    """Inspect's view of one finished command (see the module's docstring)."""
    if result.timed_out:
        raise CommandTimeout(
            f"the command ran past its timeout ({result.duration_s:.1f}s); farm killed it",
            truncated_output=result.stdout + result.stderr,
        )
    if result.error is not None:
        if result.kind == ErrorKind.INPUT:  # refused before it started: nothing ran
            return ExecResult(False, 126, "", f"farm: {result.error.evalue}\n")
        raise SandboxUnavailableError(
            f"farm could not run the command ({result.error.ename}: {result.error.evalue})"
        )
    if result.returncode is None:
        raise SandboxUnavailableError("farm returned no exit status for the command")
    if result.returncode == 126 and result.stderr == EXEC_DENIED.format(cmd[0]):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), cmd[0])
    if result.stdout_truncated or result.stderr_truncated:
        raise OutputLimitExceededError(limit_str, truncated_output=result.stdout + result.stderr)
    return ExecResult(
        success=result.returncode == 0,
        returncode=result.returncode,
        stdout=result.stdout,
        stderr=result.stderr,
    )


def unknown_user(user: str) -> ExecResult[str]:
    """What Docker answers for a user the sandbox has no account for."""
    return ExecResult(
        False, 126, "", f"unable to find user {user}: no matching entries in passwd file\n"
    )


def read_limit_exceeded() -> OutputLimitExceededError:
    return OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)


def file_error(exc: FileOperationError, file: str) -> Exception:
    """The exception Inspect expects for a refused file operation on ``file`` (the path as the
    caller gave it, which Inspect's messages must name): ``OSError(errno, ...)`` is already
    the right subclass (``FileNotFoundError``, ``PermissionError``, ``IsADirectoryError``,
    ``NotADirectoryError``); a read-only filesystem is a permission the default user lacks."""
    if exc.ename == "FileTooLarge":
        return read_limit_exceeded()
    code = exc.errno
    if code == errno.EROFS:
        return PermissionError(code, os.strerror(code), file)
    if code:
        return OSError(code, os.strerror(code), file)
    return OSError(f"{file}: {exc}")
