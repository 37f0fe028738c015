"""``read_reply``: a sent cell's reply, read in the caller's own task while timers keep the rules.

Rules: at the timeout or a flood of output the cell is interrupted (SIGINT, its host call
abandoned), ``grace_s`` later its process group is killed, and 5 s after that the read is given
up; when the process ends (a checkpoint or a child may hold its socket open, so no end of
stream need come) the read is given up 50 ms later (its last frame may be in flight).
Giving up ends the reader's stream (``feed_eof``, reading paused): only ever the stream of a
process that is then replaced. No task or future per condition: docs/design/kernel.md.
"""

from __future__ import annotations

import asyncio
import signal

from .. import KIND_OUTPUT_LIMIT, KIND_TIMEOUT
from ..wire.framing import FrameError
from ..wire.protocol import Kind
from ..wire.session_frames import CellDone
from .session_process import SessionProcess

LAST_FRAME_S = 0.05  # after the process's end, for a reply it sent just before
KILL_WAIT_S = 5.0  # after SIGKILL, for the end of its stream


class CellWatch:
    """The timers and callbacks of one running cell; ``reason`` and ``killed`` say what they did."""

    def __init__(self, proc: SessionProcess, timeout_s: float, grace_s: float) -> None:
        self.proc = proc
        self.grace_s = grace_s
        self.loop = asyncio.get_running_loop()
        self.reason: Kind | None = None
        self.killed = False
        self.ended = False  # the read was given up
        self.timer = self.loop.call_later(timeout_s, self.interrupt, KIND_TIMEOUT)
        proc.waker = self.poke
        self.poke()  # a flood or an end before the watch began

    def poke(self) -> None:
        """A flood of output or the process's end (``SessionProcess.wake``)."""
        if self.ended:
            return
        if self.proc.exited.is_set():
            self.timer.cancel()
            self.timer = self.loop.call_later(LAST_FRAME_S, self.give_up)
            self.ended = True  # nothing more to do but that
        elif self.proc.flood.is_set():
            self.interrupt(KIND_OUTPUT_LIMIT)

    def interrupt(self, reason: Kind) -> None:
        if self.reason is not None or self.ended:
            return
        self.reason = reason
        self.proc.abandon_call()
        self.proc.signal(signal.SIGINT, group=False)
        self.timer.cancel()
        self.timer = self.loop.call_later(self.grace_s, self.kill)

    def kill(self) -> None:
        self.killed = True
        self.proc.signal(signal.SIGKILL, group=True)
        self.timer = self.loop.call_later(KILL_WAIT_S, self.give_up)

    def give_up(self) -> None:
        self.ended = True
        if not self.proc.closed:
            self.proc.writer.transport.pause_reading()  # type: ignore[attr-defined]
        self.proc.reader.feed_eof()

    def stop(self) -> None:
        self.timer.cancel()
        self.proc.waker = None


async def read_reply(
    proc: SessionProcess, timeout_s: float, grace_s: float
) -> tuple[CellDone | None, Kind | None, bool]:
    """The cell's reply (it was sent), or ``None`` when the process or its stream ended first;
    with the reason it was interrupted, if it was, and whether it was killed."""
    watch = CellWatch(proc, timeout_s, grace_s)
    try:
        reply = await proc.cell_reply()
    except (FrameError, ConnectionError, OSError):
        reply = None
    finally:
        watch.stop()
    return reply, watch.reason, watch.killed
