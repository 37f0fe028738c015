"""The judge: submissions in many languages run against test cases, with verdicts.

A judge item is a map item (``BatchItem`` with ``language``, ``source``, ``tests``) and runs on
the map engine like any other: ``specs`` turns it into the judge step a worker sends its
kernel, the kernel's runner (``farm.kernel.judging``) compiles and runs it in the item's box,
``farm.worker.judging`` adds the compile cache and the special judge. ``languages`` is the
table a judge image is built from. Why it is built so: docs/design/judge.md.
"""

from __future__ import annotations

JUDGE_IMAGE = "judge"  # where judge items run unless they or their map name another image
