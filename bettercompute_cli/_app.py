"""The ``better-compute`` command.

Output rules: results go to stdout, logs and errors to stderr. An error is one line, ``error: CODE: message``
(exit 1), or ``error: <problem>`` for a configuration or usage problem (exit 2); never a traceback, never SQL, never
the database URL (it may hold a password).
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import logging
from pathlib import Path
from typing import Annotated, Any

import anyio
import attrs
import typer

import bettercompute
import bettercompute_iam
import bettercompute_store_pg
from bettercompute.errors import InvalidConfigError, NotFoundError
from bettercompute.modules.inventory import FactVerdict, verify_facts
from bettercompute_iam import Bootstrap, RemoteIam
from bettercompute_store_pg import PgStore, RoleNames

from ._config import IAM_CREDENTIAL_ENV, WORKER_ROLES, Config, ConfigError, load_config
from ._constants import OWN_COMMANDS
from ._dev import DEV_DATA, run_dev
from ._gateway import loop_options
from ._groups import group_names
from ._mcp_command import mcp_command
from ._reporting import err, reported
from ._runtime import (
    Plan,
    build,
    build_serving,
    metrics_address,
    notifier_note,
    plan_roles,
    require_database_url,
    require_embedded_iam,
    run,
    webhooks_note,
)
from ._version import __version__

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
gateways_app = typer.Typer(help="Enrol gateway processes that run apart from the api.", no_args_is_help=True)
app.add_typer(gateways_app, name="gateways")
facts_app = typer.Typer(help="Check again what a node signed and the control plane relies on.", no_args_is_help=True)
app.add_typer(facts_app, name="facts")


class Output(enum.StrEnum):
    """How ``iam bootstrap`` prints its result."""

    text = "text"
    token = "token"  # noqa: S105 - the name of an output format, not a secret


# --- plumbing -------------------------------------------------------------------------------------------------------


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


async def _migrate(config: Config, url: str) -> tuple[dict[str, list[int]], RoleNames | None]:
    compute, _iam = build(config, url)
    try:
        applied = await compute.migrate()
        store = compute.options.store
        roles = None
        if isinstance(store, PgStore):
            roles = await store.grant_roles(config.database_role_prefix or config.schema)
        return applied, roles
    finally:
        with anyio.CancelScope(shield=True):
            await compute.close()


@app.command()
def migrate(ctx: typer.Context) -> None:
    """Apply every pending migration (the store's and every module's), and print what was applied."""
    with reported():
        config = _config(ctx)
        applied, roles = anyio.run(_migrate, config, require_database_url(config))
    done = {module: versions for module, versions in applied.items() if versions}
    for module, versions in done.items():
        typer.echo(f"{module}: applied {', '.join(str(v) for v in versions)}")
    if done:
        typer.echo(f"Schema {config.schema} is up to date.")
    else:
        typer.echo(f"Nothing to apply: schema {config.schema} is up to date.")
    if roles is not None:
        typer.echo(f"Roles: {roles.api} (api), {roles.worker} (worker roles), {roles.gateway} (gateway).")


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
    with reported():
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
        # A gateway without the api composes no JoinService or CA: it asks the api process over the internal channel.
        identity = plan.api or plan.gateway is None or plan.gateway.remote is None
        # A gateway alone in its process never migrates and reads no IAM table: it runs with the gateway role,
        # which may only call the gateway's functions (``better-compute migrate`` makes and grants the roles).
        edge_only = not plan.api and not plan.workers and plan.gateway is not None and plan.gateway.remote is not None
        url = require_database_url(config)
        compute, remote = build_serving(config, url, identity=identity, edge_only=edge_only)
        _setup_logging()
        if remote is not None:
            log.info("using the central IAM at %s", config.iam_url)
        _log_notifier(config)
        note = webhooks_note(config, dev=False)
        if note is not None and config.kms_key_file is not None:  # without a KMS there is no webhooks group
            log.warning("%s", note)
        migrate = not no_migrate and not edge_only
        anyio.run(
            lambda: _serve(compute, remote, plan, config, migrate=migrate, access_log=access_log),
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
    with reported():
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
    with reported():
        config = _config(ctx)
        require_embedded_iam(config, "better-compute iam bootstrap")
        result = anyio.run(_bootstrap, config, require_database_url(config), rotate)
    nothing = "a root admin credential already exists; nothing was minted (use --rotate to replace it)"
    if output is Output.token:
        if result.credential is None:
            err(nothing)
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


# --- gateways -------------------------------------------------------------------------------------------------------


async def _gateway_token(config: Config, url: str, name: str, ttl: dt.timedelta) -> str:
    compute, _ = build(config, url)
    try:
        await compute.initialize(migrate=False)
        enrolment = compute.gateway_services.enrolment
        if enrolment is None:  # node identity with a KMS always has one
            raise InvalidConfigError(
                "gateway enrolment needs node identity (trust_domain, gateway_address, kms_key_file)"
            )
        return await enrolment.mint(name, ttl=ttl, actor="cli:gateways.token")
    finally:
        with anyio.CancelScope(shield=True):
            await compute.close()


@gateways_app.command("token")
def gateways_token(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The gateway's name: its instance name (letters, digits, . _ -).")],
    ttl_seconds: Annotated[
        int, typer.Option("--ttl-seconds", help="How long the token may be used, at most a day.")
    ] = 3600,
) -> None:
    """Print a one-time token that enrols the gateway NAME (give it as gateway_token to `serve --roles gateway`).

    Runs where the KMS key is (kms_key_file, trust_domain and gateway_address set), like the api. The token holds the
    CA pin the gateway checks the api's internal listener against; it is spent by the first enrolment.
    """
    with reported():
        config = _config(ctx)
        if config.kms_key_file is None or config.trust_domain is None or config.gateway_address is None:
            raise ConfigError(["gateways token needs trust_domain, gateway_address and kms_key_file (node identity)"])
        token = anyio.run(_gateway_token, config, require_database_url(config), name, dt.timedelta(seconds=ttl_seconds))
    typer.echo(token)


# --- facts ----------------------------------------------------------------------------------------------------------


async def _verify_facts(config: Config, url: str, node_id: str) -> list[FactVerdict]:
    compute, _ = build(config, url)
    try:
        await compute.initialize(migrate=False)
        try:
            return await verify_facts(compute.context.store, node_id)
        except NotFoundError:
            if not node_id.startswith("mch_"):
                raise
        from bettercompute_metal import verify_reports  # a machine: its ramdisk's reports

        return await verify_reports(compute.context.store, node_id)
    finally:
        with anyio.CancelScope(shield=True):
            await compute.close()


@facts_app.command("verify")
def facts_verify(
    ctx: typer.Context,
    node_id: Annotated[str, typer.Argument(help="The node (or bare-metal machine) whose facts to check.")],
) -> None:
    """Check every fact node NODE_ID signed that the control plane relies on (acceptance results, inventory
    sections, the newest desired-state acknowledgement) against the certificates and revocations as they are now.
    For a bare-metal machine (``mch_...``), its ramdisk's signed reports (diagnose, wipe).

    Prints one JSON object a line (fact, id, verdict, signer_serial); exits 1 when any verdict is not ``ok``. Runs
    where the database is; needs no KMS key.
    """
    with reported():
        config = _config(ctx)
        verdicts = anyio.run(_verify_facts, config, require_database_url(config), node_id)
    for verdict in verdicts:
        typer.echo(json.dumps(attrs.asdict(verdict), sort_keys=True))
    if any(v.verdict != "ok" for v in verdicts):
        raise typer.Exit(1)


# --- mcp ------------------------------------------------------------------------------------------------------------

# Defined apart (``_mcp_command``) so that ``better-compute mcp`` starts without loading the control plane.
app.command("mcp")(mcp_command)


# --- version --------------------------------------------------------------------------------------------------------


@app.command()
def version() -> None:
    """Print the versions of the command and of the packages it composes."""
    typer.echo(f"better-compute {__version__}")
    typer.echo(f"bettercompute {bettercompute.__version__}")
    typer.echo(f"bettercompute_store_pg {bettercompute_store_pg.__version__}")
    typer.echo(f"bettercompute_iam {bettercompute_iam.__version__}")
