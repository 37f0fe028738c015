"""``FarmExecutor``: smolagents' code agents run their code in a farm session.

Every step of an agent runs in one session (variables live on between steps); the final
answer comes back whole through a workspace file (an error's ``evalue`` is cut at 8192
characters); a session that lost its state is replaced by a fresh namespace with the tools,
and the step fails saying so. Why and how: docs/design/smolagents-executor.md.
"""

from __future__ import annotations

import ast
import base64
import io
import re
from collections.abc import Iterable
from typing import Any

from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.tools import get_tools_definition_code
from smolagents.utils import AgentError

from farm.client import Farm, Session
from farm.errors import FileOperationError, InvalidRequest, SessionLost, StateLost
from farm.models import ExecResult

ANSWER_FILE = ".farm-final-answer"
HOISTED_IMPORT = re.compile(r"^import ([\w.]+)$", re.MULTILINE)
FINAL_ANSWER = "final_answer"
RECOVERED = "the sandbox's variables are gone (the tools and the agent's were sent again)"
BUILD_HINT = "build an image with them (farm image build NAME --pip PACKAGE) and pass image=NAME"
# Run once the tools are defined: the final-answer tool also stashes its serialized answer in
# a file (absolute: the agent's code may change directory), read back by the executor.
STASH_ANSWERS = f"""
def __farm_stash_answers(tool, path):
    forward = tool.forward
    def stashing_forward(*args, **kwargs):
        try:
            return forward(*args, **kwargs)
        except BaseException as exc:
            if type(exc).__name__ == "FinalAnswerException":
                with open(path, "w", encoding="utf-8") as f:
                    f.write(str(exc))
            raise
    tool.forward = stashing_forward
__import__("os").remove({ANSWER_FILE!r}) if __import__("os").path.exists({ANSWER_FILE!r}) else None
__farm_stash_answers({FINAL_ANSWER}, __import__("os").path.abspath({ANSWER_FILE!r}))
del __farm_stash_answers
"""
# Which of the names given are neither importable modules nor installed distributions.
MISSING = """
import importlib.metadata as _m, importlib.util as _u
def __farm_missing(names):
    found = []
    for name in names:
        try:
            _m.distribution(name)
        except _m.PackageNotFoundError:
            if _u.find_spec(name.split(".")[0]) is None:
                found.append(name)
    return found
"""


