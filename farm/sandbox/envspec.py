"""An environment's spec: what ``farm image build`` adds to the sandbox base, and its file.

A spec names the image (``farm-sandbox:NAME``) and lists pip requirements, Debian packages,
an optional base image (``from``), modules to preload and the limits its work needs;
``farm-env.toml`` holds one in a user's project, and the built-in variants are specs too.
Invariant: everything is validated before anything is built (apt names reach a shell, so they
must be names and nothing else); an image records its resolved spec in a label. File format
and reasons: docs/design/images.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import tomli_w
from packaging.requirements import InvalidRequirement, Requirement
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from farm.egress.policy import PolicyError, parse_rules
from farm.errors import InvalidRequest
from farm.image_name import sandbox_tag
from farm.judge.languages import Language

SPEC_FILE = "farm-env.toml"
# A Docker tag without "/" or ":" (those name other images), lower case, not too long: the
# name is also a queue (farm.NAME), a directory and a label.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
# A module to preload: a dotted Python name, nothing else (it reaches importlib in the kernel).
MODULE_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# Debian package names (policy 5.6.1), optionally pinned: nodejs, g++, libfoo1=1.2-3.
APT_PATTERN = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+:~-]+)?$")


class EnvLimits(BaseModel):
    """Sandbox limits an environment's work needs (``FARM_SANDBOX_*``); unset ones keep the
    worker's. Only sizes: the network, the user and read-only root are not a spec's to loosen."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_mb: int | None = Field(None, ge=64)
    cpus: float | None = Field(None, gt=0)
    pids: int | None = Field(None, ge=64)  # the sandbox's own floor (SandboxLimits.pids)
    nofile: int | None = Field(None, ge=64)
    fsize_mb: int | None = Field(None, ge=1)
    tmp_mb: int | None = Field(None, ge=1)
    workspace_mb: int | None = Field(None, ge=1)
    disk_mb: int | None = Field(None, ge=16)  # room for the boxes' disks together

    def settings_env(self) -> dict[str, str]:
        """The ``FARM_SANDBOX_*`` variables that give a worker these limits."""
        return {
            f"FARM_SANDBOX_{key.upper()}": str(value)
            for key, value in self.model_dump(exclude_none=True).items()
        }


class EnvSpec(BaseModel):
    """What a farm image holds beyond the kernel. ``requirements`` are paths of pip
    requirements files, relative to the spec file (or the working directory on the command
    line); :meth:`resolve` reads them into ``pip``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(pattern=NAME_PATTERN)
    from_image: str | None = Field(None, alias="from", min_length=1)
    pip: tuple[str, ...] = ()
    requirements: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()
    limits: EnvLimits = EnvLimits()
    egress: tuple[str, ...] = Field(
        (), description="hosts its boxes may reach (within the farm's ceiling, FARM_EGRESS_ALLOW)"
    )
    languages: dict[str, Language] = Field(
        default_factory=dict, description="the judge's languages (farm.judge.languages)"
    )
    preload: tuple[str, ...] = Field(
        (), description="modules the kernel imports before forking boxes (docs/design/preload.md)"
    )

    @property
    def tag(self) -> str:
        return sandbox_tag(self.name)

    @field_validator("name")
    @classmethod
    def _not_a_pin(cls, name: str) -> str:
        if re.search(r"-k[0-9a-f]{12}$", name):
            raise ValueError(f"{name!r} ends like a pinned tag (-k<12 hex digits>)")
        return name

    @field_validator("pip")
    @classmethod
    def _requirements_parse(cls, pip: tuple[str, ...]) -> tuple[str, ...]:
        for line in pip:
            try:
                Requirement(line)
            except InvalidRequirement as exc:
                raise ValueError(f"not a pip requirement: {line!r} ({exc})") from None
        return pip

    @field_validator("egress")
    @classmethod
    def _egress_rules(cls, egress: tuple[str, ...]) -> tuple[str, ...]:
        try:
            parse_rules(egress)
        except PolicyError as exc:
            raise ValueError(str(exc)) from None
        return egress

    @field_validator("apt")
    @classmethod
    def _apt_names(cls, apt: tuple[str, ...]) -> tuple[str, ...]:
        for name in apt:
            if not APT_PATTERN.match(name):
                raise ValueError(f"not a Debian package name: {name!r}")
        return apt

    @field_validator("preload")
    @classmethod
    def _module_names(cls, preload: tuple[str, ...]) -> tuple[str, ...]:
        for name in preload:
            if not MODULE_PATTERN.match(name):
                raise ValueError(f"not a module name: {name!r}")
        if len(set(preload)) != len(preload):
            raise ValueError("a module is named twice")
        return preload

    @field_validator("languages")
    @classmethod
    def _language_names(cls, languages: dict[str, Language]) -> dict[str, Language]:
        for name in languages:
            if not re.match(r"^[a-z0-9][a-z0-9_+.-]{0,31}$", name):
                raise ValueError(f"not a language name: {name!r}")
        return languages

    def resolve(self, base_dir: Path) -> EnvSpec:
        """This spec with its requirements files read into ``pip`` (paths relative to
        ``base_dir``): what an image is built from and records."""
        pip = list(self.pip)
        for path in self.requirements:
            pip += read_requirements(base_dir / path)
        return self.model_copy(update={"pip": tuple(pip), "requirements": ()})

    def canonical(self) -> str:
        """One JSON text per spec: what the image's label holds and its hash covers."""
        data = self.model_dump(mode="json", by_alias=True)
        for added in ("egress", "preload"):  # specs from before them keep their digest (and images)
            if not data[added]:
                del data[added]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        return hashlib.sha256(self.canonical().encode()).hexdigest()

    def summary(self) -> str:
        """One line for people: ``from X; pip: a, b; apt: c; limits: memory_mb=1024``."""
        parts = [f"from {self.from_image}"] if self.from_image else []
        parts += [f"pip: {', '.join(self.pip)}"] if self.pip else []
        parts += [f"requirements: {', '.join(self.requirements)}"] if self.requirements else []
        parts += [f"apt: {', '.join(self.apt)}"] if self.apt else []
        parts += [f"preload: {', '.join(self.preload)}"] if self.preload else []
        limits = self.limits.model_dump(exclude_none=True)
        if limits:
            parts.append("limits: " + " ".join(f"{k}={v}" for k, v in limits.items()))
        return "; ".join(parts) or "nothing added"


