"""Warm imports in a real image: one environment (numpy and pandas from PyPI, downloaded by the
host) built once with ``farm image build --preload``; its kernel, in a Docker sandbox with
namespaces and seccomp, has them in every box's ``sys.modules``; a forked box multiplies
matrices with OpenBLAS's threads, runs pandas and draws its own random numbers; a module that
cannot import is reported and the rest served; ``Farm.map`` items and ``farm status`` see it.

The image, its build directories, containers and worker processes are removed at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.client import Farm
from farm.sandbox.environments import CONTEXT_DIR, WHEELS_DIR
from farm.sandbox.images import default_repo_root
from tests.conftest import Cells, make_docker_sandbox, no_mount_limits, remove_image_tags

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ENV = f"pytest-preload-{os.getpid()}"
PRELOAD = ["numpy", "pandas", "farm_no_such_module"]
FARM = str(Path(sys.executable).parent / "farm")
MATMUL = (
    "import os\n"
    "import numpy as np\n"
    "a = np.arange(512 * 512, dtype=np.float64).reshape(512, 512) % 7\n"
    "b = a @ a.T\n"
    "want = sum(float(a[3, k]) * float(a[5, k]) for k in range(512))\n"
    "bool(b[3, 5] == want), len(os.listdir('/proc/self/task')), os.cpu_count()"
)
PANDAS = (
    "import pandas as pd\n"
    "df = pd.DataFrame({'k': ['a', 'b', 'a'], 'v': [1, 2, 3]})\n"
    "df.groupby('k')['v'].sum().to_dict()"
)


@pytest.fixture(scope="module")
def image(docker_env: Any) -> Iterator[str]:
    """The environment, built by the CLI as a user would; its name."""
    root = default_repo_root()
    argv = [FARM, "image", "build", ENV, "--pip", "numpy", "--pip", "pandas"]
    argv += [arg for name in PRELOAD for arg in ("--preload", name)]
    try:
        built = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        assert built.returncode == 0, built.stderr
        yield ENV
    finally:
        remove_image_tags(docker_env, f"farm-sandbox:{ENV}")
        shutil.rmtree(root / WHEELS_DIR / ENV, ignore_errors=True)
        shutil.rmtree(root / CONTEXT_DIR / ENV, ignore_errors=True)
        (root / CONTEXT_DIR / f"{ENV}.lock").unlink(missing_ok=True)


@pytest.fixture(scope="module")
def sandbox(docker_env: Any, tmp_path_factory: Any, image: str) -> Iterator[Any]:
    tag = f"farm-sandbox:{image}"
    with make_docker_sandbox(docker_env, tmp_path_factory, image=tag) as sandbox:
        yield sandbox


def test_the_image_records_its_preloads_and_its_spec(docker_env: Any, image: str) -> None:
    labels = docker_env.images.get(f"farm-sandbox:{image}").labels
    assert json.loads(labels["farm.env_spec"])["preload"] == PRELOAD


def test_the_kernel_preloads_and_reports_the_module_it_could_not(sandbox: Any) -> None:
    with sandbox.kernel() as client:
        record = client.ping()["preload"]
    assert record["modules"] == ["numpy", "pandas"]
    assert list(record["failed"]) == ["farm_no_such_module"]
    assert sandbox.info().preload.modules == ["numpy", "pandas"]
    assert sandbox.info().isolation == "namespaces"  # boxes with seccomp and namespaces


def test_a_box_has_numpy_and_pandas_before_it_imports_them(sandbox: Any) -> None:
    with sandbox.kernel() as client:
        cells = Cells(client)
        code = "import sys\n[m in sys.modules for m in ('numpy', 'pandas', 'numpy.random')]"
        assert cells.value(code) == "[True, True, True]"
        assert cells.value(PANDAS) == "{'a': 4, 'b': 2}"
        assert cells.value("open('/etc/farm/preload.json').read()") == repr(
            json.dumps({"modules": PRELOAD})
        )


def test_a_forked_box_multiplies_matrices_with_blas_threads(sandbox: Any) -> None:
    """OpenBLAS's pool was torn down at the zygote's fork; the box starts its own threads."""
    with sandbox.kernel() as client:
        value = Cells(client).value(MATMUL)
    assert value is not None
    correct, threads, cores = value.strip("()").split(", ")
    assert correct == "True"
    assert int(threads) == int(cores)  # the session's thread and OpenBLAS's cores - 1


def test_uid_boxes_where_the_host_forbids_namespaces_get_the_preloads_too(
    docker_env: Any, tmp_path_factory: Any, image: str
) -> None:
    """The fallback: the zygote forks session processes itself, with the same modules."""
    limits = no_mount_limits(tmp_path_factory)
    tag = f"farm-sandbox:{image}"
    with (
        make_docker_sandbox(docker_env, tmp_path_factory, image=tag, limits=limits) as sandbox,
        sandbox.kernel() as client,
    ):
        assert sandbox.info().isolation == "uids"
        cells = Cells(client)
        assert cells.value("import sys\n'pandas' in sys.modules") == "True"
        assert (cells.value(MATMUL) or "").startswith("(True, ")
        assert cells.value(PANDAS) == "{'a': 4, 'b': 2}"


def test_boxes_draw_different_random_numbers(sandbox: Any) -> None:
    with sandbox.kernel() as client:
        draws = {Cells(client).value("import numpy\nnumpy.random.rand()") for _ in range(3)}
    assert len(draws) == 3


def test_map_items_and_farm_status_see_the_preloads(image: str) -> None:
    items = [f"import numpy, pandas\nint(pandas.Series(numpy.arange({n})).sum())" for n in (4, 5)]
    with Farm.local(workers=0) as farm:
        records = list(farm.map(items, image=image))
        assert [r.cells[0].value.text for r in records if r.cells[0].value] == ["6", "10"]
        (worker,) = [w for w in farm.workers() if w["image"] == image]
        preload = worker["sandbox"]["preload"]
        assert (preload["modules"], list(preload["failed"])) == (
            ["numpy", "pandas"],
            ["farm_no_such_module"],
        )
