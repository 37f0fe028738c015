"""An interactive test: the problem's interactor and the submission in one box, each one's
stdout the other's stdin (two pipes, nothing between them), each with its own limits.

The interactor runs as the box's judge uid (``checking``): the submission can neither signal
nor trace it, nor read its memory or fds. The submission starts from the item's starter (its
peak read at its ``exit_group``; a starter that fails has the test run again without it). The
runner watches both: the submission's CPU, memory and the test's wall time (idleness ends at
the wall as TLE); the interactor's own, more generous limits. What a side leaves running when
it ends is killed (the other then sees end of file, never a hang). The verdict follows Kattis'
and DOMjudge's rule (``verdict``). docs/design/judge.md.
"""

from __future__ import annotations

import base64
import contextlib
import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..judge import protocols
from ..wire.protocol import JudgeSpec, JudgeTest, JudgeTestOutcome, Verdict
from . import checking, exit_peaks, spawning, testrun, uids
from . import starter as starters
from .box_protocol import BoxInfo
from .starter import Starter, StarterFailed
from .trees import exiting, kill_tree, tree

INTERACTOR_EVERY = (
    4  # the interactor's tree is sampled every 4th look (20 ms), the submission's at each
)
GRACE_S = 2.0  # an interactor's time to end after the submission did (at least)
RunVerdict = Callable[[testrun.Measured, testrun.Limits], tuple[Verdict, str]]


@dataclass
class Side:
    """One of the two processes as the runner watches it."""

    pid: int
    limits: testrun.Limits
    pidfd: int
    peak: int = 0
    status: int | None = None
    usage: Any = None
    ended_at: float = 0.0
    killed: str | None = None
    ending: bool = False  # (the submission) already ending when the interactor ended
    inherited: int = 0  # the runner's resident kB when it spawned this side (testrun.own_peak_kb)
    starter: Starter | None = None  # what started it (the submission's), which reaps it
    exited: bool = False  # its own exit_group was seen (exit_peaks): it has begun to end

    def end(self, now: float) -> None:
        if self.starter is not None:
            self.status, self.usage = self.starter.reap(self.pid)
        else:
            _, self.status, self.usage = os.wait4(self.pid, 0)
        self.ended_at = now

    def answer_exits(self) -> None:
        """Let every ``exit_group`` waiting on its starter's listener go on, taking the peak
        of its own (the exits of what it started are let go unread)."""
        exits = self.starter.exits if self.starter is not None else None
        peak = exit_peaks.answer_waiting(exits, self.pid) if exits is not None else None
        if peak is not None:
            self.peak, self.exited = max(self.peak, peak), True


@dataclass
class Interaction:
    """What an interactive test did: the submission's run, what the interactor said (or why
    it failed), and whether it ended first."""

    run: testrun.Measured
    said: protocols.Said
    interactor_first: bool
    tout: bytes  # the interactor's report (testlib's output file): a checker's "output"


def _kill_others(me: int, keep: int) -> None:
    """Kill every process below the runner except ``keep``'s tree and the item's starter:
    what a side that ended left behind (its orphans came back to the runner, a subreaper)
    holding a pipe open."""
    kept = tree(keep) if keep else set()
    for pid in tree(me) - {me} - kept - starters.live():
        kill_tree(pid)


def _watch(
    sub: Side, inter: Side, started: float, wall_s: float, decided: Callable[[], bool]
) -> None:
    """Wait for both sides within ``wall_s``, sampling each one's tree against its limits."""
    me = os.getpid()
    poller = select.poll()
    poller.register(sub.pidfd, select.POLLIN)
    poller.register(inter.pidfd, select.POLLIN)
    exits = sub.starter.exits if sub.starter is not None else None
    if exits is not None:  # an exit_group of the submission (or its children) waits on it
        poller.register(exits, select.POLLIN)
    alive = {sub.pidfd: sub, inter.pidfd: inter}
    rounds = 0
    while alive:
        now = time.monotonic()
        deadline = started + wall_s
        if sub.pidfd not in alive:  # the interactor's last words are not cut short
            deadline = max(deadline, sub.ended_at + GRACE_S)
        left = deadline - now
        if left <= 0:
            for side in alive.values():
                side.killed = "wall"
                kill_tree(side.pid)
                side.end(now)
            return
        ready = poller.poll(min(testrun.POLL_S, left) * 1000)
        sub.answer_exits()  # first: an exit waiting is the submission's end, whatever came too
        for fd, events in ready:
            if fd == exits:
                if events & (select.POLLHUP | select.POLLERR):  # no process left under it
                    poller.unregister(fd)
                continue
            side = alive.pop(fd)
            poller.unregister(fd)
            side.end(time.monotonic())
            _kill_others(me, keep=next((s.pid for s in alive.values()), 0))
            if side is inter and sub.pidfd in alive:
                interactor_ended(sub, decided)
        rounds += 1
        for side in list(alive.values()):
            if side is inter and rounds % INTERACTOR_EVERY:
                continue  # the problem's own program: its generous limits, looked at less often
            rss, cpu = testrun.tree_usage(side.pid)
            side.peak = max(side.peak, rss)
            over = "memory" if side.peak > side.limits.memory_kb else None
            over = over or ("cpu" if cpu > side.limits.cpu_s else None)
            if over is not None and side.killed is None:
                side.killed = over
                kill_tree(side.pid)


