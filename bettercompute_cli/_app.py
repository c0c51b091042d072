"""The ``better-compute`` command.

Output rules: results go to stdout, logs and errors to stderr. An error is one line, ``error: CODE: message``
(exit 1), or ``error: <problem>`` for a configuration or usage problem (exit 2); never a traceback, never SQL, never
the database URL (it may hold a password).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import click
import typer

import bettercompute
import bettercompute_iam
import bettercompute_store_pg
from bettercompute.errors import ComputeError
from bettercompute_iam import Bootstrap, RemoteIam

from ._config import IAM_CREDENTIAL_ENV, WORKER_ROLES, Config, ConfigError, load_config
from ._constants import OWN_COMMANDS
from ._dev import DEV_DATA, run_dev
from ._gateway import loop_options
from ._groups import group_names
from ._profiles import DEFAULT_SERVER, ProfileError, resolve
from ._runtime import (
    Plan,
    build,
    build_serving,
    display_host,
    metrics_address,
    notifier_note,
    plan_roles,
    require_database_url,
    require_embedded_iam,
    run,
    webhooks_note,
)
from ._version import __version__

if TYPE_CHECKING:
    from ._mcp import Remote

__all__ = ["app"]

log = logging.getLogger("bettercompute.cli")

_ROLES_HELP = (
    f"Comma-separated: api, {', '.join(WORKER_ROLES)}, gateway, or all (the API, every worker role, and the gateway "
    "when node identity is configured)."
)

_OWN_COMMANDS = set(OWN_COMMANDS)

app = typer.Typer(
    name="better-compute",
    help="Better Compute: a control plane for GPU fleets.",
    epilog=(
        "API commands, one per method (better-compute <group> --help): "
        + ", ".join(name for name in group_names() if name not in _OWN_COMMANDS)
        + ". They call the server and use the credential saved by `better-compute login` (--profile picks one of "
        "several), or BETTERCOMPUTE_URL and BETTERCOMPUTE_TOKEN (or TOKEN). The groups of a server's own modules are "
        "commands too, made from its OpenAPI document. Also: login, logout, completion."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
iam_app = typer.Typer(help="Administer the embedded Better IAM.", no_args_is_help=True)
app.add_typer(iam_app, name="iam")


class Output(enum.StrEnum):
    """How ``iam bootstrap`` prints its result."""

    text = "text"
    token = "token"  # noqa: S105 - the name of an output format, not a secret


# --- plumbing -------------------------------------------------------------------------------------------------------


def _err(message: str) -> None:
    typer.echo(message, err=True)


def _unwrap(exc: BaseException) -> BaseException:
    """The error worth reporting inside task-group exception groups: ours first, else the first one."""
    while isinstance(exc, BaseExceptionGroup):
        leaves = list(exc.exceptions)
        exc = next((e for e in leaves if isinstance(e, ComputeError | ConfigError)), leaves[0])
    return exc


def _report(exc: BaseException) -> int:
    """Print ``exc`` as one line; return the exit code."""
    if isinstance(exc, ConfigError):
        for problem in exc.problems:
            _err(f"error: {problem}")
        return 2
    if isinstance(exc, ComputeError):
        _err(f"error: {exc.code}: {exc.message}")
        return 1
    if isinstance(exc, KeyboardInterrupt):
        _err("interrupted")
        return 130
    # A bug. Its text and traceback may hold SQL or a connection string, so only its type is shown.
    _err(f"error: INTERNAL: an unexpected {type(exc).__name__}; please report it")
    return 1


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Turn every error into one line on stderr and an exit code."""
    try:
        yield
    except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
        raise
    except (Exception, KeyboardInterrupt, BaseExceptionGroup) as exc:
        raise typer.Exit(_report(_unwrap(exc))) from None


def _config(ctx: typer.Context, **flags: Any) -> Config:
    path: Path | None = ctx.obj.get("config") if isinstance(ctx.obj, dict) else None
    return load_config(path, overrides=flags)


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _log_notifier(config: Config) -> None:
    note = notifier_note(config)
    if note is not None:
        log.info("%s", note)


@app.callback()
def _main(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A TOML configuration file (default: $BETTERCOMPUTE_CONFIG).",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
) -> None:
    """Better Compute: a control plane for GPU fleets.

    Configuration comes from the --config file, then BETTERCOMPUTE_* environment variables, then flags.
    """
    ctx.obj = {"config": config}


# --- migrate --------------------------------------------------------------------------------------------------------


async def _migrate(config: Config, url: str) -> dict[str, list[int]]:
    compute, _iam = build(config, url)
    try:
        return await compute.migrate()
    finally:
        with anyio.CancelScope(shield=True):
            await compute.close()


