"""``session.exec`` and ``session.files`` against a real Redis and a real Celery worker in this
process (process backend): commands beside the REPL, files of any size. The docker versions
(isolation of commands and files between boxes) are in ``test_cotenancy.py``."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from farm.client import Farm, Session
from farm.errors import FileOperationError
from farm.local.processes import pid_alive
from tests.conftest import Cells
from tests.waiting import wait_for


@pytest.fixture
def session(inproc_farm: Farm) -> Session:
    with inproc_farm.session() as s:
        yield s


def test_a_command_returns_its_status_and_separate_outputs(session: Session) -> None:
    result = session.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.ok and result.kind == "user" and result.error is None
    shell = session.exec("printf '%s' \"$GREETING\"", env={"GREETING": "hi there"})
    assert shell.ok and shell.stdout == "hi there"


def test_argv_travels_intact_and_stdin_of_any_size_reaches_the_command(session: Session) -> None:
    assert session.exec(["printf", "%s|", "a b", "$HOME", "`x`"]).stdout == "a b|$HOME|`x`|"
    assert session.exec(["cat"], input="hello\nworld\n").stdout == "hello\nworld\n"
    assert session.exec(["cat"], input="").stdout == ""
    binary = b"\xc3\x28\x00\xff\x01"
    out = session.exec(["sh", "-c", "cat > stdin.bin"], input=binary)
    assert out.ok and session.files.read("stdin.bin") == binary
    big = b"x" * (20 * 1024 * 1024)  # past what travels inline: staged in the box first
    assert session.exec(["wc", "-c"], input=big).stdout.strip() == str(len(big))
    assert not [e for e in session.files.list() if e["path"].startswith(".farm-stdin")]


def test_argv_and_env_of_megabytes_run_and_hurt_no_neighbour(
    inproc_farm: Farm, session: Session
) -> None:
    """A request larger than one zygote datagram travels in a memfd: it runs, and it can never
    take the zygote (and with it every session of the sandbox) down."""
    with inproc_farm.session() as neighbour:
        neighbour.run("kept = 'yes'")
        args = ["x" * 100_000] * 10  # each under Linux's 128 KiB per argument, 1 MB in all
        big = session.exec(
            ["sh", "-c", 'echo "$# ${#BIG}"', "sh", *args], env={"BIG": "y" * 100_000}
        )
        assert big.ok and big.stdout == "10 100000\n", big
        too_big = session.exec(["true", *(["x" * 100_000] * 40)])  # past ARG_MAX: exec says so
        assert not too_big.ok and "Argument list too long" in too_big.stderr, too_big
        assert neighbour.run("kept").value.text == "'yes'"  # type: ignore[union-attr]
        assert session.exec(["true"]).ok


@pytest.mark.slow
def test_a_command_that_ends_at_once_always_reports_its_exit(session: Session) -> None:
    """The zygote may report a fast command's fork and exit in one read, before the command
    is registered: its exit is kept for it, never lost (which looked like a timeout)."""
    for _ in range(200):
        result = session.exec(["true"], timeout_s=30)
        assert result.ok and not result.timed_out, result


def test_a_timeout_kills_the_whole_group_and_the_session_lives(session: Session) -> None:
    result = session.exec("sleep 30 & echo $$ $!; sleep 30", timeout_s=1)
    assert result.timed_out and result.kind == "timeout"
    shell, child = (int(pid) for pid in result.stdout.split())
    assert wait_for(lambda: not pid_alive(shell) and not pid_alive(child), 10)  # the tree, not one
    assert session.run("1 + 1").value is not None


# A daemon that left the command's group (setsid) and one whose parent exited at once (a
# double fork: re-parented), each printing its pid, then a wait that outlives the timeout.
ESCAPES = (
    "setsid sleep 300 >/dev/null 2>&1 & echo $!; "
    "(setsid sleep 300 >/dev/null 2>&1 & echo $!); sleep 30"
)


def test_a_timeout_kills_the_whole_tree_and_nothing_else(session: Session) -> None:
    """Descendants that left the group or were re-parented die with the command at its
    timeout; the session's process, a command running beside it and the background child of
    a command that ended earlier live on."""
    session.exec("(sleep 60 & echo $! > bg.pid) > /dev/null 2>&1", timeout_s=10)
    background = int(session.files.read("bg.pid"))
    beside: list[Any] = []
    thread = threading.Thread(
        target=lambda: beside.append(session.exec("touch beside; sleep 3; echo kept", timeout_s=30))
    )
    thread.start()
    assert wait_for(lambda: session.exec(["ls"]).stdout.split().count("beside"), 10)
    result = session.exec(ESCAPES, timeout_s=1)
    assert result.timed_out and result.kind == "timeout", result
    escaped = [int(pid) for pid in result.stdout.split()]
    assert len(escaped) == 2, result
    assert wait_for(lambda: not any(pid_alive(pid) for pid in escaped), 10), escaped
    thread.join()
    assert beside[0].ok and beside[0].stdout == "kept\n", beside
    assert pid_alive(background)
    assert session.run("1 + 1").value is not None


@pytest.mark.docker
def test_in_a_docker_box_a_timeout_kills_the_whole_tree_too(docker_sandbox: Any) -> None:
    """The same in a box of its own uid: the supervisor kills what the keeper holds."""
    with docker_sandbox.kernel() as client:
        cells = Cells(client)
        result = client.command(cells.id, ["sh", "-c", ESCAPES], exec_id="tree", timeout_s=1)
        assert result["timed_out"], result
        escaped = [int(pid) for pid in result["stdout"].split()]
        assert len(escaped) == 2, result
        alive = f"import os\n[p for p in {escaped} if os.path.exists(f'/proc/{{p}}')]"
        assert wait_for(lambda: cells.value(alive) == "[]", 10), cells.value(alive)
        assert cells.value("1 + 1") == "2"
        client.close_session(cells.id)


def test_a_signal_death_is_128_plus_the_signal(session: Session) -> None:
    result = session.exec(["sh", "-c", "kill -TERM $$"])
    assert (result.returncode, result.signal, result.timed_out) == (143, 15, False)


def test_programs_that_cannot_run_say_why(session: Session) -> None:
    missing = session.exec(["no-such-program-xyz"])
    assert missing.returncode == 127 and "command not found" in missing.stderr
    session.files.write("data.txt", "not a program")
    denied = session.exec(["./data.txt"])
    assert denied.returncode == 126 and "ermission" in denied.stderr
    nowhere = session.exec(["ls"], cwd="no/such/dir")
    assert nowhere.returncode == 126 and "cwd" in nowhere.stderr


def test_cwd_is_the_workspace_and_may_be_relative_or_absolute(session: Session) -> None:
    session.files.write("sub/f.txt", "x")
    assert "sub" in session.exec(["ls"]).stdout.split()
    assert session.exec(["ls"], cwd="sub").stdout == "f.txt\n"
    assert session.exec(["pwd"], cwd="/").stdout == "/\n"


def test_a_background_process_outlives_its_command_and_the_box_ends_it(
    inproc_farm: Farm,
) -> None:
    with inproc_farm.session() as s:
        s.exec("(sleep 60 & echo $! > bg.pid) > /dev/null 2>&1", timeout_s=10)
        pid = int(s.files.read("bg.pid"))
        alive = s.exec(["kill", "-0", str(pid)])
        assert alive.ok, alive  # the command ended; its background child did not
    gone = lambda: not pid_alive(pid)  # noqa: E731 - the session closed: its box is reset
    assert wait_for(gone, 10)


def test_commands_run_at_once_and_beside_a_cell(session: Session) -> None:
    """Four commands wait for a file the cell creates once it saw all four start: queued
    behind one another or behind the cell, they would time out instead."""
    wait = "touch started-$N; while [ ! -f go ]; do sleep 0.05; done; echo released"
    results = []

    def one(n: int) -> None:
        results.append(session.exec(wait, env={"N": str(n)}, timeout_s=30))

    threads = [threading.Thread(target=one, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    cell = session.run(
        "import os, time\ndeadline = time.monotonic() + 20\n"
        "while len([f for f in os.listdir() if f.startswith('started-')]) < 4:\n"
        "    assert time.monotonic() < deadline, 'the commands did not all start'\n"
        "    time.sleep(0.05)\nopen('go', 'w').close()\n'released them'",
        timeout_s=30,
    )
    for thread in threads:
        thread.join()
    assert cell.ok, cell.error
    assert [r.stdout for r in results] == ["released\n"] * 4


def test_files_of_any_size_round_trip_in_chunks(session: Session) -> None:
    payload = bytes(range(256)) * (48 * 1024)  # 12 MiB: three chunks
    assert session.files.write("blobs/big.bin", payload) == len(payload)
    assert session.files.read("blobs/big.bin") == payload
    assert session.files.stat("blobs/big.bin")["size"] == len(payload)
    with pytest.raises(FileOperationError) as limited:
        session.files.read("blobs/big.bin", max_bytes=1024)
    assert limited.value.ename == "FileTooLarge"
    assert session.files.write("empty", b"") == 0 and session.files.read("empty") == b""


def test_file_errors_carry_the_os_reason(session: Session) -> None:
    with pytest.raises(FileOperationError) as missing:
        session.files.read("nope.txt")
    assert (missing.value.ename, missing.value.errno) == ("FileNotFoundError", 2)
    assert "nope.txt" in str(missing.value)
    session.files.write("dir/x", "x")
    with pytest.raises(FileOperationError) as directory:
        session.files.read("dir")
    assert directory.value.ename == "IsADirectoryError"
    with pytest.raises(FileOperationError) as outside:
        session.files.read("/etc/hostname")
    assert outside.value.ename == "WorkspaceError"
