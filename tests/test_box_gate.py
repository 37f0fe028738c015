"""A worker's ``BoxGate`` with real threads: it admits no more than its capacity, session opens
go ahead of every map item, maps take turns, judge items stay within ``judge_parallel``, and a
waiter that gives up is never admitted. Design: docs/design/admission.md."""

from __future__ import annotations

import threading
from typing import Any

from farm.worker.box_gate import BoxGate, Ticket, weight
from tests.waiting import wait_for


def item(group: str, log: list[str], name: str, kind: Any = "item", w: int = 1) -> Ticket:
    return Ticket(kind, w, group, start=lambda ticket: log.append(name))


def test_a_gate_admits_no_more_than_its_capacity_and_maps_take_turns() -> None:
    gate = BoxGate(2, max_sessions=8, judge_parallel=4)
    started: list[str] = []
    tickets = {f"a{n}": item("a", started, f"a{n}") for n in range(3)}
    tickets |= {f"b{n}": item("b", started, f"b{n}") for n in range(2)}
    for name in ("a0", "a1", "a2", "b0", "b1"):
        gate.submit(tickets[name])
    assert started == ["a0", "a1"] and gate.waiting() == {"open": 0, "item": 3}
    gate.release(tickets["a0"])
    gate.release(tickets["a1"])
    assert started == ["a0", "a1", "b0", "a2"]  # b's turn first, then a's again
    gate.release(tickets["b0"])
    assert started[-1] == "b1" and gate.in_use == 2


def test_a_session_open_goes_ahead_of_every_waiting_map_item() -> None:
    gate = BoxGate(1, max_sessions=8, judge_parallel=4)
    started: list[str] = []
    running = item("big-map", started, "m0")
    gate.submit(running)
    for n in range(1, 50):
        gate.submit(item("big-map", started, f"m{n}"))
    opened: list[Ticket | None] = []
    thread = threading.Thread(target=lambda: opened.append(gate.open(1, 30)))
    thread.start()
    assert wait_for(lambda: gate.waiting()["open"] == 1, 5)
    gate.release(running)
    thread.join(5)
    assert opened and opened[0] is not None and started == ["m0"]
    assert gate.wait_for_room(0.05) == (False, False)  # the open holds the room: nothing taken
    gate.release(opened[0])
    assert started == ["m0", "m1"]


def test_an_open_that_gives_up_is_never_admitted_and_blocks_nothing() -> None:
    gate = BoxGate(1, max_sessions=8, judge_parallel=4)
    started: list[str] = []
    running = item("m", started, "m0")
    gate.submit(running)
    assert gate.open(1, 0.2) is None  # no room in time
    assert gate.waiting() == {"open": 0, "item": 0}
    waiting = item("m", started, "m1")
    gate.submit(waiting)
    gate.release(running)
    assert started == ["m0", "m1"]
    late = item("m", started, "m2")
    gate.submit(late)
    assert gate.cancel(late) and not gate.cancel(waiting)  # waiting was admitted: too late
    gate.release(waiting)
    assert started == ["m0", "m1"] and gate.in_use == 0


def test_judge_items_run_at_most_judge_parallel_at_once_and_others_pass_them() -> None:
    gate = BoxGate(8, max_sessions=8, judge_parallel=1)
    started: list[str] = []
    j0, j1 = item("judge", started, "j0", "judge"), item("judge", started, "j1", "judge")
    gate.submit(j0)
    gate.submit(j1)
    gate.submit(item("plain", started, "p0"))
    assert started == ["j0", "p0"]
    gate.release(j0)
    assert started == ["j0", "p0", "j1"]


def test_a_box_weighs_what_it_takes_of_the_budgets_that_add_up() -> None:
    defaults = {"pids": 64, "disk_mb": 128, "memory_mb": 256}
    assert weight(None, defaults) == 1
    assert weight({"memory_mb": 2048, "nofile": 4096}, defaults) == 1  # not added up
    assert weight({"disk_mb": 256}, defaults) == 2
    assert weight({"pids": 256, "disk_mb": 64}, defaults) == 4  # 257 / 65 pids
    assert weight({"pids": 8}, {"pids": 64}) == 1
