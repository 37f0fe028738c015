"""The Inspect AI provider on real Docker, through a real embedded farm that its ``task_init``
starts (with its default image, ``inspect``: the sandbox image plus procps, built if missing):

- Inspect's own conformance suite (``inspect_ai.util._sandbox.self_check``: 44 checks, the ones
  its Docker, Kubernetes, Proxmox and Modal providers run), collected by the star import; a
  check farm cannot pass by design is a strict xfail naming why;
- what the suite leaves out: output over the cap, concurrent commands, background processes,
  users, big commands up to Linux's limits, a missing cwd, ``inspect sandbox cleanup``, config
  forms, a broker password refused when run but not when a log is read, the box's own
  directory for Inspect's injected tools;
- offline evals with Inspect's mock model, in a fresh interpreter that finds the provider
  through its entry point, whose logs show the tools' output from the box (injected tools
  too, in two samples at once in one sandbox).

One farm and one sample box serve the module (the checks clean up after themselves), as in
Inspect's own runner; at the end the farm must have removed every container it started.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest
from inspect_ai import Task, eval_async
from inspect_ai.dataset import Sample
from inspect_ai.log import (
    EvalConfig,
    EvalDataset,
    EvalLog,
    EvalSpec,
    read_eval_log_async,
    write_eval_log_async,
)
from inspect_ai.util import (
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxEnvironmentLimits,
    SandboxEnvironmentSpec,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
)
from inspect_ai.util._sandbox._cli import SANDBOX_TOOLS_DIR
from inspect_ai.util._sandbox.limits import override_max_exec_output_size
from inspect_ai.util._sandbox.self_check import *  # noqa: F403  (the 44 checks)

from farm.errors import InvalidRequest
from farm.integrations.inspect import FarmSandboxConfig, FarmSandboxEnvironment, FarmSandboxLimits
from farm.integrations.inspect.config import resolve_config
from farm.integrations.inspect.farms import LEDGER, FarmHandle
from farm.integrations.inspect.provider import FARMS
from farm.local.processes import pid_alive
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parent.parent
# A command with no timeout of Inspect's gets this one here, so that a command that never
# ends fails the check that ran it instead of the whole run.
CONFIG = FarmSandboxConfig(workers=1, timeout_s=120)
XFAILS = {
    "test_exec_as_user": (
        "farm runs a box's commands only as the box's own non-root uid: there is no root to "
        "run adduser as, and no other user to switch to (README, Security model)"
    ),
}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def farm_handle(inspect_image: str, docker_env: Any) -> AsyncIterator[FarmHandle]:
    """The provider's farm, from ``task_init`` to ``task_cleanup``, which must leave no
    container behind."""
    await FarmSandboxEnvironment.task_init("startup", CONFIG)
    handle = FARMS.get(CONFIG)
    workers = list(handle.farm.local_farm.workers)
    try:
        yield handle
    finally:
        await FarmSandboxEnvironment.task_cleanup("shutdown", CONFIG, True)

    def containers() -> list[Any]:
        return [
            container
            for worker in workers
            for container in docker_env.containers.list(
                all=True, filters={"label": f"farm.owner={worker}"}
            )
        ]

    assert wait_for(lambda: not containers(), 30), "the embedded farm left containers"


@pytest.fixture(scope="module")
async def farm_env(farm_handle: FarmHandle) -> AsyncIterator[FarmSandboxEnvironment]:
    envs = await FarmSandboxEnvironment.sample_init("selfcheck", CONFIG, {})
    try:
        yield envs["default"].as_type(FarmSandboxEnvironment)
    finally:
        await FarmSandboxEnvironment.sample_cleanup("selfcheck", CONFIG, envs, False)


@pytest.fixture
def sandbox_env(request: pytest.FixtureRequest, farm_env: SandboxEnvironment) -> SandboxEnvironment:
    """The suite's fixture: the module's box, with the strict xfails of ``XFAILS``."""
    reason = XFAILS.get(request.node.originalname)
    if reason:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    return farm_env


def recorded(handle: FarmHandle) -> set[str]:
    return {str(key) for key in handle.farm.registry.redis.hkeys(LEDGER)}


# --- beyond the suite -------------------------------------------------------------------------


async def test_output_over_the_cap_raises_with_its_tail(farm_env: FarmSandboxEnvironment) -> None:
    with override_max_exec_output_size(4096), pytest.raises(OutputLimitExceededError) as caught:
        await farm_env.exec(["sh", "-c", "head -c 20000 /dev/zero | tr '\\0' a; echo; echo end"])
    assert "limit of 4 KiB was exceeded" in str(caught.value)
    assert caught.value.truncated_output is not None
    assert caught.value.truncated_output.endswith("a\nend\n")


MIB = 1024 * 1024


async def test_output_of_inspects_full_limit_on_both_streams_comes_back_whole(
    farm_env: FarmSandboxEnvironment,
) -> None:
    """Inspect's default cap is 10 MiB per stream (``SandboxEnvironmentLimits``); its Docker
    provider returns up to that much of each. Farm returns both whole, and one byte more is
    ``OutputLimitExceededError`` with the output's tail (what Inspect documents a provider may
    raise)."""
    limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
    assert limit == 10 * MIB  # the default this test is about (no INSPECT_SANDBOX_* override)
    both = f"head -c {limit} /dev/zero | tr '\\0' a; head -c {limit} /dev/zero | tr '\\0' b >&2"
    result = await farm_env.exec(["sh", "-c", both], timeout=120)
    assert result.success, result.returncode
    assert (len(result.stdout), len(result.stderr)) == (limit, limit)
    assert result.stdout == "a" * limit and result.stderr == "b" * limit
    over = f"head -c {limit + 1} /dev/zero | tr '\\0' a"
    with pytest.raises(OutputLimitExceededError) as caught:
        await farm_env.exec(["sh", "-c", over], timeout=120)
    assert "limit of 10 MiB was exceeded" in str(caught.value)
    assert caught.value.truncated_output is not None
    assert caught.value.truncated_output.endswith("a" * 1000)


async def test_read_file_of_inspects_full_limit_works(farm_env: FarmSandboxEnvironment) -> None:
    """``read_file`` returns a file of exactly Inspect's read limit (100 MiB) byte for byte;
    one byte more is ``OutputLimitExceededError``. The file sits in the box's workspace, a
    256 MiB tmpfs every box of the sandbox shares (``FARM_SANDBOX_WORKSPACE_MB``): 100 MiB and
    a byte fit beside the module's other boxes, and the file is removed at the end."""
    limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
    assert limit == 100 * MIB  # the default this test is about
    made = await farm_env.exec(
        ["sh", "-c", f"head -c {limit} /dev/urandom > big.bin && sha256sum big.bin"], timeout=120
    )
    try:
        assert made.success, made.stderr
        data = await farm_env.read_file("big.bin", text=False)
        assert len(data) == limit
        assert hashlib.sha256(data).hexdigest() == made.stdout.split()[0]
        del data
        assert (await farm_env.exec(["sh", "-c", "printf x >> big.bin"])).success
        with pytest.raises(OutputLimitExceededError) as caught:
            await farm_env.read_file("big.bin", text=False)
        assert "limit of 100 MiB was exceeded" in str(caught.value)
    finally:
        assert (await farm_env.exec(["rm", "-f", "big.bin"])).success


