"""What a session's branching gives its caller: a ``Checkpoint`` (``session.checkpoint()``).

A checkpoint belongs to its session and lives until it is dropped, rolled back past (never:
a rollback keeps it) or its session closes. Design: docs/design/fork.md.
"""

from __future__ import annotations

from pydantic import Field

from farm.models.model_base import Model


class Checkpoint(Model):
    """A held copy of a session: its variables, imported modules and files (``/workspace``
    and the box's ``/tmp``) as they were; ``session.rollback(cp)`` returns to it exactly."""

    id: str
    session_id: str
    epoch: int = Field(description="the session's epoch when it was taken")
    files: int = Field(description="directories, files and links it holds")
    bytes: int = Field(description="the bytes of those files (held in the box's memory)")
