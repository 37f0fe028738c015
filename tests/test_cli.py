"""What users touch, end to end: the real ``farm`` CLI and the API on a real local farm."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from farm.client import AsyncFarm, Farm
from farm.errors import SandboxUnavailable
from farm.local.embedded import DIR_PREFIX, OWNER_FILE
from farm.local.processes import pid_alive
from farm.sweep import Sweep, plan_sweep, read_items
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]
FARM = [str(Path(sys.executable).parent / "farm")]


def cli(
    *args: str, env: dict[str, str], timeout: float = 180, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FARM, *args], env=env, capture_output=True, text=True, timeout=timeout, input=stdin
    )


def write_jsonl(path: Path, items: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


def out_ids(path: Path) -> list[str]:
    return [str(json.loads(line)["id"]) for line in path.read_text().splitlines()]


def test_up_status_run_down_leave_nothing_behind(docker_env: Any, tmp_path: Path) -> None:
    env = {**os.environ, "FARM_STATE_FILE": str(tmp_path / "state.json")}
    env.pop("FARM_BROKER_URL", None)
    up = cli("up", "--workers", "1", env=env)
    assert up.returncode == 0, up.stderr
    state = json.loads((tmp_path / "state.json").read_text())
    try:
        status = cli("status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        workers = json.loads(status.stdout)["workers"]
        assert len(workers) == 1 and workers[0]["ready"]
        ran = cli("run", "-", "--json", env=env, stdin="print('hi')\n21 * 2")
        assert ran.returncode == 0, ran.stderr
        result = json.loads(ran.stdout)
        assert result["stdout"] == "hi\n" and result["value"]["text"] == "42"
        failed = cli("run", "-", env=env, stdin="1 / 0")
        assert failed.returncode == 1 and "ZeroDivisionError" in failed.stderr
    finally:
        down = cli("down", env=env)
    assert down.returncode == 0, down.stderr
    assert not (tmp_path / "state.json").exists()
    assert not pid_alive(state["pid"])
    leftovers = docker_env.containers.list(
        ignore_removed=True, all=True, filters={"label": f"farm.owner={state['workers'][0]}"}
    )
    assert leftovers == []


def test_sweep_resumes_after_being_killed_halfway(docker_env: Any, tmp_path: Path) -> None:
    items = [
        {"id": f"item-{i}", "code": f"import time\ntime.sleep(0.3)\n{i} * {i}"} for i in range(30)
    ]
    source = write_jsonl(tmp_path / "in.jsonl", items)
    out = tmp_path / "out.jsonl"
    env = dict(os.environ)
    sweep = subprocess.Popen(
        [*FARM, "sweep", str(source), "-o", str(out), "--local", "1", "--concurrency", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert wait_for(lambda: out.exists() and len(out.read_text().splitlines()) >= 5, 120, 0.1)
    os.killpg(sweep.pid, signal.SIGKILL)  # the harshest interruption: no cleanup at all
    sweep.wait(30)
    # its orphaned workers shut down and remove their sandboxes. Its farm is found by the pid
    # that owns it, not as "what is new": other test runs (xdist workers) start farms too.
    (left_behind,) = [d for d in local_dirs() if owner_pid(d) == sweep.pid]
    workers = {log.stem for log in left_behind.glob("local-*.log")}
    assert workers, f"no worker logs in {left_behind}"
    assert wait_for(lambda: not _local_owners(docker_env) & workers, 60, 0.2)
    gc = cli("gc", env=env)
    assert gc.returncode == 0, gc.stderr
    assert not left_behind.exists() and str(left_behind) in gc.stdout
    first = out_ids(out)
    assert 5 <= len(first) < 30
    resumed = cli(
        "sweep",
        str(source),
        "-o",
        str(out),
        "--local",
        "1",
        "--resume",
        "--concurrency",
        "4",
        env=env,
    )
    assert resumed.returncode == 0, resumed.stderr
    ids = out_ids(out)
    assert sorted(ids) == sorted(i["id"] for i in items)  # every id exactly once
    values = {
        json.loads(line)["id"]: json.loads(line)["cells"][-1]["value"]["text"]
        for line in out.read_text().splitlines()
    }
    assert values["item-7"] == "49"


def local_dirs() -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*"))


def owner_pid(directory: Path) -> int | None:
    """The pid of the process that made the local farm ``directory``."""
    try:
        return int((directory / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None


def _local_owners(docker_env: Any) -> set[str]:
    containers = docker_env.containers.list(
        ignore_removed=True, all=True, filters={"label": "farm.managed=1"}
    )
    return {c.labels.get("farm.owner", "") for c in containers} - {""}


def test_sweep_rejects_duplicate_ids_up_front(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "code": "1"}, {"id": 1, "code": "2"}])
    result = cli(
        "sweep",
        str(source),
        "-o",
        str(tmp_path / "out.jsonl"),
        env={**os.environ, "FARM_BROKER_URL": "redis://127.0.0.1:1/0"},
    )
    assert result.returncode == 2
    assert "duplicate ids" in result.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_sweep_records_every_outcome_and_caches(farm: Farm, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(
        json.dumps({"id": "ok", "code": "2 + 2"})
        + "\n"
        + json.dumps(
            {
                "id": "cells",
                "cells": ["x = int(open('n.txt').read())", "x * 10"],
                "setup": "import math",
                "files": {"n.txt": "2"},
            }
        )
        + "\n"
        + json.dumps({"id": "user", "code": "raise KeyError('k')"})
        + "\n"
        + json.dumps({"id": "slow", "code": "while True: pass", "timeout_s": 1})
        + "\n"
        + "not json\n"
        + json.dumps({"id": "both", "code": "1", "cells": ["2"]})
        + "\n"
    )
    items, bad = read_items(source)
    assert [i.id for i in items] == ["ok", "cells", "user", "slow"]
    assert [b.id for b in bad] == ["line-5", "both"]
    out = tmp_path / "out.jsonl"
    summary = Sweep(farm, concurrency=4, cache_dir=tmp_path / "cache").run(
        plan_sweep(source, out), out
    )
    records = {json.loads(line)["id"]: json.loads(line) for line in out.read_text().splitlines()}
    assert set(records) == {"ok", "cells", "user", "slow", "line-5", "both"}
    assert records["ok"]["cells"][0]["value"]["text"] == "4"
    assert len(records["cells"]["cells"]) == 3
    assert records["cells"]["cells"][-1]["value"]["text"] == "20"
    assert (records["user"]["status"], records["user"]["kind"]) == ("error", "user")
    assert records["slow"]["kind"] == "timeout"
    assert records["both"]["kind"] == "input"
    assert records["ok"]["manifest"]["image_digest"].startswith("sha256:")
    assert summary.by_outcome["ok/-"] == 2
    again = Sweep(farm, concurrency=4, cache_dir=tmp_path / "cache").run(
        plan_sweep(source, out), out
    )
    cached = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["cached"] for r in cached if r["kind"] != "input")
    assert again.total == summary.total


def test_the_sweep_cache_keys_on_everything_that_changes_an_outcome(
    farm: Farm, tmp_path: Path
) -> None:
    read_n = "int(open('n.txt').read()) * 10"
    items = [
        {"id": "two", "code": read_n, "files": {"n.txt": "2"}},
        {"id": "three", "code": read_n, "files": {"n.txt": "3"}},  # same code, other file
        {"id": "quick", "code": "import time; time.sleep(0.3); 'done'", "timeout_s": 5},
        {"id": "tight", "code": "import time; time.sleep(0.3); 'done'", "timeout_s": 0.1},
        {"id": "files-8", "code": FSIZE_MB, "limits": {"fsize_mb": 8}},  # same code, other box
        {"id": "files-16", "code": FSIZE_MB, "limits": {"fsize_mb": 16}},
    ]
    source = write_jsonl(tmp_path / "in.jsonl", items)
    cache = tmp_path / "cache"
    for _ in range(2):  # the second sweep answers from the cache, each item with its own
        out = tmp_path / "out.jsonl"
        Sweep(farm, concurrency=4, cache_dir=cache).run(plan_sweep(source, out), out)
        records = {json.loads(x)["id"]: json.loads(x) for x in out.read_text().splitlines()}
        assert records["two"]["cells"][0]["value"]["text"] == "20"
        assert records["three"]["cells"][0]["value"]["text"] == "30"
        assert records["quick"]["status"] == "ok"
        assert records["tight"]["kind"] == "timeout"
        assert records["files-8"]["cells"][0]["value"]["text"] == "8"
        assert records["files-16"]["cells"][0]["value"]["text"] == "16"
    assert all(record["cached"] for record in records.values())
    assert len(list(cache.glob("*.json"))) == 6


FSIZE_MB = "import resource\nresource.getrlimit(resource.RLIMIT_FSIZE)[0] // 2**20"
# what an item sees of its image (a file a build puts there) and its sandbox (its memory cap)
IMAGE_AND_SANDBOX = (
    "import os\nmem = next(f for f in ('/sys/fs/cgroup/memory.max', "
    "'/sys/fs/cgroup/memory/memory.limit_in_bytes') if os.path.exists(f))\n"
    "(open('/etc/pytest-build').read(), int(open(mem).read()) // 2**20)"
)


def test_the_sweep_cache_keys_on_the_image_digest_and_the_sandbox_limits(
    docker_env: Any, tmp_path: Path
) -> None:
    """An item on an image no worker serves when the sweep starts (a local farm starts one
    for it as the item is sent): its record is cached under that image's digest, so a rebuilt
    image, or the same image in sandboxes of other limits, runs it again, and an unchanged
    one answers from the cache."""
    import docker

    from farm.local.embedded import LocalFarm
    from farm.sandbox.images import own_sandbox_tag
    from tests.conftest import build_test_image, remove_image_tags, removing_images

    tag = "farm-sandbox:pytest-cache"

    built: list[str] = []

    def build(version: str) -> None:
        context = tmp_path / f"build-{version}"
        context.mkdir()
        (context / "build").write_text(version)
        (context / "Dockerfile").write_text(
            f"FROM {own_sandbox_tag()}\nCOPY build /etc/pytest-build\n"
        )
        built.append(build_test_image(docker_env, path=str(context), tag=tag, rm=True).id)

    source = write_jsonl(
        tmp_path / "in.jsonl", [{"id": "x", "image": "pytest-cache", "code": IMAGE_AND_SANDBOX}]
    )
    cache = tmp_path / "cache"

    def sweep(farm: Farm) -> tuple[str, bool]:
        out = tmp_path / "out.jsonl"
        Sweep(farm, cache_dir=cache).run(plan_sweep(source, out), out)
        (record,) = [json.loads(line) for line in out.read_text().splitlines()]
        assert record["status"] == "ok", record
        return record["cells"][0]["value"]["text"], record["cached"]

    seen = []
    try:
        build("1")
        with Farm.local(images={"default": 1}) as farm:
            seen += [sweep(farm), sweep(farm)]  # started on demand, then served: one key
        build("2")
        with Farm.local(images={"default": 1}) as farm:
            seen.append(sweep(farm))
        local = LocalFarm({"default": 1}, env={"FARM_SANDBOX_MEMORY_MB": "600"}).start()
        with Farm(local.settings(), owned=local) as farm:
            seen += [sweep(farm), sweep(farm)]
    finally:
        remove_image_tags(docker_env, tag)
        with removing_images():
            for image_id in built:  # the first build, untagged by the second
                with contextlib.suppress(docker.errors.ImageNotFound):
                    docker_env.images.remove(image_id)
    disks = 6144  # the boxes' disks are in the sandbox's memory too (FARM_SANDBOX_DISK_MB)
    assert seen == [
        (f"('1', {512 + disks})", False),
        (f"('1', {512 + disks})", True),
        (f"('2', {512 + disks})", False),  # rebuilt: a new digest
        (f"('2', {600 + disks})", False),  # other sandbox limits
        (f"('2', {600 + disks})", True),
    ]


def test_attach_from_a_second_process(farm: Farm) -> None:
    with farm.session() as s:
        s.run("message = 'set by the first process'")
        code = (
            "from farm.client import Farm\n"
            f"farm = Farm.connect({farm.settings.broker_url!r})\n"
            f"print(farm.attach({s.id!r}).run('message').value.text)\n"
            "farm.close()\n"
        )
        child = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert child.returncode == 0, child.stderr
        assert child.stdout.strip() == "'set by the first process'"


def test_async_twins_run_sessions_concurrently(farm: Farm) -> None:
    async def main() -> list[str]:
        afarm = AsyncFarm(farm)
        sessions = [await afarm.session() for _ in range(4)]
        for i, s in enumerate(sessions):
            await s.arun(f"n = {i}")
        results = await asyncio.gather(*(s.arun("n * 10") for s in sessions))
        one_shot = await afarm.run("'one-shot'")
        for s in sessions:
            await s.aclose()
        return [r.value.text for r in results if r.value] + [
            one_shot.value.text if one_shot.value else ""
        ]

    assert asyncio.run(main()) == ["0", "10", "20", "30", "'one-shot'"]


def test_a_local_farm_starts_a_worker_for_a_new_image_on_demand(docker_env: Any) -> None:
    from farm.sandbox.images import own_sandbox_tag
    from tests.conftest import removing_images

    docker_env.images.get(own_sandbox_tag()).tag("farm-sandbox", "pytest-extra")  # this kernel
    try:
        with Farm.local(images={"default": 1}) as farm:
            assert {w["image"] for w in farm.workers()} == {"default"}
            with farm.session(image="pytest-extra") as s:
                value = s.run("'served on demand'").value
                assert value is not None and value.text == "'served on demand'"
            assert {w["image"] for w in farm.workers()} == {"default", "pytest-extra"}
            with pytest.raises(SandboxUnavailable, match="farm image build"):
                farm.session(image="no-such-variant")
    finally:
        with removing_images():
            docker_env.images.remove("farm-sandbox:pytest-extra")


def test_image_build_of_an_unknown_name_without_packages_names_farms_images() -> None:
    proc = cli("image", "build", "nope", env=dict(os.environ))
    assert proc.returncode == 2
    assert "nothing to build for 'nope'" in proc.stderr and "docs" in proc.stderr
