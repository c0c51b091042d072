"""``better-compute mcp``, defined apart from the other server commands: an agent starts it for every session, so
it loads the MCP server and an HTTP client but not the control plane it calls (about one second of start-up instead
of two and a half). ``_main`` runs it alone when ``mcp`` is the first argument; ``_app`` lists it with the others."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from ._profiles import DEFAULT_SERVER, ProfileError, resolve
from ._reporting import display_host, err, reported

if TYPE_CHECKING:
    from ._mcp import Remote

__all__ = ["mcp_command", "run_mcp"]

log = logging.getLogger("bettercompute.cli")


def run_mcp(args: list[str]) -> None:
    """Run ``better-compute mcp`` with ``args`` (what follows ``mcp``), as the full command line would."""
    alone = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    alone.command("mcp")(mcp_command)
    alone(args=args, prog_name="better-compute mcp")


def mcp_command(
    server: Annotated[
        str | None,
        typer.Option(
            "--server", help=f"The control plane the tools call [default: the profile's, else {DEFAULT_SERVER}]."
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="The credential of every call on stdio (not with --http, where each request brings its own).",
            show_default=False,
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="A profile saved by `better-compute login` (server and credential)."),
    ] = None,
    http: Annotated[
        bool, typer.Option("--http", help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio.")
    ] = False,
    host: Annotated[str, typer.Option("--host", help="Where --http listens.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Where --http listens.")] = 3001,
) -> None:
    """Serve the control plane's methods as MCP tools, on stdio (for an agent that starts this command) or over
    streamable HTTP (--http).

    Every tool call is a call of the server's HTTP API, so its IAM, audit and idempotency apply. The tools come from
    the server's OpenAPI document: every method it serves, its modules' included. On stdio every call carries the
    credential given here; over HTTP, the bearer token of the request that carries it (a request without one is
    refused with 401). The server and credential are found as for the client commands: --server and --token, the
    profile named by --profile (or BETTERCOMPUTE_PROFILE), BETTERCOMPUTE_URL and BETTERCOMPUTE_TOKEN (or TOKEN), then
    the default profile saved by `better-compute login`.
    """
    from ._mcp import Remote, serve_http, serve_stdio  # mcp and pydantic load only for this command

    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a log line per tool call
    try:
        connection = resolve(server=server, token=token, profile=profile, env=os.environ)
    except ProfileError as exc:
        err(f"error: {exc}")
        raise typer.Exit(2) from None
    server, token = connection.server, connection.token

    if http:
        if token:
            log.info("the credential given is not used over HTTP: each request brings its own")
        err(f"MCP over streamable HTTP on http://{display_host(host)}:{port}/mcp, calling {server}")
        plane = Remote(server)
        with reported():
            anyio.run(lambda: _closing(plane, serve_http(plane, host=host, port=port)))
        return
    if not token:
        err("error: a credential is needed: --token, a profile (better-compute login), BETTERCOMPUTE_TOKEN or TOKEN")
        raise typer.Exit(2)
    if not all("!" <= c <= "~" for c in token):  # it goes into an Authorization header as it is
        err("error: the credential must be printable ASCII without spaces")
        raise typer.Exit(2)
    plane = Remote(server)
    with reported():
        anyio.run(lambda: _closing(plane, serve_stdio(plane, token)))


async def _closing(plane: Remote, serving: Awaitable[None]) -> None:
    try:
        await serving
    finally:
        with anyio.CancelScope(shield=True):
            await plane.aclose()
