"""One kernel digest: a bring-your-own image's bundle and a farm image are stale alike when any
module of the kernel changes, a sub-package's included."""

from __future__ import annotations

from pathlib import Path

from farm.sandbox.bundle import kernel_digest
from farm.sandbox.images import kernel_source_hash


def make_repo(root: Path) -> Path:
    kernel = root / "farm" / "kernel"
    (kernel / "boxes").mkdir(parents=True)
    (kernel / "__init__.py").write_text("")
    (kernel / "boxes" / "machine.py").write_text("BOX = 1\n")
    dockerfile = root / "images" / "sandbox" / "Dockerfile"
    dockerfile.parent.mkdir(parents=True)
    dockerfile.write_text("FROM base\n")
    return kernel


def test_a_change_in_a_sub_package_changes_the_digest(tmp_path: Path) -> None:
    kernel = make_repo(tmp_path)
    before = kernel_digest(kernel)
    (kernel / "boxes" / "machine.py").write_text("BOX = 2\n")
    changed = kernel_digest(kernel)
    assert changed != before
    (kernel / "boxes" / "machine.py").rename(kernel / "boxes" / "moved.py")
    assert kernel_digest(kernel) != changed  # the same contents moved count too


def test_the_image_hash_is_the_kernel_digest_with_the_dockerfile(tmp_path: Path) -> None:
    kernel = make_repo(tmp_path)
    dockerfile = tmp_path / "images" / "sandbox" / "Dockerfile"
    assert kernel_source_hash(tmp_path) == kernel_digest(kernel, dockerfile, root=tmp_path)
    before = kernel_source_hash(tmp_path)
    (kernel / "boxes" / "machine.py").write_text("BOX = 3\n")
    assert kernel_source_hash(tmp_path) != before
