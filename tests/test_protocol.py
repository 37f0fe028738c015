"""One protocol, typed on both sides: the kernel's ``TypedDict``s
(``farm.kernel.wire.protocol``) and the host's pydantic models (``farm.models``) describe the
same frames. Each test fails when a field is added, renamed, retyped or made optional on one
side only."""

from __future__ import annotations

import contextlib
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

import pytest
from pydantic import BaseModel

from farm import kernel, models
from farm.kernel.wire import protocol
from farm.kernel.wire.client import KernelClient, KernelRequestError

HOST_FRAMES = sorted(protocol.HOST_FRAMES)


def sample(hint: Any, variant: int = 0) -> Any:
    """A value of type ``hint``; ``variant`` picks among the members of unions."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return {"any": [1, "x"]}
    if is_typeddict(hint):
        return {key: sample(value, variant) for key, value in get_type_hints(hint).items()}
    if origin is Literal:
        return args[variant % len(args)]
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)] or [type(None)]
        return sample(members[variant % len(members)], variant)
    if origin is list:
        return [sample(args[0], variant)]
    if origin is dict:
        return {"key": sample(args[1], variant)}
    return {str: "text", int: 4096, float: 1.5, bool: True, type(None): None}[hint]


def conforms(value: Any, hint: Any) -> bool:
    """Whether ``value`` (a JSON-like dump) is of type ``hint`` (a TypedDict's annotation)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return True
    if is_typeddict(hint):
        hints = get_type_hints(hint)
        return (
            isinstance(value, dict)
            and hint.__required_keys__ <= value.keys() <= hints.keys()
            and all(conforms(v, hints[k]) for k, v in value.items())
        )
    if origin is Literal:
        return value in args
    if origin in (Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(conforms(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(conforms(v, args[1]) for v in value.values())
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is type(None):
        return value is None
    return isinstance(value, hint) and (hint is bool or not isinstance(value, bool))


def required_none(frame: Any) -> set[str]:
    """Keys of ``frame`` that are required but may be ``None`` (they stay in a dump)."""
    return {k for k, hint in get_type_hints(frame).items() if type(None) in get_args(hint)}


def kernel_part(value: Any, hint: Any) -> Any:
    """A model's dump without what the host adds to what the kernel sent (a model's
    ``HOST_FIELDS``, such as a result's ``worker``), at any depth (an item's cells)."""
    origin, args = get_origin(hint), get_args(hint)
    if isinstance(hint, type) and issubclass(hint, BaseModel) and isinstance(value, dict):
        host_only = getattr(hint, "HOST_FIELDS", frozenset())
        return {
            k: kernel_part(v, hint.model_fields[k].annotation)
            for k, v in value.items()
            if k not in host_only
        }
    if origin in (Union, types.UnionType) and value is not None:
        for member in args:  # the member the value is (a discriminated union's by its type)
            if isinstance(member, type) and issubclass(member, BaseModel):
                with contextlib.suppress(ValueError):
                    member.model_validate(value)
                    return kernel_part(value, member)
        return value
    if origin is list and isinstance(value, list):
        return [kernel_part(v, args[0]) for v in value]
    return value


def model_fields(model: type[BaseModel]) -> tuple[set[str], set[str]]:
    """(all the fields the kernel knows, the required ones); host-only fields left out."""
    host_only = getattr(model, "HOST_FIELDS", frozenset())
    names = set(model.model_fields) - host_only
    return names, {n for n in names if model.model_fields[n].is_required()}


def test_both_sides_define_the_same_frames() -> None:
    assert set(protocol.HOST_FRAMES) == set(models.KERNEL_FRAMES)
    for name, frame in protocol.HOST_FRAMES.items():
        assert get_type_hints(frame)["type"] == Literal[name]  # type: ignore[valid-type]


@pytest.mark.parametrize("name", HOST_FRAMES)
def test_fields_and_their_optionality_agree(name: str) -> None:
    frame, model = protocol.HOST_FRAMES[name], models.KERNEL_FRAMES[name]
    names, required = model_fields(model)
    assert set(get_type_hints(frame)) == names
    assert required <= frame.__required_keys__  # the host never needs what may be left out
    assert not frame.__optional_keys__ & required


@pytest.mark.parametrize("name", HOST_FRAMES)
@pytest.mark.parametrize("variant", [0, 1, 2])
def test_every_kernel_frame_validates_with_the_hosts_model(name: str, variant: int) -> None:
    frame = sample(protocol.HOST_FRAMES[name], variant)
    models.KERNEL_FRAMES[name].model_validate(frame)


@pytest.mark.parametrize("name", HOST_FRAMES)
@pytest.mark.parametrize("variant", [0, 1, 2])
def test_every_host_model_dumps_a_frame_the_kernel_accepts(name: str, variant: int) -> None:
    frame = protocol.HOST_FRAMES[name]
    model = models.KERNEL_FRAMES[name]
    built = model.model_validate(sample(frame, variant))
    dumped = kernel_part(built.model_dump(mode="json", exclude_none=False), model)
    optional = {n for n, f in model.model_fields.items() if not f.is_required()}
    dumped = {
        k: v for k, v in dumped.items() if v is not None or k not in optional - required_none(frame)
    }
    assert conforms(dumped, frame), dumped


def test_cell_results_and_exec_results_have_the_same_fields() -> None:
    names, required = model_fields(models.ExecResult)
    assert set(get_type_hints(protocol.CellResult)) == names
    assert required <= protocol.CellResult.__required_keys__


def test_error_kinds_are_written_once_in_the_kernel() -> None:
    assert [kind.value for kind in models.ErrorKind] == list(kernel.KINDS)


def test_the_conformance_checker_itself_notices_drift() -> None:
    class Drifted(typing.TypedDict):
        type: Literal["pong"]
        pid: str  # an int on the host side

    pong = models.Pong.model_validate(sample(protocol.Pong)).model_dump(mode="json")
    assert conforms(pong, protocol.Pong)
    assert not conforms(pong, Drifted)
    assert not conforms({**pong, "surprise": 1}, protocol.Pong)
    with pytest.raises(ValueError):
        models.Pong.model_validate(sample(Drifted))


def test_what_a_real_kernel_sends_validates_on_the_host(client: KernelClient) -> None:
    models.Pong.model_validate(client.ping())
    opened = models.SessionOpened.model_validate(client.request({"type": "open_session"}))
    message = {
        "type": "execute",
        "session_id": opened.session_id,
        "epoch": 1,
        "code": "print(1)\ndisplay(2)\nimport time; time.sleep(0.2)\nraise ValueError('v')",
        "timeout_s": 5.0,
        "exec_id": "e1",
        "events": True,
    }
    models.Execute.model_validate(message)
    events: list[dict[str, Any]] = []
    reply = models.ExecReply.model_validate(
        client.request(message, 30, lambda frame: events.append(frame))
    )
    assert reply.result.error is not None and reply.result.error.kind == models.ErrorKind.USER
    kinds = [models.EventFrame.model_validate(frame).event.type for frame in events]
    assert {"started", "running", "stream", "display"} <= set(kinds)
    closed = client.request({"type": "close_session", "session_id": opened.session_id})
    models.SessionClosed.model_validate(closed)
    with pytest.raises(KernelRequestError) as refused:
        client.request({"type": "close_session", "session_id": "missing"})
    models.ErrorReply(type="error", code=refused.value.code, message="")
