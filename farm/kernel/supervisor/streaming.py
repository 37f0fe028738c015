"""Events of a running cell, sent to the host before its result: the live half of the protocol.

Invariants: the concatenated ``stream`` texts of a cell equal its result's ``stdout``/``stderr``
(caps hold for the stream exactly as for the result); chunks are batched, at most one flush
every ``FLUSH_S``, but a lone print is not held back; displays are bounded per cell
(``MAX_DISPLAYS``, ``DISPLAY_BYTES``). Event kinds and frames: docs/design/kernel.md.
"""

from __future__ import annotations

import asyncio
import codecs
import json
from collections.abc import Callable
from typing import Any, Literal

from ..wire.protocol import CellEvent, ValueBundle
from .output import MARKER, CappedBuffer

FLUSH_S = 0.03
TICK_S = 0.1
MAX_DISPLAYS = 200
DISPLAY_BYTES = 16 * 1024 * 1024

_DECODER = codecs.getincrementaldecoder("utf-8")
Emit = Callable[[CellEvent], None]  # an event of the running cell, sent as an ``event`` frame


class _Tap:
    """The streamed part of one output stream of one cell."""

    def __init__(self, name: Literal["stdout", "stderr"], buf: CappedBuffer) -> None:
        self.name: Literal["stdout", "stderr"] = name
        self.buf = buf
        self.sent = 0  # bytes of the buffer's head streamed so far
        self.pending = bytearray()
        self.used: codecs.IncrementalDecoder | None = None  # made at the first output

    @property
    def decoder(self) -> codecs.IncrementalDecoder:
        if self.used is None:
            self.used = _DECODER(errors="replace")
        return self.used

    def take(self) -> str:
        text = self.decoder.decode(bytes(self.pending))
        self.pending.clear()
        return text

    def rest(self) -> str:
        """What the result keeps beyond the streamed head, decoded to finish the stream."""
        buf = self.buf
        if self.used is None and not self.pending and buf.total == 0:
            return ""  # a silent cell (most quick ones): no decoder made, none to finish
        self.pending += bytes(buf.head[self.sent :])
        self.sent = len(buf.head)
        if buf.truncated:
            cut = buf.total - len(buf.head) - len(buf.tail)
            text = self.take() + self.decoder.decode(b"", final=True)
            return text + MARKER.format(cut=cut) + bytes(buf.tail).decode("utf-8", "replace")
        self.pending += bytes(buf.tail)
        return self.take() + self.decoder.decode(b"", final=True)


class CellEvents:
    """The event emitter of one running cell (created only when the host asked for events)."""

    def __init__(self, emit: Emit, out: CappedBuffer, err: CappedBuffer) -> None:
        self.emit = emit
        self.taps = {"stdout": _Tap("stdout", out), "stderr": _Tap("stderr", err)}
        self.timer: asyncio.TimerHandle | None = None
        self.last_flush = float("-inf")
        self.tick: asyncio.TimerHandle | None = None
        self.live = False  # until started(): the cell may not have been sent yet
        self.displays = 0
        self.display_bytes = 0
        self.limited = False
        self.closed = False

    def started(self) -> None:
        """The cell was sent: events flow from here on (output that came first waits)."""
        self.live = True
        self.emit({"type": "started"})
        self.tick = asyncio.get_running_loop().call_later(TICK_S, self._running)
        self._schedule()

    def _running(self) -> None:
        if not self.closed:
            self.emit({"type": "running"})

    def output(self, buf: CappedBuffer) -> None:
        """New bytes reached ``buf``: stream what is new in its head, soon."""
        if self.closed:
            return
        for tap in self.taps.values():
            if tap.buf is buf and len(buf.head) > tap.sent:
                tap.pending += bytes(buf.head[tap.sent :])
                tap.sent = len(buf.head)
        self._schedule()

    def _schedule(self) -> None:
        if not self.live:
            return
        if self.timer is None and any(tap.pending for tap in self.taps.values()):
            loop = asyncio.get_running_loop()
            wait = self.last_flush + FLUSH_S - loop.time()
            if wait <= 0:
                self.flush()  # quiet until now: no reason to wait
            else:
                self.timer = loop.call_later(wait, self.flush)

    def flush(self) -> None:
        self.last_flush = asyncio.get_running_loop().time()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for tap in self.taps.values():
            if tap.pending:
                text = tap.take()
                if text:
                    self.emit({"type": "stream", "name": tap.name, "text": text})

    def display(self, value: Any) -> None:
        if self.closed or self.limited or not isinstance(value, dict):
            return
        self.flush()  # output printed before display() comes first
        size = len(json.dumps(value))
        if self.displays >= MAX_DISPLAYS or self.display_bytes + size > DISPLAY_BYTES:
            self.limited = True
            note = "[farm: display() limit of this cell reached; further displays dropped]\n"
            self.emit({"type": "stream", "name": "stderr", "text": note})
            return
        self.displays += 1
        self.display_bytes += size
        bundle: ValueBundle = {"text": value.get("text", ""), "data": value.get("data", {})}
        self.emit({"type": "display", "value": bundle})

    def finish(self) -> None:
        """The cell ended and its buffers were drained: send the rest, then stop."""
        if self.closed:
            return
        if self.tick is not None:
            self.tick.cancel()
        self.flush()
        for tap in self.taps.values():
            text = tap.rest()
            if text:
                self.emit({"type": "stream", "name": tap.name, "text": text})
        self.closed = True
