"""Timeouts, crashes, epochs, output caps and process hygiene of the kernel."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from farm.kernel.supervisor.cell import fit
from farm.kernel.supervisor.session_state import OomCounter
from farm.kernel.wire.client import KernelClient
from farm.kernel.wire.framing import encode
from farm.local.processes import pid_alive
from farm.models import ExecResult
from farm.sandbox.process import ProcessSandbox
from tests.conftest import Cells
from tests.waiting import wait_for


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def gone_or_reaped(pid: int, deadline_s: float = 10.0) -> bool:
    """True once ``pid`` has no process (a zombie still counts as present)."""
    return wait_for(lambda: not os.path.exists(f"/proc/{pid}"), deadline_s)


def test_timeout_interrupts_and_keeps_state(own_cells: Cells) -> None:
    own_cells.run("counter = 41")
    result = own_cells.run("import time\nwhile True:\n    time.sleep(0.01)", timeout_s=0.5)
    assert result.error is not None
    assert result.error.kind == "timeout"
    assert not result.state_lost
    assert result.epoch == 1
    assert 'File "<cell>", line 3' in "".join(result.error.traceback)
    assert own_cells.value("counter + 1") == "42"


def test_code_ignoring_the_interrupt_is_killed_and_reported_as_state_lost(
    own_cells: Cells,
) -> None:
    # set up with the normal timeout (the handler stays for the session's next cells), so the
    # short timeout below covers only the loop, however slow the machine
    own_cells.run("secret = 1\nimport signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)")
    result = own_cells.run("while True:\n    time.sleep(0.01)", timeout_s=0.5)
    assert result.error is not None
    assert result.error.kind == "timeout"
    assert result.state_lost
    assert result.epoch == 2
    after = own_cells.run("secret")
    assert after.error is not None and after.error.ename == "NameError"  # fresh namespace


def test_code_that_exits_on_the_interrupt_is_reported_as_its_exit_not_a_kill(
    own_cells: Cells,
) -> None:
    own_cells.run("import os, signal, time\nsignal.signal(signal.SIGINT, lambda *a: os._exit(3))")
    result = own_cells.run("while True:\n    time.sleep(0.01)", timeout_s=0.5)
    assert result.error is not None and result.error.kind == "state_lost"
    assert "exited with code 3 during this call" in result.error.evalue
    assert own_cells.value("1 + 1") == "2"


def test_a_call_with_an_old_epoch_runs_nothing(own_cells: Cells) -> None:
    own_cells.run("import os; os._exit(3)")
    client = own_cells.client
    raw = client.execute(own_cells.id, "print('ran')", epoch=1, timeout_s=5)
    result = ExecResult.model_validate(raw)
    assert result.error is not None and result.error.kind == "state_lost"
    assert result.stdout == ""
    assert result.epoch == 2


@pytest.mark.parametrize(
    ("code", "detail"),
    [
        ("import os; os._exit(3)", "exited with code 3"),
        ("import ctypes; ctypes.string_at(0)", "SIGSEGV"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"),
    ],
)
def test_a_dying_session_is_reported_then_replaced(
    own_cells: Cells, code: str, detail: str
) -> None:
    own_cells.run("x = 1")
    result = own_cells.run(f"print('before')\n{code}")
    assert result.error is not None
    assert result.error.kind == "state_lost"
    assert detail in result.error.evalue
    assert result.state_lost and result.epoch == 2
    assert result.stdout == "before\n"
    assert own_cells.run("x").error is not None  # the new namespace is honest about it
    assert own_cells.value("1 + 1") == "2"


def test_death_between_calls_is_reported_on_the_next_call(own_cells: Cells, tmp_path: Path) -> None:
    go = tmp_path / "go"  # the process backend shares the host's files and pids
    pid = own_cells.value(
        "import threading, os, time\n"
        "def _die():\n"
        f"    while not os.path.exists({str(go)!r}):\n"
        "        time.sleep(0.01)\n"
        "    os._exit(5)\n"
        "threading.Thread(target=_die, daemon=True).start()\n"
        "os.getpid()"
    )
    go.touch()  # only now, after the call returned: the process dies between calls
    assert wait_for(lambda: not pid_alive(int(pid)), 10, 0.01), "the session process lived on"
    result = own_cells.run("print('should not run')")
    assert result.error is not None and result.error.kind == "state_lost"
    assert "between calls" in result.error.evalue and "code 5" in result.error.evalue
    assert result.stdout == ""
    assert own_cells.value("'again'") == "'again'"


def test_grandchildren_die_with_the_session_and_leave_no_zombie(kernel: ProcessSandbox) -> None:
    with kernel.kernel() as client:
        cells = Cells(client)
        pids = cells.value(
            "import subprocess, os\n"
            "p = subprocess.Popen('sleep 1000 & sleep 1000; wait', shell=True)\n"
            "q = subprocess.Popen(['sleep', '1000'])\n"
            "(os.getpid(), p.pid, q.pid)"
        )
        assert pids is not None
        session_pid, shell_pid, sleep_pid = eval(pids)
        client.close_session(cells.id)
    for pid in (session_pid, shell_pid, sleep_pid):
        assert gone_or_reaped(pid), f"process {pid} is still there (or a zombie)"


def test_timeout_kill_takes_the_whole_process_group(own_cells: Cells) -> None:
    child = own_cells.value(
        "import subprocess, signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "child = subprocess.Popen(['sleep', '1000'])\n"
        "child.pid"
    )
    assert child is not None
    result = own_cells.run("child.wait()", timeout_s=0.5)
    assert result.state_lost
    assert gone_or_reaped(int(child))


def test_output_is_capped_head_and_tail_with_a_marker(own_cells: Cells) -> None:
    # 20 kB against a 4 kB cap: capped, but below the flood rule (8x the cap interrupts the
    # cell, and whether that lands before a quick cell ends is a race)
    result = own_cells.run(
        "import sys\nsys.stdout.write('HEAD' + 'x' * 20_000 + 'TAIL')\n'done'",
        max_output_bytes=4096,
    )
    assert result.ok, result.error
    assert result.stdout_truncated
    assert result.stdout.startswith("HEAD") and result.stdout.endswith("TAIL")
    assert "farm cut 15912 bytes" in result.stdout
    assert len(result.stdout) < 4096 + 100


def test_a_print_flood_ends_with_output_limit_and_bounded_kernel_memory(
    own_cells: Cells, kernel: ProcessSandbox
) -> None:
    pid = own_cells.client.ping()["pid"]
    before = rss_kb(pid)
    result = own_cells.run("while True:\n    print('flood' * 100)", timeout_s=60)
    assert result.error is not None
    assert result.error.kind in ("output_limit", "timeout")
    assert result.stdout_truncated
    assert len(result.stdout) < 1024 * 1024 + 200
    assert rss_kb(pid) - before < 16 * 1024  # the cap is 1 MiB a stream
    assert own_cells.value("'still here'") == "'still here'"


def test_a_closed_sessions_output_is_let_go_at_once(kernel: ProcessSandbox) -> None:
    """An ended session process (its object, the last cell's captured output with it) is freed
    when its session closes, not at the collector's next full pass: 40 sessions that each held
    ~1 MiB of output leave the supervisor's memory where it was, not ~40 MiB higher."""
    with kernel.kernel() as client:
        pid = client.ping()["pid"]

        def session_with_output() -> None:
            opened = client.open_session()
            sid, epoch = opened["session_id"], opened["epoch"]
            result = client.execute(sid, "print('z' * (1 << 20))", epoch=epoch, timeout_s=30)
            assert result["stdout_truncated"]  # both halves of the 1 MiB buffer are full
            client.close_session(sid)

        for _ in range(5):  # the supervisor's own high-water marks first
            session_with_output()
        before = rss_kb(pid)
        for _ in range(40):
            session_with_output()
        assert rss_kb(pid) - before < 16 * 1024


def test_one_huge_line_is_capped(own_cells: Cells) -> None:
    result = own_cells.run(
        "import os\nchunk = b'y' * (1 << 20)\nfor _ in range(100):\n    os.write(1, chunk)",
        timeout_s=60,
    )
    assert result.stdout_truncated
    assert len(result.stdout.encode()) < 1024 * 1024 + 200


def test_invalid_utf8_on_fd_1_is_replaced_not_fatal(own_cells: Cells) -> None:
    result = own_cells.run("import os\nos.write(1, b'ok \\xff\\xfe end\\n')")
    assert result.ok
    assert result.stdout == "ok \ufffd\ufffd end\n"


def test_closing_fd_1_does_not_break_the_next_cell(own_cells: Cells) -> None:
    own_cells.run("import os\nos.close(1)")
    result = own_cells.run("print('visible again')")
    assert result.ok and result.stdout == "visible again\n"


def test_sessions_are_isolated_and_a_hundred_run_concurrently(kernel: ProcessSandbox) -> None:
    with kernel.kernel() as client:
        sessions = [Cells(client) for _ in range(100)]
        for i, cells in enumerate(sessions):
            cells.run(f"mine = {i}")
        values = [cells.value("mine") for cells in sessions]
        assert values == [str(i) for i in range(100)]
        assert client.ping()["sessions"] == 100
        for cells in sessions:
            client.close_session(cells.id)
        assert client.ping()["sessions"] == 0


def test_session_processes_volunteer_for_the_oom_killer(own_cells: Cells) -> None:
    assert own_cells.value("int(open('/proc/self/oom_score_adj').read())") == "800"
    kernel_pid = own_cells.client.ping()["pid"]
    with open(f"/proc/{kernel_pid}/oom_score_adj") as f:
        assert int(f.read()) < 800


def test_the_oom_counter_follows_its_file_read_again_each_time(tmp_path: Path) -> None:
    old = tmp_path / "memory.events"  # a kernel before 4.13: no oom_kill line
    old.write_text("low 0\nhigh 0\nmax 0\noom 0\n")
    v1 = tmp_path / "memory.oom_control"
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    counter = OomCounter((str(tmp_path / "missing"), str(old), str(v1)))
    try:
        assert counter.read() == 3
        v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")  # the same inode
        assert counter.read() == 4
    finally:
        counter.close()
    assert counter.read() is None
    assert OomCounter((str(tmp_path / "missing"), str(old))).read() is None


def a_result(stdout: str, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "exec_id": "e",
        "session_id": "s",
        "epoch": 1,
        "status": "ok",
        "stdout": stdout,
        "stderr": "",
        "value": {"text": "v", "data": data},
        "error": None,
        "stdout_truncated": False,
        "stderr_truncated": False,
        "duration_s": 0.0,
        "cpu_s": 0.0,
        "max_rss_kb": 0,
        "state_lost": False,
    }


@pytest.mark.parametrize("data", [{"text/plain": "v"}, {"application/json": {"k": [1, 2]}}])
def test_a_result_is_cut_to_its_frame_only_when_it_does_not_fit(data: dict[str, Any]) -> None:
    max_frame = 64 * 1024
    small = a_result("x" * 1000, data)
    assert fit(dict(small), max_frame) == small
    escapes = a_result("\x01" * 20_000, data)  # 20 000 characters, 120 000 bytes of JSON
    cut = fit(escapes, max_frame)
    assert cut["stdout_truncated"] and "did not fit in one frame" in cut["stderr"]
    assert len(encode({"type": "exec_result", "result": cut})) <= max_frame


def test_closing_a_session_twice_is_a_clear_error(client: KernelClient) -> None:
    from farm.kernel.wire.client import KernelRequestError

    session = client.open_session()
    client.close_session(session["session_id"])
    with pytest.raises(KernelRequestError) as info:
        client.close_session(session["session_id"])
    assert info.value.code == "no_such_session"
    assert client.ping()["type"] == "pong"  # the connection stays usable
