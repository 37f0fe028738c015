"""Co-tenancy: sessions that share a worker's sandbox are boxes, and no box can touch another.

Every attack runs from a real session (B) against another (A) on the same real Docker worker;
each test fails when the isolation it names breaks. The sweep tests show why it matters for
batch evaluation: forty correct items that all write ``solution.py`` must all pass.
"""

from __future__ import annotations

import json
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.client import Farm, Session
from farm.client.session_files import SessionFiles
from farm.errors import FileOperationError, InvalidRequest
from farm.sweep import Sweep, plan_sweep
from tests.test_reliability_adversarial import record
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.reliability]


def value(session: Session, code: str) -> Any:
    result = session.run(code)
    assert result.ok and result.value is not None, result.error
    return eval(result.value.text)  # the repr of plain data


def facts(session: Session) -> dict[str, Any]:
    code = textwrap.dedent(
        """
        import os, tempfile
        status = dict(line.split(':', 1) for line in open('/proc/self/status'))
        old_umask = os.umask(0); os.umask(old_umask)
        {'uid': os.getuid(), 'gid': os.getgid(), 'groups': os.getgroups(), 'pid': os.getpid(),
         'caps': [status[k].strip() for k in ('CapEff', 'CapPrm', 'CapBnd', 'CapInh', 'CapAmb')],
         'nnp': status['NoNewPrivs'].strip(), 'cwd': os.getcwd(), 'home': os.environ['HOME'],
         'tmp': tempfile.gettempdir(), 'umask': old_umask,
         'cwd_mode': oct(os.stat('.').st_mode & 0o7777), 'cwd_owner': os.stat('.').st_uid,
         'tmp_mode': oct(os.stat(tempfile.gettempdir()).st_mode & 0o7777)}
        """
    )
    facts: dict[str, Any] = value(session, code)
    return facts


def attempts(session: Session, tries: dict[str, str]) -> dict[str, str]:
    """Run each expression in ``session``: what it returned (clipped), or its exception (a
    bare ``OSError`` with its message: the probes' way to name an errno that is not EPERM)."""
    body = "\n".join(
        f"try:\n    out[{name!r}] = repr({expr})[:80]\nexcept BaseException as e:\n"
        f"    out[{name!r}] = type(e).__name__ + (f' {{e}}' if type(e) is OSError else '')"
        for name, expr in tries.items()
    )
    found: dict[str, str] = value(session, f"import os, ctypes, signal\nout = {{}}\n{body}\nout")
    return found


def test_each_session_has_its_own_identity_and_no_privilege(
    pair: tuple[Session, Session], record_property: Any
) -> None:
    a, b = (facts(s) for s in pair)
    record(
        record_property,
        "distinct non-root uid/gid per session, no groups, CapEff/Prm/Bnd/Inh/Amb 0, "
        "no_new_privs, its own 0700 /workspace (HOME) and /tmp (TMPDIR), umask 077",
        f"A {a}; B {b}",
    )
    assert a["uid"] != b["uid"] and a["gid"] != b["gid"]
    for f in (a, b):
        assert f["uid"] >= 100_000 and f["gid"] == f["uid"]  # never root, never the kernel's
        assert f["groups"] == []
        assert f["caps"] == ["0000000000000000"] * 5 and f["nnp"] == "1"
        assert (f["cwd_mode"], f["cwd_owner"]) == ("0o700", f["uid"])
        assert f["home"] == f["cwd"] == "/workspace" and f["tmp"] == "/tmp"
        assert f["tmp_mode"] == "0o1777" and f["umask"] == 0o077  # /tmp of its own machine


PROBES = textwrap.dedent(
    """
    import ctypes, errno, os
    libc = ctypes.CDLL(None, use_errno=True)

    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    def refusal():
        # EPERM alone is a refusal; any other errno (ESRCH: no such process, EFAULT: a bad
        # address) says the probe missed, and is reported by its name (a bare OSError)
        err = ctypes.get_errno()
        if err == errno.EPERM:
            return PermissionError(err, os.strerror(err))
        return OSError(errno.errorcode.get(err, str(err)))

    def vm_readv(pid, address):
        buf = ctypes.create_string_buffer(16)
        local, remote = iovec(ctypes.addressof(buf), 16), iovec(address, 16)
        if libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) < 0:
            raise refusal()
        return buf.raw

    def ptrace_attach(pid):
        if libc.ptrace(16, pid, 0, 0) != 0:  # PTRACE_ATTACH
            raise refusal()
    """
)