@app.command()
def migrate(ctx: typer.Context) -> None:
    """Apply every pending migration (the store's and every module's), and print what was applied."""
    with _errors():
        config = _config(ctx)
        applied = anyio.run(_migrate, config, require_database_url(config))
    done = {module: versions for module, versions in applied.items() if versions}
    for module, versions in done.items():
        typer.echo(f"{module}: applied {', '.join(str(v) for v in versions)}")
    if done:
        typer.echo(f"Schema {config.schema} is up to date.")
    else:
        typer.echo(f"Nothing to apply: schema {config.schema} is up to date.")


# --- serve ----------------------------------------------------------------------------------------------------------


async def _serve(
    compute: bettercompute.BetterCompute,
    remote: RemoteIam | None,
    plan: Plan,
    config: Config,
    *,
    migrate: bool,
    access_log: bool,
) -> None:
    """``run``, then close the central IAM's connections when there is one."""
    try:
        await run(
            compute,
            plan,
            host=config.host,
            port=config.port,
            migrate=migrate,
            access_log=access_log,
            metrics=metrics_address(config),
        )
    finally:
        if remote is not None:
            with anyio.CancelScope(shield=True):
                await remote.aclose()


@app.command()
def serve(
    ctx: typer.Context,
    roles: Annotated[str | None, typer.Option("--roles", help=_ROLES_HELP, show_default="all")] = None,
    host: Annotated[str | None, typer.Option("--host", help="Where the API listens.", show_default="127.0.0.1")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Where the API listens.", show_default="3000")] = None,
    gateway_host: Annotated[
        str | None,
        typer.Option("--gateway-host", help="Where the gateway listens.", show_default="the --host address"),
    ] = None,
    gateway_port: Annotated[
        int | None,
        typer.Option("--gateway-port", help="The gateway's port.", show_default="the port of gateway_address"),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="Serve GET /metrics on a listener of its own at this port (on --metrics-host, else --host); the "
            "API's port then no longer serves it.",
            show_default="none: /metrics on the API's port only",
        ),
    ] = None,
    metrics_host: Annotated[
        str | None,
        typer.Option("--metrics-host", help="Where the metrics listener listens.", show_default="the --host address"),
    ] = None,
    iam_url: Annotated[
        str | None,
        typer.Option(
            "--iam-url",
            help=(
                "Use the IAM of the central control plane served there instead of an embedded one; this process's "
                f"credential comes from {IAM_CREDENTIAL_ENV} or iam_credential in the config file."
            ),
            show_default="embedded IAM",
        ),
    ] = None,
    no_migrate: Annotated[
        bool, typer.Option("--no-migrate", help="Do not apply migrations (run `better-compute migrate` first).")
    ] = False,
    access_log: Annotated[bool, typer.Option("--access-log", help="Log every HTTP request.")] = False,
) -> None:
    """Run the control plane in one process mode until SIGINT or SIGTERM."""
    with _errors():
        config = _config(
            ctx,
            roles=roles,
            host=host,
            port=port,
            iam_url=iam_url,
            gateway_host=gateway_host,
            gateway_port=gateway_port,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
        )
        plan = plan_roles(config.roles, config)
        compute, remote = build_serving(config, require_database_url(config))
        _setup_logging()
        if remote is not None:
            log.info("using the central IAM at %s", config.iam_url)
        _log_notifier(config)
        note = webhooks_note(config, dev=False)
        if note is not None and config.kms_key_file is not None:  # without a KMS there is no webhooks group
            log.warning("%s", note)
        anyio.run(
            lambda: _serve(compute, remote, plan, config, migrate=not no_migrate, access_log=access_log),
            backend_options=loop_options(plan.gateway),
        )


# --- dev ------------------------------------------------------------------------------------------------------------


