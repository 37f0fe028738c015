"""The sandbox interface: a place where a kernel runs, reachable at an address with a token.

Backends are siblings (``DockerSandbox``, ``ProcessSandbox``); code above ``farm.sandbox``
owns one through this interface and never asks which kind it is.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType

from farm.kernel.wire.client import KernelClient, KernelError
from farm.models import BoxCapacity, SandboxHealth, SandboxInfo, frames
from farm.settings import BoxSettings


def box_arguments(box: BoxSettings | None) -> list[str]:
    """The kernel's ``--box-*`` arguments: the boxes' default limits (``FarmSettings.box``).
    Given to the kernel rather than sent with every open, so that a session that asks for
    nothing else is a spare process the kernel made ahead of time (an open costs no fork).
    ``None``: the kernel's own defaults (``farm.kernel.boxes.pool.Caps.defaults``)."""
    limits = box.model_dump(exclude_none=True) if box is not None else {}
    flags = {"--box-" + name.replace("_", "-"): str(value) for name, value in limits.items()}
    return [arg for flag in flags.items() for arg in flag]


class Sandbox(ABC):
    address: str
    started_at: float | None = None

    @abstractmethod
    def start(self, launched: Callable[[], None] | None = None) -> None:
        """Start the kernel and return once it answers; leave nothing behind on failure.
        ``launched`` is called once the kernel's container or process exists, before its
        start: what remains is the daemon's and the kernel's work, not this process's."""

    @abstractmethod
    def stop(self) -> None:
        """Stop the kernel and remove everything the sandbox created; idempotent."""

    @abstractmethod
    def info(self) -> SandboxInfo: ...

    @property
    @abstractmethod
    def token(self) -> str: ...

    def kernel(self, connect_timeout_s: float = 5.0) -> KernelClient:
        """A new, connected client of this sandbox's kernel (the caller closes it); every frame
        it reads is checked against the kernel's protocol (``frames.validate``)."""
        client = KernelClient.at(
            self.address, self.token, connect_timeout_s=connect_timeout_s, check=frames.validate
        )
        client.connect()
        return client

    def health(self, timeout_s: float = 3.0) -> SandboxHealth:
        t0 = time.perf_counter()
        try:
            with self.kernel(connect_timeout_s=timeout_s) as client:
                pong = client.ping(timeout_s)
        except KernelError as exc:
            return SandboxHealth(ok=False, detail=str(exc))
        capacity = BoxCapacity(**pong["capacity"], quarantined=pong["quarantined"])
        return SandboxHealth(
            ok=True,
            rtt_s=time.perf_counter() - t0,
            capacity=capacity,
            box_limits=dict(pong["box_limits"]),
        )

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
