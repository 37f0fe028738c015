"""Warm imports in a real kernel (the process backend): the modules named with ``--preload`` are
in every session's ``sys.modules`` before its first cell; one that fails to import is reported
and the kernel serves anyway; an import that leaves writable shared memory (a channel between
boxes) gets the kernel restarted without preloading. numpy (the test environment has it) is
preloaded for real: a forked box computes a BLAS-sized product and draws its own random numbers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from farm.cli.main import _status_row
from farm.kernel.boxes import preload
from farm.sandbox.process import ProcessSandbox
from tests.conftest import Cells

# A module whose import maps writable memory shared with every fork of the process.
SHARING = "import mmap\nshared = mmap.mmap(-1, 4096)\nshared.write(b'box')\n"
IN_MODULES = "import sys\nsorted(m for m in {names} if m in sys.modules)"


@pytest.fixture(scope="module")
def modules_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("preloads")
    (path / "farm_test_sharing.py").write_text(SHARING)
    (path / "farm_test_exits.py").write_text("raise SystemExit(3)\n")
    return path


@pytest.fixture
def importable(modules_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``modules_dir`` on the path of the kernels the test starts."""
    inherited = os.environ.get("PYTHONPATH")
    path = f"{modules_dir}{os.pathsep}{inherited}" if inherited else str(modules_dir)
    monkeypatch.setenv("PYTHONPATH", path)
    return modules_dir


def _kernel(*modules: str) -> ProcessSandbox:
    return ProcessSandbox(extra_args=[arg for name in modules for arg in ("--preload", name)])


@pytest.fixture(scope="module")
def warm() -> Iterator[ProcessSandbox]:
    """numpy and a stdlib module no kernel imports of its own, and two that cannot import."""
    names = ("numpy", "numpy.random", "xml.dom.minidom", "farm_no_such_module", "numpy.no_such")
    with _kernel(*names) as sandbox:
        yield sandbox


def test_preloaded_modules_are_in_a_sessions_modules_before_its_first_cell(
    warm: ProcessSandbox,
) -> None:
    with warm.kernel() as client:
        cells = Cells(client)
        names = ["numpy", "xml.dom.minidom", "farm_no_such_module"]
        assert cells.value(IN_MODULES.format(names=names)) == "['numpy', 'xml.dom.minidom']"


def test_the_pong_says_what_was_preloaded_and_what_failed(warm: ProcessSandbox) -> None:
    with warm.kernel() as client:
        record = client.ping()["preload"]
    assert record["modules"] == ["numpy", "numpy.random", "xml.dom.minidom"]
    assert set(record["failed"]) == {"farm_no_such_module", "numpy.no_such"}
    assert record["failed"]["farm_no_such_module"].startswith("ModuleNotFoundError: ")
    assert record["seconds"] > 0


def test_a_kernel_without_preloads_has_none(shared_kernel: ProcessSandbox) -> None:
    with shared_kernel.kernel() as client:
        assert client.ping()["preload"] == {"modules": [], "failed": {}, "seconds": 0.0}
        names = ["xml.dom.minidom"]
        assert Cells(client).value(IN_MODULES.format(names=names)) == "[]"


def test_preloaded_numpy_multiplies_matrices_in_a_forked_box(warm: ProcessSandbox) -> None:
    """Large enough for OpenBLAS to use its threads (whose pool the fork tore down)."""
    code = (
        "import numpy as np\n"
        "a = np.arange(512 * 512, dtype=np.float64).reshape(512, 512) % 7\n"
        "b = a @ a.T\n"
        "want = sum(float(a[3, k]) * float(a[5, k]) for k in range(512))\n"
        "bool(b[3, 5] == want), float(np.linalg.norm(np.linalg.inv(a + 512 * np.eye(512)) @ "
        "(a + 512 * np.eye(512)) - np.eye(512))) < 1e-9"
    )
    with warm.kernel() as client:
        assert Cells(client).value(code) == "(True, True)"


