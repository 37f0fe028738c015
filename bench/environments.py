"""Benchmark the first result on an image no worker has served yet against ``docker run``.

1. First result. Baseline: ``docker run --rm --network none --entrypoint python3 IMAGE -c
   "print(1)"`` (the CLI, as a user would type it). Farm: a local farm whose one worker serves
   ``default`` gets ``farm.run("1", image=IMAGE)`` for an image no worker serves: it starts a
   worker for it (a Celery process and its Docker sandbox), waits until that worker registers
   ready, then runs the cell; all of it is timed, and the worker's part (``serve_image``) is
   shown apart. Two images, each under a name of this run:
   - ``env``: a farm image by name (``farm-sandbox:bench-env-<pid>``, the kernel inside): this
     checkout's default sandbox image tagged anew, as ``farm image build`` leaves an image
     (without a spec, so it is served as it is: no rebuild check);
   - ``byo``: bring your own (``bench-byo-<pid>:latest``): the sandbox base (``farm-base`` or
     ``python:3.12-slim``), python3 but no farm kernel: farm mounts its kernel from a bundle.
   Each repetition starts a new local farm, so no worker has served either image; the
   baseline runs right before each farm call (A, B, A, B). The issue sets no number: the
   ratio farm / docker run is printed.
2. Warm calls, "as for default": ``session.run("1")`` on a session of each image, and one-shot
   ``farm.run("1", image=...)`` (a box opened and closed per call), alternating in blocks
   between ``default``, ``env`` and ``byo``; p50 and p99, ratio to ``default``.

Every container carries ``farm.owner``: ``bench-<pid>`` for docker run, the workers' ids for
the farms' sandboxes; all are removed on exit, also on errors and Ctrl-C, and the run checks
that none is left. The tags made here are removed. ``FARM_SANDBOX_IMAGE`` is ignored (it would
give every worker one image). Timings are never asserted: the exit status is 0 whether or not
farm is faster.

``python bench/environments.py [--quick] [--json]``
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from functools import partial
from typing import Any

import docker
import docker.errors
from benchlib import Latency, emit, machine, parse_args

from farm.client import Farm
from farm.image_name import ImageName
from farm.local.embedded import LocalFarm
from farm.sandbox.docker import LABEL_MANAGED, LABEL_OWNER
from farm.sandbox.images import ensure_base, image_exists, own_sandbox_tag

OWNER = f"bench-{os.getpid()}"
ENV_NAME = f"bench-env-{os.getpid()}"
IMAGES = {"env": ENV_NAME, "byo": f"bench-byo-{os.getpid()}:latest"}
TAGS = {"env": f"farm-sandbox:{ENV_NAME}", "byo": IMAGES["byo"]}
DOCKER_RUN_TIMEOUT_S = 60.0
CLEANUP_TIMEOUT_S = 15.0
BLOCK = 20
# (repetitions, docker runs before each cold call, warm session calls, warm one-shot calls)
FULL = (3, 2, 300, 60)
QUICK = (1, 1, 40, 10)


def docker_run_once(tag: str) -> None:
    argv = ["docker", "run", "--rm", "--network", "none"]
    argv += ["--label", f"{LABEL_MANAGED}=1", "--label", f"{LABEL_OWNER}={OWNER}"]
    argv += ["--entrypoint", "python3", tag, "-c", "print(1)"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=DOCKER_RUN_TIMEOUT_S)
    if done.returncode != 0 or done.stdout.strip() != "1":
        raise RuntimeError(f"docker run failed ({done.returncode}): {done.stderr.strip()}")


def timed(fn: Callable[[], Any], into: Latency) -> Any:
    t0 = time.perf_counter_ns()
    out = fn()
    into.samples_ns.append(time.perf_counter_ns() - t0)
    return out


def checked(result: Any) -> None:
    if not result.ok:
        raise RuntimeError(f"run failed: {result.error}")


def make_tags(client: docker.DockerClient) -> dict[str, str]:
    """Tag the two images of this run; returns where each came from."""
    source = {"env": own_sandbox_tag(), "byo": ensure_base(client)}
    if not image_exists(client, source["env"]):
        raise RuntimeError(f"no {source['env']}: run `python -m farm.sandbox.images` first")
    for kind, tag in TAGS.items():
        repository, _, name = tag.rpartition(":")
        client.images.get(source[kind]).tag(repository, name)
    return source


def cold(
    quick: bool, lat: dict[str, Latency], loads: dict[str, list[float]], farm_tags: list[str]
) -> list[float]:
    """The first-result repetitions; returns each farm's start-up in seconds."""
    reps, runs = (QUICK if quick else FULL)[:2]
    kind_of = {ImageName.parse(image).asked: kind for kind, image in IMAGES.items()}
    startups = []
    for rep in range(reps):
        local = LocalFarm({"default": 1})
        farm_tags.append(local.tag)  # its workers' ids, which own their sandboxes
        t0 = time.perf_counter()
        with local, Farm(local.settings(), owned=local) as farm:
            startups.append(time.perf_counter() - t0)
            for _ in range(3):  # the default worker's first calls
                checked(farm.run("1"))
            serve = local.serve_image

            def timed_serve(
                image: str | ImageName, serve: Callable[[str | ImageName], str] = serve
            ) -> str:
                kind = kind_of[ImageName.parse(image).asked]  # Farm hands it parsed
                return str(timed(partial(serve, image), lat[f"serve {kind}"]))

            local.serve_image = timed_serve  # type: ignore[method-assign]
            for kind in ("env", "byo") if rep % 2 == 0 else ("byo", "env"):
                tag, image = TAGS[kind], IMAGES[kind]
                for _ in range(runs):
                    timed(partial(docker_run_once, tag), lat[f"docker {kind}"])
                first = timed(partial(farm.run, "1", image=image), lat[f"cold {kind}"])
                checked(first)
                loads[kind].append(os.getloadavg()[0])
            if rep == reps - 1:
                warm(farm, quick, lat)
    return startups


