"""Every frame of the kernel protocol, defined once (stdlib ``TypedDict``s).

They type the kernel's own code (mypy checks each frame it builds), and the host validates
the frames it reads with ``TypeAdapter``s over them (``farm.models.frames``). ``HOST_FRAMES``
are the host <-> supervisor conversation; the sandbox's own are in ``boxes.box_protocol``.
The conversations, frame by frame: docs/design/kernel.md.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, Union, get_args

from .branch_frames import BRANCH_CODES, Branch, Branched

# Why a run failed: the one place the kinds are written (``farm.models.ErrorKind`` mirrors them).
Kind = Literal[
    "user", "timeout", "oom", "output_limit", "state_lost", "sandbox_lost", "infra", "input"
]
KINDS: tuple[Kind, ...] = get_args(Kind)

# Codes of ``error`` frames after which the kernel keeps the connection; after any other, the
# kernel closes it (the request was malformed or hostile).
RECOVERABLE_CODES = frozenset(
    {"no_such_session", "too_many_sessions", "unavailable", "bad_limits", *BRANCH_CODES}
)
# Codes that say the request itself was bad (too large, malformed, limits past the caps):
# nothing ran, and the session lives on; the host reports kind ``input``, never retries.
INPUT_CODES = frozenset({"too_large", "bad_request", "bad_limits"})
# How long a box that finds no room waits for one (``wait_s`` of an open or item; default, cap).
DEFAULT_WAIT_S = 5.0
MAX_WAIT_S = 600.0

# --- values inside frames ----------------------------------------------------------------------


class ValueBundle(TypedDict):
    """A cell's value (or a ``display``): ``text`` for people, ``data`` a MIME bundle."""

    text: str
    data: dict[str, Any]


class CellError(TypedDict):
    ename: str
    evalue: str
    traceback: list[str]
    kind: Kind


class CellResult(TypedDict):
    """The result of one ``execute`` (the host adds ``worker`` and ``sub_calls``)."""

    exec_id: str
    session_id: str
    epoch: int
    status: Literal["ok", "error"]
    stdout: str
    stderr: str
    value: ValueBundle | None
    error: CellError | None
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float
    cpu_s: float
    max_rss_kb: int
    state_lost: bool


class BoxLimits(TypedDict, total=False):
    """Limits of one box (session); any left out take the kernel's defaults."""

    memory_mb: int  # RLIMIT_DATA of each process: a bigger allocation raises MemoryError
    pids: int  # RLIMIT_NPROC of the box's uid: processes and threads
    fsize_mb: int  # RLIMIT_FSIZE: the largest file a process may write
    nofile: int  # RLIMIT_NOFILE
    disk_mb: int  # the box's private disk (/workspace, /tmp, /var/tmp, /dev/shm together)


class CallError(TypedDict):
    ename: str
    evalue: str


# --- events of a running cell (``event`` frames) ----------------------------------------------


class StartedEvent(TypedDict):
    type: Literal["started"]


class RunningEvent(TypedDict):
    type: Literal["running"]


class StreamEvent(TypedDict):
    type: Literal["stream"]
    name: Literal["stdout", "stderr"]
    text: str


class DisplayEvent(TypedDict):
    type: Literal["display"]
    value: ValueBundle


class CallEvent(TypedDict):
    """A host callback the cell made; the host answers with an ``answer`` frame."""

    type: Literal["call"]
    id: int
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    batch: bool


class DoneEvent(TypedDict):
    """A cell of an ``item`` ended (only with ``events``): its result, so the host can close
    the cell's record at once and in order, before the item's next cell says anything."""

    type: Literal["done"]
    result: CellResult


# Union[...], not ``|``: TypedDict classes take ``|`` only from Python 3.10, and this module is
# imported by the kernel under any image's python3 >= 3.9.
CellEvent = Union[StartedEvent, RunningEvent, StreamEvent, DisplayEvent, CallEvent, DoneEvent]

