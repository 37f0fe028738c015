"""The farm kernel: the exec server that runs *inside* a sandbox.

Standard library only, so it runs in any ``python3`` image; it imports nothing of farm's
outside this package. Layout, from the wire inwards:

- ``framing``    length-prefixed JSON frames (the one wire format)
- ``protocol``   every frame's shape, defined once (``TypedDict``s; ``farm.models`` mirrors them)
- ``auth``       challenge-response handshake with a shared token
- ``server``     the asyncio server: connections, handshakes, requests
- ``manager``    the supervisor's sessions: spawn, execute with deadlines and caps, replace, close
- ``zygote``     a token-free, single-threaded fork server that spawns session processes
- ``session``    the loop inside one session process
- ``repl``       IPython-style cell execution (``ast``-based last-expression value)
- ``render``     the value's MIME bundle and its bounded text
- ``output``     head+tail capped capture buffers
- ``streaming``  a running cell's events (output chunks, displays) sent before its result
- ``cell``       the result dict of one execute call
- ``judges``     the supervisor's side of an item's judge step (``farm.judge``)
- ``judging``    the judge's runner in a box: compile, tests (``testrun``), ``checkers``,
                 the image's ``languages``
- ``client``     ``KernelClient``, the stdlib client every host-side layer reuses
"""

import sys

MIN_PYTHON = (3, 9)
if sys.version_info < MIN_PYTHON:  # any image's python3 may start it: say why it cannot run
    raise SystemExit(f"farm's kernel needs Python >= 3.9; this is {sys.version.split()[0]}")

from .protocol import KINDS as KINDS  # noqa: E402 - after the version check
from .protocol import Kind  # noqa: E402

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
