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

With ``pair``, two samples (``a`` and ``b``) run at once, each using ``text_editor``; the
scripted model answers each by its own transcript (a callable: a list of outputs would be
shared by both). Between their creating and viewing a file, each sample's ``bash`` finds the
directory its tools server runs from (``/proc/PID/exe``), publishes it in ``/tmp``, waits for
the other sample's (a sample that never meets the other fails the test: the two did not run at
once), and tries to list and read the other's tools. It prints ``key=value`` lines: its host
name and uid, both directories with their owner and mode, and what the two tries said.

Usage: python tests/inspect_eval.py LOG_DIR [BROKER_URL [editor|pair]]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessage, ModelOutput, ModelUsage, get_model
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


PAIR = ("a", "b")
# What each sample of the pair reports of its box: its tools directory (its server's
# executable's), who owns it, and what its /var/tmp holds (its own box's /var/tmp).
MEET = """
set -u
exe=""
for pid in $(pgrep -u "$(id -u)"); do
    case $(readlink "/proc/$pid/exe" 2>/dev/null) in
        */inspect-sandbox-tools) exe=$(readlink "/proc/$pid/exe") ;;
    esac
done
[ -n "$exe" ] || { echo "no tools server of this box" >&2; exit 1; }
own=$(dirname "$exe")
echo "host=$(hostname)"
echo "uid=$(id -u)"
echo "own=$own"
echo "own_stat=$(stat -c %u:%a "$own")"
echo "var_tmp=$(ls -A /var/tmp | tr '\\n' ' ')"
"""


def pair_outputs(
    messages: list[ChatMessage], tools: Sequence[object], choice: object, config: object
) -> ModelOutput:
    """The next step of the sample whose input names it (``sample a``): by how many tool
    results its transcript holds."""
    me = next(m.text for m in messages if m.role == "user").split()[-1]
    notes = f"/var/tmp/notes-{me}.txt"
    meet = MEET
    steps = [
        ("text_editor", {"command": "create", "path": notes, "file_text": f"notes of {me}\n"}),
        ("bash", {"command": meet}),
        ("text_editor", {"command": "view", "path": notes}),
        ("bash", {"command": f"cat {notes}"}),
    ]
    done = sum(1 for m in messages if m.role == "tool")
    if done < len(steps):
        name, arguments = steps[done]
        output = ModelOutput.for_tool_call(model=MODEL, tool_name=name, tool_arguments=arguments)
    else:
        output = ModelOutput.from_content(model=MODEL, content="The answer is 42.")
    [output] = scripted(output)
    return output


def main(log_dir: str, broker_url: str | None = None, tools: str = "bash") -> None:
    imported = any(name.startswith("farm") for name in sys.modules)  # Inspect's lookups load it
    samples = [
        Sample(
            input="What is 6 * 7? Use the tools.",
            target="42",
            files={"data/hello.txt": "placed by Sample.files\n"},
        )
    ]
    if tools == "pair":
        model = get_model(MODEL, custom_outputs=pair_outputs)
        solver = [use_tools([text_editor(), bash(timeout=60)]), generate()]
        samples = [Sample(id=me, input=f"What is 6 * 7? sample {me}", target="42") for me in PAIR]
    elif tools == "editor":
        model = get_model(MODEL, custom_outputs=editor_outputs())
        solver = [use_tools([text_editor(), bash(timeout=60)]), generate()]
    else:
        model = get_model(MODEL, custom_outputs=bash_outputs())
        solver = [use_tools([bash(timeout=BASH_TIMEOUT_S), python(timeout=60)]), generate()]
    task = Task(
        dataset=samples,
        solver=solver,
        scorer=includes(),
        sandbox=("farm", {"broker_url": broker_url}) if broker_url else "farm",
    )
    [log] = eval(task, model=model, log_dir=log_dir, display="none", max_samples=len(samples))
    print(json.dumps({"location": log.location, "farm_imported_by_the_task": imported}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
