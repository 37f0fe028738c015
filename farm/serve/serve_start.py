"""Starting ``farm serve``: the first token, the state file and uvicorn.

Tokens at start: ``FARM_API_TOKEN``, when set, is an admin token of this server. With none set
and none stored, the first start makes an admin token, returns it for the CLI to print once
(as Jupyter does) and keeps it in the state file (mode 0600), from which a later start over a
fresh broker (``--local``) registers it again, so the same token keeps working.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.local.redis_server import write_private
from farm.serve.tokens import TokenStore

if TYPE_CHECKING:
    from farm.client import Farm
    from farm.settings import FarmSettings

FIRST_TOKEN = "first"


def read_state(path: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return state


def first_token(store: TokenStore, settings: FarmSettings) -> str | None:
    """The admin token to print once, or ``None`` (``FARM_API_TOKEN`` is set, or tokens exist);
    re-registers the state file's token when the broker forgot it."""
    kept = read_state(settings.serve_state_file).get("token")
    if isinstance(kept, str) and store.verify(kept) is None:
        store.register(kept, FIRST_TOKEN, ["admin"], settings.api_token_concurrency)
        return None
    if kept or settings.api_token is not None or store.any_stored():
        return None
    _, presented = store.create(FIRST_TOKEN, ["admin"], settings.api_token_concurrency)
    return presented


def write_state(settings: FarmSettings, url: str, token: str | None, farm: Farm) -> None:
    """Record this server (``farm serve``'s state file, 0600: it may hold a token)."""
    path = settings.serve_state_file
    state = read_state(path)
    state.update(pid=os.getpid(), url=url, started_at=time.time())
    if token:
        state["token"] = token
    if farm.local_farm is not None:
        state["broker_url"] = farm.local_farm.broker_url
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    write_private(tmp, json.dumps(state))
    tmp.replace(path)


def run(
    farm: Farm,
    settings: FarmSettings,
    store: TokenStore,
    *,
    host: str,
    port: int,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
) -> None:
    """Serve until interrupted; the sessions it opened are closed at the end."""
    import uvicorn

    from farm.serve.app import make_app

    app = make_app(farm, store, settings, host=host)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
        timeout_graceful_shutdown=5,
    )
    uvicorn.Server(config).run()
