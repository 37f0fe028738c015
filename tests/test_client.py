"""The client's decisions (settling results, losses, bad input, restore) against a real Redis
and a real Celery worker running in this process over the ``process`` backend: fast, no Docker.
The Docker end-to-end versions of these paths live in ``test_worker.py`` and ``test_stream.py``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from celery.signals import before_task_publish

from farm.celeryconf import TASK_EXEC
from farm.client import Farm
from farm.errors import BadInput, StateLost
from farm.events.lanes import LANE_TTL_S, lane_key, reply_key
from farm.kernel.wire.framing import DEFAULT_MAX_FRAME

BIG = DEFAULT_MAX_FRAME + 1024 * 1024  # over the kernel's frame (64 MiB)


@pytest.mark.slow
def test_a_cell_too_large_for_a_frame_is_bad_input_and_the_session_lives(
    inproc_farm: Farm,
) -> None:
    with inproc_farm.session() as s:
        s.run("kept = 41")
        result = s.run("x = '" + "a" * BIG + "'")
        assert result.kind == "input" and result.error is not None
        assert (
            str(DEFAULT_MAX_FRAME) in result.error.evalue
            and "nothing was run" in result.error.evalue
        )
        assert not result.state_lost
        with pytest.raises(BadInput):
            result.raise_for_error()
        assert s.run("kept + 1").value is not None and s.run("kept + 1").value.text == "42"


@pytest.mark.slow
def test_a_one_shot_run_too_large_is_bad_input_and_not_retried(inproc_farm: Farm) -> None:
    result = inproc_farm.run("'" + "b" * BIG + "'", retries=3)
    assert result.kind == "input"
    assert "nothing was run" in (result.error.evalue if result.error else "")


@pytest.mark.slow
def test_output_that_escapes_past_a_frame_is_cut_to_fit_and_the_session_lives(
    inproc_farm: Farm,
) -> None:
    with inproc_farm.session() as s:  # 12 MiB of control bytes: 72 MiB of JSON escapes
        result = s.run(
            "import os\nos.write(1, bytes([1]) * (12 << 20))\n'done'",
            max_output_bytes=16 << 20,
        )
        assert result.ok and result.value is not None and result.value.text == "'done'"
        assert result.stdout_truncated and "did not fit in one frame" in result.stderr
        assert s.run("1 + 1").value is not None


def test_an_output_cap_past_what_a_frame_holds_is_bad_input(inproc_farm: Farm) -> None:
    with inproc_farm.session() as s:
        result = s.run("print('hi')", max_output_bytes=64 * 1024 * 1024)
        assert result.kind == "input" and "max_output_bytes" in (result.error or {}).__str__()
        assert s.run("print('still here')").stdout == "still here\n"


def test_a_value_too_large_for_a_frame_keeps_its_text_and_the_session_lives(
    inproc_farm: Farm,
) -> None:
    code = (
        "class Huge:\n"
        "    def _repr_html_(self): return '<b>' + 'h' * 7_000_000 + '</b>'\n"
        "    def _repr_markdown_(self): return 'm' * 7_000_000\n"
        "    def _repr_json_(self): return {'j': 'j' * 7_000_000}\n"
        "    def __repr__(self): return 'Huge()'\n"
        "Huge()"
    )
    with inproc_farm.session() as s:
        result = s.run(code)
        assert result.ok and result.value is not None
        assert set(result.value.data) == {"text/plain"}
        assert "only its text/plain is kept" in result.stderr
        assert s.run("1 + 1").value is not None


def test_state_loss_raises_until_restart_and_names_the_session(inproc_farm: Farm) -> None:
    with inproc_farm.session() as s:
        s.run("x = 1")
        with pytest.raises(StateLost) as lost:
            s.run("import os; os._exit(3)")
        assert lost.value.result.state_lost and lost.value.result.session_id == s.id
        with pytest.raises(StateLost):
            s.run("x")
        s.restart()
        assert s.run("'x' in globals()").value.text == "False"  # type: ignore[union-attr]


def test_replay_restore_rebuilds_the_namespace(inproc_farm: Farm) -> None:
    with inproc_farm.session(on_state_lost="replay") as s:
        s.run("a = 2")
        s.run("b = a * 21")
        s.run("raise ValueError('not replayed')")
        lost = s.run("import os; os._exit(1)")
        assert lost.state_lost and len(s.restores) == 1
        assert [c.code for c in s.restores[0].replayed] == ["a = 2", "b = a * 21"]
        assert s.run("b").value.text == "42"  # type: ignore[union-attr]


def test_every_session_a_worker_holds_can_have_a_call_in_flight(
    inproc_farm: Farm, tmp_path: Path
) -> None:
    """A cell that waits (a sleep, a subprocess, a host callback) holds no scarce slot: 24
    sessions of one worker wait at a barrier that only all 24 together pass. With fewer worker
    threads than sessions, the cells that arrived first would wait there until their deadline."""
    n = 24
    barrier = str(tmp_path)
    code = (
        "import os, time\n"
        f"open(os.path.join({barrier!r}, str(os.getpid())), 'w').close()\n"
        "deadline = time.monotonic() + 30\n"
        f"while len(os.listdir({barrier!r})) < {n} and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        f"len(os.listdir({barrier!r}))"
    )
    sessions = [inproc_farm.session() for _ in range(n)]
    try:
        with ThreadPoolExecutor(n) as pool:
            results = list(pool.map(lambda s: s.run(code, timeout_s=60), sessions))
        assert [r.value.text if r.value else r.error for r in results] == [str(n)] * n
    finally:
        for s in sessions:
            s.close()


def test_a_task_message_shows_its_ids_never_the_cells_code(inproc_farm: Farm) -> None:
    """Celery puts a repr of a task's arguments in its message (headers; the worker's log and
    task events repeat it); farm's shows the ids only, so a cell's code is not copied there."""
    shown: list[dict[str, str]] = []

    def seen(headers: dict[str, str], **_: object) -> None:
        shown.append({k: headers[k] for k in ("argsrepr", "kwargsrepr")})

    before_task_publish.connect(seen, weak=False)
    try:
        with inproc_farm.session() as s:  # a stream's run is a task (a plain one takes the lane)
            stream = s.stream("token = 'sk-not-for-logs'; len(token)")
            for _ in stream:
                pass
    finally:
        before_task_publish.disconnect(seen)
    result = stream.result
    assert result is not None and result.value is not None and result.value.text == "15"
    assert shown and not any("sk-not-for-logs" in h["argsrepr"] for h in shown)
    assert any(f"exec_id={result.exec_id}" in h["argsrepr"] for h in shown), shown


def test_a_plain_run_takes_the_lane_and_leaves_no_list(inproc_farm: Farm) -> None:
    """``Session.run`` sends no Celery task: the request goes on its worker's run lane and the
    result comes back on a reply list of its own, which the client pops (nothing is left of
    it). A run left on a lane (its worker gone) expires with it."""
    published: list[str] = []

    def seen(sender: str, **_: object) -> None:
        published.append(sender)

    with inproc_farm.session() as s:
        before_task_publish.connect(seen, weak=False)
        try:
            results = [s.run("x = 41"), s.run("x + 1")]
        finally:
            before_task_publish.disconnect(seen)
        redis = inproc_farm.registry.redis
        assert redis.exists(reply_key(results[1].exec_id), lane_key(s.queue)) == 0
    left = "farm.w.gone.g1"
    inproc_farm.broker.push_run(left, {"exec_id": "e-left"}, check=lambda: "")
    assert 0 < redis.ttl(lane_key(left)) <= LANE_TTL_S
    redis.delete(lane_key(left))
    assert results[1].value is not None and results[1].value.text == "42"
    assert TASK_EXEC not in published, published