def _outer_pid(container: Any, uid: int, inner: int) -> int:
    """The pid in the sandbox of the process of ``uid`` whose pid in its box is ``inner``
    (``NSpid``: the first is the sandbox's, the last the box's)."""
    code = (
        "import os, sys\n"
        "for p in filter(str.isdigit, os.listdir('/proc')):\n"
        "    s = dict(l.split(':', 1) for l in open(f'/proc/{p}/status'))\n"
        "    ids = s['NSpid'].split()\n"
        "    if s['Uid'].split()[0] == sys.argv[1] and ids[-1] == sys.argv[2]:\n"
        "        print(ids[0])"
    )
    done = container.exec_run(["python3", "-c", code, str(uid), str(inner)], user="0:0")
    assert done.exit_code == 0, done.output.decode()
    return int(done.output.split()[0])


def test_a_neighbours_files_memory_and_environment_are_out_of_reach(
    one_worker: Farm, docker_env: Any, pair: tuple[Session, Session], record_property: Any
) -> None:
    """B aims at A's files (by every path and API) and at A's session process by its pid in
    the sandbox: none of them exists in B's machine, and its own pid 1 refuses B."""
    a, b = pair
    mine = facts(a)
    pid = _outer_pid(_container(one_worker, docker_env), mine["uid"], mine["pid"])
    address = value(a, "id(secret)")
    assert b.run(PROBES).ok
    got = attempts(
        b,
        {
            "absolute path": "open('/workspace/mine.txt').read()",
            "its cwd link": f"os.listdir('/proc/{pid}/cwd/')",
            "its root link": f"os.listdir('/proc/{pid}/root/workspace')",
            "its memory": f"open('/proc/{pid}/mem', 'rb').read(1)",
            "its environment": f"open('/proc/{pid}/environ').read()",
            "its fds": f"os.listdir('/proc/{pid}/fd')",
            "signal it": f"os.kill({pid}, 0)",
            "process_vm_readv": f"vm_readv({pid}, {address})",
            "ptrace attach": f"ptrace_attach({pid})",
            "ptrace attach its pid 1": "ptrace_attach(1)",
            "the tools": "read('/workspace/mine.txt')",
        },
    )
    refused = dict.fromkeys(got, "FileNotFoundError")
    refused.update({"signal it": "ProcessLookupError"})
    refused.update({"ptrace attach its pid 1": "PermissionError"})
    refused.update({"ptrace attach": "OSError ESRCH"})
    refused["process_vm_readv"] = "PermissionError"  # Docker's profile: only with SYS_PTRACE
    refused["the tools"] = got["the tools"] if "hunter2" not in got["the tools"] else "not read"
    command = b.exec(["cat", "/workspace/mine.txt"])  # a command runs in B's machine too
    got["a command"] = "read" if "hunter2" in command.stdout else "not there"
    refused["a command"] = "not there"
    for scope in ("workspace", "box"):  # the files API sees B's own files only
        try:
            SessionFiles(b, scope=scope).read("/workspace/mine.txt")
            got[f"files API ({scope})"] = "read"
        except FileOperationError as exc:
            got[f"files API ({scope})"] = exc.ename
        refused[f"files API ({scope})"] = "FileNotFoundError"
    record(record_property, f"B reached nothing: {refused}", f"B got {got}")
    assert got == refused, got
    assert value(a, "secret") == "hunter2-" + "a" * 10


KERNEL_PID = (  # the kernel: the first python3 running farm.kernel (pid 1 is docker-init)
    "import os\nprint(min(int(p) for p in filter(str.isdigit, os.listdir('/proc'))\n"
    "    if open(f'/proc/{p}/cmdline', 'rb').read().startswith(b'python3\\0-m\\0farm.kernel')))"
)


def test_no_signal_reaches_a_neighbour_the_boxs_init_or_the_kernel(
    one_worker: Farm, docker_env: Any, pair: tuple[Session, Session], record_property: Any
) -> None:
    a, b = pair
    mine = facts(a)
    container = _container(one_worker, docker_env)
    pid = _outer_pid(container, mine["uid"], mine["pid"])
    kernel = int(container.exec_run(["python3", "-c", KERNEL_PID], user="0:0").output)
    assert value(b, "import os\nos.getppid()") == 1  # its parent: the box's own init
    tries = {}
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP, signal.SIGINT, signal.SIGUSR1):
        tries[f"{sig.name} neighbour"] = f"os.kill({pid}, {sig.value})"
        tries[f"{sig.name} neighbour's group"] = f"os.killpg({pid}, {sig.value})"
        tries[f"{sig.name} kernel"] = f"os.kill({kernel}, {sig.value})"
        tries[f"{sig.name} its init"] = f"os.kill(1, {sig.value})"
    got = attempts(b, tries)
    record(
        record_property,
        "A and the kernel do not exist for B (ProcessLookupError); B's own init refuses it "
        "(PermissionError); A's variables intact",
        f"{sorted(set(got.values()))} for {len(got)} attempts; "
        f"A's secret {value(a, 'secret')[:7]}...",
    )
    for name, what in got.items():
        assert what == ("PermissionError" if "init" in name else "ProcessLookupError"), got
    assert value(a, "secret") == "hunter2-" + "a" * 10
    assert b.run("1 + 1").ok and a.run("1 + 1").ok


