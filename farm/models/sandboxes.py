"""What a sandbox is and how it is doing, for ``farm status``, manifests and audits."""

from __future__ import annotations

from typing import Any

from pydantic import (
    Field,
)

from farm.models.model_base import Model

# --- sandboxes ------------------------------------------------------------------------------


class Preloaded(Model):
    """What a sandbox's kernel preloaded (``protocol.Preloaded``): modules every box has in
    ``sys.modules`` already, and those that failed (module -> why)."""

    modules: list[str] = Field(default_factory=list)
    failed: dict[str, str] = Field(default_factory=dict)
    seconds: float = 0.0


class SandboxInfo(Model):
    """What a sandbox is, for ``farm status``, result manifests and audits."""

    backend: str
    isolated: bool
    address: str
    container_id: str | None = None
    image: str | None = None
    image_digest: str | None = None
    image_spec: dict[str, Any] | None = Field(
        default=None,
        description="the environment spec a farm image was built from (farm image build)",
    )
    limits: dict[str, Any] = Field(default_factory=dict)
    kernel_version: str | None = None
    isolation: str | None = Field(
        None, description="what a box is here: namespaces, uids (the fallback) or dirs"
    )
    isolation_fallback: str | None = Field(
        None, description="why boxes have no namespaces although asked to (None: as asked)"
    )
    preload: Preloaded | None = Field(
        None, description="what its kernel preloaded (None: not asked yet or no kernel)"
    )
    started_at: float | None = None
    restarts: int = 0


class BoxCapacity(Model):
    """How many boxes a sandbox's kernel holds and has free (its ``Capacity``, and the boxes
    out of use until a reset of them succeeds)."""

    boxes: int = Field(description="boxes of the default limits it holds when none is alive")
    free: int = Field(description="of them, free now (ready spares included)")
    binding: str = Field(description="the budget that sets boxes: numbers, pids, disk_mb, ...")
    admitted: int = 0
    waiting: int = 0
    ending: int = 0
    refused: int = 0
    quarantined: int = 0

    @property
    def usable(self) -> int:
        """Boxes a worker may hand out: all, but those out of use."""
        return max(self.boxes - self.quarantined, 0)


class SandboxHealth(Model):
    ok: bool
    detail: str = ""
    rtt_s: float | None = None
    capacity: BoxCapacity | None = None
    box_limits: dict[str, int] = Field(
        default_factory=dict, description="a box's limits when a request names none"
    )
