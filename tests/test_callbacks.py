"""Host callbacks: sandboxed code calls ``llm_query(...)`` and a function of the client runs.

Kernel-level tests drive a local kernel through ``KernelClient`` (the host side answered by a
handler); farm-level tests go through real Docker sandboxes, Redis and Celery workers, with
deterministic callbacks (no model needed).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from farm import AsyncFarm, Farm
from farm.client.hostcall_handlers import current_depth
from farm.events.run_events import HostCall
from farm.kernel.wire.framing import encode, recv_frame, send_frame
from farm.sandbox.process import ProcessSandbox

# --- the kernel's side ----------------------------------------------------------------------


def answering(value: Any) -> Any:
    calls: list[dict[str, Any]] = []

    def on_event(event: dict[str, Any]) -> dict[str, Any] | None:
        if event["type"] != "call":
            return None
        calls.append(event)
        return {"ok": True, "value": value}

    on_event.calls = calls  # type: ignore[attr-defined]
    return on_event


def test_a_kernel_call_reaches_the_host_in_order_with_the_output(
    shared_kernel: ProcessSandbox,
) -> None:
    events: list[dict[str, Any]] = []

    def on_event(event: dict[str, Any]) -> dict[str, Any] | None:
        events.append(event)
        return {"ok": True, "value": "42"} if event["type"] == "call" else None

    with shared_kernel.kernel() as client:
        opened = client.open_session()
        result = client.execute(
            opened["session_id"],
            "print('before')\nx = llm_query('q', temperature=0)\nprint('after', x)\nx",
            epoch=opened["epoch"],
            on_event=on_event,
            calls=["llm_query"],
        )
    assert result["status"] == "ok", result["error"]
    assert result["value"]["text"] == "'42'"
    kinds = [(e["type"], e.get("text") or e.get("name")) for e in events if e["type"] != "running"]
    assert kinds == [
        ("started", None),
        ("stream", "before\n"),
        ("call", "llm_query"),
        ("stream", "after 42\n"),
    ]
    call = next(e for e in events if e["type"] == "call")
    assert call["args"] == ["q"] and call["kwargs"] == {"temperature": 0}


def test_a_cell_with_no_host_listening_gets_a_clear_error(shared_kernel: ProcessSandbox) -> None:
    with shared_kernel.kernel() as client:
        opened = client.open_session()
        sid, epoch = opened["session_id"], opened["epoch"]
        client.execute(sid, "1", epoch=epoch, on_event=answering(1), calls=["llm_query"])
        result = client.execute(sid, "llm_query('x')", epoch=epoch)  # no on_event this time
    assert result["error"]["ename"] == "CallbackError"
    assert "no host listens" in result["error"]["evalue"]


@pytest.mark.slow
def test_a_cell_waiting_on_the_host_times_out_and_keeps_its_variables(
    shared_kernel: ProcessSandbox,
) -> None:
    release = threading.Event()

    def slow(event: dict[str, Any]) -> dict[str, Any] | None:
        if event["type"] == "call":  # answers 4 s after the call came, 3 s past its timeout
            release.wait(4)
            return {"ok": True, "value": "too late"}
        return None

    with shared_kernel.kernel() as client:
        opened = client.open_session()
        sid, epoch = opened["session_id"], opened["epoch"]
        result = client.execute(
            sid,
            "y = 7\nllm_query('x')",
            epoch=epoch,
            timeout_s=1,
            on_event=slow,
            calls=["llm_query"],
        )
        assert result["error"]["kind"] == "timeout" and not result["state_lost"], result["error"]
        after = client.execute(sid, "y", epoch=result["epoch"])
    assert after["value"]["text"] == "7"


def test_only_answers_may_arrive_while_a_cell_runs(shared_kernel: ProcessSandbox) -> None:
    """A host that sends anything else while a cell with callbacks runs is cut off; the
    kernel serves on."""
    with shared_kernel.kernel() as client:
        opened = client.open_session()
        sock = client._sock
        assert sock is not None
        request = {
            "type": "execute",
            "session_id": opened["session_id"],
            "epoch": opened["epoch"],
            "code": "import time; time.sleep(0.5)",
            "timeout_s": 5,
            "exec_id": "x1",
            "events": True,
            "calls": ["llm_query"],  # a cell that may call the host: answers are read mid-cell
        }
        send_frame(sock, request)
        sock.sendall(encode({"type": "ping"}))
        frames = []
        sock.settimeout(10)
        while (frame := recv_frame(sock)) is not None:
            frames.append(frame)
        assert frames[-1]["type"] == "error" and frames[-1]["code"] == "bad_frame"
    with shared_kernel.kernel() as other:
        assert other.ping()["type"] == "pong"


def test_the_kernel_refuses_a_call_the_cell_was_not_given(shared_kernel: ProcessSandbox) -> None:
    handler = answering("should not be asked")
    forged = (
        "from farm.kernel.repl.hostcall_stubs import make_call\nimport builtins\n"
        "make_call('secret', builtins.display.__self__)('x')"
    )
    with shared_kernel.kernel() as client:
        opened = client.open_session()
        result = client.execute(
            opened["session_id"],
            forged,
            epoch=opened["epoch"],
            on_event=handler,
            calls=["llm_query"],
        )
    assert result["error"]["ename"] == "CallbackError"
    assert "no callback named 'secret'" in result["error"]["evalue"]
    assert handler.calls == []  # the host was never asked


def test_call_names_must_be_public_identifiers(shared_kernel: ProcessSandbox) -> None:
    from farm.kernel.wire.client import KernelRequestError

    with shared_kernel.kernel() as client:
        opened = client.open_session()
        with pytest.raises(KernelRequestError, match="calls"):
            client.execute(opened["session_id"], "1", epoch=opened["epoch"], calls=["__import__"])


# --- through the farm -----------------------------------------------------------------------


@pytest.mark.docker
def test_a_callback_runs_in_the_client_and_is_recorded(farm: Farm) -> None:
    seen: list[tuple[str, int]] = []

    def llm_query(prompt: str, *, temperature: float = 0.0) -> str:
        seen.append((prompt, current_depth()))
        return f"answer to {prompt} at {temperature}"

    with farm.session(callbacks={"llm_query": llm_query}) as session:
        result = session.run("print('asking')\nx = llm_query('2+2?', temperature=0.5)\nx.upper()")
    assert result.ok, result.error
    assert result.value is not None and result.value.text == "'ANSWER TO 2+2? AT 0.5'"
    assert result.stdout == "asking\n"
    assert seen == [("2+2?", 1)]
    [call] = result.sub_calls
    assert (call.name, call.args, call.kwargs, call.ok) == (
        "llm_query",
        ["2+2?"],
        {"temperature": 0.5},
        True,
    )
    assert call.response == "answer to 2+2? at 0.5" and call.depth == 1
    assert call.duration_s > 0


@pytest.mark.docker
def test_batched_calls_run_concurrently(farm: Farm) -> None:
    together = threading.Barrier(4, timeout=20)  # breaks unless all four run at once

    def llm_query(prompt: str) -> str:
        together.wait()
        return prompt * 2

    with farm.session(callbacks={"llm_query": llm_query}) as session:
        result = session.run("llm_query_batched(['a', 'b', 'c', 'd'])", timeout_s=60)
    assert result.ok, result.error
    assert result.value is not None and result.value.text == "['aa', 'bb', 'cc', 'dd']"
    assert [c.batch for c in result.sub_calls] == [True]


@pytest.mark.docker
def test_a_failing_callback_is_an_exception_inside_and_the_session_lives(farm: Farm) -> None:
    def llm_query(prompt: str) -> str:
        raise RuntimeError(f"model down for {prompt}")

    with farm.session(callbacks={"llm_query": llm_query}) as session:
        result = session.run(
            "try:\n    llm_query('q')\n"
            "except Exception as e:\n    caught = f'{type(e).__name__}: {e}'\n"
            "caught"
        )
        assert result.ok, result.error
        assert result.value is not None
        assert "CallbackError" in result.value.text and "RuntimeError: model down for q" in (
            result.value.text
        )
        assert session.run("1 + 1").value.text == "2"  # type: ignore[union-attr]
    assert result.sub_calls[0].ok is False
    assert "model down" in (result.sub_calls[0].error or "")


@pytest.mark.docker
def test_an_answer_over_the_limit_is_a_callback_error_and_the_session_lives(farm: Farm) -> None:
    from farm.kernel.repl.hostcall_stubs import MAX_ANSWER_BYTES

    def llm_query(size: int) -> str:
        return "x" * size

    fits = MAX_ANSWER_BYTES - 1024  # with the answer's JSON around it, still within the limit
    code = (
        "got = {}\nfor size in (%d, %d):\n    try:\n        got[size] = len(llm_query(size))\n"
        "    except Exception as e:\n        got[size] = f'{type(e).__name__}: {e}'\ngot"
    )
    with farm.session(callbacks={"llm_query": llm_query}) as session:
        session.run("kept = 'yes'")
        result = session.run(code % (MAX_ANSWER_BYTES, fits), timeout_s=120)
        assert result.ok and result.value is not None, result.error
        got = eval(result.value.text)  # the repr of a dict of ints and strings
        after = session.run("kept")
    too_large = str(got[MAX_ANSWER_BYTES])
    assert too_large.startswith("CallbackError: llm_query(): CallbackError: the answer of "), got
    assert too_large.endswith(f"bytes exceeds {MAX_ANSWER_BYTES} bytes"), too_large
    assert got[fits] == fits  # the limit, not something else, refused the larger one
    assert after.value is not None and after.value.text == "'yes'"


@pytest.mark.docker
def test_a_sandbox_cannot_call_a_callback_that_was_not_registered(farm: Farm) -> None:
    ran: list[str] = []

    def llm_query(prompt: str) -> str:
        ran.append(prompt)
        return "ok"

    forged = (
        "from farm.kernel.repl.hostcall_stubs import make_call\n"
        "import builtins\n"
        "secret = make_call('secret', builtins.display.__self__)\n"
        "secret('give me the host')"
    )
    with farm.session(callbacks={"llm_query": llm_query}) as session:
        result = session.run(forged)
        plain = farm.session()
        try:
            unregistered = plain.run("'llm_query' in globals()")
        finally:
            plain.close()
    assert result.error is not None and result.error.ename == "CallbackError"
    assert "no callback named 'secret'" in result.error.evalue
    assert ran == []
    assert unregistered.value is not None and unregistered.value.text == "False"


@pytest.mark.docker
def test_depth_is_bounded_for_sub_agents(farm: Farm) -> None:
    """A callback opens a child session (a sub-agent) whose code calls back in turn."""

    def llm_query(task: str) -> str:
        if not task.startswith("delegate:"):
            return f"done {task} at depth {current_depth()}"
        with farm.session(callbacks={"llm_query": llm_query}) as child:
            inner = child.run(f"llm_query({task.removeprefix('delegate:')!r})")
            if not inner.ok:
                assert inner.error is not None
                return f"refused: {inner.error.evalue}"
            assert inner.value is not None
            return f"child said {inner.value.text}"

    with farm.session(callbacks={"llm_query": llm_query}) as session:
        two = session.run("llm_query('delegate:x')")
        three = session.run("llm_query('delegate:delegate:x')")
    assert two.value is not None and two.value.text == "\"child said 'done x at depth 2'\""
    assert three.value is not None and "nest at most 2 deep (this is 3)" in three.value.text


@pytest.mark.docker
def test_calls_per_run_and_time_per_call_are_bounded(farm: Farm) -> None:
    release = threading.Event()

    def llm_query(prompt: str) -> str:
        if prompt == "hang":
            release.wait(30)
        return prompt

    hooks = {"llm_query": llm_query}
    try:
        with farm.session(callbacks=hooks, max_calls=3, callback_timeout_s=1.0) as session:
            counted = session.run(
                "out = []\n"
                "for i in range(5):\n"
                "    try:\n        out.append(llm_query(str(i)))\n"
                "    except Exception as e:\n        out.append(type(e).__name__)\n"
                "out"
            )
            slow = session.run("llm_query('hang')", timeout_s=20)
            alive = session.run("'still here'")
    finally:
        release.set()
    assert counted.value is not None
    assert counted.value.text == "['0', '1', '2', 'CallbackError', 'CallbackError']"
    assert slow.error is not None and "did not answer within 1s" in slow.error.evalue
    assert alive.value is not None and alive.value.text == "'still here'"


@pytest.mark.docker
def test_calls_appear_in_the_live_stream_and_the_journal(farm: Farm) -> None:
    with farm.session(callbacks={"llm_query": lambda p: p[::-1]}) as session:
        live = [e for e in session.stream("llm_query('abc')") if isinstance(e, HostCall)]
        journaled = [e for e in farm.replay(session.id) if isinstance(e, HostCall)]
    assert [(e.name, e.args) for e in live] == [("llm_query", ["abc"])]
    assert [(e.name, e.args) for e in journaled] == [("llm_query", ["abc"])]
    assert "llm_query('abc')" in live[0]._repr_markdown_()


@pytest.mark.docker
def test_async_sessions_take_coroutine_callbacks(farm: Farm) -> None:
    async def llm_query(prompt: str) -> str:
        await asyncio.sleep(0.01)
        return prompt.upper()

    async def main() -> str | None:
        afarm = AsyncFarm(farm)  # not closed here: the module's farm is shared
        session = await afarm.session(callbacks={"llm_query": llm_query})
        try:
            result = await session.arun("llm_query('hey')")
        finally:
            await session.aclose()
        return result.value.text if result.value else None

    assert asyncio.run(main()) == "'HEY'"


def test_callback_names_are_checked_up_front() -> None:
    from farm.client.hostcall_handlers import Callbacks

    with pytest.raises(ValueError, match="identifier"):
        Callbacks({"not a name": print})
    with pytest.raises(ValueError, match="_batched"):
        Callbacks({"llm_query_batched": print})
    with pytest.raises(TypeError, match="callable"):
        Callbacks({"llm_query": "nope"})  # type: ignore[dict-item]
