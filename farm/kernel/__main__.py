"""``python3 -m farm.kernel``: start the kernel.

The token comes from ``FARM_KERNEL_TOKEN``, ``--token-file`` (read, then deleted) or
``--token-fd``; user code can read it neither from the environment, memory nor ``/proc`` (a
clean re-exec, the zygote forked first, a non-dumpable supervisor). When listening, one JSON
line ``{"event": "ready", "listen": ...}`` goes to stdout: the readiness signal to poll for.
Why: docs/design/kernel.md.
"""

from __future__ import annotations

import argparse

# Warm imports: the zygote inherits them, so session processes start without importing.
import ast  # noqa: F401
import asyncio
import collections  # noqa: F401
import dataclasses  # noqa: F401
import datetime  # noqa: F401
import functools  # noqa: F401
import itertools  # noqa: F401
import json
import logging
import math  # noqa: F401
import os
import random  # noqa: F401
import re  # noqa: F401
import subprocess  # noqa: F401
import sys
import traceback  # noqa: F401
import typing  # noqa: F401

from .boxes import namespaces, preload, zygote
from .boxes.pool import BoxPool, Caps, Isolation, LimitsError
from .boxes.uids import prctl
from .repl import cell_exec  # noqa: F401 - imported here: every forked session shares it
from .supervisor.server import KernelServer, serve_forever
from .wire import auth
from .wire.framing import DEFAULT_MAX_FRAME
from .wire.protocol import Preloaded

TOKEN_ENV = "FARM_KERNEL_TOKEN"
PR_SET_DUMPABLE = 4
SPARE_BOXES = 64  # boxes being reset after their session closed do not count against sessions
REQUIRED_CAPS = {
    0: "CAP_CHOWN",
    5: "CAP_KILL",
    6: "CAP_SETGID",
    7: "CAP_SETUID",
    8: "CAP_SETPCAP",
}
NAMESPACE_CAPS = {
    namespaces.CAP_NET_ADMIN: "CAP_NET_ADMIN",
    namespaces.CAP_SYS_ADMIN: "CAP_SYS_ADMIN",
}


# A box's limits the host may preset (``--box-memory-mb`` ...); a session asks for others.
BOX_DEFAULTS = {
    "memory_mb": "data per process, MB",
    "pids": "processes and threads",
    "fsize_mb": "largest file, MB",
    "nofile": "open files per process",
    "disk_mb": "private disk (/workspace, /tmp, /var/tmp, /dev/shm together), MB",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m farm.kernel", description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--listen", metavar="HOST:PORT", help="listen on TCP (port 0: any)")
    where.add_argument("--unix", metavar="PATH", help="listen on a Unix socket")
    parser.add_argument("--token-file", help="read the token from this file, then delete it")
    parser.add_argument("--token-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--grace-s",
        type=float,
        default=2.0,
        help="how long an interrupted cell may take to stop before a kill",
    )
    parser.add_argument("--max-sessions", type=int, default=256)
    parser.add_argument("--max-connections", type=int, default=1024)
    parser.add_argument("--max-frame", type=int, default=DEFAULT_MAX_FRAME)
    parser.add_argument(
        "--workspace",
        default=None,
        help="where the boxes' workspaces go, box-N each (default: the working dir)",
    )
    parser.add_argument(
        "--tmp-root", default="/tmp", help="where the boxes' temporary dirs go, box-N each"
    )
    parser.add_argument(
        "--isolation",
        choices=["namespaces", "uids", "dirs"],
        default="namespaces" if os.geteuid() == 0 else "dirs",
        help="namespaces: each box is a uid plus mount, pid, network, IPC and UTS namespaces "
        "(also needs CAP_SYS_ADMIN and CAP_NET_ADMIN; falls back to uids where the host "
        "forbids them); uids: each box runs as a uid of its own (needs root with CAP_SETUID, "
        "SETGID, SETPCAP, CHOWN, KILL); dirs: private directories only, one uid for all",
    )
    parser.add_argument(
        "--require-namespaces",
        action="store_true",
        help="refuse to start where boxes cannot have namespaces, instead of falling back",
    )
    parser.add_argument(
        "--disk-mb",
        type=int,
        help="room for the boxes' private disks together, MB (tmpfs: in the sandbox's memory)",
    )
    parser.add_argument("--box-uid-base", type=int, default=20000, help="box N runs as uid base+N")
    for name, what in BOX_DEFAULTS.items():
        flag = "--box-" + name.replace("_", "-")
        parser.add_argument(flag, type=int, dest=f"box_{name}", help=f"a box's default {what}")
    # The host warned that dirs isolation separates no uids: the kernel says it at debug only.
    parser.add_argument("--dirs-warned", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--tool-output-chars",
        type=int,
        default=3000,
        help="tool outputs are clipped head+tail to this many characters",
    )
    parser.add_argument(
        "--egress-ca",
        help="the CA bundle (a path in the sandbox) that boxes with egress are told to trust",
    )
    parser.add_argument(
        "--preload",
        action="append",
        default=[],
        metavar="MODULE",
        help=f"import MODULE before forking boxes (repeatable; also those {preload.IMAGE_FILE} "
        "names, which an image's build writes)",
    )
    parser.add_argument(preload.REFUSED_FLAG, help=argparse.SUPPRESS)
    parser.add_argument("--log-level", default=os.environ.get("FARM_KERNEL_LOG_LEVEL", "INFO"))
    return parser.parse_args(argv)


