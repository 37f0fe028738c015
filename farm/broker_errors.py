"""The one place where what Redis, kombu and Celery raise becomes a farm error.

Every tier talks to the broker (clients send and wait, workers publish and answer), and each
must tell the same two things apart: a broker that is down (an outage: wait it out, up to
``FARM_BROKER_WAIT_S``) and a broker that refuses this process (a wrong or missing password,
an ACL user without farm's keys, a TLS certificate this process does not trust: waiting will
not help, so ``BrokerAuthFailed`` at once). redis-py's ``AuthenticationError`` is a
``ConnectionError``, so without this a wrong password would be waited out as an outage.
"""

from __future__ import annotations

import ssl

import redis
from kombu.exceptions import OperationalError

from farm.errors import BrokerAuthFailed, BrokerUnavailable, FarmError

# What the broker's clients raise when it cannot be reached (kombu for sends, redis-py for
# results, the registry and the journal).
BROKER_DOWN: tuple[type[BaseException], ...] = (
    OperationalError,
    redis.ConnectionError,
    redis.TimeoutError,
)
# What the broker's clients raise when the broker refuses this client (``refusal`` says which):
# redis-py's AuthenticationError (NOAUTH, WRONGPASS) is among BROKER_DOWN, an ACL's NOPERM is not.
REFUSED: tuple[type[BaseException], ...] = (*BROKER_DOWN, redis.exceptions.NoPermissionError)


def refusal(
    exc: BaseException, url: str, *, password: bool | None = None
) -> BrokerAuthFailed | None:
    """``BrokerAuthFailed`` when ``exc``, or an error it wraps (kombu and Celery wrap
    redis-py's), says that the broker refused this client or this client the broker's TLS
    certificate; ``None`` for anything else. ``password``: whether the client gave one
    (``None``: unknown), to say which of the two to fix."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, redis.AuthenticationError):
            hint = "set FARM_BROKER_PASSWORD, or put the password in FARM_BROKER_URL"
            if password is False:
                return BrokerAuthFailed(
                    url, f"requires a password and this client gave none; {hint}"
                )
            return BrokerAuthFailed(
                url, f"refused this client's password (or user): {cause}; {hint}"
            )
        if isinstance(cause, redis.exceptions.NoPermissionError):
            return BrokerAuthFailed(
                url, f"does not allow this client's user what farm needs: {cause}"
            )
        if isinstance(cause, ssl.SSLCertVerificationError):
            return BrokerAuthFailed(
                url,
                f"presented a TLS certificate this client does not trust ({cause.verify_message}); "
                "set FARM_BROKER_TLS_CA_FILE to the CA that signed it",
            )
        cause = cause.__cause__ or cause.__context__
    return None


def broker_error(
    exc: BaseException, url: str, *, sent: bool, password: bool | None = None
) -> FarmError:
    """The farm error for a failure of the broker's clients: ``BrokerAuthFailed`` when the
    broker refused this client, else ``BrokerUnavailable`` (``sent``: see there)."""
    return refusal(exc, url, password=password) or BrokerUnavailable(url, exc, sent=sent)
