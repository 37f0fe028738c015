"""The farm kernel: the exec server that runs *inside* a sandbox (standard library only; it
imports nothing of farm's outside this package). Grouped by the process that runs the code,
imports running one way, down this list (``tests/test_layering.py``):

- ``supervisor/``  the kernel's main process: server, requests, sessions, items, spawner, judges
- ``boxes/``       the zygote, each box's init, a command's keeper, a judge's runner
- ``repl/``        a session process: its loop, cells, values
- ``tools/``       what a session's code calls: files, patches, documents, the browser
- ``judge/``       the judge's pure parts: output checkers, the image's language table
- ``wire/``        both ends of the host's connection: frames, protocol, auth, the client
"""

import sys

MIN_PYTHON = (3, 9)
if sys.version_info < MIN_PYTHON:  # any image's python3 may start it: say why it cannot run
    raise SystemExit(f"farm's kernel needs Python >= 3.9; this is {sys.version.split()[0]}")

from .wire.protocol import KINDS as KINDS  # noqa: E402 - after the version check
from .wire.protocol import Kind  # noqa: E402

KERNEL_VERSION = "0.1.0"

# Failure kinds (``protocol.Kind`` is where they are written; mypy holds these to it), also the
# values of ``farm.models.ErrorKind``.
KIND_USER: Kind = "user"
KIND_TIMEOUT: Kind = "timeout"
KIND_OOM: Kind = "oom"
KIND_OUTPUT_LIMIT: Kind = "output_limit"
KIND_STATE_LOST: Kind = "state_lost"
KIND_SANDBOX_LOST: Kind = "sandbox_lost"
KIND_INFRA: Kind = "infra"
KIND_INPUT: Kind = "input"  # the request itself is bad (too large, malformed): nothing was run

# Part of the message of a ``state_lost`` result whose code never started (the session died
# between calls, or the call named an old epoch): the host may run it again after a restore.
NOT_RUN = "nothing was run"
