"""Put the wheels images/worker/Dockerfile installs in build/worker-wheels/, for a base image.

The worker image installs farm with ``pip install --no-index``: a container build may not
reach PyPI (no registry, or a TLS-intercepting proxy whose CA only the host trusts), the
host's pip does. So the host downloads, for the base image's interpreter and machine:

- ``farm/``: farm's own wheel, built from this checkout (every run);
- ``deps/``: every dependency as a binary wheel (again only when pyproject.toml or the base's
  Python changed; ``deps.stamp`` records for what they are).

``pip download --python-version`` picks wheels for another interpreter but evaluates
environment markers against the running one (``python_full_version < "3.11.3"`` is decided
by the host's Python, not the base's), so a dependency the base needs can be left out. After
pip's pass this closes the set itself: it reads each wheel's ``Requires-Dist``, evaluates the
markers with the base's own marker environment, and downloads what is missing, until nothing
is.

usage: .venv/bin/python scripts/worker_wheels.py BASE_IMAGE [--dest build/worker-wheels]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]
GLIBC_TAGS = ("2_17", "2_24", "2_28", "2_31", "2_34", "2_35", "2_36", "2_39")
MAX_ROUNDS = 20

# PEP 508's marker environment, computed by the base image's own interpreter.
MARKER_ENV_SCRIPT = """
import json, os, platform, sys
impl = sys.implementation
v = impl.version
iver = "%d.%d.%d" % (v.major, v.minor, v.micro)
print(json.dumps({
    "implementation_name": impl.name,
    "implementation_version": iver,
    "os_name": os.name,
    "platform_machine": platform.machine(),
    "platform_python_implementation": platform.python_implementation(),
    "platform_release": platform.release(),
    "platform_system": platform.system(),
    "platform_version": platform.version(),
    "python_full_version": platform.python_version(),
    "python_version": ".".join(platform.python_version_tuple()[:2]),
    "sys_platform": sys.platform,
}))
"""


def log(message: str) -> None:
    print(f"worker-wheels: {message}", file=sys.stderr, flush=True)


def marker_env(base: str) -> dict[str, str]:
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", base, "-c"]
        + [MARKER_ENV_SCRIPT],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    env: dict[str, str] = json.loads(out)
    return env


def pip_target_args(env: dict[str, str]) -> list[str]:
    machine = env["platform_machine"]
    args = ["--only-binary=:all:", "--implementation", "cp"]
    args += ["--python-version", env["python_full_version"]]
    for tag in GLIBC_TAGS:
        args += ["--platform", f"manylinux_{tag}_{machine}"]
    return args


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args]
    subprocess.run(cmd, check=True, timeout=900)


def requires(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(zf.read(name).decode())
    return [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]


def missing(wheels: list[Path], env: dict[str, str]) -> list[Requirement]:
    """Requirements of the set that no wheel in it satisfies, under the base's markers.

    Extras count where they were asked for: ``celery[redis]`` brings celery's
    ``extra == "redis"`` requirements.
    """
    have = {}
    for wheel in wheels:
        name, version, _, _ = parse_wheel_filename(wheel.name)
        have[canonicalize_name(name)] = (version, wheel)
    wanted_extras: dict[str, set[str]] = {}
    todo = [wheel for _, wheel in have.values()]
    needed: dict[str, Requirement] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        wheel = todo.pop()
        parent = canonicalize_name(parse_wheel_filename(wheel.name)[0])
        extras = frozenset(wanted_extras.get(parent, set()))
        if (parent, extras) in seen:
            continue
        seen.add((parent, extras))
        for req in requires(wheel):
            applies = req.marker is None or any(
                req.marker.evaluate({**env, "extra": extra}) for extra in ("", *extras)
            )
            if not applies:
                continue
            name = canonicalize_name(req.name)
            if name in have:
                version, dep = have[name]
                if not req.specifier.contains(version, prereleases=True):
                    raise SystemExit(f"{dep.name} does not satisfy {req} (needed by {parent})")
                if req.extras - wanted_extras.get(name, set()):
                    wanted_extras.setdefault(name, set()).update(req.extras)
                    todo.append(dep)
            else:
                bare = Requirement(str(req))
                bare.marker = None
                needed[name] = bare
    return list(needed.values())


def download_deps(farm_wheel: Path, deps: Path, env: dict[str, str]) -> None:
    target = pip_target_args(env)
    pip("download", *target, "--dest", str(deps), str(farm_wheel))
    for own in deps.glob("farm-*.whl"):
        own.unlink()
    for _ in range(MAX_ROUNDS):
        lacking = missing([farm_wheel, *deps.glob("*.whl")], env)
        if not lacking:
            return
        log("pip left out (markers judged by the host): " + ", ".join(map(str, lacking)))
        pip("download", *target, "--no-deps", "--dest", str(deps), *map(str, lacking))
    raise SystemExit(f"dependency wheels still incomplete after {MAX_ROUNDS} rounds")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the base image the worker image is built FROM")
    parser.add_argument("--dest", type=Path, default=ROOT / "build" / "worker-wheels")
    args = parser.parse_args()
    dest: Path = args.dest
    env = marker_env(args.base)
    log(f"{args.base}: Python {env['python_full_version']} on {env['platform_machine']}")

    farm_dir = dest / "farm"
    shutil.rmtree(farm_dir, ignore_errors=True)
    farm_dir.mkdir(parents=True)
    pip("wheel", "--no-deps", "--wheel-dir", str(farm_dir), str(ROOT))
    (farm_wheel,) = farm_dir.glob("farm-*.whl")

    pyproject = (ROOT / "pyproject.toml").read_bytes()
    stamp = json.dumps({"env": env, "pyproject": hashlib.sha256(pyproject).hexdigest()})
    stamp_file = dest / "deps.stamp"
    deps = dest / "deps"
    if stamp_file.exists() and stamp_file.read_text() == stamp and deps.is_dir():
        log("dependency wheels are current")
        return 0
    log("downloading dependency wheels")
    stamp_file.unlink(missing_ok=True)
    shutil.rmtree(deps, ignore_errors=True)
    deps.mkdir()
    download_deps(farm_wheel, deps, env)
    stamp_file.write_text(stamp)
    log(f"{len(list(deps.glob('*.whl')))} dependency wheels in {deps}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
