"""Adversarial code through the public API, on real Docker sandboxes (issue 10).

Each case runs hostile code in a session of its own on a shared two-worker farm, then checks
what a pipeline relies on:
- the result has the documented kind (``user``, ``timeout``, ``oom``, ``output_limit``,
  ``state_lost``; ``SessionLost`` when the sandbox itself went);
- the session's variables are kept, or their loss is reported (``StateLost`` until
  ``restart()``), and no call ever receives another call's answer;
- a bystander session opened before on the same worker still has its variables, whatever the
  code did (every session is a box with a uid of its own: see the security model);
- a fresh session on that worker works, and the worker process was not restarted.

Expected and observed outcomes go to junit properties for ``scripts/reliability_report.py``.
"""

from __future__ import annotations

import ast
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any

import pytest

from farm.client import Farm, Session
from farm.errors import FarmBusy, FarmError, SessionLost, StateLost
from farm.models import ExecResult
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.reliability]

REPO = Path(__file__).resolve().parents[1]
OUTPUT_BOUND = 1024 * 1024 + 200  # the default per-stream cap plus the cut marker
FRESH_DEADLINE_S = 60.0  # a replaced sandbox (2 missed pings, then a start) is ready by then

KEPT, LOST, GONE = "kept", "lost", "gone"


# --- helpers shared with the chaos tests ----------------------------------------------------


def session_on(farm: Farm, worker: str, deadline_s: float = FRESH_DEADLINE_S) -> Session:
    """Open a session on ``worker``: sessions open through the shared queue, so ask until one
    lands there (closing the others); ``LookupError`` when none does before the deadline."""
    deadline = time.monotonic() + deadline_s
    last = "no attempt"
    while time.monotonic() < deadline:
        try:
            session = farm.session(open_wait_s=max(1.0, deadline - time.monotonic()))
        except FarmBusy as exc:
            last = str(exc)
            continue
        if session.worker == worker:
            return session
        last = f"landed on {session.worker}"
        session.close()
    raise LookupError(f"no session opened on worker {worker} within {deadline_s:g}s ({last})")


def describe(result: ExecResult) -> str:
    if result.ok:
        return f"ok, value {result.value.text if result.value else None}"
    assert result.error is not None
    return f"{result.error.kind.value} ({result.error.ename}), state_lost={result.state_lost}"


def record(record_property: Callable[[str, object], None], expected: str, observed: str) -> None:
    record_property("expected", expected)
    record_property("observed", observed)


# --- what happened --------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str  # "ok", an ErrorKind value, or "sandbox_lost" when run raised SessionLost
    result: ExecResult | None
    raised: str | None
    seconds: float

    @property
    def state_lost(self) -> bool:
        return self.result is not None and self.result.state_lost

    def describe(self) -> str:
        what = describe(self.result) if self.result is not None else self.kind
        via = f", run raised {self.raised}" if self.raised else ""
        return f"{what}{via} after {self.seconds:.1f}s"


def run_hostile(session: Session, code: str, timeout_s: float) -> Outcome:
    t0 = time.monotonic()
    try:
        result = session.run(code, timeout_s)
        kind = result.kind.value if result.kind else "ok"
        return Outcome(kind, result, None, time.monotonic() - t0)
    except StateLost as exc:
        return Outcome("state_lost", exc.result, "StateLost", time.monotonic() - t0)
    except SessionLost:
        return Outcome("sandbox_lost", None, "SessionLost", time.monotonic() - t0)
    except FarmError as exc:
        return Outcome(f"error {type(exc).__name__}", None, type(exc).__name__, 0.0)


def fate_of_variables(session: Session) -> str:
    """``kept``, ``lost`` (reported by StateLost, then gone after restart) or ``gone``."""
    try:
        result = session.run("canary", timeout_s=10)
    except StateLost:
        session.restart()
        try:
            after = session.run("'canary' in globals()", timeout_s=10)
        except FarmError as exc:
            return f"restart() did not help: {type(exc).__name__}"
        if after.value is not None and after.value.text == "False":
            return LOST
        return f"wrong: after restart() got {describe(after)}"
    except SessionLost:
        return GONE
    except FarmError as exc:
        return f"wrong: {type(exc).__name__}: {exc}"
    if result.value is not None and result.value.text == "'alive'":
        return KEPT
    return f"wrong answer to 'canary': {describe(result)}"


