"""``FarmError``, the root of every farm error, and the kernel client's errors under it.

The root lives here because ``KernelClient`` must derive its errors from it and the kernel
imports nothing of farm's outside itself; imports run one way, so ``farm.errors`` (where users
import everything) re-exports these and builds the host's errors on the same root. Why the
client and its errors belong to the kernel package: docs/design/errors.md.
"""

from __future__ import annotations


class FarmError(Exception):
    """Root of every farm error; ``except farm.FarmError`` catches the kernel client's too."""


class KernelError(FarmError):
    """Base of every kernel client failure."""


class KernelConnectionError(KernelError):
    """The kernel could not be reached, or the connection broke."""


class KernelAuthError(KernelError):
    """The handshake failed: wrong token, or the peer is not the kernel it claims to be."""


class KernelProtocolError(KernelError):
    """The kernel answered something that is not the protocol."""


class KernelRequestError(KernelError):
    """The kernel refused a request; ``code`` says why (e.g. ``no_such_session``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
