"""Answers from a session's held processes, waited for with their ends watched.

A held copy, its standby or a session process between cells answers an order with one frame on
the control socket. Who answers is known by a pidfd, and its end (the pidfd reads as ready)
ends the wait at once, not after the order's timeout: what it sent just before it ended is
still read (``ENDED_GRACE_S``). Nothing here polls: every wait is woken by a frame or an end.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..wire.framing import FrameError, encode, read_frame

if TYPE_CHECKING:
    from .session_process import SessionProcess

HOLD_TIMEOUT_S = 60.0  # a checkpoint reads every file of the box into its memory
ENDED_GRACE_S = 0.05  # a woken process ended: what it sent just before is read in this time


async def ask(
    proc: SessionProcess,
    order: dict[str, Any] | None,
    timeout_s: float = HOLD_TIMEOUT_S,
    watch: int | None = None,
) -> dict[str, Any]:
    """Send ``order`` (if any) to a session process between cells and read the one frame
    that answers it (``{"error": ...}`` when none came): given the pidfd of the process that
    is to answer (``watch``), its end is no answer at once, not after ``timeout_s``."""
    if order is not None:
        proc.writer.write(encode(order))
        await proc.writer.drain()
    reading = asyncio.ensure_future(read_frame(proc.reader))
    try:
        if watch is not None and not await _first(reading, watch, timeout_s):
            return {"error": "the process to answer ended first"}
        reply = await asyncio.wait_for(reading, timeout_s)
    except (asyncio.TimeoutError, FrameError, ConnectionError, OSError) as exc:
        return {"error": f"no answer ({type(exc).__name__})"}
    finally:
        reading.cancel()
    return reply if isinstance(reply, dict) else {"error": "the socket closed"}


async def _first(reading: asyncio.Future[Any], pidfd: int, timeout_s: float) -> bool:
    """Whether ``reading`` is done, or still may be, once its process has ended: a frame it
    sent just before it ended is in the socket, read at once (``ENDED_GRACE_S``)."""
    with on_end(pidfd) as end:
        await asyncio.wait({reading, end}, timeout=timeout_s, return_when="FIRST_COMPLETED")
    if reading.done() or not end.done():
        return True
    await asyncio.wait({reading}, timeout=ENDED_GRACE_S)
    return reading.done()


@contextlib.contextmanager
def on_end(pidfd: int) -> Iterator[asyncio.Future[None]]:
    """A future done once ``pidfd``'s process has ended (the pidfd reads as ready): woken by
    the end, not by a poll."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        yield ended
    finally:
        loop.remove_reader(pidfd)


async def all_ended(pidfds: list[int], deadline: float, loop: asyncio.AbstractEventLoop) -> bool:
    """Whether every process of ``pidfds`` ended by ``deadline`` (a pidfd reads as ready once
    its process has exited)."""
    for pidfd in pidfds:
        if select.select([pidfd], [], [], 0)[0]:
            continue
        with on_end(pidfd) as end:
            try:
                await asyncio.wait_for(end, max(deadline - loop.time(), 0.0))
            except asyncio.TimeoutError:
                return False
    return True


def wake(pidfd: int, sig: int) -> None:
    """Wake a held process: continued first, in case the box's code stopped it (same uid)."""
    signal.pidfd_send_signal(pidfd, signal.SIGCONT)
    signal.pidfd_send_signal(pidfd, sig)