def prepare_shared_dirs(pool: BoxPool, *, warned: bool = False) -> None:
    """Check that boxes can get uids of their own, and close the shared directories: a box
    may create its own entries in them (``/tmp``: sticky) but list nobody's. ``dirs``
    isolation makes the roots only, and says loudly what it cannot do, unless whoever started
    the kernel has said it already (``warned``: the process backend warns once per process,
    not at every sandbox it starts)."""
    os.makedirs(pool.workspace_root, exist_ok=True)
    os.makedirs(pool.tmp_root, exist_ok=True)
    if pool.isolation == "dirs":
        logging.getLogger("farm.kernel").log(
            logging.DEBUG if warned else logging.WARNING,
            "isolation 'dirs': sessions get private directories and limits but share one "
            "uid, so they can read and signal each other; use the docker backend to separate them",
        )
        return
    missing = [name for bit, name in REQUIRED_CAPS.items() if not _effective_caps() >> bit & 1]
    if missing:
        raise SystemExit(
            f"isolation 'uids' needs the capabilities {', '.join(missing)} (start the sandbox "
            "as root with them, or run --isolation dirs)"
        )
    os.chmod(pool.workspace_root, 0o711)
    # Docker gives a tmpfs the mode of the image's directory under it (1777), whatever its
    # mount options say: each is closed here, by its owner.
    log = logging.getLogger("farm.kernel")
    for path in (pool.tmp_root, "/var/tmp", "/dev/shm", namespaces.QUEUES):
        try:
            os.chmod(path, 0o1733)
        except FileNotFoundError:  # nothing to list: the root has none (a bare host)
            if path == namespaces.QUEUES and pool.isolation == "uids":
                log.warning(
                    "no %s here: the POSIX queues a uid box leaves cannot be found or removed, "
                    "and a later session with its uid may open them",
                    path,
                )
            elif path == namespaces.QUEUES:
                log.info(
                    "no %s here: each box mounts its queues where its init alone sees them", path
                )
        except OSError as exc:  # not ours: boxes keep it as the image made it
            log.warning("cannot close %s to listing: %s", path, exc)


def choose_isolation(args: argparse.Namespace) -> tuple[Isolation, str | None]:
    """The isolation boxes get here, and why it is less than asked (``None``: as asked).
    Namespaces are tried as a box would be made; where the host forbids them the kernel
    falls back to uid boxes and says so loudly, or refuses to start if told to."""
    isolation: Isolation = args.isolation
    if isolation != "namespaces":
        return isolation, None
    missing = [name for bit, name in NAMESPACE_CAPS.items() if not _effective_caps() >> bit & 1]
    why = f"no {' and no '.join(missing)}" if missing else namespaces.probe()
    if why is None:
        return isolation, None
    if args.require_namespaces:
        raise SystemExit(f"boxes cannot have namespaces here ({why}) and they are required")
    logging.getLogger("farm.kernel").error(
        "BOXES HAVE NO NAMESPACES: %s. Falling back to uid boxes: sessions share the "
        "loopback network, the disk and the process table (README, Security model)",
        why,
    )
    return "uids", why