def answers_match(session: Session) -> str:
    """Three distinct calls must each get their own answer (no stale replies in the pipe)."""
    for i in range(3):
        try:
            result = session.run(f"'probe-{i}'", timeout_s=10)
        except StateLost:
            return f"call {i} raised StateLost with no loss reported before"
        except FarmError as exc:
            return f"call {i} raised {type(exc).__name__}"
        if result.value is None or result.value.text != f"'probe-{i}'":
            return f"call {i} ('probe-{i}') got {describe(result)}"
    return "each call got its own answer"


def bystander_fate(session: Session) -> str:
    try:
        result = session.run("kept", timeout_s=10)
    except SessionLost:
        return GONE
    except FarmError as exc:
        return f"wrong: {type(exc).__name__}"
    return KEPT if result.value is not None and result.value.text == "'yes'" else describe(result)


def fresh_session_works(farm: Farm, worker: str) -> str:
    try:
        session = session_on(farm, worker)
    except (LookupError, FarmError) as exc:
        return f"no: {exc}"
    try:
        result = session.run("6 * 7", timeout_s=10)
        return "yes" if result.value is not None and result.value.text == "42" else describe(result)
    except FarmError as exc:
        return f"no: {type(exc).__name__}: {exc}"
    finally:
        session.close()


def replace_worker(farm: Farm, worker: str) -> None:
    """Test hygiene after a case broke a worker: later cases need two healthy workers."""
    local = farm.local_farm
    local.kill_worker(worker)
    local.workers[worker].wait(30)
    local.wait_ready([local.add_worker()])


# --- the cases ------------------------------------------------------------------------------


def _secrets_code(farm: Farm) -> str:
    local = farm.local_farm
    needles = [farm.settings.broker_url, str(local.dir), str(REPO)]
    host_paths = [str(REPO), str(local.dir), str(Path.home() / ".farm"), "/work"]
    return Template(
        "import os, glob\n"
        "seen = [repr(dict(os.environ))]\n"
        "for p in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'):\n"
        "    try:\n"
        "        seen.append(open(p, 'rb').read().decode('latin-1'))\n"
        "    except OSError:\n"
        "        pass\n"
        "text = chr(10).join(seen)\n"
        "readable = []\n"
        "for p in ('/etc/shadow', '/root', '/proc/1/root/etc/shadow'):\n"
        "    try:\n"
        "        os.listdir(p) if os.path.isdir(p) else open(p, 'rb').read(1)\n"
        "        readable.append(p)\n"
        "    except OSError:\n"
        "        pass\n"
        "{'leaked': [n for n in $needles if n in text],\n"
        " 'farm_vars': sorted(k for k in os.environ\n"
        "                     if k.startswith('FARM') or 'REDIS' in k or 'BROKER' in k),\n"
        " 'docker_socket': [p for p in ('/var/run/docker.sock', '/run/docker.sock')\n"
        "                   if os.path.exists(p)],\n"
        " 'host_paths': [p for p in $host_paths if os.path.exists(p)],\n"
        " 'readable': readable}"
    ).substitute(needles=repr(needles), host_paths=repr(host_paths))


def _check_secrets(outcome: Outcome, session: Session) -> None:
    assert outcome.result is not None and outcome.result.value is not None
    found = ast.literal_eval(outcome.result.value.text)
    assert found == {
        "leaked": [],
        "farm_vars": [],
        "docker_socket": [],
        "host_paths": [],
        "readable": [],
    }, found


def _network_code(farm: Farm) -> str:
    port = farm.local_farm.redis.port
    others = [
        str((w.get("sandbox") or {}).get("address", "")).removeprefix("unix:")
        for w in farm.workers()
    ]
    return Template(
        "import os, socket\n"
        "def reach(host, port):\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=2).close()\n"
        "        return 'connected'\n"
        "    except OSError as e:\n"
        "        return type(e).__name__\n"
        "def unix(path):\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    s.settimeout(2)\n"
        "    try:\n"
        "        s.connect(path)\n"
        "        return 'connected'\n"
        "    except OSError as e:\n"
        "        return type(e).__name__\n"
        "    finally:\n"
        "        s.close()\n"
        "def resolve(name):\n"
        "    try:\n"
        "        socket.getaddrinfo(name, 443)\n"
        "        return 'resolved'\n"
        "    except OSError as e:\n"
        "        return type(e).__name__\n"
        "{'ifaces': sorted(os.listdir('/sys/class/net')),\n"
        " 'broker_loopback': reach('127.0.0.1', $port),\n"
        " 'broker_via_gateway': reach('172.17.0.1', $port),\n"
        " 'docker_api': reach('172.17.0.1', 2375),\n"
        " 'internet': reach('1.1.1.1', 443),\n"
        " 'dns': resolve('pypi.org'),\n"
        " 'other_kernels': [unix(p) for p in $others if p]}"
    ).substitute(port=port, others=repr(others))