async def test_commands_run_concurrently_in_one_box(farm_env: FarmSandboxEnvironment) -> None:
    """Each command waits for the other's file: run one after the other, both would fail."""
    wait = (
        "touch {mine}; for i in $(seq 300); do [ -e {other} ] && exit 0; sleep 0.05; done; exit 1"
    )
    results: dict[str, Any] = {}

    async def run(name: str, mine: str, other: str) -> None:
        command = wait.format(mine=mine, other=other)
        results[name] = await farm_env.exec(["sh", "-c", command], timeout=30)

    async with anyio.create_task_group() as group:
        group.start_soon(run, "first", "concurrent.a", "concurrent.b")
        group.start_soon(run, "second", "concurrent.b", "concurrent.a")
    assert results["first"].success and results["second"].success
    assert (await farm_env.exec(["rm", "concurrent.a", "concurrent.b"])).success


async def test_a_background_process_outlives_its_command(farm_env: FarmSandboxEnvironment) -> None:
    started = await farm_env.exec(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"])
    pid = started.stdout.strip()
    assert pid.isdecimal()
    assert (await farm_env.exec(["kill", "-0", pid])).success
    assert (await farm_env.exec(["kill", pid])).success


async def test_commands_run_only_as_the_box_own_user(farm_env: FarmSandboxEnvironment) -> None:
    uid = (await farm_env.exec(["id", "-u"])).stdout.strip()
    assert uid.isdecimal() and uid != "0"
    assert (await farm_env.exec(["id", "-u"], user=uid)).stdout.strip() == uid
    for user in ("root", "0", "nobody"):
        with pytest.raises(SandboxUserUnsupportedError):
            await farm_env.exec(["id", "-u"], user=user)
    unknown = await farm_env.exec(["id", "-u"], user="nonexistent")
    assert (unknown.returncode, unknown.stderr) == (
        126,
        "unable to find user nonexistent: no matching entries in passwd file\n",
    )


async def test_big_commands_run_as_given_up_to_linux_limits(
    farm_env: FarmSandboxEnvironment,
) -> None:
    """An argv and env of megabytes run as they are (the suite's check sends 1 MiB of argv);
    one string over Linux's 128 KiB per argument, or an argv past ``ARG_MAX``, is a failed
    command saying why, and the box goes on."""
    big = "x" * 100_000
    script = 'printf "%s %s" "$#" "${#BIG}"'
    result = await farm_env.exec(["sh", "-c", script, "sh", *[big] * 10], env={"BIG": big})
    assert (result.returncode, result.stdout) == (0, "10 100000"), result
    missing = await farm_env.exec(["no-such-program", big])
    assert missing.returncode == 127
    assert missing.stderr == "farm: no-such-program: command not found\n"
    for argv, env in (
        (["true", "x" * 200_000], {}),
        (["true"], {"BIG": "x" * 200_000}),
        (["true", *[big] * 40], {}),
    ):
        refused = await farm_env.exec(argv, env=env)
        assert not refused.success and refused.returncode == 126, refused
        assert "Argument list too long" in refused.stderr, refused
    assert (await farm_env.exec(["true"])).success


async def test_a_missing_cwd_fails_the_command(farm_env: FarmSandboxEnvironment) -> None:
    result = await farm_env.exec(["ls"], cwd="no-such-dir")
    assert result.returncode == 126
    assert "no-such-dir" in result.stderr


async def test_cleanup_closes_a_box_for_good(farm_handle: FarmHandle) -> None:
    """``inspect sandbox cleanup farm ID`` closes that box: recorded no more, gone from the
    farm, and a command there is ``SandboxUnavailableError``; ``sample_cleanup`` after it is
    harmless."""
    envs = await FarmSandboxEnvironment.sample_init("cleanup", CONFIG, {})
    box = envs["default"].as_type(FarmSandboxEnvironment)
    assert (await box.exec(["true"])).success
    assert box.session.id in recorded(farm_handle)
    await FarmSandboxEnvironment.cli_cleanup(box.session.id)
    assert box.session.id not in recorded(farm_handle)
    registry = farm_handle.farm.registry
    assert wait_for(lambda: registry.session(box.session.id) is None, 10)
    with pytest.raises(SandboxUnavailableError):
        await box.exec(["true"])
    await FarmSandboxEnvironment.sample_cleanup("cleanup", CONFIG, envs, True)


KILLED_EVAL = """
import json, sys
import anyio
from farm.integrations.inspect import FarmSandboxConfig, FarmSandboxEnvironment
from farm.integrations.inspect.provider import FARMS
from farm.local.processes import pid_alive

async def main() -> None:
    config = FarmSandboxConfig(workers=1)
    await FarmSandboxEnvironment.task_init("killed", config)
    await FarmSandboxEnvironment.sample_init("killed", config, {})  # a box open in the sandbox
    print(json.dumps(list(FARMS.get(config).farm.local_farm.workers)), flush=True)
    sys.stdin.read()  # until the test kills this process

anyio.run(main)
"""


def farm_containers(docker_env: Any, owners: list[str]) -> list[Any]:
    return [
        container
        for owner in owners
        for container in docker_env.containers.list(
            all=True, ignore_removed=True, filters={"label": f"farm.owner={owner}"}
        )
    ]


async def test_cleanup_removes_the_containers_of_an_eval_killed_with_its_farm(
    farm_handle: FarmHandle, docker_env: Any, tmp_path: Path
) -> None:
    """An eval killed with every process it started (a cancelled CI job, a cgroup's OOM kill:
    SIGKILL for all, so no worker removes its sandbox) leaves its embedded farm's containers in
    Docker: ``inspect sandbox cleanup farm``, in a process of its own, removes them (and the
    farm's directory), and leaves a live farm's alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_BROKER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(installed_entry_points(tmp_path / "site")), str(ROOT)])
    workers: list[str] = []
    eval_pid = 0
    try:
        with (tmp_path / "eval.stderr").open("wb") as stderr:
            process = await anyio.open_process(
                [sys.executable, "-c", KILLED_EVAL],
                env=env,
                cwd=ROOT,
                stderr=stderr,
                start_new_session=True,
            )
        async with process:
            eval_pid = process.pid
            assert process.stdout is not None
            line = b""
            with anyio.fail_after(240):
                while not line.endswith(b"\n"):
                    line += await process.stdout.receive(1)
            workers = json.loads(line)
            left = farm_containers(docker_env, workers)
            assert left and all(c.status == "running" for c in left)
            pids = [int(c.labels["farm.pid"]) for c in left]
            for pid in pids:  # the eval's workers, then the eval
                os.kill(pid, signal.SIGKILL)
            process.kill()
            await process.wait()
        assert wait_for(lambda: not any(pid_alive(pid) for pid in pids), 30), "workers live on"
        assert farm_containers(docker_env, workers), "Docker keeps a dead farm's containers"
        live_owners = list(farm_handle.farm.local_farm.workers)
        live = {c.id for c in farm_containers(docker_env, live_owners)}
        assert live
        with anyio.fail_after(120):
            run = await anyio.run_process(
                [sys.executable, "-m", "inspect_ai", "sandbox", "cleanup", "farm"],
                cwd=tmp_path,
                env=env,
                check=False,
            )
        assert run.returncode == 0, run.stderr.decode()[-3000:]
        assert farm_containers(docker_env, workers) == []
        assert {c.id for c in farm_containers(docker_env, live_owners)} == live  # a live farm's
        assert owned_dirs(eval_pid) == []
    finally:
        for container in farm_containers(docker_env, workers):
            container.remove(force=True)
        for path in owned_dirs(eval_pid):
            shutil.rmtree(path, ignore_errors=True)


def owned_dirs(pid: int) -> list[Path]:
    """The local farm directories ``pid`` made (``farm.local.embedded``:
    ``farm-local-*/owner.pid``)."""
    return [
        owner.parent
        for owner in Path(tempfile.gettempdir()).glob("farm-local-*/owner.pid")
        if pid and owner.read_text().strip() == str(pid)
    ]


def test_configs_come_as_models_dicts_and_files(tmp_path: Path) -> None:
    spec = SandboxEnvironmentSpec("farm", {"workers": 1, "limits": {"memory_mb": 512}})
    wanted = FarmSandboxConfig(workers=1, limits=FarmSandboxLimits(memory_mb=512))
    assert spec.config == wanted
    assert len({spec, SandboxEnvironmentSpec("farm", wanted)}) == 1  # hashable, equal
    path = tmp_path / "farm.yaml"
    path.write_text("image: default\nworkers: 3\n")
    assert resolve_config(str(path)) == FarmSandboxConfig(image="default", workers=3)
    path.write_text("image: default\nwrokers: 3\n")
    with pytest.raises(InvalidRequest, match="wrokers"):
        resolve_config(str(path))


SECRET = "s3cret-4711"
# Brokers nobody listens on: a refusal that failed would fail fast, connecting there.
PASSWORD_URLS = [f"redis://:{SECRET}@127.0.0.1:9/0", f"rediss://farm:{SECRET}@localhost:9/1"]


def said_safely(caught: pytest.ExceptionInfo[InvalidRequest]) -> None:
    said = str(caught.value)
    assert "must not hold the broker's password" in said, said
    assert "FARM_BROKER_PASSWORD" in said and SECRET not in said, said


@pytest.mark.parametrize("url", PASSWORD_URLS)
@pytest.mark.parametrize("form", ["model", "task-dict", "file"])
async def test_a_broker_url_holding_a_password_is_refused_without_showing_it(
    url: str, form: str, tmp_path: Path
) -> None:
    """Inspect writes the sandbox config into the eval log: a password there would travel with
    every shared log. ``task_init`` and ``sample_init`` refuse every form of config holding
    one, before reaching any farm, pointing to FARM_BROKER_PASSWORD, and no error shows it."""
    path = tmp_path / "farm.yaml"
    path.write_text(f"broker_url: {url}\n")
    config: Any = {
        "model": FarmSandboxConfig(broker_url=url),
        "task-dict": SandboxEnvironmentSpec("farm", {"broker_url": url}).config,  # as a Task
        "file": str(path),
    }[form]
    with pytest.raises(InvalidRequest) as caught:
        await FarmSandboxEnvironment.task_init("refused", config)
    said_safely(caught)
    with pytest.raises(InvalidRequest) as caught:
        await FarmSandboxEnvironment.sample_init("refused", config, {})
    said_safely(caught)


async def test_an_eval_with_a_password_in_its_broker_url_stops_before_writing_a_log(
    tmp_path: Path,
) -> None:
    """Inspect runs ``task_init`` before it writes the eval's log: the refusal ends the eval,
    and no file of the log directory holds the password."""
    task = Task(
        dataset=[Sample(input="never run")],
        sandbox=("farm", {"broker_url": PASSWORD_URLS[0]}),  # type: ignore[arg-type]
    )
    logs = tmp_path / "logs"
    with pytest.raises(InvalidRequest) as caught:
        await eval_async(task, model="mockllm/model", log_dir=str(logs))
    said_safely(caught)
    files = [p for p in logs.rglob("*") if p.is_file()] if logs.exists() else []
    assert not any(SECRET.encode() in p.read_bytes() for p in files), files


@pytest.mark.parametrize("fmt", ["eval", "json"])
async def test_a_log_holding_a_password_in_its_broker_url_loads(fmt: str, tmp_path: Path) -> None:
    """A log written before the refusal existed (its config holding the password) still loads:
    Inspect validates the sandbox config again when it reads a log (``SandboxEnvironmentSpec``
    calls the provider's ``config_deserialize``). Running with that config is refused."""
    url = PASSWORD_URLS[0]
    spec = EvalSpec(
        created="2025-01-01T00:00:00+00:00",
        task="old",
        dataset=EvalDataset(),
        model="mockllm/model",
        config=EvalConfig(),
        sandbox=SandboxEnvironmentSpec("farm", {"broker_url": url}),
    )
    path = tmp_path / f"old.{fmt}"
    await write_eval_log_async(EvalLog(eval=spec), str(path))
    log = await read_eval_log_async(str(path))
    assert log.eval.sandbox == SandboxEnvironmentSpec("farm", FarmSandboxConfig(broker_url=url))
    assert log.eval.sandbox is not None
    with pytest.raises(InvalidRequest) as caught:
        await FarmSandboxEnvironment.task_init("old", log.eval.sandbox.config)
    said_safely(caught)


def test_a_broker_url_without_a_password_is_kept() -> None:
    for url in ("redis://10.0.0.5:6379/0", "rediss://farm@redis:6380/1"):  # an ACL user's too
        assert FarmSandboxConfig(broker_url=url).broker_url == url


def test_the_inspect_images_sandboxes_have_room_for_eight_samples_tools() -> None:
    """Each sample that uses Inspect's injected tools keeps ~32 MiB in /var/tmp and ~33 MiB in
    their server (docs/design/inspect-provider.md): the inspect image's sandboxes default to
    room for eight, explicit settings still win."""
    from farm.settings import FarmSettings

    limits = FarmSettings(image="inspect").limits
    assert (limits.tmp_mb, limits.memory_mb) == (272, 1024)
    explicit = FarmSettings(image="inspect", limits={"tmp_mb": 64}).limits  # type: ignore[arg-type]
    assert (explicit.tmp_mb, explicit.memory_mb) == (64, 1024)


def test_farm_imports_neither_framework() -> None:
    """The integrations are optional: farm's client and CLI import neither framework."""
    code = (
        "import sys, farm.client, farm.cli.main, farm.sweep; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'inspect_ai', 'smolagents'}))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert (run.returncode, run.stdout) == (0, "[]\n"), run.stderr


# --- an eval, end to end ----------------------------------------------------------------------


def installed_entry_points(directory: Path) -> Path:
    """The metadata ``pip install`` writes for this checkout (its name, version and the
    ``inspect_ai`` entry point of pyproject.toml), first on a fresh interpreter's path: it
    finds this checkout's provider whatever farm the environment installed."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dist = directory / f"farm-{project['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: farm\nVersion: {project['version']}\n"
    )
    points = project["entry-points"]["inspect_ai"]
    lines = ["[inspect_ai]", *(f"{name} = {target}" for name, target in points.items())]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return directory


async def test_an_offline_eval_runs_its_tools_in_farm(
    farm_env: FarmSandboxEnvironment, farm_handle: FarmHandle, tmp_path: Path
) -> None:
    """``tests/inspect_eval.py``: mock model, ``bash`` and ``python`` tools,
    ``sandbox=("farm", {"broker_url": URL})`` naming this module's farm by a URL without its
    password, which the eval's process has in ``FARM_BROKER_PASSWORD``: the log records the
    config, and the password appears nowhere in the log file."""
    parts = urlsplit(farm_handle.farm.settings.broker_url)
    password = parts.password
    assert password, "the embedded farm's broker requires a password"
    url = urlunsplit(parts._replace(netloc=f"{parts.hostname}:{parts.port}"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_BROKER_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(installed_entry_points(tmp_path / "site")), str(ROOT)]),
        FARM_BROKER_PASSWORD=password,
    )
    script = ROOT / "tests" / "inspect_eval.py"
    with anyio.fail_after(280):
        run = await anyio.run_process(
            [sys.executable, str(script), str(tmp_path / "logs"), url],
            cwd=tmp_path,
            env=env,
            check=False,
        )
    assert run.returncode == 0, run.stderr.decode()[-4000:]
    summary = json.loads(run.stdout.decode().splitlines()[-1])
    assert summary["farm_imported_by_the_task"] is False
    log = await read_eval_log_async(summary["location"])
    assert log.status == "success", log.error
    assert log.eval.sandbox == SandboxEnvironmentSpec("farm", FarmSandboxConfig(broker_url=url))
    with zipfile.ZipFile(summary["location"]) as archive:  # every file of the log, unpacked
        for member in archive.namelist():
            assert password.encode() not in archive.read(member), member
    assert log.samples is not None
    sample = log.samples[0]
    tools = [m for m in sample.messages if m.role == "tool"]
    assert [m.function for m in tools] == ["bash", "python", "bash"]
    hello, computed, slow = tools
    echoed, uid, placed = hello.text.splitlines()
    assert (echoed, placed) == ("hello from farm", "placed by Sample.files")
    assert uid.isdecimal() and uid != "0"
    assert computed.text == "x=42 in /workspace\n"  # the sample's box: its own /workspace
    assert slow.error is not None and slow.error.type == "timeout"
    assert "started" in slow.text and "never" not in slow.text
    assert log.results is not None
    assert log.results.scores[0].metrics["accuracy"].value == 1.0
    assert recorded(farm_handle) == {farm_env.session.id}  # the eval's box was closed


async def run_eval_script(farm_handle: FarmHandle, tmp_path: Path, mode: str) -> EvalLog:
    """The log of ``tests/inspect_eval.py LOG_DIR URL MODE`` run in a fresh interpreter against
    this module's farm (by a URL without its password, which goes in FARM_BROKER_PASSWORD)."""
    parts = urlsplit(farm_handle.farm.settings.broker_url)
    url = urlunsplit(parts._replace(netloc=f"{parts.hostname}:{parts.port}"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_BROKER_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(installed_entry_points(tmp_path / "site")), str(ROOT)]),
        FARM_BROKER_PASSWORD=str(parts.password),
    )
    script = ROOT / "tests" / "inspect_eval.py"
    with anyio.fail_after(280):
        run = await anyio.run_process(
            [sys.executable, str(script), str(tmp_path / "logs"), url, mode],
            cwd=tmp_path,
            env=env,
            check=False,
        )
    assert run.returncode == 0, run.stderr.decode()[-4000:]
    return await read_eval_log_async(json.loads(run.stdout.decode().splitlines()[-1])["location"])


def var_tmp(container: Any) -> list[str]:
    """What the sandbox's ``/var/tmp`` holds, as root lists it."""
    listed = container.exec_run(["ls", "-A", "/var/tmp"], user="0:0")
    assert listed.exit_code == 0, listed.output
    return sorted(listed.output.decode().split())


async def test_an_injected_tool_runs_in_farm_and_its_files_end_with_the_box(
    farm_env: FarmSandboxEnvironment, farm_handle: FarmHandle, docker_env: Any, tmp_path: Path
) -> None:
    """``tests/inspect_eval.py editor``: ``text_editor``, which Inspect *injects* (it installs
    its helper under ``/var/tmp`` as the sample's user and starts it there), creates and views
    a file in the sample's box, and ``bash`` reads it back. What the box left in ``/var/tmp``
    (the helper, the file) is gone once the sample's box is closed."""
    log = await run_eval_script(farm_handle, tmp_path, "editor")
    assert log.status == "success", log.error
    assert log.samples is not None
    tools = [m for m in log.samples[0].messages if m.role == "tool"]
    assert [(m.function, m.error) for m in tools] == [
        ("text_editor", None),
        ("text_editor", None),
        ("bash", None),
    ], [m.text for m in tools]
    created, viewed, read_back = (m.text for m in tools)
    assert "six times seven" in viewed and read_back == "six times seven\n", (created, viewed)
    assert recorded(farm_handle) == {farm_env.session.id}  # the eval's box was closed
    (container,) = farm_containers(docker_env, list(farm_handle.farm.local_farm.workers))
    assert wait_for(lambda: var_tmp(container) == [], 30), var_tmp(container)


async def test_what_names_inspects_tools_directory_names_the_box_own(
    farm_handle: FarmHandle, docker_env: Any
) -> None:
    """Inspect's fixed tools path, in an argv element (a shell script's too), the working
    directory, an environment value or a file path, is the box's own directory: made by the
    box, mode 0700, in no other box; a longer name that begins with the path is left
    alone. A command that finds ``/var/tmp`` full there says so first, and what to set."""
    opened = [await FarmSandboxEnvironment.sample_init("toolsdir", CONFIG, {}) for _ in "ab"]
    (container,) = farm_containers(docker_env, list(farm_handle.farm.local_farm.workers))
    try:
        box, other = (envs["default"].as_type(FarmSandboxEnvironment) for envs in opened)
        script = f'echo {SANDBOX_TOOLS_DIR}; pwd; echo "$WHERE"; echo {SANDBOX_TOOLS_DIR}.old'
        ran = await box.exec(
            ["sh", "-c", script], cwd=SANDBOX_TOOLS_DIR, env={"WHERE": f"{SANDBOX_TOOLS_DIR}/x"}
        )
        own = box.tools.path
        assert re.fullmatch(r"/var/tmp/\.inspect-tools-[0-9a-f]{32}", own)
        assert ran.stdout.splitlines() == [own, own, f"{own}/x", f"{SANDBOX_TOOLS_DIR}.old"]
        uid = (await box.exec(["id", "-u"])).stdout.strip()
        stat = await box.exec(["stat", "-c", "%u:%a", SANDBOX_TOOLS_DIR])
        assert stat.stdout == f"{uid}:700\n"
        await box.write_file(f"{SANDBOX_TOOLS_DIR}/notes", "mine")
        assert await box.read_file(f"{own}/notes") == "mine"
        assert await box.read_file(f"{SANDBOX_TOOLS_DIR}/notes") == "mine"
        assert other.tools.path != own
        with pytest.raises(FileNotFoundError):  # not in the other box's /var/tmp at all
            await other.read_file(f"{own}/notes")
        denied = await other.exec(["ls", own])
        assert not denied.success and "No such file" in denied.stderr
        fill = (  # files of 100 MiB (a file is capped by the sandbox's fsize) until it is full
            f"i=0; while head -c {100 * MIB} /dev/zero > {SANDBOX_TOOLS_DIR}/big$i; "
            "do i=$((i + 1)); done; exit 1"
        )
        full = await box.exec(["sh", "-c", fill])
        assert full.returncode == 1
        first, *rest = full.stderr.splitlines()
        assert first.startswith("farm: the box's /var/tmp is full"), full.stderr
        assert "FARM_BOX_DISK_MB" in first and "No space left on device" in rest[-1]
    finally:
        for envs in opened:
            await FarmSandboxEnvironment.sample_cleanup("toolsdir", CONFIG, envs, False)
    assert wait_for(lambda: var_tmp(container) == [], 30), var_tmp(container)


async def test_samples_at_once_in_one_sandbox_each_get_injected_tools_of_their_own(
    farm_env: FarmSandboxEnvironment, farm_handle: FarmHandle, docker_env: Any, tmp_path: Path
) -> None:
    """``tests/inspect_eval.py pair``: two samples run at once in the one sandbox of this
    module's farm (one worker: the host name both saw is its container's) and both use
    ``text_editor``. Each box's tools run from a directory of its own under ``/var/tmp``
    (``.inspect-tools-<digest>``, the box's, mode 0700), not from Inspect's fixed path, which
    the first box would have held until it ended (the other sample failing with
    ``SandboxInjectionError``); each sample's ``/var/tmp`` (its box's own) holds its tools and
    not the other's. Nothing of them is in the sandbox's own ``/var/tmp`` once both boxes are
    closed."""
    log = await run_eval_script(farm_handle, tmp_path, "pair")
    assert log.status == "success", log.error
    assert log.samples is not None and sorted(str(s.id) for s in log.samples) == ["a", "b"]
    (container,) = farm_containers(docker_env, list(farm_handle.farm.local_farm.workers))
    met: dict[str, dict[str, str]] = {}
    for sample in log.samples:
        tools = [m for m in sample.messages if m.role == "tool"]
        assert [(m.function, m.error) for m in tools] == [
            ("text_editor", None),
            ("bash", None),
            ("text_editor", None),
            ("bash", None),
        ], [m.text for m in tools]
        _, meeting, viewed, read_back = (m.text for m in tools)
        notes = f"notes of {sample.id}"
        assert notes in viewed and read_back == notes + "\n", (viewed, read_back)
        met[str(sample.id)] = dict(line.split("=", 1) for line in meeting.splitlines())
    a, b = met["a"], met["b"]
    assert a["host"] == b["host"] == container.attrs["Config"]["Hostname"]  # one sandbox
    assert a["uid"] != b["uid"] and a["own"] != b["own"]
    for me, other in ((a, b), (b, a)):
        assert re.fullmatch(r"/var/tmp/\.inspect-tools-[0-9a-f]{32}", me["own"]), me
        assert me["own_stat"] == f"{me['uid']}:700", me
        listed = me["var_tmp"].split()  # its box's own /var/tmp: its tools and notes alone
        assert Path(me["own"]).name in listed and Path(other["own"]).name not in listed, me
    assert recorded(farm_handle) == {farm_env.session.id}  # the eval's boxes were closed
    assert wait_for(lambda: var_tmp(container) == [], 30), var_tmp(container)
