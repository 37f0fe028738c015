"""Where Inspect's injected tools live in a box: a directory of each box's own, not the one
fixed path Inspect gives every sandbox.

Inspect installs the tools it injects (``text_editor``, ``bash_session``, ``exec_remote``...),
a PyInstaller tree of about 31 MiB, at one fixed path (``SANDBOX_TOOLS_DIR``,
``/var/tmp/.da7be258e003d428``) and starts their server from there; the server keeps its state
(socket, pid) beside its executable. Farm cannot run as root, so Inspect installs the tree as
the sample's own user: in a sandbox shared by many boxes, the first box to use the tools would
own that path until it ends, and every other sample meanwhile fails with
``SandboxInjectionError``.

So every mention of ``SANDBOX_TOOLS_DIR`` a sample's environment is given (in an argv element,
shell scripts included; the working directory; an environment value; a file path) is rewritten
to the box's own directory, ``/var/tmp/.inspect-tools-<digest>``: each box gets its own tree and
its own server. The model's commands are rewritten alike: wherever it is named, the path is the
box's. Inspect's framework-directory helper names the directory as two arguments
(parent, then leaf): that pair is rewritten too. Inspect's contract for such a directory holds:
its parent, ``/var/tmp``, is root's and sticky (mode 1733), and the directory itself is the
box's, mode 0700, made by the box before the first command that names it. A command naming it
that fails on a full ``/var/tmp`` (about 31 MiB per box; the inspect image's default 272 MB
holds eight, other images' 64 MB two) says so first, with what to set (``FULL``): Inspect
shows that in its ``SandboxInjectionError``.

Why the digest is keyed by a secret of this process (not the bare session id, a box number or
a uid): another box could otherwise create the directory first and make it unusable (Inspect
refuses a directory owned by another uid); ``/var/tmp`` is closed to listing, so a name nobody
can guess is one nobody can take. What the box put there goes when the box ends (its files are
removed by uid, ``/var/tmp`` included).
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
# takes about 31 MiB per box: FARM_SANDBOX_TMP_MB, 272 for the inspect image, holds eight).
FULL = (
    "farm: the sandbox's /var/tmp is full: each sample using Inspect's injected tools keeps "
    "about 32 MiB there (and its server about 33 MiB of memory); give the farm's workers a "
    "larger FARM_SANDBOX_TMP_MB and FARM_SANDBOX_MEMORY_MB, or fewer such samples at once "
    "(FARM_MAX_SESSIONS)\n"
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
