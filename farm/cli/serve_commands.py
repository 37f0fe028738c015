"""``farm serve``, ``farm mcp`` and ``farm token``: thin, like the rest of the CLI (parse, call
``farm.serve``, render)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from farm.client import Farm
from farm.errors import InvalidRequest
from farm.serve.tokens import TokenStore
from farm.settings import FarmSettings

token_app = typer.Typer(help="Bearer tokens of the HTTP API (`farm serve`).", no_args_is_help=True)
console = Console()
err = Console(stderr=True)
LOCAL = typer.Option(0, "--local", help="run an embedded farm with this many workers")
BROKER = typer.Option(
    None, "--broker-url", help="the farm's broker (default: FARM_BROKER_URL, or `farm up`'s)"
)


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


@contextlib.contextmanager
def farm_for(local: int, broker_url: str | None) -> Iterator[Farm]:
    """An embedded farm of ``local`` workers, the farm at ``broker_url``, or the default one."""
    if local:
        held = Farm.local(local)
    elif broker_url:
        held = Farm.connect(broker_url)
    else:
        held = Farm.default()
    with held:
        yield held


def serve(
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8080, help="port"),
    local: int = LOCAL,
    broker_url: str | None = BROKER,
    ssl_certfile: str | None = typer.Option(None, help="TLS certificate (uvicorn's)"),
    ssl_keyfile: str | None = typer.Option(None, help="TLS key (uvicorn's)"),
) -> None:
    """Serve the HTTP API (/v1), MCP (/mcp) and the live page; needs a bearer token."""
    from farm.serve.serve_start import first_token, run, write_state

    settings = FarmSettings()
    scheme = "https" if ssl_certfile else "http"
    url = f"{scheme}://{host}:{port}"
    with farm_for(local, broker_url) as farm:
        env = settings.api_token.get_secret_value() if settings.api_token else None
        store = TokenStore(farm.registry.redis, env)
        token = first_token(store, settings)
        write_state(settings, url, token, farm)
        console.print(f"farm serve: {url}/v1 (OpenAPI at {url}/docs, MCP at {url}/mcp)")
        if token:
            console.print(
                f"  admin token (shown once, kept in {settings.serve_state_file}):\n  {token}",
                highlight=False,
            )
        run(
            farm,
            settings,
            store,
            host=host,
            port=port,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
        )


def mcp(local: int = LOCAL, broker_url: str | None = BROKER) -> None:
    """Serve MCP over stdio (for an MCP host: Claude, Cursor, ...)."""
    from farm.serve.mcp_server import run_stdio

    with farm_for(local, broker_url) as farm:
        run_stdio(farm)


@contextlib.contextmanager
def _store() -> Iterator[TokenStore]:
    """The tokens of the farm ``Farm.default()`` finds, else of the one a running
    ``farm serve --local N`` recorded (its broker lives as long as that server)."""
    from farm.serve.serve_start import read_state

    settings = FarmSettings()
    served = read_state(settings.serve_state_file).get("broker_url")
    chosen = "broker_url" in settings.model_fields_set or settings.state_file.exists()
    with Farm.default() if chosen or not served else Farm.connect(str(served)) as farm:
        yield TokenStore(farm.registry.redis)


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Argument(help="who or what it is for")],
    scope: list[str] = typer.Option(["run"], "--scope", help="run | admin (repeatable)"),
    concurrency: int = typer.Option(32, help="calls it may have running at once"),
) -> None:
    """Make a token; its secret is printed once and kept nowhere (only its hash is stored)."""
    with _store() as store:
        try:
            token, presented = store.create(name, scope, concurrency)
        except InvalidRequest as exc:
            fail(str(exc), 2)
    err.print(f"token {token.id} ({token.name}, scopes {', '.join(token.scopes)}):")
    print(presented)


@token_app.command("list")
def token_list() -> None:
    """The stored tokens (never their secrets)."""
    with _store() as store:
        tokens = store.list()
    table = Table(title=f"{len(tokens)} tokens")
    for column in ("id", "name", "scopes", "concurrency"):
        table.add_column(column)
    for t in tokens:
        table.add_row(t.id, t.name, ",".join(t.scopes), str(t.concurrency))
    console.print(table)


@token_app.command("revoke")
def token_revoke(token_id: Annotated[str, typer.Argument(help="its id or name")]) -> None:
    """Revoke a token: its next request is refused (401)."""
    with _store() as store:
        if not store.revoke(token_id):
            fail(f"no token {token_id}")
    console.print(f"revoked {token_id}")
