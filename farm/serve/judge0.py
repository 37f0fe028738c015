"""A Judge0-compatible subset on ``farm serve``, under ``/judge0``: existing Judge0 clients
(the official ``judge0`` Python package among them) work when pointed at it.

Routes: ``POST /submissions`` (``wait=true|false``), ``GET /submissions/{token}``,
``POST``/``GET /submissions/batch``, ``GET /languages[/{id}]``, ``/statuses``,
``/config_info``, ``/about``, with Judge0 CE 1.13.1's field names, status ids and base64
handling. ``X-Auth-Token`` carries a farm token (scope ``run``). Each submission is a judge
item of one test (``checker`` ``lines``, or ``none`` without ``expected_output``), judged on
the map engine; a batch is one map. Submissions live in this server's memory (the last
``KEPT`` of them) and are visible only to the token that made them. Why: docs/design/judge.md.
"""

from __future__ import annotations

import asyncio
import base64
import math
import threading
import uuid
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from pydantic import BaseModel, ConfigDict

from farm.judge import JUDGE_IMAGE
from farm.judge.languages import LANGUAGES
from farm.models.batch import BatchRecord
from farm.models.judge import JudgeResult, Verdict
from farm.serve.access import authenticate
from farm.serve.problems import ProblemError
from farm.serve.tokens import Token

router = APIRouter(prefix="/judge0", tags=["judge0"])
VERSION = "1.13.1"  # the Judge0 CE whose language ids and fields these are
KEPT = 100_000
MAX_BATCH = 20
STATUSES = {
    1: "In Queue",
    2: "Processing",
    3: "Accepted",
    4: "Wrong Answer",
    5: "Time Limit Exceeded",
    6: "Compilation Error",
    7: "Runtime Error (SIGSEGV)",
    8: "Runtime Error (SIGXFSZ)",
    9: "Runtime Error (SIGFPE)",
    10: "Runtime Error (SIGABRT)",
    11: "Runtime Error (NZEC)",
    12: "Runtime Error (Other)",
    13: "Internal Error",
    14: "Exec Format Error",
}
BY_SIGNAL = {11: 7, 25: 8, 8: 9, 6: 10}
BY_VERDICT = {Verdict.AC: 3, Verdict.WA: 4, Verdict.TLE: 5, Verdict.CE: 6, Verdict.OLE: 8}
LANGUAGE_BY_ID = {lang.judge0: name for name, lang in LANGUAGES.items() if lang.judge0}
DEFAULT_FIELDS = ("token", "time", "memory", "stdout", "stderr", "compile_output", "message")
ENCODED = {"stdout", "stderr", "compile_output", "source_code", "stdin", "expected_output"}


class SubmissionIn(BaseModel):
    """The fields of a Judge0 submission farm takes; the others are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    source_code: str
    language_id: int
    stdin: str | None = None
    expected_output: str | None = None
    cpu_time_limit: float | None = None
    wall_time_limit: float | None = None
    memory_limit: float | None = None  # kB
    max_file_size: int | None = None  # kB


class BatchIn(BaseModel):
    submissions: list[SubmissionIn]


class Store:
    """Submissions by token (the last ``KEPT``), each with its owner."""

    def __init__(self) -> None:
        self.entries: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.lock = threading.Lock()

    def add(self, owner: str, submission: SubmissionIn) -> str:
        token = str(uuid.uuid4())
        entry = {
            "owner": owner,
            "token": token,
            "status_id": 1,
            "language_id": submission.language_id,
            "created_at": _now(),
            "finished_at": None,
            "result": None,
        }
        with self.lock:
            self.entries[token] = entry
            while len(self.entries) > KEPT:
                self.entries.popitem(last=False)
        return token

    def finish(self, token: str, record: BatchRecord) -> None:
        with self.lock:
            entry = self.entries.get(token)
            if entry is not None:
                entry.update(finished_at=_now(), result=record)

    def get(self, owner: str, token: str) -> dict[str, Any]:
        with self.lock:
            return self._owned(owner, token)

    def delete(self, owner: str, token: str) -> dict[str, Any]:
        """Forget a finished submission of ``owner``'s and give it back; one still queued or
        running is refused (as Judge0 does: its result has nowhere to go yet)."""
        with self.lock:
            entry = self._owned(owner, token)
            if entry["result"] is None:
                raise ProblemError(
                    400, "input", f"submission {token} is still queued or running: not deleted"
                )
            del self.entries[token]
        return entry

    def _owned(self, owner: str, token: str) -> dict[str, Any]:
        """The entry of ``token`` if ``owner``'s, else not found (held: ``self.lock``)."""
        entry = self.entries.get(token)
        if entry is None or entry["owner"] != owner:
            raise ProblemError(404, "not_found", f"no submission {token}")
        return entry


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def judge0_caller(
    request: Request, x_auth_token: Annotated[str | None, Header()] = None
) -> Token:
    """Judge0's ``X-Auth-Token`` holds a farm token (a bearer one works too)."""
    from farm.serve.access import bearer

    presented = x_auth_token or bearer(request)
    return await asyncio.to_thread(authenticate, request.app.state.tokens, presented, "run")


