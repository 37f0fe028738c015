"""Wheels for an image's Python, downloaded on the host: how images get pip packages here.

A container build may not reach PyPI; the host's pip does, so it downloads binary wheels for
the base image's interpreter and machine, and the Dockerfile installs them with ``--no-index``.
Invariant: :func:`download_closure` closes the set with the base's own environment markers
(``pip download`` judges them by the host's Python). Why: docs/design/images.md.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Sequence
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from farm.errors import ImageBuildError

GLIBC_TAGS = ("2_17", "2_24", "2_28", "2_31", "2_34", "2_35", "2_36", "2_39")
# Older wheels (playwright's) carry only the legacy names; pip does not derive them.
LEGACY_MANYLINUX = ("manylinux1", "manylinux2010", "manylinux2014")
MAX_ROUNDS = 20
PIP_TIMEOUT_S = 900


class WheelError(ImageBuildError):
    """The wheel set cannot be completed (a conflict, or pip keeps leaving something out)."""


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


def marker_env(base: str) -> dict[str, str]:
    """The PEP 508 marker environment of ``base``'s ``python3`` (run without network)."""
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
    for legacy in LEGACY_MANYLINUX:
        args += ["--platform", f"{legacy}_{machine}"]
    return args


# What pip says when a requirement has no (binary) distribution for the target.
PIP_NOT_FOUND = re.compile(
    r"No matching distribution found for (\S+)"
    r"|Could not find a version that satisfies the requirement (\S+)"
)


def pip(*args: str) -> None:
    """Run the host's pip; a failure is a :class:`WheelError` carrying pip's last lines and,
    when pip names one, the requirement it could not find (``package``)."""
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, errors="replace", timeout=PIP_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise WheelError(f"pip {args[0]} took over {PIP_TIMEOUT_S}s") from None
    if proc.returncode == 0:
        return
    output = (proc.stdout + proc.stderr).strip()
    found = PIP_NOT_FOUND.search(output)
    package = (found[1] or found[2]) if found else None
    why = (
        f"no wheel of {package!r} (no such package or version, or none built for the image's "
        "Python and machine)"
        if package
        else "failed"
    )
    tail = "\n".join(output.splitlines()[-12:])
    raise WheelError(f"pip {args[0]}: {why}:\n{tail}", package=package)


def requires(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(zf.read(name).decode())
    return [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]


def missing(
    wheels: list[Path], env: dict[str, str], roots: Iterable[Requirement] = ()
) -> list[Requirement]:
    """Requirements of the set that no wheel in it satisfies, under the base's markers.

    Extras count where they were asked for: ``celery[redis]`` brings celery's
    ``extra == "redis"`` requirements, and so do the extras of ``roots`` (what was asked for
    at the top, e.g. ``markitdown[pdf]``).
    """
    have = {}
    for wheel in wheels:
        name, version, _, _ = parse_wheel_filename(wheel.name)
        have[canonicalize_name(name)] = (version, wheel)
    wanted_extras: dict[str, set[str]] = {}
    for root in roots:
        wanted_extras.setdefault(canonicalize_name(root.name), set()).update(root.extras)
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
                    raise WheelError(f"{dep.name} does not satisfy {req} (needed by {parent})")
                if req.extras - wanted_extras.get(name, set()):
                    wanted_extras.setdefault(name, set()).update(req.extras)
                    todo.append(dep)
            else:
                bare = Requirement(str(req))
                bare.marker = None
                needed[name] = bare
    return list(needed.values())


def download_closure(
    requirements: Sequence[str], dest: Path, env: dict[str, str], *, log: bool = True
) -> None:
    """Download ``requirements`` and everything they need on ``env``'s Python into ``dest``.

    ``requirements`` are pip arguments: names with extras and specifiers, or wheel paths.
    """
    target = pip_target_args(env)
    pip("download", *target, "--dest", str(dest), *requirements)
    roots = [Requirement(r) for r in requirements if not r.endswith(".whl")]
    local = [Path(r) for r in requirements if r.endswith(".whl")]
    for _ in range(MAX_ROUNDS):
        lacking = missing([*local, *dest.glob("*.whl")], env, roots)
        if not lacking:
            return
        if log:
            print(
                "wheels: pip left out (markers judged by the host): "
                + ", ".join(map(str, lacking)),
                file=sys.stderr,
                flush=True,
            )
        pip("download", *target, "--no-deps", "--dest", str(dest), *map(str, lacking))
    raise WheelError(f"dependency wheels still incomplete after {MAX_ROUNDS} rounds")
