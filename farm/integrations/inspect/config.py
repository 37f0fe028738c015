"""``FarmSandboxConfig``: what a task says about its farm sandboxes (``sandbox=("farm", cfg)``).

Inspect keeps sandbox configs in sets and writes them into the eval log, so the model is frozen
(hashable) and made of plain JSON values; a log read back rebuilds it through the provider's
``config_deserialize``. A task may also name a YAML or JSON file (``sandbox=("farm",
"farm.yaml")``, or a ``farm.yaml`` next to the task): one loader reads both into this model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from farm.errors import InvalidRequest
from farm.models import BoxLimits

INSPECT_IMAGE = "inspect"  # the provider's own environment: the sandbox image plus procps
CONFIG_FILES = ("farm.yaml", "farm.yml")
MAX_TIMEOUT_S = 24 * 3600.0  # the longest a farm command may run (farm.kernel.server's bound)


class FarmSandboxLimits(BoxLimits):
    """``BoxLimits`` made hashable, so that a config holding them can be."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class FarmSandboxConfig(BaseModel):
    """One farm sandbox configuration of an Inspect task.

    ``broker_url`` names a running farm; without one (and without ``FARM_BROKER_URL``) the
    provider starts an embedded local farm of ``workers`` Docker workers once per process.
    ``image`` is a farm image: the default, ``inspect``, is the sandbox image with ``procps``
    (built on first use by an embedded farm; on a farm of yours, `farm image build inspect
    --apt procps`). ``limits`` are each sample box's. ``timeout_s`` is a command's timeout when
    Inspect gives none; ``open_wait_s`` how long a sample waits for room on a full farm.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    broker_url: str | None = None
    image: str = INSPECT_IMAGE
    workers: int = Field(2, ge=1, description="workers of an embedded farm")
    limits: FarmSandboxLimits = FarmSandboxLimits()
    timeout_s: float = Field(MAX_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S)
    open_wait_s: float = Field(600.0, gt=0)


def resolve_config(config: BaseModel | str | None) -> FarmSandboxConfig:
    """The ``FarmSandboxConfig`` Inspect's ``config`` stands for (a model, a file, or none)."""
    if config is None:
        return FarmSandboxConfig()
    if isinstance(config, FarmSandboxConfig):
        return config
    if isinstance(config, str):
        return load_config(Path(config))
    try:  # a model of another class with the same fields (e.g. rebuilt from a log)
        return FarmSandboxConfig.model_validate(config.model_dump())
    except ValidationError as exc:
        raise InvalidRequest(f"not a farm sandbox config: {exc}") from None


def load_config(path: Path) -> FarmSandboxConfig:
    """A config file: YAML (JSON being YAML, one parser reads both); empty means defaults."""
    try:
        data: Any = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidRequest(f"cannot read farm sandbox config {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise InvalidRequest(f"{path} is neither YAML nor JSON: {exc}") from None
    try:
        return FarmSandboxConfig.model_validate(data or {})
    except ValidationError as exc:
        raise InvalidRequest(f"{path}: {exc}") from None
