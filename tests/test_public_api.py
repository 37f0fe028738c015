"""What a user's type checker sees of ``import farm``: the real classes (``farm`` ships
``py.typed`` and names its exports), while importing it at run time stays as light as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import farm

ROOT = Path(farm.__file__).resolve().parents[1]

USER_CODE = """\
from farm import AsyncFarm, BatchItem, BoxLimits, ExecResult, Farm, Session
from farm.settings import FarmSettings


def connect() -> Farm:
    return Farm(FarmSettings(broker_url="redis://127.0.0.1:6379/0"))


def items() -> list[BatchItem]:
    return [BatchItem(id=1, code="6 * 7", timeout_s=5.0)]


def answer(farm: Farm) -> ExecResult:
    with farm.session(limits=BoxLimits(memory_mb=256)) as session:
        assert isinstance(session, Session)
        return session.run("6 * 7")


async def answer_async(farm: AsyncFarm) -> ExecResult:
    return await farm.run("6 * 7")
"""

MISTAKE = """\
from farm import Farm

x: int = Farm
"""


@pytest.fixture(scope="module")
def user_mypy(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """``mypy --strict`` over a user's two files, with farm found the way an installed package is
    (a search path entry, where mypy reads only packages that ship ``py.typed``)."""
    home = tmp_path_factory.mktemp("user")
    (home / "uses_farm.py").write_text(USER_CODE)
    (home / "mistake.py").write_text(MISTAKE)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(home / ".mypy_cache")]
        + ["uses_farm.py", "mistake.py"],
        cwd=home,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_a_user_s_strict_mypy_checks_code_using_farm(
    user_mypy: subprocess.CompletedProcess[str],
) -> None:
    assert "uses_farm.py" not in user_mypy.stdout, user_mypy.stdout
    assert "py.typed" not in user_mypy.stdout, user_mypy.stdout
    assert "Found 1 error in 1 file (checked 2 source files)" in user_mypy.stdout, user_mypy.stdout


@pytest.mark.slow
def test_a_user_s_strict_mypy_refuses_farm_as_an_int(
    user_mypy: subprocess.CompletedProcess[str],
) -> None:
    assert user_mypy.returncode == 1, user_mypy.stdout + user_mypy.stderr
    assert (
        'mistake.py:3: error: Incompatible types in assignment (expression has type "type[Farm]"'
        in user_mypy.stdout
    )


def test_the_package_ships_its_py_typed_marker() -> None:
    """The marker exists and is package data, so wheels carry it (PEP 561)."""
    assert (ROOT / "farm" / "py.typed").is_file()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["farm"]
    assert "__all__" in vars(farm) and "Farm" in farm.__all__


def test_importing_farm_loads_no_other_module_of_farm() -> None:
    """The exports stay lazy: ``import farm`` brings in no client, model or third-party code."""
    code = (
        "import sys; before = set(sys.modules); import farm\n"
        "import json; print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr
    loaded = json.loads(run.stdout)
    assert "farm" in loaded
    assert [
        m for m in loaded if m != "farm" and m.split(".")[0] not in sys.stdlib_module_names
    ] == []


def test_every_export_resolves_to_what_it_names() -> None:
    from farm.client import Farm
    from farm.models import ExecResult

    assert farm.Farm is Farm and farm.ExecResult is ExecResult
    assert all(getattr(farm, name) is not None for name in farm.__all__)
