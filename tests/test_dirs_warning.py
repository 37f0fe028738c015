"""The process backend says loudly, once, that it separates no uids: the kernel it starts says
it only when nobody did before (``--dirs-warned``: its host warned already, at debug only)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from farm.kernel.wire import auth

READY_TIMEOUT_S = 20.0
WARNING = "isolation 'dirs': sessions get private directories and limits but share one uid"


def kernel_stderr(tmp_path: Path, *extra: str) -> str:
    """What a dirs-isolation kernel logs from its start until it is ready, then stopped."""
    env = {**os.environ, "FARM_KERNEL_TOKEN": auth.new_token(), "FARM_KERNEL_LOG_LEVEL": "INFO"}
    with subprocess.Popen(
        [sys.executable, "-m", "farm.kernel", "--listen", "127.0.0.1:0", "--isolation", "dirs"]
        + ["--workspace", str(tmp_path / "boxes"), "--tmp-root", str(tmp_path / "tmp"), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    ) as kernel:
        try:
            assert kernel.stdout is not None and kernel.stderr is not None
            readable, _, _ = select.select([kernel.stdout], [], [], READY_TIMEOUT_S)
            assert readable, "the kernel did not become ready"
            ready = json.loads(kernel.stdout.readline())  # the kernel's readiness line
            assert ready["event"] == "ready", ready
        finally:
            kernel.terminate()
            _, err = kernel.communicate(timeout=10)
    return err.decode()


@pytest.mark.parametrize(("extra", "warns"), [((), True), (("--dirs-warned",), False)])
def test_the_kernel_warns_unless_its_host_did(
    tmp_path: Path, extra: tuple[str, ...], warns: bool
) -> None:
    logged = kernel_stderr(tmp_path, *extra)
    assert (WARNING in logged) is warns, logged


def test_a_process_that_starts_many_process_sandboxes_is_warned_once() -> None:
    """Two sandboxes (a worker and its replacement, say) in one process: one warning in all,
    the host's, and none from either kernel."""
    script = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "from farm.sandbox.process import ProcessSandbox\n"
        "for _ in range(2):\n"
        "    with ProcessSandbox() as sandbox:\n"
        "        sandbox.health()\n"
    )
    env = {**os.environ, "FARM_KERNEL_LOG_LEVEL": "INFO"}
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("runs UNISOLATED") == 1, run.stderr
    assert WARNING not in run.stderr, run.stderr