class FarmExecutor(RemotePythonExecutor):
    """A smolagents ``RemotePythonExecutor`` over one farm session (see the module).

    ``image`` is the farm image the code runs in (it must hold the packages the tools and
    ``additional_imports`` name); ``timeout_s`` bounds each step; ``session_kwargs`` go to
    ``farm.session`` (``limits``, ``open_wait_s``...). Managed agents cannot be sent to a
    remote executor as source code, so they are not supported.
    """

    def __init__(
        self,
        farm: Farm,
        image: str = "default",
        *,
        additional_imports: Iterable[str] = (),
        logger: AgentLogger | None = None,
        allow_pickle: bool = False,
        timeout_s: float = 60.0,
        **session_kwargs: Any,
    ) -> None:
        # CodeAgent hands neither its logger nor its authorized imports to an executor given
        # with executor=: they are this one's own.
        imports = list(additional_imports)  # read once: it may be an iterator
        super().__init__(imports, logger or AgentLogger(LogLevel.INFO), allow_pickle)
        self.farm = farm
        self.image = image
        self.timeout_s = timeout_s
        self.session_kwargs = session_kwargs
        self.session: Session = self._open()
        self._tools: dict[str, Any] = {}
        self._variables: dict[str, Any] = {}
        self._reported: set[str] = set()  # missing packages logged already
        try:
            missing = self._missing(imports)
        except BaseException:
            self.session.close()
            raise
        if missing:
            self.session.close()
            raise InvalidRequest(f"farm image {image!r} lacks {missing}; {BUILD_HINT}")
        self.installed_packages = list(imports)

    def _open(self) -> Session:
        return self.farm.session(self.image, timeout_s=self.timeout_s, **self.session_kwargs)

    # --- what the agent calls ------------------------------------------------------------

    def send_tools(self, tools: dict[str, Any]) -> None:
        """Define the tools in the session, as smolagents' remote executors do (the final
        answer tool patched to raise its answer, once: ``agent.run`` sends the tools at every
        run), except that the imports smolagents hoists out of the tools' code are optional
        (see ``guard_imports``) and nothing is installed."""
        self._tools = dict(tools)
        answer = tools.get(FINAL_ANSWER)
        if answer is not None and not hasattr(answer, "_forward"):
            self._patch_final_answer_with_exception(answer)
        requirements = {pkg for tool in tools.values() for pkg in tool.to_dict()["requirements"]}
        self.install_packages(sorted(requirements - {"smolagents"}))
        self._define_tools()

    def send_variables(self, variables: dict[str, Any]) -> None:
        self._variables = dict(variables)
        super().send_variables(variables)

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """What smolagents asks to install for the tools (read from their imports, some of
        them optional: the final-answer tool imports PIL and numpy only when they are there).
        Nothing can be installed in a sandbox without network: the missing ones are logged,
        and a tool that needs one fails with ``ImportError``, which the model sees."""
        missing = set(self._missing(additional_imports)) - self._reported
        if missing:
            self._reported |= missing
            self.logger.log(f"farm image {self.image!r} lacks {sorted(missing)}; {BUILD_HINT}")
        return additional_imports

    def _missing(self, names: Iterable[str]) -> list[str]:
        """Which of ``names`` (distributions or modules, ``pkg.*`` allowed) the image lacks."""
        wanted = sorted({name.removesuffix(".*") for name in names} - {"*"})
        if not wanted:
            return []
        result = self._run(MISSING + f"__farm_missing({wanted!r})")
        if result.error is not None or result.value is None:
            raise InvalidRequest(f"cannot check packages in farm image {self.image!r}: {result}")
        found: list[str] = ast.literal_eval(result.value.text)
        return found

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """Run one step's code: its value and logs, its final answer, or an ``AgentError``
        the model sees (the code raised, timed out, or its session lost its state)."""
        try:
            result = self._run(code)
        except StateLost as exc:
            self._recover(restart=True)
            raise AgentError(f"{exc}; {RECOVERED}", self.logger) from None
        except SessionLost as exc:
            self._recover(restart=False)
            raise AgentError(f"{exc}; {RECOVERED}", self.logger) from None
        logs = result.stdout + result.stderr
        error = result.error
        if error is not None and error.ename == self.FINAL_ANSWER_EXCEPTION:
            answer = self._deserialize_final_answer(
                self._final_payload(error.evalue), self.allow_pickle
            )
            return CodeOutput(output=answer, logs=logs, is_final_answer=True)
        if error is not None:
            message = (
                f"{logs}\nExecuting code yielded an error:\n{error.ename}\n{error.evalue}\n"
                f"{''.join(error.traceback)}"
            )
            if result.state_lost:
                self._recover(restart=True)
                message += f"\n({error.kind.value}: {RECOVERED})"
            raise AgentError(message, self.logger)
        return CodeOutput(output=_output(result), logs=logs, is_final_answer=False)

    def cleanup(self) -> None:
        """Close the session (again: nothing happens)."""
        self.session.close()

    delete = cleanup

    # --- farm ----------------------------------------------------------------------------

    def _run(self, code: str) -> ExecResult:
        return self.session.run(code, self.timeout_s)

    def _final_payload(self, evalue: str) -> str:
        """The whole serialized answer: the stash file, else the (possibly cut) error value."""
        try:
            return self.session.files.read(ANSWER_FILE).decode("utf-8")
        except FileOperationError:  # a FinalAnswerException of the agent's own making
            return evalue

    def _recover(self, *, restart: bool) -> None:
        """Go on in a fresh namespace (``restart``) or a new session, with the tools and
        variables sent again."""
        if restart:
            self.session.restart()
        else:
            self.session.close()
            self.session = self._open()
        if self._variables:
            super().send_variables(self._variables)
        self._define_tools()

    def _define_tools(self) -> None:
        code = get_tools_definition_code(self._tools)
        if code:
            self.run_code_raise_errors(guard_imports(code))
        if FINAL_ANSWER in self._tools:
            self.run_code_raise_errors(STASH_ANSWERS)


def guard_imports(code: str) -> str:
    """The tools' definition with each top-level ``import X`` made optional. smolagents hoists
    every import it finds in a tool's class to the top of the cell, those its code guards with
    ``try/except ImportError`` too (the final-answer tool's PIL and numpy): one missing package
    would then leave every tool undefined. Guarded, a tool that needs a missing package fails
    when it is called, with an error the model sees."""
    return HOISTED_IMPORT.sub(r"try:\n    import \1\nexcept ImportError:\n    pass", code)


def _output(result: ExecResult) -> Any:
    """A step's value as remote executors give it: a PIL image for a PNG, else its text."""
    if result.value is None:
        return None
    png = result.value.data.get("image/png")
    if isinstance(png, str):
        from PIL import Image

        return Image.open(io.BytesIO(base64.b64decode(png)))
    return result.value.text
