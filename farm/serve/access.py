"""Who calls, what it may do, and which sessions are its own.

Every route but the health check asks ``caller`` (a FastAPI dependency): no bearer token, or an
unknown one, is a 401 problem; a token without the route's scope a 403. ``Sessions`` keeps each
session's owner in the registry (``farm:api:owner:<session>``), so a token never sees, runs in
or closes another's session: to it, another token's session does not exist (404, the same as a
missing one). ``Slots`` caps the calls one token has running on this server.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPBearer

from farm.errors import SessionLost
from farm.registry import PREFIX
from farm.serve.problem_documents import ProblemError
from farm.serve.tokens import Token, TokenStore

if TYPE_CHECKING:
    from farm.client import Farm, Session

SCHEME = HTTPBearer(auto_error=False, description="a token of `farm token create`")
OWNER_TTL_S = 7 * 24 * 3600  # past any session's idle timeout: the registry forgets it first


def _owner_key(session_id: str) -> str:
    return f"{PREFIX}api:owner:{session_id}"


def _owned_key(token_id: str) -> str:
    return f"{PREFIX}api:owned:{token_id}"


def idempotent_id(token: Token, scope: str, key: str | None) -> str | None:
    """The exec id an ``Idempotency-Key`` stands for: the same key from the same token for the
    same session (or one-shot run) names the same exec, which the worker runs once."""
    if not key:
        return None
    return hashlib.sha256(f"{token.id}\0{scope}\0{key}".encode()).hexdigest()[:32]


@dataclass
class Slots:
    """Calls running per token on this server; one past a token's ``concurrency`` is a 429."""

    running: dict[str, int] = field(default_factory=dict)

    def free(self, token: Token) -> int:
        return token.concurrency - self.running.get(token.id, 0)

    def check(self, token: Token, count: int = 1) -> None:
        """A 429 problem unless ``count`` more calls fit (a streamed response checks before it
        starts: past its first byte, a refusal could no longer be a problem document)."""
        if self.free(token) < count:
            raise ProblemError(
                429,
                "busy",
                f"token {token.name!r} already has {self.running.get(token.id, 0)} calls "
                f"running (its cap is {token.concurrency}); wait for one to end",
                headers={"Retry-After": "1"},
            )

    @contextlib.asynccontextmanager
    async def hold(self, token: Token, count: int = 1) -> AsyncIterator[None]:
        self.check(token, count)
        self.running[token.id] = self.running.get(token.id, 0) + count
        try:
            yield
        finally:
            self.running[token.id] -= count


class Sessions:
    """The sessions the API opened, each held by the ``Session`` object that opened it (one
    engine: calls go through ``farm.client``) and owned by one token."""

    def __init__(self, farm: Farm) -> None:
        self.farm = farm
        self.held: dict[str, Session] = {}
        self.owners: dict[str, str] = {}  # session -> token id: it never changes, so it is kept

    async def open(self, token: Token, **options: Any) -> Session:
        return await self.adopt(token, await asyncio.to_thread(self.farm.session, **options))

    async def adopt(self, token: Token, session: Session) -> Session:
        """``session`` (opened, restored, or a fork) is the caller's from now on."""
        redis = self.farm.registry.redis
        with redis.pipeline() as pipe:
            pipe.set(_owner_key(session.id), token.id, ex=OWNER_TTL_S)
            pipe.sadd(_owned_key(token.id), session.id)
            await asyncio.to_thread(pipe.execute)
        self.held[session.id] = session
        self.owners[session.id] = token.id
        return session

    async def get(self, token: Token, session_id: str) -> Session:
        """The caller's session ``session_id``; 404 when it is not the caller's (or none's),
        ``SessionLost`` (410) when it was the caller's and is gone."""
        owner = self.owners.get(session_id)
        if owner is None:
            stored = await asyncio.to_thread(self.farm.registry.redis.get, _owner_key(session_id))
            if stored is not None:
                owner = self.owners[session_id] = str(stored)
        if owner != token.id:
            raise ProblemError(404, "not_found", f"no session {session_id}")
        session = self.held.get(session_id)
        if session is None or session.closed:  # opened through another server replica
            session = await asyncio.to_thread(self.farm.attach, session_id)
            self.held[session_id] = session
        return session

    async def close(self, token: Token, session_id: str) -> None:
        """Close the caller's session; one that is already gone is forgotten all the same."""
        try:
            session: Session | None = await self.get(token, session_id)
        except SessionLost:
            session = None
        self.held.pop(session_id, None)
        self.owners.pop(session_id, None)
        if session is not None:
            await asyncio.to_thread(session.close)
        redis = self.farm.registry.redis
        with redis.pipeline() as pipe:
            pipe.delete(_owner_key(session_id))
            pipe.srem(_owned_key(token.id), session_id)
            await asyncio.to_thread(pipe.execute)

    async def list(self, token: Token) -> list[dict[str, Any]]:
        """The caller's live sessions (those the registry forgot are dropped from its set)."""
        registry = self.farm.registry
        members = await asyncio.to_thread(registry.redis.smembers, _owned_key(token.id))
        ids = sorted(str(m) for m in members)
        found, gone = [], []
        for session_id in ids:
            entry = await asyncio.to_thread(registry.session, session_id)
            if entry is None:
                gone.append(session_id)
            else:
                found.append({"id": session_id, **entry})
        if gone:
            await asyncio.to_thread(registry.redis.srem, _owned_key(token.id), *gone)
        return found

    def close_all(self) -> None:
        """Close every session this server holds (it is stopping)."""
        for session in list(self.held.values()):
            with contextlib.suppress(SessionLost):
                session.close()
        self.held.clear()
        self.owners.clear()


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def authenticate(store: TokenStore, presented: str | None, scope: str) -> Token:
    """The token a request presents, allowed ``scope``; else a 401 or 403 problem."""
    challenge = {"WWW-Authenticate": 'Bearer realm="farm"'}
    if presented is None:
        raise ProblemError(401, "auth", "a bearer token is required", headers=challenge)
    token = store.verify(presented)
    if token is None:
        raise ProblemError(401, "auth", "unknown or revoked token", headers=challenge)
    if not token.allows(scope):
        raise ProblemError(403, "forbidden", f"token {token.name!r} lacks the {scope!r} scope")
    return token


def caller(scope: str) -> Callable[[Request], Any]:
    """A FastAPI dependency: the request's token, allowed ``scope``."""

    async def dependency(
        request: Request, credentials: Annotated[Any, Depends(SCHEME)] = None
    ) -> Token:
        store: TokenStore = request.app.state.tokens
        presented = bearer(request)
        token = store.recently_verified(presented) if presented else None
        if token is not None and token.allows(scope):
            return token
        return await asyncio.to_thread(authenticate, store, presented, scope)

    return dependency