def make_spec(**fields: Any) -> EnvSpec:
    """An :class:`EnvSpec` from keyword fields, or ``InvalidRequest`` saying what is wrong."""
    try:
        return EnvSpec.model_validate(fields)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid environment spec: {_errors(exc)}") from None


def spec_from_json(text: str) -> EnvSpec:
    """The spec an image's label recorded (:meth:`EnvSpec.canonical`)."""
    return EnvSpec.model_validate_json(text)


def read_requirements(path: Path, _seen: frozenset[Path] = frozenset()) -> list[str]:
    """Requirement lines of a pip requirements file, with ``-r`` includes followed. Options
    (``--index-url``, ``-e``, hashes...) are refused: wheels come from the host's pip
    configuration, and an image is built from names and versions only."""
    path = path.resolve()
    if path in _seen:
        raise InvalidRequest(f"{path} includes itself")
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InvalidRequest(f"cannot read requirements file {path}: {exc}") from None
    found: list[str] = []
    for number, raw in enumerate(lines, 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not line:
            continue
        include = re.match(r"^(?:-r|--requirement)(?:\s+|=)(\S+)$", line)
        if include:
            found += read_requirements(path.parent / include[1], _seen | {path})
            continue
        if line.startswith("-"):
            raise InvalidRequest(f"{path}:{number}: pip options are not supported: {line!r}")
        try:
            Requirement(line)
        except InvalidRequirement as exc:
            raise InvalidRequest(f"{path}:{number}: not a requirement: {line!r} ({exc})") from None
        found.append(line)
    return found


def load_spec(path: Path, *, name: str | None = None) -> EnvSpec:
    """The spec in ``path`` (TOML, see the module's docstring); ``name`` overrides its own."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise InvalidRequest(f"cannot read environment spec {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidRequest(f"{path} is not valid TOML: {exc}") from None
    if name is not None:
        data["name"] = name
    try:
        return EnvSpec.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(f"{path}: {_errors(exc)}") from None


def dump_spec(spec: EnvSpec) -> str:
    """``spec`` as the TOML text :func:`load_spec` reads back to an equal spec."""
    data = spec.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    if not data.get("limits"):
        data.pop("limits", None)
    return tomli_w.dumps(data)


def save_spec(spec: EnvSpec, path: Path, *, base_dir: Path | None = None) -> None:
    """Write ``spec`` to ``path``; requirements paths given relative to ``base_dir`` (the
    working directory of a command line) are rewritten relative to the file."""
    if base_dir is not None and spec.requirements:
        spec = spec.model_copy(
            update={
                "requirements": tuple(
                    os.path.relpath((base_dir / r).resolve(), path.resolve().parent)
                    for r in spec.requirements
                )
            }
        )
    path.write_text(dump_spec(spec))


def _errors(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in error['loc']) or 'spec'}: {error['msg']}"
        for error in exc.errors()
    )