def warm(farm: Farm, quick: bool, lat: dict[str, Latency]) -> None:
    """Session calls and one-shot calls on each image, alternating in blocks of ``BLOCK``."""
    calls, one_shots = (QUICK if quick else FULL)[2:]
    images = {"default": "default", **IMAGES}
    sessions = {kind: farm.session(image=image) for kind, image in images.items()}
    try:
        for kind, image in images.items():  # warm-up, not timed
            checked(sessions[kind].run("1"))
            checked(farm.run("1", image=image))
        for total, name in ((calls, "session"), (one_shots, "one-shot")):
            while any(len(lat[f"{name} {k}"].samples_ns) < total for k in images):
                for kind, image in images.items():
                    s = lat[f"{name} {kind}"]
                    call: Callable[[], Any] = (
                        partial(sessions[kind].run, "1")
                        if name == "session"
                        else partial(farm.run, "1", image=image)
                    )
                    for _ in range(min(BLOCK, total - len(s.samples_ns))):
                        checked(timed(call, s))
    finally:
        for session in sessions.values():
            session.close()


def cleanup(client: docker.DockerClient, farm_tags: list[str]) -> list[str]:
    """Remove this run's containers and tags; return the names of those still present."""
    ours = (OWNER, *(f"local-{tag}-" for tag in farm_tags))
    deadline = time.monotonic() + CLEANUP_TIMEOUT_S
    while True:
        flt: dict[str, str | list[str] | bool] = {"label": LABEL_OWNER}
        listed = client.containers.list(all=True, ignore_removed=True, filters=flt)
        left = [c for c in listed if c.labels.get(LABEL_OWNER, "").startswith(ours)]
        for container in left:
            with suppress(docker.errors.APIError):  # gone meanwhile, or already being removed
                container.remove(force=True)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # `docker run --rm` removes after the CLI returns: allow it a moment
    kept = []
    for tag in TAGS.values():
        try:
            if image_exists(client, tag):
                client.images.remove(tag)  # an untag: the image keeps its source's tags
        except docker.errors.APIError:
            kept.append(tag)
    return [str(c.name) for c in left] + kept


def ms(latency: Latency, q: float) -> float:
    return latency.p(q) / 1e6


