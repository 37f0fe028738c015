"""The kernel as a read-only bundle, for images that do not carry it (bring your own image).

Any image with ``python3`` (>= 3.9) can be a sandbox: the docker backend mounts this directory
read-only at ``/opt/farm`` and starts ``python3 -m farm.kernel`` with the image's own
interpreter, under every hardening flag of a farm image. The bundle holds the kernel (stdlib
only) and an empty ``farm/__init__.py``, as a farm image does, with the bytecode of this
interpreter (an image whose ``python3`` has the same cache tag skips compiling the kernel at
every start; any other compiles it as before). It lives in the sandboxes' socket directory,
which the Docker engine resolves on the same host (``FARM_SOCKET_DIR``), one directory per
kernel digest and cache tag, made once and atomically (a rename).
"""

from __future__ import annotations

import compileall
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import farm.kernel

MOUNT = "/opt/farm"


def kernel_digest(kernel_dir: Path | None = None, *extra: Path, root: Path | None = None) -> str:
    """sha256 of the kernel's sources, sub-packages included, and of ``extra`` files (the
    image's Dockerfile), each by its path under ``root`` (default: the kernel's directory) and
    its contents: the one digest that says whether a bundle or an image holds this kernel."""
    kernel = kernel_dir or Path(farm.kernel.__file__).parent
    base = root or kernel
    files = sorted([*kernel.rglob("*.py"), *extra], key=lambda p: p.relative_to(base).as_posix())
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(base).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def kernel_bundle(under: Path) -> Path:
    """The bundle of this process's kernel under ``under`` (made if missing)."""
    kernel_dir = Path(farm.kernel.__file__).parent
    target = under / f"kernel-{kernel_digest(kernel_dir)[:16]}-{sys.implementation.cache_tag}"
    if target.is_dir():
        return target
    under.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".kernel-", dir=under))
    package = staging / "farm"
    shutil.copytree(kernel_dir, package / "kernel", ignore=shutil.ignore_patterns("__pycache__"))
    (package / "__init__.py").write_text("")
    # timestamp-checked bytecode (copytree kept the sources' times); paths as mounted
    compileall.compile_dir(package, ddir=f"{MOUNT}/farm", quiet=1)
    for path in [staging, *staging.rglob("*")]:  # readable by the container's root, read-only
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    try:
        staging.rename(target)
    except OSError:  # another worker made it first
        shutil.rmtree(staging, ignore_errors=True)
    return target
