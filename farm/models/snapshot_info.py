"""What a session snapshot holds and what a restore or a move carried (``farm.client.snapshots``).

A snapshot names every variable it could not carry and why (``lost``): nothing is left out
silently. Its image identity (image, digest, Python, pickler) decides where it may be restored.
"""

from __future__ import annotations

from pydantic import Field

from farm.models.model_base import Model


class SnapshotInfo(Model):
    """A session's snapshot: its variables, its workspace's files, the image it came from."""

    id: str
    session_id: str
    worker: str
    image: str = Field(description="the image name its session ran (its queue: where it goes)")
    image_digest: str | None = Field(default=None, description="the build its sandbox ran")
    python: str = Field(description="major.minor of the box's Python: pickles need the same")
    pickler: str = Field(description="cloudpickle (code carried by value) or pickle")
    names: list[str] = Field(default_factory=list, description="the variables it carries")
    modules: dict[str, str] = Field(
        default_factory=dict, description="imported modules, carried by name (imported again)"
    )
    lost: dict[str, str] = Field(
        default_factory=dict, description="variables it could not carry, and why"
    )
    limits: dict[str, int] | None = Field(
        default=None, description="its box's limits as asked: a restore asks the same"
    )
    egress: list[str] | None = Field(
        default=None, description="the hosts its box could reach, as asked: likewise"
    )
    files: int = 0
    skipped_files: dict[str, str] = Field(
        default_factory=dict, description="workspace entries not carried (links, devices)"
    )
    namespace_bytes: int = 0
    workspace_bytes: int = 0
    created_at: float = 0.0

    @property
    def size(self) -> int:
        return self.namespace_bytes + self.workspace_bytes


class Restored(Model):
    """A snapshot put back into a session: where, and what did not come back."""

    session_id: str
    worker: str
    snapshot: SnapshotInfo
    lost: dict[str, str] = Field(
        default_factory=dict,
        description="what the snapshot could not carry plus what this image could not load",
    )
    duration_s: float = 0.0


class DrainReport(Model):
    """A worker's drain: its sessions moved elsewhere (same ids), and those it could not."""

    worker: str
    moved: dict[str, str] = Field(default_factory=dict, description="session id -> new worker")
    lost: dict[str, str] = Field(
        default_factory=dict, description="session id -> what of its state was not carried"
    )
    failed: dict[str, str] = Field(
        default_factory=dict, description="session id -> why it could not be moved"
    )
    duration_s: float = 0.0
