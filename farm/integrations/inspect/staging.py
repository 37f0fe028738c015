"""Commands too big for one farm request: their argv and env go to a file of the box and a
launcher ``execve``s them from there.

Why: farm's kernel hands a command to its zygote in one datagram read 64 KiB at a time, so an
argv (or env) over ~64 KiB kills the zygote, and with it every session of that sandbox; over
~200 KiB the supervisor cannot even send it. Inspect expects ~1 MiB of argv to work (its
``test_exec_large_command`` check, and a model's long ``bash`` heredocs). Until the kernel
carries a command of any size (see issue 19's note), this provider never sends one over
``INLINE_BYTES``: it writes ``{"argv", "env"}`` to the box's workspace through the chunked
files API and runs ``python3 -I -c LAUNCHER FILE``, which removes the file, applies the env and
``execve``s the argv in the same process (same pid and process group, so the timeout still
kills the whole group), reporting a program that cannot be run as farm's kernel does (127 not
found, 126 not executable, with farm's messages).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence

from inspect_ai.util import SandboxUnavailableError

INLINE_BYTES = 32 * 1024  # argv and env as JSON, well under the kernel's 64 KiB datagram
LAUNCHER = """\
import json, os, sys
path = sys.argv[1]
with open(path, encoding="utf-8") as f:
    spec = json.load(f)
os.unlink(path)
argv = spec["argv"]
os.environ.update(spec["env"])
try:
    os.execvpe(argv[0], argv, os.environ)
except FileNotFoundError:
    sys.stderr.write(f"farm: {argv[0]}: command not found\\n")
    code = 127
except PermissionError as exc:
    sys.stderr.write(f"farm: {argv[0]}: {exc.strerror}\\n")
    code = 126
sys.stderr.flush()
os._exit(code)
"""
# The box's workspace and its python3, by absolute path (a launcher must not depend on the
# caller's PATH).
FACTS = ["/bin/sh", "-c", "pwd && command -v python3"]


class Stager:
    """One sample box's staging: its facts are learnt on the first big command."""

    def __init__(
        self,
        run: Callable[[list[str]], Awaitable[str]],
        write: Callable[[str, str], Awaitable[None]],
    ) -> None:
        self._run = run  # a command's stdout
        self._write = write
        self._facts: tuple[str, str] | None = None

    async def command(
        self, cmd: Sequence[str], env: Mapping[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """The argv and env to send for ``cmd`` and ``env``: themselves when small enough,
        else the launcher and its staged file."""
        spec = json.dumps({"argv": list(cmd), "env": dict(env)})
        if len(spec) <= INLINE_BYTES:
            return list(cmd), dict(env)
        workspace, python = await self._learn()
        path = f"{workspace}/.farm-command-{uuid.uuid4().hex}.json"
        await self._write(path, spec)
        return [python, "-I", "-c", LAUNCHER, path], {}

    async def _learn(self) -> tuple[str, str]:
        if self._facts is None:
            lines = (await self._run(FACTS)).splitlines()
            if len(lines) < 2 or not all(line.startswith("/") for line in lines[:2]):
                raise SandboxUnavailableError(f"cannot stage a large command here: {lines}")
            self._facts = (lines[0], lines[1])
        return self._facts
