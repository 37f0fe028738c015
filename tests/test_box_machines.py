"""Every box a machine of its own: two real sessions on one real Docker worker, A and B.

Each test is one thing a neighbour shared while boxes were only uids (the loopback network,
abstract sockets, the disk, the process table, absolute paths, the process budget) and fails
when it is shared again. What the sandbox's root sees is read with ``docker exec`` as root.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from farm.client import Farm, Session
from tests.test_cotenancy import facts, reopen_until_uid, value
from tests.test_reliability_adversarial import record, session_on
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.reliability]


def outcome(session: Session, code: str) -> str:
    """What ``code`` (an expression) gave: its repr, or its exception's name."""
    body = f"try:\n    _o = repr({code})\nexcept BaseException as e:\n    _o = type(e).__name__\n_o"
    result: str = value(session, body)
    return result


SERVE = textwrap.dedent(
    """
    import socket, threading
    def serve(sock, answer):
        sock.listen()
        def loop():
            while True:
                conn, _ = sock.accept()
                conn.sendall(answer)
                conn.close()
        threading.Thread(target=loop, daemon=True).start()
    """
)


def test_loopback_is_the_boxs_own(pair: tuple[Session, Session], record_property: Any) -> None:
    """A serves a secret on 127.0.0.1:8765: B cannot reach it, binds 8765 itself and serves
    its own; both answer their own connections."""
    a, b = pair
    a.run(SERVE + "s = socket.socket(); s.bind(('127.0.0.1', 8765)); serve(s, b'SECRET-OF-A')")
    read = "socket.create_connection(('127.0.0.1', 8765), timeout=2).recv(64)"
    assert b.run(SERVE).ok
    got = outcome(b, read)
    bound = outcome(b, "(serve(socket.create_server(('127.0.0.1', 8765)), b'B'), 'bound')")
    mine, theirs = outcome(a, read), outcome(b, read)
    record(
        record_property,
        "B's connect to A's port refused; B binds the same port; each reads its own",
        f"B's connect: {got}; B's bind: {bound}; A reads {mine}, B reads {theirs}",
    )
    assert got == "ConnectionRefusedError"
    assert bound == "(None, 'bound')"
    assert (mine, theirs) == ("b'SECRET-OF-A'", "b'B'")


def test_two_boxes_serve_http_on_one_port_each_its_own_files(
    pair: tuple[Session, Session],
) -> None:
    """The agents' favourite: ``python -m http.server 8000`` in each box, then a fetch of
    localhost:8000, each sees its own workspace."""
    fetch = textwrap.dedent(
        """
        import subprocess, sys, time, urllib.request
        open('/workspace/whose.txt', 'w').write(WHO)
        server = subprocess.Popen([sys.executable, '-m', 'http.server', '8000'],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                body = urllib.request.urlopen('http://localhost:8000/whose.txt').read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # poll interval until the server answers (a deadline above)
        body
        """
    )
    a, b = pair
    a.run("WHO = 'A'")
    b.run("WHO = 'B'")
    assert value(a, fetch) == b"A"
    assert value(b, fetch) == b"B"
    assert value(a, "urllib.request.urlopen('http://127.0.0.1:8000/whose.txt').read()") == b"A"


def test_abstract_unix_sockets_are_the_boxs_own(pair: tuple[Session, Session]) -> None:
    a, b = pair
    a.run(SERVE + "u = socket.socket(socket.AF_UNIX); u.bind('\\0farm-secret'); serve(u, b'A')")
    connect = "(lambda c: (c.connect('\\0farm-secret'), c.recv(8))[1])(socket.socket(1))"
    assert b.run("import socket").ok
    assert outcome(b, connect) == "ConnectionRefusedError"
    assert outcome(a, connect) == "b'A'"


PROCESSES = textwrap.dedent(
    """
    import os
    def processes():
        seen = {}
        for pid in filter(str.isdigit, os.listdir('/proc')):
            try:
                status = dict(l.split(':', 1) for l in open(f'/proc/{pid}/status'))
            except OSError:
                continue
            seen[int(pid)] = int(status['Uid'].split()[0])
        return seen
    """
)


