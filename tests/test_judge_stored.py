"""Stored problems and packages, end to end on a real local farm (Docker, Redis, Celery, the
judge image): a problem judged twice is stored once and no chunk carries its tests, a digest
nothing is stored under is the item's input error, groups are scored by the worker from the
stored problem, and ``farm judge --problem`` judges a Kattis package like verifyproblem."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from farm.cli.main import app
from farm.client import AsyncFarm, Farm
from farm.judge import problems
from farm.judge.packages import read_package
from farm.judge.problems import Problem
from farm.models.judge import Verdict

pytestmark = [pytest.mark.docker, pytest.mark.slow]

PACKAGES = Path(__file__).parent / "problems"
SUM_PY = "a, b = map(int, input().split())\nprint(a + b)\n"
CAPPED_PY = "a, b = map(int, input().split())\nprint(min(a + b, 10**9))\n"  # wrong past 1e9
LIST_PY = "input()\nprint(sum(map(int, input().split())))\n"
LIST_CAPPED_PY = "input()\nprint(max(sum(map(int, input().split())), -10**9))\n"


@pytest.fixture(scope="module")
def judge_farm(docker_env: Any) -> Iterator[Farm]:
    from farm.sandbox.catalog import build_image

    build_image("judge", client=docker_env)
    with Farm.local(images={"judge": 1}) as farm:
        yield farm


class Sent:
    """The chunks a farm's maps queue (their bodies, as Redis gets them) and its puts."""

    def __init__(self, farm: Farm, monkeypatch: pytest.MonkeyPatch) -> None:
        self.chunks: list[str] = []
        self.puts: list[str] = []
        queue_chunk = farm.broker.queue_chunk
        put = problems.put

        def queued(queue: str, body: str) -> tuple[int, int]:
            self.chunks.append(body)
            return queue_chunk(queue, body)

        def stored(client: Any, problem: Problem, ttl_s: int = problems.TTL_S) -> str:
            self.puts.append(problem.digest)
            return put(client, problem, ttl_s)

        monkeypatch.setattr(farm.broker, "queue_chunk", queued)
        monkeypatch.setattr(problems, "put", stored)


def test_a_stored_problem_is_sent_once(judge_farm: Farm, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "31337 4242\n"
    problem = Problem.model_validate(
        {"tests": [{"stdin": "1 2\n", "expected": "3\n"}, {"stdin": secret, "expected": "35579\n"}]}
    )
    sent = Sent(judge_farm, monkeypatch)
    first = judge_farm.judge("python3", SUM_PY, problem=problem)
    assert first.verdict == Verdict.AC, first
    items = [
        {"id": n, "language": "python3", "source": source, "problem": problem}
        for n, source in enumerate([SUM_PY, CAPPED_PY.replace("10**9", "5")])
    ]
    again = list(judge_farm.map(items, image="judge"))
    assert [r.judge.verdict if r.judge else r.message for r in again] == [Verdict.AC, Verdict.WA]
    assert sent.puts == [problem.digest]  # stored once, by the first judging
    assert sent.chunks and all(problem.digest in body for body in sent.chunks)
    assert not any(secret.strip() in body or "35579" in body for body in sent.chunks)
    assert judge_farm.registry.redis.exists(problems.key(problem.digest))


def test_a_digest_nothing_is_stored_under_is_an_input_error(judge_farm: Farm) -> None:
    digest = "sha256:" + "ab" * 32
    (record,) = judge_farm.map(
        [{"id": "gone", "language": "python3", "source": SUM_PY, "problem": digest}], image="judge"
    )
    assert record.status == "error" and record.kind == "input", record
    assert digest in (record.message or "") and "put_problem" in (record.message or "")
    result = judge_farm.judge("python3", SUM_PY, problem=digest)
    assert result.verdict == Verdict.IE and result.kind == "input"


def test_groups_of_a_stored_problem_are_scored(judge_farm: Farm) -> None:
    scoring = read_package(PACKAGES / "kattis_scoring")
    full = judge_farm.judge("python3", SUM_PY, problem=scoring)
    assert (full.verdict, full.score, full.max_score) == (Verdict.AC, 100, 100)
    capped = judge_farm.judge("python3", CAPPED_PY, problem=scoring.digest)  # stored above
    assert capped.verdict == Verdict.WA and capped.score == 40, capped.groups


def test_a_polygon_package_with_groups(judge_farm: Farm, tmp_path: Path) -> None:
    package = shutil.copytree(PACKAGES / "polygon_sum", tmp_path / "p")
    xml = (package / "problem.xml").read_text()  # its own testlib checker needs testlib.h
    (package / "problem.xml").write_text(
        xml.replace('<checker type="testlib">', '<checker name="std::wcmp.cpp" type="testlib">')
    )
    result = judge_farm.judge("python3", LIST_CAPPED_PY, problem=package)
    assert result.verdict == Verdict.WA and [t.verdict for t in result.tests][-1] == Verdict.WA
    assert (result.score, result.max_score) == (40, 100), result.groups  # test 5 of "large"
    assert judge_farm.judge("python3", LIST_PY, problem=package).score == 100


def test_the_async_client_judges_on_a_package_too(judge_farm: Farm) -> None:
    async def judged() -> tuple[str, Verdict]:
        farm = AsyncFarm(judge_farm)
        package = read_package(PACKAGES / "kattis_sum")
        digest = await farm.put_problem(package)
        return digest, (await farm.judge("python3", SUM_PY, problem=digest)).verdict

    assert asyncio.run(judged()) == (read_package(PACKAGES / "kattis_sum").digest, Verdict.AC)


def test_the_default_validator_ignores_case(judge_farm: Farm) -> None:
    source = "n = int(input())\nprint('EVEN' if n % 2 == 0 else 'odd', n / 2)\n"
    result = judge_farm.judge("python3", source, problem=PACKAGES / "kattis_parity")
    assert result.verdict == Verdict.AC, result
    wrong = judge_farm.judge("python3", "print('even 0')", problem=PACKAGES / "kattis_parity")
    assert wrong.verdict == Verdict.WA


@pytest.mark.parametrize(("source", "code", "verdict"), [(SUM_PY, 0, "AC"), (CAPPED_PY, 1, "WA")])
def test_farm_judge_a_kattis_package(
    judge_farm: Farm, tmp_path: Path, source: str, code: int, verdict: str
) -> None:
    path = tmp_path / "sum.py"
    path.write_text(source)
    url = judge_farm.settings.broker_url
    args = ["judge", "--problem", str(PACKAGES / "kattis_sum"), str(path), "--broker-url", url]
    result = CliRunner().invoke(app, args, catch_exceptions=False, terminal_width=200)
    assert result.exit_code == code, result.output
    assert f"verdict: {verdict}" in result.output
    assert all(f"data/secret/0{n}" in result.output for n in (1, 2))  # a row a test
