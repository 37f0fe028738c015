"""The asyncio twins: ``AsyncFarm`` and ``AsyncSession``, the same calls run off the loop.

They wrap the sync client (``asyncio.to_thread``), so that message building, fencing and retries
exist once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

from farm.client.farm import Farm
from farm.client.session import Session
from farm.client.snapshots import Snapshot
from farm.events.run_events import Event
from farm.judge.problems import Problem
from farm.models import CommandResult, ExecResult
from farm.models.batch import BatchRecord
from farm.models.branches import Checkpoint
from farm.models.judge import JudgeResult
from farm.models.snapshot_info import DrainReport


class AsyncFarm:
    """The asyncio twin of ``Farm``: the same calls, run off the event loop."""

    def __init__(self, farm: Farm) -> None:
        self.sync = farm

    @classmethod
    async def connect(cls, broker_url: str | None = None) -> AsyncFarm:
        return cls(await asyncio.to_thread(Farm.connect, broker_url))

    @classmethod
    async def local(
        cls, workers: int = 2, *, backend: str = "docker", images: dict[str, int] | None = None
    ) -> AsyncFarm:
        return cls(await asyncio.to_thread(Farm.local, workers, backend=backend, images=images))

    async def session(self, image: str = "default", **kwargs: Any) -> AsyncSession:
        return AsyncSession(await asyncio.to_thread(self.sync.session, image, **kwargs))

    async def attach(self, session_id: str, **kwargs: Any) -> AsyncSession:
        return AsyncSession(await asyncio.to_thread(self.sync.attach, session_id, **kwargs))

    async def run(self, code: str, **kwargs: Any) -> ExecResult:
        return await asyncio.to_thread(self.sync.run, code, **kwargs)

    async def restore(self, snapshot: Snapshot | bytes | str, **kwargs: Any) -> AsyncSession:
        """``Farm.restore`` off the event loop: a new session holding ``snapshot``."""
        return AsyncSession(await asyncio.to_thread(self.sync.restore, snapshot, **kwargs))

    async def resume(self, session_id: str, **kwargs: Any) -> AsyncSession:
        """``Farm.resume`` off the event loop: a paused session, back with its id."""
        return AsyncSession(await asyncio.to_thread(self.sync.resume, session_id, **kwargs))

    async def drain(self, worker_id: str) -> DrainReport:
        """``Farm.drain`` off the event loop: move a worker's sessions elsewhere."""
        return await asyncio.to_thread(self.sync.drain, worker_id)

    async def judge(
        self, language: str, source: str, tests: Any = None, **options: Any
    ) -> JudgeResult:
        """``Farm.judge`` off the event loop: one submission's verdicts, on ``tests`` or a
        ``problem`` (a ``Problem``, a stored one's digest, a package's directory)."""
        return await asyncio.to_thread(self.sync.judge, language, source, tests, **options)

    async def put_problem(self, problem: Problem, *, again: bool = False) -> str:
        """``Farm.put_problem`` off the event loop: the stored problem's digest."""
        return await asyncio.to_thread(self.sync.put_problem, problem, again=again)

    async def map(self, items: Iterable[Any], **kwargs: Any) -> AsyncIterator[BatchRecord]:
        """``async for record in farm.map(items)``: ``Farm.map`` read off the event loop (the
        items, a plain iterable, are read lazily in that thread too). Leaving early cancels
        the map, and so does cancelling the task that reads it; as for any async generator,
        the cancel of a ``break`` comes when the generator is closed, at once when nothing
        else holds it, else at ``contextlib.aclosing(farm.map(items))``'s end."""
        run = await asyncio.to_thread(self.sync.map, items, **kwargs)
        records = iter(run)
        done: Any = object()
        try:
            while (record := await asyncio.to_thread(next, records, done)) is not done:
                yield record
        finally:
            await asyncio.to_thread(run.close)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncFarm:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncSession:
    """The asyncio twin of ``Session`` (``await session.arun(code)``)."""

    def __init__(self, session: Session) -> None:
        self.sync = session
        self.id = session.id
        self.queue_s = session.queue_s  # how long opening it waited for room

    async def arun(self, code: str, timeout_s: float | None = None, **kwargs: Any) -> ExecResult:
        return await asyncio.to_thread(self.sync.run, code, timeout_s, **kwargs)

    async def exec(self, cmd: Any, **kwargs: Any) -> CommandResult:
        """``await session.exec(cmd)``: ``Session.exec`` off the loop."""
        return await asyncio.to_thread(self.sync.exec, cmd, **kwargs)

    async def stream(
        self, code: str, timeout_s: float | None = None, **kwargs: Any
    ) -> AsyncIterator[Event]:
        """``async for event in session.stream(code)``: the sync stream, read off the loop."""
        events = iter(self.sync.stream(code, timeout_s, **kwargs))
        done: Any = object()
        while (event := await asyncio.to_thread(next, events, done)) is not done:
            yield event

    async def checkpoint(self) -> Checkpoint:
        return await asyncio.to_thread(self.sync.checkpoint)

    async def rollback(self, cp: Checkpoint | str, *, keep: bool = True) -> None:
        await asyncio.to_thread(lambda: self.sync.rollback(cp, keep=keep))

    async def drop_checkpoint(self, cp: Checkpoint | str) -> None:
        await asyncio.to_thread(self.sync.drop_checkpoint, cp)

    async def fork(self, n: int = 1) -> list[AsyncSession]:
        """The forks as ``AsyncSession``s (``Forks.not_carried``: ``self.sync.fork``)."""
        return [AsyncSession(s) for s in await asyncio.to_thread(self.sync.fork, n)]

    async def snapshot(self, *, keep: bool = False) -> Snapshot:
        """``Session.snapshot`` off the loop: its bytes, or with ``keep`` its id."""
        return await asyncio.to_thread(self.sync.snapshot, keep=keep)

    async def pause(self) -> Snapshot:
        """``Session.pause`` off the loop: the box freed, the snapshot kept by the farm."""
        return await asyncio.to_thread(self.sync.pause)

    async def resume(self) -> None:
        """``Session.resume`` off the loop: back on any worker, same id."""
        await asyncio.to_thread(self.sync.resume)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