def test_a_box_lists_only_its_own_processes(
    pair: tuple[Session, Session], record_property: Any
) -> None:
    """A runs a sleeper whose argv holds a token; B's process table is B's alone: its pid 1
    (root, the box's init) and processes of its own uid, none of A's."""
    a, b = pair
    a.exec("sleep 60 --token=SECRET-ARGV &", timeout_s=5)
    assert b.run(PROCESSES).ok
    seen = value(b, "processes()")
    uid = value(b, "os.getuid()")
    argv = value(b, "[open(f'/proc/{p}/cmdline').read() for p in processes()]")
    record(
        record_property,
        "B sees pid 1 (root) and its own uid only; no argv of A's",
        f"B's processes {seen}; argv {argv}",
    )
    assert seen[1] == 0 and set(seen.values()) == {0, uid}, seen
    assert [pid for pid, owner in seen.items() if owner == 0] == [1], seen
    assert not [line for line in argv if "SECRET-ARGV" in line], argv


def test_absolute_paths_are_the_boxs_own(pair: tuple[Session, Session]) -> None:
    """A and B both write /workspace/x, /tmp/x, /var/tmp/x and /dev/shm/x; each reads its own,
    and the files API and a command see the same."""
    a, b = pair
    paths = ("/workspace/x", "/tmp/x", "/var/tmp/x", "/dev/shm/x")
    for session, who in ((a, "A"), (b, "B")):
        writes = "; ".join(f"open({p!r}, 'w').write({who!r})" for p in paths)
        assert session.run(writes).ok
    for session, who in ((a, "A"), (b, "B")):
        assert value(session, f"[open(p).read() for p in {paths!r}]") == [who] * 4
        assert session.files.read("/workspace/x") == who.encode()
        assert session.exec(["cat", "/tmp/x"]).stdout == who
    assert value(a, "import os\nos.getcwd(), os.environ['HOME'], os.environ['TMPDIR']") == (
        "/workspace",
        "/workspace",
        "/tmp",
    )


def test_a_full_disk_is_the_boxs_own(
    one_worker: Farm, pair: tuple[Session, Session], record_property: Any
) -> None:
    """A fills its disk (all of /workspace, /tmp, /var/tmp and /dev/shm are one budget, its
    ``disk_mb``): A gets ENOSPC everywhere, B writes 4 MB into each of its own."""
    a, b = pair
    fill = textwrap.dedent(
        """
        import errno
        written = 0
        try:
            with open('/workspace/fill', 'wb') as f:
                while True:
                    f.write(b'x' * 2**20)
                    f.flush()
                    written += 1
        except OSError as e:
            stopped = errno.errorcode[e.errno]
        more = []
        for d in ('/tmp', '/var/tmp', '/dev/shm'):
            try:
                open(d + '/more', 'wb').write(b'y' * 2**20)
                more.append('written')
            except OSError as e:
                more.append(errno.errorcode[e.errno])
        written, stopped, more
        """
    )
    written, stopped, more = value(a, fill)
    dirs = ("/workspace", "/tmp", "/var/tmp", "/dev/shm")
    space = "\n".join(f"open('{d}/b', 'wb').write(b'z' * 4 * 2**20)" for d in dirs)
    neighbour = b.run(space)
    record(
        record_property,
        "A stops at its 128 MB disk with ENOSPC everywhere; B's 4 MB writes succeed",
        f"A wrote {written} MB then {stopped}, then {more}; B's writes: {neighbour.kind or 'ok'}",
    )
    assert stopped == "ENOSPC" and 100 <= written <= 128, (written, stopped)
    assert more == ["ENOSPC"] * 3
    assert neighbour.ok, neighbour.error
    with one_worker.session(limits={"disk_mb": 16}) as small:
        written, stopped, _ = value(small, fill)
        assert stopped == "ENOSPC" and written <= 16


