"""The frames of sessions that branch: checkpoint, rollback, drop, fork (stdlib ``TypedDict``s).

One request type, ``branch``, with its ``op``, answered by ``branched`` (or an ``error``): kept
apart from ``protocol`` so that the branching code reads as one piece; ``protocol.HOST_FRAMES``
lists both, and the host validates them like every other frame. Design: docs/design/fork.md.
"""

from __future__ import annotations

from typing import Literal, TypedDict

# Codes of the refusals of a branch (the session lives on): the host's typed errors
BRANCH_CODES = frozenset({"too_many_checkpoints", "no_such_checkpoint", "budget_exceeded"})
BranchOp = Literal["checkpoint", "rollback", "drop", "fork"]


class _BranchRequired(TypedDict):
    type: Literal["branch"]
    op: BranchOp
    session_id: str


class Branch(_BranchRequired, total=False):
    checkpoint_id: str  # rollback, drop
    keep: bool  # rollback: the checkpoint stays held (the default), else it is spent
    n: int  # fork: how many
    wait_s: float  # fork: how long the new boxes may wait for room


class Forked(TypedDict):
    """One session a fork made: its id and epoch, and what of the parent it does not hold."""

    session_id: str
    epoch: int


class _BranchedRequired(TypedDict):
    type: Literal["branched"]
    op: BranchOp
    session_id: str
    epoch: int  # the session's epoch after the op (a rollback moves it on)
    checkpoints: int  # how many the session holds now


class Branched(_BranchedRequired, total=False):
    checkpoint_id: str
    files: int  # checkpoint: how many files, directories and links it holds
    bytes: int  # checkpoint: their bytes (in its memory)
    forks: list[Forked]
    not_carried: list[str]  # fork: names of the parent's variables the forks lack, and why
    duration_s: float
