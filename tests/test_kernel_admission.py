"""The kernel's admission (a real kernel process): a box that finds no room waits for one, in
the order the requests came, up to its ``wait_s``; then it is refused and nothing of it ran. A
waiter whose host left, or whose item the host closed, takes no room. The pool's capacity is
set by the budget that runs out first. Design: docs/design/admission.md."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.kernel.boxes.pool import KERNEL_PIDS, BoxPool, Caps
from farm.kernel.wire import framing
from farm.kernel.wire.client import KernelClient, KernelRequestError
from farm.sandbox.process import ProcessSandbox
from tests.raw_sockets import authed
from tests.waiting import stays, wait_for


@pytest.fixture
def two_boxes() -> Iterator[ProcessSandbox]:
    """A kernel that holds two sessions (or items) at once."""
    with ProcessSandbox(extra_args=["--max-sessions", "2"]) as sandbox:
        yield sandbox


def capacity(client: KernelClient) -> dict[str, Any]:
    return dict(client.ping()["capacity"])


def opening(sandbox: ProcessSandbox, wait_s: float, **kwargs: Any) -> tuple[threading.Thread, dict]:
    """An open (or, with ``cells``, an item) sent from a thread of its own: its outcome."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        with sandbox.kernel() as client:
            try:
                if "cells" in kwargs:
                    outcome["reply"] = client.item(timeout_s=10, wait_s=wait_s, **kwargs)
                else:
                    outcome["reply"] = client.open_session(wait_s=wait_s, **kwargs)
            except KernelRequestError as exc:
                outcome["error"] = exc
            outcome["at"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_a_box_that_finds_no_room_waits_for_one_to_end(two_boxes: ProcessSandbox) -> None:
    with two_boxes.kernel() as client:
        assert capacity(client)["boxes"] == 2 and capacity(client)["binding"] == "sessions"
        first = client.open_session()
        client.open_session()
        thread, outcome = opening(two_boxes, wait_s=60)
        assert wait_for(lambda: capacity(client)["waiting"] == 1, 10), capacity(client)
        assert stays(lambda: "reply" not in outcome, 0.5)  # it waits, and is not refused
        closed_at = time.monotonic()
        client.close_session(first["session_id"])
        thread.join(30)
        opened = outcome["reply"]
        assert outcome["at"] >= closed_at and opened["queue_s"] > 0.5, outcome
        now = capacity(client)
        assert (now["admitted"], now["waiting"], now["refused"]) == (2, 0, 0), now


def test_a_box_that_waits_past_its_deadline_is_refused_and_runs_nothing(
    two_boxes: ProcessSandbox, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    with two_boxes.kernel() as client:
        client.open_session()
        client.open_session()
        started = time.monotonic()
        with pytest.raises(KernelRequestError) as refused:
            client.item("late", [f"open({str(marker)!r}, 'w').write('x')"], timeout_s=5, wait_s=0.3)
        assert refused.value.code == "too_many_sessions", refused.value
        assert "no room within 0.3 s" in str(refused.value)
        assert time.monotonic() - started >= 0.3
        assert not marker.exists()
        # a refusal the host may send again: the connection is kept
        assert client.ping()["capacity"]["refused"] == 1


def test_waiters_are_admitted_in_the_order_they_came(two_boxes: ProcessSandbox) -> None:
    with two_boxes.kernel() as client:
        held = [client.open_session()["session_id"] for _ in range(2)]
        waiting = []
        for n in range(3):  # one after the other: each waits before the next comes
            waiting.append(opening(two_boxes, wait_s=60))
            assert wait_for(lambda n=n: capacity(client)["waiting"] == n + 1, 10)
        for n in range(3):
            client.close_session(held.pop(0))
            thread, outcome = waiting[n]
            thread.join(30)
            held.append(outcome["reply"]["session_id"])
            assert all("reply" not in later[1] for later in waiting[n + 1 :]), n


def test_an_item_closed_while_it_waits_for_room_never_runs(
    two_boxes: ProcessSandbox, tmp_path: Path
) -> None:
    """A cancelled map closes its items' boxes, waiting ones too: once room comes the item is
    refused and runs nothing."""
    marker = tmp_path / "ran"
    with two_boxes.kernel() as client:
        first = client.open_session()
        client.open_session()
        code = f"open({str(marker)!r}, 'w').write('x')"
        thread, outcome = opening(
            two_boxes, wait_s=60, exec_id="x", cells=[code], session_id="waiting-item"
        )
        assert wait_for(lambda: capacity(client)["waiting"] == 1, 10)
        with pytest.raises(KernelRequestError):  # not open yet: nothing to close
            client.close_session("waiting-item")
        client.close_session(first["session_id"])
        thread.join(30)
        assert outcome["error"].code == "no_such_session", outcome
        assert not marker.exists()
        assert wait_for(lambda: capacity(client)["admitted"] == 1, 10), capacity(client)


def test_a_waiter_whose_connection_goes_takes_no_room(two_boxes: ProcessSandbox) -> None:
    with two_boxes.kernel() as client:
        first = client.open_session()
        client.open_session()
        gone = authed(two_boxes)
        framing.send_frame(gone, {"type": "open_session", "wait_s": 60})
        assert wait_for(lambda: capacity(client)["waiting"] == 1, 10)
        gone.close()
        client.close_session(first["session_id"])
        assert wait_for(lambda: capacity(client)["admitted"] == 1, 10), capacity(client)
        assert client.open_session(wait_s=5)["session_id"]


def test_the_pool_counts_boxes_by_the_budget_that_runs_out_first() -> None:
    caps = Caps(memory_mb=None, pids=KERNEL_PIDS + 10 * 65, fsize_mb=None, nofile=None, disk_mb=512)
    pool = BoxPool(isolation="namespaces", workspace_root="/tmp", count=100, caps=caps)
    box = {"pids": 64, "disk_mb": 128}
    assert pool.capacity(box) == (4, "disk_mb")  # the pids would hold 10
    assert pool.capacity({"pids": 64, "disk_mb": 16}) == (10, "pids")
    assert pool.fits(box) == 4
    taken = [pool.take(box) for _ in range(3)]
    assert pool.fits(box) == 1 and pool.fits({"pids": 64, "disk_mb": 256}) == 0
    assert pool.room({"pids": 64, "disk_mb": 256}) is not None
    for held in taken:
        assert held is not None
        pool.give_back(held, clean=True)
    pool.kept = 64  # emptied boxes kept for their numbers: an init's pid each
    assert pool.fits({"pids": 64, "disk_mb": 16}) == 9