@app.command()
def dev(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option("--host", help="Where the API listens.", show_default="127.0.0.1")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Where the API listens.", show_default="3000")] = None,
    ephemeral: Annotated[
        bool,
        typer.Option(
            "--ephemeral",
            help=f"Keep the embedded PostgreSQL's data and the KMS key in temporary folders, not {DEV_DATA.parent} "
            "(with a database URL: the tables in a throw-away schema, unless a schema is configured).",
        ),
    ] = False,
    rotate: Annotated[
        bool, typer.Option("--rotate", help="Mint a new root admin credential, revoking the old one.")
    ] = False,
    access_log: Annotated[bool, typer.Option("--access-log", help="Log every HTTP request.")] = False,
) -> None:
    """Run the whole control plane on this machine, for development.

    Uses BETTERCOMPUTE_DATABASE_URL when set, else an embedded PostgreSQL whose data stays in ./.bettercompute/pg.
    Webhook signing secrets, the node CA's key and JoinService's key are sealed with the key in
    ./.bettercompute/kms.key (or kms_key_file; with --ephemeral, a temporary one); nodes join the trust domain
    dev.localhost through <host>:7443 unless trust_domain and gateway_address are set. Webhooks may reach loopback
    destinations (a receiver on this machine), which serve refuses unless webhooks_allow_private is set. Migrates,
    makes sure a root admin credential exists (printing it when it is new), and serves every role.
    """
    with _errors():
        config = _config(ctx, host=host, port=port)
        _setup_logging()
        if config.iam_url is not None:
            log.info("dev runs its own embedded IAM; iam_url is not used")
        run_dev(config, ephemeral=ephemeral, rotate=rotate, access_log=access_log)


# --- iam ------------------------------------------------------------------------------------------------------------


async def _bootstrap(config: Config, url: str, rotate: bool) -> Bootstrap:
    compute, iam = build(config, url)
    try:
        await compute.initialize()
        return await iam.bootstrap(rotate=rotate)
    finally:
        with anyio.CancelScope(shield=True):
            await compute.close()


@iam_app.command("bootstrap")
def iam_bootstrap(
    ctx: typer.Context,
    rotate: Annotated[
        bool, typer.Option("--rotate", help="Mint a new credential even if one exists, revoking the old ones.")
    ] = False,
    output: Annotated[
        Output, typer.Option("--output", help="text, or token: only the credential (for TOKEN=$(...)).")
    ] = Output.text,
) -> None:
    """Create the root tenant and its admin, and print the admin's credential once.

    Runs where IAM is embedded: with iam_url configured it refuses (exit 2).

    Without --rotate, a second run mints nothing. With --output token and nothing minted, stdout stays empty and the
    exit code is 1, so a script notices.
    """
    with _errors():
        config = _config(ctx)
        require_embedded_iam(config, "better-compute iam bootstrap")
        result = anyio.run(_bootstrap, config, require_database_url(config), rotate)
    nothing = "a root admin credential already exists; nothing was minted (use --rotate to replace it)"
    if output is Output.token:
        if result.credential is None:
            _err(nothing)
            raise typer.Exit(1)
        typer.echo(result.credential)
        return
    if result.credential is None:
        typer.echo(f"The root admin ({result.principal_id}) already has a credential; nothing was minted.")
        typer.echo("To mint a new one and revoke the old: better-compute iam bootstrap --rotate")
        return
    if result.revoked:
        typer.echo(f"Revoked the previous credential(s): {', '.join(result.revoked)}.")
    typer.echo(
        f"Root admin {result.principal_id} of tenant {result.tenant_id}: a new credential ({result.credential_id})."
    )
    typer.echo("It is shown once; keep it now:")
    typer.echo("")
    typer.echo(f"    {result.credential}")


# --- mcp ------------------------------------------------------------------------------------------------------------


@app.command("mcp")
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
        _err(f"error: {exc}")
        raise typer.Exit(2) from None
    server, token = connection.server, connection.token

    if http:
        if token:
            log.info("the credential given is not used over HTTP: each request brings its own")
        _err(f"MCP over streamable HTTP on http://{display_host(host)}:{port}/mcp, calling {server}")
        plane = Remote(server)
        with _errors():
            anyio.run(lambda: _closing(plane, serve_http(plane, host=host, port=port)))
        return
    if not token:
        _err("error: a credential is needed: --token, a profile (better-compute login), BETTERCOMPUTE_TOKEN or TOKEN")
        raise typer.Exit(2)
    if not all("!" <= c <= "~" for c in token):  # it goes into an Authorization header as it is
        _err("error: the credential must be printable ASCII without spaces")
        raise typer.Exit(2)
    plane = Remote(server)
    with _errors():
        anyio.run(lambda: _closing(plane, serve_stdio(plane, token)))


async def _closing(plane: Remote, serving: Awaitable[None]) -> None:
    try:
        await serving
    finally:
        with anyio.CancelScope(shield=True):
            await plane.aclose()


# --- version --------------------------------------------------------------------------------------------------------


@app.command()
def version() -> None:
    """Print the versions of the command and of the packages it composes."""
    typer.echo(f"better-compute {__version__}")
    typer.echo(f"bettercompute {bettercompute.__version__}")
    typer.echo(f"bettercompute_store_pg {bettercompute_store_pg.__version__}")
    typer.echo(f"bettercompute_iam {bettercompute_iam.__version__}")
