"""A session's state by value, for a fork into a box of its own (``session.fork()``).

``export`` turns the namespace and the box's files into bytes, ``load`` makes them the
namespace and files of a fresh session in another box. Only bytes cross (through the
supervisor), never a process: the fork is an ordinary box. Carried: the files (as a
checkpoint holds them), functions and classes defined in cells (their code objects, by
``marshal``: one interpreter, one image), every global that pickles, and imported modules (by
name). What is not is named in ``not_carried``. Design: docs/design/fork.md.
"""

from __future__ import annotations

import contextlib
import importlib
import marshal
import pickle
import sys
import types
from collections.abc import Mapping
from typing import Any

from .box_files import restore, snapshot

MAIN = "__main__"  # the REPL's namespace is this module's (``cell_exec.Repl``)
MAX_STATE = 32 * 1024 * 1024  # bytes of state a fork carries: one frame's blob
Spec = tuple[str, str, Any]  # kind, name, payload


def answer(order: Mapping[str, Any], namespace: dict[str, Any], roots: list[str]) -> dict[str, Any]:
    """The frame that answers an ``export`` (``exported``) or an ``import`` (``imported``)."""
    if order["type"] == "export":
        try:
            state, not_carried = export(namespace, roots)
        except MemoryError:
            return {"type": "exported", "error": "no memory left", "budget": True}
        except Exception as exc:
            return {"type": "exported", "error": f"{type(exc).__name__}: {exc}"}
        if len(state) > MAX_STATE:
            why = f"its state is {len(state) >> 20} MiB, past the {MAX_STATE >> 20} MiB of a fork"
            return {"type": "exported", "error": why, "budget": True}
        return {"type": "exported", "blob": state, "not_carried": not_carried}  # raw: framing
    try:
        failed = load(namespace, roots, order["blob"])
    except Exception as exc:
        return {"type": "imported", "error": f"{type(exc).__name__}: {exc}"}
    return {"type": "imported", "not_carried": failed}


def export(namespace: dict[str, Any], roots: list[str]) -> tuple[bytes, list[str]]:
    """The state as bytes, and the names left out (``name: why``)."""
    not_carried: list[str] = []
    specs: list[Spec] = []
    data: dict[str, Any] = {}
    for name, value in namespace.items():
        if name.startswith("__") and name.endswith("__"):
            continue
        try:
            if isinstance(value, types.ModuleType):
                specs.append(("module", name, value.__name__))
            elif _defined_here(value) and isinstance(value, types.FunctionType):
                specs.append(("function", name, _function(value)))
            elif _defined_here(value) and isinstance(value, type):
                specs.append(("class", name, _class(value)))
            else:
                data[name] = value
        except Exception as exc:
            not_carried.append(f"{name}: {type(exc).__name__}: {exc}")
    blob = _pickled(data, not_carried)
    modules = sorted(n for n, m in sys.modules.items() if m is not None and n != MAIN)
    files = [snapshot(root) for root in roots]
    return pickle.dumps((modules, specs, blob, files)), not_carried


def load(namespace: dict[str, Any], roots: list[str], state: bytes) -> list[str]:
    """Make ``state`` this session's; the names that could not be made here."""
    modules, specs, blob, files = pickle.loads(state)
    for module in modules:
        if module not in sys.modules:
            with contextlib.suppress(Exception):  # one that needs what is not here
                importlib.import_module(module)
    for root, entries in zip(roots, files):
        restore(root, entries)
    failed: list[str] = []
    for kind, name, payload in specs:
        try:
            if kind == "module":
                namespace[name] = importlib.import_module(payload)
            elif kind == "function":
                namespace[name] = _make_function(payload, namespace)
            else:
                namespace[name] = _make_class(payload, namespace)
        except Exception as exc:
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    for name, pickled in blob.items():
        try:
            namespace[name] = pickle.loads(pickled)
        except Exception as exc:
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    return failed


def _defined_here(value: Any) -> bool:
    return getattr(value, "__module__", None) == MAIN


def _pickled(data: dict[str, Any], not_carried: list[str]) -> dict[str, bytes]:
    """Each variable by itself, so that one that cannot be made again in the fork (an
    instance of a class that was not carried) costs only itself."""
    kept = {}
    for name, value in data.items():
        try:
            kept[name] = pickle.dumps(value)
        except Exception as exc:
            not_carried.append(f"{name}: {type(value).__name__} ({type(exc).__name__})")
    return kept


def _function(f: Any) -> tuple[Any, ...]:
    closure = None
    if f.__closure__ is not None:
        names = f.__code__.co_freevars
        closure = [
            None if name == "__class__" else pickle.dumps(cell.cell_contents)
            for name, cell in zip(names, f.__closure__)
        ]
    extra = pickle.dumps((f.__defaults__, f.__kwdefaults__, f.__dict__))
    return marshal.dumps(f.__code__), f.__name__, f.__qualname__, closure, extra


def _make_function(
    payload: tuple[Any, ...], namespace: dict[str, Any], owner: type | None = None
) -> types.FunctionType:
    code, name, qualname, closure, extra = payload
    cells = None
    if closure is not None:
        cells = tuple(
            types.CellType(owner if item is None else pickle.loads(item)) for item in closure
        )
    f = types.FunctionType(marshal.loads(code), namespace, name, None, cells)
    f.__defaults__, f.__kwdefaults__, attrs = pickle.loads(extra)
    f.__dict__.update(attrs)
    f.__qualname__ = qualname
    return f


_SKIPPED = ("__dict__", "__weakref__", "__module__", "__qualname__")


def _class(cls: type) -> tuple[Any, ...]:
    if type(cls) is not type:
        raise TypeError(f"its metaclass {type(cls).__name__} is not carried")
    members: list[tuple[str, str, Any]] = []
    for attr, member in cls.__dict__.items():
        if attr in _SKIPPED:
            continue
        if isinstance(member, types.FunctionType):
            members.append((attr, "function", _function(member)))
        elif isinstance(member, (staticmethod, classmethod)):
            kind = type(member).__name__
            members.append((attr, kind, _function(member.__func__)))
        elif isinstance(member, property):
            parts = (member.fget, member.fset, member.fdel)
            members.append((attr, "property", [p and _function(p) for p in parts]))
        else:
            members.append((attr, "value", pickle.dumps(member)))
    return cls.__name__, cls.__qualname__, pickle.dumps(cls.__bases__), members


def _make_class(payload: tuple[Any, ...], namespace: dict[str, Any]) -> type:
    name, qualname, bases, members = payload
    cls = type(name, pickle.loads(bases), {"__module__": MAIN, "__qualname__": qualname})
    for attr, kind, item in members:
        if kind == "function":
            value: Any = _make_function(item, namespace, cls)
        elif kind in ("staticmethod", "classmethod"):
            wrap = staticmethod if kind == "staticmethod" else classmethod
            value = wrap(_make_function(item, namespace, cls))
        elif kind == "property":
            fget, fset, fdel = (p and _make_function(p, namespace, cls) for p in item)
            value = property(fget, fset, fdel)
        else:
            value = pickle.loads(item)
        setattr(cls, attr, value)
    return cls
