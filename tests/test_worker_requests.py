"""The typed link to the workers (``farm.models.worker_requests``): each request survives its
trip as JSON unchanged, and a malformed one sent straight to a task of a real Celery worker (in
this process, real Redis, the ``process`` backend) is an ``input`` refusal naming the field,
after which the worker serves the next good request."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from farm.celeryconf import TASK_BRANCH, TASK_CLOSE, TASK_COMMAND, TASK_EXEC, TASK_FILE, TASK_RUN
from farm.client import Farm, Session
from farm.client.broker import Watch
from farm.image_name import ImageName
from farm.models import (
    BranchRequest,
    CloseRequest,
    CommandRequest,
    CommandResult,
    ExecRequest,
    ExecResult,
    FileRequest,
    Malformed,
    OpenRequest,
    RunRequest,
    WorkerRequest,
    arrived,
)

EXAMPLES: list[WorkerRequest] = [
    ExecRequest(
        exec_id="e1",
        code="6 * 7",
        timeout_s=30.0,
        max_output_bytes=1024,
        session_id="s1",
        epoch=2,
        generation=3,
        stream=True,
        replay_of="e0",
        calls=["lookup"],
    ),
    ExecRequest(exec_id="e2", code="1", timeout_s=5, session_id="s1", epoch=0, generation=1),
    RunRequest(
        exec_id="r1", code="1", timeout_s=5.0, limits={"pids": 64}, egress=["pypi.org"], wait_s=2.5
    ),
    CommandRequest(
        exec_id="c1",
        session_id="s1",
        generation=1,
        argv=["cat"],
        timeout_s=10.0,
        cwd="sub",
        env={"A": "1"},
        stdin=base64.b64encode(b"hello").decode(),
    ),
    FileRequest(
        op="write",
        path="a.txt",
        parcel="0" * 32,
        offset=0,
        session_id="s1",
        generation=1,
        scope="box",
    ),
    FileRequest(op="read", path="a.txt", offset=0, length=10, session_id="s1", generation=1),
    CloseRequest(session_id="s1"),
    BranchRequest(session_id="s1", generation=1, op="rollback", checkpoint_id="c1", keep=False),
    BranchRequest(session_id="s1", generation=1, op="fork", n=4),
    OpenRequest(open_id="o1", reply="farm:answers:x", sent_at=1.0, deadline=2.0, limits=None),
]


@pytest.mark.parametrize("request_", EXAMPLES, ids=lambda r: type(r).__name__)
def test_a_request_travels_as_json_unchanged(request_: WorkerRequest) -> None:
    wire = json.loads(json.dumps(request_.model_dump(mode="json")))  # as Celery carries it
    assert arrived(type(request_), wire) == request_


@pytest.mark.parametrize(
    ("change", "field", "what"),
    [
        ({"bogus": 1}, "bogus", "Extra inputs are not permitted"),
        ({"timeout_s": "soon"}, "timeout_s", "valid number"),
        ({"epoch": "3"}, "epoch", "valid integer"),  # strict: no coercion from text
        ({"calls": "lookup"}, "calls", "valid list"),
        ({"code": None}, "code", "valid string"),
    ],
)
def test_a_malformed_exec_request_names_its_field(
    change: dict[str, Any], field: str, what: str
) -> None:
    good = EXAMPLES[0].model_dump(mode="json")
    with pytest.raises(Malformed) as refused:
        arrived(ExecRequest, {**good, **change})
    assert f"{field}: " in str(refused.value) and what in str(refused.value), refused.value


def test_a_missing_field_and_a_request_that_is_no_object_are_named() -> None:
    good = EXAMPLES[0].model_dump(mode="json")
    del good["session_id"]
    with pytest.raises(Malformed, match="session_id: Field required"):
        arrived(ExecRequest, good)
    with pytest.raises(Malformed, match="the request: Input should be"):
        arrived(CloseRequest, "s1")  # the close task's argument before it was a model


def test_a_refusal_names_a_few_faults_not_thousands() -> None:
    with pytest.raises(Malformed) as refused:
        arrived(CloseRequest, {"session_id": "s1", **{f"x{n}": n for n in range(1000)}})
    assert "and 995 more" in str(refused.value) and len(str(refused.value)) < 400


def test_stdin_that_is_not_base64_is_refused_before_it_travels() -> None:
    with pytest.raises(ValueError, match="stdin"):
        CommandRequest(
            exec_id="c", session_id="s", generation=1, argv=["cat"], timeout_s=1, stdin="%%%"
        )
    command = EXAMPLES[3]
    assert isinstance(command, CommandRequest) and command.stdin_bytes() == b"hello"


def test_a_one_shot_run_becomes_a_cell_of_its_session() -> None:
    run = EXAMPLES[2]
    assert isinstance(run, RunRequest)
    cell = run.in_session("s9", 4, 7)
    assert (cell.exec_id, cell.code, cell.timeout_s) == (run.exec_id, run.code, run.timeout_s)
    assert (cell.session_id, cell.epoch, cell.generation, cell.stream) == ("s9", 4, 7, False)


def test_file_fields_for_the_kernel_leave_out_what_is_unset() -> None:
    read = EXAMPLES[5]
    assert isinstance(read, FileRequest)
    assert read.kernel_fields() == {"scope": "workspace", "offset": 0, "length": 10}


# --- against a real worker: malformed requests straight to the task names ------------------------


def send(farm: Farm, task: str, queue: str, argument: Any, watch: Watch) -> Any:
    pending = farm.app.send_task(task, args=[argument], queue=queue)
    return farm.broker.wait(pending, time.monotonic() + 60, watch)


def good_cell(s: Session, **change: Any) -> dict[str, Any]:
    return {**s.exec_request("6 * 7").model_dump(mode="json"), **change}


@pytest.mark.parametrize(
    ("change", "field"),
    [({"bogus": 1}, "bogus"), ({"timeout_s": "soon"}, "timeout_s"), ({"code": None}, "code")],
)
def test_a_malformed_cell_is_an_input_refusal_and_the_session_serves_on(
    inproc_farm: Farm, change: dict[str, Any], field: str
) -> None:
    with inproc_farm.session() as s:
        s.run("kept = 41")
        watch = Watch(worker=(s.worker, s.generation))
        malformed = good_cell(s, **change)
        result = ExecResult.model_validate(send(inproc_farm, TASK_EXEC, s.queue, malformed, watch))
        assert result.kind == "input" and result.error is not None, result
        assert f"{field}: " in result.error.evalue and "ExecRequest" in result.error.evalue
        assert (result.session_id, result.worker) == (s.id, s.worker)
        assert result.exec_id == malformed["exec_id"] and not result.state_lost
        again = ExecResult.model_validate(
            send(inproc_farm, TASK_EXEC, s.queue, good_cell(s), watch)
        )
        assert again.ok and again.value is not None and again.value.text == "42"
        assert s.run("kept + 1").value is not None


def test_a_missing_field_or_no_object_at_all_is_refused_too(inproc_farm: Farm) -> None:
    with inproc_farm.session() as s:
        watch = Watch(worker=(s.worker, s.generation))
        missing = good_cell(s)
        del missing["session_id"]
        for argument, named in ((missing, "session_id: Field required"), ([1, 2], "the request")):
            result = ExecResult.model_validate(
                send(inproc_farm, TASK_EXEC, s.queue, argument, watch)
            )
            assert result.kind == "input" and named in (result.error.evalue if result.error else "")
        assert s.run("'serving'").value is not None


def test_malformed_commands_files_closes_and_runs_are_input_refusals(inproc_farm: Farm) -> None:
    with inproc_farm.session() as s:
        watch = Watch(worker=(s.worker, s.generation))
        command = CommandRequest(
            exec_id="cmd-1", session_id=s.id, generation=s.generation, argv=["true"], timeout_s=9
        ).model_dump(mode="json")
        raw = send(inproc_farm, TASK_COMMAND, s.queue, {**command, "argv": "true"}, watch)
        done = CommandResult.model_validate(raw)
        assert done.kind == "input" and done.error is not None and "argv: " in done.error.evalue
        assert (done.exec_id, done.session_id) == ("cmd-1", s.id)
        assert s.exec(["echo", "ok"]).stdout == "ok\n"

        write = FileRequest(
            op="write",
            path="f",
            parcel="0" * 32,
            offset=0,
            session_id=s.id,
            generation=s.generation,
        ).model_dump(mode="json")
        reply = send(inproc_farm, TASK_FILE, s.queue, {**write, "op": "chmod"}, watch)
        assert reply["error"]["kind"] == "input" and "op: " in reply["error"]["evalue"], reply
        s.files.write("f", b"hi")
        assert s.files.read("f") == b"hi"

        fork = BranchRequest(session_id=s.id, generation=s.generation, op="fork", n=2)
        bad = {**fork.model_dump(mode="json"), "n": 0}
        reply = send(inproc_farm, TASK_BRANCH, s.queue, bad, watch)
        assert reply["error"]["code"] == "input" and "n: " in reply["error"]["message"], reply
        assert s.checkpoint().session_id == s.id

        reply = send(inproc_farm, TASK_CLOSE, s.queue, s.id, watch)  # a bare id: no longer
        assert reply["closed"] is False and reply["error"]["kind"] == "input", reply
        assert s.run("'still open'").value is not None

        shared = ImageName("default").queue
        run = RunRequest(exec_id="run-1", code="1", timeout_s=9).model_dump(mode="json")
        raw = send(inproc_farm, TASK_RUN, shared, {**run, "limits": {"pids": "many"}}, Watch())
        result = ExecResult.model_validate(raw)
        assert result.kind == "input" and "limits.pids: " in (
            result.error.evalue if result.error else ""
        )
        assert result.exec_id == "run-1"
    assert inproc_farm.run("6 * 7").value is not None