def _preload(args: argparse.Namespace, argv: list[str]) -> Preloaded:
    """The image's warm imports and ``--preload``'s, here: before the zygote is forked (every
    box inherits them) and before the token is read (none of them ever holds it)."""
    names, unreadable = preload.image_modules()
    names = list(dict.fromkeys([*names, *args.preload]))
    record, restart = preload.run(names, args.preload_refused)
    if restart is not None:
        preload.restart_without(argv, restart)
    if unreadable is not None:
        record["failed"][preload.IMAGE_FILE] = unreadable
    return record


def _effective_caps() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


MALLOC_TUNING = "GLIBC_TUNABLES"  # the host's (``sandbox.backend.KERNEL_ENV``), the kernel's own


def _reexec_without_env_token(argv: list[str]) -> None:
    token = os.environ.pop(TOKEN_ENV)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, token.encode())
    os.close(write_fd)
    os.set_inheritable(read_fd, True)
    args = [sys.executable, "-m", "farm.kernel", *argv, "--token-fd", str(read_fd)]
    os.execve(sys.executable, args, dict(os.environ))


def _read_token(args: argparse.Namespace) -> str:
    if args.token_fd is not None:
        with os.fdopen(args.token_fd, "rb") as f:
            return auth.check_token(f.read().decode())
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read()
        try:
            os.unlink(args.token_file)
        except OSError as exc:
            logging.getLogger("farm.kernel").warning("could not delete the token file: %s", exc)
        return auth.check_token(token)
    raise SystemExit(f"no token: set {TOKEN_ENV} or pass --token-file")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if TOKEN_ENV in os.environ:
        _reexec_without_env_token(argv)
    # glibc read its tuning at this process's start (huge pages for the heap: cheaper forks of
    # the zygote, sessions and checkpoints, which inherit it); what boxes exec does not
    os.environ.pop(MALLOC_TUNING, None)
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s pid=%(process)d %(message)s",
    )
    host = port = None
    if args.listen:
        host, _, port_text = args.listen.rpartition(":")
        port = int(port_text)
    isolation, fallback = choose_isolation(args)
    pool = BoxPool(
        isolation=isolation,
        workspace_root=os.path.realpath(args.workspace or os.getcwd()),
        tmp_root=os.path.realpath(args.tmp_root),
        uid_base=args.box_uid_base,
        count=args.max_sessions + SPARE_BOXES,
    )
    preset = {name: value for name in BOX_DEFAULTS if (value := getattr(args, f"box_{name}"))}
    try:
        caps = Caps.of_this_sandbox(preset, disk_mb=args.disk_mb)
    except LimitsError as exc:
        raise SystemExit(f"the boxes' default limits do not fit this sandbox: {exc}") from None
    pool.caps = caps
    prepare_shared_dirs(pool, warned=args.dirs_warned)
    socket_dir = os.path.dirname(os.path.realpath(args.unix)) if args.unix else "/"
    if isolation == "namespaces" and socket_dir not in namespaces.NOT_HIDDEN:
        namespaces.HIDDEN.append(socket_dir)  # boxes see an empty directory there
    preloaded = _preload(args, argv)
    _, zygote_sock = zygote.start(isolation)
    if isolation == "namespaces":  # only the zygote (and a box's init, briefly) keeps them
        namespaces.drop_capabilities(namespaces.CAP_SYS_ADMIN, namespaces.CAP_NET_ADMIN)
    token = _read_token(args)
    prctl(PR_SET_DUMPABLE, 0)
    server = KernelServer(
        token,
        zygote_sock,
        grace_s=args.grace_s,
        max_sessions=args.max_sessions,
        max_connections=args.max_connections,
        max_frame=args.max_frame,
        pool=pool,
        caps=caps,
        tool_limit=args.tool_output_chars,
        fallback=fallback,
        egress_ca=args.egress_ca,
        preloaded=preloaded,
    )

    def ready(where: str) -> None:
        print(json.dumps({"event": "ready", "listen": where, "pid": os.getpid()}), flush=True)

    asyncio.run(serve_forever(server, host=host or None, port=port, unix=args.unix, on_ready=ready))


if __name__ == "__main__":
    main()
