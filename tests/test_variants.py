"""Image variants without Docker: per-image limits, the judge's rows on a rebuild, pagination,
the browser's request filter."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.judge.languages import LANGUAGES, Language
from farm.kernel.tools.browser import Browser
from farm.kernel.tools.documents import DocumentError, paginate
from farm.kernel.tools.workspace import Workspace
from farm.sandbox.variants import VARIANTS, judge_rebuilt, judge_variant
from farm.settings import FarmSettings


def test_variant_images_get_their_own_limits_and_the_default_keeps_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    default, browser = FarmSettings().limits, FarmSettings(image="browser").limits
    assert (default.memory_mb, default.pids, default.tmp_mb) == (512, 4096, 64)
    assert (browser.memory_mb, browser.pids, browser.tmp_mb) == (2048, 4096, 512)
    assert browser.network == "none"
    assert FarmSettings(image="docs").limits.memory_mb == 1024
    monkeypatch.setenv("FARM_SANDBOX_MEMORY_MB", "1500")
    assert FarmSettings(image="browser").limits.memory_mb == 1500  # explicit settings win


def test_variants_are_named_after_their_images() -> None:
    assert {name: v.tag for name, v in VARIANTS.items()} == {
        "docs": "farm-sandbox:docs",
        "browser": "farm-sandbox:browser",
        "judge": "farm-sandbox:judge",
    }


def test_a_rebuilt_judge_image_keeps_its_languages_with_the_tables_rows() -> None:
    """A rebuild (a kernel change) takes the table's rows as they are now: a fix to how a
    language compiles or runs reaches the images built before it."""
    old_java = LANGUAGES["java17"].model_copy(update={"run": ("java", "Main")})
    gone = Language(file="main.cob", run=("cobc", "-x", "main.cob"))
    rows = {"java17": old_java, "bash": LANGUAGES["bash"], "cobol": gone}
    recorded = judge_variant(["bash"]).model_copy(update={"languages": rows})
    rebuilt = judge_rebuilt(recorded)
    assert rebuilt.languages == {**rows, "java17": LANGUAGES["java17"]}
    assert rebuilt.limits == recorded.limits


def test_pages_are_cut_by_lines() -> None:
    text = "\n".join(f"l{i}" for i in range(1, 8)) + "\n"
    assert paginate(text, 3) == ["l1\nl2\nl3", "l4\nl5\nl6", "l7"]
    assert paginate("", 3) == [""]
    with pytest.raises(DocumentError):
        paginate(text, 0)


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1:8000/", True),
        ("http://localhost/x", True),
        ("http://[::1]:80/", True),
        ("http://example.com/", False),
        ("ftp://127.0.0.1/", False),
        ("data:text/html,hi", True),
        ("file:///etc/passwd", False),
        ("file://{ws}/page.html", True),
        ("file://{ws}/../etc/passwd", False),
    ],
)
def test_without_egress_the_browser_requests_only_loopback_and_the_workspace(
    tmp_path: Path, url: str, allowed: bool
) -> None:
    browser = Browser(Workspace(tmp_path), proxy="")
    assert browser._allowed(url.format(ws=tmp_path)) is allowed


def test_with_egress_other_hosts_go_to_the_boxs_proxy_which_decides(tmp_path: Path) -> None:
    browser = Browser(Workspace(tmp_path), proxy="http://127.0.0.1:4000")
    assert browser._allowed("https://example.com/") and browser._allowed("http://a.b/")
    assert not browser._allowed("file:///etc/passwd") and not browser._allowed("ftp://a.b/")


def test_the_kernel_imports_only_the_standard_library_at_module_level() -> None:
    """markitdown and playwright are imported inside functions, only in the images that
    have them; a module-level import would break the default image."""
    import ast
    import sys

    kernel = Path(__file__).resolve().parents[1] / "farm" / "kernel"
    for path in kernel.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in sys.stdlib_module_names, (path.name, name)
