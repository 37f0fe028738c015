"""Mutual challenge-response authentication with a shared token.

The server greets with a fresh random nonce, so a recorded handshake cannot be replayed; the
client answers with HMAC-SHA256(token, "client" + server nonce + client nonce) and the server
proves it knows the token too with the "server" variant. The token itself never crosses the
wire, is never logged, and is compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

NONCE_BYTES = 16
MIN_TOKEN_CHARS = 16


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def new_token() -> str:
    return secrets.token_hex(32)


def mac(token: str, role: str, server_nonce: str, client_nonce: str) -> str:
    message = f"{role}:{server_nonce}:{client_nonce}".encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def verify(token: str, role: str, server_nonce: str, client_nonce: str, given: object) -> bool:
    if not isinstance(given, str):
        return False
    expected = mac(token, role, server_nonce, client_nonce)
    return hmac.compare_digest(expected.encode(), given.encode())


def check_token(token: str) -> str:
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"the kernel token must have at least {MIN_TOKEN_CHARS} characters")
    return token
