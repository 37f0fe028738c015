"""The events of a run, as they happen: the live stream, the session journal and replay.

A run is ``ExecStart``, then ``Stream``, ``Display``, ``HostCall`` and ``Egress`` (a
connection through the box's proxy) in the order they happened, then ``Result`` or ``Error``
when there is one, then ``ExecEnd``: the same models from ``Session.stream``, ``Farm.replay``
and the wire. Invariants: every event is JSON-serialisable and every rendering is bounded
(``RENDER_CHARS``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from farm.models import ErrorKind, ExecError, Value

RENDER_CHARS = 20_000
TRACEBACK_LINES = 60


def clip(text: str, limit: int = RENDER_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = (limit - 60) // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def fenced(text: str, lang: str = "") -> str:
    """A fenced block that no backtick run inside ``text`` can close early."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    body = clip(text)
    return f"{fence}{lang}\n{body}{'' if body.endswith(chr(10)) else chr(10)}{fence}"


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exec_id: str
    session_id: str
    seq: int = Field(description="position of this event within its run, from 0")
    ts: float = Field(description="when the worker saw it (unix time)")

    def _repr_markdown_(self) -> str:
        raise NotImplementedError

    def plain(self) -> str:
        """A bounded one-glance text (``text/plain`` of ``mime_stream``)."""
        return self._repr_markdown_()

    def mime_bundle(self) -> dict[str, Any]:
        """What shows this event: its own renderings (rich values bring their own bundle)."""
        return {"text/plain": self.plain(), "text/markdown": self._repr_markdown_()}


class ExecStart(_Event):
    type: Literal["exec_start"] = "exec_start"
    code: str
    epoch: int
    worker: str | None = None
    replay_of: str | None = Field(default=None, description="exec id this run replays (restore)")

    def _repr_markdown_(self) -> str:
        what = f"replay of `{self.replay_of[:8]}`" if self.replay_of else "run"
        return f"**▶ {what} `{self.exec_id[:8]}`** (epoch {self.epoch})\n\n" + fenced(
            self.code, "python"
        )

    def plain(self) -> str:
        return f">>> {clip(self.code)}"


class Stream(_Event):
    type: Literal["stream"] = "stream"
    name: Literal["stdout", "stderr"]
    text: str

    def _repr_markdown_(self) -> str:
        return fenced(self.text, "text" if self.name == "stdout" else "stderr")

    def plain(self) -> str:
        return clip(self.text)


class _Rich(_Event):
    value: Value

    def mime_bundle(self) -> dict[str, Any]:
        return dict(self.value.data)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """Jupyter shows the object's own bundle (PNG, HTML, ...), not a description of it."""
        return self.mime_bundle()

    def plain(self) -> str:
        return clip(str(self.value.data.get("text/plain", self.value.text)))

    def _repr_markdown_(self) -> str:
        markdown = self.value.data.get("text/markdown")
        if isinstance(markdown, str):
            return clip(markdown)
        return fenced(self.plain(), "text")


class Display(_Rich):
    type: Literal["display"] = "display"


class Result(_Rich):
    type: Literal["result"] = "result"

    def _repr_markdown_(self) -> str:
        return "**Out:**\n\n" + super()._repr_markdown_()


class Error(_Event):
    type: Literal["error"] = "error"
    error: ExecError

    def _repr_markdown_(self) -> str:
        head = f"**{self.error.ename}** ({self.error.kind.value}): {clip(self.error.evalue, 2000)}"
        lines = self.error.traceback[-TRACEBACK_LINES:]
        return head + ("\n\n" + fenced("".join(lines), "pytb") if lines else "")

    def plain(self) -> str:
        return clip("".join(self.error.traceback[-TRACEBACK_LINES:])) or (
            f"{self.error.ename}: {clip(self.error.evalue, 2000)}"
        )


