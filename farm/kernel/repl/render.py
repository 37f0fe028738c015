"""A value's MIME bundle and its bounded text: the representation cascade.

``text`` follows the cascade: ``_repr_markdown_`` when the object offers it; else, when it has
``_repr_html_``, its plain ``repr`` (the HTML travels in ``data``); else a bounded text: the
``repr`` for ordinary values, a shape summary for big built-in containers (at most 2048
characters, depth 2, 50 items) so that ``dict(range(10**6))`` costs nothing to show.
``data["text/plain"]`` is always present. Every rendering is bounded and a ``_repr_*_`` that
raises is contained; one that never returns is stopped by the exec timeout.
"""

from __future__ import annotations

import base64
import itertools
import json
import sys
from typing import Any

from ..wire.protocol import ValueBundle

SUMMARY_CHARS = 2048
SUMMARY_DEPTH = 2
SUMMARY_ITEMS = 50
REPR_CHARS = 64 * 1024
RICH_BYTES = 8 * 1024 * 1024
WALK_BUDGET = 2000

_CONTAINERS = (list, tuple, set, frozenset, dict)
_RICH = (
    ("_repr_markdown_", "text/markdown"),
    ("_repr_html_", "text/html"),
    ("_repr_png_", "image/png"),
    ("_repr_json_", "application/json"),
)


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = (limit - 40) // 2
    return f"{text[:half]}… [{len(text) - 2 * half} chars cut] …{text[-half:]}"


def safe_repr(obj: object, limit: int = REPR_CHARS) -> str:
    try:
        return clip(repr(obj), limit)
    except Exception as exc:  # a user __repr__ may raise anything
        return f"<repr of {type(obj).__name__} object failed: {type(exc).__name__}: {exc}>"


def _is_big(obj: object) -> bool:
    """True when a built-in container nests more than we want to ``repr`` in full."""
    budget = WALK_BUDGET
    stack: list[Any] = [obj]
    while stack:
        item = stack.pop()
        if type(item) not in _CONTAINERS:
            continue
        size = len(item)
        if size > SUMMARY_ITEMS:
            return True
        budget -= size
        if budget < 0:
            return True
        stack.extend(item.values() if isinstance(item, dict) else item)
    return False


def _summary(obj: Any, depth: int) -> str:
    kind = type(obj)
    if kind not in _CONTAINERS:
        return safe_repr(obj, 200)
    size = len(obj)
    name = kind.__name__
    if depth >= SUMMARY_DEPTH:
        return f"<{name} with {size} items>"
    if kind is dict:
        parts = [
            f"{safe_repr(k, 200)}: {_summary(v, depth + 1)}"
            for k, v in itertools.islice(obj.items(), SUMMARY_ITEMS)
        ]
    else:
        parts = [_summary(v, depth + 1) for v in itertools.islice(obj, SUMMARY_ITEMS)]
    if size > SUMMARY_ITEMS:
        parts.append("…")
    inner = ", ".join(parts)
    brackets: dict[type, str] = {list: "[]", tuple: "()", dict: "{}", set: "{}", frozenset: "{}"}
    body = f"{brackets[kind][0]}{inner}{brackets[kind][1]}"
    if kind is frozenset:
        body = f"frozenset({body})"
    return f"{name} with {size} items {body}"


def plain_text(obj: object) -> str:
    if type(obj) in _CONTAINERS and _is_big(obj):
        return clip(_summary(obj, 0), SUMMARY_CHARS)
    return safe_repr(obj)


def _rich(obj: object, method: str) -> Any:
    if isinstance(obj, type):
        return None  # a class's _repr_*_ is an unbound function, not a representation
    fn = getattr(obj, method, None)
    if not callable(fn):
        return None
    try:
        return fn()
    except Exception:
        return None


def bundle(obj: object) -> ValueBundle:
    """The ``{"text", "data"}`` value of a run, JSON-serialisable and bounded."""
    plain = plain_text(obj)
    data: dict[str, Any] = {"text/plain": plain}
    for method, mime in _RICH:
        rich = _rich(obj, method)
        if rich is None:
            continue
        if isinstance(rich, tuple):  # (data, metadata) form
            rich = rich[0]
        if mime == "image/png" and isinstance(rich, bytes):
            if len(rich) <= RICH_BYTES:
                data[mime] = base64.b64encode(rich).decode("ascii")
        elif mime == "application/json":
            try:
                if len(json.dumps(rich)) <= RICH_BYTES:
                    data[mime] = rich
            except (TypeError, ValueError):
                pass
        elif isinstance(rich, str):
            data[mime] = clip(rich, RICH_BYTES)
    text = data.get("text/markdown", plain)
    return {"text": text, "data": data}


FRAME_BYTES = 4 * 1024 * 1024  # a value or display bigger than this travels as its text alone


def framed(value: ValueBundle) -> ValueBundle:
    """``value`` as it may travel in a frame: a bundle over ``FRAME_BYTES`` (its rich parts
    add up: 8 MiB of each kind is allowed) keeps only ``text/plain``, and says so on stderr."""
    size = len(json.dumps(value))
    if size <= FRAME_BYTES:
        return value
    plain = value["data"]["text/plain"]
    print(
        f"[farm: a value's MIME bundle of {size} bytes is over {FRAME_BYTES}; "
        "only its text/plain is kept]",
        file=sys.stderr,
    )
    return {"text": plain, "data": {"text/plain": plain}}
