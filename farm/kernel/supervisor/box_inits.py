"""``BoxInits``: the boxes with namespaces, each held through its pid 1, by box number.

A box is made on its number's first use (the zygote forks its init, which starts the box's
processes). At its end its init empties it and it is kept for the number's next box, or, when
it cannot be emptied so or the next box wants another disk, it is ended: its init killed and
reaped, which takes every process and mount of the box. Making, emptying and ending a box of
one number never overlap (a lock per number). Design: docs/design/boxes.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from ..boxes.box_protocol import Recycle
from ..boxes.pool import DEFAULT_DISK_MB, Box, BoxPool
from .links import RESET_TIMEOUT_S, BoxInit, Link, RequestError, request_ids

log = logging.getLogger("farm.kernel")


class BoxInits:
    """Each box's pid 1 and the connection to it, by box number (``namespaces`` isolation)."""

    def __init__(self, zygote: Link, pool: BoxPool, groups: dict[int, set[int]]) -> None:
        self.zygote = zygote
        self.pool = pool
        self.groups = groups  # the spawner's: box number -> its commands' groups, dropped here
        self.boxes: dict[int, tuple[Link, BoxInit]] = {}  # box number -> its pid 1
        self.making: dict[int, asyncio.Lock] = {}  # box number -> held while made or ended
        self.kept: set[int] = set()  # numbers whose emptied box waits for their next box
        self.loop = asyncio.get_running_loop()

    async def link(self, box: Box) -> Link:
        """The connection to ``box``'s pid 1 (``namespaces``), the box made on first use; the
        zygote's own with other isolation."""
        if self.pool.isolation != "namespaces":
            return self.zygote
        async with self._making(box):  # one box at a time per number
            held = self.boxes.get(box.number)
            disk_mb = box.limits.get("disk_mb", DEFAULT_DISK_MB)
            if held is not None:
                if held[0].alive and held[1].disk_mb == disk_mb:
                    self._unkeep(box.number)
                    return held[0]
                # its init died under it, or it is kept with a disk of another size: a new box
                if not await self._end_now(box):
                    raise RequestError("unavailable", f"box {box.number} did not end")
            link = await self._make(box)
            self.boxes[box.number][1].disk_mb = disk_mb
            return link

    async def endpoint(self, box: Box) -> tuple[int, socket.socket]:
        """``box``'s proxy endpoint, made by its pid 1 in its network namespace: the port and
        the listening socket (``egress.py``). Boxes without a network of their own have none:
        a port on a shared loopback would be every box's way out."""
        if self.pool.isolation != "namespaces":
            raise RequestError(
                "bad_request",
                f"egress needs boxes with namespaces; this sandbox has {self.pool.isolation} "
                "boxes (farm doctor says why)",
            )
        link = await self.link(box)
        try:
            return await link.listen()
        except (asyncio.TimeoutError, OSError) as exc:
            raise RequestError("unavailable", f"no proxy endpoint for the box: {exc!r}") from None

    async def empty(self, box: Box) -> bool:
        """Every process of the box but its pid 1 gone (reaped); its files stay."""
        held = self.boxes.get(box.number)
        if held is None:
            return True
        try:
            return await held[0].reset({"op": "reset", "id": next(request_ids)})
        except (asyncio.TimeoutError, RequestError, OSError):
            return False

    async def recycle(self, box: Box) -> bool:
        """A box's end that keeps its init and namespaces for the number's next box: every
        process killed and what the box left removed by its init (``namespaces.empty_box``).
        A box that cannot be emptied so is ended instead (``_end_now``)."""
        async with self._making(box):
            held = self.boxes.get(box.number)
            if held is None:
                return True
            link = held[0]
            if link.alive:
                message: Recycle = {"op": "recycle", "id": next(request_ids), "box": box.describe()}
                try:
                    emptied = await link.reset(message)
                except (asyncio.TimeoutError, RequestError, OSError):
                    emptied = False
                if emptied and link.alive:
                    self.groups.pop(box.number, None)
                    if box.number not in self.kept:
                        self.kept.add(box.number)
                        self.pool.kept += 1
                    return True
            return await self._end_now(box)

    async def _end_now(self, box: Box) -> bool:
        """The box's pid 1 killed and reaped (the caller holds the number's lock): the kernel
        has then ended every process of its pid namespace, and its mounts went with its mount
        namespace."""
        self._unkeep(box.number)
        held = self.boxes.pop(box.number, None)
        self.groups.pop(box.number, None)
        if held is None:
            return True
        link, init = held
        init.kill()
        self.loop.remove_reader(link.sock)
        link.close()
        try:
            await asyncio.wait_for(init.exited.wait(), RESET_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.boxes[box.number] = held  # tried again (``Spawner._retry``) until it ends
            log.error("box %d did not end in %.0f s; it is not reused", box.number, RESET_TIMEOUT_S)
            return False
        init.close()
        return True

    async def _make(self, box: Box) -> Link:
        key, pid, fds = await self.zygote.fork({"op": "box", "box": box.describe()})
        try:
            init = BoxInit(pid)
        except OSError as exc:  # gone already: its connection closes, nothing of it is left
            for fd in fds:
                os.close(fd)
            raise RequestError("unavailable", f"the box's init is gone: {exc}") from None
        self.zygote.register(key, init)
        link = Link(socket.socket(fileno=fds[0]), in_box=True)
        self.boxes[box.number] = (link, init)
        self.loop.add_reader(link.sock, self._on_box, link)
        return link

    def _making(self, box: Box) -> asyncio.Lock:
        return self.making.setdefault(box.number, asyncio.Lock())

    def _unkeep(self, number: int) -> None:
        if number in self.kept:
            self.kept.discard(number)
            self.pool.kept -= 1

    def _on_box(self, link: Link) -> None:
        if not link.receive():
            self.loop.remove_reader(link.sock)
