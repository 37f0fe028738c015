"""An image name is parsed once where it enters farm: what it is (default, variant, built
environment, reference to any image), its queue and its Docker tag follow from it, and a bad
one is an ``InvalidRequest`` before anything is sent or started."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from farm.client import Farm
from farm.errors import InvalidRequest
from farm.image_name import VARIANT_NAMES, ImageName, ServedImage
from farm.models.batch import BatchItem
from farm.sandbox.factory import sandboxes
from farm.sandbox.served import sandbox_ref
from farm.sandbox.variants import VARIANTS
from farm.settings import FarmSettings

BAD = ["", " ", "a b", "ds\n", "x:", "x/", "a//b", "-x", "ds;rm"]


@pytest.mark.parametrize(
    ("asked", "kind", "tag"),
    [
        ("default", "default", "farm-sandbox:default"),
        ("docs", "variant", "farm-sandbox:docs"),
        ("judge", "variant", "farm-sandbox:judge"),
        ("ds", "environment", "farm-sandbox:ds"),
        ("python:3.12-slim", "reference", "python:3.12-slim"),
        ("localhost:5000/team/img:v1", "reference", "localhost:5000/team/img:v1"),
        ("farm-sandbox:ds", "reference", "farm-sandbox:ds"),
    ],
)
def test_a_name_says_its_kind_queue_and_tag(asked: str, kind: str, tag: str) -> None:
    name = ImageName(asked)
    assert (name.kind, name.tag, name.queue, str(name)) == (kind, tag, f"farm.{asked}", asked)
    assert ImageName.parse(name) is name and ImageName.parse(asked) == name


@pytest.mark.parametrize("asked", BAD)
def test_a_bad_name_is_an_invalid_request(asked: str) -> None:
    with pytest.raises(InvalidRequest, match="bad image name"):
        ImageName(asked)


def test_the_variants_named_are_the_variants_defined() -> None:
    assert set(VARIANTS) == VARIANT_NAMES


def test_a_worker_with_a_bad_image_name_does_not_start() -> None:
    with pytest.raises(ValidationError, match="bad image name"):
        FarmSettings(image="a b")


def test_a_worker_runs_the_tag_its_image_names() -> None:
    assert sandbox_ref(ImageName("ds")) == "farm-sandbox:ds"
    assert sandbox_ref(ImageName("python:3.12-slim")) == "python:3.12-slim"
    assert sandbox_ref(ImageName("ds"), "x/y:1") == "x/y:1"  # FARM_SANDBOX_IMAGE


SERVED = ServedImage(
    ImageName("ds"),
    "farm-sandbox:ds",
    image_id="sha256:" + "1" * 64,
    digest="sha256:" + "1" * 64,
    spec={"name": "ds", "limits": {"memory_mb": 1024, "cpus": None}},
)


def test_a_served_image_reaches_a_worker_whole_and_gives_it_its_specs_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FARM_IMAGE", "ds")
    monkeypatch.setenv("FARM_SERVED_IMAGE", SERVED.to_json())
    settings = FarmSettings()
    assert settings.served_image == SERVED and settings.limits.memory_mb == 1024
    assert settings.limits.cpus == 1.0  # what the spec leaves unset keeps the default
    monkeypatch.setenv("FARM_SANDBOX_MEMORY_MB", "640")
    assert FarmSettings().limits.memory_mb == 640  # an explicit setting wins
    monkeypatch.setenv("FARM_IMAGE", "docs")
    with pytest.raises(ValidationError, match="FARM_SERVED_IMAGE is ds, FARM_IMAGE docs"):
        FarmSettings()


def test_a_workers_first_sandbox_runs_what_was_served_and_a_replacement_resolves_anew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import farm.sandbox.served

    resolved = replace(SERVED, image_id="sha256:" + "2" * 64, digest="sha256:" + "2" * 64)
    asked: list[tuple[ImageName, str | None]] = []

    def serve(name: ImageName, ref: str | None = None) -> ServedImage:
        asked.append((name, ref))
        return resolved

    monkeypatch.setattr(farm.sandbox.served, "serve", serve)
    make = sandboxes(FarmSettings(image="ds", served_image=SERVED, backend="docker"), "o")
    first, second = make(), make()
    assert (first.info().image_digest, second.info().image_digest) == (
        SERVED.digest,
        resolved.digest,
    )
    assert asked == [(ImageName("ds"), None)]


def test_a_map_item_with_a_bad_image_is_an_input_error() -> None:
    with pytest.raises(ValidationError, match="bad image name"):
        BatchItem(id=1, code="1", image="a b")


def test_farm_refuses_a_bad_image_name_before_sending(redis_server: Any) -> None:
    with Farm(FarmSettings(broker_url=redis_server.url)) as farm:
        for call in (
            lambda: farm.run("1", image="a b"),
            lambda: farm.session("a b"),
            lambda: farm.map(["1"], image="a b"),
        ):
            with pytest.raises(InvalidRequest, match="bad image name"):
                call()
        assert farm.registry.queue_length(ImageName("default").queue) == 0