def _check_network(outcome: Outcome, session: Session) -> None:
    assert outcome.result is not None and outcome.result.value is not None
    facts = ast.literal_eval(outcome.result.value.text)
    assert facts["ifaces"] == ["lo"], facts
    reached = [k for k, v in facts.items() if v in ("connected", "resolved")]
    reached += [
        f"other_kernels[{i}]" for i, v in enumerate(facts["other_kernels"]) if v == "connected"
    ]
    assert reached == [], facts


def _check_bounded_output(outcome: Outcome, session: Session) -> None:
    assert outcome.result is not None
    assert outcome.result.stdout_truncated
    assert len(outcome.result.stdout.encode()) < OUTPUT_BOUND


def _check_replaced_bytes(outcome: Outcome, session: Session) -> None:
    assert outcome.result is not None and outcome.result.stdout == "ok \ufffd\ufffd end\n"


def _check_stdout_comes_back(outcome: Outcome, session: Session) -> None:
    after = session.run("print('visible again')", timeout_s=10)
    assert after.ok and after.stdout == "visible again\n", describe(after)


def _check_thread_still_harmless(outcome: Outcome, session: Session) -> None:
    first = session.run("ticks[0]", timeout_s=10).value
    assert first is not None

    def ticked() -> bool:
        later = session.run("ticks[0]", timeout_s=10).value
        return later is not None and int(later.text) > int(first.text)

    assert wait_for(ticked, 10), "the leftover thread stopped (or the session stopped answering)"


def _remove_fill(path: str) -> Callable[[Outcome, Session], None]:
    def check(outcome: Outcome, session: Session) -> None:
        assert outcome.result is not None and outcome.result.error is not None
        assert outcome.result.error.ename in ("OSError", "BlockingIOError") or "Errno" in (
            outcome.result.error.evalue
        )
        # The hostile session cleans up after itself so later cases see a normal sandbox.
        cleanup = f"import os\ntry:\n    f.close()\nexcept OSError:\n    pass\nos.remove({path!r})"
        assert session.run(cleanup, timeout_s=10).ok

    return check


@dataclass(frozen=True)
class Case:
    id: str
    code: str | Callable[[Farm], str]
    kinds: frozenset[str]
    state: frozenset[str]
    note: str
    timeout_s: float = 2.0
    check: Callable[[Outcome, Session], None] | None = field(default=None, compare=False)

    @property
    def expected(self) -> str:
        kinds = " or ".join(sorted(self.kinds))
        fates = " or ".join(sorted(self.state))
        return (
            f"{kinds}; variables {fates}; {self.note}; every call gets its own answer; "
            "bystander (another session on the worker) kept; a fresh session on the worker works"
        )


def case(
    id: str, code: str | Callable[[Farm], str], kinds: str, state: str, note: str, **kw: Any
) -> Case:
    return Case(id, code, frozenset(kinds.split("|")), frozenset(state.split("|")), note, **kw)


# Sandboxed code writes a cell_done of its own, with an error the protocol does not allow, on
# every socket it holds (its control socket among them): the supervisor must not pass it on.
FORGE_CELL_DONE = (
    "import json, os, socket, struct\n"
    "frame = {'type': 'cell_done', 'value': None, 'duration_s': 0.0, 'cpu_s': 0.0,\n"
    "         'max_rss_kb': 0, 'error': {'ename': 'Forged', 'evalue': '', 'traceback': []}}\n"
    "body = json.dumps(frame).encode()\n"
    "for fd in map(int, os.listdir('/proc/self/fd')):\n"
    "    try:\n"
    "        if os.readlink(f'/proc/self/fd/{fd}').startswith('socket:'):\n"
    "            s = socket.socket(fileno=os.dup(fd))\n"
    "            s.sendall(struct.pack('>I', len(body)) + body)\n"
    "            s.close()\n"
    "    except OSError:\n"
    "        pass\n"
    "import time\n"
    "time.sleep(5)\n"  # the forged frame is read first, whatever the cell does next
)


