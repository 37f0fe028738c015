"""Put the wheels images/worker/Dockerfile installs in build/worker-wheels/, for a base image.

The worker image installs farm with ``pip install --no-index``: a container build may not
reach PyPI (no registry, or a TLS-intercepting proxy whose CA only the host trusts), the
host's pip does. So the host downloads, for the base image's interpreter and machine:

- ``farm/``: farm's own wheel, built from this checkout (every run);
- ``deps/``: every dependency, the ``serve`` extra's too (the image also runs ``farm serve``),
  as a binary wheel (again only when pyproject.toml or the base's
  Python changed; ``deps.stamp`` records for what they are).

The download itself (and why pip's own pass is not enough: markers judged by the host's
Python) is ``farm.sandbox.wheels``, shared with the sandbox variants.

usage: .venv/bin/python scripts/worker_wheels.py BASE_IMAGE [--dest build/worker-wheels]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tomllib
from pathlib import Path

from farm.sandbox.wheels import download_closure, marker_env, pip

ROOT = Path(__file__).resolve().parents[1]


def log(message: str) -> None:
    print(f"worker-wheels: {message}", file=sys.stderr, flush=True)


def serve_requirements() -> list[str]:
    """The ``serve`` extra's requirements: the image also runs ``farm serve`` (compose's
    ``api`` service, the chart's API Deployment)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["optional-dependencies"]["serve"])


def download_deps(farm_wheel: Path, deps: Path, env: dict[str, str]) -> None:
    download_closure([str(farm_wheel), *serve_requirements()], deps, env)
    for own in deps.glob("farm-*.whl"):
        own.unlink()


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
