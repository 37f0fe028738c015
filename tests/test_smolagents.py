"""``FarmExecutor`` under a real smolagents ``CodeAgent``, offline: a scripted model (fixed
replies, no network) writes the code, and every step runs in one real farm session (real Redis,
Celery worker and Docker sandbox).

A variable defined in one step is there in the next, tools travel as source and run in the
sandbox, the final answer is computed there (and comes back whole past farm's 8 KiB error
value), an error is a step the model sees and recovers from, a session that loses its variables
goes on with its tools sent again, and the session closes with the agent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from smolagents import CodeAgent, Tool
from smolagents.memory import ActionStep
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.monitoring import AgentLogger, LogLevel, TokenUsage

from farm.client import Farm
from farm.errors import InvalidRequest
from farm.integrations.smolagents import FarmExecutor
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def farm(docker_env: Any) -> Iterator[Farm]:
    with Farm.local(workers=1) as f:
        yield f


class ScriptedModel(Model):
    """Returns its replies in order, as a model would (no network)."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.replies = list(replies)
        self.calls = 0

    def generate(self, messages: Any, stop_sequences: Any = None, **kwargs: Any) -> ChatMessage:
        reply = self.replies[self.calls]
        self.calls += 1
        usage = TokenUsage(input_tokens=0, output_tokens=0)
        return ChatMessage(role=MessageRole.ASSISTANT, content=reply, token_usage=usage)


class AddTool(Tool):
    """A custom tool: remote executors get its class as source and run it in the sandbox."""

    name = "add"
    description = "Adds two integers."
    inputs = {
        "a": {"type": "integer", "description": "first"},
        "b": {"type": "integer", "description": "second"},
    }
    output_type = "integer"

    def forward(self, a: int, b: int) -> int:
        return a + b


def code(thought: str, body: str) -> str:
    return f"Thought: {thought}\n<code>\n{body}\n</code>"


def run_agent(farm: Farm, replies: list[str], **executor: Any) -> tuple[Any, list[ActionStep]]:
    """Run a scripted agent on a FarmExecutor; its result, its steps, and the executor closed."""
    model = ScriptedModel(replies)
    farm_executor = FarmExecutor(farm, logger=AgentLogger(LogLevel.OFF), **executor)
    with CodeAgent(
        tools=[AddTool()], model=model, max_steps=len(replies), executor=farm_executor
    ) as agent:
        result = agent.run("Compute it in the sandbox.")
        steps = [s for s in agent.memory.steps if isinstance(s, ActionStep)]
    session = farm_executor.session
    assert session.closed, "the session closes with the agent"
    assert wait_for(lambda: farm.registry.session(session.id) is None, 10)
    farm_executor.cleanup()  # again: harmless
    assert model.calls == len(replies)
    return result, steps


def test_a_two_step_agent_keeps_its_variables_in_one_session(farm: Farm) -> None:
    result, steps = run_agent(
        farm,
        [
            code("define x", "import os\nx = add(40, 2)\nprint('x is', x, 'in', os.getcwd())"),
            code("x persists", "y = x * 10\nfinal_answer(y + 1)"),
        ],
    )
    assert result == 421 and type(result) is int
    assert [s.error for s in steps] == [None, None]
    assert steps[0].observations is not None
    assert "x is 42 in /workspace\n" in steps[0].observations  # the session's own box


def test_a_final_answer_comes_back_whole(farm: Farm) -> None:
    """Past farm's 8192-character error value: 2 MB of answer, made in the sandbox."""
    result, _ = run_agent(farm, [code("answer", "final_answer('ab' * 1_000_000)")])
    assert result == "ab" * 1_000_000


def test_an_error_is_a_step_the_model_recovers_from(farm: Farm) -> None:
    result, steps = run_agent(
        farm,
        [
            code("divide", "x = 7\n1 / 0"),
            code("recover", "final_answer(add(x, 1))"),
        ],
    )
    assert result == 8
    assert steps[0].error is not None and "ZeroDivisionError" in str(steps[0].error)


def test_a_session_that_loses_its_variables_goes_on_with_its_tools(farm: Farm) -> None:
    """A step that ignores the timeout's interrupt is killed: its variables are gone, the
    model is told so, and the tools work in the fresh namespace."""
    stubborn = (
        "import signal\nx = 1\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    )
    result, steps = run_agent(
        farm,
        [
            code("spin", stubborn),
            code("look", "final_answer([('x' in globals()), add(1, 2)])"),
        ],
        timeout_s=2.0,
    )
    assert result == [False, 3]
    assert steps[0].error is not None and "variables are gone" in str(steps[0].error)


def test_missing_packages_are_named_not_installed(farm: Farm) -> None:
    with pytest.raises(InvalidRequest, match="no_such_package_xyz"):
        FarmExecutor(farm, additional_imports=["json", "no_such_package_xyz"]).cleanup()
    with pytest.raises(InvalidRequest, match="no_such_package_xyz"):  # an iterator: read once
        FarmExecutor(farm, additional_imports=iter(["no_such_package_xyz"])).cleanup()
    FarmExecutor(farm, additional_imports=["json", "collections.*"]).cleanup()
