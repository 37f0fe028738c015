"""``farm up`` and ``farm down``: a ``LocalFarm`` run detached until SIGTERM, recorded in a
state file (its pid, broker URL with its password: owner-only, workers, directory). ``farm up``
returns once the file exists (the farm is ready); ``farm down`` stops the recorded process and
removes the file; a file whose process is gone is stale and replaced.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from farm.errors import LocalFarmError
from farm.local.embedded import READY_TIMEOUT_S, LocalFarm
from farm.local.processes import pid_alive
from farm.local.redis_server import write_private


def serve(workers: int, backend: str, state_file: Path) -> None:
    """Run a local farm until SIGTERM/SIGINT, recording it in ``state_file`` (``farm up``)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    local = LocalFarm(workers, backend=backend).start()
    try:
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "pid": os.getpid(),
            "broker_url": local.broker_url,
            "backend": backend,
            "workers": list(local.workers),
            "dir": str(local.dir),
            "started_at": time.time(),
        }
        tmp = state_file.with_suffix(".tmp")
        write_private(tmp, json.dumps(state))  # it holds the broker's password: owner only
        tmp.replace(state_file)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
    finally:
        state_file.unlink(missing_ok=True)
        local.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m farm.local.farm_up")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backend", default="docker")
    parser.add_argument("--state-file", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    serve(args.workers, args.backend, args.state_file)


def start_background(
    workers: int, backend: str, state_file: Path, timeout_s: float = READY_TIMEOUT_S
) -> dict[str, object]:
    """Start ``serve`` detached (``farm up``); return its recorded state once it is ready."""
    if state_file.exists():
        old_pid = int(json.loads(state_file.read_text())["pid"])
        if pid_alive(old_pid):
            raise LocalFarmError(f"a local farm is already up (pid {old_pid}); `farm down`")
        state_file.unlink()
    state_file.parent.mkdir(parents=True, exist_ok=True)
    log_path = state_file.with_suffix(".log")
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "farm.local.farm_up",
                "--workers",
                str(workers),
                "--backend",
                backend,
                "--state-file",
                str(state_file),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    while not state_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.terminate()
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
            raise LocalFarmError(f"the local farm did not start; its log ({log_path}):\n{tail}")
        time.sleep(0.1)  # poll interval of the deadline-bounded readiness check
    state: dict[str, object] = json.loads(state_file.read_text())
    return state


def stop_background(state_file: Path, timeout_s: float = 60.0) -> bool:
    """Stop the farm ``farm up`` started; False when none was recorded."""
    if not state_file.exists():
        return False
    pid = int(json.loads(state_file.read_text())["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        state_file.unlink(missing_ok=True)
        return True
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)  # poll interval of the deadline-bounded shutdown wait
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    state_file.unlink(missing_ok=True)
    return True


if __name__ == "__main__":
    main()