Caller = Annotated[Token, Depends(judge0_caller)]


def _store(request: Request) -> Store:
    store: Store | None = getattr(request.app.state, "judge0", None)
    if store is None:
        store = request.app.state.judge0 = Store()
    return store


def _decode(value: str | None, encoded: bool) -> str | None:
    if value is None or not encoded:
        return value
    try:
        return base64.b64decode(value, validate=False).decode()
    except (ValueError, UnicodeDecodeError):
        raise ProblemError(422, "input", "a field is not base64 of UTF-8 text") from None


def _item(token: str, submission: SubmissionIn, encoded: bool) -> dict[str, Any]:
    language = LANGUAGE_BY_ID.get(submission.language_id)
    if language is None:
        raise ProblemError(422, "input", f"language_id {submission.language_id} is not served")
    expected = _decode(submission.expected_output, encoded)
    limits: dict[str, Any] = {"time_s": submission.cpu_time_limit or 5.0}
    if submission.wall_time_limit:
        limits["wall_s"] = submission.wall_time_limit
    if submission.memory_limit:
        limits["memory_mb"] = max(16, math.ceil(submission.memory_limit / 1024))
    if submission.max_file_size:
        limits["output_mb"] = max(1, math.ceil(submission.max_file_size / 1024))
    test = {"stdin": _decode(submission.stdin, encoded) or "", "expected": expected}
    return {
        "id": token,
        "language": language,
        "source": _decode(submission.source_code, encoded),
        "tests": [test],
        "checker": "lines" if expected is not None else "none",
        "limits": limits,
        "keep_outputs": True,
    }


def _judge(request: Request, items: list[dict[str, Any]]) -> None:
    """Judge ``items`` in one map (blocking: run in a thread), recording each as it ends; a
    map that fails (the broker gone past its wait, say) ends its unfinished items as
    ``Internal Error``, never leaves them in the queue for good."""
    store = _store(request)
    left = {str(item["id"]) for item in items}
    try:
        farm = request.app.state.farm
        for record in farm.map(items, image=JUDGE_IMAGE, ordered=False, retries=1):
            store.finish(str(record.id), record)
            left.discard(str(record.id))
    except Exception as exc:
        for key in left:
            why = f"{type(exc).__name__}: {exc}"
            store.finish(key, BatchRecord(id=key, status="error", kind="infra", message=why))
        raise


def _status(result: JudgeResult | None, record: BatchRecord | None) -> int:
    if record is None:
        return 1
    if result is None or result.verdict == Verdict.IE:
        return 13
    if result.verdict in BY_VERDICT:
        return BY_VERDICT[result.verdict]
    test = result.tests[0] if result.tests else None
    if result.verdict == Verdict.RE and test is not None:
        return BY_SIGNAL.get(test.signal or 0, 12) if test.signal else 11
    return 12  # MLE: Judge0 has no status of its own for it


def _view(entry: dict[str, Any], fields: str | None, encoded: bool) -> dict[str, Any]:
    record: BatchRecord | None = entry["result"]
    result = record.judge if record is not None else None
    test = result.tests[0] if result is not None and result.tests else None
    status = _status(result, record)
    stdout = (
        base64.b64decode(test.output).decode(errors="replace") if test and test.output else None
    )
    message = result.message if result is not None else (record.message if record else None)
    view: dict[str, Any] = {
        "token": entry["token"],
        "stdout": stdout,
        "stderr": (test.stderr or None) if test else None,
        "compile_output": (result.compile.output or None) if result and result.compile else None,
        "message": (test.message if test and test.message else message) or None,
        "exit_code": test.exit_code if test else None,
        "exit_signal": test.signal if test else None,
        "status": {"id": status, "description": STATUSES[status]},
        "created_at": entry["created_at"],
        "finished_at": entry["finished_at"],
        "time": f"{test.time_s:.3f}" if test else None,
        "wall_time": f"{test.wall_s:.3f}" if test else None,
        "memory": test.memory_kb if test else None,
        "language": {"id": entry["language_id"], "name": _language_name(entry["language_id"])},
    }
    if encoded:
        for key in ENCODED & view.keys():
            if view[key] is not None:
                view[key] = base64.b64encode(view[key].encode()).decode("ascii")
    wanted = DEFAULT_FIELDS + ("status",) if not fields else tuple(fields.split(","))
    if "*" in wanted:
        return view
    return {key: view[key] for key in wanted if key in view}


def _language_name(language_id: int) -> str:
    name = LANGUAGE_BY_ID.get(language_id)
    return LANGUAGES[name].title if name else "unknown"


Encoded = Annotated[bool, Query()]


@router.post("/submissions", status_code=201)
async def create_submission(
    body: SubmissionIn,
    token: Caller,
    request: Request,
    base64_encoded: Encoded = False,
    wait: bool = False,
    fields: str | None = None,
) -> dict[str, Any]:
    """One submission; with ``wait=true`` the answer holds its result."""
    store = _store(request)
    submission_token = store.add(token.id, body)
    items = [_item(submission_token, body, base64_encoded)]
    if not wait:
        threading.Thread(target=_judge, args=(request, items), daemon=True).start()
        return {"token": submission_token}
    await asyncio.to_thread(_judge, request, items)
    return _view(store.get(token.id, submission_token), fields, base64_encoded)


