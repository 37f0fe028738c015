"""Resumable JSONL sweeps: thousands of snippets through a farm, one output line per id.

A thin front over ``Farm.map``: it reads ``BatchItem`` lines, skips what ``--resume`` finds
done and the cache holds, and appends each record as it comes. Invariants: every input id
appears once in the output (a malformed line is an error line; duplicate ids are refused before
anything runs); a line is written whole and flushed as its item ends; only ``sandbox_lost`` and
``infra`` are retried. Input format and outages: docs/design/map-engine.md.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from farm.client import Farm
from farm.errors import BrokerUnavailable, InvalidRequest, SandboxUnavailable
from farm.judge import image_for
from farm.models import ErrorKind
from farm.models.batch import BatchItem, BatchRecord

# A sweep line and its output line are the map's items and records.
SweepItem = BatchItem
SweepRecord = BatchRecord
RETRYABLE = {ErrorKind.SANDBOX_LOST.value, ErrorKind.INFRA.value}
# A judge item's fields that change its outcome (in the cache key beside the cells).
JUDGE_FIELDS = {"language", "source", "tests", "checker", "special_judge", "all_tests"}
JUDGE_FIELDS |= {"keep_outputs", "judge_limits", "groups", "checker_program", "interactor"}
JUDGE_FIELDS |= {"problem"}  # a digest names its content: a stored problem's key is its name
REFRESH_S = 1.0  # the cache reads the live workers (their images' digests) at most this often


class SweepSummary(BaseModel):
    total: int = 0
    skipped: int = 0
    by_outcome: dict[str, int] = Field(default_factory=dict)
    duration_s: float = 0.0
    interrupted: bool = False
    stopped: str | None = None  # why the sweep stopped before the end (items left for --resume)
    scored: int = 0  # judge items with groups among those run (resumed ones are not counted)
    score: float = 0.0  # their points scored
    max_score: float = 0.0  # and their points

    def add_score(self, record: BatchRecord) -> None:
        """Count ``record``'s score, if its judge item has groups."""
        judge = record.judge
        if judge is not None and judge.score is not None and judge.max_score is not None:
            self.scored += 1
            self.score = round(self.score + judge.score, 6)
            self.max_score = round(self.max_score + judge.max_score, 6)


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
        concurrency: int | None = None,
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
        self._workers: list[dict[str, Any]] = []  # the live workers, as the cache last read them
        self._workers_at = float("-inf")
        self._asked: dict[str, float] = {}  # image -> when the cache last asked to serve it
        self._halt: BrokerUnavailable | None = None  # the outage that stopped the sweep

    def run(self, plan: SweepPlan, out_path: Path) -> SweepSummary:
        """Run what ``plan`` left to do, appending one line per item to ``out_path``."""
        self._read_workers()  # a broker that is down fails the sweep before its output is touched
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
                    summary.add_score(record)
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
        verdict = record.judge.verdict.value if record.judge is not None else "-"
        outcomes[f"{record.status}/{record.kind or verdict}"] += 1
        if self.on_record is not None:
            self.on_record(record)

    def _execute(self, items: Iterable[SweepItem]) -> Iterator[SweepRecord]:
        """Cached items' records, then the map's, each stored in the cache when final."""
        keys: dict[str, str | None] = {}  # in flight: id -> cache key
        hits: list[SweepRecord] = []

        def uncached() -> Iterator[SweepItem]:
            for item in items:
                key = self._cache_key(item)
                cached = self._cache_get(key)
                if cached is not None:
                    hits.append(cached.model_copy(update={"id": item.id, "cached": True}))
                    continue
                keys[str(item.id)] = key
                yield item

        run = self.farm.map(
            uncached(),
            image=self.image,
            concurrency=self.concurrency,
            timeout_s=self.timeout_s,
            retries=self.retries,
            ordered=False,
            journal=self.journal,
        )
        try:
            with run:
                for record in run:
                    yield from _drain(hits)
                    self._cache_put(keys.pop(str(record.id), None), record)
                    yield record
                yield from _drain(hits)
        except BrokerUnavailable as exc:
            self._halt = exc
        yield from _drain(hits)

    # --- cache ----------------------------------------------------------------------------

    def _cache_key(self, item: SweepItem) -> str | None:
        """A digest of everything that can change an item's outcome: its cells (setup
        included) or submission and tests, files and timeout, and the image it runs on as the
        workers serving it report it when the item is read (digest and limits); a change to
        any of them misses the cache. No worker serving the image, no key: the item is
        neither looked up nor stored (a record keyed without a digest would be served again
        for any build)."""
        if self.cache_dir is None:
            return None
        image = image_for(item, self.image)
        served = self._sandboxes(image)
        if not served:
            return None
        basis = {
            "judge": item.model_dump(mode="json", include=JUDGE_FIELDS, exclude_none=True),
            "cells": item.all_cells(),
            "cmd": item.cmd,
            "files": item.files or {},
            "timeout_s": item.timeout_s or self.timeout_s,
            "box": item.limits.model_dump() if item.limits else None,
            "image": image,
            "digests": sorted({str(sandbox.get("image_digest")) for sandbox in served}),
            "limits": sorted(
                {json.dumps(sandbox.get("limits"), sort_keys=True) for sandbox in served}
            ),
        }
        return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()

    def _sandboxes(self, image: str) -> list[dict[str, Any]]:
        """The sandboxes of the live workers serving ``image``, read again when the last read
        is ``REFRESH_S`` old (a worker replaced meanwhile may run another build). When none
        serves it, the farm is asked to serve it first, as the map would (a local farm starts
        a worker), at most once per ``REFRESH_S`` and image."""

        def serving() -> list[dict[str, Any]]:
            return [(w.get("sandbox") or {}) for w in self._workers if w.get("image") == image]

        now = time.monotonic()
        if serving() and now - self._workers_at < REFRESH_S:
            return serving()
        if not serving():
            if now - self._asked.get(image, float("-inf")) < REFRESH_S:
                return []
            self._asked[image] = now
            try:
                self.farm.require_image(image)
            except SandboxUnavailable:
                return []
        self._read_workers()
        return serving()

    def _read_workers(self) -> None:
        self._workers = self.farm.broker.call(self.farm.workers, sent=False)
        self._workers_at = time.monotonic()

    def _cache_get(self, key: str | None) -> SweepRecord | None:
        if key is None or self.cache_dir is None:
            return None
        path = self.cache_dir / f"{key}.json"
        try:
            return SweepRecord.model_validate_json(path.read_text())
        except (OSError, ValidationError):
            return None

    def _cache_put(self, key: str | None, record: SweepRecord) -> None:
        if key is None or self.cache_dir is None or record.kind in RETRYABLE:
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_dir / f".{key}.{threading.get_ident()}"
        tmp.write_text(record.model_dump_json())
        tmp.replace(self.cache_dir / f"{key}.json")


def _drain(records: list[SweepRecord]) -> Iterator[SweepRecord]:
    while records:
        yield records.pop(0)
