"""Resumable JSONL sweeps: thousands of snippets through a farm, one output line per id.

Input lines: ``{"id": ..., "code": "..."}`` or ``{"id": ..., "cells": ["...", ...]}`` (cells run
in one session, in order, stopping at the first failure), optional ``timeout_s``, ``setup``
(a cell run first) and ``files`` (``{"path": "text"}`` written to the workspace first). Invariants:
- every input id appears in the output exactly once; a malformed line becomes an error line
  and the sweep goes on; duplicate ids are refused before anything runs;
- an output line is written whole and flushed as soon as its item ends, so an interrupted
  sweep leaves a valid file that ``resume`` continues;
- only infrastructure failures (``sandbox_lost``, ``infra``) are retried; user failures,
  timeouts and OOMs are results.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

import farm
from farm.client import Farm
from farm.errors import (
    BrokerUnavailable,
    FarmError,
    FileOperationError,
    InvalidRequest,
    SessionLost,
    StateLost,
)
from farm.models import ErrorKind, ExecResult
from farm.streams import mime_stream

RETRYABLE = {ErrorKind.SANDBOX_LOST.value, ErrorKind.INFRA.value}


class SweepItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | int
    code: str | None = None
    cells: list[str] | None = None
    setup: str | None = None
    timeout_s: float | None = Field(None, gt=0)
    files: dict[str, str] | None = Field(None, description="workspace path -> text content")

    @model_validator(mode="after")
    def _one_body(self) -> SweepItem:
        if (self.code is None) == (self.cells is None):
            raise ValueError("give exactly one of 'code' or 'cells'")
        return self

    def all_cells(self) -> list[str]:
        body = self.cells if self.cells is not None else [self.code or ""]
        return ([self.setup] if self.setup else []) + body


class SweepRecord(BaseModel):
    """One output line."""

    id: str | int
    status: str  # ok | error
    kind: str | None = None
    message: str | None = None
    cells: list[ExecResult] = Field(default_factory=list)
    attempts: int = 0
    duration_s: float = 0.0
    cached: bool = False
    manifest: dict[str, Any] = Field(default_factory=dict)
    journal: list[dict[str, Any]] | None = Field(
        None, description="with --journal: the item's session journal as mime_stream dicts"
    )


class SweepSummary(BaseModel):
    total: int = 0
    skipped: int = 0
    by_outcome: dict[str, int] = Field(default_factory=dict)
    duration_s: float = 0.0
    interrupted: bool = False
    stopped: str | None = None  # why the sweep stopped before the end (items left for --resume)


def read_items(path: Path) -> tuple[list[SweepItem], list[SweepRecord]]:
    """Parse the input; malformed lines become error records, duplicate ids an error."""
    items: list[SweepItem] = []
    bad: list[SweepRecord] = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            raw: Any = None
            try:
                raw = json.loads(line)
                items.append(SweepItem.model_validate(raw))
            except (ValueError, ValidationError) as exc:
                given = raw.get("id") if isinstance(raw, dict) else None
                if not isinstance(given, str | int):
                    given = f"line-{number}"
                bad.append(
                    SweepRecord(
                        id=given,
                        status="error",
                        kind="input",
                        message=f"line {number}: {exc}"[:2000],
                    )
                )
    counts = Counter([str(item.id) for item in items] + [str(r.id) for r in bad])
    duplicates = sorted(i for i, n in counts.items() if n > 1)
    if duplicates:
        raise InvalidRequest(f"duplicate ids in {path}: {', '.join(duplicates[:10])}")
    return items, bad


def done_ids(out_path: Path) -> set[str]:
    """Ids already in the output (a torn last line from a crash is ignored)."""
    if not out_path.exists():
        return set()
    ids = set()
    with out_path.open(encoding="utf-8") as f:
        for line in f:
            try:
                ids.add(str(json.loads(line)["id"]))
            except (ValueError, KeyError, TypeError):
                continue
    return ids


@dataclass
class SweepPlan:
    """What a sweep will do, decided from the input (and the output, when resuming) alone."""

    todo: list[SweepItem]
    bad: list[SweepRecord]
    skipped: int
    total: int
    fresh: bool


def plan_sweep(in_path: Path, out_path: Path, *, resume: bool = False) -> SweepPlan:
    """Read and check the input before anything starts; raises ``InvalidRequest`` on bad input."""
    items, bad = read_items(in_path)
    skip = done_ids(out_path) if resume else set()
    return SweepPlan(
        todo=[item for item in items if str(item.id) not in skip],
        bad=[record for record in bad if str(record.id) not in skip],
        skipped=len(skip),
        total=len(items) + len(bad),
        fresh=not resume,
    )


class Sweep:
    def __init__(
        self,
        farm_: Farm,
        *,
        concurrency: int = 8,
        timeout_s: float = 30.0,
        retries: int = 2,
        image: str = "default",
        cache_dir: Path | None = None,
        journal: bool = False,
        on_record: Callable[[SweepRecord], None] | None = None,
        on_start: Callable[[int], None] | None = None,
    ) -> None:
        self.farm = farm_
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.retries = retries
        self.image = image
        self.cache_dir = cache_dir
        self.journal = journal
        self.on_record = on_record
        self.on_start = on_start
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers: dict[str, dict[str, Any]] = {}
        self._halt: BrokerUnavailable | None = None  # the outage that stopped the sweep

    def run(self, plan: SweepPlan, out_path: Path) -> SweepSummary:
        """Run what ``plan`` left to do, appending one line per item to ``out_path``."""
        workers = self.farm.broker.call(self.farm.workers, sent=False)
        self._workers = {str(w["id"]): w for w in workers}
        summary = SweepSummary(total=plan.total, skipped=plan.skipped)
        if self.on_start is not None:
            self.on_start(len(plan.todo) + len(plan.bad))
        outcomes: Counter[str] = Counter()
        t0 = time.perf_counter()
        out_path.parent.mkdir(parents=True, exist_ok=True)
        with out_path.open("w" if plan.fresh else "a", encoding="utf-8") as out:
            for record in plan.bad:
                self._emit(out, record, outcomes)
            try:
                for record in self._execute(plan.todo):
                    self._emit(out, record, outcomes)
            except KeyboardInterrupt:
                summary.interrupted = True
        if self._halt is not None:
            summary.interrupted = True
            summary.stopped = f"{self._halt}; the items not run are left for --resume"
        summary.by_outcome = dict(outcomes)
        summary.duration_s = time.perf_counter() - t0
        return summary

    def _emit(self, out: Any, record: SweepRecord, outcomes: Counter[str]) -> None:
        with self._lock:
            skip = {"journal"} if record.journal is None else None
            out.write(record.model_dump_json(exclude=skip) + "\n")
            out.flush()
        outcomes[f"{record.status}/{record.kind or '-'}"] += 1
        if self.on_record is not None:
            self.on_record(record)

    def _execute(self, items: list[SweepItem]) -> Iterator[SweepRecord]:
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="farm-sweep")
        pending: set[Future[SweepRecord | None]] = set()
        queue = iter(items)
        try:
            for item in queue:
                pending.add(pool.submit(self.run_item, item))
                if len(pending) >= self.concurrency * 2:
                    break
            while pending:
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    record = future.result()
                    if record is not None:
                        yield record
                    nxt = None if self._stop.is_set() else next(queue, None)
                    if nxt is not None:
                        pending.add(pool.submit(self.run_item, nxt))
        finally:
            self._stop.set()
            pool.shutdown(wait=False, cancel_futures=True)

    def run_item(self, item: SweepItem) -> SweepRecord | None:
        """The item's record; ``None`` when the broker stopped the sweep before it ran."""
        key = self._cache_key(item)
        cached = self._cache_get(key)
        if cached is not None:
            return cached.model_copy(update={"id": item.id, "cached": True})
        t0 = time.perf_counter()
        record = SweepRecord(id=item.id, status="error")
        for attempt in range(1, self.retries + 2):
            sessions: list[str] = []
            attempted = self._attempt(item, sessions)
            if attempted is None:
                return None
            record = attempted
            record.attempts = attempt
            if self.journal and sessions and self._halt is None:
                record.journal = list(mime_stream(self.farm.replay(sessions[-1])))
            if record.kind not in RETRYABLE or self._stop.is_set():
                break
        record.duration_s = time.perf_counter() - t0
        if record.kind not in RETRYABLE:
            self._cache_put(key, record)
        return record

    def _attempt(self, item: SweepItem, sessions: list[str]) -> SweepRecord | None:
        """One try at an item; the session it opens is added to ``sessions``. An outage of
        the broker longer than the farm waits out stops the sweep: an item it kept from being
        sent gets no record (``--resume`` runs it), one that may have run an ``infra`` one."""
        timeout = item.timeout_s or self.timeout_s
        cells = item.all_cells()
        results: list[ExecResult] = []
        try:
            if len(cells) == 1 and not item.files:  # a one-shot run: one round trip, not three
                results.append(self.farm.run(cells[0], image=self.image, timeout_s=timeout))
                sessions.extend([results[0].session_id] if results[0].session_id else [])
                manifest = self._manifest(results[0].worker)
            else:
                with self.farm.session(self.image, timeout_s=timeout) as session:
                    sessions.append(session.id)
                    for path, content in (item.files or {}).items():
                        session.files.write(path, content)
                    for code in cells:
                        results.append(session.run(code, timeout))
                        if not results[-1].ok:
                            break
                    manifest = self._manifest(session.worker)
        except StateLost as exc:
            results.append(exc.result)
            manifest = self._manifest(exc.result.worker)
        except SessionLost as exc:
            return _failed(item, ErrorKind.SANDBOX_LOST.value, str(exc), results)
        except FileOperationError as exc:  # the item's files are bad input, never retried
            return _failed(item, "input", str(exc), results)
        except FarmError as exc:
            if isinstance(exc, BrokerUnavailable):
                self._halt = exc
                self._stop.set()
                if not exc.sent:
                    return None
            return _failed(item, ErrorKind.INFRA.value, f"{type(exc).__name__}: {exc}", results)
        last = results[-1] if results else None
        failed = last is not None and not last.ok
        return SweepRecord(
            id=item.id,
            status="error" if failed else "ok",
            kind=last.kind.value if failed and last and last.kind else None,
            message=f"{last.error.ename}: {last.error.evalue}"[:2000]
            if failed and last and last.error
            else None,
            cells=results,
            manifest=manifest,
        )

    def _manifest(self, worker_id: str | None) -> dict[str, Any]:
        worker = self._workers.get(str(worker_id))
        if worker is None and worker_id:  # started after the sweep did; the broker may be down
            worker = self.farm.broker.quietly(lambda: self.farm.registry.worker(str(worker_id)))
        sandbox = (worker or {}).get("sandbox") or {}
        return {
            "farm_version": farm.__version__,
            "worker": worker_id,
            "image": self.image,
            "image_digest": sandbox.get("image_digest"),
            "backend": sandbox.get("backend"),
            "limits": sandbox.get("limits"),
        }

    # --- cache ----------------------------------------------------------------------------

    def _cache_key(self, item: SweepItem) -> str | None:
        """A digest of everything that can change an item's outcome: its cells (setup
        included), files and timeout, and the image it runs on as the workers serving it
        report it (digest and limits); a change to any of them misses the cache."""
        if self.cache_dir is None:
            return None
        served = [
            (w.get("sandbox") or {}) for w in self._workers.values() if w.get("image") == self.image
        ]
        basis = {
            "cells": item.all_cells(),
            "files": item.files or {},
            "timeout_s": item.timeout_s or self.timeout_s,
            "image": self.image,
            "digests": sorted({str(sandbox.get("image_digest")) for sandbox in served}),
            "limits": sorted(
                {json.dumps(sandbox.get("limits"), sort_keys=True) for sandbox in served}
            ),
        }
        return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()

    def _cache_get(self, key: str | None) -> SweepRecord | None:
        if key is None or self.cache_dir is None:
            return None
        path = self.cache_dir / f"{key}.json"
        try:
            return SweepRecord.model_validate_json(path.read_text())
        except (OSError, ValidationError):
            return None

    def _cache_put(self, key: str | None, record: SweepRecord) -> None:
        if key is None or self.cache_dir is None:
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_dir / f".{key}.{threading.get_ident()}"
        tmp.write_text(record.model_dump_json())
        tmp.replace(self.cache_dir / f"{key}.json")


def _failed(item: SweepItem, kind: str, message: str, cells: list[ExecResult]) -> SweepRecord:
    return SweepRecord(id=item.id, status="error", kind=kind, message=message, cells=cells)
