"""Each part of the deployment as the body of one process: ``setup`` once, then the central IAM, the api processes,
the workers and the gateways, each running until SIGINT or SIGTERM.

Only ``setup`` migrates. The long-running parts call ``initialize(migrate=False)``, so a process that starts never
changes the schema under processes already running.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Collection, Iterator, Sequence

import anyio
import attrs
import uvicorn

from bettercompute import BetterCompute
from bettercompute_gateway import Gateway, GatewayOptions, GatewayTls, create_gateway, issue_tls
from bettercompute_iam import (
    CreateBindingInput,
    CreateCredentialInput,
    CreatePrincipalInput,
    EmbeddedIam,
    IamGroups,
)

from ._compose import Deployment, Parts, central, compose, edge

__all__ = [
    "CENTRAL_ROLES",
    "EDGE_ACCOUNT",
    "WORKER_ROLES",
    "Minted",
    "run_api",
    "run_gateway",
    "run_iam",
    "run_worker",
    "setup",
]

log = logging.getLogger("examples.custom_deployment")

CENTRAL_ROLES = frozenset({"iam"})
"""The worker role the central IAM process runs: IAM's own jobs (expiring credentials, checking its projection)."""
WORKER_ROLES = frozenset({"controllers", "scheduler", "sinks"})
"""What the worker processes run: reconcilers (node adoption, reservations), placement, event and webhook delivery."""
EDGE_ACCOUNT = "api-edge"
"""The service account whose credential the api, worker and gateway processes present to the central IAM."""
DRAIN_SECONDS = 5.0
"""Over how long a stopping gateway closes its sessions, so its daemons do not all redial the others at once."""
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@attrs.frozen(kw_only=True, repr=False)
class Minted:
    """The credentials ``setup`` minted (both ``None`` when an earlier run already did). Shown once."""

    root: str | None
    edge: str | None

    def __repr__(self) -> str:
        return "Minted(<hidden>)"


async def setup(deployment: Deployment) -> Minted:
    """Once per deploy, before any other part starts: every migration (IAM's tables too), the node CA and
    JoinService keys, the root admin, and the service account that the other processes present to the central IAM
    (bound on the root scope to ``compute.authz-client``, which may authenticate and ask for decisions, nothing
    more). A second run mints nothing.

    Raises:
        ComputeError: The database cannot be reached (``UnavailableError``) or a setting is malformed.
    """
    embedded = EmbeddedIam()
    parts = compose(deployment, embedded)  # what central() composes, with the IAM at hand to bootstrap it
    try:
        await parts.compute.initialize()
        booted = await embedded.bootstrap()
        if booted.credential is None:
            return Minted(root=None, edge=None)
        root, tenant = booted.credential, booted.tenant_id
        iam = IamGroups(parts.compute.api)
        account = await iam.principals.create(
            root, CreatePrincipalInput(tenant=tenant, name=EDGE_ACCOUNT, kind="service_account")
        )
        await iam.bindings.create(
            root,
            CreateBindingInput(tenant=tenant, principal_id=account.id, role="compute.authz-client", scope_type="root"),
        )
        created = await iam.credentials.create(
            root, CreateCredentialInput(tenant=tenant, principal_id=account.id, expires_in_seconds=None)
        )
        return Minted(root=root, edge=created.credential)
    finally:
        await parts.close()


@contextlib.contextmanager
def _signals_to_uvicorn() -> Iterator[None]:
    """Let uvicorn's own SIGINT and SIGTERM handling stop the server, and nothing more.

    After a graceful stop uvicorn raises the signal again for the handler it found; with Python's defaults that is a
    KeyboardInterrupt or an immediate kill, before the control plane is closed. Ignoring the signals around it lets
    the process close everything and exit 0.
    """
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def _serve_http(parts: Parts, host: str, port: int, roles: Collection[str] = ()) -> None:
    """Serve the control plane's HTTP API (and run ``roles``) until SIGINT or SIGTERM, then close it."""
    compute = parts.compute
    try:
        await compute.initialize(migrate=False)
        async with anyio.create_task_group() as tg:
            if roles:
                await tg.start(compute.run, roles)
            # The process initializes and closes the control plane itself, so uvicorn runs no lifespan.
            config = uvicorn.Config(
                compute.asgi,
                host=host,
                port=port,
                lifespan="off",
                log_config=None,  # uvicorn's records go through this process's logging
                access_log=False,
            )
            with _signals_to_uvicorn():
                await uvicorn.Server(config).serve()
            tg.cancel_scope.cancel()  # the roles hand their leases back as they stop
    finally:
        with anyio.CancelScope(shield=True):
            await parts.close()
    log.info("stopped")


