"""The judge's runner: compile a submission once, run it on each test, give verdicts.

Forked by a box's init for an item's ``judge`` step (``zygote``), it stays root in the box
(untouchable by the box's uid: no signal, no trace, no look at its fds) and starts every
compile and test as the box's uid (``testrun``), so that a submission can neither forge its
verdict nor see another test's data. It writes one JSON object (``protocol.JudgeOutcome``)
on stdout. Verdict order per test: output size, memory kill, wall or CPU time, peak memory,
non-zero exit or signal, then the checker. A problem's own checker or interactor is compiled
first and run as the box's judge uid (``checking``, ``interaction``). Why: docs/design/judge.md.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import stat
from typing import Any

from ..judge import checkers, entries, language_table
from ..wire.protocol import (
    CompileOutcome,
    JudgeOutcome,
    JudgeSpec,
    JudgeTest,
    JudgeTestOutcome,
    Verdict,
)
from . import checking, interaction, pycheck, testrun
from .box_protocol import BoxInfo
from .starter import Starter

BUILD_DIR = ".judge"
COMPILE_OUTPUT_BYTES = 8 << 20  # a compiler's messages past this: a flood, killed
MESSAGE_HEAD = 8 * 1024  # of each of a compile's outputs, the first bytes kept
MESSAGE_TAIL = 4 * 1024  # and the last, with how many were cut between them
ARTIFACT_BYTES = 32 << 20
OUTPUTS_BYTES = 8 << 20  # the outputs returned (special judge, keep_outputs), all tests
STACK_BYTES = 256 << 20


def outcome(
    verdict: Verdict,
    message: str = "",
    *,
    tests: list[JudgeTestOutcome] | None = None,
    compile: CompileOutcome | None = None,
) -> JudgeOutcome:
    return {"verdict": verdict, "message": message, "tests": tests or [], "compile": compile}


def _named(result: JudgeOutcome, language: tuple[str, str]) -> JudgeOutcome:
    """``result`` with the language it was judged in: its name and the toolchain's words."""
    result["language"], result["version"] = language
    return result


def judge(spec: JudgeSpec, box: BoxInfo, isolation: str) -> JudgeOutcome:
    """Judge ``spec`` (``protocol.JudgeSpec``) in ``box``: the outcome to send back."""
    table = language_table.load()
    language = table.get(spec["language"])
    if language is None:
        known = ", ".join(sorted(table)) or "none: build a judge image"
        why = f"this image judges no {spec['language']!r} (it judges: {known})"
        refused = outcome("IE", why)
        refused["kind"] = "input"
        return refused
    named = (spec["language"], language.get("version_text", ""))
    if spec.get("compile_options") and not language.get("compile"):
        refused = outcome("IE", f"{spec['language']} has no compile step for compile options")
        refused["kind"] = "input"
        return _named(refused, named)
    try:
        entry = entries.find(language.get("entry"), spec["source"], language["file"])
    except entries.EntryError as exc:
        return _named(outcome("CE", str(exc), compile=_failed(str(exc))), named)
    build = os.path.join(box["workspace"], BUILD_DIR)
    programs = None  # the problem's checker and interactor: first, as the judge uid
    if spec.get("checker_program") or spec.get("interactor"):
        prepared = checking.prepare(spec, table, box, isolation, build, _compile)
        if not isinstance(prepared, checking.Programs):
            return _named(prepared, named)
        programs = prepared
    try:
        compiled, artifact = _compile(spec, language, entry, box, isolation, build)
        if compiled["status"] == "error":
            return _named(outcome("CE", compiled["output"], compile=compiled), named)
        return _named(
            _tests(spec, language, entry, box, isolation, compiled, programs, artifact), named
        )
    finally:
        if programs is not None:
            programs.close()


