"""Batch work: an item of ``Farm.map`` or a sweep line, its record, and what travels between the
client and the workers for it (chunks of items out, one ``ItemDone`` per item back)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from farm.image_name import ImageName
from farm.judge.problems import Problem, check_digest
from farm.models.frames import JudgeStep
from farm.models.judge import (
    JudgeLimits,
    JudgeProgram,
    JudgeResult,
    TestCase,
    TestGroup,
    check_judge_item,
    check_words,
)
from farm.models.model_base import Model
from farm.models.results import BoxLimits, CommandResult, ExecResult


class BatchItem(Model):
    """One item: a ``code`` string, ``cells`` run in order in one session (stopping at the
    first failure), a command ``cmd`` (an argv list, or a string for ``/bin/sh -c``: any
    program of the image), or a submission to judge (``language``, ``source``, ``tests``,
    ``checker``, ``all_tests``, ``groups`` of tests with points, ``compile_options`` and the
    program's ``args``; its ``limits`` are then ``JudgeLimits``: see ``farm.judge``; or,
    instead of its tests and their checker, a stored ``problem``: a ``Problem`` or its
    digest, ``farm.judge.problems``),
    with an optional ``setup`` cell first, ``files`` written to the workspace before, its own
    ``timeout_s``, box ``limits`` and ``image``."""

    id: str | int
    code: str | None = None
    cells: list[str] | None = None
    cmd: str | list[str] | None = None
    setup: str | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    files: dict[str, str] | None = Field(default=None, description="workspace path -> text content")
    limits: BoxLimits | None = None
    image: str | None = Field(default=None, description="the image it runs on (default: the map's)")
    egress: list[str] | None = Field(
        default=None, description="hosts its box may reach (default: the map's; none)"
    )
    language: str | None = Field(default=None, description="a judge item's language")
    source: str | None = None
    tests: list[TestCase] | None = None
    checker: str = Field(
        default="tokens", description="exact, lines, tokens, float:A[:R], special, program"
    )
    special_judge: str | None = Field(default=None, description="Python: def check(i, e, o)")
    checker_program: JudgeProgram | None = Field(
        default=None, description="with checker 'program': a testlib checker or Kattis validator"
    )
    interactor: JudgeProgram | None = Field(
        default=None, description="an interactive problem's interactor (testlib or Kattis)"
    )
    all_tests: bool = False
    keep_outputs: bool = Field(default=False, description="each test's stdout in its result")
    judge_limits: JudgeLimits | None = None
    groups: list[TestGroup] | None = Field(
        default=None, description="subtasks with points: the record's judge gets a score"
    )
    problem: str | Problem | None = Field(
        default=None, description="a stored problem (its digest), instead of tests and checker"
    )
    compile_options: list[str] | None = Field(
        default=None,
        description="argv words for the compiler (no shell): at the language's {options}, "
        "else before the source file's name",
    )
    args: list[str] | None = Field(
        default=None, description="argv words after the run command: the program's arguments"
    )

    @field_validator("image")
    @classmethod
    def _image_name(cls, image: str | None) -> str | None:
        return None if image is None else ImageName(image).asked  # a bad one: an input error

    @model_validator(mode="before")
    @classmethod
    def _judge_limits(cls, data: Any) -> Any:
        """A judge item's ``limits`` are per test (``JudgeLimits``), not the box's."""
        if isinstance(data, dict) and data.get("language") is not None and "limits" in data:
            data = {**data, "judge_limits": data["limits"]}
            del data["limits"]
        return data

    @model_validator(mode="after")
    def _one_body(self) -> BatchItem:
        bodies = (self.code, self.cells, self.cmd, self.source)
        if sum(body is not None for body in bodies) != 1:
            raise ValueError("give exactly one of 'code', 'cells', 'cmd' or 'source'")
        if isinstance(self.cmd, list) and not self.cmd:
            raise ValueError("'cmd' must not be an empty list")
        if (self.source is None) != (self.language is None):
            raise ValueError("a judge item needs both 'language' and 'source'")
        if self.problem is not None:
            if self.source is None:
                raise ValueError("'problem' is a judge item's (with 'language' and 'source')")
            if isinstance(self.problem, str):
                check_digest(self.problem)
            given = sorted(PROBLEM_FIELDS & self.model_fields_set)
            if given:
                raise ValueError(f"an item with a 'problem' takes these from it: {given}")
        elif self.source is not None:
            check_judge_item(
                self.checker,
                self.special_judge,
                self.tests,
                self.files,
                self.checker_program,
                self.interactor,
                self.groups,
            )
        elif self.groups is not None:
            raise ValueError("'groups' are a judge item's (with 'language' and 'source')")
        elif self.compile_options is not None or self.args is not None:
            raise ValueError("'compile_options' and 'args' are a judge item's")
        if self.source is not None:
            check_words("compile_options", self.compile_options)
            check_words("args", self.args)
        return self

    def argv(self) -> list[str] | None:
        if self.cmd is None:
            return None
        return ["/bin/sh", "-c", self.cmd] if isinstance(self.cmd, str) else list(self.cmd)

    def all_cells(self) -> list[str]:
        body = (
            self.cells if self.cells is not None else [self.code] if self.code is not None else []
        )
        return ([self.setup] if self.setup else []) + body


# A judge item's fields that are its problem's (with a stored ``problem``, the problem's own).
PROBLEM_FIELDS = frozenset(
    {"tests", "checker", "checker_program", "interactor", "special_judge", "files", "groups"}
)


class Submission(Model):
    """A judge item as its worker gets it: the submission, its problem (inline, or the digest
    of a stored one, which the worker resolves) and the item's own overrides of it."""

    language: str
    source: str
    problem: str | Problem
    limits: dict[str, int | float] | None = Field(
        default=None, description="the item's own JudgeLimits fields, over the problem's"
    )
    all_tests: bool = False
    keep_outputs: bool = False
    timeout_s: float | None = Field(default=None, gt=0)
    compile_options: list[str] | None = None
    args: list[str] | None = None


