"""farm's exceptions: one root, a shallow tree, each carrying what it belongs to.

Error kinds are written once, in the kernel's protocol (``farm.kernel.wire.protocol.Kind``), which
``farm.models.ErrorKind`` mirrors; they are mapped to exceptions once, here.

The root, ``FarmError``, and the kernel client's errors are defined in
``farm.kernel.wire.wire_errors`` and re-exported here (imports run from here into the kernel,
never back; why the root lives there: docs/design/errors.md). ``KernelRequestError.code`` says
why the kernel refused a request; the other ``Kernel*Error``s that it could not be reached,
authenticated or understood.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from farm.kernel.wire.wire_errors import FarmError as FarmError
from farm.kernel.wire.wire_errors import KernelAuthError as KernelAuthError
from farm.kernel.wire.wire_errors import KernelConnectionError as KernelConnectionError
from farm.kernel.wire.wire_errors import KernelError as KernelError
from farm.kernel.wire.wire_errors import KernelProtocolError as KernelProtocolError
from farm.kernel.wire.wire_errors import KernelRequestError as KernelRequestError

if TYPE_CHECKING:
    from farm.models import ExecResult


class ExecFailed(FarmError):
    """A run ended in an error; ``result`` holds everything about it."""

    def __init__(self, result: ExecResult) -> None:
        error = result.error
        summary = f"{error.ename}: {error.evalue}" if error else "unknown error"
        kind = error.kind.value if error else "?"
        super().__init__(f"run {result.exec_id} failed ({kind}): {summary}")
        self.result = result


class UserCodeError(ExecFailed):
    """The code raised (kind ``user``)."""


class ExecTimeout(ExecFailed):
    """The code ran past its timeout (kind ``timeout``)."""


class OutOfMemory(ExecFailed):
    """The code ran out of memory (kind ``oom``)."""


class OutputLimitExceeded(ExecFailed):
    """The code printed far more than the output cap (kind ``output_limit``)."""


class StateLost(ExecFailed):
    """The session's variables are gone; re-run its setup in the new epoch or open a new one."""


class RestoreFailed(StateLost):
    """``on_state_lost="replay"`` could not rebuild the namespace (a replayed cell failed, or
    the journal no longer holds the whole history); ``report`` says what was re-run."""

    def __init__(self, result: ExecResult, why: str, report: object = None) -> None:
        super().__init__(result)
        self.args = (f"{self.args[0]}; restore failed: {why}",)
        self.why = why
        self.report = report


class SessionLost(FarmError):
    """The session's sandbox or worker is gone (kind ``sandbox_lost``)."""

    def __init__(self, session_id: str | None, worker: str | None, reason: str) -> None:
        what = f"session {session_id}" if session_id else "the run"
        where = f" on worker {worker}" if worker else ""
        super().__init__(f"{what}{where} is lost: {reason}")
        self.session_id = session_id
        self.worker = worker
        self.reason = reason


class FarmBusy(FarmError):
    """Every worker is at capacity and none freed up before the deadline; retry later."""


class SandboxUnavailable(FarmError):
    """No sandbox could be started or reached (Docker down, image missing, kernel dead)."""


class SandboxStartError(SandboxUnavailable):
    """A sandbox did not come up; nothing it started is left running."""


class DockerUnavailable(SandboxUnavailable):
    """The Docker daemon does not answer: nothing about sandboxes or images can be done."""


class ImageBuildError(FarmError):
    """A sandbox image (or the wheels it installs) could not be built; the message says which
    step failed and carries the build's last lines. ``image`` is the tag being built and
    ``package`` the pip requirement or Debian package that failed, when one did."""

    def __init__(
        self, message: str, *, image: str | None = None, package: str | None = None
    ) -> None:
        super().__init__(message)
        self.image = image
        self.package = package


class LocalFarmError(FarmError):
    """A local farm (``farm up``, ``Farm.local``) could not start, or one is already up."""


class InvalidRequest(FarmError, ValueError):
    """An argument or setting farm cannot act on (a bad name, a limit over the sandbox's cap,
    duplicate sweep ids); raised before anything is sent or run."""


class ProblemError(InvalidRequest):
    """A problem farm cannot store or read (``farm.judge.problems``, ``farm.judge.packages``);
    ``path``: the package's file at fault, when one is."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class ProblemTooLarge(ProblemError):
    """A problem over the size a farm stores (``size`` and ``limit``, in bytes of its
    canonical form); nothing was stored."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the problem is {size} bytes, over the {limit} bytes a farm stores as one problem"
        )
        self.size = size
        self.limit = limit


