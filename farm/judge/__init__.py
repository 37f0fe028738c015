"""The judge: submissions in many languages run against test cases, with verdicts.

A judge item is a map item (``BatchItem`` with ``language``, ``source``, ``tests``) and runs on
the map engine like any other: ``specs`` turns it into the judge step a worker sends its kernel,
the kernel's runner (``farm.kernel.boxes.judge_runner``) compiles and runs it in the item's box,
``farm.worker.judge_items`` adds the compile cache and the special judge, and ``scoring`` scores
an item's groups of tests on the client. ``languages`` is the table a judge image is built from.
Why it is built so: docs/design/judge.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from farm.models.batch import BatchItem

JUDGE_IMAGE = "judge"  # where judge items run unless they or their map name another image


def image_for(item: BatchItem, default: str) -> str:
    """The image ``item`` runs on: its own, else the map's, except that a judge item in a
    map of the default image goes to the judge's."""
    if item.image is None and item.language is not None and default == "default":
        return JUDGE_IMAGE
    return item.image or default