def test_a_fork_bomb_and_a_memory_bomb_starve_only_their_own_box(
    pair: tuple[Session, Session], record_property: Any
) -> None:
    a, b = pair
    b.run("kept = list(range(1000))")
    bomb = a.run(
        "import os, time\npids = []\ntry:\n    while True:\n        pid = os.fork()\n"
        "        if pid == 0:\n            time.sleep(30)\n            os._exit(0)\n"
        "        pids.append(pid)\nexcept OSError as e:\n    stopped = e.errno\nlen(pids)",
        timeout_s=20,
    )
    assert bomb.ok and bomb.value is not None and int(bomb.value.text) < 64, bomb
    sandbox = value(
        b,
        "import os\nforked = os.fork()\nif forked == 0:\n    os._exit(0)\nos.waitpid(forked, 0)\n"
        "pids = next(d for d in ('/sys/fs/cgroup', '/sys/fs/cgroup/pids') "  # cgroup v2, v1
        "if os.path.exists(f'{d}/pids.current'))\n"
        "[int(open(f'{pids}/pids.{k}').read()) for k in ('current', 'max')]",
    )
    assert sandbox[0] < sandbox[1] / 2, sandbox  # the sandbox's pids limit far from reached
    memory = a.run("hog = bytearray(400 * 2**20)")
    record(
        record_property,
        "A's fork bomb stops at its box's pids; B forks; the sandbox far from its pids limit; "
        "A's 400 MB allocation is kind oom (MemoryError); B's variables kept",
        f"A forked {bomb.value.text if bomb.value else bomb.kind}; sandbox pids {sandbox}; "
        f"A's allocation {memory.kind} ({memory.error.ename if memory.error else None}); "
        f"B's variables: {value(b, 'len(kept)')} items",
    )
    assert memory.kind == "oom" and memory.error is not None, memory
    assert memory.error.ename == "MemoryError" and not memory.state_lost
    assert value(b, "len(kept)") == 1000


HOGS = """
import subprocess, sys, time
hog = "x = bytearray(120 * 2**20); x[::4096] = bytes(len(x[::4096])); import time; time.sleep(10)"
procs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(3)]
deadline = time.monotonic() + 10
while time.monotonic() < deadline and all(p.poll() is None for p in procs):
    time.sleep(0.05)  # until one of them ends (killed) or the allocations are long done
died = [p.returncode for p in procs if p.poll() is not None]
for p in procs:
    p.kill()
    p.wait()
assert not died, died
"""


def test_a_box_whose_processes_together_pass_its_memory_loses_them_not_a_neighbour(
    pair: tuple[Session, Session], record_property: Any
) -> None:
    """Each of A's three processes keeps to the box's 256 MB data limit, together they take
    360: the kernel's memory watch kills A's largest until A fits, B's 100 MB stay, and so do
    A's own variables (its session process is killed last)."""
    a, b = pair
    b.run("kept = bytearray(100 * 2**20); kept[::4096] = b'x' * len(kept[::4096])")
    a.run("mine = 41")
    hogs = a.run(HOGS, timeout_s=30)
    record(
        record_property,
        "A's three 120 MB processes (256 MB box): A's call kind oom, a kill named on stderr; "
        "A's and B's variables kept",
        f"A's call {hogs.kind}; stderr {hogs.stderr.strip()[-160:]!r}; A's variables "
        f"{value(a, 'mine + 1')}; B's {value(b, 'len(kept)') // 2**20} MB",
    )
    assert hogs.kind == "oom" and "over its 256 MB" in hogs.stderr, hogs
    assert value(a, "mine + 1") == 42 and value(b, "len(kept)") == 100 * 2**20


