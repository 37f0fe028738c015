"""The API's bearer tokens: made by ``farm token create``, kept hashed in the registry.

A token reads ``farm_<id>_<secret>``: the id finds its record (``farm:api:tokens``, a hash of id
to JSON), the secret is checked against the record's SHA-256 in constant time. The secret
itself is stored nowhere (256 random bits need no slow hash); whoever loses it makes a new one.
Scopes: ``run`` (sessions, runs, files, map) and ``admin`` (also workers, images, tokens). Each
token has ``concurrency``, the calls it may have running at once on one server.

``FARM_API_TOKEN`` is an admin token of the server it is set for (id ``env``), never stored.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from farm.errors import InvalidRequest
from farm.registry import PREFIX

if TYPE_CHECKING:
    import redis

TOKENS_KEY = f"{PREFIX}api:tokens"
# A verified token is trusted this long without asking Redis again: a revoke takes effect on
# every server within it, and a run pays no round trip for its token.
VERIFIED_S = 1.0
SCOPES = ("run", "admin")
ENV_ID = "env"


class Token(BaseModel):
    """A token's record (what ``farm token list`` shows): never its secret."""

    id: str
    name: str
    scopes: list[str] = Field(default_factory=lambda: ["run"])
    concurrency: int = Field(32, ge=1, description="calls it may have running at once")
    created: float = 0.0
    digest: str = Field("", exclude=True, description="SHA-256 of the secret (hex)")

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _split(presented: str) -> tuple[str, str] | None:
    prefix, _, rest = presented.partition("_")
    token_id, _, secret = rest.partition("_")
    if prefix != "farm" or not token_id or not secret:
        return None
    return token_id, secret


ENV_TOKEN = Token(id=ENV_ID, name="FARM_API_TOKEN", scopes=["admin"], concurrency=1024)


class TokenStore:
    """The tokens of one farm (its registry's Redis), plus the server's ``FARM_API_TOKEN``."""

    def __init__(self, redis: redis.Redis, env_token: str | None = None) -> None:
        self.redis = redis
        self._env = _digest(env_token) if env_token else None
        self._verified: dict[str, tuple[float, Token]] = {}  # digest -> (until, token)

    def create(
        self, name: str, scopes: list[str] | None = None, concurrency: int = 32
    ) -> tuple[Token, str]:
        """A new token and its secret string (shown once: only its digest is kept)."""
        token_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        presented = f"farm_{token_id}_{secret}"
        return self.register(presented, name, scopes, concurrency), presented

    def register(
        self, presented: str, name: str, scopes: list[str] | None = None, concurrency: int = 32
    ) -> Token:
        """Store ``presented`` (a ``farm_<id>_<secret>`` string made earlier) as a token."""
        parts = _split(presented)
        if parts is None:
            raise InvalidRequest("a token reads farm_<id>_<secret>")
        wanted = list(dict.fromkeys(scopes or ["run"]))
        unknown = [s for s in wanted if s not in SCOPES]
        if unknown:
            raise InvalidRequest(f"unknown scopes {unknown}: use {', '.join(SCOPES)}")
        token = Token(
            id=parts[0],
            name=name,
            scopes=wanted,
            concurrency=concurrency,
            created=time.time(),
            digest=_digest(parts[1]),
        )
        record = token.model_dump() | {"digest": token.digest}
        self.redis.hset(TOKENS_KEY, token.id, json.dumps(record))
        return token

    def list(self) -> list[Token]:
        raw: dict[str, str] = self.redis.hgetall(TOKENS_KEY)  # type: ignore[assignment]
        return sorted((self._load(v) for v in raw.values()), key=lambda t: t.created)

    def any_stored(self) -> bool:
        return bool(self.redis.hlen(TOKENS_KEY))

    def revoke(self, token_id: str) -> bool:
        """Remove a token (by id or name); False when there was none."""
        for token in self.list():
            if token_id in (token.id, token.name):
                return bool(self.redis.hdel(TOKENS_KEY, token.id))
        return False

    def recently_verified(self, presented: str) -> Token | None:
        """The token ``presented`` is, when that needs no I/O: ``FARM_API_TOKEN``, or a token
        verified within ``VERIFIED_S``."""
        digest = _digest(presented)
        if self._env is not None and hmac.compare_digest(digest, self._env):
            return ENV_TOKEN
        hit = self._verified.get(digest)
        return hit[1] if hit is not None and hit[0] > time.monotonic() else None

    def verify(self, presented: str) -> Token | None:
        """The token ``presented`` is, or ``None`` (unknown, revoked or a wrong secret)."""
        digest = _digest(presented)
        if self._env is not None and hmac.compare_digest(digest, self._env):
            return ENV_TOKEN
        parts = _split(presented)
        if parts is None:
            return None
        raw = self.redis.hget(TOKENS_KEY, parts[0])
        if raw is None:
            return None
        token = self._load(str(raw))
        if not hmac.compare_digest(_digest(parts[1]), token.digest):
            return None
        if len(self._verified) > 10_000:  # many tokens at once: forget, never grow without end
            self._verified.clear()
        self._verified[digest] = (time.monotonic() + VERIFIED_S, token)
        return token

    @staticmethod
    def _load(raw: str) -> Token:
        data = json.loads(raw)
        digest = data.pop("digest", "")
        token = Token.model_validate(data)
        token.digest = digest
        return token
