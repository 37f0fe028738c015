"""Every benchmark script still imports: ``make test`` never runs them (speed is measured, not
asserted), so a rename elsewhere would otherwise break one silently until someone needs it."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_the_benchmark_imports(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setattr(sys, "argv", [script])
    runpy.run_path(str(BENCH / script), run_name="bench_import_check")