class BatchRecord(Model):
    """The outcome of one item: a ``farm sweep`` output line, what ``Farm.map`` yields."""

    id: str | int
    status: str  # ok | error
    kind: str | None = None
    message: str | None = None
    cells: list[ExecResult] = Field(default_factory=list)
    command: CommandResult | None = Field(default=None, description="what an item's 'cmd' did")
    attempts: int = 0
    duration_s: float = 0.0
    queue_s: float = Field(
        default=0.0,
        description="of duration_s, how long it waited for room (in the farm's list of "
        "chunks, at its worker, for its box in the kernel), however often it was sent",
    )
    cached: bool = False
    judge: JudgeResult | None = Field(default=None, description="a judge item's verdicts")
    manifest: dict[str, Any] = Field(default_factory=dict)
    journal: list[dict[str, Any]] | None = Field(
        default=None,
        description="with journal=True: the item's session journal as mime_stream dicts",
    )

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class ChunkItem(Model):
    """One attempt at one item, as a worker runs it (``key``: its place in the map)."""

    key: int
    exec_id: str = Field(description="claimed before the item runs: a copy never runs twice")
    cells: list[str]
    argv: list[str] | None = Field(default=None, description="a command, run after the cells")
    files: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(gt=0)
    limits: dict[str, int] = Field(default_factory=dict)
    egress: list[str] | None = None
    submission: Submission | None = Field(default=None, description="a submission to judge")
    # Made by the worker from ``submission`` (farm.worker.judge_items), never sent:
    judge: JudgeStep | None = Field(default=None, description="the kernel's judge step")
    special_judge: str | None = Field(default=None, description="its checker's Python code")


class Chunk(Model):
    """Items a worker takes together from its image's list of chunks (``chunks_key``), each
    run in a box of its own as room comes, its result pushed to ``results`` (a Redis list) as
    soon as it ends."""

    map_id: str
    chunk_id: str = Field(description="claimed by the worker that takes the chunk")
    results: str = Field(description="the Redis list the client reads the results from")
    items: list[ChunkItem]
    journal: bool = False
    sent_at: float = Field(default=0.0, description="the client's time.time() as it was queued")


class ItemDone(Model):
    """What a worker publishes when one item ends."""

    key: int
    exec_id: str
    worker: str
    session_id: str = ""
    cells: list[ExecResult] = Field(default_factory=list)
    command: CommandResult | None = None
    egress: list[dict[str, Any]] = Field(
        default_factory=list, description="where its box connected to (host, port, allowed)"
    )
    judge: JudgeResult | None = None
    queue_s: float = Field(default=0.0, description="how long it waited for room")
    retry: str | None = Field(
        default=None,
        description="not run: why the worker had no room for it (its client sends it again)",
    )
