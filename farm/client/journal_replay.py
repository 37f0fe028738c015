"""Opt-in restore after a state loss: re-run the session's successful cells from its journal.

``farm.session(on_state_lost="replay")``. Invariants: nothing is replayed from a partial
history (a trimmed journal or a failing replay is ``RestoreFailed``, never a namespace that
silently lacks state); a lost call that ran nothing is run once more, one that ran never is;
the report (``Session.restores``) names every replayed cell, whose effects outside the
namespace may repeat. Details: docs/design/events-and-journal.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from farm.errors import RestoreFailed, SessionLost, StateLost
from farm.events.run_events import Branch, Event, ExecEnd, ExecStart
from farm.models import ErrorKind, ExecResult, ReplayedCell, RestoreReport

if TYPE_CHECKING:
    from farm.client.exec_call import Caller

log = logging.getLogger(__name__)


def live_cells(events: Iterable[Event], lost_exec_id: str) -> list[ExecStart]:
    """The cells whose effects the namespace held when run ``lost_exec_id`` lost it."""
    starts: dict[str, ExecStart] = {}
    live: list[ExecStart] = []
    kept: dict[str, list[ExecStart]] = {}  # checkpoint id -> the cells it holds
    for event in events:
        if isinstance(event, Branch) and event.checkpoint_id is not None:
            if event.op == "checkpoint":
                kept[event.checkpoint_id] = list(live)
            elif event.op == "rollback":
                live = list(kept.get(event.checkpoint_id, live))
        elif isinstance(event, ExecStart):
            starts[event.exec_id] = event
        elif isinstance(event, ExecEnd):
            if event.exec_id == lost_exec_id:
                break
            if event.state_lost:
                live.clear()
            elif event.status == "ok" and event.exec_id in starts:
                live.append(starts[event.exec_id])
    return live


def restore(
    session: Caller, lost: ExecResult, code: str, timeout_s: float | None, **kwargs: Any
) -> ExecResult:
    """Rebuild ``session``'s namespace after ``lost``; return the call's result."""
    journal = session.farm.journal
    events = list(journal.events(session.id))
    if not journal.complete(session.id):
        raise RestoreFailed(lost, "the journal no longer holds the session's whole history")
    end = next((e for e in events if isinstance(e, ExecEnd) and e.exec_id == lost.exec_id), None)
    report = RestoreReport(
        session_id=session.id,
        lost_exec_id=lost.exec_id,
        reason=lost.error.evalue if lost.error else "state lost",
    )
    session.restart()
    for cell in live_cells(events, lost.exec_id):
        replay = session.collect(session.send(cell.code, timeout_s, replay_of=cell.exec_id))
        if not replay.ok:
            why = f"replaying run {cell.exec_id} failed: {replay.error}"
            raise RestoreFailed(lost, why, report)
        report.replayed.append(
            ReplayedCell(exec_id=cell.exec_id, replay_exec_id=replay.exec_id, code=cell.code)
        )
    session.restores.append(report)
    log.warning(
        "session %s on worker %s: state lost in exec %s; replayed %d cells (%s)",
        session.id,
        session.worker,
        lost.exec_id,
        len(report.replayed),
        report.warning,
    )
    if end is not None and not end.ran:
        report.reran_lost_call = True
        result = session.collect(session.send(code, timeout_s, **kwargs))
        if result.kind == ErrorKind.SANDBOX_LOST:
            raise SessionLost(
                session.id, session.worker, result.error.evalue if result.error else ""
            )
        if result.kind == ErrorKind.STATE_LOST:  # lost again: once is enough, the caller decides
            raise StateLost(result)
        return result
    return lost