def _check_forgery_named(outcome: Outcome, victim: Session) -> None:
    assert outcome.result is not None and outcome.result.error is not None
    evalue = outcome.result.error.evalue
    assert "sent a 'cell_done' frame with an error" in evalue, evalue


CASES = [
    case("infinite-loop", "while True:\n    pass", "timeout", KEPT, "interrupted"),
    case("sleep-forever", "import time\ntime.sleep(10**6)", "timeout", KEPT, "interrupted"),
    case(
        "catastrophic-regex",
        "import re\nre.match(r'(a+)+$', 'a' * 64 + 'b')",
        "timeout",
        f"{KEPT}|{LOST}",
        "interrupted, or killed after the grace period",
    ),
    case(
        "c-loop-ignoring-signals",
        "sum(range(10**15))",
        "timeout",
        LOST,
        "killed after the grace period (state_lost true)",
    ),
    case(
        "fork-bomb",
        "import os\nwhile True:\n    os.fork()",
        "user|timeout",
        f"{KEPT}|{LOST}",
        "pids limit stops it",
        timeout_s=5,
    ),
    case(
        "fork-bomb-swallowing-errors",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "timeout",
        f"{KEPT}|{LOST}",
        "pids limit stops it",
        timeout_s=3,
    ),
    case(
        "memory-bomb",
        "bomb = []\nwhile True:\n    bomb.append(bytearray(10**7))",
        "oom",
        KEPT,
        "MemoryError at the box's memory limit (FARM_BOX_MEMORY_MB): the session lives",
        timeout_s=60,
    ),
    case(
        "memory-bomb-in-child-processes",
        "import os\nfor _ in range(6):\n    if os.fork() == 0:\n"
        "        bomb = []\n        while True:\n            bomb.append(bytearray(10**7))\n"
        "import time\ntime.sleep(3)",
        "ok|oom|state_lost|timeout",
        f"{KEPT}|{LOST}",
        "each child stops at the box's memory limit or is OOM-killed; the kernel lives",
        timeout_s=30,
    ),
    case(
        "thread-outliving-the-timeout",
        "import threading, time\nticks = [0]\n"
        "def tick():\n    while True:\n        ticks[0] += 1\n        time.sleep(0.001)\n"
        "threading.Thread(target=tick, daemon=True).start()\ntime.sleep(10**6)",
        "timeout",
        KEPT,
        "interrupted; the session answers while the thread lives on",
        check=_check_thread_still_harmless,
    ),
    case(
        "stdout-flood",
        "while True:\n    print('flood' * 100)",
        "output_limit",
        KEPT,
        "interrupted; stdout capped head+tail",
        timeout_s=60,
        check=_check_bounded_output,
    ),
    case(
        "one-100MB-line",
        "import sys\nsys.stdout.write('y' * (100 * 2**20))",
        "output_limit",
        KEPT,
        "interrupted; stdout capped head+tail",
        timeout_s=60,
        check=_check_bounded_output,
    ),
    case(
        "invalid-utf8-on-fd-1",
        "import os\nos.write(1, b'ok \\xff\\xfe end\\n');",
        "ok",
        KEPT,
        "bad bytes replaced with U+FFFD",
        check=_check_replaced_bytes,
    ),
    case(
        "os-close-fd-1",
        "import os\nos.close(1)",
        "ok",
        KEPT,
        "the next cell's stdout is captured again",
        check=_check_stdout_comes_back,
    ),
    case(
        "forged-frame-on-the-control-socket",
        FORGE_CELL_DONE,
        "state_lost",
        LOST,
        "the process that wrote it is replaced, saying why; the kernel and host go on",
        check=_check_forgery_named,
    ),
    case("sys-exit", "import sys\nsys.exit(3)", "user", KEPT, "SystemExit is a user error"),
    case("os-_exit", "import os\nos._exit(3)", "state_lost", LOST, "the process died"),
    case("segfault", "import ctypes\nctypes.string_at(0)", "state_lost", LOST, "the process died"),
    case(
        "deep-recursion",
        "def f(n):\n    return f(n + 1)\nf(0)",
        "user",
        KEPT,
        "RecursionError",
    ),
    case(
        "disk-fill-tmp",
        "f = open('/tmp/fill', 'wb')\nwhile True:\n    f.write(b'x' * 2**20)",
        "user",
        KEPT,
        "ENOSPC from the 64 MB tmpfs",
        timeout_s=60,
        check=_remove_fill("/tmp/fill"),
    ),
    case(
        "disk-fill-workspace",
        "f = open('fill', 'wb')\nwhile True:\n    f.write(b'x' * 2**20)",
        "user",
        KEPT,
        "ENOSPC/EFBIG from the 256 MB tmpfs and fsize limit",
        timeout_s=60,
        check=_remove_fill("fill"),
    ),
    case(
        "write-to-the-workspace-root",
        "open('/workspace/mine', 'w').write('x')",
        "ok",
        KEPT,
        "/workspace is the box's own (the working directory)",
    ),
    case(
        "write-to-root",
        "open('/farm-was-here', 'w').write('x')",
        "user",
        KEPT,
        "read-only root filesystem",
    ),
    case(
        "read-host-secrets",
        _secrets_code,
        "ok",
        KEPT,
        "no worker env, broker URL, host files or Docker socket visible",
        timeout_s=30,
        check=_check_secrets,
    ),
    case(
        "network-egress-broker-and-other-sandbox",
        _network_code,
        "ok",
        KEPT,
        "only lo; broker, Docker API, internet, DNS and the other kernel unreachable",
        timeout_s=30,
        check=_check_network,
    ),
    case(
        "repr-that-never-returns",
        "class Endless:\n    def __repr__(self):\n        while True:\n            pass\nEndless()",
        "timeout",
        KEPT,
        "the rendering is interrupted like any code",
    ),
    case(
        "sigint-ignored-then-long-loop",
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
        "timeout",
        LOST,
        "killed after the grace period (state_lost true)",
    ),
    case(
        "os-kill-1",
        "import os\nos.kill(1, 9)",
        "user",
        KEPT,
        "PermissionError: pid 1 is the box's init, root's",
    ),
    case(
        "os-killpg-own-group",
        "import os\nos.killpg(0, 9)",
        "state_lost",
        LOST,
        "only its own process group dies",
    ),
    case(
        "kill-the-parent",
        "import os\nos.kill(os.getppid(), 9)",
        "user",
        KEPT,
        "PermissionError: its parent is the box's init, root's, which no box may signal",
    ),
    case(
        "killpg-the-inits-group",
        "import os\nos.killpg(os.getpgid(1), 9)",
        "user",
        KEPT,
        "PermissionError: the box's init's group holds only root's processes",
    ),
]


