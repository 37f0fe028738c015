"""One-shot boxes (the kernel's ``item`` request: open, files, cells, command, close in one round
trip) and the boxes' default limits given at the kernel's start (``--box-*``), on the process
backend: the same rules as the step-by-step requests, for one round trip."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from farm.kernel.wire.client import KernelClient, KernelRequestError
from farm.models.frames import ItemResults
from farm.sandbox.process import ProcessSandbox
from farm.settings import BoxSettings
from tests.waiting import wait_for

BOX = BoxSettings(memory_mb=300, pids=40, nofile=200)


@pytest.fixture(scope="module")
def preset() -> Iterator[ProcessSandbox]:
    """A kernel whose boxes default to ``BOX`` (as a worker's sandbox does)."""
    with ProcessSandbox(box=BOX, extra_args=["--log-level", "WARNING"]) as sandbox:
        yield sandbox


@pytest.fixture
def client(preset: ProcessSandbox) -> Iterator[KernelClient]:
    with preset.kernel() as c:
        yield c


def outcome(reply: dict[str, object]) -> ItemResults:
    return ItemResults.from_kernel(reply, "w1", 10)  # as the worker reads it


def test_an_item_writes_its_files_runs_its_cells_and_command_then_its_box_is_gone(
    client: KernelClient,
) -> None:
    reply = client.item(
        "item-1",
        ["data = open('in.txt').read()", "data.upper()"],
        timeout_s=10,
        files={"in.txt": b"hello"},
        argv=["cat", "in.txt"],
    )
    done = outcome(reply)
    assert [c.exec_id for c in done.cells] == ["item-1-0", "item-1-1"]
    assert done.cells[-1].value is not None and done.cells[-1].value.text == "'HELLO'"
    assert done.command is not None and done.command.stdout == "hello"
    assert done.file_error is None
    assert client.ping()["sessions"] == 0  # closed with the reply
    with pytest.raises(KernelRequestError, match="no_such_session"):
        client.close_session(done.session_id)


def test_an_item_stops_at_its_first_failing_cell_and_runs_no_command(
    client: KernelClient,
) -> None:
    done = outcome(client.item("item-2", ["x = 1", "1 / 0", "x"], timeout_s=10, argv=["true"]))
    assert [c.status for c in done.cells] == ["ok", "error"]
    assert done.cells[1].error is not None and done.cells[1].error.ename == "ZeroDivisionError"
    assert done.command is None


def test_a_file_it_may_not_write_is_reported_and_nothing_runs(client: KernelClient) -> None:
    done = outcome(client.item("item-3", ["1"], timeout_s=10, files={"../../etc/x": b"no"}))
    assert done.file_error is not None and done.cells == []


def test_a_timeout_inside_an_item_is_the_cells_result_not_the_items_failure(
    client: KernelClient,
) -> None:
    done = outcome(client.item("item-4", ["import time; time.sleep(30)"], timeout_s=0.5))
    error = done.cells[0].error
    assert error is not None and error.kind == "timeout"
    assert client.ping()["sessions"] == 0


def test_the_host_may_close_an_item_while_it_runs(preset: ProcessSandbox) -> None:
    """A cancelled map closes its running items' boxes (by the session id it chose)."""
    replies: list[dict[str, object]] = []

    def run() -> None:
        with preset.kernel() as c:
            replies.append(
                c.item(
                    "item-5", ["import time; time.sleep(60)"], timeout_s=90, session_id="cancelme"
                )
            )

    thread = threading.Thread(target=run)
    thread.start()
    with preset.kernel() as c:
        assert wait_for(lambda: c.ping()["sessions"] >= 1, 10), "the item never opened its box"
        c.close_session("cancelme")
    thread.join(timeout=10)
    assert not thread.is_alive()
    done = outcome(replies[0])
    assert done.cells[0].state_lost and "closed while this call ran" in str(done.cells[0].error)


def test_a_session_id_in_use_is_refused(client: KernelClient, preset: ProcessSandbox) -> None:
    with preset.kernel() as other:
        opened = other.open_session()
        with pytest.raises(KernelRequestError, match="bad_request"):
            client.item("item-6", ["1"], timeout_s=5, session_id=opened["session_id"])
        assert client.ping()["type"] == "pong"  # the client reconnects after a refusal
        other.close_session(opened["session_id"])


def test_boxes_get_the_preset_limits_and_an_open_that_asks_nothing_takes_a_spare(
    client: KernelClient,
) -> None:
    assert client.ping()["box_limits"] == {"memory_mb": 300, "pids": 40, "nofile": 200}
    done = outcome(
        client.item(
            "item-7",
            ["import resource; resource.getrlimit(resource.RLIMIT_NOFILE)[0], 1"],
            timeout_s=10,
        )
    )
    value = done.cells[0].value
    assert value is not None and value.text == "(200, 1)"
    before = client.ping()
    assert wait_for(lambda: client.ping()["spares"] >= 1, 10), "no spare was made"
    client.item("warm", ["1"], timeout_s=5)
    middle = client.ping()
    assert middle["spare_opens"] == before["spare_opens"] + 1  # asked nothing: a spare
    own = outcome(client.item("item-9", ["1"], timeout_s=10, limits={"nofile": 100}))
    assert own.cells[0].ok
    after = client.ping()
    assert (after["opens"], after["spare_opens"]) == (middle["opens"] + 1, middle["spare_opens"])


def test_box_defaults_over_the_sandboxs_caps_stop_the_kernel_at_its_start() -> None:
    """A sandbox whose boxes could not open must fail to start, saying why."""
    from farm.errors import SandboxStartError

    too_many = BoxSettings(nofile=1 << 30)
    with pytest.raises(SandboxStartError), ProcessSandbox(box=too_many):
        pass


def test_with_events_each_cell_ends_with_its_result_before_the_next_says_anything(
    client: KernelClient,
) -> None:
    """A worker journals an item's cells as they run: each cell's ``done`` event (its result)
    comes before anything of the next cell, so each cell's record closes in order."""
    seen: list[tuple[str, str]] = []
    reply = client.item(
        "item-ev",
        ["print('a')", "print('b')", "1 / 0"],
        timeout_s=10,
        on_event=lambda exec_id, event: seen.append((exec_id, event["type"])),
    )
    ends = [i for i, (_, kind) in enumerate(seen) if kind == "done"]
    assert [seen[i][0] for i in ends] == ["item-ev-0", "item-ev-1", "item-ev-2"]
    for i, end in enumerate(ends):
        before = seen[: end + 1] if i == 0 else seen[ends[i - 1] + 1 : end + 1]
        assert {exec_id for exec_id, _ in before} == {f"item-ev-{i}"}, seen
    assert ("item-ev-0", "stream") in seen
    assert [c.status for c in outcome(reply).cells] == ["ok", "ok", "error"]


def test_a_box_closed_before_it_opened_never_runs(client: KernelClient) -> None:
    """A map cancelled at once may close an item's box before the kernel opened it: the open
    that comes after is refused and runs nothing (not the whole item after its cancel)."""
    with pytest.raises(KernelRequestError, match="no_such_session"):
        client.close_session("closed-first")
    with pytest.raises(KernelRequestError, match="no_such_session.*closed already"):
        client.item(
            "item-late", ["open('ran', 'w').write('x')"], timeout_s=5, session_id="closed-first"
        )
    assert client.ping()["sessions"] == 0


@pytest.fixture
def small_frames() -> Iterator[ProcessSandbox]:
    """A kernel whose frames hold 64 KiB (the default is 64 MiB): what must fit, fits."""
    with ProcessSandbox(
        extra_args=["--max-frame", str(64 * 1024), "--log-level", "WARNING"]
    ) as box:
        yield box


def test_an_items_results_and_their_events_fit_one_frame_together(
    small_frames: ProcessSandbox,
) -> None:
    """Each cell's output is capped, but an item's results (and, with events, each cell's
    done event) share frames: six cells of 15 kB each are cut to fit, never a lost kernel."""
    cells = [f"print('{n}' * 15000)" for n in range(6)]
    done: list[int] = []
    with small_frames.kernel() as c:
        reply = c.item(
            "big",
            cells,
            timeout_s=10,
            max_output_bytes=16 * 1024,
            # control characters: JSON writes each in six bytes, 96 kB in all unless cut
            argv=["sh", "-c", "head -c 16000 /dev/zero | tr '\\0' '\\001'"],
            on_event=lambda _, event: done.append(1) if event["type"] == "done" else None,
        )
        result = outcome(reply)
        assert [cell.status for cell in result.cells] == ["ok"] * 6 and len(done) == 6
        assert all("did not fit in one frame" in cell.stderr for cell in result.cells)
        assert result.command is not None and result.command.stdout_truncated
        assert len(result.command.stdout) < 16000  # cut to fit
        assert c.ping()["type"] == "pong"  # the connection lives
