"""What ``better-compute dev`` runs: the whole control plane on this machine, with what it makes for itself (a KMS key,
an embedded PostgreSQL or a throw-away schema, a simulated node) and the banner that says how to use it."""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import anyio
import attrs
import psycopg
import typer
from psycopg import sql

from bettercompute_iam import Bootstrap
from bettercompute_store_pg import EmbeddedPostgres

from ._config import DATABASE_URL_ENV, WORKER_ROLES, Config
from ._devnode import run_dev_node
from ._gateway import GatewayPlan, loop_options
from ._profiles import DEFAULT_SERVER
from ._reporting import display_host
from ._runtime import (
    Plan,
    build,
    close,
    gateway_plan,
    metrics_address,
    notifier_note,
    run,
    webhooks_note,
)

__all__ = ["DEV_DATA", "DEV_GATEWAY_PORT", "DEV_KMS_KEY", "DEV_NODE", "DEV_TRUST_DOMAIN", "path_hint", "run_dev"]

log = logging.getLogger("bettercompute.cli")

DEV_DATA = Path(".bettercompute") / "pg"
"""Where ``dev`` keeps its embedded PostgreSQL's data, below the current folder."""

DEV_KMS_KEY = Path(".bettercompute") / "kms.key"
"""The key file sealing ``dev``'s webhook signing secrets unless ``kms_key_file`` is set (0600, made on first use)."""
DEV_NODE = Path(".bettercompute") / "node"
"""Where ``dev``'s simulated node keeps its state (``0/``: its key, certificate and declared inventory)."""
DEV_TRUST_DOMAIN = "dev.localhost"
"""``dev``'s SPIFFE trust domain unless ``trust_domain`` is set."""
DEV_GATEWAY_PORT = 7443
"""The gateway port ``dev``'s join commands pin unless ``gateway_address`` is set."""


def _curl(host: str, port: int) -> str:
    return (
        f"""curl -X POST -H "Authorization: Bearer $TOKEN" -H 'content-type: application/json' """
        f"""http://{display_host(host)}:{port}/api/compute/system/version -d '{{}}'"""
    )


def _cli_try(host: str, port: int) -> str:
    url = f"http://{display_host(host)}:{port}"
    prefix = "" if url == DEFAULT_SERVER else f"BETTERCOMPUTE_URL={url} "
    return f"{prefix}better-compute system version"


def path_hint(found: str | None, running: Path, prefix: Path, base_prefix: Path) -> str | None:
    """What to do first so that the printed ``better-compute ...`` commands run in another terminal: nothing when
    the command found on PATH is this one; else how to put this one there (``make dev`` runs it from ``.venv``)."""
    here = running.resolve() if running.name == "better-compute" else prefix / "bin" / "better-compute"
    if found is not None and Path(found).resolve() == here.resolve():
        return None
    if prefix != base_prefix:  # a virtual environment
        activate = prefix / "bin" / "activate"
        return f"(The better-compute command is in {prefix / 'bin'}: in another terminal, first run: source {activate})"
    return f"(The better-compute command is in {here.parent}, which is not on PATH: add it first.)"


def _banner(config: Config, result: Bootstrap, embedded_url: str | None) -> str:
    lines = [
        "",
        f"Better Compute is running on http://{display_host(config.host)}:{config.port} "
        "(the API and every worker role).",
        "",
    ]
    if result.credential is not None:
        lines += [
            "A root admin credential was minted. It is shown once; keep it now:",
            "",
            f"    export TOKEN={result.credential}",
        ]
    else:
        lines += ["A root admin credential already exists (it was shown when it was minted)."]
        if embedded_url is None:
            lines += ["To mint a new one and revoke the old: better-compute iam bootstrap --rotate"]
        else:
            lines += [
                "To mint a new one and revoke the old: better-compute dev --rotate",
                f"(or, while this runs: {DATABASE_URL_ENV}={embedded_url} better-compute iam bootstrap --rotate)",
            ]
    lines += ["", "Try it:", "", f"    {_curl(config.host, config.port)}", "", "or with this command:", ""]
    lines += [f"    {_cli_try(config.host, config.port)}", ""]
    hint = path_hint(shutil.which("better-compute"), Path(sys.argv[0]), Path(sys.prefix), Path(sys.base_prefix))
    if hint is not None:
        lines += [hint, ""]
    if config.gateway_address is not None:
        lines += [
            f"Node daemons join through the gateway at {config.gateway_address}: pools/create, then",
            "join-tokens/create prints the `bcd join ...` command (and an install script) for a machine.",
            "",
        ]
    lines += ["Stop with Ctrl-C.", ""]
    return "\n".join(lines)


def _dial(config: Config, gateway: GatewayPlan) -> str | None:
    """Where dev's own node dials its gateway: where it listens, when that is not the advertised address's port."""
    advertised = (config.gateway_address or "").rpartition(":")[2]
    if advertised == str(gateway.port):
        return None
    host = "127.0.0.1" if gateway.listen_host in ("0.0.0.0", "::", "") else gateway.listen_host  # noqa: S104
    return f"[{host}]:{gateway.port}" if ":" in host else f"{host}:{gateway.port}"


