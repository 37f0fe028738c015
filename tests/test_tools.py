"""Agent tools in sessions and the workspace files API."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from farm.client import Farm
from farm.errors import FileOperationError
from farm.sandbox.process import ProcessSandbox
from tests.conftest import Cells
from tests.waiting import wait_for


@pytest.fixture
def ws(own_cells: Cells) -> Path:
    """The session's own workspace (its box's directory in the kernel's workspace root)."""
    return Path(str(own_cells.value("__import__('os').getcwd()")).strip("'"))


def test_tools_list_read_grep_and_run_commands(own_cells: Cells, ws: Path) -> None:
    (ws / "src").mkdir()
    (ws / "src" / "app.py").write_text("import os\n\ndef main():\n    return 'hello'\n")
    (ws / "notes.txt").write_text("nothing to see\n")
    assert own_cells.value("print(ls())") is None
    listing = own_cells.run("print(ls())").stdout
    assert listing.splitlines() == ["notes.txt  15", "src/"]
    assert own_cells.run("print(read('src/app.py', 3, 4))").stdout == (
        "3| def main():\n4|     return 'hello'\n"
    )
    assert own_cells.run("print(grep('return', glob='*.py'))").stdout == (
        "src/app.py:4:    return 'hello'\n"
    )
    assert own_cells.run("print(bash('echo $((6 * 7)); pwd'))").stdout == f"42\n{ws}\n[exit 0]\n"


def test_tool_output_is_clipped_head_and_tail(own_cells: Cells) -> None:
    out = own_cells.run("print(bash('seq 1 100000'))").stdout
    assert out.startswith("1\n2\n3\n")
    assert out.rstrip().endswith("100000\n[exit 0]")
    assert re.search(r"\[\.\.\. \d+ chars cut \.\.\.\]", out)
    assert len(out) < 3100


@pytest.mark.parametrize(
    "path",
    ["../outside.txt", "/etc/passwd", "link/passwd", "{sibling}/secret.txt"],
    ids=["dotdot", "absolute", "symlink-out", "prefix-trick"],
)
def test_paths_outside_the_workspace_are_refused(own_cells: Cells, ws: Path, path: str) -> None:
    sibling = Path(f"{ws}2")  # /tmp/farm-workspace-xyz2: shares the string prefix
    sibling.mkdir()
    (sibling / "secret.txt").write_text("secret")
    (ws / "link").symlink_to("/etc")
    try:
        result = own_cells.run(f"read({path.format(sibling=sibling)!r})")
        assert result.error is not None
        assert result.error.ename == "WorkspaceError"
        assert "outside the workspace" in result.error.evalue
    finally:
        (sibling / "secret.txt").unlink()
        sibling.rmdir()


def test_grep_takes_the_pattern_as_an_argument_not_shell(own_cells: Cells, ws: Path) -> None:
    (ws / "a.txt").write_text("x\n")
    result = own_cells.run("grep('x; touch pwned #')")
    assert result.ok
    assert not (ws / "pwned").exists()


def test_bash_timeout_kills_the_whole_process_group(own_cells: Cells) -> None:
    out = own_cells.run(
        "print(bash('sleep 1000 & echo $!; sleep 1000', timeout_s=3))", timeout_s=30
    ).stdout
    assert "[killed after 3s timeout]" in out
    orphan = int(out.splitlines()[0])
    assert wait_for(lambda: not os.path.exists(f"/proc/{orphan}"), 10)


PATCH = """\
--- a/keep.py
+++ b/keep.py
@@ -1,3 +1,3 @@
 def f():
-    return 1
+    return 2
 # end
--- /dev/null
+++ b/new/created.txt
@@ -0,0 +1,2 @@
+first
+second
--- a/gone.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
"""


def test_apply_patch_edits_creates_and_deletes(own_cells: Cells, ws: Path) -> None:
    (ws / "keep.py").write_text("def f():\n    return 1\n# end\n")
    (ws / "gone.txt").write_text("bye\n")
    result = own_cells.run(f"print(apply_patch({PATCH!r}))")
    assert result.ok, result.error
    assert result.stdout.splitlines() == [
        "patched keep.py",
        "created new/created.txt",
        "deleted gone.txt",
    ]
    assert (ws / "keep.py").read_text() == "def f():\n    return 2\n# end\n"
    assert (ws / "new" / "created.txt").read_text() == "first\nsecond\n"
    assert not (ws / "gone.txt").exists()


def test_a_patch_that_does_not_apply_changes_nothing(own_cells: Cells, ws: Path) -> None:
    (ws / "keep.py").write_text("def f():\n    return 99\n# end\n")
    (ws / "gone.txt").write_text("bye\n")
    result = own_cells.run(f"apply_patch({PATCH!r})")
    assert result.error is not None and result.error.ename == "PatchError"
    assert "hunk 1 of keep.py does not apply" in result.error.evalue
    assert "no file was changed" in result.error.evalue
    assert (ws / "keep.py").read_text() == "def f():\n    return 99\n# end\n"
    assert (ws / "gone.txt").exists() and not (ws / "new").exists()


def test_tools_can_be_opted_out_per_session(kernel: ProcessSandbox) -> None:
    with kernel.kernel() as client:
        opened = client.open_session(tools=False)
        result = client.execute(opened["session_id"], "ls()", epoch=1, timeout_s=10)
        assert result["error"]["ename"] == "NameError"


@pytest.mark.docker
def test_session_files_round_trip_inside_the_sandbox(farm: Farm, tmp_path: Path) -> None:
    with farm.session() as s:
        assert s.files.write("data/input.csv", "a,b\n1,2\n") == 8
        assert s.files.read("data/input.csv") == b"a,b\n1,2\n"
        assert s.run("open('data/input.csv').read().count(',')").value.text == "2"
        (tmp_path / "proj" / "pkg").mkdir(parents=True)
        (tmp_path / "proj" / "pkg" / "mod.py").write_text("VALUE = 7\n")
        assert s.files.upload(tmp_path / "proj", "proj") == 1
        value = s.run("import sys; sys.path.insert(0, 'proj')\nfrom pkg.mod import VALUE\nVALUE")
        assert value.value is not None and value.value.text == "7"
        paths = {entry["path"] for entry in s.files.list()}
        assert {"data/input.csv", "proj/pkg/mod.py"} <= paths
        s.files.remove("data")
        assert not any(e["path"].startswith("data") for e in s.files.list())
        with pytest.raises(FileOperationError, match="outside the workspace"):
            s.files.write("../etc/evil", b"x")
        big = bytes(range(256)) * (9 * 4096) + b"end"  # more than two 4 MiB chunks
        assert s.files.write("big.bin", big) == len(big)
        size = s.run("import os; os.path.getsize('big.bin')").value
        assert size is not None and size.text == str(len(big))
        assert s.files.read("big.bin") == big
