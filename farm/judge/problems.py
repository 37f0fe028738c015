"""A problem stored once and named by digest: its tests, checker (or checker program,
interactor, special judge), files, groups and limits, without a submission.

Invariants: the digest is ``sha256:`` over the problem's canonical form (JSON of its fields
that differ from their defaults, keys sorted, no spaces, UTF-8), so the same problem has the
same digest in every client and version that adds a defaulted field; the store holds exactly
those bytes under ``farm:problem:<digest>`` (``SET NX``, a TTL refreshed on use), so a worker
can check what it read against the name it asked for. docs/design/judge.md, "Stored problems".
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, Field, ValidationError, model_validator

from farm.errors import ProblemError, ProblemNotFound, ProblemTooLarge
from farm.models.judge import (
    JudgeLimits,
    JudgeProgram,
    TestCase,
    TestGroup,
    check_judge_item,
)
from farm.models.model_base import Model
from farm.registry import PREFIX

if TYPE_CHECKING:
    import redis


DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
MAX_BYTES = 64 << 20  # one problem's canonical form, as stored (Redis takes 512 MB a value)
TTL_S = 7 * 24 * 3600  # unused this long, a stored problem is forgotten
REFRESH_S = TTL_S // 8  # a problem in use has its TTL pushed back at most this often


class Problem(Model):
    """What a judge item has besides its submission: ``tests``, how their outputs are judged
    (``checker``; ``checker_program`` with ``checker="program"``; an ``interactor``; a Python
    ``special_judge`` with ``checker="special"``), the box's ``files``, ``groups`` of tests
    with points and per-test ``limits``. Immutable once made: its digest is cached."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tests: list[TestCase] = Field(min_length=1)
    checker: str = "tokens"
    checker_program: JudgeProgram | None = None
    interactor: JudgeProgram | None = None
    special_judge: str | None = None
    files: dict[str, str] | None = None
    groups: list[TestGroup] | None = None
    limits: JudgeLimits | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Problem:
        check_judge_item(
            self.checker,
            self.special_judge,
            self.tests,
            self.files,
            self.checker_program,
            self.interactor,
            self.groups,
        )
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Problem:
        """A copy, its digest taken anew (a cached one would name the original)."""
        copy = super().model_copy(update=update, deep=deep)
        for cached in ("canonical", "digest"):
            copy.__dict__.pop(cached, None)
        return copy

    @cached_property
    def canonical(self) -> bytes:
        """The bytes the digest is taken of, and that the store holds."""
        fields = self.model_dump(mode="json", exclude_defaults=True)
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return text.encode()

    @cached_property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.canonical).hexdigest()

    @classmethod
    def from_canonical(cls, data: bytes, digest: str) -> Problem:
        """The problem stored as ``digest``; ``ProblemError`` if the bytes are not its."""
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise ProblemError(f"the problem stored as {digest} does not match its digest")
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:  # stored by a farm of another version
            raise ProblemError(
                f"the problem stored as {digest} cannot be read here: {exc}"
            ) from None


def check_digest(digest: str) -> str:
    if not DIGEST.match(digest):
        raise ValueError(f"{digest!r} is not a problem digest ('sha256:' and 64 hex digits)")
    return digest


def key(digest: str) -> str:
    return f"{PREFIX}problem:{digest}"


def put(client: redis.Redis, problem: Problem, ttl_s: int = TTL_S) -> str:
    """Store ``problem`` unless it is (then only its TTL is pushed back: its bytes are not
    sent again); its digest. ``ProblemTooLarge`` past ``MAX_BYTES``."""
    digest = problem.digest
    name = key(digest)
    if client.expire(name, ttl_s):
        return digest
    data = problem.canonical
    if len(data) > MAX_BYTES:
        raise ProblemTooLarge(len(data), MAX_BYTES)
    client.set(name, data, ex=ttl_s, nx=True)
    return digest


def fetch(client: redis.Redis, digest: str, ttl_s: int = TTL_S) -> Problem:
    """The problem stored as ``digest`` (its TTL pushed back); ``ProblemNotFound`` if none."""
    with client.pipeline(transaction=False) as pipe:
        pipe.get(key(digest))
        pipe.expire(key(digest), ttl_s)
        data, _ = pipe.execute()
    if data is None:
        raise ProblemNotFound(digest)
    if isinstance(data, str):  # a client that decodes responses (farm's registry does)
        data = data.encode()
    return Problem.from_canonical(data, digest)


class Uploads:
    """What one client put, by digest, and when: a problem judged again is named, not sent
    again, and its TTL is pushed back at most every ``REFRESH_S``."""

    def __init__(self) -> None:
        self.put_at: dict[str, float] = {}

    def put(self, client: redis.Redis, problem: Problem) -> str:
        digest = problem.digest
        now = time.monotonic()
        if now - self.put_at.get(digest, -float("inf")) < REFRESH_S:
            return digest
        put(client, problem)
        self.put_at[digest] = now
        return digest
