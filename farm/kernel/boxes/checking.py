"""A problem's own programs in a judge's box: its checker and its interactor.

They run as the box's *judge uid* (``judge_uid``: the box's uid shifted past every box uid
farm hands out), never as the box's uid: a submission can then neither signal, trace nor
read them, nor reach their files. Each is compiled once per problem (or restored from the
worker's cache, ``artifact``) in a directory of that uid (mode 0700, made in the sticky
``/tmp`` with a random name before any of the submission runs), and reads its input, the
submission's output and the answer from memfds of the runner's (``/proc/self/fd/N``): no
path a submission could have planted or replaced. Why: docs/design/judge.md, "Checkers and
interactors".
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..judge import entries, protocols
from ..judge.language_table import TABLE
from ..wire.protocol import CompileOutcome, JudgeOutcome, JudgeProgram, JudgeSpec
from . import testrun, uids
from .box_protocol import BoxInfo

JUDGE_UID_SHIFT = 1 << 22  # past every box uid (docker: 4000 blocks of 1024 from 100000)
INCLUDE_DIR = os.path.join(os.path.dirname(TABLE), "include")  # testlib.h
ROLES = ("checker_program", "interactor")
NAMES = {"checker_program": "checker", "interactor": "interactor"}
EXTRA_CPU_S = 5.0  # a program's CPU time: the test's and this
MIN_MEMORY_KB = 1 << 20  # and at least 1 GB of memory
COMPILE_S = 60.0  # a program's compile CPU time, at least (g++ -O2 on testlib.h: seconds)
FEEDBACK_BYTES = 64 * 1024

Compile = Callable[..., tuple[CompileOutcome, "dict[str, str] | None"]]


def judge_uid(box: BoxInfo, isolation: str) -> int:
    """The uid a box's checker and interactor run as: another box's never, its own never
    (with ``dirs`` isolation there are no uids: the box's own)."""
    return box["uid"] if isolation == "dirs" else box["uid"] + JUDGE_UID_SHIFT


@dataclass
class Program:
    role: str
    protocol: str
    argv: list[str]  # its run command, its arguments to be appended
    build: str  # its directory (the judge uid's): where it runs


@dataclass
class Programs:
    """The compiled checker and interactor of an item, and their identity (``judge``: a box
    as ``testrun`` takes one, with the judge uid and the programs' directory)."""

    judge: BoxInfo
    isolation: str
    root: str
    home: str  # the submission's build directory: the runner's working directory for tests
    box: BoxInfo
    found: dict[str, Program] = field(default_factory=dict)
    inputs: dict[int, bytes] = field(default_factory=dict)  # tests' stdin files, as they were
    artifacts: dict[str, dict[str, str]] = field(default_factory=dict)
    compiles: dict[str, CompileOutcome] = field(default_factory=dict)

    @contextlib.contextmanager
    def inside(self, program: Program) -> Iterator[None]:
        """For a block: the runner's working directory is ``program``'s (entered as the judge
        uid: root here has no ``CAP_DAC_OVERRIDE``), then the submission's again."""
        with testrun.as_box(self.judge, self.isolation):
            os.chdir(program.build)
        try:
            yield
        finally:
            with testrun.as_box(self.box, self.isolation):
                os.chdir(self.home)

    def spawn(
        self,
        program: Program,
        args: list[str],
        *,
        stdin: int | None,
        stdout: int,
        stderr: int,
        pass_fds: tuple[int, ...],
    ) -> int:
        """Start ``program`` with ``args`` as the judge uid, in a session of its own, with
        ``pass_fds`` (the memfds its arguments name) and SIGPIPE ignored (a submission that
        closed its end makes an interactor's write fail, not kill it: it then says WA)."""
        ids: dict[str, Any] = {}
        if self.isolation != "dirs":
            ids = {"user": self.judge["uid"], "group": self.judge["gid"], "extra_groups": []}
        with self.inside(program):
            proc = subprocess.Popen(
                [*program.argv, *args],
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                pass_fds=pass_fds,
                env=uids.program_env(self.judge),
                start_new_session=True,
                restore_signals=False,  # the runner's SIGPIPE and SIGXFSZ: ignored
                umask=0o077,
                **ids,
            )
        proc.returncode = 0  # waited for with wait4 by the runner
        return proc.pid

    def ids(self, who: BoxInfo) -> tuple[int, int] | None:
        """``who``'s uid and gid to start a program as (``None`` with ``dirs``: no uids)."""
        return None if self.isolation == "dirs" else (who["uid"], who["gid"])

    def limits(self, test: testrun.Limits) -> testrun.Limits:
        """A program's limits beside a test's: generous, bounded."""
        cpu = test.cpu_s + EXTRA_CPU_S
        return testrun.Limits(
            cpu_s=cpu,
            wall_s=max(test.wall_s, cpu * 2),
            memory_kb=max(test.memory_kb, MIN_MEMORY_KB),
            output_bytes=test.output_bytes,
            stack_bytes=test.stack_bytes,
        )

    @property
    def feedback(self) -> str:
        return os.path.join(self.root, "feedback")

    @contextlib.contextmanager
    def feedback_dir(self) -> Iterator[str]:
        """The judge uid's directory for a Kattis validator's feedback (made with the
        programs), empty, and emptied again after the block."""
        try:
            yield self.feedback
        finally:
            with testrun.as_box(self.judge, self.isolation):
                for name in os.listdir(self.feedback):
                    path = os.path.join(self.feedback, name)
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        os.unlink(path)

    def read_feedback(self, path: str, name: str) -> str | None:
        """A file the validator wrote in its feedback directory, read as the judge uid and
        following no link; ``None`` when it wrote none."""
        with testrun.as_box(self.judge, self.isolation):
            try:
                fd = os.open(os.path.join(path, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                return None
            with os.fdopen(fd, "rb") as f:
                return f.read(FEEDBACK_BYTES).decode(errors="replace")

    def close(self) -> None:
        """Remove the programs' directory (as the judge uid, which owns all of it)."""
        with testrun.as_box(self.judge, self.isolation):
            shutil.rmtree(self.root, ignore_errors=True)


def memfd(name: str, data: bytes) -> int:
    """A memfd holding ``data``, read from its start (inherited only through ``pass_fds``)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def fd_path(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def prepare(
    spec: JudgeSpec,
    table: dict[str, dict[str, Any]],
    box: BoxInfo,
    isolation: str,
    home: str,
    compile_program: Compile,
) -> Programs | JudgeOutcome:
    """Compile (or restore) the item's checker and interactor as the judge uid, and read the
    tests' input files, before anything of the submission's (its compile too: a build that
    fills the box's disk) ran; ``home`` is the submission's build directory, to be.
    A program that does not compile, or in a language the image lacks, is the problem's
    failure: an ``IE`` of kind ``input``."""
    uid = judge_uid(box, isolation)
    token = secrets.token_hex(8)
    if isolation == "namespaces":  # the box's own /tmp
        root = os.path.join(box["tmp"], f".judge-{token}")
    elif isolation == "uids":  # the sandbox's /tmp (the box's own is its uid's, 0700)
        root = os.path.join(os.path.dirname(box["tmp"]), f"box-{box['number']}-judge-{token}")
    else:
        root = os.path.join(box["tmp"], f".judge-{token}")
    env = {**(box.get("env") or {}), "CPATH": INCLUDE_DIR}
    judge: BoxInfo = {**box, "uid": uid, "gid": uid, "workspace": root, "tmp": root, "env": env}
    programs = Programs(judge=judge, isolation=isolation, root=root, home=home, box=box)
    with testrun.as_box(judge, isolation):
        os.mkdir(root, 0o700)
    with testrun.as_box(box, isolation):  # read before any test ran: none could change them
        for index, test in enumerate(spec["tests"]):
            if test.get("stdin_path"):
                path = os.path.join(box["workspace"], test["stdin_path"])
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as f:
                    programs.inputs[index] = f.read()
    try:
        for role in ROLES:
            given: JudgeProgram | None = spec.get(role)  # type: ignore[assignment]
            if given is not None:
                refused = _build(programs, role, given, spec, table, compile_program)
                if refused is not None:
                    programs.close()
                    return refused
        if any(p.protocol == "kattis" for p in programs.found.values()):
            with testrun.as_box(judge, isolation):  # made now: no inode is needed later
                os.mkdir(programs.feedback, 0o700)
    finally:
        with testrun.as_box(box, isolation):
            os.chdir(box["workspace"])
    return programs


def reported(result: JudgeOutcome, programs: Programs | None) -> JudgeOutcome:
    """``result`` with the programs' compiles and fresh builds (for the worker's cache)."""
    if programs is not None:
        result["program_compiles"] = programs.compiles
        if programs.artifacts:
            result["program_artifacts"] = programs.artifacts
    return result


def _refused(why: str) -> JudgeOutcome:
    refused: JudgeOutcome = {"verdict": "IE", "message": why, "tests": [], "compile": None}
    refused["kind"] = "input"
    return refused


def _build(
    programs: Programs,
    role: str,
    given: JudgeProgram,
    spec: JudgeSpec,
    table: dict[str, dict[str, Any]],
    compile_program: Compile,
) -> JudgeOutcome | None:
    name = NAMES[role]
    language = table.get(given["language"])
    if language is None:
        return _refused(f"the {name}'s language {given['language']!r} is not in this image")
    try:
        entry = entries.find(language.get("entry"), given["source"], language["file"])
    except entries.EntryError as exc:
        return _refused(f"the {name} did not compile: {exc}")
    build = os.path.join(programs.root, name)
    with testrun.as_box(programs.judge, programs.isolation):
        os.mkdir(build, 0o700)
    seconds = max(float(spec.get("compile_time_s") or COMPILE_S), COMPILE_S)
    as_spec: JudgeSpec = {
        **spec,
        "source": given["source"],
        "artifact": given.get("artifact"),
        "compile_time_s": seconds,
    }
    compiled, artifact = compile_program(
        as_spec, language, entry, programs.judge, programs.isolation, build
    )
    programs.compiles[name] = compiled
    if compiled["status"] == "error":
        return _refused(f"the {name} did not compile:\n{compiled['output']}")
    if artifact is not None:
        programs.artifacts[name] = artifact
    argv = []
    for arg in language["run"]:
        for key, value in {"file": entry.file, "main": entry.main}.items():
            arg = arg.replace("{" + key + "}", value)
        argv.append(arg.replace("{memory_mb}", str(MIN_MEMORY_KB >> 10)))
    programs.found[role] = Program(role=role, protocol=given["protocol"], argv=argv, build=build)
    return None


def run_checker(
    programs: Programs,
    test_input: bytes,
    output: bytes,
    answer: bytes,
    test_limits: testrun.Limits,
) -> protocols.Said:
    """The checker's verdict on ``output``: testlib's ``checker input output answer``, or a
    Kattis validator's ``validator input answer feedback_dir < output``. The submission's
    processes are all gone by now (``testrun`` killed and reaped its tree)."""
    program = programs.found["checker_program"]
    limits = programs.limits(test_limits)
    fds = [memfd("input", test_input), memfd("output", output), memfd("answer", answer)]
    err = os.memfd_create("checker-stderr", os.MFD_CLOEXEC)
    out = os.memfd_create("checker-stdout", os.MFD_CLOEXEC)
    try:
        with contextlib.ExitStack() as stack:
            feedback = ""
            if program.protocol == "kattis":
                feedback = stack.enter_context(programs.feedback_dir())
                args = [fd_path(fds[0]), fd_path(fds[2]), feedback]
                stdin: int | None = fds[1]
            else:
                args = [fd_path(fd) for fd in fds]
                stdin = None
            started = time.monotonic()
            pid = programs.spawn(
                program, args, stdin=stdin, stdout=out, stderr=err, pass_fds=tuple(fds)
            )
            status, _, _, _, killed = testrun.wait(pid, limits, started)
            testrun.sweep_leftovers()
            if killed is not None:
                return protocols.Said(
                    "IE", 0.0, f"the checker was stopped: over its {killed} limit"
                )
            stderr, _ = testrun.read_all(err, protocols.MESSAGE_BYTES)
            return ended(programs, program, status, stderr.decode(errors="replace"), feedback)
    finally:
        for fd in (*fds, err, out):
            os.close(fd)


def ended(
    programs: Programs, program: Program, status: int, stderr: str, feedback: str
) -> protocols.Said:
    """What ``program`` said, from its wait status, stderr and feedback directory."""
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    died = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    message, score = "", None
    if feedback:
        message = programs.read_feedback(feedback, "judgemessage.txt") or ""
        score = programs.read_feedback(feedback, "score.txt")
    return protocols.said(program.protocol, code, died, stderr, message, score, NAMES[program.role])
