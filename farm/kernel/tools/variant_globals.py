"""Session globals that exist only in the image variants that can serve them.

``read_document`` where ``markitdown`` is installed (the ``docs`` image), ``browser`` where
Playwright and Chromium are (the ``browser`` image). Both modules are stdlib-only at import
and load their packages on first use, inside the session process; the default image, which
has neither package, gets neither global.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import browser, documents

if TYPE_CHECKING:
    from .workspace import Workspace


def variant_globals(workspace: Workspace) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if documents.AVAILABLE:
        extra["read_document"] = documents.DocumentReader(workspace)
    if browser.AVAILABLE:
        extra["browser"] = browser.Browser(workspace)
    return extra
