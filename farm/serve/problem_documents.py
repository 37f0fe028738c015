"""RFC 9457 problem documents: every refusal of the API, with farm's error kind.

``farm.errors`` are mapped to HTTP statuses once, here (``STATUS``); the ``kind`` member says
which farm error it was, so a client of any language branches on it as Python code branches on
the exception's type. ``type`` is a relative reference, ``/problems/<kind>`` (farm owns no
domain to name types under), or ``about:blank`` where the status says it all (``GENERIC``).
A failure of the *code* is not a problem: it is a 200 whose result holds an ``error``, as
``Session.run`` returns it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from farm import errors

log = logging.getLogger(__name__)

MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "/problems/"  # a full path, resolved against the API's URL (RFC 9457, 3.1.1)
GENERIC = frozenset({"not_found", "method"})  # kinds that only restate their status

# (status, kind) per farm error; the first matching class in this order wins (subclasses first).
STATUS: list[tuple[type[Exception], int, str]] = [
    (errors.RestoreFailed, 409, "state_lost"),
    (errors.StateLost, 409, "state_lost"),
    (errors.SessionPaused, 409, "paused"),
    (errors.SessionLost, 410, "sandbox_lost"),
    (errors.SnapshotTooLarge, 413, "snapshot_too_large"),
    (errors.SnapshotIncompatible, 409, "snapshot_incompatible"),
    (errors.SnapshotNotFound, 404, "snapshot_not_found"),
    (errors.SnapshotError, 422, "snapshot"),
    (errors.FarmBusy, 503, "busy"),
    (errors.SandboxUnavailable, 503, "unavailable"),
    (errors.BrokerAuthFailed, 502, "broker"),
    (errors.BrokerUnavailable, 503, "broker"),
    (errors.BrokerLost, 502, "broker"),
    (errors.WorkerFailed, 502, "infra"),
    (errors.InvalidRequest, 422, "input"),
    (errors.FileOperationError, 400, "file"),
    (errors.TooManyCheckpoints, 409, "too_many_checkpoints"),
    (errors.UnknownCheckpoint, 404, "unknown_checkpoint"),
    (errors.BudgetExceeded, 409, "budget_exceeded"),
    (errors.BranchRefused, 409, "branch_refused"),
]


class Problem(BaseModel):
    """An RFC 9457 problem document (``application/problem+json``) with farm's ``kind``."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(
        description="the problem type: /problems/<kind> (relative to the API), or about:blank"
    )
    title: str
    status: int
    detail: str = ""
    instance: str | None = None
    kind: str = Field(description="farm's error kind: input, auth, forbidden, busy, ...")


class ProblemError(Exception):
    """Raised by the API's own checks (auth, scopes, limits): becomes a problem document."""

    def __init__(
        self, status: int, kind: str, detail: str, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.detail = detail
        self.headers = headers or {}


def problem_type(kind: str) -> str:
    """``type`` of a problem of ``kind``: ``about:blank`` when the status says it all."""
    return "about:blank" if kind in GENERIC else TYPE_BASE + kind


def problem(
    status: int,
    kind: str,
    detail: str,
    *,
    instance: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    """The one place a problem response is built."""
    from http import HTTPStatus

    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    body = Problem(
        type=problem_type(kind),
        title=title,
        status=status,
        detail=detail,
        instance=instance,
        kind=kind,
        **extra,
    )
    return Response(
        json.dumps(body.model_dump(mode="json", exclude_none=True)),
        status_code=status,
        media_type=MEDIA_TYPE,
        headers=headers,
    )


def for_farm_error(exc: errors.FarmError, instance: str | None = None) -> Response:
    """The problem document of a farm error (``STATUS``); an unknown one is a 500 ``infra``."""
    extra: dict[str, Any] = {}
    status, kind = next(((s, k) for cls, s, k in STATUS if isinstance(exc, cls)), (500, "infra"))
    headers = {"Retry-After": "1"} if status == 503 else None
    if isinstance(exc, errors.ExecFailed):
        extra["result"] = exc.result.model_dump(mode="json")
    if isinstance(exc, errors.SessionLost):
        extra["session_id"] = exc.session_id
    if isinstance(exc, errors.FileOperationError):
        extra.update(errno=exc.errno, path=exc.path, ename=exc.ename)
        if exc.errno == 2:  # ENOENT
            status = 404
    if isinstance(exc, errors.BrokerUnavailable):
        extra["sent"] = exc.sent
    return problem(status, kind, str(exc), instance=instance, headers=headers, **extra)


def install(app: FastAPI) -> None:
    """Problem documents for farm errors, the API's own refusals, and FastAPI's 4xx."""

    async def on_problem(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProblemError)
        return problem(
            exc.status, exc.kind, exc.detail, instance=request.url.path, headers=exc.headers
        )

    async def on_farm_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, errors.FarmError)
        log.info("%s %s: %s", request.method, request.url.path, exc)
        return for_farm_error(exc, request.url.path)

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        issues = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg")), "type": str(e.get("type"))}
            for e in exc.errors()
        ]
        malformed = any(i["type"] == "json_invalid" for i in issues)
        status = 400 if malformed else 422
        detail = "the body is not valid JSON" if malformed else "the request does not validate"
        return problem(status, "input", detail, instance=request.url.path, errors=issues)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        kind = {401: "auth", 403: "forbidden", 404: "not_found", 405: "method"}.get(
            exc.status_code, "input"
        )
        return problem(
            exc.status_code,
            kind,
            str(exc.detail),
            instance=request.url.path,
            headers=dict(exc.headers or {}),
        )

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(errors.FarmError, on_farm_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)


def problem_json(response: Response) -> dict[str, Any]:
    """A problem response's body as a dict (for the SSE and NDJSON streams' error lines)."""
    body = response.body if isinstance(response, JSONResponse | Response) else b"{}"
    data: dict[str, Any] = json.loads(bytes(body))
    return data
