"""One root for every error a user of farm's public API meets, the sandbox API included: what
``Sandbox.kernel()``'s clients raise (a refused request, a wrong token, a kernel gone) is a
``farm.errors.FarmError``, while the kernel, which defines those errors, stays stdlib only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from farm import errors
from farm.errors import FarmError, KernelAuthError, KernelConnectionError, KernelRequestError
from farm.kernel.wire.client import KernelClient
from farm.sandbox.bundle import kernel_bundle
from farm.sandbox.process import ProcessSandbox


def test_a_refused_request_of_the_sandbox_api_is_a_farm_error(
    shared_kernel: ProcessSandbox,
) -> None:
    with shared_kernel.kernel() as client, pytest.raises(FarmError) as refused:
        client.close_session("no-such-session")
    assert isinstance(refused.value, KernelRequestError)
    assert refused.value.code == "no_such_session"


def test_a_wrong_token_and_a_kernel_that_is_gone_are_farm_errors(
    shared_kernel: ProcessSandbox, tmp_path: Path
) -> None:
    wrong = KernelClient.at(shared_kernel.address, "0" * 64, connect_timeout_s=5)
    with pytest.raises(FarmError) as refused:
        wrong.connect()
    assert isinstance(refused.value, KernelAuthError)
    gone = KernelClient.at(f"unix:{tmp_path / 'no-kernel.sock'}", "0" * 64, connect_timeout_s=1)
    with pytest.raises(FarmError) as unreachable:
        gone.connect()
    assert isinstance(unreachable.value, KernelConnectionError)


def test_every_public_exception_derives_from_farm_error() -> None:
    public = [
        value
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, BaseException) and not name.startswith("_")
    ]
    assert KernelRequestError in public and len(public) > 20
    assert [e.__name__ for e in public if not issubclass(e, FarmError)] == []


def test_the_kernel_defines_them_with_the_standard_library_alone(tmp_path: Path) -> None:
    """As a sandbox runs it (the bundle: the kernel and an empty ``farm/__init__.py``), in an
    isolated interpreter: the client's errors have their root, and nothing else of farm's is
    imported for it."""
    bundle = kernel_bundle(tmp_path)
    code = (
        f"import sys; sys.path.insert(0, {str(bundle)!r})\n"
        "from farm.kernel.wire.wire_errors import FarmError, KernelRequestError\n"
        "from farm.kernel.wire import client\n"
        "assert issubclass(client.KernelRequestError, FarmError)\n"
        "assert client.KernelRequestError is KernelRequestError\n"
        "print(sorted(m for m in sys.modules if m.startswith('farm')))"
    )
    run = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    loaded = ast.literal_eval(run.stdout)
    assert "farm.errors" not in loaded and all(
        m.startswith("farm.kernel") or m == "farm" for m in loaded
    )


def test_the_public_root_is_the_one_the_kernel_client_raises_under() -> None:
    """``farm.FarmError`` is the kernel's root itself, not a copy: ``except farm.FarmError``
    catches a kernel client's failure."""
    import farm
    import farm.kernel.wire.wire_errors

    assert farm.FarmError is errors.FarmError is farm.kernel.wire.wire_errors.FarmError
    with pytest.raises(farm.FarmError):
        raise farm.kernel.wire.wire_errors.KernelConnectionError("the kernel is gone")
