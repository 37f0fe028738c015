"""farm's exceptions: one root, a shallow tree, each carrying what it belongs to.

Error kinds are written once, in the kernel's protocol (``farm.kernel.wire.protocol.Kind``),
which ``farm.models.ErrorKind`` mirrors, and mapped to exceptions once, beside it in
``farm.models.results`` (a failed run's exceptions carry its ``ExecResult``, which raises them).
The root, ``FarmError``, and the kernel client's errors come from ``farm.kernel.wire.wire_errors``;
both kinds are re-exported here, where users import every error (imports run down, never
back: docs/design/errors.md). ``KernelRequestError.code`` says why the kernel refused a
request; the other ``Kernel*Error``s that it could not be reached, authenticated or understood.
"""

from __future__ import annotations

from farm.kernel.wire.wire_errors import FarmError as FarmError
from farm.kernel.wire.wire_errors import KernelAuthError as KernelAuthError
from farm.kernel.wire.wire_errors import KernelConnectionError as KernelConnectionError
from farm.kernel.wire.wire_errors import KernelError as KernelError
from farm.kernel.wire.wire_errors import KernelProtocolError as KernelProtocolError
from farm.kernel.wire.wire_errors import KernelRequestError as KernelRequestError
from farm.models.results import BadInput as BadInput
from farm.models.results import ExecFailed as ExecFailed
from farm.models.results import ExecTimeout as ExecTimeout
from farm.models.results import InfraError as InfraError
from farm.models.results import OutOfMemory as OutOfMemory
from farm.models.results import OutputLimitExceeded as OutputLimitExceeded
from farm.models.results import RestoreFailed as RestoreFailed
from farm.models.results import SessionLost as SessionLost
from farm.models.results import StateLost as StateLost
from farm.models.results import UserCodeError as UserCodeError
from farm.models.results import error_for_result as error_for_result


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


class BranchRefused(FarmError):
    """A checkpoint, rollback or fork was refused; nothing changed and the session lives on.
    ``code`` is the kernel's reason (docs/design/fork.md)."""

    def __init__(self, session_id: str, code: str, message: str) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.code = code


class TooManyCheckpoints(BranchRefused):
    """The session holds its limit of checkpoints: drop one first."""


class UnknownCheckpoint(BranchRefused):
    """No such checkpoint: never taken here, dropped, or lost (its process ended)."""


class BudgetExceeded(BranchRefused):
    """The box's budgets (processes, memory) or the worker's room do not allow it."""


def error_for_branch(session_id: str, code: str, message: str) -> FarmError:
    """The exception for a refused branch (``code``: the kernel's, or the worker's)."""
    if code == "session_lost":
        return SessionLost(session_id, None, message)
    by_code: dict[str, type[BranchRefused]] = {
        "too_many_checkpoints": TooManyCheckpoints,
        "no_such_checkpoint": UnknownCheckpoint,
        "budget_exceeded": BudgetExceeded,
    }
    return by_code.get(code, BranchRefused)(session_id, code, message)
