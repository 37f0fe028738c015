"""Capture buffers that keep the head and the tail of a stream and count what they cut.

Memory stays bounded by the cap whatever the sandboxed code writes (a flood, one 100 MB line,
invalid UTF-8): bytes past the head go to a tail window that drops its oldest bytes.
"""

from __future__ import annotations

import os

MARKER = "\n[... farm cut {cut} bytes of output ...]\n"


class CappedBuffer:
    def __init__(self, cap: int) -> None:
        self.reset(cap)

    def reset(self, cap: int) -> None:
        self.cap = max(cap, 0)
        self.head_cap = self.cap // 2
        self.tail_cap = self.cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def write(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        if len(data) >= self.tail_cap:
            self.tail = bytearray(data[len(data) - self.tail_cap :])
            return
        self.tail += data
        excess = len(self.tail) - self.tail_cap
        if excess > 0:
            del self.tail[:excess]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        if not self.truncated:
            return bytes(self.head + self.tail).decode("utf-8", errors="replace")
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        cut = self.total - len(self.head) - len(self.tail)
        return head + MARKER.format(cut=cut) + tail


def drain_into(fd: int, buf: CappedBuffer) -> bool:
    """Move what the non-blocking pipe ``fd`` holds into ``buf``; False once it reached its
    end (or broke), when the caller stops watching it."""
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        buf.write(data)