def test_what_a_box_changes_in_a_preloaded_module_stays_in_that_box(warm: ProcessSandbox) -> None:
    """Each box is a fork: a preloaded module's state is copy-on-write, never shared."""
    with warm.kernel() as client:
        first, second = Cells(client), Cells(client)
        first.value("import numpy\nnumpy.leak = 'box 1'\nnumpy.dot = None")
        code = "import numpy\nhasattr(numpy, 'leak'), numpy.dot is None"
        assert second.value(code) == "(False, False)"
        assert Cells(client).value(code) == "(False, False)"  # a box forked after the change


def test_boxes_draw_their_own_random_numbers(warm: ProcessSandbox) -> None:
    """numpy seeds its global generator once, as numpy.random is imported (here, preloaded):
    the kernel reseeds it in each fork."""
    code = "import numpy.random\nnumpy.random.rand()"
    with warm.kernel() as client:
        draws = {Cells(client).value(code) for _ in range(3)}
    assert len(draws) == 3


@pytest.mark.usefixtures("importable")
def test_a_module_that_exits_as_it_imports_does_not_stop_the_kernel() -> None:
    with _kernel("farm_test_exits", "json.tool") as sandbox, sandbox.kernel() as client:
        record = client.ping()["preload"]
        assert record["modules"] == ["json.tool"]
        assert record["failed"] == {"farm_test_exits": "SystemExit: 3"}
        assert Cells(client).value("1 + 1") == "2"


@pytest.mark.usefixtures("importable")
def test_shared_memory_left_by_an_import_restarts_the_kernel_without_preloading() -> None:
    with _kernel("json.tool", "farm_test_sharing") as sandbox, sandbox.kernel() as client:
        record = client.ping()["preload"]
        assert record["modules"] == []
        assert set(record["failed"]) == {"json.tool", "farm_test_sharing"}
        assert record["failed"]["farm_test_sharing"].startswith("refused: ")
        names = ["farm_test_sharing", "json.tool"]
        assert Cells(client).value(IN_MODULES.format(names=names)) == "[]"


def test_the_image_file_names_modules_and_a_broken_one_says_why(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"modules": ["numpy", "pandas"]}))
    assert preload.image_modules(str(good)) == (["numpy", "pandas"], None)
    assert preload.image_modules(str(tmp_path / "none.json")) == ([], None)
    broken = tmp_path / "broken.json"
    broken.write_text('{"modules": "numpy"}')
    names, why = preload.image_modules(str(broken))
    assert names == [] and why is not None and "not a list" in why


def test_the_sandbox_reports_what_its_kernel_preloaded(warm: ProcessSandbox) -> None:
    info = warm.info()
    assert info.preload is not None and info.preload.modules[0] == "numpy"
    assert "farm_no_such_module" in info.preload.failed


def test_farm_status_shows_the_preloads_and_marks_the_failures() -> None:
    """A worker's heartbeat carries its sandbox's info (JSON); ``farm status`` renders it."""
    record = {"modules": ["numpy", "pandas"], "failed": {"torch": "ModuleNotFoundError: x"}}
    row = _status_row({"id": "w1", "sandbox": {"preload": record}})
    assert row["preload"] == "numpy pandas [red]!torch[/]"
    assert _status_row({"id": "w1", "sandbox": {"preload": {}}})["preload"] == "-"
    assert _status_row({"id": "w1", "sandbox": None})["preload"] == "?"


def test_a_module_that_prints_as_it_imports_leaves_the_readiness_line_alone(
    importable: Path,
) -> None:
    """The process backend reads the kernel's stdout for its readiness line (JSON)."""
    (importable / "farm_test_chatty.py").write_text(
        "import os\nprint('hello from an import')\nos.write(1, b'and from C\\n')\n"
    )
    with _kernel("farm_test_chatty") as sandbox, sandbox.kernel() as client:
        assert client.ping()["preload"]["modules"] == ["farm_test_chatty"]
        assert Cells(client).value("print('mine')\n2") == "2"