def test_shared_memory_a_box_maps_counts_against_its_budget(
    pair: tuple[Session, Session],
) -> None:
    """``MAP_SHARED`` anonymous memory (``mmap.mmap(-1, n)``, what multiprocessing's shared
    arrays use) is not data to ``RLIMIT_DATA``: two processes mapping 150 MB each still meet
    the box's 256 MB as the memory watch counts them."""
    a, b = pair
    b.run("kept = 41")
    mapped = a.run(
        HOGS.replace(
            "x = bytearray(120 * 2**20); x[::4096] = bytes(len(x[::4096]))",
            "import mmap; m = mmap.mmap(-1, 150 * 2**20); m.write(bytes(150 * 2**20))",
        ).replace("range(3)", "range(2)"),
        timeout_s=30,
    )
    assert mapped.kind == "oom" and "over its 256 MB" in mapped.stderr, mapped
    assert value(b, "kept + 1") == 42


def test_forked_workers_that_share_their_parents_memory_are_not_counted_twice(
    pair: tuple[Session, Session], record_property: Any
) -> None:
    """Four forked children of a 100 MB parent touch little of their own: by what each maps
    they would be 500 MB, by what they really add (a few MB each) far below the box's 256."""
    a, _ = pair
    pool = a.run(
        "import os, time\nbig = bytearray(100 * 2**20); big[::4096] = b'y' * len(big[::4096])\n"
        "pids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
        "        time.sleep(1.0)\n        os._exit(0)\n    pids.append(pid)\n"
        "[os.waitpid(p, 0)[1] for p in pids]",
        timeout_s=30,
    )
    record(
        record_property,
        "a 100 MB parent and four forked children (500 MB by what each maps) are ok, none "
        "killed (their shares are measured)",
        f"{pool.kind or 'ok'}, exits {pool.value.text if pool.value else None}; "
        f"killed: {'farm: killed' in pool.stderr}",
    )
    assert pool.ok and pool.value is not None and pool.value.text == "[0, 0, 0, 0]", pool
    assert "farm: killed" not in pool.stderr


def test_limits_are_per_session_within_the_sandboxs_caps(
    one_worker: Farm, record_property: Any
) -> None:
    record(
        record_property,
        "memory_mb 64: 100 MB is oom; memory_mb 400: 300 MB fits; fsize_mb 8: 16 MB file "
        "fails; over the sandbox's caps: InvalidRequest (session) / kind input (run)",
        "as expected when the test passes (each step asserts)",
    )
    with one_worker.session(limits={"memory_mb": 64}) as small:
        result = small.run("hog = bytearray(100 * 2**20)")
        assert result.kind == "oom" and result.error is not None
    with one_worker.session(limits={"memory_mb": 400}) as large:
        assert large.run("hog = bytearray(300 * 2**20)\nlen(hog)").ok
    with one_worker.session(limits={"fsize_mb": 8}) as capped:
        write = (
            "with open('big', 'wb') as f:\n    for _ in range(16):\n        f.write(b'x' * 2**20)"
        )
        result = capped.run(write)
        assert result.kind == "user" and "File too large" in str(result.error), result
    with pytest.raises(InvalidRequest, match="over this sandbox's cap"):
        one_worker.session(limits={"memory_mb": 4096})
    with pytest.raises(InvalidRequest, match="pids"):
        one_worker.session(limits={"pids": 1})
    bad = one_worker.run("1", limits={"nofile": 10**9})
    assert bad.kind == "input" and "cap" in (bad.error.evalue if bad.error else "")