def _tests(
    spec: JudgeSpec,
    language: dict[str, Any],
    entry: entries.Entry,
    box: BoxInfo,
    isolation: str,
    compiled: CompileOutcome,
    programs: checking.Programs | None,
    artifact: dict[str, str] | None,
) -> JudgeOutcome:
    """Each test of the compiled submission, and the item's verdict."""
    memory_mb = int(spec["memory_mb"])
    run_argv = _filled(language["run"], entry, memory_mb=str(memory_mb))
    run_argv += spec.get("run_args") or []
    limits = testrun.Limits(
        cpu_s=float(spec["time_s"]),
        wall_s=float(spec.get("wall_s") or default_wall_s(float(spec["time_s"]))),
        memory_kb=memory_mb * 1024,
        output_bytes=int(spec["output_mb"]) << 20,
        stack_bytes=min(STACK_BYTES, memory_mb << 20),
        out_of_memory=tuple(words.encode() for words in language.get("out_of_memory") or ()),
    )
    testrun.confine(box, limits)  # the runner's limits are the tests' from here on
    starter = None
    if isolation != "dirs":  # "dirs": no uid to change, subprocess uses vfork already
        starter = Starter(box)  # its tests' peaks read at their exit_group (exit_peaks)
    try:
        return _each(spec, run_argv, box, isolation, limits, compiled, programs, artifact, starter)
    finally:
        if starter is not None:
            starter.close()


def _each(
    spec: JudgeSpec,
    run_argv: list[str],
    box: BoxInfo,
    isolation: str,
    limits: testrun.Limits,
    compiled: CompileOutcome,
    programs: checking.Programs | None,
    artifact: dict[str, str] | None,
    starter: Starter | None,
) -> JudgeOutcome:
    results: list[JudgeTestOutcome] = []
    kept = 0
    verdict: Verdict = "AC"
    for index, test in enumerate(spec["tests"]):
        result = _test(index, test, spec, run_argv, box, isolation, limits, programs, starter)
        kept += len(result.get("output", ""))
        if kept > OUTPUTS_BYTES or result["verdict"] == "IE":  # IE: the problem's program failed
            why = f"the outputs to return are over {OUTPUTS_BYTES >> 20} MB"
            refused = outcome("IE", why if kept > OUTPUTS_BYTES else result["message"])
            refused["kind"] = "input"
            return checking.reported(refused, programs)
        results.append(result)
        if result["verdict"] not in ("AC", "PENDING") and verdict == "AC":
            verdict = result["verdict"]
            if not spec.get("all_tests"):
                break
    if verdict == "AC" and any(r["verdict"] == "PENDING" for r in results):
        verdict = "PENDING"  # the special judge decides
    judged = outcome(verdict, "", tests=results, compile=compiled)
    judged["artifact"] = artifact
    return checking.reported(judged, programs)


def _filled(argv: list[str], entry: entries.Entry, **more: str) -> list[str]:
    """``argv`` of the table with ``{file}``, ``{main}`` (``entry``'s) and ``more`` filled."""
    values = {"file": entry.file, "main": entry.main, **more}
    filled = []
    for arg in argv:
        for name, value in values.items():
            arg = arg.replace("{" + name + "}", value)
        filled.append(arg)
    return filled


def _optioned(argv: list[str], options: list[str], source: str) -> list[str]:
    """``argv`` with ``options`` at its ``{options}`` word, else before the source's name (its
    first word naming the source file), else at its end."""
    if "{options}" in argv:
        at = argv.index("{options}")
        return argv[:at] + options + argv[at + 1 :]
    at = argv.index(source) if source in argv else len(argv)
    return argv[:at] + options + argv[at:]


def _failed(why: str, done: testrun.Measured | None = None) -> CompileOutcome:
    """A compile that failed, with why and what the compiler said."""
    said = (done.stdout + done.stderr).decode(errors="replace") if done is not None else ""
    return {
        "status": "error",
        "output": f"{why}\n{said}" if why and said else why or said or "failed",
        "time_s": done.cpu_s if done is not None else 0.0,
        "wall_s": done.wall_s if done is not None else 0.0,
        "cached": False,
    }


def _stopped(killed: str, limits: testrun.Limits) -> str:
    """Why the runner stopped a compile: a verdict's words, never a failure of the runner."""
    return {
        "wall": f"the compilation took over {limits.wall_s:g} s of wall time",
        "cpu": f"the compilation took over {limits.cpu_s:g} s of CPU time",
        "memory": f"the compiler used over {limits.memory_kb // 1024} MB of memory",
        "output": f"the compiler wrote over {limits.output_bytes >> 20} MB of messages",
    }.get(killed, f"the compiler was stopped ({killed})")


