"""What a map makes of an item at both ends: the item parsed from what the caller gave, and
the record built from what a worker (or the map itself, for a dead worker or a lost broker)
says of it. Pure functions, so ``farm.client.mapping`` holds only the engine's state.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from farm.judge.problems import Problem
from farm.judge.specs import problem_of, submission_of, timeout_of
from farm.models import ErrorKind, ExecResult
from farm.models.batch import BatchItem, BatchRecord, ChunkItem, ItemDone
from farm.models.judge import Verdict

Item = BatchItem | dict[str, Any] | str


def parse_item(key: int, raw: Item) -> BatchItem | BatchRecord:
    """The item at position ``key``, or the record of why it is not one (kind ``input``): a bad
    item ends as a record of its own, never as the map's exception."""
    try:
        if isinstance(raw, BatchItem):
            return raw
        if isinstance(raw, str):
            return BatchItem(id=key, code=raw)
        return BatchItem.model_validate(raw)
    except ValidationError as exc:
        given = raw.get("id") if isinstance(raw, dict) else None
        item_id = given if isinstance(given, str | int) else key
        return BatchRecord(
            id=item_id, status="error", kind="input", message=f"item {key}: {exc}"[:2000]
        )


def chunk_item(
    key: int, exec_id: str, item: BatchItem, timeout_s: float, egress: list[str] | None = None
) -> ChunkItem:
    """One attempt at ``item`` as a worker gets it (a judge item: its submission, with its
    problem inline or named by digest: its worker builds the judge step); ``egress``: the
    map's hosts, for an item that names none."""
    hosts = item.egress if item.egress is not None else egress
    if item.source is not None:  # a submission to judge (farm.judge)
        problem = problem_of(item) if item.problem is None else item.problem
        submission = submission_of(item, problem)
        if isinstance(problem, Problem):
            item_timeout_s = timeout_of(problem, submission)
        else:  # a digest: its problem is read by the worker, which sets the item's timeout
            item_timeout_s = item.timeout_s or timeout_s
        return ChunkItem(
            key=key,
            exec_id=exec_id,
            cells=[],
            timeout_s=item_timeout_s,
            submission=submission,
            egress=hosts,
        )
    return ChunkItem(
        key=key,
        exec_id=exec_id,
        cells=item.all_cells(),
        argv=item.argv(),
        files=item.files or {},
        timeout_s=item.timeout_s or timeout_s,
        limits=item.limits.model_dump() if item.limits else {},
        egress=hosts,
    )


def unsendable(key: int, item: BatchItem, chunk: ChunkItem) -> BatchRecord | None:
    """The record (kind ``input``) of an item whose chunk item cannot travel as JSON (text
    that is not UTF-8: a lone surrogate, as ``json.loads`` makes of ``"\\ud800"``), else
    ``None``. Checked only when a whole chunk failed to serialize: free on the usual path."""
    try:
        chunk.model_dump_json()
    except PydanticSerializationError as exc:
        why = str(exc).removeprefix("Error serializing to JSON: ")
        message = f"item {key}: its text cannot be sent as UTF-8 ({why})"
        return BatchRecord(id=item.id, status="error", kind="input", message=message[:2000])
    return None


def failed(key: int, exec_id: str, worker: str, kind: ErrorKind, ename: str, why: str) -> ItemDone:
    """What a worker would have pushed for an item that it could not finish (it died, or the
    broker lost the map's data): one failed cell, its state lost."""
    done = ItemDone(key=key, exec_id=exec_id, worker=worker)
    done.cells.append(
        ExecResult.failure(
            kind, ename, why, exec_id=exec_id, worker=worker or None, state_lost=True
        )
    )
    return done


def outcome(done: ItemDone) -> tuple[bool, str | None, str | None]:
    """(failed, kind, message) of an item: its verdict's for a judge item, its command's when
    it has one, else its last cell's (a failed cell stops the item before its command)."""
    if done.judge is not None:  # a verdict is a result; IE is farm's failure (retried)
        if done.judge.verdict != Verdict.IE:
            return False, None, None
        return True, done.judge.kind or ErrorKind.INFRA.value, f"IE: {done.judge.message}"[:2000]
    command = done.command
    if command is not None:
        if command.ok:
            return False, None, None
        kind = command.kind.value if command.kind else None
        if command.error is not None:
            return True, kind, f"{command.error.ename}: {command.error.evalue}"[:2000]
        tail = command.stderr.strip()[-1500:]
        return True, kind, f"exit status {command.returncode}: {tail}"[:2000]
    last = done.cells[-1] if done.cells else None
    if last is None or last.ok:
        return False, None, None
    message = f"{last.error.ename}: {last.error.evalue}"[:2000] if last.error else None
    return True, last.kind.value if last.kind else None, message


def manifest(worker_id: str, worker: dict[str, Any], image: str) -> dict[str, Any]:
    """Where a record was produced: enough to rerun it the same way (the image's digest and
    spec, the sandbox's limits) or to tell two runs apart."""
    import farm

    sandbox = worker.get("sandbox") or {}
    return {
        "farm_version": farm.__version__,
        "worker": worker_id,
        "image": image,
        "image_ref": sandbox.get("image"),
        "image_digest": sandbox.get("image_digest"),
        "image_spec": sandbox.get("image_spec"),
        "backend": sandbox.get("backend"),
        "limits": sandbox.get("limits"),
    }