async def run_iam(deployment: Deployment, *, host: str, port: int) -> None:
    """The central IAM: serves IAM's methods (and the ``authz`` group the other processes ask) and runs IAM's jobs."""
    log.info("central IAM on http://%s:%d", host, port)
    await _serve_http(central(deployment), host, port, CENTRAL_ROLES)


async def run_api(deployment: Deployment, *, host: str, port: int) -> None:
    """An api process: the HTTP API only, every credential and decision checked by the central IAM; no worker role,
    so any number of them can run behind a load balancer."""
    log.info("api process on http://%s:%d, asking the central IAM at %s", host, port, deployment.iam_url)
    await _serve_http(edge(deployment), host, port)


async def _until_stopped(what: str) -> None:
    with anyio.open_signal_receiver(*_STOP_SIGNALS) as signals:
        log.info("%s; stop with SIGINT or SIGTERM", what)
        async for signum in signals:
            log.info("received %s; stopping", signal.Signals(signum).name)
            return


async def run_worker(deployment: Deployment, *, roles: Collection[str] = WORKER_ROLES) -> None:
    """A worker: ``roles`` under leases, until SIGINT or SIGTERM; no HTTP. Several may run: they share the shards."""
    parts = edge(deployment)
    compute = parts.compute
    try:
        await compute.initialize(migrate=False)
        async with anyio.create_task_group() as tg:
            await tg.start(compute.run, roles)
            await _until_stopped(f"worker running {', '.join(sorted(roles))}")
            tg.cancel_scope.cancel()  # compute.run hands the shard and singleton leases back as it stops
    finally:
        with anyio.CancelScope(shield=True):
            await parts.close()
    log.info("stopped")


async def _server_tls(compute: BetterCompute, name: str, hosts: Sequence[str]) -> tuple[GatewayTls, float]:
    """A new server certificate for the gateway from the control plane's CA, which every daemon trusts since its
    join, and how many seconds to use it before asking for the next (two thirds of its life)."""
    return await issue_tls(compute.gateway_services, name=name, hosts=hosts)


async def _renew(compute: BetterCompute, gateway: Gateway, name: str, hosts: Sequence[str], delay: float) -> None:
    while True:
        await anyio.sleep(delay)
        try:
            tls, delay = await _server_tls(compute, name, hosts)
            gateway.reload_tls(tls)
            log.info("gateway %s: server certificate renewed", name)
        except Exception as exc:  # the certificate in use is still valid for a third of its life: try again soon
            log.warning("gateway %s: server certificate not renewed (%s); trying again in a minute", name, exc)
            delay = 60.0


async def run_gateway(deployment: Deployment, *, host: str, port: int, name: str) -> None:
    """A gateway: daemons join through it and hold their mutual-TLS sessions with it; no HTTP.

    This process composes the control plane's gateway services itself (``compute.gateway_services``), so it loads the
    KMS key and with it the CA and JoinService keys: trust it as much as an api process. For a gateway that holds no
    key, give it ``RemoteGatewayServices`` through ``GatewayIdentity`` instead, enrolled on an api process's
    ``InternalListener`` (as ``serve --roles gateway`` does; see ``docs/security.md``)."""
    parts = edge(deployment)
    compute = parts.compute
    dialed = deployment.gateway_address.rpartition(":")[0].strip("[]")
    hosts = list(dict.fromkeys([dialed, "localhost", "127.0.0.1", "::1"]))
    try:
        await compute.initialize(migrate=False)
        tls, renew_in = await _server_tls(compute, name, hosts)
        gateway = create_gateway(
            compute.gateway_services, parts.store, tls, GatewayOptions(name=name), notifier=parts.notifier
        )
        await gateway.start(host, port)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_renew, compute, gateway, name, hosts, renew_in)
                await _until_stopped(f"gateway {name} listening on {host}:{port} (certificate for {', '.join(hosts)})")
                tg.cancel_scope.cancel()
            with anyio.move_on_after(DRAIN_SECONDS + 5):
                await gateway.drain(period=DRAIN_SECONDS)
        finally:
            with anyio.CancelScope(shield=True):
                await gateway.close()
    finally:
        with anyio.CancelScope(shield=True):
            await parts.close()
    log.info("stopped")
