"""The base of every farm model: unknown fields are refused, so a drifted peer fails loudly."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")
