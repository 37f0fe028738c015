"""``FarmSandboxConfig``: what a task says about its farm sandboxes (``sandbox=("farm", cfg)``).

Frozen and plain JSON, since Inspect keeps configs in sets and writes them into eval logs; one
loader reads a YAML or JSON file into it too. Invariant: a ``broker_url`` holding a password
is refused when the provider is to use it (eval logs are shared), with the password masked,
while the model still accepts it so old logs load. Why: docs/design/inspect-provider.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from kombu.utils.url import maybe_sanitize_url
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from farm.errors import InvalidRequest
from farm.models import BoxLimits

INSPECT_IMAGE = "inspect"  # the provider's own environment: the sandbox image plus procps
CONFIG_FILES = ("farm.yaml", "farm.yml")
MAX_TIMEOUT_S = (
    24 * 3600.0
)  # the longest a farm command may run (farm.kernel.supervisor.server's bound)


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
    ``broker_url`` must not hold the password (see the module's docstring).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    broker_url: str | None = None
    image: str = INSPECT_IMAGE
    workers: int = Field(default=2, ge=1, description="workers of an embedded farm")
    limits: FarmSandboxLimits = FarmSandboxLimits()
    timeout_s: float = Field(default=MAX_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S)
    open_wait_s: float = Field(default=600.0, gt=0)


def usable_config(config: BaseModel | str | None) -> FarmSandboxConfig:
    """``resolve_config``, refusing a ``broker_url`` that carries a password (``InvalidRequest``,
    the URL shown with its password masked): what ``task_init`` and ``sample_init`` run with."""
    resolved = resolve_config(config)
    url = resolved.broker_url
    if url is not None and urlsplit(url).password is not None:
        raise InvalidRequest(
            "broker_url must not hold the broker's password: Inspect writes the sandbox config "
            "into the eval log (log.eval.sandbox), which people share. Give the URL without it "
            "(redis://host:6379/0, or redis://USER@host:6379/0 for an ACL user) and set "
            f"FARM_BROKER_PASSWORD in the eval's environment (broker_url: "
            f"{maybe_sanitize_url(url)})"
        )
    return resolved


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
