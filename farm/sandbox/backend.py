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

# The kernel's environment on every backend, and so its boxes': glibc's malloc asks for
# transparent huge pages (madvise) on the heap and its large blocks. A fork copies one entry per
# 2 MiB instead of 512, so the forks that a checkpoint, a rollback and every box cost are cheaper
# when a process holds much memory (a 100 MB session forks in ~1 ms instead of ~9 ms here), for
# ~0.4 MB more resident memory per process. glibc < 2.35, musl and hosts with THP off ignore it.
# The kernel drops it once started: what boxes exec runs with the image's defaults.
KERNEL_ENV = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


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
