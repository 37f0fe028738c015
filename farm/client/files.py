"""``session.files``: put files into a session's workspace and get them back."""

from __future__ import annotations

import ast
import base64
import io
import json
import os
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.errors import FileOperationError
from farm.kernel.tools import files_call

if TYPE_CHECKING:
    from farm.client.session import Session


class SessionFiles:
    """``session.files``: the session's workspace (``/workspace`` in a docker sandbox).

    Each operation is a small call in the session itself, so it is fenced, exactly-once and
    confined like the session's code: paths are resolved (symlinks included) and must stay in
    the workspace; sizes are bounded. Refusals raise ``FileOperationError``.
    """

    def __init__(self, session: Session) -> None:
        self.session = session

    def _call(self, method: str, *args: str | bytes) -> Any:
        result = self.session.run(files_call(method, *args))
        if result.error is not None:
            raise FileOperationError(f"{method}: {result.error.ename}: {result.error.evalue}")
        assert result.value is not None
        return json.loads(ast.literal_eval(result.value.data["text/plain"]))

    def write(self, path: str, data: bytes | str) -> int:
        raw = data.encode() if isinstance(data, str) else data
        reply = self._call("write_file", path, raw)
        return int(reply["size"])

    def read(self, path: str) -> bytes:
        return base64.b64decode(self._call("read_file", path)["data"])

    def list(self, path: str = ".") -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = self._call("list_files", path)
        return entries

    def remove(self, path: str) -> None:
        self._call("remove", path)

    def upload(self, source: str | os.PathLike[str], dest: str = ".") -> int:
        """Upload a local directory (or a .tar/.tar.gz file) into the workspace."""
        source = Path(source)
        if source.is_dir():
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
                tar.add(source, arcname=".")
            blob = buffer.getvalue()
        else:
            blob = source.read_bytes()
        reply = self._call("extract", blob, dest)
        return int(reply["files"])
