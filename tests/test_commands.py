"""``session.exec`` and ``session.files`` against a real Redis and a real Celery worker in this
process (process backend): commands beside the REPL, files of any size. The docker versions
(isolation of commands and files between boxes) are in ``test_cotenancy.py``."""

from __future__ import annotations

import threading

import pytest

from farm.client import Farm, Session
from farm.errors import FileOperationError
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


def test_a_timeout_kills_the_whole_group_and_the_session_lives(session: Session) -> None:
    result = session.exec("sleep 30 & echo $$ $!; sleep 30", timeout_s=1)
    assert result.timed_out and result.kind == "timeout"
    shell, child = (int(pid) for pid in result.stdout.split())
    assert wait_for(lambda: not _alive(shell) and not _alive(child), 10)  # the tree, not one
    assert session.run("1 + 1").value is not None


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
    gone = lambda: not _alive(pid)  # noqa: E731 - the session closed: its box is reset
    assert wait_for(gone, 10)


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


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
