"""The supervisor's side of a box's pid 1 (``Link``), fed real datagrams and real pidfds: a
process reported with a pidfd that has ended before the supervisor reads it is still a process
that ran (its exit is on its way), never a failed fork."""

from __future__ import annotations

import asyncio
import json
import os
import socket

from farm.kernel.supervisor.links import GONE, Link


def test_a_process_that_ended_before_it_was_read_is_held_by_a_pid_no_signal_reaches() -> None:
    async def scenario() -> tuple[int, int]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        link = Link(ours, in_box=True)
        child = os.fork()
        if child == 0:
            os._exit(0)
        pidfd = os.pidfd_open(child)
        os.waitpid(child, 0)  # reaped: its pidfd's fdinfo says Pid: -1
        spawned: asyncio.Future[tuple[int, int, list[int]]] = (
            asyncio.get_running_loop().create_future()
        )
        link.pending.append(spawned)
        out_r, out_w = os.pipe()
        message = json.dumps({"op": "spawned", "pid": 7}).encode()
        socket.send_fds(theirs, [message], [out_r, pidfd])
        for fd in (out_r, pidfd):
            os.close(fd)
        assert link.receive()
        key, pid, fds = await asyncio.wait_for(spawned, 5)
        for fd in fds:
            os.close(fd)
        os.close(out_w)
        link.close()
        theirs.close()
        return key, pid

    key, pid = asyncio.run(scenario())
    assert key == 7 and pid == GONE
    assert GONE > 1 << 22  # beyond PID_MAX_LIMIT: kill(GONE, ...) finds no process