def report(
    lat: dict[str, Latency], loads: dict[str, list[float]], startups: list[float], quick: bool
) -> dict[str, Any]:
    stats = {
        name: {
            "n": len(lt.samples_ns),
            "p50_ms": ms(lt, 50),
            "p99_ms": ms(lt, 99),
            "min_ms": ms(lt, 0),
            "max_ms": ms(lt, 100),
        }
        for name, lt in lat.items()
    }
    ratios: dict[str, float] = {}
    for kind in IMAGES:
        ratios[f"cold {kind}/docker run p50"] = ms(lat[f"cold {kind}"], 50) / ms(
            lat[f"docker {kind}"], 50
        )
        for name in ("session", "one-shot"):
            ratios[f"{name} {kind}/default p50"] = ms(lat[f"{name} {kind}"], 50) / ms(
                lat[f"{name} default"], 50
            )
    return {
        "bench": "environments",
        "quick": quick,
        "results": stats,
        "ratios": ratios,
        "load_at_cold_calls": loads,
        "farm_startup_s": startups,
    }


def render(info: dict[str, Any], out: dict[str, Any], source: dict[str, str]) -> str:
    r, ratio = out["results"], out["ratios"]
    head = "{:<44} {:>4} {:>10} {:>10} {:>10} {:>8}"
    lines = [
        f"farm environments bench  {info['date']}  host {info['host']}  {info['cpu']}  "
        f"{info['cores']} cores ({info['usable_cores']} usable)  Python {info['python']}"
        + ("  (--quick)" if out["quick"] else ""),
        f"env = {TAGS['env']} (tagged from {source['env']}); "
        f"byo = {TAGS['byo']} (tagged from {source['byo']}, no farm kernel)",
        "",
        head.format("first result, image no worker served", "n", "p50", "min", "max", "ratio"),
    ]

    def row(label: str, key: str, extra: str = "") -> str:
        s = r[key]
        cells = (label, s["n"], f"{s['p50_ms']:.0f} ms", f"{s['min_ms']:.0f} ms")
        return head.format(*cells, f"{s['max_ms']:.0f} ms", extra)

    for kind in IMAGES:
        load = out["load_at_cold_calls"][kind]
        lines += [
            row(f"docker run --rm python3 -c 'print(1)' ({kind})", f"docker {kind}"),
            row(
                f'farm.run("1", image={kind}) cold',
                f"cold {kind}",
                f"{ratio[f'cold {kind}/docker run p50']:.2f}x",
            ),
            row("  of which the worker's start (serve_image)", f"serve {kind}"),
            f"  load 1 m at its calls: {', '.join(f'{x:.1f}' for x in load)}",
        ]
    lines += ["", head.format("warm calls", "n", "p50", "p99", "", "/default")]
    for name, label in (("session", 'session.run("1")'), ("one-shot", 'farm.run("1") one-shot')):
        for kind in ("default", *IMAGES):
            s = r[f"{name} {kind}"]
            rel = "" if kind == "default" else f"{ratio[f'{name} {kind}/default p50']:.2f}x"
            cells = (f"{label} on {kind}", s["n"], f"{s['p50_ms']:.2f} ms")
            lines.append(head.format(*cells, f"{s['p99_ms']:.2f} ms", "", rel))
    load = os.getloadavg()
    lines += [
        "",
        f"load average at the end 1/5/15 m: {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; local "
        f"farm start-ups (left out): {', '.join(f'{s:.1f} s' for s in out['farm_startup_s'])}",
        "cold: a new local farm (one default worker) per repetition; docker run right before "
        "each farm call, --network none, no other hardening flags",
        f"warm: alternating in blocks of {BLOCK} calls; one-shot: a box opened and closed per call",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    os.environ.pop("FARM_SANDBOX_IMAGE", None)
    client = docker.from_env()
    kinds = [f"{w} {k}" for w in ("docker", "cold", "serve") for k in IMAGES]
    kinds += [f"{w} {k}" for w in ("session", "one-shot") for k in ("default", *IMAGES)]
    lat = {name: Latency(name) for name in kinds}
    loads: dict[str, list[float]] = {kind: [] for kind in IMAGES}
    farm_tags: list[str] = []
    try:
        source = make_tags(client)
        startups = cold(args.quick, lat, loads, farm_tags)
    finally:
        left = cleanup(client, farm_tags)
        assert not left, f"containers or tags of this run left behind: {left}"
    out = report(lat, loads, startups, args.quick)
    info = machine()
    out.update(machine=info, farms=[f"local-{tag}" for tag in farm_tags])
    return emit(render(info, out, source), out, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