def interactor_ended(sub: Side, decided: Callable[[], bool]) -> None:
    """The interactor ended while the submission's pidfd had not said so. The submission may
    already be ending (stopped by the runner for its limits, or exiting: its pipes close
    before its pidfd is ready, and the interactor may be reaped first, answering its end of
    file): then it ended first. Else, if the interactor said WA (or failed), it is killed:
    the verdict is decided, no need to wait."""
    sub.answer_exits()  # one that called exit_group waits there: it is ending
    sub.ending = sub.killed is not None or sub.exited or exiting(sub.pid)
    if not sub.ending and decided():
        sub.killed = "decided"
        kill_tree(sub.pid)


def ended_first(inter: Side, sub: Side) -> bool:
    """Whether the interactor ended first, on its own (Kattis' and DOMjudge's "exited first")."""
    return inter.ended_at < sub.ended_at and inter.killed is None and not sub.ending


def interact(
    programs: checking.Programs,
    argv: list[str],
    box: BoxInfo,
    isolation: str,
    limits: testrun.Limits,
    test_input: bytes,
    answer: bytes,
    starter: Starter | None = None,
) -> Interaction:
    """Run the submission (``argv``) against the interactor on one test, started by
    ``starter`` when there is one (``StarterFailed`` when it fails: the caller sweeps and
    runs the test again without it)."""
    program = programs.found["interactor"]
    kattis = program.protocol == "kattis"
    inputs = [checking.memfd("input", test_input), checking.memfd("answer", answer)]
    tout = os.memfd_create("tout", os.MFD_CLOEXEC)
    errs = [os.memfd_create(name, os.MFD_CLOEXEC) for name in ("sub-stderr", "int-stderr")]
    to_sub_r, to_sub_w = os.pipe()  # interactor -> submission
    to_int_r, to_int_w = os.pipe()  # submission -> interactor
    pipes = [to_sub_r, to_sub_w, to_int_r, to_int_w]
    sides: list[Side] = []
    try:
        with contextlib.ExitStack() as stack:
            feedback = stack.enter_context(programs.feedback_dir()) if kattis else ""
            if kattis:
                args = [checking.fd_path(inputs[0]), checking.fd_path(inputs[1]), feedback]
            else:
                args = [checking.fd_path(fd) for fd in (inputs[0], tout, inputs[1])]
            started = time.monotonic()
            if isolation == "namespaces" and spawning.nobody_runs_as(programs.judge["uid"]):
                with programs.inside(program):
                    ipid = spawning.spawn_as(
                        [*program.argv, *args],
                        programs.ids(programs.judge),
                        uids.program_env(programs.judge),
                        stdin=to_int_r,
                        stdout=to_sub_w,
                        stderr=errs[1],
                        keep=(*inputs, tout),
                        default_signals=False,  # SIGPIPE ignored: a closed pipe is WA to say
                    )
            else:
                ipid = programs.spawn(
                    program,
                    args,
                    stdin=to_int_r,
                    stdout=to_sub_w,
                    stderr=errs[1],
                    pass_fds=(*inputs, tout),
                )
            inter = Side(ipid, programs.limits(limits), os.pidfd_open(ipid))
            sides.append(inter)
            inherited = testrun.resident_kb()  # what the submission starts with
            try:  # never spawning.spawn_as: the submission could signal the runner at its start
                if starter is not None:
                    spid, inherited = starter.start(argv, to_sub_r, to_int_w, errs[0])
                else:
                    spid = testrun.spawn(
                        argv, box, isolation, stdin_fd=to_sub_r, out_fd=to_int_w, err_fd=errs[0]
                    )
            except OSError as exc:
                kill_tree(ipid)
                inter.end(time.monotonic())
                failed = testrun.Measured(
                    127, None, 0.0, 0.0, 0, None, b"", f"farm: {exc}".encode(), 0
                )
                return Interaction(failed, protocols.Said("AC", 0.0, ""), False, b"")
            sub = Side(spid, limits, os.pidfd_open(spid), inherited=inherited, starter=starter)
            sub.peak = testrun.resident_kb(spid)  # one that ends before the first sample shows
            sides.append(sub)
            for fd in pipes:  # only the two sides hold them now: end of file when one ends
                os.close(fd)
            pipes.clear()

            def decided() -> bool:
                said = _said(programs, program, inter, errs[1], feedback)
                return said.verdict in ("WA", "IE")

            _watch(sub, inter, started, limits.wall_s, decided)
            testrun.sweep_leftovers()
            said = _said(programs, program, inter, errs[1], feedback)
            if inter.killed == "wall" and sub.killed is None:
                why = f"the interactor did not end within {GRACE_S:g} s after the submission did"
                said = protocols.Said("IE", 0.0, why)
        run = _measured(sub, started, errs[0])
        report, _ = testrun.read_all(tout, limits.output_bytes)
        return Interaction(run, said, ended_first(inter, sub), report)
    finally:
        for side in sides:
            os.close(side.pidfd)
        for fd in (*inputs, tout, *errs, *pipes):
            os.close(fd)