async def _serve(config: Config, url: str, embedded: bool, rotate: bool, access_log: bool, node_folder: Path) -> None:
    """Serve every role with dev's own simulated node, printing the banner once the API is up."""
    compute, iam = build(config, url, notify=True, loopback_webhooks=True)
    try:
        await compute.initialize()
        result = await iam.bootstrap(rotate=rotate)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await close(compute)
        raise
    banner = _banner(config, result, url if embedded else None)
    plan = Plan(api=True, workers=frozenset(WORKER_ROLES), gateway=gateway_plan(config))
    ready = anyio.Event()
    node_scope = anyio.CancelScope()
    node_stopped = anyio.Event()

    def on_ready() -> None:
        typer.echo(banner)
        ready.set()

    async def node(api: str, gateway: str | None) -> None:
        try:
            with node_scope:
                await run_dev_node(compute, result, node_folder, api=api, gateway=gateway)
        finally:
            node_stopped.set()

    async def stop_node() -> None:
        # Before the gateway closes: with the node's session open, the gateway would drain it for seconds.
        node_scope.cancel()
        if ready.is_set() and plan.gateway is not None:
            with anyio.move_on_after(5):
                await node_stopped.wait()

    async with anyio.create_task_group() as tg:

        async def serve() -> None:
            try:
                await run(
                    compute,
                    plan,
                    host=config.host,
                    port=config.port,
                    migrate=True,
                    access_log=access_log,
                    on_ready=on_ready,
                    before_close=stop_node,
                    metrics=metrics_address(config),
                )
            finally:
                tg.cancel_scope.cancel()

        tg.start_soon(serve)
        if plan.gateway is not None:
            await ready.wait()
            tg.start_soon(node, f"http://{display_host(config.host)}:{config.port}", _dial(config, plan.gateway))


def run_dev(config: Config, *, ephemeral: bool, rotate: bool, access_log: bool) -> None:
    """Run ``better-compute dev`` until stopped: what it makes for itself (a KMS key, a throw-away schema, an
    embedded PostgreSQL, its node's folder) is undone in the reverse order, however it ends."""
    with contextlib.ExitStack() as cleanup:
        config = _settings(config, ephemeral, cleanup)
        note = notifier_note(config)
        if note is not None:
            log.info("%s", note)
        config, url, embedded = _database(config, ephemeral, cleanup)
        node = DEV_NODE.absolute()
        if ephemeral:
            node = Path(tempfile.mkdtemp(prefix="bettercompute-node-"))
            cleanup.callback(shutil.rmtree, node, ignore_errors=True)
        anyio.run(
            _serve,
            config,
            url,
            embedded,
            rotate,
            access_log,
            node,
            backend_options=loop_options(gateway_plan(config)),
        )


def _settings(config: Config, ephemeral: bool, cleanup: contextlib.ExitStack) -> Config:
    """dev's KMS key file (with ``--ephemeral``, in a temporary folder removed by ``cleanup``) and trust domain,
    unless configured."""
    if config.kms_key_file is None:
        if ephemeral:
            key_folder = tempfile.mkdtemp(prefix="bettercompute-kms-")  # mode 0700
            cleanup.callback(shutil.rmtree, key_folder, ignore_errors=True)
            key_file = Path(key_folder) / "kms.key"
        else:
            key_file = DEV_KMS_KEY.absolute()
        config = attrs.evolve(config, kms_key_file=key_file)
    log.info("webhook signing secrets are sealed with the key in %s", config.kms_key_file)
    log.info("%s", webhooks_note(config, dev=True))
    if config.trust_domain is None and config.gateway_address is None:
        config = attrs.evolve(
            config, trust_domain=DEV_TRUST_DOMAIN, gateway_address=f"{config.host}:{DEV_GATEWAY_PORT}"
        )
    log.info("nodes join the trust domain %s through %s", config.trust_domain, config.gateway_address)
    return config


def _database(config: Config, ephemeral: bool, cleanup: contextlib.ExitStack) -> tuple[Config, str, bool]:
    """dev's database URL, and whether it is an embedded PostgreSQL started here (stopped by ``cleanup``); with
    ``--ephemeral`` and a URL, the configuration names a throw-away schema (dropped by ``cleanup``)."""
    url = config.database_url
    if url is not None:
        if ephemeral and config.schema == attrs.fields(Config).schema.default:
            # The KMS key is a throw-away one: so are the tables whose secrets it seals, or the next run would
            # meet secrets it cannot open. (A schema named in the configuration is used as it is.)
            schema = f"dev_ephemeral_{secrets.token_hex(4)}"
            config = attrs.evolve(config, schema=schema)
            cleanup.callback(_drop_schema, url, schema)
            log.info("--ephemeral: tables in the throw-away schema %s, dropped at the end", schema)
        return config, url, False
    directory = None if ephemeral else DEV_DATA
    where = "a temporary folder" if ephemeral else f"./{DEV_DATA}"
    log.info("starting an embedded PostgreSQL (data in %s)", where)
    server = EmbeddedPostgres(directory)
    cleanup.callback(_stop_embedded, server)  # before start(): a half-started server is stopped too
    return config, server.start(), True


def _stop_embedded(server: EmbeddedPostgres) -> None:
    log.info("stopping the embedded PostgreSQL")
    server.stop()


def _drop_schema(url: str, schema: str) -> None:
    """Drop dev's throw-away schema (``--ephemeral`` with a database URL); a failure is logged, not raised."""
    try:
        with psycopg.connect(_libpq(url), autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        log.info("dropped the throw-away schema %s", schema)
    except psycopg.Error as exc:
        log.warning("could not drop the throw-away schema %s (%s)", schema, type(exc).__name__)


def _libpq(url: str) -> str:
    """The URL as libpq takes it (without SQLAlchemy's ``+driver``)."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.split('+', 1)[0]}{sep}{rest}"