def _compile(
    spec: JudgeSpec,
    language: dict[str, Any],
    entry: entries.Entry,
    box: BoxInfo,
    isolation: str,
    build: str,
) -> tuple[CompileOutcome, dict[str, str] | None]:
    """Write the source (and a cached build) with the box's rights, compile unless cached:
    what the compile did, and its artifact (the build's files, for the worker's cache) when
    it ran. The runner's working directory is the build's from here on: the compiler's and
    the tests'. A compile killed (a flood of messages, a hang) is a compile error."""
    cached = spec.get("artifact")
    argv = _filled(language.get("compile") or [], entry)
    argv = _optioned(argv, spec.get("compile_options") or [], entry.file) if argv else argv
    with testrun.as_box(box, isolation):  # the box's files, made with its rights
        os.makedirs(build, mode=0o700, exist_ok=True)
        os.chdir(build)
        files = {entry.file: spec["source"].encode()}
        files.update({name: base64.b64decode(data) for name, data in (cached or {}).items()})
        for name, data in files.items():
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o700)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    seconds = float(spec.get("compile_time_s") or 30.0)
    limits = testrun.Limits(
        cpu_s=seconds,
        wall_s=seconds * 2 + 5.0,
        memory_kb=int(spec.get("compile_memory_mb") or 2048) * 1024,
        output_bytes=COMPILE_OUTPUT_BYTES,
        stack_bytes=STACK_BYTES,
    )
    compiled: CompileOutcome = {
        "status": "ok",
        "output": "",
        "time_s": 0.0,
        "wall_s": 0.0,
        "cached": cached is not None,
    }
    if not argv or cached is not None:
        return compiled, ({} if not argv else None)
    checked = pycheck.applies(argv, box)
    if checked is not None:  # Python's syntax check: a fork that parses, no Python start
        done = pycheck.run(
            checked, box, isolation, limits, keep=MESSAGE_HEAD, keep_tail=MESSAGE_TAIL
        )
    else:
        done = testrun.run(
            argv,
            box,
            isolation,
            limits,
            keep_stdout=MESSAGE_HEAD,
            keep_stderr=MESSAGE_HEAD,
            keep_tail=MESSAGE_TAIL,
            watch_output=True,
        )
    if done.killed is not None:
        return _failed(_stopped(done.killed, limits), done), None
    if done.signal is not None:
        return _failed(f"the compiler died of signal {done.signal}", done), None
    if done.exit_code != 0:
        return _failed("", done), None
    text = (done.stdout + done.stderr).decode(errors="replace")
    compiled["output"], compiled["time_s"], compiled["wall_s"] = text, done.cpu_s, done.wall_s
    with testrun.as_box(box, isolation):  # root here has no CAP_DAC_OVERRIDE
        return compiled, _artifact(build, entry.file)


def default_wall_s(time_s: float) -> float:
    """A test's wall limit unless given: 3x its CPU time, as DMOJ (a worker judges at most
    twice its CPUs' tests at once, so each has half a core), and at least 5 s more than
    it, for a runtime's start on a loaded worker. A program asleep past it is TLE."""
    return max(time_s * 3, time_s + 5.0)


