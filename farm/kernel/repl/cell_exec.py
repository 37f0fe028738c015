"""IPython-style cell execution, decided with ``ast`` and ``tokenize``, never regex.

Rules (IPython's ``ast_node_interactivity="last_expr"``): when the last top-level statement is
an expression its value is the cell's value and is bound to ``_`` (older ones to ``__`` and
``___``); a trailing ``;`` suppresses it; ``None`` is no value. Top-level ``await`` works.
Tracebacks show user frames only, in a file called ``<cell>`` with the cell's line numbers.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import io
import linecache
import sys
import tokenize
import traceback
import types
from typing import Any

from .. import KIND_OOM, KIND_USER
from ..wire.protocol import CellError, ValueBundle
from . import inputs
from .render import bundle

CELL_FILE = "<cell>"
_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_CO_COROUTINE = 0x0080
_NOT_CODE = {
    tokenize.NEWLINE,
    tokenize.NL,
    tokenize.COMMENT,
    tokenize.ENDMARKER,
    tokenize.INDENT,
    tokenize.DEDENT,
}


class StdinNotImplementedError(RuntimeError):
    """Raised by ``input()``: a farm session has no terminal to read from."""


class _NoStdin(io.TextIOBase):
    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> str:
        raise StdinNotImplementedError(
            "input() is not available: farm sessions have no stdin; "
            "pass data in the code or through files"
        )

    readline = read  # type: ignore[assignment]


def ends_with_semicolon(code: str) -> bool:
    """IPython's rule: the last real token of the cell is ``;`` (comments don't count)."""
    if ";" not in code:
        return False
    last = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type not in _NOT_CODE:
                last = tok
    except (tokenize.TokenError, SyntaxError):
        return False
    return last is not None and last.type == tokenize.OP and last.string == ";"


def parse(code: str) -> ast.Module:
    """The cell's syntax tree; a cell that uses IPython-only syntax says so."""
    try:
        return ast.parse(code, filename=CELL_FILE, mode="exec")
    except SyntaxError as exc:
        special = inputs.unsupported(code)
        if special is not None:
            raise special from None
        raise exc from None


class Repl:
    """One session's namespace and the machinery to run cells in it."""

    def __init__(self, extra_globals: dict[str, Any] | None = None) -> None:
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
        main.__dict__.update(extra_globals or {})
        sys.modules["__main__"] = main  # so pickle/multiprocessing find user definitions
        self.namespace: dict[str, Any] = main.__dict__
        self.loop: asyncio.AbstractEventLoop | None = None
        sys.stdin = _NoStdin()
        builtins.StdinNotImplementedError = StdinNotImplementedError  # type: ignore[attr-defined]

    def _run_code(self, code: types.CodeType) -> Any:
        if code.co_flags & _CO_COROUTINE:
            if self.loop is None or self.loop.is_closed():
                self.loop = asyncio.new_event_loop()
            return self.loop.run_until_complete(eval(code, self.namespace))
        return eval(code, self.namespace)

    def run_cell(self, code: str) -> tuple[ValueBundle | None, CellError | None]:
        """Run one cell, cleaned as IPython cleans it (``inputs``); return ``(value, error)``
        as wire dicts (at most one is set)."""
        code = inputs.clean(code)
        linecache.cache[CELL_FILE] = (len(code), None, code.splitlines(True), CELL_FILE)
        try:
            tree = parse(code)
            last_expr = None
            if tree.body and isinstance(tree.body[-1], ast.Expr) and not ends_with_semicolon(code):
                last_expr = ast.Expression(tree.body.pop().value)  # type: ignore[attr-defined]
            body = (  # none for a lone expression (most quick cells): it costs a compile
                compile(tree, CELL_FILE, "exec", flags=_FLAGS, dont_inherit=True)
                if tree.body
                else None
            )
            expr = (
                compile(last_expr, CELL_FILE, "eval", flags=_FLAGS, dont_inherit=True)
                if last_expr is not None
                else None
            )
        except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
            return None, error_dict(exc, user_frames_only=False)
        try:
            if body is not None:
                self._run_code(body)
            if expr is None:
                return None, None
            value = self._run_code(expr)
            if value is None:
                return None, None
            self._remember(value)
            return bundle(value), None
        except BaseException as exc:
            return None, error_dict(exc)

    def _remember(self, value: Any) -> None:
        ns = self.namespace
        ns["___"] = ns.get("__")
        ns["__"] = ns.get("_")
        ns["_"] = value


def _user_traceback(exc: BaseException) -> types.TracebackType | None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def error_dict(exc: BaseException, *, user_frames_only: bool = True) -> CellError:
    tb = _user_traceback(exc) if user_frames_only else None
    try:
        lines = traceback.format_exception(type(exc), exc, tb)
    except Exception:
        lines = [f"{type(exc).__name__}: <unprintable>\n"]
    try:
        evalue = str(exc)
    except Exception:
        evalue = "<unprintable>"
    kind = KIND_OOM if isinstance(exc, MemoryError) else KIND_USER
    return {
        "ename": type(exc).__name__,
        "evalue": evalue[:8192],
        "traceback": [line[:8192] for line in lines[-200:]],
        "kind": kind,
    }
