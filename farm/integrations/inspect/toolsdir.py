"""Where Inspect's injected tools live in a box: a directory of each box's own, not the one
fixed path Inspect gives every sandbox.

Every mention of ``SANDBOX_TOOLS_DIR`` in a sample's argv, cwd, env or file paths becomes
``/var/tmp/.inspect-tools-<digest>``, the box's own (mode 0700, made before the first command
naming it), keyed by a secret of this process so no other box can take the name first. Boxes
with namespaces have their own ``/var/tmp`` anyway; uid boxes (the fallback) share it.
Why and how: docs/design/inspect-provider.md.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

from inspect_ai.util._sandbox._cli import SANDBOX_TOOLS_DIR

TOOLS_PARENT = str(PurePosixPath(SANDBOX_TOOLS_DIR).parent)
TOOLS_LEAF = PurePosixPath(SANDBOX_TOOLS_DIR).name
BOX_PREFIX = "/var/tmp/.inspect-tools-"
# The fixed path as a whole name: one that goes on (``...d428.old``) is another file.
_MENTION = re.compile(re.escape(SANDBOX_TOOLS_DIR) + r"(?![\w.-])")
_KEY = secrets.token_bytes(32)

# Makes the box's directory (mode 0700, as the box's user), or accepts the one it made before:
# a real directory of its own. Anything else at that name is refused with a message.
MAKE_SCRIPT = (
    'umask 077; mkdir -m 700 -- "$1" 2>/dev/null && exit 0; '
    '[ -d "$1" ] && [ ! -L "$1" ] && [ -O "$1" ] && exit 0; '
    "echo \"farm: cannot make $1, the box's directory for Inspect's tools\" >&2; exit 1"
)


# What a command naming the tools directory says first when it found /var/tmp full (the tree
# takes about 31 MiB per box, on the box's own disk; uid boxes share the sandbox's /var/tmp).
FULL = (
    "farm: the box's /var/tmp is full: each sample using Inspect's injected tools keeps about "
    "32 MiB there (and its server about 33 MiB of memory); give its box a larger disk "
    "(FARM_BOX_DISK_MB, or limits={'disk_mb': ...}), or, where boxes share the sandbox's "
    "/var/tmp (uid boxes), the farm's workers a larger FARM_SANDBOX_TMP_MB, or fewer such "
    "samples at once (FARM_MAX_SESSIONS)\n"
)
NO_SPACE = "No space left on device"


def box_tools_dir(session_id: str) -> str:
    """The tools directory of the box ``session_id``: ``/var/tmp/.inspect-tools-<digest>``,
    the digest keyed by this process's secret (see the module's docstring)."""
    digest = hmac.new(_KEY, session_id.encode(), hashlib.sha256).hexdigest()[:32]
    return BOX_PREFIX + digest


class ToolsDir:
    """One box's tools directory, and the rewriting of what names Inspect's fixed one."""

    def __init__(self, path: str) -> None:
        self.path = path
        pure = PurePosixPath(path)
        self.parent, self.leaf = str(pure.parent), pure.name

    def text(self, value: str) -> str:
        """``value`` with every mention of Inspect's fixed directory made this box's."""
        if SANDBOX_TOOLS_DIR not in value:
            return value
        return _MENTION.sub(lambda _: self.path, value)

    def argv(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` rewritten element by element, and the (parent, leaf) pair by which Inspect's
        framework-directory helper names the directory (``/var/tmp``, ``.da7be258e003d428``)."""
        out = [self.text(part) for part in cmd]
        for i in range(len(out) - 1):
            if out[i] == TOOLS_PARENT and out[i + 1] == TOOLS_LEAF:
                out[i], out[i + 1] = self.parent, self.leaf
        return out

    def command(
        self, cmd: Sequence[str], cwd: str | None, env: Mapping[str, str]
    ) -> tuple[list[str], str | None, dict[str, str]]:
        """A command's argv, working directory and environment, rewritten."""
        new_cwd = None if cwd is None else self.text(cwd)
        return self.argv(cmd), new_cwd, {key: self.text(value) for key, value in env.items()}