def _said(
    programs: checking.Programs, program: checking.Program, inter: Side, err: int, feedback: str
) -> protocols.Said:
    """What the interactor said (once it ended), or why it failed."""
    if inter.killed in ("cpu", "memory"):
        return protocols.Said(
            "IE", 0.0, f"the interactor was stopped: over its {inter.killed} limit"
        )
    if inter.killed == "wall":
        return protocols.Said("AC", 0.0, "")  # idle with the submission: the submission's TLE
    assert inter.status is not None
    stderr, _ = testrun.read_all(err, protocols.MESSAGE_BYTES)
    return checking.ended(
        programs,
        program,
        inter.status,
        stderr.decode(errors="replace"),
        feedback if program.protocol == "kattis" else "",
    )


def _measured(sub: Side, started: float, err: int) -> testrun.Measured:
    assert sub.status is not None
    stderr, _ = testrun.read_all(err, 4096)
    status = sub.status
    killed = sub.killed if sub.killed != "decided" else None
    return testrun.Measured(
        exit_code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) and sub.killed != "decided" else None,
        cpu_s=sub.usage.ru_utime + sub.usage.ru_stime,
        wall_s=sub.ended_at - started,
        memory_kb=max(testrun.own_peak_kb(int(sub.usage.ru_maxrss), sub.inherited), sub.peak),
        killed=killed,
        stdout=b"",
        stderr=stderr,
        output_bytes=0,
    )


def test(
    index: int,
    test: JudgeTest,
    data: bytes,
    spec: JudgeSpec,
    argv: list[str],
    box: BoxInfo,
    isolation: str,
    limits: testrun.Limits,
    programs: checking.Programs,
    run_verdict: RunVerdict,
    starter: Starter | None = None,
) -> JudgeTestOutcome:
    """One interactive test as the runner reports it; with a checker program too (testlib),
    the checker reads the interactor's report as the output once the interaction passed.
    The submission starts from ``starter`` while it is alive; one that fails (the submission
    may kill it) has the test thrown away and run again without it."""
    answer = base64.b64decode(test.get("expected") or "")
    try:
        live = starter if starter is not None and starter.alive else None
        done = interact(programs, argv, box, isolation, limits, data, answer, live)
    except StarterFailed:
        testrun.sweep_leftovers()  # the interactor, and what the submission left
        done = interact(programs, argv, box, isolation, limits, data, answer)
    said, message, points = verdict(done, limits, run_verdict)
    if said == "AC" and "checker_program" in programs.found:
        checked = checking.run_checker(programs, data, done.tout, answer, limits)
        said, message, points = checked.verdict, checked.message, checked.points
    run = done.run
    result: JudgeTestOutcome = {
        "index": index,
        "verdict": said,
        "message": message,
        "time_s": round(run.cpu_s, 4),
        "wall_s": round(run.wall_s, 4),
        "memory_kb": run.memory_kb,
        "output_bytes": 0,
        "exit_code": run.exit_code,
        "signal": run.signal,
        "stderr": run.stderr.decode(errors="replace"),
        "points": points,
    }
    if spec.get("keep_outputs"):
        result["output"] = base64.b64encode(done.tout).decode("ascii")
    return result


def verdict(
    done: Interaction, limits: testrun.Limits, run_verdict: RunVerdict
) -> tuple[Verdict, str, float]:
    """The test's verdict, as Kattis' problemtools and DOMjudge decide it: the interactor's
    failure first (``IE``, the problem's); then its WA when it ended first (a submission
    that then died of SIGPIPE or waited for nothing is still WA); then the submission's own
    end (TLE, MLE, RE; a wall kill is idleness); then what the interactor said."""
    said = done.said
    if said.verdict == "IE":
        return "IE", said.message, 0.0
    if said.verdict == "WA" and done.interactor_first:
        return "WA", said.message, said.points
    run_said, why = run_verdict(done.run, limits)
    if run_said != "AC":
        if done.run.killed == "wall" and done.run.cpu_s < limits.cpu_s:
            why = f"idleness limit exceeded: {why}, {done.run.cpu_s:.3f} s of CPU (waiting?)"
        return run_said, why, 0.0
    return ("AC" if said.verdict == "AC" else "WA"), said.message, said.points
