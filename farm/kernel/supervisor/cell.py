"""``Cell``: builds the result dict of one execute call (validated host-side as ``ExecResult``).

Every path of a call ends here: the code's own reply, an interrupt turned into ``timeout`` or
``output_limit``, a kill (``state_lost``), or a refusal that ran nothing (whose message says
``NOT_RUN``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from .. import KIND_OOM, KIND_OUTPUT_LIMIT, KIND_STATE_LOST, KIND_TIMEOUT
from ..wire.protocol import CellError, CellResult, CommandOutcome, Execute, Kind, ValueBundle
from ..wire.session_frames import CellDone

if TYPE_CHECKING:
    from .session_process import SessionProcess
    from .session_state import Session


class Cell:
    """Builds the result dict of one execute call (validated host-side as ``ExecResult``)."""

    def __init__(self, session: Session, request: Execute) -> None:
        self.session = session
        self.request = request
        self.t0 = time.perf_counter()
        self.stdout = self.stderr = ""
        self.stdout_truncated = self.stderr_truncated = False

    def finish(self, proc: SessionProcess) -> None:
        for fd in proc.fds:
            proc.drain(fd)
        self.stdout, self.stdout_truncated = proc.out.text(), proc.out.truncated
        self.stderr, self.stderr_truncated = proc.err.text(), proc.err.truncated

    def _result(
        self,
        status: Literal["ok", "error"] = "ok",
        value: ValueBundle | None = None,
        error: CellError | None = None,
        cpu_s: float = 0.0,
        max_rss_kb: int = 0,
        state_lost: bool = False,
    ) -> CellResult:
        return {
            "exec_id": self.request["exec_id"],
            "session_id": self.session.id,
            "epoch": self.session.epoch,
            "status": status,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "value": value,
            "error": error,
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
            "duration_s": time.perf_counter() - self.t0,
            "cpu_s": cpu_s,
            "max_rss_kb": max_rss_kb,
            "state_lost": state_lost,
        }

    def _error(self, ename: str, evalue: str, kind: Kind, *, state_lost: bool) -> CellResult:
        error: CellError = {"ename": ename, "evalue": evalue, "traceback": [], "kind": kind}
        return self._result(status="error", error=error, state_lost=state_lost)

    def lost(self, why: str, *, kind: Kind = KIND_STATE_LOST) -> CellResult:
        ename = "OutOfMemory" if kind == KIND_OOM else "StateLost"
        return self._error(ename, f"{why} (new epoch {self.session.epoch})", kind, state_lost=True)

    def killed(self, reason: Kind, grace_s: float) -> CellResult:
        what = "produced too much output" if reason == KIND_OUTPUT_LIMIT else "timed out"
        why = (
            f"the code {what} and ignored the interrupt for {grace_s:g}s, so the session "
            f"process was killed; its variables are gone (new epoch {self.session.epoch})"
        )
        ename = "OutputLimitExceeded" if reason == KIND_OUTPUT_LIMIT else "TimeoutError"
        return self._error(ename, why, reason, state_lost=True)

    def done(self, reply: CellDone, reason: Kind | None) -> CellResult:
        error = reply.get("error")
        if error is not None and reason is not None and error["ename"] == "KeyboardInterrupt":
            error["kind"] = reason
            if reason == KIND_TIMEOUT:
                error["ename"] = "TimeoutError"
                error["evalue"] = (
                    f"the code ran past its {self.request['timeout_s']:g}s timeout and was "
                    "interrupted; the session's variables are kept"
                )
            else:
                error["ename"] = "OutputLimitExceeded"
                error["evalue"] = "the code printed too much and was interrupted; state kept"
        return self._result(
            status="error" if error else "ok",
            value=reply.get("value"),
            error=error,
            cpu_s=reply.get("cpu_s", 0.0),
            max_rss_kb=reply.get("max_rss_kb", 0),
        )


def kill_notes(kills: list[tuple[int, int, int, int]]) -> str:
    """What the memory watch (``memwatch``) killed in a box during a call, for its stderr."""
    return "".join(
        f"[farm: killed pid {pid} of this box ({kb // 1024} MB): its processes together used "
        f"{total // 1024} MB, over its {budget // 1024} MB (memory_mb)]\n"
        for pid, kb, total, budget in kills
    )


def over_budget(result: CellResult, kills: list[tuple[int, int, int, int]]) -> CellResult:
    """A cell during which the memory watch killed processes of its box: each kill said on
    stderr, and a cell that failed is ``oom`` (its failure follows from the kill: a pool whose
    worker died, a child's exit status, a session process that is gone). A command's result
    has no error to mark (the host judges its exit status): it gets the notes alone."""
    if not kills:
        return result
    result["stderr"] += kill_notes(kills)
    error = result["error"]
    if error is not None and error["kind"] != KIND_OUTPUT_LIMIT:
        error["kind"] = KIND_OOM
    return result


FIT_NOTE = (
    "\n[farm: the result did not fit in one frame ({size} bytes, limit {limit}); outputs cut]\n"
)
Fitted = TypeVar("Fitted", CellResult, CommandOutcome)


def _size(result: Mapping[str, Any]) -> int:
    return len(json.dumps(result, ensure_ascii=False).encode()) + 256  # the frame around it


def _surely_fits(result: Mapping[str, Any], max_frame: int) -> bool:
    """True when ``result`` fits ``max_frame`` without measuring it: as JSON a character of
    its strings takes at most 6 bytes, the rest (keys, numbers, quotes) well under 4 KiB plus
    8 bytes an item. A value whose data is not plain strings (``application/json``) is
    measured instead. Saves a warm cell a second JSON encoding of its result."""
    strings = [result["stdout"], result["stderr"], result["exec_id"], result["session_id"]]
    value, error = result.get("value"), result.get("error")
    if value:
        data = value["data"]
        if not all(type(v) is str for v in data.values()):
            return False
        strings += [value["text"], *data, *data.values()]
    if error:
        strings += [error["ename"], error["evalue"], error["kind"], *error["traceback"]]
    return 6 * sum(map(len, strings)) + 8 * len(strings) + 4096 <= max_frame


def fit(result: Fitted, max_frame: int) -> Fitted:
    """``result`` as it can travel in one frame of ``max_frame`` bytes. Values are bounded
    where they are made (``render.framed``) and outputs by their cap, but JSON escapes can
    take six bytes a character: outputs are then clipped head+tail until the frame fits, and
    ``stderr`` says so. Never a frame the kernel cannot send (that would lose the session)."""
    if _surely_fits(result, max_frame):
        return result
    room = max_frame // 3
    while (size := _size(result)) > max_frame and room >= 1024:
        _short_traceback(result)
        if len(result["stdout"]) > room:
            result["stdout"], result["stdout_truncated"] = _clip(result["stdout"], room), True
        if len(result["stderr"]) > room:
            result["stderr"], result["stderr_truncated"] = _clip(result["stderr"], room), True
        room //= 2
        if _size(result) <= max_frame:
            result["stderr"] += FIT_NOTE.format(size=size, limit=max_frame)
    return result


def _short_traceback(result: Mapping[str, Any]) -> None:
    error = result.get("error")  # a cell's (a command's has none)
    if error:
        error["traceback"] = error["traceback"][-50:]


def _clip(text: str, limit: int) -> str:
    half = limit // 2
    return f"{text[:half]}\n[... farm cut {len(text) - 2 * half} characters ...]\n{text[-half:]}"