class HostCall(_Event):
    """Sandboxed code called a host callback (``llm_query(...)``); the client answers it."""

    type: Literal["host_call"] = "host_call"
    call_id: int
    name: str
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    batch: bool = False

    @property
    def items(self) -> int:
        """How many calls this is: a batch counts its inputs."""
        return len(self.args[0]) if self.batch and self.args else 1

    def _repr_markdown_(self) -> str:
        shown = ", ".join(
            [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        )
        name = f"{self.name}_batched" if self.batch else self.name
        return f"↪ host call `{clip(f'{name}({shown})', 2000)}`"


class Egress(_Event):
    """A connection through the box's egress proxy, as it ended (``farm.egress``): where to,
    whether its policy allowed it (and why not, or why it was cut off), bytes each way."""

    type: Literal["egress"] = "egress"
    host: str
    port: int
    allowed: bool
    reason: str = ""
    address: str = Field(default="", description="the address connected to, once checked")
    bytes_out: int = Field(default=0, description="from the box")
    bytes_in: int = Field(default=0, description="to the box")
    duration_s: float = 0.0

    def _repr_markdown_(self) -> str:
        where = f"`{self.host}:{self.port}`"
        if not self.allowed:
            return f"⊘ egress to {where} denied: {clip(self.reason, 500)}"
        cut = f"; {clip(self.reason, 500)}" if self.reason else ""
        return (
            f"⇄ egress to {where} ({self.address}): {self.bytes_out} B out, "
            f"{self.bytes_in} B in, {self.duration_s:.2f} s{cut}"
        )


class ExecEnd(_Event):
    type: Literal["exec_end"] = "exec_end"
    status: Literal["ok", "error"]
    kind: ErrorKind | None = None
    epoch: int
    state_lost: bool = False
    ran: bool = Field(
        default=True, description="False when the kernel refused to run the code at all"
    )
    duration_s: float = 0.0
    cpu_s: float = 0.0
    max_rss_kb: int = 0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    worker: str | None = None

    def _repr_markdown_(self) -> str:
        mark = (
            "✔ ok" if self.status == "ok" else f"✘ error ({self.kind.value if self.kind else '?'})"
        )
        extra = "; **state lost**" if self.state_lost else ""
        return f"*{mark} in {self.duration_s:.3f} s, cpu {self.cpu_s:.3f} s{extra}*"

    def plain(self) -> str:
        return self._repr_markdown_().strip("*")


class Lifecycle(_Event):
    """A session's snapshot, pause, resume or move to another worker (its own ``exec_id``):
    where it went and which variables did not come along (``farm.client.snapshots``)."""

    type: Literal["lifecycle"] = "lifecycle"
    action: Literal["snapshot", "restored", "paused", "resumed", "moved"]
    worker: str
    snapshot_id: str = ""
    lost: dict[str, str] = Field(default_factory=dict, description="name -> why not carried")

    def _repr_markdown_(self) -> str:
        lost = f"; not carried: {', '.join(sorted(self.lost))}" if self.lost else ""
        return f"⟳ session {self.action} (worker {self.worker}){clip(lost, 2000)}"


def closing_events(
    result: dict[str, Any], *, exec_id: str, session_id: str, seq: int, ts: float, ran: bool
) -> list[Event]:
    """``Result``/``Error``/``ExecEnd`` of a run, from its result (an ``ExecResult`` dict)."""
    out: list[Event] = []

    def common() -> dict[str, Any]:
        return {"exec_id": exec_id, "session_id": session_id, "seq": seq + len(out), "ts": ts}

    if result.get("value") is not None:
        out.append(Result(**common(), value=Value.model_validate(result["value"])))
    if result.get("error") is not None:
        out.append(Error(**common(), error=ExecError.model_validate(result["error"])))
    out.append(
        ExecEnd(
            **common(),
            status=result["status"],
            kind=(result.get("error") or {}).get("kind"),
            epoch=result.get("epoch", 0),
            state_lost=result.get("state_lost", False),
            ran=ran,
            duration_s=result.get("duration_s", 0.0),
            cpu_s=result.get("cpu_s", 0.0),
            max_rss_kb=result.get("max_rss_kb", 0),
            stdout_truncated=result.get("stdout_truncated", False),
            stderr_truncated=result.get("stderr_truncated", False),
            worker=result.get("worker"),
        )
    )
    return out


class Branch(_Event):
    """A checkpoint, rollback, drop or fork of the session (docs/design/fork.md), as its
    worker did it; ``exec_id`` is the op's own id. A rollback moves the session's ``epoch``."""

    type: Literal["branch"] = "branch"
    op: Literal["checkpoint", "rollback", "drop", "fork"]
    epoch: int
    checkpoint_id: str | None = None
    forks: list[str] = Field(default_factory=list, description="a fork's new sessions")

    def _repr_markdown_(self) -> str:
        what = f" `{self.checkpoint_id}`" if self.checkpoint_id else ""
        made = f": {', '.join(f'`{f[:8]}`' for f in self.forks)}" if self.forks else ""
        return f"⑂ {self.op}{what} (epoch {self.epoch}){made}"


Event = Annotated[
    ExecStart
    | Stream
    | Display
    | HostCall
    | Egress
    | Result
    | Error
    | ExecEnd
    | Branch
    | Lifecycle,
    Field(discriminator="type"),
]
EVENT = TypeAdapter(Event)
EVENT_TYPES = (
    ExecStart,
    Stream,
    Display,
    HostCall,
    Egress,
    Result,
    Error,
    ExecEnd,
    Branch,
    Lifecycle,
)


def parse_event(raw: str | bytes | dict[str, Any]) -> Event:
    """An event from its JSON (a journal entry) or its dict."""
    if isinstance(raw, dict):
        return EVENT.validate_python(raw)
    return EVENT.validate_json(raw)
