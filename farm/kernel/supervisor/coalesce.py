"""``Coalesce``: one call of a batch function answers every ask made within ``COALESCE_S``.

For work whose cost is the same for one key as for many (a pass over ``/proc``, a listing of
the shared directories): boxes end in bursts, and what a box's end costs then no longer grows
with the number of boxes that end at once. Invariant: every asker hears the answer for its
key, or the batch's exception; none waits forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

COALESCE_S = 0.002  # asks this close together share one call

K = TypeVar("K")
A = TypeVar("A")
R = TypeVar("R")


class Coalesce(Generic[K, A, R]):
    """``await ask(key, arg)``: the answer for ``key`` of one ``work({key: arg, ...})`` call made
    for every ask within ``COALESCE_S``."""

    def __init__(self, work: Callable[[dict[K, A]], dict[K, R]]) -> None:
        self.work = work
        self.loop = asyncio.get_running_loop()
        self.asked: dict[K, A] = {}
        self.waiting: list[tuple[K, asyncio.Future[R]]] = []

    async def ask(self, key: K, arg: A) -> R:
        future: asyncio.Future[R] = self.loop.create_future()
        if not self.waiting:
            self.loop.call_later(COALESCE_S, self._run)
        self.asked[key] = arg
        self.waiting.append((key, future))
        return await future

    def _run(self) -> None:
        asked, waiting = self.asked, self.waiting
        self.asked, self.waiting = {}, []
        try:
            answers = self.work(asked)
        except Exception as exc:  # each asker hears of it, none waits forever
            for _, future in waiting:
                if not future.done():
                    future.set_exception(exc)
            return
        for key, future in waiting:
            if not future.done():
                future.set_result(answers[key])