@router.post("/submissions/batch", status_code=201)
async def create_batch(
    body: BatchIn, token: Caller, request: Request, base64_encoded: Encoded = False
) -> list[dict[str, Any]]:
    """Many submissions, judged in one map; their tokens, in order."""
    if not 0 < len(body.submissions) <= MAX_BATCH:
        raise ProblemError(422, "input", f"a batch holds 1 to {MAX_BATCH} submissions")
    store = _store(request)
    tokens = [store.add(token.id, submission) for submission in body.submissions]
    items = [
        _item(key, submission, base64_encoded)
        for key, submission in zip(tokens, body.submissions, strict=True)
    ]
    threading.Thread(target=_judge, args=(request, items), daemon=True).start()
    return [{"token": key} for key in tokens]


@router.get("/submissions/batch")
async def get_batch(
    token: Caller,
    request: Request,
    tokens: str,
    base64_encoded: Encoded = False,
    fields: str | None = None,
) -> dict[str, Any]:
    store = _store(request)
    found = [store.get(token.id, key) for key in tokens.split(",") if key]
    return {"submissions": [_view(entry, fields, base64_encoded) for entry in found]}


@router.get("/submissions/{submission_token}")
async def get_submission(
    submission_token: str,
    token: Caller,
    request: Request,
    base64_encoded: Encoded = False,
    fields: str | None = None,
) -> dict[str, Any]:
    return _view(_store(request).get(token.id, submission_token), fields, base64_encoded)


@router.delete("/submissions/{submission_token}")
async def delete_submission(
    submission_token: str,
    token: Caller,
    request: Request,
    base64_encoded: Encoded = False,
    fields: str | None = None,
) -> dict[str, Any]:
    """Judge0's delete: the submission, as a last ``GET`` would have shown it, then gone."""
    return _view(_store(request).delete(token.id, submission_token), fields, base64_encoded)


@router.get("/languages")
async def languages(token: Caller) -> list[dict[str, Any]]:
    return [{"id": lang.judge0, "name": lang.title} for lang in LANGUAGES.values() if lang.judge0]


@router.get("/languages/{language_id}")
async def language(language_id: int, token: Caller) -> dict[str, Any]:
    name = LANGUAGE_BY_ID.get(language_id)
    if name is None:
        raise ProblemError(404, "not_found", f"no language {language_id}")
    lang = LANGUAGES[name]
    return {
        "id": language_id,
        "name": lang.title,
        "is_archived": False,
        "source_file": lang.file,
        "compile_cmd": " ".join(lang.compile) or None,
        "run_cmd": " ".join(lang.run),
    }


@router.get("/statuses")
async def statuses(token: Caller) -> list[dict[str, Any]]:
    return [{"id": key, "description": text} for key, text in STATUSES.items()]


@router.get("/about")
async def about(token: Caller) -> dict[str, Any]:
    return {
        "version": VERSION,
        "homepage": "farm serve",
        "source_code": "farm",
        "maintainer": "farm",
    }


@router.get("/config_info")
async def config_info(token: Caller) -> dict[str, Any]:
    """Judge0's configuration document, with farm's defaults (``farm.models.JudgeLimits``)."""
    return {
        "allow_enable_network": False,
        "allow_enable_per_process_and_thread_memory_limit": False,
        "allow_enable_per_process_and_thread_time_limit": False,
        "allowed_languages_for_compile_options": [],
        "callbacks_max_tries": 0,
        "callbacks_timeout": 0.0,
        "cpu_extra_time": 0.0,
        "cpu_time_limit": 5.0,
        "enable_additional_files": False,
        "enable_batched_submissions": True,
        "enable_callbacks": False,
        "enable_command_line_arguments": False,
        "enable_compiler_options": False,
        "enable_network": False,
        "enable_per_process_and_thread_memory_limit": False,
        "enable_per_process_and_thread_time_limit": False,
        "enable_submission_delete": True,
        "enable_wait_result": True,
        "maintenance_mode": False,
        "max_cpu_extra_time": 0.0,
        "max_cpu_time_limit": 60.0,
        "max_extract_size": 0,
        "max_file_size": 16 * 1024,
        "max_max_file_size": 256 * 1024,
        "max_max_processes_and_or_threads": 96,
        "max_memory_limit": 8192 * 1024,
        "max_number_of_runs": 1,
        "max_processes_and_or_threads": 96,
        "max_queue_size": KEPT,
        "max_stack_limit": 256 * 1024,
        "max_submission_batch_size": MAX_BATCH,
        "max_wall_time_limit": 600.0,
        "memory_limit": 256 * 1024,
        "number_of_runs": 1,
        "redirect_stderr_to_stdout": False,
        "stack_limit": 256 * 1024,
        "submission_cache_duration": 0.0,
        "use_docs_as_homepage": False,
        "wall_time_limit": 20.0,
    }