# --- host <-> supervisor -----------------------------------------------------------------------


class Hello(TypedDict):
    type: Literal["hello"]
    kernel: Literal["farm"]
    version: str
    nonce: str


class Auth(TypedDict):
    type: Literal["auth"]
    nonce: str
    mac: str


class Welcome(TypedDict):
    type: Literal["welcome"]
    mac: str
    version: str


class ErrorFrame(TypedDict):
    type: Literal["error"]
    code: str
    message: str


class Ping(TypedDict):
    type: Literal["ping"]


class Capacity(TypedDict):
    """How many boxes a kernel holds (``boxes``: of its default limits, when none is alive;
    ``binding``: the budget that sets it: numbers, pids, disk_mb or sessions) and has ``free``
    now (ready spares included); boxes of sessions and items alive (``admitted``), being
    emptied after their end (``ending``), requests ``waiting`` for room and, so far, those
    ``refused`` after waiting their ``wait_s``."""

    boxes: int
    free: int
    binding: str
    admitted: int
    waiting: int
    ending: int
    refused: int


class Preloaded(TypedDict):
    """The image's warm imports (``boxes.preload``): in every box's ``sys.modules`` already;
    ``failed``: module -> why not (the kernel serves without it); ``seconds`` they took."""

    modules: list[str]
    failed: dict[str, str]
    seconds: float


class Pong(TypedDict):
    type: Literal["pong"]
    version: str
    python: str
    pid: int
    sessions: int
    max_sessions: int
    uptime_s: float
    grace_s: float
    max_frame: int
    isolation: Literal["namespaces", "uids", "dirs"]
    isolation_fallback: str | None  # why boxes have no namespaces although asked to
    box_limits: BoxLimits
    opens: int  # sessions opened so far
    spare_opens: int  # of which took a process made ahead of time
    spares: int  # such processes ready now
    quarantined: int  # boxes out of use until a reset of them succeeds
    capacity: Capacity
    preload: Preloaded


class _OpenSessionRequired(TypedDict):
    type: Literal["open_session"]


class OpenSession(_OpenSessionRequired, total=False):
    """``egress``: the box gets a proxy endpoint, sent to the attached proxy (``EgressBox``)
    under ``session_id`` (the host's choice, else a new one)."""

    tools: bool
    limits: BoxLimits
    session_id: str
    egress: bool
    wait_s: float  # how long the box may wait for room (default DEFAULT_WAIT_S)


class EgressAttach(TypedDict):
    """This connection (a Unix socket) becomes the host proxy's: boxes' endpoints come on it."""

    type: Literal["egress_attach"]


class EgressAttached(TypedDict):
    type: Literal["egress_attached"]


class EgressBox(TypedDict):
    """A box's proxy endpoint (its listening socket travels as ``SCM_RIGHTS`` with the
    frame's first byte) for the session ``session_id``; ``port`` on the box's loopback."""

    type: Literal["egress_box"]
    session_id: str
    port: int


class SessionOpened(TypedDict):
    type: Literal["session_opened"]
    session_id: str
    epoch: int
    queue_s: float  # how long its box waited for room (admission)


class _ExecuteRequired(TypedDict):
    type: Literal["execute"]
    session_id: str
    epoch: int
    code: str
    timeout_s: float
    exec_id: str


class Execute(_ExecuteRequired, total=False):
    max_output_bytes: int
    events: bool
    calls: list[str]


class EventFrame(TypedDict):
    type: Literal["event"]
    exec_id: str
    event: CellEvent


class _AnswerRequired(TypedDict):
    type: Literal["answer"]
    session_id: str
    id: int
    ok: bool


class Answer(_AnswerRequired, total=False):
    """The host's answer to a ``call`` event (``ok`` with ``value``, or ``error``)."""

    value: Any
    error: CallError


class _ExecReplyRequired(TypedDict):
    type: Literal["exec_result"]
    result: CellResult