NAMESPACE_CALLS = textwrap.dedent(
    """
    import ctypes, errno, os
    libc = ctypes.CDLL(None, use_errno=True)
    def call(result):
        return 'ok' if result == 0 else errno.errorcode[ctypes.get_errno()]
    fd = os.open('/proc/self/ns/net', os.O_RDONLY)
    ({
        'unshare user': call(libc.unshare(0x10000000)),
        'unshare net': call(libc.unshare(0x40000000)),
        'unshare mount': call(libc.unshare(0x00020000)),
        'mount tmpfs': call(libc.mount(b'none', b'/workspace', b'tmpfs', 0, None)),
        'umount': call(libc.umount2(b'/workspace', 2)),
        'setns': call(libc.setns(fd, 0)),
        'clone newpid': call(0 if libc.syscall(56, 0x20000000 | 17, 0, 0, 0, 0) >= 0 else -1),
    }, open('/proc/self/status').read())
    """
)


def test_a_box_cannot_make_or_leave_namespaces_and_holds_no_capability(
    pair: tuple[Session, Session], record_property: Any
) -> None:
    a, _ = pair
    calls, status = value(a, NAMESPACE_CALLS)
    caps = {k: v.strip() for k, v in (line.split(":", 1) for line in status.splitlines())}
    threads = value(a, "import threading\nt = threading.Thread(target=int)\nt.start()\n'ok'")
    forked = a.exec(["sh", "-c", "echo forked"]).stdout
    record(
        record_property,
        "unshare (user, net, mount), mount, umount, setns, clone(CLONE_NEWPID): EPERM; "
        "every capability set empty, seccomp filter on; threads and fork still work",
        f"{calls}; caps {[caps[k] for k in ('CapEff', 'CapPrm', 'CapInh', 'CapBnd', 'CapAmb')]};"
        f" Seccomp {caps['Seccomp']}",
    )
    assert calls == dict.fromkeys(calls, "EPERM"), calls
    for key in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"):
        assert caps[key] == "0000000000000000", (key, caps[key])
    assert caps["Seccomp"] == "2" and caps["NoNewPrivs"] == "1"
    assert threads == "ok" and forked == "forked\n"
    masked = value(  # the box's fresh /proc keeps Docker's masks and read-only paths
        a,
        "import os\n[os.statvfs('/proc/sys').f_flag & os.ST_RDONLY != 0] + "
        "[open(p).read() for p in ('/proc/timer_list', '/proc/sched_debug') "
        "if os.path.exists(p)]",
    )
    assert masked[0] is True and masked[1:] == [""] * (len(masked) - 1), masked
    assert value(a, "import os\nos.listdir('/run/farm')") == []  # the kernel's socket dir


HOG = textwrap.dedent(
    """
    import os, time
    children = []
    try:
        while True:
            pid = os.fork()
            if pid == 0:
                time.sleep(120)
                os._exit(0)
            children.append(pid)
    except OSError as e:
        stopped = e.errno
    len(children)
    """
)


def test_ten_boxes_that_use_all_their_processes_starve_no_neighbour(
    one_worker: Farm, record_property: Any
) -> None:
    """Ten sessions each fork until their box's pids are used up: the budgets add up, so a
    victim still forks and a new session still opens."""
    victim = one_worker.session()
    hogs = [session_on(one_worker, victim.worker) for _ in range(10)]
    try:
        forked = [value(hog, HOG) for hog in hogs]
        ran = victim.exec(["true"])
        fresh = session_on(one_worker, victim.worker)
        opened = value(fresh, "import subprocess\nsubprocess.run(['true']).returncode")
        fresh.close()
        record(
            record_property,
            "ten hogs fork to their box's limit; the victim forks; a new session opens and forks",
            f"hogs forked {forked}; victim's command {ran.returncode}; new session {opened}",
        )
        assert all(55 <= n < 64 for n in forked), forked
        assert ran.returncode == 0 and opened == 0
    finally:
        for session in (*hogs, victim):
            session.close()


def _container(farm: Farm, client: Any) -> Any:
    (worker,) = farm.workers()
    return client.containers.get(worker["sandbox"]["container_id"])


