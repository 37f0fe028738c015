"""Environment specs without Docker: the spec file round-trips, requirements files are read,
what cannot be built is refused before anything is, and a spec's limits reach the settings."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest

from farm.errors import ImageBuildError, InvalidRequest
from farm.sandbox.catalog import RESERVED, build_image
from farm.sandbox.environments import explain
from farm.sandbox.envspec import (
    EnvLimits,
    dump_spec,
    load_spec,
    make_spec,
    save_spec,
    spec_from_json,
)
from farm.sandbox.images import _build_log
from farm.sandbox.variants import VARIANTS
from farm.settings import FarmSettings, SandboxLimits

SPEC_TEXT = """\
name = "ds"
from = "python:3.12-slim"
pip = ["numpy>=1.26", "pandas[performance]"]
requirements = ["reqs/base.txt"]
apt = ["nodejs", "g++", "libfoo1=1.2-3"]
preload = ["numpy", "pandas", "numpy.random"]

[limits]
memory_mb = 1024
cpus = 1.5
"""


def test_a_spec_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "farm-env.toml"
    path.write_text(SPEC_TEXT)
    spec = load_spec(path)
    assert spec.name == "ds" and spec.tag == "farm-sandbox:ds"
    assert spec.from_image == "python:3.12-slim"
    assert spec.pip == ("numpy>=1.26", "pandas[performance]")
    assert spec.requirements == ("reqs/base.txt",)
    assert spec.apt == ("nodejs", "g++", "libfoo1=1.2-3")
    assert spec.preload == ("numpy", "pandas", "numpy.random")
    assert spec.limits == EnvLimits(memory_mb=1024, cpus=1.5)
    copy = tmp_path / "copy.toml"
    save_spec(spec, copy)
    assert load_spec(copy) == spec
    assert dump_spec(load_spec(copy)) == dump_spec(spec)
    # what an image records (its label) comes back as the same spec too
    assert spec_from_json(spec.canonical()) == spec


def test_a_minimal_spec_file_is_just_a_name_and_packages(tmp_path: Path) -> None:
    spec = make_spec(name="np", pip=["numpy"])
    save_spec(spec, tmp_path / "farm-env.toml")
    assert (tmp_path / "farm-env.toml").read_text() == 'name = "np"\npip = [\n    "numpy",\n]\n'
    assert load_spec(tmp_path / "farm-env.toml", name="other").name == "other"


def test_requirements_files_are_read_relative_to_the_spec(tmp_path: Path) -> None:
    (tmp_path / "reqs").mkdir()
    (tmp_path / "reqs" / "base.txt").write_text(
        "# pinned for the benchmark\nscipy==1.13.1  # inline comment\n\n-r more.txt\n"
    )
    (tmp_path / "reqs" / "more.txt").write_text("requests>=2\n")
    spec = load_spec(_write(tmp_path / "farm-env.toml", SPEC_TEXT))
    resolved = spec.resolve(tmp_path)
    assert resolved.pip == ("numpy>=1.26", "pandas[performance]", "scipy==1.13.1", "requests>=2")
    assert resolved.requirements == ()
    assert resolved.digest() != spec.digest()
    # A file saved from the command line keeps pointing at the same requirements file.
    sub = tmp_path / "project" / "env"
    sub.mkdir(parents=True)
    save_spec(spec, sub / "farm-env.toml", base_dir=tmp_path)
    assert load_spec(sub / "farm-env.toml").resolve(sub).pip == resolved.pip


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('name = "Bad/Name"', "name"),
        ('name = "a:b"', "name"),
        ('name = "ds-k0123456789ab"', "pinned tag"),
        ('name = "ok"\npip = ["numpy>>1"]', "not a pip requirement"),
        ('name = "ok"\napt = ["nodejs; rm -rf /"]', "not a Debian package name"),
        ('name = "ok"\nimage = "x"', "image"),
        ('name = "ok"\npreload = ["os; import x"]', "not a module name"),
        ('name = "ok"\npreload = ["numpy."]', "not a module name"),
        ('name = "ok"\npreload = ["numpy", "numpy"]', "named twice"),
        ('name = "ok"\n[limits]\nnetwork = "host"', "limits.network"),
        ('name = "ok"\n[limits]\nmemory_mb = 1', "limits.memory_mb"),
        ("name = ", "not valid TOML"),
    ],
)
def test_a_spec_farm_cannot_build_is_refused_saying_why(
    tmp_path: Path, text: str, complaint: str
) -> None:
    with pytest.raises(InvalidRequest, match="farm-env.toml") as caught:
        load_spec(_write(tmp_path / "farm-env.toml", text))
    assert complaint in str(caught.value)


def test_requirements_files_with_pip_options_are_refused(tmp_path: Path) -> None:
    _write(tmp_path / "requirements.txt", "numpy\n--index-url https://example.invalid/simple\n")
    spec = make_spec(name="ok", requirements=["requirements.txt"])
    with pytest.raises(InvalidRequest, match=r"requirements.txt:2: pip options"):
        spec.resolve(tmp_path)
    with pytest.raises(InvalidRequest, match="cannot read"):
        make_spec(name="ok", requirements=["missing.txt"]).resolve(tmp_path)


@pytest.mark.parametrize("name", sorted(RESERVED))
def test_an_environment_may_not_take_the_name_of_a_farm_image(name: str) -> None:
    with pytest.raises(InvalidRequest, match="one of farm's images"):
        build_image(name, make_spec(name=name, pip=["numpy"]))


def test_farm_builds_farm_images_only() -> None:
    with pytest.raises(InvalidRequest, match=r"'python:3.12-slim' is an image reference"):
        build_image("python:3.12-slim")  # before Docker is asked anything
    with pytest.raises(InvalidRequest, match="bad image name"):
        build_image("a b")


def test_an_environments_egress_rules_are_checked_and_keep_old_digests() -> None:
    with pytest.raises(InvalidRequest, match="ports must be"):
        make_spec(name="net", egress=["pypi.org:https"])
    plain = make_spec(name="net", pip=["numpy"])
    assert "egress" not in plain.canonical()  # specs from before egress: the same digest
    allowed = make_spec(name="net", pip=["numpy"], egress=["pypi.org"])
    assert allowed.digest() != plain.digest() and allowed.egress == ("pypi.org",)


def test_preloads_change_the_digest_and_a_spec_without_them_keeps_its_own() -> None:
    plain = make_spec(name="ds", pip=["numpy"])
    assert "preload" not in plain.canonical()  # specs from before preload: the same digest
    warm = make_spec(name="ds", pip=["numpy"], preload=["numpy"])
    assert warm.digest() != plain.digest()
    assert warm.summary() == "pip: numpy; preload: numpy"
    assert spec_from_json(warm.canonical()) == warm


def test_the_variants_are_specs_with_their_images_limits() -> None:
    assert VARIANTS["browser"].apt == ("chromium", "fonts-dejavu-core", "libatomic1")
    for name, spec in VARIANTS.items():
        settings = FarmSettings(image=name).limits
        for key, value in spec.limits.model_dump(exclude_none=True).items():
            assert getattr(settings, key) == value, (name, key)


def test_a_specs_limits_are_the_settings_a_worker_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = EnvLimits(memory_mb=768, pids=256, cpus=0.5, disk_mb=2048)
    for key, value in limits.settings_env().items():
        monkeypatch.setenv(key, value)
    got = FarmSettings(image="some-env").limits
    assert (got.memory_mb, got.pids, got.cpus, got.disk_mb) == (768, 256, 0.5, 2048)
    assert got.network == "none"


def test_a_failed_apt_step_is_explained_by_the_package() -> None:
    """Not by the step's command, which the log echoes and which holds farm's own message."""
    step = 'RUN set -e; if ! command -v apt-get; then echo "farm: apt packages need..."; fi'
    log = (
        f"sandbox image build failed:\nStep 7/25 : {step}\nReading package lists...\n"
        "E: Unable to locate package no-such-deb\n"
        f"The command '/bin/sh -c {step}' returned a non-zero code: 100"
    )
    error = explain(ImageBuildError(log), "farm-sandbox:x")
    assert error.package == "no-such-deb" and error.image == "farm-sandbox:x"
    first = str(error).splitlines()[0]
    assert first == (
        "farm-sandbox:x: apt: no such package in the base's mirror: "
        "E: Unable to locate package no-such-deb"
    )
    assert log in str(error)  # the build's own lines stay


def test_a_builds_coloured_stderr_in_pieces_is_read_as_whole_lines() -> None:
    """Docker streams a step's stderr a few characters at a time, coloured: the log (and so
    the explanation) must still see apt's line whole."""
    chunks = [
        {"stream": "Step 7/25 : RUN apt-get install farm-no-such-deb\n"},
        {"stream": "Reading package lists...\n"},
        {"stream": "\x1b[91mE\x1b[0m"},
        {"stream": "\x1b[91m: \x1b[0m"},
        {"stream": "\x1b[91mUnable to locate package farm-no-such-deb\x1b[0m"},
        {"stream": "\x1b[91m\n\x1b[0m"},
        {"error": "The command '/bin/sh -c apt-get install' returned a non-zero code: 100"},
    ]
    tail: deque[str] = deque(maxlen=40)
    with pytest.raises(ImageBuildError) as caught:
        _build_log(iter(chunks), tail)
    assert "E: Unable to locate package farm-no-such-deb" in tail
    assert explain(caught.value, "farm-sandbox:x").package == "farm-no-such-deb"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_every_limit_a_spec_accepts_is_one_a_sandbox_accepts() -> None:
    """A spec's limits become a worker's FARM_SANDBOX_* settings: the smallest value a spec may
    name must start a worker (else the image builds and its worker refuses to start)."""
    for name, field in EnvLimits.model_fields.items():
        bounds = {k: getattr(m, k) for m in field.metadata for k in ("ge", "gt") if hasattr(m, k)}
        smallest = bounds["ge"] if "ge" in bounds else bounds["gt"] + 0.5
        limits = EnvLimits(**{name: smallest})
        SandboxLimits(**{name: smallest})  # raises when the sandbox's floor is higher
        assert limits.settings_env()
