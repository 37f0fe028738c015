"""``FarmSandboxEnvironment``: Inspect AI's sandbox provider ``farm`` (``Task(sandbox="farm")``).

Each sample environment is one farm box, opened by ``sample_init`` and closed by
``sample_cleanup``; ``exec`` is ``Session.exec`` and files move through ``session.files``, as
the box's own non-root user (``user="root"`` raises ``SandboxUserUnsupportedError``). Every
blocking farm call runs in a worker thread under the provider's own limiter, so samples
waiting for room never starve running ones. Why and how: docs/design/inspect-provider.md.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar
from inspect_ai.util import (
    ExecResult,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from pydantic import BaseModel

from farm.client import Session
from farm.client.session_files import SessionFiles
from farm.errors import FarmError, FileOperationError, InvalidRequest
from farm.integrations.inspect import contract
from farm.integrations.inspect.config import (
    CONFIG_FILES,
    FarmSandboxConfig,
    resolve_config,
    usable_config,
)
from farm.integrations.inspect.farms import FarmHandle, Farms
from farm.integrations.inspect.toolsdir import (
    FULL,
    MAKE_SCRIPT,
    NO_SPACE,
    ToolsDir,
    box_tools_dir,
)

log = logging.getLogger(__name__)

CALL_THREADS = 512  # farm calls in flight per event loop (each blocks a thread while it waits)
OPEN_THREADS = 16  # farms started and boxes opened or closed at once (an open may wait long)
ROOT_USERS = frozenset({"root", "0"})
T = TypeVar("T")

_calls: RunVar[anyio.CapacityLimiter] = RunVar("farm_inspect_calls")
_opens: RunVar[anyio.CapacityLimiter] = RunVar("farm_inspect_opens")
FARMS = Farms()


def _limiter(var: RunVar[anyio.CapacityLimiter], total: int) -> anyio.CapacityLimiter:
    """This event loop's limiter (a RunVar: one per loop, as anyio's own default limiter)."""
    try:
        return var.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(total)
        var.set(limiter)
        return limiter


async def _blocking(fn: Callable[..., T], *args: Any, abandon: bool = False, **kwargs: Any) -> T:
    """Run a blocking farm call in a thread; farm failures that leave no sandbox to talk to
    (its session lost, the broker gone, no room) become ``SandboxUnavailableError``.

    ``abandon``: a cancelled caller (a sample's time limit) does not wait for the call, which
    ends in its thread when the command does or when ``sample_cleanup`` closes the box. Opens
    and closes are always waited for, so that no box is left open behind the caller's back.
    """
    limiter = _limiter(_calls, CALL_THREADS) if abandon else _limiter(_opens, OPEN_THREADS)
    call = functools.partial(fn, *args, **kwargs)
    try:
        return await anyio.to_thread.run_sync(call, limiter=limiter, abandon_on_cancel=abandon)
    except (FileOperationError, InvalidRequest):
        raise
    except FarmError as exc:
        raise SandboxUnavailableError(f"farm: {type(exc).__name__}: {exc}") from exc


@sandboxenv(name="farm")
class FarmSandboxEnvironment(SandboxEnvironment):
    """One sample environment: a farm box (see the module's docstring)."""

    def __init__(self, session: Session, handle: FarmHandle, config: FarmSandboxConfig) -> None:
        super().__init__()
        self.session = session
        self.handle = handle
        self.config = config
        self.files = SessionFiles(session, scope="box")
        self.tools = ToolsDir(box_tools_dir(session.id))
        self._tools_made = False
        self._tools_lock = anyio.Lock()

    # --- lifecycle --------------------------------------------------------------------------

    @classmethod
    def config_files(cls) -> list[str]:
        return list(CONFIG_FILES)

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return FarmSandboxConfig(**config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Start or connect to the config's farm and make sure a worker serves its image (a
        config whose ``broker_url`` holds a password is refused: ``config.usable_config``)."""
        await _blocking(FARMS.acquire, usable_config(config))

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        resolved = usable_config(config)
        handle = await _blocking(FARMS.get, resolved)
        session = await _blocking(handle.open, resolved, task_name)
        return {"default": cls(session, handle, resolved)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        """Close the sample's boxes, interrupted or not (a close is cheap and frees the box)."""
        for environment in environments.values():
            env = environment.as_type(FarmSandboxEnvironment)
            try:
                await _blocking(env.handle.close_session, env.session)
            except Exception as exc:  # a box left behind ends at the farm's idle timeout
                log.warning("closing farm sandbox %s: %s", env.session.id, exc)

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        await _blocking(FARMS.release, resolve_config(config), cleanup=cleanup)

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """``inspect sandbox cleanup farm [ID]``: close that box, or every box recorded on the
        farms this process knows (its own, and ``FARM_BROKER_URL``'s) and then remove what dead
        farms left on this host (an embedded farm killed with its eval leaves its sandbox
        containers: ``farms.remove_dead_farms``)."""
        closed = await _blocking(FARMS.cleanup, id)
        log.info("closed %d farm sandbox(es)", closed)

    def default_polling_interval(self) -> float:
        return 0.2

    # --- commands ---------------------------------------------------------------------------

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        """Run ``cmd`` in the box. ``timeout_retry`` and ``concurrency`` are ignored: farm
        never runs a command twice, and its commands run concurrently anyway."""
        env = env or {}
        contract.check_command(cmd, env)
        if user is not None:
            refusal = await self._user_refusal(user)
            if refusal is not None:
                return refusal
        given = (list(cmd), cwd, dict(env))
        cmd, cwd, env = self.tools.command(cmd, cwd, env)
        names_tools = (cmd, cwd, env) != given
        if names_tools:
            await self._make_tools_dir()
        cap, cap_str = contract.output_cap()
        result = await _blocking(
            self.session.exec,
            cmd,
            input=input,
            cwd=cwd,
            env=env,
            timeout_s=float(timeout) if timeout else self.config.timeout_s,
            max_output_bytes=cap,
            abandon=True,
        )
        if names_tools and result.returncode and NO_SPACE in result.stderr:
            result = result.model_copy(update={"stderr": FULL + result.stderr})
        return contract.exec_result(cmd, result, cap_str)

    async def _make_tools_dir(self) -> None:
        """Make the box's tools directory (mode 0700) before the first command or file that
        names it: Inspect would make it too, but a path named first by ``write_file`` would get
        a directory of the default mode."""
        if self._tools_made:
            return
        async with self._tools_lock:
            if self._tools_made:
                return
            made = await _blocking(
                self.session.exec,
                ["/bin/sh", "-c", MAKE_SCRIPT, "sh", self.tools.path],
                abandon=True,
            )
            if made.error is not None or made.returncode != 0:
                raise RuntimeError(made.stderr.strip() or f"farm: cannot make {self.tools.path}")
            self._tools_made = True

    async def _user_refusal(self, user: str) -> ExecResult[str] | None:
        """None when ``user`` is the box's own (by uid); a failed result for a user the sandbox
        has no account for; ``SandboxUserUnsupportedError`` for root and any other account."""
        if user in ROOT_USERS:
            raise SandboxUserUnsupportedError(
                "farm never runs commands as root: each box runs as its own non-root uid"
            )
        probe = await _blocking(
            self.session.exec,
            ["/bin/sh", "-c", 'id -u; getent passwd "$1"', "sh", user],
            abandon=True,
        )
        lines = probe.stdout.splitlines()
        own_uid = lines[0] if lines else ""
        account = lines[1].split(":") if len(lines) > 1 else None
        if user == own_uid or (account is not None and account[2:3] == [own_uid]):
            return None
        if account is None and not user.isdecimal():
            return contract.unknown_user(user)
        raise SandboxUserUnsupportedError(
            f"farm runs a box's commands only as its own uid ({own_uid}), not as {user!r}"
        )

    # --- files ------------------------------------------------------------------------------

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Create or replace ``file`` (and its parent directories) as the box's user; a
        relative path is in the sample's working directory (the box's workspace)."""
        path = await self._path(file)
        try:
            await _blocking(self.files.write, path, contents, abandon=True)
        except FileOperationError as exc:
            raise contract.file_error(exc, file) from None

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        """The file's bytes (strict UTF-8 text with ``text``, line endings kept). Its size is
        checked against Inspect's read limit before any of it travels."""
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        path = await self._path(file)
        try:
            data = await _blocking(self._read, path, limit, abandon=True)
        except FileOperationError as exc:
            raise contract.file_error(exc, file) from None
        return data.decode("utf-8") if text else data

    async def _path(self, file: str) -> str:
        """``file``, in the box's tools directory if it names Inspect's (made first)."""
        path = self.tools.text(file)
        if path != file:
            await self._make_tools_dir()
        return path

    def _read(self, file: str, limit: int) -> bytes:
        info = self.files.stat(file)
        if info["type"] == "dir":
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), file)
        if info["type"] == "file" and info["size"] > limit:
            raise contract.read_limit_exceeded()
        return self.files.read(file, max_bytes=limit)  # a link: checked after its first chunk