class ProblemNotFound(FarmError):
    """No problem is stored under ``digest`` (never put, or expired unused): put it again."""

    def __init__(self, digest: str) -> None:
        super().__init__(
            f"no problem is stored as {digest} (never put, or unused past its TTL): "
            "Farm.put_problem it again"
        )
        self.digest = digest


class FileOperationError(FarmError):
    """A ``session.files`` operation was refused (outside the workspace, too big, missing);
    ``errno``, ``path`` and ``ename`` (the OS's exception name) say how."""

    def __init__(self, message: str, *, errno: int = 0, path: str = "", ename: str = "") -> None:
        super().__init__(message)
        self.errno = errno
        self.path = path
        self.ename = ename


class SessionPaused(SessionLost):
    """The session is paused (its box freed, its snapshot kept by the farm): ``resume()`` it."""


class SnapshotError(FarmError):
    """A session snapshot could not be taken or restored (``code``: what failed)."""

    code = "snapshot_failed"


class SnapshotTooLarge(SnapshotError):
    """A snapshot over the farm's ``snapshot_max_bytes`` (``size`` and ``limit``, in bytes):
    nothing was kept; store big data as files elsewhere, or raise the limit."""

    code = "snapshot_too_large"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the snapshot is {size} bytes, over the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class SnapshotIncompatible(SnapshotError):
    """The snapshot cannot be restored on this image (another Python, a pickler or module the
    image lacks); nothing was opened."""

    code = "snapshot_incompatible"


class SnapshotNotFound(SnapshotError):
    """No snapshot is kept under this id (never kept, expired, or already resumed)."""

    code = "snapshot_not_found"


class WorkerFailed(FarmError):
    """A worker task crashed around the code (a farm bug or a broken worker); retryable."""


class BrokerLost(FarmError):
    """The broker lost its data while a call waited (a Redis restart without persistence, a
    flush, a failover): the message, its claim and its result are gone, so nobody can tell
    whether the code ran. Never retried behind the caller's back."""


class BrokerUnavailable(FarmError):
    """The broker cannot be reached (Redis down, restarting or unreachable). ``sent`` says
    whether the call had reached it first: ``False``, nothing was sent and nothing ran, so it
    is safe to call again once the broker is back; ``True``, it may or may not have run."""

    def __init__(self, url: str, cause: BaseException, *, sent: bool) -> None:
        what = (
            "the call was sent before it went away: it may or may not have run"
            if sent
            else "nothing was sent; call again when it is back"
        )
        why = f"{type(cause).__name__}: {cause}"
        super().__init__(f"cannot reach the broker at {url} ({why}); {what}")
        self.url = url
        self.sent = sent


class BrokerAuthFailed(FarmError):
    """The broker and this client could not authenticate each other: the broker refused the
    client's credentials (no password, a wrong one, an ACL user without the rights farm
    needs) or the client does not trust the broker's TLS certificate. It fails at once, never
    waited out like an outage: it does not end by itself. Nothing was sent."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"the broker at {url} {reason}")
        self.url = url
        self.reason = reason


class InfraError(ExecFailed):
    """The farm failed around the code (kind ``infra``); safe to retry if it never started."""


class BadInput(ExecFailed):
    """The request itself was refused (kind ``input``: too large, malformed); nothing ran and
    nothing is retried."""


def error_for_result(result: ExecResult) -> FarmError:
    """The exception that ``ExecResult.raise_for_error`` raises for a failed result."""
    from farm.models import ErrorKind

    assert result.error is not None
    by_kind: dict[ErrorKind, type[ExecFailed]] = {
        ErrorKind.USER: UserCodeError,
        ErrorKind.TIMEOUT: ExecTimeout,
        ErrorKind.OOM: OutOfMemory,
        ErrorKind.OUTPUT_LIMIT: OutputLimitExceeded,
        ErrorKind.STATE_LOST: StateLost,
        ErrorKind.INFRA: InfraError,
        ErrorKind.INPUT: BadInput,
    }
    if result.error.kind == ErrorKind.SANDBOX_LOST:
        return SessionLost(result.session_id, result.worker, result.error.evalue)
    return by_kind[result.error.kind](result)