class ExecReply(_ExecReplyRequired, total=False):
    """``started``: the cell was started and its ``started`` event held back, nothing else
    having been said (the host's client passes it on as that event before it returns)."""

    started: bool


class CloseSession(TypedDict):
    type: Literal["close_session"]
    session_id: str


class SessionClosed(TypedDict):
    type: Literal["session_closed"]
    session_id: str


class _CommandRequired(TypedDict):
    type: Literal["command"]
    session_id: str
    exec_id: str
    argv: list[str]
    timeout_s: float


class Command(_CommandRequired, total=False):
    """Run ``argv`` in the session's box (``commands``); stdin inline (base64) or staged."""

    stdin: str
    stdin_path: str
    cwd: str
    env: dict[str, str]
    max_output_bytes: int


class CommandOutcome(TypedDict):
    """What a command did (the host adds ``worker`` and, around it, ``error``)."""

    exec_id: str
    session_id: str
    returncode: int | None  # the exit status, or 128 + N for a death by signal N
    signal: int | None
    timed_out: bool
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float


class CommandReply(TypedDict):
    type: Literal["command_result"]
    result: CommandOutcome


FileOp = Literal["write", "read", "stat", "list", "remove", "extract"]
FILE_CHUNK = 8 * 1024 * 1024  # the most bytes one file frame writes or reads (its blob)


class FileError(TypedDict):
    ename: str
    evalue: str
    errno: int
    path: str


class _FileRequestRequired(TypedDict):
    type: Literal["file"]
    session_id: str
    op: FileOp
    path: str


class FileRequest(_FileRequestRequired, total=False):
    """One file operation (``fileops``): a chunk, ``blob`` (raw bytes after the frame's JSON,
    ``framing``), written at ``offset``; ``length`` bytes read from ``offset``; ``scope``
    "workspace" (confined) or "box"."""

    scope: Literal["workspace", "box"]
    offset: int
    length: int
    blob: bytes
    source: str


class _FileReplyRequired(TypedDict):
    type: Literal["file_result"]
    result: Any
    error: FileError | None


class FileReply(_FileReplyRequired, total=False):
    """A file operation's result; a read's bytes in ``blob`` (raw, ``framing``)."""

    blob: bytes


class _ItemRequired(TypedDict):
    type: Literal["item"]
    exec_id: str  # cell n runs as "<exec_id>-<n>", the command as "<exec_id>-cmd"
    cells: list[str]
    timeout_s: float


class Item(_ItemRequired, total=False):
    """A one-shot box in one request: open it, write ``files`` (workspace path -> base64),
    run ``cells`` in order (stopping at the first that fails), then ``argv`` as a command,
    and close it. ``session_id`` (the host's choice) lets the host close it early."""

    session_id: str
    tools: bool
    limits: BoxLimits
    files: dict[str, str]
    argv: list[str]
    max_output_bytes: int
    events: bool
    egress: bool
    judge: JudgeSpec  # a judge step instead of a command (judging)
    wait_s: float  # how long its box may wait for room (default DEFAULT_WAIT_S)


Verdict = Literal["AC", "WA", "TLE", "MLE", "RE", "OLE", "CE", "IE", "PENDING"]
VERDICTS: tuple[str, ...] = get_args(Verdict)  # PENDING: a special judge decides (host side)


class JudgeTest(TypedDict, total=False):
    """``stdin`` (base64) or ``stdin_path`` (a workspace file, opened as the box), and the
    ``expected`` output (base64; none with a special judge)."""

    stdin: str
    stdin_path: str
    expected: str


class _JudgeProgramRequired(TypedDict):
    language: str  # a name of the image's table, like a submission's
    source: str
    protocol: Literal["testlib", "kattis"]


class JudgeProgram(_JudgeProgramRequired, total=False):
    """A problem's checker or interactor (``checking``, ``interaction``): compiled once per
    problem, run as the box's judge uid; ``artifact``: the worker's cached build."""

    artifact: dict[str, str] | None


