"""Conformance with DMOJ: its judge-server's own testsuite cases judged by farm, verdict by verdict.

Run with the project venv, on a checkout of DMOJ's ``testsuite/`` (not part of this repository:
DMOJ is AGPL; its files are read at run time, never copied)::

    git -C DMOJ-judge-server archive HEAD testsuite | tar -x -C /tmp/dmoj
    .venv/bin/python bench/conformance.py /tmp/dmoj/testsuite [--only REGEX] [--json]

Every case in a language of farm's judge image (``bench/dmoj_cases.py`` maps DMOJ's executor
names) becomes one judge item, all in one ``Farm.map`` on ``Farm.local(images={"judge": 1})``:
DMOJ's tests, time limit, memory limit (KB, raised to farm's 16 MB floor where lower: noted),
compile limit (10 s), its checker where a farm built-in judges alike, its bridged checker or
interactor as a testlib program (``bench/dmoj_programs.py``), every test run (``all_tests``).
A case agrees when each test's verdict is one DMOJ's case accepts (RTE and IR are farm's RE; a
test after a batch's first failure, or in a batch whose dependency failed, is DMOJ's SC); a
``CE`` or an ``IE`` of kind ``input`` when DMOJ expects it; farm's points DMOJ's ``score``.
Prints the table, the skipped cases with why, the agreements by language and expected verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from benchlib import machine
from dmoj_cases import Case, Skip, read_suite

from farm.client import Farm
from farm.models.batch import BatchRecord
from farm.models.judge import JudgeResult, Verdict
from farm.sandbox.catalog import build_image

IMAGE = "judge"


def image_languages(tag: str = "farm-sandbox:judge") -> set[str]:
    """The languages the judge image's table holds (what its runner can judge)."""
    out = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "cat", tag, "/etc/farm/judge/languages.json"],
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    return set(json.loads(out))


def farm_codes(case: Case, result: JudgeResult) -> list[str]:
    """Each test's verdict as DMOJ would report it: SC after a failure in its batch, or in a
    batch whose dependency did not pass whole."""
    codes = [test.verdict.value for test in result.tests]
    passed: dict[int, bool] = {}
    for number, batch in enumerate(case.batches):
        blocked = any(not passed.get(d, False) for d in case.depends.get(number, []))
        failed = blocked
        for index in batch:
            if index >= len(codes):
                continue
            if failed:
                codes[index] = "SC"
            elif codes[index] != "AC":
                failed = True
        passed[number] = not failed
    return codes


def compare(case: Case, result: JudgeResult) -> tuple[bool, str]:
    """Whether farm's result agrees with what DMOJ expects, and farm's verdicts in short."""
    verdict = result.verdict.value
    if verdict == "IE":  # only the problem's fault (input) is DMOJ's IE; infra is farm's
        return verdict in case.expect and result.kind == "input", f"IE({result.kind})"
    if verdict == "CE":
        return verdict in case.expect, verdict
    codes = farm_codes(case, result)
    count = len(case.item["tests"])
    agree = len(codes) == count and all(
        code in case.per_test.get(number, case.expect) for number, code in enumerate(codes, 1)
    )
    shown = codes[0] if len(set(codes)) == 1 and not case.per_test else ",".join(codes)
    if case.score is not None:  # DMOJ's points: a test's value times the share it earned
        score = sum(
            value * (test.points if test.points is not None else test.verdict == Verdict.AC)
            for value, test in zip(case.points, result.tests, strict=False)
        )
        agree = agree and math.isclose(score, case.score, abs_tol=1e-6)
        shown += f" {score:g}pt"
    return agree, shown or "no tests"


def expected(case: Case) -> str:
    if case.per_test:
        return ",".join("|".join(sorted(case.per_test[n])) for n in sorted(case.per_test))
    score = f" {case.score:g}pt" if case.score is not None else ""
    return "|".join(sorted(case.expect)) + score


def run(cases: list[Case]) -> dict[str, BatchRecord]:
    build_image(IMAGE)
    with Farm.local(images={IMAGE: 1}) as farm:
        items = [case.item for case in cases]
        return {str(r.id): r for r in farm.map(items, image=IMAGE, ordered=False, retries=1)}


def report(cases: list[Case], skips: list[Skip], records: dict[str, BatchRecord]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for case in cases:
        record = records[case.name]
        result = record.judge or JudgeResult(verdict=Verdict.IE, message=record.message or "")
        agree, says = compare(case, result)
        message = result.message.strip().splitlines()[0][:90] if result.message.strip() else ""
        if not message and result.tests:
            failing = [t for t in result.tests if t.verdict.value != "AC"]
            message = failing[0].message[:90] if failing else ""
        rows.append(
            {
                "case": case.name,
                "dmoj": case.dmoj_language,
                "language": case.item["language"],
                "expects": expected(case),
                "farm": says,
                "agree": agree,
                "notes": "; ".join(case.notes),
                "message": message,
            }
        )
    width = max((len(row["case"]) for row in rows), default=10)
    print(f"{'case':<{width}}  {'language':<10} {'DMOJ expects':<16} {'farm says':<16} agree")
    for row in rows:
        mark = "yes" if row["agree"] else "NO"
        notes = f"  ({row['notes']})" if row["notes"] else ""
        print(
            f"{row['case']:<{width}}  {row['language']:<10} {row['expects']:<16} "
            f"{row['farm']:<16} {mark}{notes}"
        )
    agreed = sum(row["agree"] for row in rows)
    print(f"\nagreements: {agreed} of {len(rows)}")
    above = [row for row in rows if "raised" not in row["notes"]]
    print(f"  with DMOJ's memory limit at or above farm's 16 MB floor: "
          f"{sum(row['agree'] for row in above)} of {len(above)}")  # fmt: skip
    for key in ("language", "expects"):
        total, good = Counter(r[key] for r in rows), Counter(r[key] for r in rows if r["agree"])
        print(f"by {key}: " + ", ".join(f"{k} {good[k]}/{n}" for k, n in sorted(total.items())))
    print("\ndisagreements:")
    for row in rows:
        if not row["agree"]:
            print(f"  {row['case']}: DMOJ {row['expects']}, farm {row['farm']}: {row['message']}")
    print(f"\nskipped ({len(skips)}):")
    for skip in skips:
        print(f"  {skip.name} [{skip.language}]: {skip.reason}")
    return {"machine": machine(), "agreed": agreed, "cases": len(rows), "rows": rows,
            "skipped": [vars(skip) for skip in skips]}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("testsuite", nargs="?", type=Path, help="DMOJ's testsuite directory")
    parser.add_argument("--only", help="judge only the cases whose name matches this regex")
    parser.add_argument("--no-py2", action="store_true", help="skip PY2 cases, even valid py3")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.testsuite is None:
        parser.error("give the path of DMOJ's testsuite directory")
    found = read_suite(args.testsuite, image_languages(), py2_as_py3=not args.no_py2)
    if args.only:
        found = [case for case in found if re.search(args.only, case.name)]
    cases = [case for case in found if isinstance(case, Case)]
    skips = [case for case in found if isinstance(case, Skip)]
    summary = report(cases, skips, run(cases))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