@pytest.fixture
def victim_and_bystander(farm: Farm) -> Iterator[tuple[Session, Session]]:
    victim = farm.session()
    bystander = session_on(farm, victim.worker)
    victim.run("canary = 'alive'")
    bystander.run("kept = 'yes'")
    yield victim, bystander
    for session in (victim, bystander):
        with contextlib.suppress(FarmError):
            session.close()


@pytest.mark.parametrize("hostile", CASES, ids=[c.id for c in CASES])
def test_hostile_code_gets_its_kind_and_harms_no_one_else(
    farm: Farm,
    victim_and_bystander: tuple[Session, Session],
    hostile: Case,
    record_property: Callable[[str, object], None],
) -> None:
    victim, bystander = victim_and_bystander
    worker = victim.worker
    code = hostile.code(farm) if callable(hostile.code) else hostile.code
    outcome = run_hostile(victim, code, hostile.timeout_s)
    check_error = ""
    if hostile.check is not None and outcome.kind in hostile.kinds:
        try:
            hostile.check(outcome, victim)
        except (AssertionError, FarmError) as exc:
            check_error = f"{type(exc).__name__}: {exc}"[:300]
    fate = fate_of_variables(victim)
    answers = answers_match(victim) if fate != GONE else "n/a (session gone)"
    bystander_now = bystander_fate(bystander)
    fresh = fresh_session_works(farm, worker)
    process_alive = farm.local_farm.workers[worker].poll() is None
    observed = (
        f"{outcome.describe()}; variables {fate}; {answers}; bystander {bystander_now}; "
        f"fresh session on the worker: {fresh}; worker process "
        f"{'alive' if process_alive else 'DEAD'}"
        + (f"; check failed: {check_error}" if check_error else "")
    )
    record(record_property, hostile.expected, observed)
    try:
        assert outcome.kind in hostile.kinds, observed
        assert not check_error, observed
        assert fate in hostile.state, observed
        assert answers in ("each call got its own answer", "n/a (session gone)"), observed
        assert bystander_now == KEPT, observed
        assert fresh == "yes", observed
        assert process_alive, observed
    finally:
        if fresh != "yes" or not process_alive:
            replace_worker(farm, worker)