class _JudgeSpecRequired(TypedDict):
    language: str  # a name of the image's table (languages.TABLE)
    source: str
    tests: list[JudgeTest]
    checker: str  # exact | lines | tokens | float:ABS[:REL] | none | special | program
    time_s: float  # CPU seconds per test
    memory_mb: int  # peak resident memory per test
    output_mb: int  # stdout per test


class JudgeSpec(_JudgeSpecRequired, total=False):
    """An item's judge step (``judging``): compile ``source`` once (or restore ``artifact``,
    the worker's cached build: file name -> base64), run each test, check it. With
    ``keep_outputs`` (a special judge) outputs come back and the verdict is ``PENDING``."""

    all_tests: bool
    wall_s: float  # wall seconds per test (default: max(3x the CPU time, + 5 s))
    artifact: dict[str, str] | None
    keep_outputs: bool
    compile_time_s: float
    compile_memory_mb: int
    checker_program: JudgeProgram  # with checker "program"
    interactor: JudgeProgram  # an interactive problem: wired to the submission's stdin/stdout
    compile_options: list[str]  # argv words: at the table's {options}, else before the source
    run_args: list[str]  # argv words after the run command


class JudgeTestOutcome(TypedDict, total=False):
    index: int
    verdict: Verdict
    message: str
    time_s: float  # CPU time (ru_utime + ru_stime)
    wall_s: float
    memory_kb: int  # peak RSS (ru_maxrss)
    output_bytes: int
    exit_code: int | None
    signal: int | None
    stderr: str
    output: str  # base64, with keep_outputs (or a special judge) only
    points: float  # the share of the test a checker or interactor gave it (0 to 1)


class CompileOutcome(TypedDict):
    status: Literal["ok", "error"]
    output: str  # the compiler's messages (clipped)
    time_s: float
    wall_s: float
    cached: bool  # the worker's cached build was restored instead


class _JudgeOutcomeRequired(TypedDict):
    verdict: Verdict  # the first failing test's (or CE, IE, AC, PENDING)
    message: str
    tests: list[JudgeTestOutcome]
    compile: CompileOutcome | None


class JudgeOutcome(_JudgeOutcomeRequired, total=False):
    kind: Kind  # with IE: "input" when the request itself was refused (an unknown language)
    language: str
    version: str  # the toolchain's own words (recorded when the image was built)
    artifact: dict[str, str] | None  # a fresh build's files, for the worker's cache
    program_artifacts: dict[str, dict[str, str]]  # "checker"/"interactor": fresh builds
    program_compiles: dict[str, CompileOutcome]  # "checker"/"interactor": their compiles


class ItemOutcome(TypedDict):
    """What a one-shot box did: its cells' results, the command's, or the file it could not
    write (then nothing ran)."""

    session_id: str
    cells: list[CellResult]
    command: CommandOutcome | None
    file_error: FileError | None
    judge: JudgeOutcome | None
    queue_s: float  # how long its box waited for room (admission)


class ItemReply(TypedDict):
    type: Literal["item_result"]
    result: ItemOutcome


HOST_FRAMES: dict[str, type] = {
    "hello": Hello,
    "auth": Auth,
    "welcome": Welcome,
    "error": ErrorFrame,
    "ping": Ping,
    "pong": Pong,
    "open_session": OpenSession,
    "session_opened": SessionOpened,
    "egress_attach": EgressAttach,
    "egress_attached": EgressAttached,
    "execute": Execute,
    "event": EventFrame,
    "answer": Answer,
    "exec_result": ExecReply,
    "close_session": CloseSession,
    "session_closed": SessionClosed,
    "command": Command,
    "command_result": CommandReply,
    "file": FileRequest,
    "file_result": FileReply,
    "item": Item,
    "item_result": ItemReply,
    "branch": Branch,
    "branched": Branched,
}
