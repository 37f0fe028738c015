"""A Judge0-compatible subset on ``farm serve``, under ``/judge0``: existing Judge0 clients
(the official ``judge0`` Python package among them) work when pointed at it.

Routes: ``POST /submissions`` (``wait=true|false``), ``GET``/``DELETE /submissions/{token}``,
``POST``/``GET /submissions/batch``, ``GET /languages[/{id}]``, ``/statuses``,
``/config_info``, ``/about``, with Judge0 CE 1.13.1's field names, status ids and base64
handling. ``X-Auth-Token`` carries a farm token (scope ``run``). A submission is a judge item
of one test; a batch is one map. They are kept in Redis, visible only to the token that made
them (``judge0_store``), judged by any ``farm serve`` of the farm (``judge0_runner``); input
checks are ``judge0_input``'s, answers ``judge0_view``'s. Why: docs/design/judge.md.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request

from farm.judge.languages import LANGUAGES
from farm.serve.access import authenticate
from farm.serve.judge0_input import (
    LANGUAGE_BY_ID,
    MAX_EXTRACT_BYTES,
    BatchIn,
    SubmissionIn,
    compiled,
    document,
)
from farm.serve.judge0_runner import CALLBACK_TIMEOUT_S, CALLBACK_TRIES, Runner
from farm.serve.judge0_store import MAX_PENDING, Judge0Store, now
from farm.serve.judge0_view import STATUSES, view
from farm.serve.problem_documents import ProblemError
from farm.serve.tokens import Token

if TYPE_CHECKING:
    from farm.client import Farm
    from farm.settings import FarmSettings

router = APIRouter(prefix="/judge0", tags=["judge0"])
VERSION = "1.13.1"  # the Judge0 CE whose language ids and fields these are
MAX_BATCH = 20


async def judge0_caller(
    request: Request, x_auth_token: Annotated[str | None, Header()] = None
) -> Token:
    """Judge0's ``X-Auth-Token`` holds a farm token (a bearer one works too)."""
    from farm.serve.access import bearer

    presented = x_auth_token or bearer(request)
    return await asyncio.to_thread(authenticate, request.app.state.tokens, presented, "run")


Caller = Annotated[Token, Depends(judge0_caller)]


def start(app: FastAPI, farm: Farm, settings: FarmSettings) -> Runner:
    """The store and this server's runner (``farm serve``'s lifespan stops it)."""
    store = Judge0Store(farm.registry.redis, settings.judge0_ttl_s)
    runner = Runner(farm, store, settings.judge0_parallel)
    app.state.judge0 = runner
    runner.start()
    return runner


def _runner(request: Request) -> Runner:
    runner: Runner | None = getattr(request.app.state, "judge0", None)
    if runner is None:
        raise ProblemError(503, "unavailable", "this server judges nothing (no farm)")
    return runner


async def _make(
    request: Request, owner: str, submissions: list[SubmissionIn], encoded: bool, wait: bool
) -> str:
    """Check, store and queue ``submissions`` as one element (all or none: a bad one is
    refused before any is kept), or claim it for this server (``wait``); the element."""
    runner = _runner(request)
    callbacks = request.app.state.settings.judge0_callbacks
    made = [
        document(str(uuid.uuid4()), submission, encoded, now(), callbacks)
        for submission in submissions
    ]
    await asyncio.to_thread(runner.store.check_room)
    held_by = runner.replica if wait else ""
    return await asyncio.to_thread(runner.store.add, owner, made, held_by)


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
    """One submission; with ``wait=true`` the answer holds its result (judged by this
    server), else it is queued for any server of the farm."""
    runner = _runner(request)
    made = await _make(request, token.id, [body], base64_encoded, wait)
    if not wait:
        return {"token": made}
    await asyncio.to_thread(runner.judge_now, made)
    entry = await asyncio.to_thread(runner.store.get, token.id, made)
    return view(entry, fields, base64_encoded)


@router.post("/submissions/batch", status_code=201)
async def create_batch(
    body: BatchIn, token: Caller, request: Request, base64_encoded: Encoded = False
) -> list[dict[str, Any]]:
    """Many submissions, queued to be judged in one map; their tokens, in order."""
    if not 0 < len(body.submissions) <= MAX_BATCH:
        raise ProblemError(422, "input", f"a batch holds 1 to {MAX_BATCH} submissions")
    made = await _make(request, token.id, body.submissions, base64_encoded, wait=False)
    return [{"token": key} for key in made.split(",")]


@router.get("/submissions/batch")
async def get_batch(
    token: Caller,
    request: Request,
    tokens: str,
    base64_encoded: Encoded = False,
    fields: str | None = None,
) -> dict[str, Any]:
    store = _runner(request).store
    found = [await asyncio.to_thread(store.get, token.id, key) for key in tokens.split(",") if key]
    return {"submissions": [view(entry, fields, base64_encoded) for entry in found]}


@router.get("/submissions/{submission_token}")
async def get_submission(
    submission_token: str,
    token: Caller,
    request: Request,
    base64_encoded: Encoded = False,
    fields: str | None = None,
) -> dict[str, Any]:
    entry = await asyncio.to_thread(_runner(request).store.get, token.id, submission_token)
    return view(entry, fields, base64_encoded)


@router.delete("/submissions/{submission_token}")
async def delete_submission(
    submission_token: str,
    token: Caller,
    request: Request,
    base64_encoded: Encoded = False,
    fields: str | None = None,
) -> dict[str, Any]:
    """Judge0's delete: the submission, as a last ``GET`` would have shown it, then gone."""
    entry = await asyncio.to_thread(_runner(request).store.delete, token.id, submission_token)
    return view(entry, fields, base64_encoded)


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
async def config_info(token: Caller, request: Request) -> dict[str, Any]:
    """Judge0's configuration document, with farm's defaults (``farm.models.JudgeLimits``)."""
    settings = request.app.state.settings
    callbacks = bool(settings.judge0_callbacks)
    return {
        "allow_enable_network": False,
        "allow_enable_per_process_and_thread_memory_limit": False,
        "allow_enable_per_process_and_thread_time_limit": False,
        "allowed_languages_for_compile_options": sorted(
            LANGUAGES[name].title for name in LANGUAGE_BY_ID.values() if compiled(name)
        ),
        "callbacks_max_tries": CALLBACK_TRIES if callbacks else 0,
        "callbacks_timeout": CALLBACK_TIMEOUT_S if callbacks else 0.0,
        "cpu_extra_time": 0.0,
        "cpu_time_limit": 5.0,
        "enable_additional_files": True,
        "enable_batched_submissions": True,
        "enable_callbacks": callbacks,
        "enable_command_line_arguments": True,
        "enable_compiler_options": True,
        "enable_network": False,
        "enable_per_process_and_thread_memory_limit": False,
        "enable_per_process_and_thread_time_limit": False,
        "enable_submission_delete": True,
        "enable_wait_result": True,
        "maintenance_mode": False,
        "max_cpu_extra_time": 0.0,
        "max_cpu_time_limit": 60.0,
        "max_extract_size": MAX_EXTRACT_BYTES // 1024,
        "max_file_size": 16 * 1024,
        "max_max_file_size": 256 * 1024,
        "max_max_processes_and_or_threads": 96,
        "max_memory_limit": 8192 * 1024,
        "max_number_of_runs": 1,
        "max_processes_and_or_threads": 96,
        "max_queue_size": MAX_PENDING,
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
