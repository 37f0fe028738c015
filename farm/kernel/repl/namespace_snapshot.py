"""A session's namespace and workspace, written down to be carried to another box, and back.

Runs in the session process, called by a cell the worker sends (never journaled). ``dump``
pickles what it can of the namespace (cloudpickle when the image has it, else pickle, which
cannot carry code defined in the session) and tars the workspace's files into ``DIR``; every
name it leaves out is listed with why, never dropped silently. ``load`` puts them back in a
fresh box of an image with the same Python. Pickles are only ever loaded inside a box, never on
a host. Design: docs/design/snapshots.md.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import pickle
import sys
import tarfile
import types
from typing import Any

DIR = ".farm-snapshot"
MANIFEST = "manifest.json"
NAMESPACE = "namespace.pkl"
WORKSPACE = "workspace.tar"
REASON_CHARS = 300
ROOT = ""  # the box's workspace: set by the session loop


class SnapshotIncompatible(Exception):
    """The snapshot cannot be loaded here (another Python, or a pickler this image lacks)."""


class _Sink(io.RawIOBase):
    """Counts what a trial pickling writes, keeps nothing."""

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return len(data)


def _pickler() -> tuple[Any, str]:
    try:
        import cloudpickle  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return pickle, "pickle"
    return cloudpickle, "cloudpickle"


class _StdPickler(pickle.Pickler):
    """pickle would write code defined in the session by reference (``__main__.f``), which no
    other box has: refused, so that the name is listed as not carried."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)) and obj.__module__ == "__main__":
            raise pickle.PicklingError(
                f"{obj.__qualname__} is defined in the session: carrying code needs "
                "cloudpickle, which this image lacks"
            )
        return NotImplemented


def _dumper(module: Any, name: str, out: Any) -> Any:
    if name == "cloudpickle":
        return module.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    return _StdPickler(out, protocol=pickle.HIGHEST_PROTOCOL)


def _kernel_made(value: Any) -> bool:
    """What the kernel puts in every namespace (tools, ``display``, host call stubs): the new
    box makes its own."""
    module = getattr(value, "__module__", None) or type(value).__module__ or ""
    return str(module).startswith("farm.kernel")


def _candidates(ns: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    values, modules = {}, {}
    for name, value in ns.items():
        if name.startswith("__") and name.endswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            if getattr(value, "__spec__", None) is not None:
                modules[name] = value.__name__
            else:
                values[name] = value  # a module made in the session: its pickling says why
        elif not _kernel_made(value):
            values[name] = value
    return values, modules


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:REASON_CHARS]


def _pickle_namespace(values: dict[str, Any], path: str) -> tuple[str, dict[str, str]]:
    """Pickle ``values`` at ``path`` (together, so shared objects stay shared); a name that
    cannot be pickled is left out with its reason."""
    module, name = _pickler()
    lost: dict[str, str] = {}
    while True:
        try:
            with open(path, "wb") as out:
                _dumper(module, name, out).dump(values)
            return name, lost
        except Exception:  # find which names fail, alone
            failed = {}
            for key in list(values):
                try:
                    _dumper(module, name, _Sink()).dump(values[key])
                except Exception as exc:
                    failed[key] = _why(exc)
                    del values[key]
            if not failed:  # together fails, each alone passes: carry nothing rather than guess
                failed = {key: "could not be pickled with the others" for key in values}
                values.clear()
            lost.update(failed)


def _tar_workspace(root: str, path: str) -> tuple[int, dict[str, str]]:
    """Tar the workspace's files and directories (but ``DIR``); other kinds are listed."""
    skipped: dict[str, str] = {}
    files = 0
    with tarfile.open(path, "w") as tar:
        for top, dirs, names in os.walk(root):
            rel_top = os.path.relpath(top, root)
            if rel_top == ".":
                dirs[:] = [d for d in dirs if d != DIR]
            for entry in sorted(dirs) + sorted(names):
                full = os.path.join(top, entry)
                rel = os.path.normpath(os.path.join(rel_top, entry))
                if os.path.islink(full):
                    skipped[rel] = "a symbolic link"
                elif os.path.isdir(full):
                    tar.add(full, arcname=rel, recursive=False)
                elif os.path.isfile(full):
                    tar.add(full, arcname=rel, recursive=False)
                    files += 1
                else:
                    skipped[rel] = "not a regular file"
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
    return files, skipped


def dump(ns: dict[str, Any]) -> None:
    """Write the namespace ``ns`` and the workspace into ``DIR`` with a manifest."""
    root = ROOT or os.getcwd()
    where = os.path.join(root, DIR)
    os.makedirs(where, exist_ok=True)
    values, modules = _candidates(ns)
    pickler, lost = _pickle_namespace(values, os.path.join(where, NAMESPACE))
    files, skipped = _tar_workspace(root, os.path.join(where, WORKSPACE))
    manifest = {
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "pickler": pickler,
        "names": sorted(values),
        "modules": modules,
        "lost": lost,
        "files": files,
        "skipped_files": skipped,
        "namespace_bytes": os.path.getsize(os.path.join(where, NAMESPACE)),
        "workspace_bytes": os.path.getsize(os.path.join(where, WORKSPACE)),
    }
    with open(os.path.join(where, MANIFEST), "w") as out:
        json.dump(manifest, out)


def load(ns: dict[str, Any]) -> None:
    """Put a snapshot's namespace back into ``ns`` (its workspace was extracted by the host's
    file operation); prints ``{"lost": {...}}``: the modules this image cannot import."""
    where = os.path.join(ROOT or os.getcwd(), DIR)
    try:
        with open(os.path.join(where, MANIFEST)) as f:
            manifest = json.load(f)
        python = f"{sys.version_info[0]}.{sys.version_info[1]}"
        if manifest["python"] != python:
            raise SnapshotIncompatible(
                f"the snapshot was taken on Python {manifest['python']}, this image has {python}"
            )
        if manifest["pickler"] == "cloudpickle" and _pickler()[1] != "cloudpickle":
            raise SnapshotIncompatible("the snapshot needs cloudpickle, which this image lacks")
        lost: dict[str, str] = {}
        for name, module in manifest["modules"].items():
            try:
                ns[name] = importlib.import_module(module)
            except Exception as exc:
                lost[name] = _why(exc)
        try:
            with open(os.path.join(where, NAMESPACE), "rb") as f:
                values = pickle.load(f)
        except Exception as exc:
            raise SnapshotIncompatible(
                f"its variables cannot be loaded here: {_why(exc)}"
            ) from None
        ns.update(values)
    finally:
        for name in (MANIFEST, NAMESPACE, WORKSPACE):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(where, name))
        with contextlib.suppress(OSError):
            os.rmdir(where)
    print(json.dumps({"lost": lost}))