def test_nothing_outlives_its_box(one_worker: Farm, docker_env: Any, record_property: Any) -> None:
    """A session leaves a daemon (setsid, double fork), files in its workspace, in /tmp and in
    /dev/shm, a POSIX message queue (/dev/mqueue) and System V shared memory; once it is
    closed, no process of its uid is left in the sandbox, and the next session given its uid
    finds an empty machine."""
    a = one_worker.session()
    leftovers = textwrap.dedent(
        """
        import os, time, ctypes
        open('work.txt', 'w').write('w')
        open('/tmp/left.txt', 'w').write('t')
        open('/dev/shm/left', 'w').write('s')
        os.makedirs('deep/closed'); open('deep/closed/f', 'w').write('d'); os.chmod('deep', 0)
        os.chmod('/workspace', 0o777); os.setxattr('/workspace', 'user.left', b'x')
        shm = ctypes.CDLL(None).shmget(0x4641524d, 4096, 0o1600)
        mq = ctypes.CDLL(None).mq_open(b'/left-mq', os.O_CREAT | os.O_RDWR, 0o600, None)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                while True:
                    time.sleep(0.05)
            os._exit(0)
        (os.getuid(), shm, mq)
        """
    )
    uid, shm, mq = value(a, leftovers)
    assert shm >= 0 and mq >= 0
    seen = value(a, LOOK)
    assert seen[0] == ["deep", "work.txt"] and "left.txt" in seen[1], seen
    assert seen[2:4] == [["left"], ["left-mq"]] and len(seen[4]) == 1, seen
    container = _container(one_worker, docker_env)
    assert wait_for(lambda: len(_uid_processes(container, uid)) >= 2, 10), "no daemon to outlive"
    a.close()
    assert wait_for(lambda: _uid_processes(container, uid) == [], 30), "a process of A lives"
    reused: list[Session] = []
    try:
        found = value(reopen_until_uid(one_worker, uid, reused), LOOK)
        record(
            record_property,
            "no process of the uid once A is closed; the next session with the uid finds an "
            "empty workspace, /tmp, /dev/shm, /dev/mqueue and no SysV shared memory",
            f"A had {seen}; the next session with uid {uid} finds {found}",
        )
        assert found == [[], [], [], [], []], found
        fresh = value(reused[-1], "import os\noct(os.stat('.').st_mode & 0o777), os.listxattr('.')")
        assert fresh == ("0o700", []), fresh  # its /workspace as a new box's
    finally:
        for s in reused:
            s.close()


def reopen_until_uid(
    farm: Farm, uid: int, opened: list[Session], timeout_s: float = 60.0
) -> Session:
    """Open sessions (each kept in ``opened``, for the caller to close) until one is given
    ``uid``'s box (the lowest free box once its end has emptied it), and return it. A box's
    end runs after its session's close returns, so on a loaded machine a round of opens can
    come before it: the round's sessions are closed and another round opened, up to
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        round_: list[Session] = []
        for _ in range(12):
            round_.append(farm.session())
            opened.append(round_[-1])
            if facts(round_[-1])["uid"] == uid:
                return round_[-1]
        if time.monotonic() > deadline:
            pytest.fail(f"no session got uid {uid} back in {timeout_s:.0f} s")
        for session in round_:
            session.close()


LOOK = (  # a box's workspace, /tmp, /dev/shm, /dev/mqueue and SysV shared memory
    "import os\n[sorted(os.listdir(d)) for d in ('.', '/tmp', '/dev/shm', '/dev/mqueue')] + "
    "[open('/proc/sysvipc/shm').read().splitlines()[1:]]"
)


def _uid_processes(container: Any, uid: int) -> list[int]:
    """The processes of ``uid`` in the sandbox, as its root sees them."""
    code = (
        "import os, sys\nprint([int(p) for p in filter(str.isdigit, os.listdir('/proc')) "
        "if open(f'/proc/{p}/status').read().split('Uid:')[1].split()[0] == sys.argv[1]])"
    )
    done = container.exec_run(["python3", "-c", code, str(uid)], user="0:0")
    assert done.exit_code == 0, done.output.decode()
    found: list[int] = eval(done.output)
    return found


def _container(farm: Farm, client: Any) -> Any:
    (worker,) = farm.workers()
    return client.containers.get(worker["sandbox"]["container_id"])


SOLUTION_ITEM = (
    "import time\nopen('solution.py', 'w').write('ANSWER = {n}')\ntime.sleep(0.2)\n"
    "ns = {{}}\nexec(open('solution.py').read(), ns)\nassert ns['ANSWER'] == {n}, ns['ANSWER']\n"
    "ns['ANSWER']"
)


@pytest.fixture
def two_workers(docker_env: Any) -> Iterator[Farm]:
    with Farm.local(workers=2) as farm:
        yield farm


@pytest.mark.parametrize("workers", [1, 2])
def test_forty_items_writing_the_same_file_all_pass(
    workers: int, tmp_path: Path, request: pytest.FixtureRequest, record_property: Any
) -> None:
    farm: Farm = request.getfixturevalue("one_worker" if workers == 1 else "two_workers")
    assert len(farm.workers()) == workers
    source = tmp_path / "in.jsonl"
    lines = [json.dumps({"id": n, "code": SOLUTION_ITEM.format(n=n)}) for n in range(40)]
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    Sweep(farm, concurrency=16).run(plan_sweep(source, out), out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 40
    failed = [(r["id"], r["message"]) for r in records if r["status"] != "ok"]
    record(record_property, "40/40 ok", f"{40 - len(failed)}/40 ok; failed: {failed[:3]}")
    assert not failed, failed
