"""Warm imports: the modules an image preloads, imported once before the zygote is forked, so
every box finds them in ``sys.modules`` (copy-on-write pages of one import, not one per item).

Invariants: a module that fails to import is recorded (name and error) and the kernel serves
anyway; an import that leaves writable shared memory (a channel between boxes) gets the kernel
restarted without preloading; every forked child reseeds numpy's global generator, else all
boxes would draw the same numbers. Why, and which packages fork safely: docs/design/preload.md.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import os
import struct
import sys
import time
from collections.abc import Iterator

from ..wire.protocol import Preloaded

IMAGE_FILE = "/etc/farm/preload.json"  # written by the image's build (farm image build)
REFUSED_FLAG = "--preload-refused"  # the restart's argument: why nothing is preloaded
MAX_ERROR = 300  # characters of an import's error kept in the record

log = logging.getLogger("farm.kernel")


def image_modules(path: str = IMAGE_FILE) -> tuple[list[str], str | None]:
    """The modules the image names (``{"modules": [...]}``), and why the file is unusable
    (``None``: fine, or no file: an image built without preloads)."""
    try:
        with open(path) as f:
            data = json.load(f)
        modules = data["modules"]
        if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
            raise ValueError("'modules' is not a list of names")
        return modules, None
    except FileNotFoundError:
        return [], None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [], f"{path}: {exc}"


def run(names: list[str], refused: str | None = None) -> tuple[Preloaded, str | None]:
    """Import ``names`` in order, here, before any fork: what was preloaded and what failed,
    and why the kernel must start again without them (``restart_without``; ``None``: serve).
    ``refused``: an earlier start refused them, so none is imported."""
    record: Preloaded = {"modules": [], "failed": {}, "seconds": 0.0}
    if refused is not None:
        record["failed"] = {name: refused for name in names}
        return record, None
    if not names:
        return record, None
    shared_before = _shared_writable()
    started = time.perf_counter()
    with _stdout_to_stderr():  # stdout carries the readiness line: nothing else may reach it
        for name in names:
            why = _import(name)
            if why is None:
                record["modules"].append(name)
            else:
                record["failed"][name] = why[:MAX_ERROR]
                log.warning("preload: %s did not import (%s); serving without it", name, why)
    record["seconds"] = round(time.perf_counter() - started, 3)
    os.register_at_fork(after_in_child=reseed)
    # The supervisor's collector would otherwise write to every page of these objects (copies
    # of pages the zygote and the boxes share); the zygote freezes its own before serving.
    gc.freeze()
    leaked = sorted(_shared_writable() - shared_before)
    if leaked:
        why = "refused: the imports left writable shared memory that every box would share: "
        return record, (why + ", ".join(leaked[:3]))[:MAX_ERROR]
    log.info("preload: %s in %.2fs", record["modules"] or "nothing", record["seconds"])
    return record, None


def _import(name: str) -> str | None:
    """Import ``name``: ``None``, or why it failed (an image's module must not stop the
    kernel, not even by ``exit()``)."""
    try:
        importlib.import_module(name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 (and so ``print`` and C code alike) goes to stderr meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def restart_without(argv: list[str], why: str) -> None:
    """Start this kernel again in a fresh interpreter that preloads nothing (the shared
    memory goes with this one); the token's fd or file is still unread, so it carries over."""
    log.error("preload: %s; the kernel starts again without preloading", why)
    args = [sys.executable, "-m", "farm.kernel", *argv, REFUSED_FLAG, why]
    os.execv(sys.executable, args)


def reseed() -> None:
    """In every forked child: a fresh seed for numpy's global generator (``np.random.rand``),
    which numpy seeds from entropy once, at import; Python's ``random`` reseeds itself.
    256 bits from ``os.urandom`` (~25 us; numpy's own ``seed()`` takes ~100)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed(list(struct.unpack("8I", os.urandom(32))))
        except Exception as exc:  # a broken numpy must not stop a box
            log.debug("preload: numpy.random.seed() failed: %s", exc)


def _shared_writable() -> set[str]:
    """This process's writable shared mappings (``rw-s``): memory a fork would share."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    found = set()
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) >= 2 and fields[1].startswith("rw") and fields[1].endswith("s"):
            found.add(" ".join(fields[:1] + fields[5:]))
    return found
