"""An Inspect eval, offline, with ``sandbox="farm"``: run by ``tests/test_inspect.py`` as a
program, in a fresh interpreter, so that Inspect must find the farm provider through the
``inspect_ai`` entry point (this file imports nothing of farm's).

Inspect's mock model is scripted to call ``bash`` (reading a file ``Sample.files`` placed in the
sample's box), ``python``, then ``bash`` with a command that outlives the tool's timeout, and
to answer. Every scripted output carries its ``usage``: otherwise mockllm counts tokens with
tiktoken, which downloads its encoding from the internet. Prints the log's location and whether
farm was imported before Inspect looked anything up (as JSON).

With BROKER_URL the task names its farm as a user would, in the sandbox config
(``("farm", {"broker_url": BROKER_URL})``, which the log records), the password apart in
``FARM_BROKER_PASSWORD``.

With ``editor``, the model calls ``text_editor`` instead, one of the tools Inspect *injects*
into a sandbox (a helper it installs under ``/var/tmp`` and starts as the sample's user):
create a file, view it, then ``bash`` reads it back.

Usage: python tests/inspect_eval.py LOG_DIR [BROKER_URL [editor]]
"""

from __future__ import annotations

import json
import sys

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash, python, text_editor

MODEL = "mockllm/model"
BASH_TIMEOUT_S = 3
NOTES = "/var/tmp/notes.txt"  # an absolute path the sample's user may write (text_editor's rule)


def scripted(*outputs: ModelOutput) -> list[ModelOutput]:
    for output in outputs:
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return list(outputs)


def bash_outputs() -> list[ModelOutput]:
    return scripted(
        ModelOutput.for_tool_call(
            model=MODEL,
            tool_name="bash",
            tool_arguments={"command": "echo hello from farm; id -u; cat data/hello.txt"},
        ),
        ModelOutput.for_tool_call(
            model=MODEL,
            tool_name="python",
            tool_arguments={"code": "import os\nx = 6 * 7\nprint(f'x={x} in {os.getcwd()}')"},
        ),
        ModelOutput.for_tool_call(
            model=MODEL,
            tool_name="bash",
            tool_arguments={"command": "echo started; sleep 60; echo never"},
        ),
        ModelOutput.from_content(model=MODEL, content="The answer is 42."),
    )


def editor_outputs() -> list[ModelOutput]:
    return scripted(
        ModelOutput.for_tool_call(
            model=MODEL,
            tool_name="text_editor",
            tool_arguments={"command": "create", "path": NOTES, "file_text": "six times seven\n"},
        ),
        ModelOutput.for_tool_call(
            model=MODEL, tool_name="text_editor", tool_arguments={"command": "view", "path": NOTES}
        ),
        ModelOutput.for_tool_call(
            model=MODEL, tool_name="bash", tool_arguments={"command": f"cat {NOTES}"}
        ),
        ModelOutput.from_content(model=MODEL, content="The answer is 42."),
    )


def main(log_dir: str, broker_url: str | None = None, tools: str = "bash") -> None:
    imported = any(name.startswith("farm") for name in sys.modules)  # Inspect's lookups load it
    if tools == "editor":
        model = get_model(MODEL, custom_outputs=editor_outputs())
        solver = [use_tools([text_editor(), bash(timeout=60)]), generate()]
    else:
        model = get_model(MODEL, custom_outputs=bash_outputs())
        solver = [use_tools([bash(timeout=BASH_TIMEOUT_S), python(timeout=60)]), generate()]
    task = Task(
        dataset=[
            Sample(
                input="What is 6 * 7? Use the tools.",
                target="42",
                files={"data/hello.txt": "placed by Sample.files\n"},
            )
        ],
        solver=solver,
        scorer=includes(),
        sandbox=("farm", {"broker_url": broker_url}) if broker_url else "farm",
    )
    [log] = eval(task, model=model, log_dir=log_dir, display="none")
    print(json.dumps({"location": log.location, "farm_imported_by_the_task": imported}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
