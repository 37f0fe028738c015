"""The API's problem documents name their type without a domain farm does not own: a full
path relative to the API (``/problems/<kind>``), or ``about:blank`` where the status says it
all (RFC 9457, 3.1.1)."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from farm import errors
from farm.serve.problem_documents import for_farm_error, problem


def body(status: int, kind: str) -> dict[str, object]:
    document: dict[str, object] = json.loads(bytes(problem(status, kind, "why").body))
    return document


def test_a_farm_kind_is_typed_by_a_path_relative_to_the_api() -> None:
    response = for_farm_error(errors.FarmBusy("every worker is full"))
    document = json.loads(bytes(response.body))
    assert document["type"] == "/problems/busy" and document["kind"] == "busy"
    parts = urlsplit(document["type"])
    assert (parts.scheme, parts.netloc) == ("", "")  # no host: resolved against the API's URL


def test_a_kind_that_only_restates_its_status_is_about_blank() -> None:
    assert body(404, "not_found") == {
        "type": "about:blank",
        "title": "Not Found",
        "status": 404,
        "detail": "why",
        "kind": "not_found",
    }
    assert body(405, "method")["type"] == "about:blank"
    assert body(401, "auth")["type"] == "/problems/auth"
