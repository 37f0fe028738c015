"""``read_document(path, page=1)``: PDF, DOCX, PPTX, XLSX, HTML and text as paginated markdown.

Conversion is ``markitdown``'s, which only the ``docs`` image has (``farm.session(image=
"docs")``); it is imported on the first call, in the session process, so the kernel itself
stays stdlib-only and sessions that never read a document pay nothing. Parsers of untrusted
files are an attack surface: they run here, inside the sandbox, with its limits (a parser that
never returns is stopped by the exec timeout like any other code).

Paths go through ``Workspace.confine`` like every tool's. A converted document is cached per
session by (path, size, mtime), so reading page after page converts it once.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .workspace import Workspace

DEFAULT_LINES_PER_PAGE = 100
CACHE_DOCUMENTS = 8


# Decided once, when the zygote imports the kernel, without importing markitdown.
AVAILABLE = importlib.util.find_spec("markitdown") is not None


class DocumentError(ValueError):
    """A document that cannot be converted, or a page it does not have."""


def paginate(text: str, lines_per_page: int) -> list[str]:
    """``text`` cut into pages of ``lines_per_page`` lines; an empty text is one empty page."""
    if lines_per_page < 1:
        raise DocumentError(f"lines_per_page must be at least 1, not {lines_per_page}")
    lines = text.strip("\n").splitlines()
    if not lines:
        return [""]
    return ["\n".join(lines[i : i + lines_per_page]) for i in range(0, len(lines), lines_per_page)]


class DocumentReader:
    """The ``read_document`` global of a session in the docs image."""

    def __init__(self, workspace: Workspace, lines_per_page: int = DEFAULT_LINES_PER_PAGE) -> None:
        self.workspace = workspace
        self.lines_per_page = lines_per_page
        self._converter: Any = None
        self._cache: dict[tuple[str, int, int], str] = {}

    def __call__(self, path: str, page: int = 1, lines_per_page: int | None = None) -> str:
        """Page ``page`` (1-based) of ``path`` as markdown, headed ``[Page i/N]``.

        ``lines_per_page`` overrides the session's default (``read_document.lines_per_page``,
        100 lines) for this call.
        """
        pages = paginate(self.markdown(path), lines_per_page or self.lines_per_page)
        if not 1 <= page <= len(pages):
            raise DocumentError(f"{path!r} has {len(pages)} page(s); there is no page {page}")
        return f"[Page {page}/{len(pages)}]\n\n{pages[page - 1]}"

    def markdown(self, path: str) -> str:
        """The whole document as markdown (converted once per version of the file)."""
        target = self.workspace.confine(path)
        if not target.is_file():
            raise FileNotFoundError(f"{path!r} is not a file in the workspace")
        stat = target.stat()
        key = (str(target), stat.st_size, stat.st_mtime_ns)
        if key not in self._cache:
            if len(self._cache) >= CACHE_DOCUMENTS:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = self._convert(os.fspath(target))
        return self._cache[key]

    def _convert(self, path: str) -> str:
        if self._converter is None:
            try:
                from markitdown import MarkItDown
            except ImportError as exc:
                raise DocumentError(
                    "read_document needs markitdown, which the 'docs' image has: "
                    "farm.session(image='docs')"
                ) from exc
            self._converter = MarkItDown(enable_plugins=False)
        try:
            result = self._converter.convert_local(path)
        except Exception as exc:  # markitdown's converters raise anything on a bad file
            raise DocumentError(f"cannot convert {path!r}: {type(exc).__name__}: {exc}") from None
        return str(result.text_content or "")

    def __repr__(self) -> str:
        return f"<read_document(path, page=1, lines_per_page={self.lines_per_page})>"
