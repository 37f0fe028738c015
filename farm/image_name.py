"""``ImageName``: the image a caller asked for, parsed once where it enters farm (``Farm``'s
calls, the CLI, a worker's settings); ``ServedImage``: that name resolved once where the image is
made ready (which tag, which build, which spec), handed down to the sandbox that runs it. A name
with ``/`` or ``:`` is a reference to any image (served with farm's kernel mounted in); a bare
one is a farm image, ``farm-sandbox:NAME``. Invariant: a name that parses has one queue and one
Docker tag; one that does not is an ``InvalidRequest`` before anything is sent or started.
Stdlib only, outside ``farm.sandbox``: clients import it. Why: docs/design/images.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any, Literal

from farm.errors import InvalidRequest

SANDBOX_REPOSITORY = "farm-sandbox"
VARIANT_NAMES = frozenset({"docs", "browser", "judge"})  # farm.sandbox.variants.VARIANTS
# A farm image's name is a Docker tag; a reference is a Docker image reference
# (registry/repository:tag or @digest), checked loosely: Docker has the last word.
FARM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
REFERENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,254}(?<![:/@])")

Kind = Literal["default", "variant", "environment", "reference"]


def sandbox_tag(name: str) -> str:
    """The Docker tag of the farm image ``name``: ``farm-sandbox:NAME``."""
    return f"{SANDBOX_REPOSITORY}:{name}"


@dataclass(frozen=True)
class ImageName:
    """What was asked (``default``, ``docs``, ``ds``, ``python:3.12-slim``), checked."""

    asked: str = "default"

    def __post_init__(self) -> None:
        pattern = REFERENCE if _is_reference(self.asked) else FARM_NAME
        asked = self.asked if isinstance(self.asked, str) else ""
        if not pattern.fullmatch(asked) or "//" in asked:
            raise InvalidRequest(
                f"bad image name {self.asked!r}: a farm image's name (default, docs, a built "
                "one) or an image reference (registry/repository:tag)"
            )

    @classmethod
    def parse(cls, image: str | ImageName) -> ImageName:
        return image if isinstance(image, ImageName) else cls(image)

    @property
    def kind(self) -> Kind:
        if _is_reference(self.asked):
            return "reference"
        if self.asked == "default":
            return "default"
        return "variant" if self.asked in VARIANT_NAMES else "environment"

    @property
    def queue(self) -> str:
        """Where one-shot runs, session opens and map chunks for this image go; any worker
        serving it may take them."""
        return f"farm.{self.asked}"

    @property
    def tag(self) -> str:
        """The Docker image its sandboxes run: the reference itself, or ``farm-sandbox:NAME``
        (for ``default``, a worker prefers the build of its own kernel: ``served.sandbox_ref``)."""
        return self.asked if self.kind == "reference" else sandbox_tag(self.asked)

    def __str__(self) -> str:
        return self.asked


@dataclass(frozen=True)
class ServedImage:
    """An image made ready to serve, resolved once (``farm.sandbox.served.resolve``): the
    ``name`` asked, the ``tag`` its sandboxes report, the build that tag named then
    (``image_id``; ``digest``, what sandboxes report: the registry digest, else the id), whether
    farm's kernel is built in (else it is mounted) and the spec the image recorded, if any. A
    sandbox runs ``image_id``, so what it reports is what runs."""

    name: ImageName
    tag: str
    image_id: str
    digest: str
    kernel_built_in: bool = True
    spec: dict[str, Any] | None = None

    def to_json(self) -> str:
        """One line for a worker's environment (``FARM_SERVED_IMAGE``)."""
        return json.dumps({**asdict(self), "name": self.name.asked}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ServedImage:
        fields = json.loads(text)
        return cls(**{**fields, "name": ImageName(fields["name"])})


def _is_reference(name: object) -> bool:
    return isinstance(name, str) and ("/" in name or ":" in name)