def _artifact(build: str, source_name: str) -> dict[str, str] | None:
    """The files the compile made (regular files of the build directory, the source left
    out), base64; none when they would be too large to cache. Read with the box's rights,
    following no link (the directory and each file are opened with ``O_NOFOLLOW``)."""
    files: dict[str, str] = {}
    total = 0
    try:
        dir_fd = os.open(build, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        for name in os.listdir(dir_fd):
            if name == source_name:
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError:
                return None
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a directory (a Java package's)
                os.close(fd)
                return None
            with os.fdopen(fd, "rb") as f:
                data = f.read(ARTIFACT_BYTES + 1)
            total += len(data)
            if total > ARTIFACT_BYTES:
                return None
            files[name] = base64.b64encode(data).decode("ascii")
    finally:
        os.close(dir_fd)
    return files


def _test(
    index: int,
    test: JudgeTest,
    spec: JudgeSpec,
    argv: list[str],
    box: BoxInfo,
    isolation: str,
    limits: testrun.Limits,
    programs: checking.Programs | None = None,
    starter: Starter | None = None,
) -> JudgeTestOutcome:
    stdin_path = None
    if test.get("stdin_path"):
        stdin_path = os.path.join(box["workspace"], test["stdin_path"])
    data = base64.b64decode(test["stdin"]) if test.get("stdin") is not None else None
    if programs is not None:  # the input as it was before any test ran: the checker's too
        data, stdin_path = programs.inputs.get(index, data or b""), None
        if "interactor" in programs.found:
            return interaction.test(
                index, test, data, spec, argv, box, isolation, limits, programs, _verdict, starter
            )
    done = testrun.run(
        argv,
        box,
        isolation,
        limits,
        stdin_path=stdin_path,
        stdin_data=data if stdin_path is None else None,
        keep_stdout=limits.output_bytes,
        starter=starter,
    )
    result: JudgeTestOutcome = {
        "index": index,
        "time_s": round(done.cpu_s, 4),
        "wall_s": round(done.wall_s, 4),
        "memory_kb": done.memory_kb,
        "output_bytes": done.output_bytes,
        "exit_code": done.exit_code,
        "signal": done.signal,
        "stderr": done.stderr.decode(errors="replace"),
        "message": "",
    }
    verdict, message = _verdict(done, limits)
    if spec.get("keep_outputs") or spec["checker"] == "special":
        result["output"] = base64.b64encode(done.stdout).decode("ascii")
    if verdict == "AC":
        if spec["checker"] == "special":
            verdict = "PENDING"
        elif programs is not None:
            expected = base64.b64decode(test.get("expected") or "")
            said = checking.run_checker(programs, data or b"", done.stdout, expected, limits)
            verdict, message, result["points"] = said.verdict, said.message, said.points
        else:
            expected = base64.b64decode(test.get("expected") or "")
            passed, message = checkers.check(spec["checker"], expected, done.stdout)
            verdict = "AC" if passed else "WA"
    result["verdict"], result["message"] = verdict, message
    return result


def _verdict(done: testrun.Measured, limits: testrun.Limits) -> tuple[Verdict, str]:
    """The verdict of a run before its output is checked (``AC``: check it)."""
    if done.output_bytes >= limits.output_bytes:  # it was stopped there (RLIMIT_FSIZE)
        return "OLE", f"over {limits.output_bytes >> 20} MB of output"
    if done.killed == "memory":
        return "MLE", f"over {limits.memory_kb // 1024} MB of memory"
    if done.killed == "wall":
        return "TLE", f"over {limits.wall_s:g} s of wall time"
    if done.killed == "cpu":
        return "TLE", f"over {limits.cpu_s:g} s of CPU time"
    if done.cpu_s > limits.cpu_s or done.signal == signal.SIGXCPU:
        return "TLE", f"{done.cpu_s:.3f} s of CPU time, over {limits.cpu_s:g} s"
    if done.memory_kb > limits.memory_kb:
        return "MLE", f"peak {done.memory_kb // 1024} MB, over {limits.memory_kb // 1024} MB"
    if done.signal is not None:
        return "RE", f"killed by signal {done.signal}"
    if done.exit_code != 0:
        said = next((words for words in limits.out_of_memory if words in done.stderr), None)
        if said is not None:  # a heap bounded at the limit (Java's -Xmx): MLE, as DMOJ
            return "MLE", f"out of memory at {limits.memory_kb // 1024} MB ({said.decode()})"
        return "RE", f"exit code {done.exit_code}"
    return "AC", ""


def serve(spec: JudgeSpec, box: BoxInfo, isolation: str) -> int:
    """In the runner process (root, in the box, stdout a pipe to the supervisor): judge, write
    the outcome as one JSON object, and return the exit code."""
    os.umask(0o077)
    try:
        result = judge(spec, box, isolation)
    except Exception as exc:  # a failure of farm's own: IE, which the host retries
        result = outcome("IE", f"the judge's runner failed: {exc!r}")
    data = json.dumps(result).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]
    return 0
