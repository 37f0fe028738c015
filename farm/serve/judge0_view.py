"""A stored ``/judge0`` submission as Judge0 CE 1.13.1 shows it: its status id from farm's
verdict, its fields (``fields``: a comma list, ``*`` for all) and base64 when asked. The
answers of ``GET``, ``DELETE``, ``wait=true`` and the body of a callback are all this view.
"""

from __future__ import annotations

import base64
from typing import Any

from farm.judge.languages import LANGUAGES
from farm.models.batch import BatchRecord
from farm.models.judge import JudgeResult, Verdict
from farm.serve.judge0_input import LANGUAGE_BY_ID
from farm.serve.judge0_store import Entry

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
DEFAULT_FIELDS = ("token", "time", "memory", "stdout", "stderr", "compile_output", "message")
ENCODED = {"stdout", "stderr", "compile_output", "source_code", "stdin", "expected_output"}
REQUEST_FIELDS = (
    "source_code",
    "language_id",
    "stdin",
    "expected_output",
    "cpu_time_limit",
    "wall_time_limit",
    "memory_limit",
    "max_file_size",
    "compiler_options",
    "command_line_arguments",
    "callback_url",
)


def status_of(result: JudgeResult | None, record: BatchRecord | None) -> int:
    """Judge0's status id of a judged submission (``record`` none: still queued)."""
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


def view(entry: Entry, fields: str | None, encoded: bool) -> dict[str, Any]:
    record = entry.result
    result = record.judge if record is not None else None
    test = result.tests[0] if result is not None and result.tests else None
    status = entry.status_id if record is None else status_of(result, record)
    stdout = (
        base64.b64decode(test.output).decode(errors="replace") if test and test.output else None
    )
    message = result.message if result is not None else (record.message if record else None)
    shown: dict[str, Any] = {key: entry.doc.get(key) for key in REQUEST_FIELDS}
    shown |= {
        "token": entry.doc["token"],
        "stdout": stdout,
        "stderr": (test.stderr or None) if test else None,
        "compile_output": (result.compile.output or None) if result and result.compile else None,
        "message": (test.message if test and test.message else message) or None,
        "exit_code": test.exit_code if test else None,
        "exit_signal": test.signal if test else None,
        "status": {"id": status, "description": STATUSES[status]},
        "status_id": status,
        "created_at": entry.doc["created_at"],
        "finished_at": entry.finished_at,
        "time": f"{test.time_s:.3f}" if test else None,
        "wall_time": f"{test.wall_s:.3f}" if test else None,
        "memory": test.memory_kb if test else None,
        "language": {"id": entry.doc["language_id"], "name": _name(entry.doc["language_id"])},
    }
    if encoded:
        for key in ENCODED & shown.keys():
            if shown[key] is not None:
                shown[key] = base64.b64encode(shown[key].encode()).decode("ascii")
    wanted = DEFAULT_FIELDS + ("status",) if not fields else tuple(fields.split(","))
    if "*" in wanted:
        return shown
    return {key: shown[key] for key in wanted if key in shown}


def _name(language_id: int) -> str:
    name = LANGUAGE_BY_ID.get(language_id)
    return LANGUAGES[name].title if name else "unknown"
