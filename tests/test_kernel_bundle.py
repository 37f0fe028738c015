"""The kernel bundle (``farm.sandbox.bundle``), which images without farm's kernel mount: an
interpreter with this one's cache tag starts the kernel from its bytecode, compiling nothing
(the sandbox writes no bytecode: without it every start compiled the kernel)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from farm.sandbox.bundle import kernel_bundle

SPY = """
import importlib, importlib.machinery as machinery, sys
sys.path.insert(0, {bundle!r})
compiled = []
real = machinery.SourceFileLoader.source_to_code
def spy(self, data, path, *args, **kwargs):
    compiled.append(str(path))
    return real(self, data, path, *args, **kwargs)
machinery.SourceFileLoader.source_to_code = spy
module = importlib.import_module("farm.kernel.__main__")
loaded = sorted(m for m in sys.modules if m.startswith("farm.kernel"))
print(repr((module.__file__, len(loaded), compiled)))
"""


def test_the_kernels_start_loads_the_bundles_bytecode_and_compiles_nothing(
    tmp_path: Path,
) -> None:
    bundle = kernel_bundle(tmp_path)
    assert kernel_bundle(tmp_path) == bundle  # made once
    run = subprocess.run(
        [sys.executable, "-I", "-B", "-c", SPY.format(bundle=str(bundle))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    main, loaded, compiled = ast.literal_eval(run.stdout)
    assert main == str(bundle / "farm" / "kernel" / "__main__.py")  # the bundle's, not ours
    assert loaded > 30 and compiled == []