ROOT_VIEW = textwrap.dedent(
    """
    import json, os, sys
    uid = sys.argv[1]
    found, spaces = {}, set()
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            status = dict(l.split(':', 1) for l in open(f'/proc/{pid}/status'))
            space = os.readlink(f'/proc/{pid}/ns/mnt')
        except OSError:
            continue
        spaces.add(space)
        if status['Uid'].split()[0] == uid and int(pid) != os.getpid():
            found[pid] = space
    print(json.dumps([found, sorted(spaces)]))
    """
)


INITS_IN = (  # the pids of root's processes in a given mount namespace
    "import os, sys\nprint(' '.join(p for p in filter(str.isdigit, os.listdir('/proc')) "
    "if os.path.exists(f'/proc/{p}/ns/mnt') and os.readlink(f'/proc/{p}/ns/mnt') == sys.argv[1]))"
)


def test_a_box_ends_with_every_process_and_mount_of_it(
    one_worker: Farm, docker_env: Any, record_property: Any
) -> None:
    """A leaves a daemon (setsid, double fork) and files; once A is closed, the sandbox holds
    no process of A's uid, and A's mount namespace is held by its init alone (kept, emptied,
    for the next box of its number: tests/test_cotenancy.py shows that box finds nothing)."""
    a = one_worker.session()
    a.run(
        "import os, time\nopen('/tmp/left', 'w').write('x')\nif os.fork() == 0:\n    os.setsid()\n"
        "    if os.fork() == 0:\n        while True:\n            time.sleep(0.05)\n    os._exit(0)"
    )
    uid = value(a, "os.getuid()")
    container = _container(one_worker, docker_env)

    def view(user: str) -> tuple[dict[str, str], list[str]]:
        """A's processes (pid -> mount namespace) and the mount namespaces of the processes
        ``user`` may look into (root: its own, the kernel's and every box's pid 1)."""
        done = container.exec_run(["python3", "-c", ROOT_VIEW, str(uid)], user=user)
        assert done.exit_code == 0, done.output.decode()
        found, spaces = json.loads(done.output)
        return found, spaces

    processes, _ = view(f"{uid}:{uid}")
    assert len(processes) >= 2, processes
    (mine,) = set(processes.values())  # all of A's processes: one machine
    assert mine in view("0:0")[1]  # A's pid 1 is root's
    a.close()
    assert wait_for(lambda: view("0:0")[0] == {}, 30), view("0:0")
    left, _ = view("0:0")
    inits = container.exec_run(["python3", "-c", INITS_IN, mine], user="0:0")
    held_by = inits.output.decode().split()
    record(
        record_property,
        "no process of A's uid once A is closed; A's mount namespace held by one root "
        "process alone (its init, kept emptied for the number's next box), or gone",
        f"before {len(processes)} processes in {mine}; after {left}; now held by {held_by}",
    )
    assert inits.exit_code == 0 and len(held_by) <= 1, inits.output


def test_a_box_that_left_files_is_emptied_and_kept_for_its_number(one_worker: Farm) -> None:
    """A leaves files in /tmp, /var/tmp and /dev/shm and a POSIX queue; the next session
    given its box number finds the same machine (its pid 1 started when A's did: the box was
    emptied and kept, not made anew) and nothing of A's in it."""
    started = "open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19]"  # pid 1's start
    a = one_worker.session()
    left = (
        "import ctypes, os, tempfile\nopen('/tmp/left', 'w').write('t')\n"
        "open('/var/tmp/left', 'w').write('v')\nopen('/dev/shm/left', 'w').write('s')\n"
        "tempfile.mkstemp()\n"
        "ctypes.CDLL(None).mq_open(b'/left-mq', os.O_CREAT | os.O_RDWR, 0o600, None) >= 0"
    )
    assert value(a, left) is True
    uid, init = facts(a)["uid"], value(a, started)
    a.close()
    reused: list[Session] = []
    try:
        b = reopen_until_uid(one_worker, uid, reused)
        look = "[sorted(os.listdir(d)) for d in ('/tmp', '/var/tmp', '/dev/shm', '/dev/mqueue')]"
        assert value(b, "import os\n" + look) == [[], [], [], []]
        assert value(b, started) == init  # the same box, emptied
    finally:
        for session in reused:
            session.close()
